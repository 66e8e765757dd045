#!/usr/bin/env python3
"""bench_serve — bin/serve under load (a benchmark, never a test).

For each concurrency C, C clients on loopback each send requests back to back
(streaming, greedy, TinyStories openings as prompts) until R requests have been
answered; each mode runs on a fresh server: continuous batching, and static
batching (--no-continuous: a batch forms when none runs and runs to its end).
Prints a markdown table: generated tok/s over the wall time, request latency and
time to first token percentiles.

  scripts/bench_serve.py -m MODEL [--conc 1,4,16,64] [--requests R] [--max-tokens N]
                         [--method NAME] [--serve-args "..."] [--prompt-words N] [--chat]

--chat sends each opening as a user's message to /v1/chat/completions ("Continue this
story: ..."), for an instruct model and heads trained on its chat answers (TinyStories is
in no recipe's training data).
"""
import argparse, gzip, http.client, json, os, re, subprocess, sys, threading, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def prompts(n, words=6):
    """the first words of TinyStories stories: open prompts of a few tokens (or longer)"""
    for root in [os.environ.get("PARADEC_DATA", ""), os.path.join(ROOT, "data"), os.path.join(ROOT, "..", "shared", "data")]:
        path = os.path.join(root, "datasets", "tinystories", "tinystories_val_sample.txt.gz")
        if root and os.path.exists(path):
            text = gzip.open(path, "rt").read()
            break
    else:
        sys.exit("bench_serve: the TinyStories sample is missing (set PARADEC_DATA)")
    starts = [" ".join(s.split()[:words]) for s in re.split(r"\n\s*\n|<\|endoftext\|>", text) if len(s.split()) > words + 2]
    return [starts[i % len(starts)] for i in range(n)]


def start(model, extra):
    log = open("/tmp/bench_serve.log", "w+")
    p = subprocess.Popen([os.path.join(ROOT, "bin", "serve"), "-m", model, "--port", "0"] + extra, stderr=log)
    for _ in range(600):
        log.seek(0)
        m = re.search(r"127\.0\.0\.1:(\d+)", log.read())
        if m:
            return p, int(m.group(1))
        if p.poll() is not None:
            break
        time.sleep(0.1)
    log.seek(0)
    sys.exit("bench_serve: the server did not start: " + log.read())


def one(port, prompt, max_tokens, method, chat=False):
    """one streamed request: (latency, time to first token, generated tokens)"""
    body = {"max_tokens": max_tokens, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    if chat:
        body["messages"] = [{"role": "user", "content": "Continue this story: " + prompt}]
    else:
        body["prompt"] = prompt
    if method:
        body["method"] = method
    t0 = time.perf_counter()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/chat/completions" if chat else "/v1/completions", json.dumps(body),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    ttft, n = None, 0
    for line in r:
        if not line.startswith(b"data: {"):
            continue
        ev = json.loads(line[6:])
        delta = ev["choices"][0].get("text") or ev["choices"][0].get("delta", {}).get("content") if ev["choices"] else None
        if ttft is None and delta:
            ttft = time.perf_counter() - t0
        if ev.get("usage"):
            n = ev["usage"]["completion_tokens"]
    c.close()
    t = time.perf_counter() - t0
    return t, ttft if ttft is not None else t, n


def load(port, conc, total, max_tokens, method, ps, chat):
    """conc clients, total requests; (wall seconds, results)"""
    lock, results, next_i = threading.Lock(), [], [0]

    def client():
        while True:
            with lock:
                i = next_i[0]
                if i >= total:
                    return
                next_i[0] += 1
            res = one(port, ps[i], max_tokens, method, chat)
            with lock:
                results.append(res)

    t0 = time.perf_counter()
    th = [threading.Thread(target=client) for _ in range(conc)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    return time.perf_counter() - t0, results


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--conc", default="1,4,16,64")
    ap.add_argument("--requests", type=int, default=0, help="per concurrency (default max(2C, 8))")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--method", default=None)
    ap.add_argument("--serve-args", default="")
    ap.add_argument("--modes", default="continuous,static")
    ap.add_argument("--prompt-words", type=int, default=6, help="each prompt: a story's first N words")
    ap.add_argument("--chat", action="store_true", help="chat requests (above)")
    a = ap.parse_args()
    concs = [int(c) for c in a.conc.split(",")]
    print(f"model {os.path.basename(a.model)}, {'chat ' if a.chat else ''}prompts of {a.prompt_words} words, max_tokens {a.max_tokens}, greedy, streamed, "
          f"method {a.method or 'standard'}, serve {a.serve_args or '(defaults)'} --parallel {max(concs)}\n")
    print("| batching | clients | requests | generated tok/s | latency p50 / p90 / p99 (s) | first token p50 / p99 (s) |")
    print("| --- | ---: | ---: | ---: | --- | --- |")
    for mode in a.modes.split(","):
        extra = a.serve_args.split() + ["--parallel", str(max(concs))] + (["--no-continuous"] if mode == "static" else [])
        p, port = start(a.model, extra)
        try:
            one(port, "Once upon a time", 8, None)  # warm: pages the weights in
            for c in concs:
                total = a.requests or max(2 * c, 8)
                wall, res = load(port, c, total, a.max_tokens, a.method, prompts(total, a.prompt_words), a.chat)
                lat, ttft, toks = [r[0] for r in res], [r[1] for r in res], sum(r[2] for r in res)
                print(f"| {mode} | {c} | {total} | {toks / wall:.1f} | {pct(lat, .5):.2f} / {pct(lat, .9):.2f} / "
                      f"{pct(lat, .99):.2f} | {pct(ttft, .5):.3f} / {pct(ttft, .99):.3f} |", flush=True)
        finally:
            p.terminate()
            p.wait()


if __name__ == "__main__":
    main()
