#!/usr/bin/env python3
"""bench_drafters.py — the drafters' speed (medusa, speculative, prompt lookup, lookahead):
tokens per target pass (τ), the speedup over standard measured in this same run, what a
verification of the round's tree costs (bin/verifycost at the rounds' mean context,
same run), the ideal speedup τ ÷ cost, and how much of it the engine realises.

  python3 scripts/bench_drafters.py --model M [--prompts 100] [--tokens 128] [--temps 0,1]
      [--reps 3] [--dataset tinystories|xsum|humaneval|gsm8k] [--chat] [--label NAME] [--max-chars N] [--prefix TEXT]
      --config "NAME: decode flags" [--config ...]
      [--oracle "NAME: decode flags" --rates 0,0.2,... [--png FILE]]

Each configuration runs the same prompts (one process per prompt, 1 thread) as standard
does, interleaved with it prompt by prompt, --reps times (default 3; a prompt's fastest
run counts); tok/s is summed tokens over summed decode time. The ideal uses the mean of every
round's verification cost at the nodes it ran (decode --json's rounds_by_nodes, side
nodes included, interpolated in the verifycost table). With --oracle the flags get
--oracle-acceptance RATE for every rate (greedy) and the speedup-vs-acceptance curve is
printed (and drawn, when gnuplot is installed)."""
import argparse, json, os, subprocess, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_adadecode import dataset_prompts, run  # noqa: E402  (one decode process a prompt)


def measure(a, ps, runs):
    """runs: {name: decode flags}. Every prompt runs every configuration, --reps times in
    turn, so the machine's drift falls on all of them alike; a prompt's time in a
    configuration is its fastest run (the text and counts are the same each time)."""
    acc = {k: {"toks": 0, "secs": 0, "passes": 0, "trees": 0, "texts": [], "sizes": {}, "ctx": 0} for k in runs}
    for i, p in enumerate(ps):
        best = {}
        for _ in range(a.reps):
            for k, extra in runs.items():
                j = run(a, ["-p", p, "--seed", str(i + 1)] + extra)
                j["secs"] = j["n_gen"] / j["tok_per_s"]
                if k not in best or j["secs"] < best[k]["secs"]:
                    best[k] = j
        for k, j in best.items():
            r = acc[k]
            r["toks"] += j["n_gen"]
            r["secs"] += j["secs"]
            # τ is the tokens after the first over the passes after the prefill
            n = (j["n_gen"] - 1) / j["tau"] if j.get("tau", 0) > 0 else j["n_gen"] - 1
            r["passes"] += n
            r["after_first"] = r.get("after_first", 0) + j["n_gen"] - 1
            r["trees"] += (j.get("mean_tree", 1) if j.get("tau", 0) > 0 else 1) * n
            r["texts"].append(j["tokens"])
            r["ctx"] += j["n_prompt"] + j["n_gen"] / 2
            for m, c in j.get("rounds_by_nodes", {}).items():
                r["sizes"][int(m)] = r["sizes"].get(int(m), 0) + c
    return {k: {"tok_s": r["toks"] / r["secs"], "tau": r["after_first"] / r["passes"], "tree": r["trees"] / r["passes"],
                "texts": r["texts"], "sizes": r["sizes"], "ctx": r["ctx"] / len(ps)} for k, r in acc.items()}


def cost_table(a, ctx):
    """verification costs after ctx positions: the mean context the rounds ran at (a
    node's attention grows with it, so a tree costs more plain steps later in a text)"""
    cmd = [a.bin + "/verifycost", "-m", a.model, "--sizes", "1,2,3,4,6,8,12,16,24,32,48,64", "--reps", "9"]
    run_ = subprocess.run(cmd + (["--ctx", str(ctx)] if ctx else []), capture_output=True, text=True)
    if run_.returncode:  # the biggest tree does not fit after ctx: verifycost's own context
        print(f"verifycost --ctx {ctx}: {run_.stderr.strip()}; measuring at its default context", file=sys.stderr)
        run_ = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return [(j["n"], j["ratio"]) for j in map(json.loads, run_.stdout.split("\n")[:-1])]


def cost(table, n):
    """the cost of an n-node verification, linear between the measured sizes"""
    for (n0, c0), (n1, c1) in zip(table, table[1:]):
        if n <= n1:
            return c0 + (c1 - c0) * (max(n, n0) - n0) / (n1 - n0)
    return table[-1][1] * n / table[-1][0]


def round_cost(table, r):
    """a round's mean verification cost: each round at its own size (side nodes
    included), or the cost at the mean tree where decode did not report sizes"""
    if not r["sizes"]:
        return cost(table, r["tree"])
    return sum(c * cost(table, n) for n, c in r["sizes"].items()) / sum(r["sizes"].values())


def config(s):
    name, _, flags = s.partition(":")
    return name.strip(), flags.split()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--bin", default="bin")
    ap.add_argument("--prompts", type=int, default=100)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--temps", default="0,1")
    ap.add_argument("--dataset", default="tinystories")
    ap.add_argument("--chat", action="store_true")
    ap.add_argument("--label", default="")
    ap.add_argument("--config", action="append", default=[])
    ap.add_argument("--oracle", default="")
    ap.add_argument("--rates", default="0,0.2,0.4,0.6,0.7,0.8,0.9,1")
    ap.add_argument("--png", default="")
    ap.add_argument("--reps", type=int, default=3, help="runs of each prompt in each configuration (the fastest counts)")
    ap.add_argument("--max-chars", type=int, default=0, help="cut prompts to this many characters")
    ap.add_argument("--prefix", default="", help="put this before every prompt (e.g. 'summarise: ')")
    a = ap.parse_args()
    data = os.environ.get("PARADEC_DATA") or "../shared/data"
    ps = [a.prefix + (p[:a.max_chars] if a.max_chars else p) for p in dataset_prompts(a.dataset, a.prompts, data)]
    label = (a.label or os.path.basename(a.model)) + ("" if a.dataset == "tinystories" else ", " + a.dataset)
    runs = [(temp, measure(a, ps, dict([("standard", ["--temp", temp])] +
                                       [(n, ["--temp", temp] + f) for n, f in map(config, a.config)])))
            for temp in (a.temps.split(",") if a.config else [])]
    if a.oracle:
        oname, oflags = config(a.oracle)
        rates = a.rates.split(",")
        ores = measure(a, ps, dict([("standard", ["--temp", "0"])] +
                                   [(r, ["--temp", "0", "--oracle-acceptance", r] + oflags) for r in rates]))
    stds = [res["standard"] for _, res in runs] + ([ores["standard"]] if a.oracle else [])
    ctx = round(sum(s["ctx"] for s in stds) / len(stds)) if stds else None  # None: verifycost's own
    table = cost_table(a, ctx)
    at = f" --ctx {ctx}, the rounds' mean context" if ctx else ""
    print(f"verification cost (bin/verifycost{at}, this run): " +
          ", ".join(f"{n} nodes {c:.2f}×" for n, c in table))
    print()
    if a.config:
        print("| model | temp | method | tok/s | speedup vs standard (same run) | τ (tokens/pass) | mean tree | "
              "verify cost | ideal speedup τ÷cost | realised ÷ ideal | same text as standard |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
    for temp, res in runs:
        std = res.pop("standard")
        print(f"| {label} | {temp} | standard | {std['tok_s']:.1f} | 1.00 | 1.00 | 1 | 1.00 | 1.00 | — | — |")
        for name, r in res.items():
            sp = r["tok_s"] / std["tok_s"]
            cst = round_cost(table, r)
            ideal = r["tau"] / cst
            same = "yes" if r["texts"] == std["texts"] else ("n/a (sampling)" if temp != "0" else "NO")
            print(f"| {label} | {temp} | {name} | {r['tok_s']:.1f} | {sp:.2f} | {r['tau']:.2f} | {r['tree']:.1f} | "
                  f"{cst:.2f} | {ideal:.2f} | {sp / ideal:.2f} | {same} |")
    if a.oracle:
        print()
        print("| model | method | oracle acceptance | tok/s | speedup vs standard | τ | mean tree | ideal | same text |")
        print("|---|---|---|---|---|---|---|---|---|")
        std, pts = ores.pop("standard"), []
        for rate, r in ores.items():
            sp = r["tok_s"] / std["tok_s"]
            pts.append((float(rate), sp, r["tau"]))
            print(f"| {label} | {oname} | {rate} | {r['tok_s']:.1f} | {sp:.2f} | {r['tau']:.2f} | {r['tree']:.1f} | "
                  f"{r['tau'] / round_cost(table, r):.2f} | {'yes' if r['texts'] == std['texts'] else 'NO'} |")
        if a.png and subprocess.run(["which", "gnuplot"], capture_output=True).returncode == 0:
            dat = a.png + ".dat"
            open(dat, "w").write("".join(f"{x} {y} {t}\n" for x, y, t in pts))
            subprocess.run(["gnuplot", "-e", f"set terminal png size 640,400; set output '{a.png}'; "
                            f"set xlabel 'oracle acceptance per head'; set ylabel 'speedup over standard'; set grid; "
                            f"set y2label 'tau'; set y2tics; set title '{oname}, {label}'; "
                            f"plot '{dat}' using 1:2 with linespoints title 'speedup', "
                            f"'{dat}' using 1:3 axes x1y2 with linespoints title 'tau', 1 title 'standard'"])
            os.remove(dat)


main()
