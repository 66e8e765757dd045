#!/usr/bin/env python3
"""bench_lookup.py — prompt lookup and lookahead decoding against standard (issue 6).

  python3 scripts/bench_lookup.py --model M [--prompts 50] [--tokens 128] [--temp 0]
          [--runs "prompt-lookup;lookahead;lookahead --adaptive"] [--bin bin] [--label L]

Runs standard and each method (a method name and its flags, runs separated by ';') on
the same TinyStories openings, one process per prompt and method, 1 thread, taking
turns prompt by prompt (a shared machine's busy spells hit every method alike), and prints
a markdown row per run: tok/s (summed tokens over summed decode time), the speedup
over standard measured in this same run, τ (tokens per target pass), the mean
verified tree, the acceptance per depth and whether the text equals standard's.
A benchmark: nothing here is a test."""
import argparse, gzip, json, os, shlex, subprocess, sys

def prompts(n, path):
    """the first six words of each story paragraph, as bench_adadecode.py makes them"""
    text = gzip.open(path, "rt", encoding="utf-8").read()
    out = []
    for para in text.split("\n\n"):
        w = para.split()
        if len(w) >= 8 and w[0][0].isupper():
            out.append(" ".join(w[:6]))
        if len(out) == n:
            break
    return out

def run(a, prompt, extra):
    cmd = [a.bin + "/decode", "-m", a.model, "-n", str(a.tokens), "--json", "-t", "1", "--temp", a.temp,
           "-p", prompt, "--seed", "1"] + extra
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        sys.exit("bench_lookup: " + " ".join(map(shlex.quote, cmd)) + ": " + r.stderr.strip())
    return json.loads(r.stdout)

def summary(js):
    toks = secs = passes = tree = 0
    acc = []
    for j in js:
        toks += j["n_gen"]
        secs += j["n_gen"] / j["tok_per_s"]
        if "tau" in j:
            n_pass = j["n_gen"] / j["tau"]
            passes += n_pass
            tree += j["mean_tree"] * n_pass
            for d, v in enumerate(j["acceptance_per_depth"]):
                if d == len(acc):
                    acc.append([0.0, 0])
                acc[d][0] += v
                acc[d][1] += 1
    return {"tok_s": toks / secs, "tau": toks / passes if passes else 1.0, "tree": tree / passes if passes else 1.0,
            "acc": [s / n for s, n in acc], "texts": [j["tokens"] for j in js]}

def measure(a, ps, configs):
    """every config on every prompt; the configs take turns prompt by prompt (in a
    rotating order), so a busy spell on a shared machine hits them all alike"""
    out = [[] for _ in configs]
    for i, p in enumerate(ps):
        for k in range(len(configs)):
            c = (k + i) % len(configs)
            out[c].append(run(a, p, configs[c]))
    return [summary(js) for js in out]

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--bin", default="bin")
    ap.add_argument("--prompts", type=int, default=50)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--temp", default="0")
    ap.add_argument("--runs", default="prompt-lookup;lookahead")
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    data = os.environ.get("PARADEC_DATA") or "../shared/data"
    ps = prompts(a.prompts, os.path.join(data, "datasets/tinystories/tinystories_val_sample.txt.gz"))
    label = a.label or os.path.basename(a.model)
    print(f"| model | method | tok/s | speedup vs standard (same run) | τ | mean tree | acceptance per depth | same text as standard |")
    print("|---|---|---|---|---|---|---|---|")
    specs = a.runs.split(";")
    res = measure(a, ps, [[]] + [["--method"] + shlex.split(s) for s in specs])
    std = res[0]
    print(f"| {label} | standard | {std['tok_s']:.1f} | 1.00 | 1.00 | 1.0 | — | — |")
    for spec, r in zip(specs, res[1:]):
        same = "yes" if r["texts"] == std["texts"] else ("n/a (sampling)" if a.temp != "0" else "NO")
        accs = " ".join(f"{v:.2f}" for v in r["acc"][:6])
        print(f"| {label} | {spec} | {r['tok_s']:.1f} | {r['tok_s'] / std['tok_s']:.2f} | {r['tau']:.2f} | "
              f"{r['tree']:.1f} | {accs} | {same} |")

if __name__ == "__main__":
    main()
