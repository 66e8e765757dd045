#!/usr/bin/env python3
"""smollm2_logits.py — a slow, independent reference forward pass for a llama GGUF
(SmolLM2-135M-Instruct), in numpy float64 on the weights as llama.cpp's own Python
package (gguf, from PyPI) dequantises them. It uses the GGUF's q/k rows as stored
(Meta's interleaved RoPE pairs), so paradec's un-permutation is checked too.

  python smollm2_logits.py GGUF OUT.f32 ID [ID ...]

writes the last position's logits as raw float32. scripts/quality_ref.py imports
Reference for its float64 logits of many positions."""
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


class Reference:
    def __init__(self, path):
        r = GGUFReader(path)
        kv = {f.name: f for f in r.fields.values()}

        def scalar(key):
            f = kv[key]
            return f.parts[f.data[0]][0]

        self.W = {}
        for t in r.tensors:
            self.W[t.name] = dequantize(t.data, t.tensor_type).astype(np.float64).reshape(
                [int(d) for d in reversed(t.shape)])
        self.L = int(scalar("llama.block_count"))
        self.H = int(scalar("llama.attention.head_count"))
        self.KV = int(scalar("llama.attention.head_count_kv"))
        self.eps = float(scalar("llama.attention.layer_norm_rms_epsilon"))
        self.theta = float(scalar("llama.rope.freq_base"))

    def logits(self, ids, rows):
        """float64 logits [len(rows)][vocab] of the positions rows of the sequence ids"""
        W, H, KV, eps, theta = self.W, self.H, self.KV, self.eps, self.theta
        E = W["token_embd.weight"]
        D = E.shape[1]
        hd = D // H
        n = len(ids)

        def rms(x, g):
            return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g

        def rope(x):  # x: [n, heads, hd], pairs (2i, 2i+1)
            pos = np.arange(n)[:, None]
            freq = theta ** (-np.arange(0, hd, 2) / hd)
            a = pos * freq[None, :]
            c, s = np.cos(a)[:, None, :], np.sin(a)[:, None, :]
            x0, x1 = x[..., 0::2], x[..., 1::2]
            y = np.empty_like(x)
            y[..., 0::2] = x0 * c - x1 * s
            y[..., 1::2] = x0 * s + x1 * c
            return y

        x = E[ids]
        mask = np.triu(np.full((n, n), -np.inf), 1)
        for l in range(self.L):
            p = f"blk.{l}."
            h = rms(x, W[p + "attn_norm.weight"])
            q = rope((h @ W[p + "attn_q.weight"].T).reshape(n, H, hd))
            k = rope((h @ W[p + "attn_k.weight"].T).reshape(n, KV, hd))
            v = (h @ W[p + "attn_v.weight"].T).reshape(n, KV, hd)
            k = np.repeat(k, H // KV, axis=1)
            v = np.repeat(v, H // KV, axis=1)
            att = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd) + mask
            att = np.exp(att - att.max(-1, keepdims=True))
            att /= att.sum(-1, keepdims=True)
            o = np.einsum("hqk,khd->qhd", att, v).reshape(n, D)
            x = x + o @ W[p + "attn_output.weight"].T
            h = rms(x, W[p + "ffn_norm.weight"])
            g = h @ W[p + "ffn_gate.weight"].T
            u = h @ W[p + "ffn_up.weight"].T
            x = x + (g / (1 + np.exp(-g)) * u) @ W[p + "ffn_down.weight"].T
        head = W.get("output.weight", E)
        return rms(x[rows], W["output_norm.weight"]) @ head.T


def main():
    path, out, ids = sys.argv[1], sys.argv[2], [int(x) for x in sys.argv[3:]]
    Reference(path).logits(ids, [len(ids) - 1])[0].astype(np.float32).tofile(out)


if __name__ == "__main__":
    main()
