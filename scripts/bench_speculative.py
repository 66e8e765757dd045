#!/usr/bin/env python3
"""bench_speculative.py — draft-model speculative decoding against standard, in the same
run: tokens/s, speedup, τ (tokens per target pass), the mean draft length, acceptance
per depth, and whether the greedy text is standard's (a benchmark, never a test).

  python3 scripts/bench_speculative.py --model M --draft D [--prompts 50] [--tokens 128]
      [--temps 0,1] [--config "NAME: decode flags"]... [--oracle "NAME: decode flags"]...

Every configuration gets `--method speculative --draft D` in front of its flags. The
runs are interleaved prompt by prompt (standard, then each configuration, on the same
prompt and seed) so that a busy machine slows every method alike; one process per run,
1 thread; tok/s is summed tokens over summed decode time. --oracle configurations run
greedy only (the oracle knows standard's greedy text). bin/verifycost's table (same run)
gives each configuration's verification cost at its mean round size and the ideal
speedup τ ÷ cost."""
import argparse, json, os, subprocess, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_adadecode import dataset_prompts  # noqa: E402

DEFAULT = ["adaptive: ", "fixed k=3: --draft-fixed --draft-max 3 --fixed-tree"]


def decode(a, extra):
    cmd = [a.bin + "/decode", "-m", a.model, "-n", str(a.tokens), "--json", "-t", "1"] + extra
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        sys.exit("bench: " + " ".join(cmd) + ": " + r.stderr.strip())
    return json.loads(r.stdout)


def cost_table(a):
    out = subprocess.run([a.bin + "/verifycost", "-m", a.model, "--sizes", "1,2,3,4,5,6,7,8,9,12,16",
                          "--reps", "15"], capture_output=True, text=True, check=True).stdout
    return [(j["n"], j["ratio"]) for j in map(json.loads, out.split("\n")[:-1])]


def cost(table, n):
    for (n0, c0), (n1, c1) in zip(table, table[1:]):
        if n <= n1:
            return c0 + (c1 - c0) * (max(n, n0) - n0) / (n1 - n0)
    return table[-1][1] * n / table[-1][0]


class Sum:
    def __init__(self):
        self.tok = self.sec = self.passes = self.nodes = 0
        self.acc = []
        self.texts = []

    def add(self, j):
        self.tok += j["n_gen"]
        self.sec += j["n_gen"] / j["tok_per_s"]
        p = j["n_gen"] / j["tau"] if j.get("tau") else j["n_gen"]
        self.passes += p
        self.nodes += j.get("mean_tree", 1) * p
        self.acc.append(j.get("acceptance_per_depth", []))
        self.texts.append(j["tokens"])

    def depth_acc(self, k=4):
        """mean acceptance at depths 1..k over the prompts that reached them"""
        out = []
        for d in range(k):
            v = [x[d] for x in self.acc if len(x) > d]
            out.append(f"{sum(v) / len(v):.2f}" if v else "—")
        return " ".join(out)


def config(s):
    name, _, flags = s.partition(":")
    return name.strip(), flags.split()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--bin", default="bin")
    ap.add_argument("--prompts", type=int, default=50)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--temps", default="0,1")
    ap.add_argument("--dataset", default="tinystories")
    ap.add_argument("--config", action="append", default=[])
    ap.add_argument("--oracle", action="append", default=[])
    ap.add_argument("--no-cost", action="store_true")
    a = ap.parse_args()
    a.chat = False
    data = os.environ.get("PARADEC_DATA") or "../shared/data"
    ps = dataset_prompts(a.dataset, a.prompts, data)
    cfgs = [config(c) for c in (a.config or DEFAULT)]
    oracles = [config(c) for c in a.oracle]
    table = None if a.no_cost else cost_table(a)
    if table:
        print("verification cost (bin/verifycost --reps 15, this run): " +
              ", ".join(f"{n} nodes {c:.2f}×" for n, c in table))
    print(f"\n{len(ps)} prompts × {a.tokens} tokens, model {a.model}, draft {a.draft}\n")
    print("| temp | method | tok/s | speedup vs standard | τ | mean draft length | acceptance at depth 1..4 | "
          "verify cost | ideal τ÷cost | same text |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for temp in a.temps.split(","):
        runs = cfgs + (oracles if temp == "0" else [])
        std, res = Sum(), [Sum() for _ in runs]
        for i, p in enumerate(ps):
            base = ["-p", p, "--seed", str(i + 1), "--temp", temp]
            std.add(decode(a, base))
            for (name, flags), r in zip(runs, res):
                r.add(decode(a, base + ["--method", "speculative", "--draft", a.draft] + flags))
        s0 = std.tok / std.sec
        print(f"| {temp} | standard | {s0:.1f} | 1.00 | 1.00 | — | — | 1.00 | 1.00 | — |")
        for (name, flags), r in zip(runs, res):
            tau, tree, sp = r.tok / r.passes, r.nodes / r.passes, r.tok / r.sec / s0
            c = cost(table, tree) if table else float("nan")
            same = "yes" if r.texts == std.texts else ("n/a (sampling)" if temp != "0" else "NO")
            print(f"| {temp} | {name} | {r.tok / r.sec:.1f} | {sp:.2f} | {tau:.2f} | {tree - 1:.2f} | "
                  f"{r.depth_acc()} | {c:.2f} | {tau / c:.2f} | {same} |")
            sys.stdout.flush()


main()
