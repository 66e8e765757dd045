#!/usr/bin/env python3
"""seeds.py — writes the fuzzers' seed corpus, tests/fuzz/corpus/NAME/: small valid
inputs of every kind, so that mutations start deep inside each parser. Tiny files are
built here; the rest are cut from the real assets in ../shared/data (a vocabulary's first
pieces, a dataset's first records), so a seed stays a few KiB. Deterministic: the same
files every run. Run from the repository root: python3 tests/fuzz/seeds.py"""
import gzip
import json
import os
import shutil
import struct
import subprocess
import sys

OUT = "tests/fuzz/corpus"
DATA = os.environ.get("PARADEC_DATA") or "../shared/data"


def put(target, name, data):
    os.makedirs(f"{OUT}/{target}", exist_ok=True)
    with open(f"{OUT}/{target}/{name}", "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def f32s(n, seed):
    return [((i * 7 + seed * 13) % 17 - 8) / 8.0 for i in range(n)]


# ---- safetensors ----

def safetensors(tensors, meta=None):
    """tensors: [(name, dtype, shape, raw bytes)]"""
    header, off, data = {}, 0, b""
    if meta:
        header["__metadata__"] = meta
    for name, dt, shape, raw in tensors:
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        data += raw
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-(8 + len(h)) % 64)
    return struct.pack("<Q", len(h)) + h + data


CONFIG = {"architecture": "llama", "hidden_size": 4, "intermediate_size": 8, "num_hidden_layers": 1,
          "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 2, "vocab_size": 6,
          "max_position_embeddings": 16, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
          "tie_word_embeddings": True}


def safetensors_seeds():
    f = lambda n, s: struct.pack(f"<{n}f", *f32s(n, s))
    model = safetensors(
        [("model.embed_tokens.weight", "F32", [6, 4], f(24, 1)),
         ("model.norm.weight", "BF16", [4], struct.pack("<4H", 0x3f80, 0x3f80, 0x4000, 0xbf80)),
         ("tokenizer.bytes", "U8", [5], b"\x01\x02\x03\x04\x05")],
        {"paradec.kind": "model", "paradec.version": "1", "paradec.config": json.dumps(CONFIG),
         "paradec.tokenizer": "llama2c"})
    heads = safetensors(
        [("medusa.0.w", "F32", [2, 2], f(4, 2)), ("medusa.0.b", "F32", [2], f(2, 3)),
         ("empty", "F16", [0, 3], b""), ("scalar", "I64", [], struct.pack("<q", -7)),
         ("ids", "I32", [3], struct.pack("<3i", 1, -2, 3)), ("half", "F16", [2], struct.pack("<2H", 0x3c00, 0x7c00)),
         ("small", "I8", [2], b"\x80\x7f")],
        {"paradec.kind": "medusa-heads", "paradec.medusa.heads": "1",
         "paradec.bundle": '[{"prefix":"heads.0/","kind":"exit-heads"}]'})
    # block tensors: U8 [rows][row bytes] and paradec.quant (a short Q4_K row of 300)
    put("safetensors", "blocks.safetensors", safetensors(
        [("w8", "U8", [2, 68], blocks(8, 4, 1)), ("wk", "U8", [1, 288], blocks(12, 2, 2)),
         ("w6", "U8", [1, 210], blocks(14, 1, 3)), ("f", "F32", [2], f(2, 4))],
        {"paradec.quant": json.dumps({"w8": ["Q8_0", 64], "wk": ["Q4_K", 300], "w6": ["q6_k", 17]})}))
    # the same model with its digests (docs/formats.md, "Checked weights"), right when the
    # xxhash module is there, else placeholders (the mismatch path)
    try:
        import xxhash
        h64, h128 = xxhash.xxh3_64_hexdigest, xxhash.xxh3_128_hexdigest
    except ImportError:
        h64, h128 = (lambda b: "0" * 16), (lambda b: "0" * 32)
    t = [("model.embed_tokens.weight", "F32", [6, 4], f(24, 1)),
         ("model.norm.weight", "BF16", [4], struct.pack("<4H", 0x3f80, 0x3f80, 0x4000, 0xbf80)),
         ("tokenizer.bytes", "U8", [5], b"\x01\x02\x03\x04\x05")]
    codes, stream = {"F32": 0, "BF16": 2}, b""
    for name, dt, shape, raw in t[:2]:
        stream += name.encode() + b"\0" + struct.pack("<iqq", codes[dt], shape[0], shape[1] if len(shape) == 2 else 1) + raw
    digested = safetensors(
        t, {"paradec.kind": "model", "paradec.version": "1", "paradec.config": json.dumps(CONFIG),
            "paradec.tokenizer": "llama2c", "paradec.digest": h128(stream),
            "paradec.digests": json.dumps([[n, h64(r)] for n, _, _, r in t], separators=(",", ":"))})
    put("safetensors", "digests.safetensors", digested)
    put("safetensors_zst", "digests.safetensors", digested)
    for name, data in (("model.safetensors", model), ("heads.safetensors", heads)):
        put("safetensors", name, data)
        put("safetensors_zst", name, data)
        zst = subprocess.run(["zstd", "-q", "-c", "--content-size", "-3"], input=data, capture_output=True,
                             check=True).stdout
        put("safetensors_zst", name + ".zst", zst)
    # two frames, the second without a recorded size
    two = subprocess.run(["zstd", "-q", "-c", "--no-content-size"], input=heads[100:], capture_output=True,
                         check=True).stdout
    one = subprocess.run(["zstd", "-q", "-c"], input=heads[:100], capture_output=True, check=True).stdout
    put("safetensors_zst", "frames.safetensors.zst", one + two)


# ---- llama2.c checkpoints ----

def llama2c(dim, hidden, layers, heads, kv, vocab, seq, shared, v1=False):
    hd = dim // heads
    n = vocab * dim + layers * (2 * dim + dim * dim + 2 * dim * kv * hd + dim * dim + 3 * dim * hidden) + dim
    if not shared:
        n += vocab * dim
    if v1:
        head = struct.pack("<Ii7iB", 0x616B3432, 1, dim, hidden, layers, heads, kv, vocab, seq, int(shared))
        head += b"\0" * (256 - len(head))
    else:
        head = struct.pack("<7i", dim, hidden, layers, heads, kv, vocab if shared else -vocab, seq)
        n += seq * hd  # RoPE tables
    return head + struct.pack(f"<{n}f", *f32s(n, dim))


def llama2c_seeds():
    put("llama2c", "legacy_shared.bin", llama2c(4, 8, 1, 2, 1, 5, 4, True))
    put("llama2c", "legacy_unshared.bin", llama2c(4, 4, 2, 2, 2, 3, 2, False))
    put("llama2c", "v1.bin", llama2c(4, 8, 1, 2, 1, 5, 4, True, v1=True))


# ---- tokenizers ----

def read_tok512():
    b = open(f"{DATA}/models/stories260K/tok512.bin", "rb").read()
    at, pieces = 4, []
    while at < len(b):
        score, n = struct.unpack_from("<fi", b, at)
        pieces.append((b[at + 8:at + 8 + n], score))
        at += 8 + n
    return b, pieces


def tokenizer_bin_seeds():
    raw, pieces = read_tok512()  # an excerpt (its first 96 pieces), not a copy of the asset
    put("tokenizer_bin", "tok512_cut.bin",
        raw[:4] + b"".join(struct.pack("<fi", s, len(p)) + p for p, s in pieces[:96]))
    tiny = [(b"<unk>", 0.0), (b"\n<s>\n", 0.0), (b"\n</s>\n", 0.0), (b"<0x41>", 0.0), (b" a", -1.0),
            (b"b", -2.0), (b" ab", -0.5), (b"\xe2\x96\x81", -3.0)]
    put("tokenizer_bin", "tiny.bin",
        struct.pack("<i", 8) + b"".join(struct.pack("<fi", s, len(p)) + p for p, s in tiny))


def cut_llama3():
    """llama3's tokenizer.json with its first 600 pieces, the merges among them, 4 added tokens"""
    d = json.load(gzip.open(f"{DATA}/tokenizers/llama3/tokenizer.json.gz"))
    m = d["model"]
    m["vocab"] = {k: v for k, v in m["vocab"].items() if v < 600}
    merges = []
    for mg in m["merges"]:
        a, b = mg.split(" ") if isinstance(mg, str) else mg
        if a in m["vocab"] and b in m["vocab"] and a + b in m["vocab"]:
            merges.append(mg)
        if len(merges) == 300:
            break
    m["merges"] = merges
    d["added_tokens"] = [dict(t, id=600 + i) for i, t in enumerate(d["added_tokens"][:4])]
    pp = d["post_processor"]
    for p in pp.get("processors", []):
        for k, v in p.get("special_tokens", {}).items():
            v["ids"] = [600]
    return d


def spm_bpe(pieces):
    """a Llama-2-style tokenizer.json (Metaspace, byte fallback) from tok512's pieces"""
    vocab = {}
    for i, (p, _) in enumerate(pieces):
        s = p.decode("utf-8", "replace").replace(" ", "\u2581")
        if s == "\n<s>\n":
            s = "<s>"
        elif s == "\n</s>\n":
            s = "</s>"
        vocab.setdefault(s, i)
    merges = []
    for s in vocab:
        for k in range(1, len(s)):
            if s[:k] in vocab and s[k:] in vocab and len(merges) < 200:
                merges.append(f"{s[:k]} {s[k:]}")
                break
    return {"version": "1.0", "added_tokens": [
                {"id": 1, "content": "<s>", "special": True}, {"id": 2, "content": "</s>", "special": True}],
            "normalizer": {"type": "Sequence", "normalizers": [
                {"type": "Prepend", "prepend": "\u2581"},
                {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
            "pre_tokenizer": None,
            "post_processor": {"type": "TemplateProcessing", "single": [
                {"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
            "model": {"type": "BPE", "unk_token": "<unk>", "byte_fallback": True, "fuse_unk": True,
                      "vocab": vocab, "merges": merges}}


def tokenizer_json_seeds():
    _, pieces = read_tok512()
    put("tokenizer_json", "llama3_cut.json", json.dumps(cut_llama3(), ensure_ascii=False))
    put("tokenizer_json", "llama2_style.json", json.dumps(spm_bpe(pieces), ensure_ascii=False))
    put("tokenizer_json", "tiny_bytelevel.json", json.dumps({
        "added_tokens": [{"id": 5, "content": "<|eot|>", "special": True},
                         {"id": 6, "content": "hello", "special": False}],
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": True, "use_regex": True},
        "post_processor": {"type": "RobertaProcessing", "cls": ["<s>", 0], "sep": ["</s>", 1]},
        "model": {"type": "BPE", "ignore_merges": True, "vocab": {"a": 0, "b": 1, "ab": 2, "\u0120": 3, "\u0120ab": 4},
                  "merges": [["a", "b"], ["\u0120", "ab"]]}}))


# ---- config.json ----

def hf_config_seeds():
    base = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 172,
            "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 512,
            "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
            "tie_word_embeddings": True, "hidden_act": "silu"}
    put("hf_config", "llama.json", json.dumps(base, indent=2))
    put("hf_config", "llama31.json", json.dumps(dict(base, head_dim=8, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192}), indent=2))
    put("hf_config", "qwen2.json", json.dumps(dict(base, architectures=["Qwen2ForCausalLM"], use_sliding_window=True,
                                                   sliding_window=256, attention_bias=True), indent=2))
    put("hf_config", "mistral_t5.json", json.dumps(dict(base, architectures=["MistralForCausalLM"], sliding_window=128,
                                                        rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
                                                   indent=2))


# ---- GGUF ----

STRING, ARRAY, U32, F32, I32, BOOL, U64 = 8, 9, 4, 6, 5, 7, 10


def gstr(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def gkv(key, typ, val):
    out = gstr(key) + struct.pack("<I", typ)
    if typ == STRING:
        return out + gstr(val)
    if typ == ARRAY:
        elem, items = val
        out += struct.pack("<IQ", elem, len(items))
        if elem == STRING:
            return out + b"".join(gstr(x) for x in items)
        return out + b"".join(struct.pack({F32: "<f", I32: "<i", U32: "<I"}[elem], x) for x in items)
    return out + struct.pack({U32: "<I", F32: "<f", BOOL: "<B", U64: "<Q", I32: "<i"}[typ], val)


def q8_0(xs):
    out = b""
    for i in range(0, len(xs), 32):
        blk = xs[i:i + 32]
        d = max(abs(x) for x in blk) / 127 or 1.0
        out += struct.pack("<e", d) + bytes((round(x / d) & 0xff) for x in blk)
    return out


def q4(xs, with_min):
    out = b""
    for i in range(0, len(xs), 32):
        blk = xs[i:i + 32]
        lo, hi = min(blk), max(blk)
        d = (hi - lo) / 15 or 1.0
        q = [max(0, min(15, round((x - lo) / d))) for x in blk]
        out += struct.pack("<ee", d, lo) if with_min else struct.pack("<e", d)
        out += bytes(q[j] | q[j + 16] << 4 for j in range(16))
    return out


def gguf(kvs, tensors, align=32):
    """tensors: [(name, ggml dims (fastest first), type, raw)]"""
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(gkv(*kv) for kv in kvs)
    off, data = 0, b""
    for name, dims, typ, raw in tensors:
        head += gstr(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        head += struct.pack("<IQ", typ, off)
        pad = -len(raw) % align
        data += raw + b"\0" * pad
        off += len(raw) + pad
    head += b"\0" * (-len(head) % align)
    return head + data


def gguf_model():
    D, H, V, C = 32, 32, 8, 8
    f32 = lambda n, s: struct.pack(f"<{n}f", *f32s(n, s))
    f16 = lambda n, s: struct.pack(f"<{n}e", *f32s(n, s))
    bf16 = lambda n, s: b"".join(struct.pack("<f", x)[2:] for x in f32s(n, s))
    toks = ["<unk>", "<s>", "</s>", "<0x41>", "\u2581a", "b", "\u2581ab", "\u2581"]
    kvs = [("general.architecture", STRING, "llama"), ("llama.embedding_length", U32, D),
           ("llama.feed_forward_length", U32, H), ("llama.block_count", U32, 1),
           ("llama.attention.head_count", U32, 2), ("llama.attention.head_count_kv", U32, 1),
           ("llama.context_length", U32, C), ("llama.attention.layer_norm_rms_epsilon", F32, 1e-5),
           ("llama.rope.freq_base", F32, 10000.0), ("tokenizer.ggml.model", STRING, "llama"),
           ("tokenizer.ggml.tokens", ARRAY, (STRING, toks)),
           ("tokenizer.ggml.scores", ARRAY, (F32, [0.0, 0.0, 0.0, 0.0, -1.0, -2.0, -0.5, -3.0])),
           ("tokenizer.ggml.token_type", ARRAY, (I32, [2, 3, 3, 6, 1, 1, 1, 1])),
           ("tokenizer.ggml.bos_token_id", U32, 1), ("tokenizer.ggml.eos_token_id", U32, 2),
           ("tokenizer.chat_template", STRING, "{{ messages }}")]
    t = [("token_embd.weight", [D, V], 0, f32(D * V, 1)), ("blk.0.attn_norm.weight", [D], 0, f32(D, 2)),
         ("blk.0.attn_q.weight", [D, D], 8, q8_0(f32s(D * D, 3))), ("blk.0.attn_k.weight", [D, 16], 1, f16(D * 16, 4)),
         ("blk.0.attn_v.weight", [D, 16], 0, f32(D * 16, 5)), ("blk.0.attn_output.weight", [D, D], 2, q4(f32s(D * D, 6), False)),
         ("blk.0.ffn_norm.weight", [D], 0, f32(D, 7)), ("blk.0.ffn_gate.weight", [D, H], 3, q4(f32s(D * H, 8), True)),
         ("blk.0.ffn_up.weight", [D, H], 30, bf16(D * H, 9)), ("blk.0.ffn_down.weight", [H, D], 0, f32(D * H, 10)),
         ("output_norm.weight", [D], 0, f32(D, 11))]
    return gguf(kvs, t)


def blocks(typ, n_blocks, seed):
    """n_blocks of a ggml block type: bytes of a fixed pattern, the f16 scales sane"""
    size, scales = {8: (34, [0]), 2: (18, [0]), 3: (20, [0, 2]), 12: (144, [0, 2]), 13: (176, [0, 2]),
                    14: (210, [208])}[typ]
    out = b""
    for b in range(n_blocks):
        blk = bytearray((i * 37 + b * 11 + seed * 5) % 256 for i in range(size))
        for k, at in enumerate(scales):
            blk[at:at + 2] = struct.pack("<e", 0.01 * (1 + (b + k + seed) % 7) * (-1 if (b + k) % 3 == 0 else 1))
        out += bytes(blk)
    return out


def gguf_seeds():
    put("gguf", "llama_tiny.gguf", gguf_model())
    # the block types' traits and dequantization: K types, one short of a model
    put("gguf", "block_types.gguf", gguf([("general.architecture", STRING, "llama")], [
        ("q4k", [256, 2], 12, blocks(12, 2, 1)), ("q5k", [256, 1], 13, blocks(13, 1, 2)),
        ("q6k", [512, 1], 14, blocks(14, 2, 3)), ("q80", [64, 2], 8, blocks(8, 4, 4)),
        ("q40", [32, 1], 2, blocks(2, 1, 5)), ("q41", [32, 3], 3, blocks(3, 3, 6))]))
    d = cut_llama3()
    vocab = sorted(d["model"]["vocab"].items(), key=lambda kv: kv[1])[:300]
    names = {k for k, _ in vocab}
    merges = [m for m in d["model"]["merges"] if all(p in names for p in m.split(" ") + [m.replace(" ", "")])]
    put("gguf", "gpt2_vocab.gguf", gguf([
        ("general.architecture", STRING, "llama"), ("general.alignment", U32, 64),
        ("tokenizer.ggml.model", STRING, "gpt2"), ("tokenizer.ggml.pre", STRING, "llama-bpe"),
        ("tokenizer.ggml.tokens", ARRAY, (STRING, [k for k, _ in vocab])),
        ("tokenizer.ggml.merges", ARRAY, (STRING, merges[:100])),
        ("tokenizer.ggml.add_bos_token", BOOL, 0), ("tokenizer.ggml.eot_token_id", U64, 3)], [], align=64))


# ---- datasets, recipes, trees ----

def records(path, n):
    op = gzip.open if path.endswith(".gz") else open
    with op(path, "rt", encoding="utf-8") as f:
        return "".join(next(f) for _ in range(n))


def dataset_seeds():
    ds = f"{DATA}/datasets"
    for name, path in (("xsum", "xsum/test_1000.jsonl.gz"), ("gsm8k", "gsm8k/test.jsonl.gz"),
                       ("humaneval", "humaneval/HumanEval.jsonl.gz"), ("mt_bench", "mt_bench/question.jsonl")):
        put("dataset", f"{name}.jsonl", records(f"{ds}/{path}", 1))
    story = records(f"{ds}/tinystories/tinystories_val_sample.txt.gz", 30)
    put("dataset", "tinystories.txt", story[:2000])
    put("dataset", "tinystories.txt.gz", gzip.compress(story[:2000].encode(), mtime=0))
    put("dataset", "tinystories.txt.zst", zstd_raw(story[:200].encode()))


def zstd_raw(data):
    """a zstd frame of one raw (stored) block, for up to 255 bytes: magic, a single-segment
    header with a 1-byte content size, the last block's 3-byte header (size << 3 | last)"""
    assert len(data) < 256
    return b"\x28\xb5\x2f\xfd" + bytes([0x20, len(data)]) + (len(data) << 3 | 1).to_bytes(3, "little") + data


def recipe_seeds():
    os.makedirs(f"{OUT}/recipe", exist_ok=True)
    for f in sorted(os.listdir("recipes")):
        if f.endswith(".yaml"):  # a checkpoint that is there, so the whole recipe is read
            text = open(f"recipes/{f}").read().replace("$PARADEC_CKPT", "models/stories260K/stories260K.bin")
            put("recipe", f, text)


def medusa_tree_seeds():
    put("medusa_tree", "small.json", "[[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]")
    put("medusa_tree", "mc_sim.json", json.dumps(
        [[0], [0, 0], [1], [0, 1], [2], [0, 0, 0], [1, 0], [0, 2], [3], [0, 3], [4], [0, 4], [2, 0], [0, 5],
         [0, 0, 1], [5], [0, 6], [6], [0, 7], [0, 1, 0], [1, 1], [7], [0, 8], [0, 0, 2], [3, 0], [0, 9], [8],
         [9], [1, 0, 0], [0, 2, 0], [1, 2], [0, 0, 3], [4, 0], [2, 1], [0, 0, 4], [0, 0, 5], [0, 0, 0, 0],
         [0, 1, 1], [0, 0, 6], [0, 3, 0], [5, 0], [1, 3], [0, 0, 7], [0, 0, 8], [0, 0, 9], [6, 0], [0, 4, 0],
         [1, 4], [7, 0], [0, 1, 2], [2, 0, 0], [3, 1], [2, 2], [8, 0], [0, 5, 0], [1, 5], [1, 0, 1], [0, 2, 1],
         [9, 0], [0, 6, 0], [0, 0, 0, 1], [1, 6], [0, 7, 0]]))


def serve_request_seeds():
    """request bodies as OpenAI clients send them; the target parses each as a completion
    and as a chat request"""
    put("serve_request", "completion.json", json.dumps(
        {"model": "m", "prompt": "Once upon a time", "max_tokens": 32, "temperature": 0.7, "top_p": 0.9,
         "top_k": 40, "seed": 7, "stream": True, "stop": ["\n\n", "The end"], "method": "medusa"}))
    put("serve_request", "prompt_array.json", json.dumps({"prompt": ["caf\u00e9 \U0001f600"], "max_tokens": 0}))
    put("serve_request", "chat.json", json.dumps(
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                      {"role": "assistant", "content": "Hello."},
                      {"role": "user", "content": [{"type": "text", "text": "Bye"}]}],
         "max_completion_tokens": 12, "stream": False, "stop": "x"}))


def serve_generate_seeds():
    """whole requests the target runs on stories260K (no heads: the methods that need
    none), as completion and as chat; each must start as one of them"""
    put("serve_generate", "greedy_stop.json", json.dumps(
        {"model": "m", "prompt": "Once upon a time", "max_tokens": 24, "temperature": 0, "stop": [" the", "."]}))
    put("serve_generate", "sampled_stream.json", json.dumps(
        {"prompt": "Tom had a red ball", "max_tokens": 30, "temperature": 0.9, "top_p": 0.9, "top_k": 40,
         "seed": 3, "stream": True, "stop": "Lily"}))
    put("serve_generate", "chat_lookup_stream.json", json.dumps(
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell a story."}],
         "max_tokens": 20, "temperature": 0, "stream": True, "method": "prompt-lookup", "stop": ["\n"]}))
    put("serve_generate", "chat_lookahead.json", json.dumps(
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "Once"}]}],
         "max_completion_tokens": 16, "temperature": 0, "method": "lookahead"}))
    put("serve_generate", "zero_tokens.json", json.dumps({"prompt": "caf\u00e9 \U0001f600", "max_tokens": 0}))
    put("serve_generate", "to_the_context.json", json.dumps({"prompt": "The end", "max_tokens": None, "temperature": 0.5}))
    put("serve_generate", "choices_logprobs_echo.json", json.dumps(
        {"prompt": ["Once", "Tom and"], "n": 2, "max_tokens": 8, "temperature": 0.8, "logprobs": 3, "echo": True,
         "stream": True, "stream_options": {"include_usage": True}, "user": "u", "best_of": 1}))
    put("serve_generate", "token_ids.json", json.dumps(
        {"prompt": [[1, 403, 407], [1, 90]], "max_tokens": 6, "temperature": 0, "logprobs": 0, "stop": ["a"]}))
    put("serve_generate", "chat_top_logprobs.json", json.dumps(
        {"messages": [{"role": "developer", "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}]},
                      {"role": "user", "content": "Hi"}],
         "max_tokens": 10, "n": 3, "seed": 5, "logprobs": True, "top_logprobs": 20, "stream": True,
         "stream_options": {"include_usage": False}, "tools": [], "response_format": {"type": "text"}}))
    put("serve_generate", "zero_tokens_echo.json", json.dumps({"prompt": "Once upon", "max_tokens": 0, "echo": True, "logprobs": 5}))


def main():
    if not os.path.isdir(f"{DATA}/models/stories260K"):
        sys.exit(f"seeds.py: {DATA}/models/stories260K not found (set PARADEC_DATA)")
    shutil.rmtree(OUT, ignore_errors=True)
    for make in (safetensors_seeds, llama2c_seeds, tokenizer_bin_seeds, tokenizer_json_seeds, hf_config_seeds,
                 gguf_seeds, dataset_seeds, recipe_seeds, medusa_tree_seeds, serve_request_seeds,
                 serve_generate_seeds):
        make()
    total = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(OUT) for f in fs)
    print(f"seeds.py: {OUT}: {total // 1024} KiB")


if __name__ == "__main__":
    main()
