#!/usr/bin/env python3
"""quant_ref.py — paradec's block types (formats/quant.c) against gguf-py, bit for bit.

usage: quant_ref.py TEST_QUANT_FORMAT [SMOLLM2.gguf] [CONVERTED.safetensors]
  (a) every tensor of the SmolLM2 Q4_1 GGUF dequantized by paradec (gguf.c → quant.c) and by
      gguf.quants.dequantize: identical bits; and the converted paradec file (convert, no
      --dtype) holds the GGUF's very blocks (q/k rows un-permuted as whole rows)
  (b) random blocks of Q8_0 Q4_0 Q4_1 Q5_0 Q4_K Q5_K Q6_K (bytes from a fixed seed, f16 scales
      sane) written as a GGUF by gguf-py's GGUFWriter, read by paradec (the GGUF, and the
      same blocks through a paradec safetensors file): identical dequantization
  (c) paradec's Q8_0 / Q4_0 / Q4_1 / Q5_0 quantizer bytes == gguf.quants.quantize's
Prints SKIP and exits 0 when numpy or gguf is missing (a / the model part when absent)."""
import json
import os
import struct
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import gguf
    from gguf import GGMLQuantizationType as T
except ImportError as e:
    print(f"SKIP quant_ref: {e}")
    sys.exit(0)

BIN = sys.argv[1]
fails = 0


def check(ok, msg):
    global fails
    if not ok:
        fails += 1
        print("FAIL", msg)
    return ok


def paradec_dequant(path, name):
    out = subprocess.run([BIN, "--dequant", path, name], check=True, capture_output=True).stdout
    return np.frombuffer(out, dtype=np.float32)


def same_bits(a, b):
    a = np.ascontiguousarray(a, dtype=np.float32).reshape(-1)
    b = np.ascontiguousarray(b, dtype=np.float32).reshape(-1)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


TYPES = {"Q8_0": T.Q8_0, "Q4_0": T.Q4_0, "Q4_1": T.Q4_1, "Q5_0": T.Q5_0, "Q4_K": T.Q4_K, "Q5_K": T.Q5_K, "Q6_K": T.Q6_K}
# where each type keeps its f16 scales (byte offsets in a block) and, for Q6_K, int8 scales
F16_AT = {"Q8_0": [0], "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}


def random_blocks(name, rows, cols, rng):
    bs, bb = gguf.GGML_QUANT_SIZES[TYPES[name]]
    nb = rows * cols // bs
    b = rng.integers(0, 256, size=(nb, bb), dtype=np.uint8)
    for at in F16_AT[name]:  # sane scales: |d| in [1e-4, 1], either sign
        d = (rng.uniform(1e-4, 1.0, nb) * rng.choice([-1, 1], nb)).astype(np.float16)
        b[:, at:at + 2] = d.view(np.uint8).reshape(nb, 2)
    return b.reshape(rows, cols // bs * bb)


def test_random(tmp):
    rng = np.random.default_rng(20231)
    path = os.path.join(tmp, "random.gguf")
    w = gguf.GGUFWriter(path, "llama")
    made = {}
    for name in TYPES:
        bs = gguf.GGML_QUANT_SIZES[TYPES[name]][0]
        rows, cols = 5, 3 * bs
        b = random_blocks(name, rows, cols, rng)
        made[name] = b
        w.add_tensor(name.lower(), b, raw_shape=b.shape, raw_dtype=TYPES[name])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    st = os.path.join(tmp, "random.safetensors")
    subprocess.run([BIN, "--to-safetensors", path, st], check=True)
    for name, b in made.items():
        want = gguf.quants.dequantize(b, TYPES[name])
        check(same_bits(paradec_dequant(path, name.lower()), want), f"(b) {name}: GGUF dequantization differs")
        check(same_bits(paradec_dequant(st, name.lower()), want), f"(b) {name}: via safetensors differs")
    print(f"(b) random blocks of {len(made)} types: dequantization identical to gguf-py")


def test_quantize(tmp):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((64, 256)) * rng.uniform(0.001, 3, (64, 1))).astype(np.float32)
    x[3, :40] = 0  # a zero block
    x[4, 32:64] = 0.5  # a constant block
    x[5, 0] = -x[5, 1:32].max() * 2  # a negative extreme
    for name in ("Q8_0", "Q4_0", "Q4_1", "Q5_0"):
        out = subprocess.run([BIN, "--quant", name, "256"], input=x.tobytes(), check=True, capture_output=True).stdout
        want = gguf.quants.quantize(x, TYPES[name])
        got = np.frombuffer(out, dtype=np.uint8).reshape(want.shape)
        bad = int((got != want).any(axis=1).sum())
        check(bad == 0, f"(c) {name}: {bad} of {len(x)} rows differ from gguf.quants.quantize")
    print("(c) Q8_0 Q4_0 Q4_1 Q5_0 quantizer bytes identical to gguf-py's")


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
    return hdr, data


def test_smollm2(model, converted):
    r = gguf.GGUFReader(model)
    n = 0
    for t in r.tensors:
        want = gguf.quants.dequantize(t.data, t.tensor_type)
        check(same_bits(paradec_dequant(model, t.name), want), f"(a) {t.name} ({t.tensor_type.name}) differs")
        n += 1
    print(f"(a) {n} tensors of {os.path.basename(model)}: dequantization identical to gguf-py")
    if not converted:
        return
    hdr, data = read_safetensors(converted)
    quant = json.loads(hdr["__metadata__"]["paradec.quant"])
    heads = r.fields["llama.attention.head_count"].parts[-1][0]
    kv = r.fields["llama.attention.head_count_kv"].parts[-1][0]
    names = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
             "ffn_down": "mlp.down_proj"}
    k = 0
    for t in r.tensors:
        if t.tensor_type not in TYPES.values():
            continue
        p = t.name.split(".")
        hf = "model.embed_tokens.weight" if t.name == "token_embd.weight" else \
            f"model.layers.{p[1]}.{names[p[2]]}.weight" if p[0] == "blk" and p[2] in names else None
        if hf is None:
            continue
        e = hdr[hf]
        got = np.asarray(data[e["data_offsets"][0]:e["data_offsets"][1]]).reshape(e["shape"])
        src = np.asarray(t.data).reshape(got.shape)
        if p[-2] in ("attn_q", "attn_k"):  # Meta's interleaved rows back to HF's halves
            h = heads if p[-2] == "attn_q" else kv
            hd = got.shape[0] // h
            src = src.reshape(h, hd // 2, 2, -1).transpose(0, 2, 1, 3).reshape(got.shape)
        check(e["dtype"] == "U8" and quant[hf] == [t.tensor_type.name, int(t.shape[0])] and np.array_equal(got, src),
              f"(a) {hf}: not the GGUF's blocks")
        k += 1
    print(f"(a) {k} block tensors of the converted file are the GGUF's blocks")


with tempfile.TemporaryDirectory() as tmp:
    test_random(tmp)
    test_quantize(tmp)
model = sys.argv[2] if len(sys.argv) > 2 else ""
if model and os.path.exists(model):
    test_smollm2(model, sys.argv[3] if len(sys.argv) > 3 else "")
else:
    print("SKIP (a): no SmolLM2 Q4_1 GGUF")
print("quant_ref:", "FAILED" if fails else "ok", f"({fails} failures)")
sys.exit(1 if fails else 0)
