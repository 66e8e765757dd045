#!/usr/bin/env python3
"""bench_prefix — time to first token with a shared system prompt (a benchmark, never a test).

One server, chat requests one after another, each with the same system prompt of about
--system-tokens tokens (TinyStories text) and a different short user turn; the first
request computes the system prompt, later ones find its KV blocks in the prefix cache.
Prints each request's time to first token and the ratio of the later ones' median to
the first's, with the cache on and (a second server) off.

  scripts/bench_prefix.py -m MODEL [--system-tokens 400] [--requests 8] [--serve-args "..."]
"""
import argparse, gzip, http.client, json, os, statistics, sys, time

from bench_serve import start  # the same server start, on a free port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def story_text():
    for root in [os.environ.get("PARADEC_DATA", ""), os.path.join(ROOT, "data"), os.path.join(ROOT, "..", "shared", "data")]:
        path = os.path.join(root, "datasets", "tinystories", "tinystories_val_sample.txt.gz")
        if root and os.path.exists(path):
            return gzip.open(path, "rt").read()
    sys.exit("bench_prefix: the TinyStories sample is missing (set PARADEC_DATA)")


def ttft(port, system, user):
    """one streamed chat request: (seconds to its first text, prompt tokens)"""
    body = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
            "max_tokens": 4, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    first, prompt = None, 0
    for line in c.getresponse():
        if not line.startswith(b"data: {"):
            continue
        ev = json.loads(line[6:])
        if first is None and ev["choices"] and ev["choices"][0]["delta"].get("content"):
            first = time.perf_counter() - t0
        if ev.get("usage"):
            prompt = ev["usage"]["prompt_tokens"]
    c.close()
    return first if first is not None else time.perf_counter() - t0, prompt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--system-tokens", type=int, default=400)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--serve-args", default="")
    a = ap.parse_args()
    words = story_text().split()
    system = "You answer questions about this story.\n\n" + " ".join(words[: int(a.system_tokens * 0.75)])
    users = [f"Question {i}: who is in the story, and what happens to them?" for i in range(a.requests)]
    print(f"model {os.path.basename(a.model)}, serve {a.serve_args or '(defaults)'}\n")
    print("| prefix cache | prompt tokens | first request's TTFT (s) | later requests' TTFT, median (s) | ratio |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for cache in (True, False):
        p, port = start(a.model, a.serve_args.split() + ([] if cache else ["--no-prefix-cache"]))
        try:
            ttft(port, "Warm up.", "Hi")  # pages the weights in
            t = [ttft(port, system, u) for u in users]
            first, later = t[0][0], statistics.median(x[0] for x in t[1:])
            print(f"| {'on' if cache else 'off'} | {t[0][1]} | {first:.3f} | {later:.3f} | {later / first:.2f} |",
                  flush=True)
        finally:
            p.terminate()
            p.wait()


if __name__ == "__main__":
    main()
