"""gguf_with_vocab.py IN.gguf TOKENIZER.bin OUT.gguf [NAME=TYPE,...] — IN's keys and tensors
(as stored) with a llama.cpp "llama" vocabulary made from a llama2.c tokenizer.bin, written
by gguf-py (llama.cpp's own writer), so `-m OUT.gguf` has its tokenizer inside. NAME=TYPE:
the F32 matrices whose name holds NAME quantized to TYPE (Q8_0, Q4_0, ...) by gguf-py's
own gguf.quants.quantize (rows that are not whole blocks stay F32).
tokenizer.bin: int32 max_token_length, then per token float32 score, int32 len, bytes."""
import struct
import sys

import gguf
import numpy as np

src, tokbin, out = sys.argv[1:4]
quant = [q.split("=") for q in sys.argv[4].split(",")] if len(sys.argv) > 4 else []
r = gguf.GGUFReader(src)
data = open(tokbin, "rb").read()
n_vocab = int(r.tensors[[t.name for t in r.tensors].index("token_embd.weight")].shape[1])
pos, toks, scores, types = 4, [], [], []
for i in range(n_vocab):
    score, ln = struct.unpack_from("<fi", data, pos)
    pos += 8
    piece = data[pos:pos + ln].decode("utf-8", "replace")
    pos += ln
    toks.append(piece)
    scores.append(score)
    # llama2.c's tok512: 0 <unk>, 1 <s>, 2 </s>, 3..258 <0xNN> byte pieces
    types.append(2 if i == 0 else 3 if i < 3 else 6 if piece.startswith("<0x") else 1)
w = gguf.GGUFWriter(out, "llama")
for f in r.fields.values():
    if f.name.startswith("GGUF.") or f.name == "general.architecture":
        continue
    t = f.types[0]
    v = f.parts[f.data[0]]
    if t == gguf.GGUFValueType.UINT32:
        w.add_uint32(f.name, int(v[0]))
    elif t == gguf.GGUFValueType.FLOAT32:
        w.add_float32(f.name, float(v[0]))
    elif t == gguf.GGUFValueType.STRING:
        w.add_string(f.name, bytes(v).decode())
    else:
        sys.exit("unexpected key type %s for %s" % (t, f.name))
w.add_tokenizer_model("llama")
w.add_token_list(toks)
w.add_token_scores(scores)
w.add_token_types(types)
w.add_bos_token_id(1)
w.add_eos_token_id(2)
for t in r.tensors:
    shape = [int(x) for x in reversed(t.shape)]  # gguf-py's numpy order, rows first
    x = np.asarray(t.data).reshape(shape)
    qt = [getattr(gguf.GGMLQuantizationType, ty) for name, ty in quant if name in t.name]
    if qt and len(shape) == 2 and t.tensor_type == gguf.GGMLQuantizationType.F32 and shape[1] % 32 == 0:
        q = gguf.quants.quantize(x.astype(np.float32), qt[0])
        w.add_tensor(t.name, q, raw_shape=q.shape, raw_dtype=qt[0])
    else:
        w.add_tensor(t.name, x, raw_dtype=t.tensor_type)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
