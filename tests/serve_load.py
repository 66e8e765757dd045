#!/usr/bin/env python3
"""serve_load.py PORT REFS METHODS [REQUESTS CLIENTS]: the load of test_serve_load.sh.

CLIENTS threads send REQUESTS /v1/completions requests in all to 127.0.0.1:PORT, a
plan drawn up front with random.Random(1234) so a failure can be replayed: greedy with
a method from METHODS (space-separated) or seeded sampling with standard, streamed or
not, and ~5% streams the client closes after its first one or two events. REFS holds a
JSON object a line, {"prompt", "text"} (greedy: bin/decode's text) or {"prompt", "seed",
"text"} (sampled: the same request sent alone); every answer must equal its line's text.
Prints one JSON summary line; exits 0 only if every request was answered right."""
import http.client, json, os, random, sys, threading, time

MAX_TOKENS, TEMP, SOCKET_S, WHOLE_S = 24, 0.8, 60, 240

port, refs_file, methods = int(sys.argv[1]), sys.argv[2], sys.argv[3].split()
total = int(sys.argv[4]) if len(sys.argv) > 4 else 2000
clients = int(sys.argv[5]) if len(sys.argv) > 5 else 64
refs = [json.loads(l) for l in open(refs_file) if l.strip()]
greedy = [r for r in refs if "seed" not in r]
sampled = [r for r in refs if "seed" in r]

rng = random.Random(1234)
plans = []
for _ in range(total):
    cancel = rng.random() < 0.05
    ref = rng.choice(sampled if rng.random() < 0.35 and sampled else greedy)
    method = rng.choice(methods) if "seed" not in ref else "standard"
    plans.append(dict(ref=ref, method=method, stream=cancel or rng.random() < 0.5,
                      cancel=cancel, keep=rng.choice((1, 2))))

lock = threading.Lock()
count = dict(sent=0, ok=0, mismatched=0, errors=0, cancelled=0, retries=0)
problems = {"mismatched": [], "errors": []}  # the first three of each, printed at the end
next_plan = 0


def note(key, what=None):
    with lock:
        count[key] += 1
        if what and len(problems[key]) < 3:
            problems[key].append(what)


def body_of(p):
    b = {"prompt": p["ref"]["prompt"], "max_tokens": MAX_TOKENS, "method": p["method"],
         "temperature": TEMP if "seed" in p["ref"] else 0, "stream": p["stream"]}
    if "seed" in p["ref"]:
        b["seed"] = p["ref"]["seed"]
    return json.dumps(b)


def events(raw):
    """a stream's data: payloads, in order"""
    return [l[6:] for l in raw.decode().split("\n") if l.startswith("data: ")]


def answer(p, resp):
    """the answer's text and finish_reason, or raises ValueError saying what is wrong"""
    raw = resp.read()
    if not p["stream"]:
        c = json.loads(raw)["choices"][0]
        return c["text"], c["finish_reason"]
    ev = events(raw)
    if not ev or ev[-1] != "[DONE]":
        raise ValueError("the stream did not end with [DONE]: %r" % raw[-200:])
    chunks = [json.loads(e)["choices"][0] for e in ev[:-1]]
    return "".join(c["text"] for c in chunks), chunks[-1]["finish_reason"] if chunks else None


def one(p):
    desc = "%s %s%s %r" % (p["method"], "seed %d " % p["ref"]["seed"] if "seed" in p["ref"] else "",
                           "cancel" if p["cancel"] else "stream" if p["stream"] else "plain",
                           p["ref"]["prompt"][:40])
    for attempt in range(21):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=SOCKET_S)
        try:
            conn.request("POST", "/v1/completions", body_of(p), {"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status == 503 and resp.getheader("Retry-After") and attempt < 20:
                # every connection busy: the documented answer is to come back later (a
                # 21st 503 is an error below)
                wait = min(float(resp.getheader("Retry-After")), 1.0)
                resp.read()
                note("retries")
                time.sleep(wait)
                continue
            if resp.status != 200:
                return note("errors", "%s: HTTP %d %r" % (desc, resp.status, resp.read()[:200]))
            if p["cancel"]:
                seen = 0
                while seen < p["keep"]:
                    line = resp.readline()
                    if not line:
                        break
                    seen += line.startswith(b"data: ")
                return note("cancelled")  # closing the socket below is the cancel
            text, finish = answer(p, resp)
            if finish not in ("length", "stop"):
                return note("errors", "%s: finish_reason %r" % (desc, finish))
            if text != p["ref"]["text"]:
                return note("mismatched", "%s: expected %r got %r" % (desc, p["ref"]["text"], text))
            return note("ok")
        except (OSError, http.client.HTTPException, ValueError, KeyError, IndexError) as e:
            return note("errors", "%s: %s: %s" % (desc, type(e).__name__, e))
        finally:
            conn.close()


def client():
    global next_plan
    while True:
        with lock:
            if next_plan >= total or time.time() > deadline:
                return
            p = plans[next_plan]
            next_plan += 1
            count["sent"] += 1
        one(p)


t0 = time.time()
deadline = t0 + WHOLE_S
threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
for t in threads:
    t.start()
for t in threads:
    t.join(max(0, deadline + 1 - time.time()))
late = sum(t.is_alive() for t in threads)
with lock:  # past the deadline: what was not answered counts as errors
    done = count["ok"] + count["mismatched"] + count["errors"] + count["cancelled"]
    if done < total:
        count["errors"] += total - done
        problems["errors"].append("%d requests unanswered after %d s (%d clients still waiting)" % (total - done, WHOLE_S, late))
    for what in problems["mismatched"] + problems["errors"]:
        print(what, file=sys.stderr)
    print(json.dumps(dict(count, seconds=round(time.time() - t0, 1))), flush=True)
    good = count["mismatched"] == 0 and count["errors"] == 0 and count["ok"] + count["cancelled"] == total
os._exit(0 if good else 1)  # daemon threads still blocked in a socket must not hold the exit
