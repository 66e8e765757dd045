#!/usr/bin/env python3
"""bench_adadecode.py — AdaDecode's engine efficiency and its headroom (issue 4, point 5).

  python3 scripts/bench_adadecode.py --model M --heads H [--prompts 100] [--tokens 128]
          [--temps 0,1] [--oracle 0,0.2,...] [--methods adadecode,self-speculative]

For each temperature: runs standard and each method on the same prompts (cut from the
TinyStories sample), one process per prompt and method, 1 thread, and prints
tok/s (summed tokens over summed decode time), the speedup over standard measured in
this same run, sequential layer passes per token, the rejection rate, and the ideal
speedup those passes imply (n_layers / passes per token). With --oracle it sweeps
--oracle-exit RATE (greedy) and prints speedup against RATE (and writes a PNG when
gnuplot is installed). Output is markdown; every row says which model it ran."""
import argparse, gzip, json, os, subprocess, sys

def dataset_prompts(name, n, data):
    """chat prompts built from a dataset's records (XSum, HumanEval, GSM8K), or
    TinyStories openings"""
    if name == "tinystories":
        return prompts(n, os.path.join(data, "datasets/tinystories/tinystories_val_sample.txt.gz"))
    files = {"xsum": "datasets/xsum/test_1000.jsonl.gz", "humaneval": "datasets/humaneval/HumanEval.jsonl.gz",
             "gsm8k": "datasets/gsm8k/test.jsonl.gz"}
    out = []
    for line in gzip.open(os.path.join(data, files[name]), "rt", encoding="utf-8"):
        r = json.loads(line)
        if name == "xsum":
            out.append("Summarize this article in one sentence.\n\n" + r["document"][:1200])
        elif name == "humaneval":
            out.append("Complete this Python function.\n\n" + r["prompt"])
        else:
            out.append(r["question"])
        if len(out) == n:
            break
    return out

def prompts(n, path):
    text = gzip.open(path, "rt", encoding="utf-8").read()
    out = []
    for para in text.split("\n\n"):
        w = para.split()
        if len(w) >= 8 and w[0][0].isupper():
            out.append(" ".join(w[:6]))
        if len(out) == n:
            break
    return out

def run(args, extra):
    cmd = [args.bin + "/decode", "-m", args.model, "-n", str(args.tokens), "--json", "-t", "1"] + extra
    if args.chat:
        cmd.append("--chat")
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        sys.exit("bench: " + " ".join(cmd) + ": " + r.stderr.strip())
    return json.loads(r.stdout)

def total(args, ps, extra):
    toks = secs = lp = drafted = rejected = 0
    texts = []
    for i, p in enumerate(ps):
        j = run(args, ["-p", p, "--seed", str(i + 1)] + extra)
        toks += j["n_gen"]
        secs += j["n_gen"] / j["tok_per_s"]
        lp += j.get("layer_passes_per_token", 0) * j["n_gen"]
        drafted += j.get("drafted", 0)
        rejected += j.get("rejection_rate", 0) * j.get("drafted", 0)
        texts.append(j["tokens"])
    return {"tok_s": toks / secs, "passes": lp / toks, "rej": rejected / drafted if drafted else 0,
            "texts": texts, "toks": toks}

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--heads", required=True)
    ap.add_argument("--bin", default="bin")
    ap.add_argument("--prompts", type=int, default=100)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--temps", default="0,1")
    ap.add_argument("--gamma", default="0.75")
    ap.add_argument("--methods", default="adadecode,self-speculative")
    ap.add_argument("--oracle", default="")
    ap.add_argument("--layers", type=int, required=True, help="the model's n_layers")
    ap.add_argument("--label", default="")
    ap.add_argument("--png", default="")
    ap.add_argument("--dataset", default="tinystories", help="tinystories, xsum, humaneval or gsm8k")
    ap.add_argument("--chat", action="store_true", help="wrap prompts in the model's chat format")
    a = ap.parse_args()
    data = os.environ.get("PARADEC_DATA") or "../shared/data"
    ps = dataset_prompts(a.dataset, a.prompts, data)
    label = (a.label or os.path.basename(a.model)) + ("" if a.dataset == "tinystories" else ", " + a.dataset)
    print(f"| model | temp | method | tok/s | speedup vs standard (same run) | layer passes/token | ideal speedup | realised ÷ ideal | rejection rate | same text as standard |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for temp in a.temps.split(","):
        std = total(a, ps, ["--temp", temp])
        print(f"| {label} | {temp} | standard | {std['tok_s']:.1f} | 1.00 | {a.layers:.2f} | 1.00 | — | — | — |")
        for m in a.methods.split(","):
            r = total(a, ps, ["--temp", temp, "--method", m, "--heads", a.heads, "--gamma", a.gamma])
            sp = r["tok_s"] / std["tok_s"]
            ideal = a.layers / r["passes"] if r["passes"] else 0
            same = "yes" if r["texts"] == std["texts"] else ("n/a (sampling)" if temp != "0" else "NO")
            print(f"| {label} | {temp} | {m} γ={a.gamma} | {r['tok_s']:.1f} | {sp:.2f} | {r['passes']:.2f} | {ideal:.2f} | "
                  f"{sp / ideal if ideal else 0:.2f} | {r['rej']:.3f} | {same} |")
            sys.stdout.flush()
    if a.oracle:
        print()
        print("| model | oracle exit rate | tok/s | speedup vs standard | layer passes/token | same text |")
        print("|---|---|---|---|---|---|")
        std = total(a, ps, ["--temp", "0"])
        pts = []
        for rate in a.oracle.split(","):
            r = total(a, ps, ["--temp", "0", "--method", "adadecode", "--heads", a.heads, "--oracle-exit", rate])
            sp = r["tok_s"] / std["tok_s"]
            pts.append((float(rate), sp))
            print(f"| {label} (oracle) | {rate} | {r['tok_s']:.1f} | {sp:.2f} | {r['passes']:.2f} | "
                  f"{'yes' if r['texts'] == std['texts'] else 'NO'} |")
            sys.stdout.flush()
        if a.png and subprocess.run(["which", "gnuplot"], capture_output=True).returncode == 0:
            dat = a.png + ".dat"
            open(dat, "w").write("".join(f"{x} {y}\n" for x, y in pts))
            subprocess.run(["gnuplot", "-e", f"set terminal png size 640,400; set output '{a.png}'; "
                            f"set xlabel 'oracle exit rate'; set ylabel 'speedup over standard'; set grid; "
                            f"set title 'AdaDecode, {label}, oracle at the middle head'; "
                            f"plot '{dat}' with linespoints title 'measured', 1 title 'standard'"])
            os.remove(dat)

if __name__ == "__main__":
    main()
