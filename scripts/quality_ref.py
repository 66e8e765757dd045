#!/usr/bin/env python3
"""quality_ref.py — how far paradec's logits are from a float64 reference (a measurement).

    scripts/quality_ref.py MODEL.gguf LOGITS [LOGITS ...]

MODEL.gguf's weights are dequantised by gguf-py (gguf.quants.dequantize) and a Llama
forward pass runs in float64 numpy (tests/ref/smollm2_logits.py, the suite's reference)
on the chunks a `bin/perplexity --logits` file holds (its tokens, its CTX). For each
LOGITS file (paradec's float32 logits of the scored positions, same chunks) it prints
one JSON line: top-1 agreement with the reference, mean and max KL(reference ||
paradec) in nats, both perplexities. Nothing here is paradec's code.
Run with the venv `make models` sets up: ~/.cache/paradec/venv/bin/python.
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "ref"))
from smollm2_logits import Reference  # noqa: E402  (the test suite's float64 forward pass)


def read_logits(path):
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    if bytes(raw[:8]) != b"PDLOGITS":
        sys.exit(f"{path}: not a bin/perplexity --logits file")
    ctx, vocab, chunks, first = np.frombuffer(raw[8:24], dtype=np.int32)
    tok_end = 24 + 4 * chunks * ctx
    tokens = np.frombuffer(raw[24:tok_end], dtype=np.int32).reshape(chunks, ctx)
    scored = ctx - 1 - first
    logits = np.frombuffer(raw[tok_end:], dtype=np.float32).reshape(chunks, scored, vocab)
    return int(ctx), int(first), tokens, logits


def log_softmax(z):
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    m = Reference(sys.argv[1])
    files = [read_logits(p) for p in sys.argv[2:]]
    ctx, first, tokens, _ = files[0]
    for c, f, t, _ in files[1:]:
        if c != ctx or f != first or not np.array_equal(t, tokens):
            sys.exit("the LOGITS files hold different chunks")
    stats = [dict(agree=0, kl=0.0, kl_max=0.0, nll=0.0) for _ in files]
    ref_nll, count = 0.0, 0
    for c in range(tokens.shape[0]):
        rows = np.arange(first, ctx - 1)
        ref = log_softmax(m.logits(tokens[c], rows))
        target = tokens[c][rows + 1]
        ref_nll -= ref[np.arange(len(rows)), target].sum()
        pref = np.exp(ref)
        for s, (_, _, _, lg) in zip(stats, files):
            got = log_softmax(lg[c].astype(np.float64))
            kl = (pref * (ref - got)).sum(axis=1)
            s["agree"] += int((got.argmax(axis=1) == ref.argmax(axis=1)).sum())
            s["kl"] += float(kl.sum())
            s["kl_max"] = max(s["kl_max"], float(kl.max()))
            s["nll"] -= float(got[np.arange(len(rows)), target].sum())
        count += len(rows)
        print(f"quality_ref: chunk {c + 1}/{tokens.shape[0]}", file=sys.stderr)
    for path, s in zip(sys.argv[2:], stats):
        print(json.dumps(dict(file=path, positions=count, top1_agreement=s["agree"] / count,
                              mean_kl=s["kl"] / count, max_kl=s["kl_max"],
                              ppl=float(np.exp(s["nll"] / count)), ref_ppl=float(np.exp(ref_nll / count)))))


if __name__ == "__main__":
    main()
