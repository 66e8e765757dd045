#!/usr/bin/env python3
"""quality_ref.py — how far paradec's logits are from a float64 reference (a measurement).

    scripts/quality_ref.py MODEL.gguf LOGITS [LOGITS ...]

MODEL.gguf's weights are dequantised by gguf-py (gguf.quants.dequantize) and a Llama
forward pass runs in float64 numpy on the chunks a `bin/perplexity --logits` file holds
(its tokens, its CTX). For each LOGITS file (paradec's float32 logits of the scored
positions, same chunks) it prints one JSON line: top-1 agreement with the reference,
mean and max KL(reference || paradec) in nats, both perplexities. Nothing here is
paradec's code: the reference is written from the Llama architecture and GGUF's layout
(llama.cpp's converter stores q/k rows so that RoPE rotates adjacent pairs).
Run with the venv `make models` sets up: ~/.cache/paradec/venv/bin/python.
"""
import json
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


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


class Model:
    def __init__(self, path):
        r = GGUFReader(path)
        arch = r.fields["general.architecture"]
        arch = bytes(arch.parts[arch.data[0]]).decode()

        def val(key):
            f = r.fields[f"{arch}.{key}"]
            return f.parts[f.data[0]][0]

        self.n_layers = int(val("block_count"))
        self.n_heads = int(val("attention.head_count"))
        self.n_kv = int(val("attention.head_count_kv"))
        self.dim = int(val("embedding_length"))
        self.hd = self.dim // self.n_heads
        self.eps = float(val("attention.layer_norm_rms_epsilon"))
        self.theta = float(val("rope.freq_base")) if f"{arch}.rope.freq_base" in r.fields else 10000.0
        self.w = {}
        for t in r.tensors:
            a = dequantize(t.data, t.tensor_type).astype(np.float64)
            self.w[t.name] = a.reshape([int(x) for x in reversed(t.shape)]) if a.ndim > 1 or len(t.shape) > 1 else a
        self.out = self.w.get("output.weight", self.w["token_embd.weight"])

    def norm(self, x, g):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * g

    def rope(self, x, n):  # x [n][heads][hd], adjacent pairs rotate
        j = np.arange(self.hd // 2)
        freq = self.theta ** (-2.0 * j / self.hd)
        ang = np.arange(n)[:, None] * freq[None, :]
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        a, b = x[..., 0::2], x[..., 1::2]
        y = np.empty_like(x)
        y[..., 0::2] = a * c - b * s
        y[..., 1::2] = a * s + b * c
        return y

    def logits(self, tokens, rows):
        n, W = len(tokens), self.w
        x = W["token_embd.weight"][tokens]
        mask = np.triu(np.full((n, n), -np.inf), 1)
        g = self.n_heads // self.n_kv
        for l in range(self.n_layers):
            p = f"blk.{l}."
            h = self.norm(x, W[p + "attn_norm.weight"])
            q = self.rope((h @ W[p + "attn_q.weight"].T).reshape(n, self.n_heads, self.hd), n)
            k = self.rope((h @ W[p + "attn_k.weight"].T).reshape(n, self.n_kv, self.hd), n)
            v = (h @ W[p + "attn_v.weight"].T).reshape(n, self.n_kv, self.hd)
            o = np.empty((n, self.n_heads, self.hd))
            for hh in range(self.n_heads):
                s = q[:, hh] @ k[:, hh // g].T / np.sqrt(self.hd) + mask
                s = np.exp(s - s.max(axis=1, keepdims=True))
                o[:, hh] = (s / s.sum(axis=1, keepdims=True)) @ v[:, hh // g]
            x = x + o.reshape(n, self.dim) @ W[p + "attn_output.weight"].T
            h = self.norm(x, W[p + "ffn_norm.weight"])
            a, b = h @ W[p + "ffn_gate.weight"].T, h @ W[p + "ffn_up.weight"].T
            x = x + (a / (1 + np.exp(-a)) * b) @ W[p + "ffn_down.weight"].T
        return self.norm(x[rows], W["output_norm.weight"]) @ self.out.T


def log_softmax(z):
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    m = Model(sys.argv[1])
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
