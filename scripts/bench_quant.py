#!/usr/bin/env python3
"""bench_quant.py — paradec against llama.cpp on the same quantized model, side by side in
one run (a benchmark, never a test).

    scripts/bench_quant.py --llama-bench PATH [--llama-simple PATH] [--reps 3] [-n 128]
                           [--threads 1,2] NAME=PARADEC_MODEL[:GGUF] ...

For each rep, each model and each thread count in turn (interleaved, so the machine's
drift falls on both alike): `bin/decode -m PARADEC_MODEL -n N --temp 0 -t T --json`
(its decode rate: tokens after the first over their time) and, when a GGUF is given,
`llama-bench -m GGUF -p 0 -n N -t T -r 1` (its tg rate). The medians go into a Markdown
table with the ratio, the bytes of weights a token reads, and the share of the read
bandwidth `bin/membw` measured in the same run (before and after the runs). With
--llama-simple, also the time to the first token as a user sees it: the wall time of a
whole process that loads the model, reads the prompt and prints one token
(`bin/decode -n 1` against `llama-simple -n 1`), the least of 5 runs each, interleaved.
"""
import time
import argparse
import json
import statistics
import subprocess
import sys

BIN = "bin"
PROMPT = "Once upon a time"


def paradec(model, n, threads):
    out = subprocess.run([f"{BIN}/decode", "-m", model, "-p", PROMPT, "-n", str(n), "--temp", "0", "-t",
                          str(threads), "--json"], capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"decode failed: {out.stderr.strip()}")
    j = json.loads(out.stdout)
    return j["tok_per_s"], j["weight_bytes_per_token"]


def llama(bench, gguf, n, threads):
    out = subprocess.run([bench, "-m", gguf, "-p", "0", "-n", str(n), "-t", str(threads), "-r", "1", "-o", "json"],
                         capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"llama-bench failed: {out.stderr.strip()[-300:]}")
    return json.loads(out.stdout)[0]["avg_ts"]


def wall(cmd):
    t0 = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def first_token(simple, model, gguf):
    ours = [f"{BIN}/decode", "-m", model, "-p", PROMPT, "-n", "1", "--temp", "0", "-t", "1"]
    theirs = [simple, "-m", gguf, "-n", "1", PROMPT]
    a, b = [], []
    for _ in range(5):
        a.append(wall(ours))
        b.append(wall(theirs))
    return min(a), min(b)


def membw(threads):
    out = subprocess.run([f"{BIN}/membw", "-t", str(threads)], capture_output=True, text=True, check=True)
    return float(out.stdout.split()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-bench", required=True)
    ap.add_argument("--llama-simple")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("models", nargs="+", help="NAME=PARADEC_MODEL[:GGUF]")
    a = ap.parse_args()
    threads = [int(t) for t in a.threads.split(",")]
    models = []
    for m in a.models:
        name, rest = m.split("=", 1)
        ours, _, gguf = rest.partition(":")
        models.append((name, ours, gguf or None))
    bw = {t: [membw(t)] for t in threads}
    ours, theirs, wbytes = {}, {}, {}
    for rep in range(a.reps):
        for name, model, gguf in models:
            for t in threads:
                tps, wb = paradec(model, a.n, t)
                ours.setdefault((name, t), []).append(tps)
                wbytes[name] = wb
                if gguf:
                    theirs.setdefault((name, t), []).append(llama(a.llama_bench, gguf, a.n, t))
        print(f"bench_quant: rep {rep + 1}/{a.reps} done", file=sys.stderr)
    for t in threads:
        bw[t].append(membw(t))
    print("| model | threads | paradec tok/s | llama.cpp tok/s | ratio | MB a token reads | "
          "paradec GB/s | of membw |")
    print("|---|---|---|---|---|---|---|---|")
    for name, _, gguf in models:
        for t in threads:
            p = statistics.median(ours[(name, t)])
            ll = statistics.median(theirs[(name, t)]) if gguf else None
            gbs = p * wbytes[name] / 1e9
            band = statistics.mean(bw[t])
            print(f"| {name} | {t} | {p:.1f} | {f'{ll:.1f}' if ll else '—'} | {f'{p / ll:.2f}×' if ll else '—'} | "
                  f"{wbytes[name] / 1e6:.1f} | {gbs:.2f} | {100 * gbs / band:.0f} % |")
    if a.llama_simple:
        for name, model, gguf in models:
            if gguf:
                ours_s, theirs_s = first_token(a.llama_simple, model, gguf)
                print(f"time to the first token, {name}: paradec {1e3 * ours_s:.0f} ms, llama.cpp {1e3 * theirs_s:.0f} ms")
    print("membw (GB/s, before / after): " + ", ".join(f"{t} thread(s) {bw[t][0]:.2f} / {bw[t][1]:.2f}"
                                                       for t in threads))


if __name__ == "__main__":
    main()
