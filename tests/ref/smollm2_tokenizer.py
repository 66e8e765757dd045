#!/usr/bin/env python3
"""smollm2_tokenizer.py — cross-checks paradec's GGUF byte-level BPE tokenizer against an
independent one: Hugging Face's `tokenizers` library (PyPI), given the same vocabulary and
merges read from SmolLM2-135M-Instruct's GGUF file, and the pre-tokenizer llama.cpp's
"smollm" name stands for (llama-vocab.cpp: the regex \\p{N} first, each digit a piece,
then GPT-2's regex on what is left; HF: Split(\\p{N}, isolated) + ByteLevel(use_regex)).

Texts: llama.cpp's tokenizer test strings (ggml-vocab-llama-bpe.gguf.inp), the first 20
XSum documents cut to 500 characters, every HumanEval prompt, every GSM8K question.
Prints the agreement rate; exit 0 only when every text gives the same ids.

  python3 -m venv build/venv && build/venv/bin/pip install tokenizers
  build/venv/bin/python tests/ref/smollm2_tokenizer.py [--gguf PATH] [--tool bin/tokenize]

Not run by `make test` (it needs the venv and the model); the GGUF is read with the tiny
parser below, so only `tokenizers` is needed.
"""
import argparse
import gzip
import json
import os
import struct
import subprocess
import sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

SEP = "\n__ggml_vocab_test__\n"


def gguf_kv(path):
    """the key/values of a GGUF file (version 2/3), tensors not read"""
    with open(path, "rb") as f:
        d = f.read(64 << 20)  # the metadata comes first; 64 MiB holds any vocabulary
    o = 0

    def u(fmt):
        nonlocal o
        v = struct.unpack_from("<" + fmt, d, o)[0]
        o += struct.calcsize("<" + fmt)
        return v

    def s():
        nonlocal o
        n = u("Q")
        v = d[o:o + n]
        o += n
        return v.decode("utf-8", errors="surrogateescape")

    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def val(t):
        if t == 8:
            return s()
        if t == 9:
            et, n = u("I"), u("Q")
            return [val(et) for _ in range(n)]
        return u(scalar[t])

    if d[:4] != b"GGUF":
        sys.exit(f"{path}: not a GGUF file")
    o = 4
    version, _n_tensors, n_kv = u("I"), u("Q"), u("Q")
    if version not in (2, 3):
        sys.exit(f"{path}: GGUF version {version}")
    kv = {}
    for _ in range(n_kv):
        k = s()
        kv[k] = val(u("I"))
    return kv


def reference_tokenizer(kv):
    if kv["tokenizer.ggml.model"] != "gpt2" or kv.get("tokenizer.ggml.pre") != "smollm":
        sys.exit("expected a gpt2 vocabulary with the smollm pre-tokenizer")
    tokens, types = kv["tokenizer.ggml.tokens"], kv["tokenizer.ggml.token_type"]
    vocab = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)  # a repeated piece: the first id, as paradec's map keeps
    merges = []
    for m in kv["tokenizer.ggml.merges"]:
        cut = m.index(" ", 1)  # llama.cpp: the first space after the first byte
        merges.append((m[:cut], m[cut + 1:]))
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=None, byte_fallback=False))
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False)
                           for t, ty in zip(tokens, types) if ty == 3])
    return tk


def data_path(rel):
    for root in (os.environ.get("PARADEC_DATA"), "data", "../shared/data"):
        if root and os.path.exists(os.path.join(root, rel)):
            return os.path.join(root, rel)
    sys.exit(f"{rel} not found under $PARADEC_DATA, data/ or ../shared/data")


def jsonl(rel):
    with gzip.open(data_path(rel), "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def texts():
    with open(data_path("tokenizers/ggml-vocab/ggml-vocab-llama-bpe.gguf.inp"), encoding="utf-8") as f:
        inp = f.read()
    yield from (("llama.cpp", t) for t in inp.split(SEP)[:-1])
    yield from (("xsum", d["document"][:500]) for d in jsonl("datasets/xsum/test_1000.jsonl.gz")[:20])
    yield from (("humaneval", d["prompt"]) for d in jsonl("datasets/humaneval/HumanEval.jsonl.gz"))
    yield from (("gsm8k", d["question"]) for d in jsonl("datasets/gsm8k/test.jsonl.gz"))


def paradec_ids(tool, gguf, text):
    r = subprocess.run([tool, "--tokenizer", gguf, "--special"], input=text.encode("utf-8"),
                       capture_output=True, check=False)
    if r.returncode:
        return "error: " + r.stderr.decode(errors="replace").strip()
    return [int(x) for x in r.stdout.split()]


def main():
    cache = os.environ.get("PARADEC_CACHE", os.path.expanduser("~/.cache/paradec"))
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default=os.path.join(cache, "smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--tool", default="bin/tokenize")
    a = ap.parse_args()
    ref = reference_tokenizer(gguf_kv(a.gguf))
    total, same, per, shown = 0, 0, {}, 0
    for src, text in texts():
        want = ref.encode(text, add_special_tokens=False).ids
        got = paradec_ids(a.tool, a.gguf, text)
        ok = got == want
        total += 1
        same += ok
        n, k = per.get(src, (0, 0))
        per[src] = (n + 1, k + ok)
        if not ok and shown < 5:
            shown += 1
            print(f"DIFF [{src}] {text[:80]!r}\n  hf:      {want[:40]}\n  paradec: {got if isinstance(got, str) else got[:40]}")
    for src, (n, k) in per.items():
        print(f"  {src:10s} {k}/{n}")
    print(f"smollm2 tokenizer vs HF tokenizers: {same}/{total} texts agree ({100.0 * same / total:.2f}%)")
    return 0 if same == total else 1


if __name__ == "__main__":
    sys.exit(main())
