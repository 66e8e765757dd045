# test_convert_quant — bin/convert --dtype with GGUF's block types, end to end: every type
# from a paradec file and from a llama2.c checkpoint (2-d weights quantized, norms F32,
# short rows for stories260K's 64-wide rows), block sources kept as they are by default and
# requantized with a note, dequantized with --dtype f32; widen refuses block types; bad
# input (an unsupported GGUF type, a row not whole blocks, truncated blocks, a bad
# paradec.quant) refused in one line with no output; and tests/ref/quant_ref.py, formats/
# quant.c against gguf-py bit for bit (SKIPs without the venv; SmolLM2 part without the model).
. tests/lib.sh
Q=$BUILD/tests/test_quant_format
GG=$BUILD/tests/test_gguf
C=${PARADEC_CACHE:-$HOME/.cache/paradec}
G=$C/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
PY=$C/venv/bin/python
S=$(data models/stories260K)

# the metadata of a plain safetensors file, as JSON on stdout
meta() { python3 -c "
import json, struct, sys
f = open(sys.argv[1], 'rb'); n = struct.unpack('<Q', f.read(8))[0]; print(json.dumps(json.loads(f.read(n))))" "$1"; }
# every 2-d weight is TYPE blocks stored U8, every vector F32
types_are() { python3 -c "
import json, sys
h = json.loads(sys.stdin.read()); q = json.loads(h['__metadata__'].get('paradec.quant', '{}')); want = sys.argv[1]
bad = [k for k, v in h.items() if k not in ('__metadata__', 'tokenizer.bytes') and
       ((len(v['shape']) == 2) != (k in q) or (k in q and (q[k][0] != want or v['dtype'] != 'U8')) or
        (len(v['shape']) == 1 and v['dtype'] != 'F32'))]
print(*bad[:3], file=sys.stderr) if bad else None; sys.exit(1 if bad or not q else 0)" "$1"; }
has_types() { meta "$1" | types_are "$2"; } # has_types FILE TYPE

for t in q8_0 q4_0 q4_1 q4_k q5_k q6_k; do
    T=$(echo $t | tr a-z A-Z)
    $BIN/convert "$MODEL" --dtype $t -o "$TMP/s_$t.safetensors" 2>"$TMP/log"
    check "convert --dtype $t: exit 0 ($(cat "$TMP/log"))" test $? = 0
    check "convert --dtype $t: 2-d weights $T, norms F32" has_types "$TMP/s_$t.safetensors" $T
done
$BIN/convert "$S/stories260K.bin" --tokenizer "$S/tok512.bin" --dtype q4_k -o "$TMP/l2c.safetensors" 2>/dev/null
check "llama2.c checkpoint --dtype q4_k" has_types "$TMP/l2c.safetensors" Q4_K
check "llama2.c → q4_k is the file paradec → q4_k makes (the same weights)" cmp -s "$TMP/l2c.safetensors" "$TMP/s_q4_k.safetensors"

# block sources: kept as they are by default, the same type is a no-op, another is requantized
$BIN/convert "$TMP/s_q4_k.safetensors" -o "$TMP/keep.safetensors" 2>"$TMP/log"
check "paradec Q4_K source, no --dtype: the same file" cmp -s "$TMP/keep.safetensors" "$TMP/s_q4_k.safetensors"
$BIN/convert "$TMP/s_q8_0.safetensors" --dtype q8_0 -o "$TMP/same.safetensors" 2>"$TMP/log"
check "Q8_0 source --dtype q8_0: no note" sh -c "! grep -q note '$TMP/log'"
check "Q8_0 source --dtype q8_0: the same file" cmp -s "$TMP/same.safetensors" "$TMP/s_q8_0.safetensors"
$BIN/convert "$TMP/s_q8_0.safetensors" --dtype q4_k -o "$TMP/re.safetensors" 2>"$TMP/log"
check "Q8_0 source --dtype q4_k: a note says it requantizes" grep -q "Q8_0 blocks .* are dequantized, then quantized to Q4_K" "$TMP/log"
check "Q8_0 source --dtype q4_k: Q4_K weights" has_types "$TMP/re.safetensors" Q4_K
$BIN/convert "$TMP/s_q8_0.safetensors" --dtype f32 -o "$TMP/deq.safetensors" 2>/dev/null
check "Q8_0 source --dtype f32: no block types left" sh -c "! grep -aq paradec.quant '$TMP/deq.safetensors'"
$BIN/convert "$TMP/s_q8_0.safetensors" --dtype bf16 -o "$TMP/deq16.safetensors" 2>/dev/null
check "Q8_0 source --dtype bf16: BF16 weights" grep -aq '"dtype":"BF16"' "$TMP/deq16.safetensors"

# GGUF blocks: kept (the tiny fixture mixes Q8_0, Q4_0, Q4_1, F16, BF16, F32)
$GG --write-tiny "$TMP/tiny.gguf"
$BIN/convert "$TMP/tiny.gguf" -o "$TMP/tiny.safetensors" 2>"$TMP/log"
check "tiny GGUF, no --dtype: exit 0 ($(cat "$TMP/log"))" test $? = 0
check "tiny GGUF: the log says keep" grep -q ", keep," "$TMP/log"
check "tiny GGUF: block types kept" python3 -c "
import json, struct, sys
f = open('$TMP/tiny.safetensors', 'rb'); n = struct.unpack('<Q', f.read(8))[0]; h = json.loads(f.read(n))
q = json.loads(h['__metadata__']['paradec.quant'])
sys.exit(not (q['model.embed_tokens.weight'] == ['Q8_0', 64] and q['model.layers.0.self_attn.q_proj.weight'] == ['Q4_1', 64]
         and q['model.layers.0.self_attn.k_proj.weight'] == ['Q4_0', 64] and h['model.layers.0.self_attn.v_proj.weight']['dtype'] == 'F32'))"

# widen needs floats
refuses "widen of a Q4_K model" "$TMP/wide.safetensors" $BIN/widen -m "$TMP/s_q4_k.safetensors" --preset 110m -o "$TMP/wide.safetensors"
$BIN/widen -m "$TMP/s_q4_k.safetensors" --preset 110m -o "$TMP/wide.safetensors" 2>"$TMP/err"
check "widen names the way out ($(cat "$TMP/err"))" grep -q "widen needs f32 or bf16 weights: widen first, then convert --dtype" "$TMP/err"

# ---- bad input: one line, non-zero exit, no output ----
O=$TMP/out.safetensors
refuses "--dtype q5_1" "$O" $BIN/convert "$MODEL" --dtype q5_1 -o "$O"
P=tests/ref/gguf_patch.py
python3 $P "$TMP/tiny.gguf" "$TMP/b1.gguf" blk.0.attn_q.weight type 7
refuses "GGUF Q5_1 tensor" "$O" $BIN/convert "$TMP/b1.gguf" -o "$O"
$BIN/convert "$TMP/b1.gguf" -o "$O" 2>"$TMP/err"
check "GGUF Q5_1: names type and tensor ($(cat "$TMP/err"))" grep -q "tensor 'blk.0.attn_q.weight' has ggml type 7 (Q5_1)" "$TMP/err"
python3 $P "$TMP/tiny.gguf" "$TMP/b2.gguf" blk.1.ffn_down.weight type 16
$BIN/convert "$TMP/b2.gguf" -o "$O" 2>"$TMP/err"
check "GGUF IQ2_XXS: names type and tensor ($(cat "$TMP/err"))" grep -q "tensor 'blk.1.ffn_down.weight' has ggml type 16 (IQ2_XXS)" "$TMP/err"
refuses "GGUF IQ2_XXS tensor" "$O" $BIN/convert "$TMP/b2.gguf" -o "$O"
python3 $P "$TMP/tiny.gguf" "$TMP/b3.gguf" blk.0.attn_q.weight dim0 48
$BIN/convert "$TMP/b3.gguf" -o "$O" 2>"$TMP/err"
check "GGUF row not whole blocks ($(cat "$TMP/err"))" grep -q "row length 48 is not a multiple of its type's block of 32" "$TMP/err"
refuses "GGUF row not whole blocks" "$O" $BIN/convert "$TMP/b3.gguf" -o "$O"
python3 $P "$TMP/tiny.gguf" "$TMP/b4.gguf" - cut 7
refuses "GGUF truncated blocks" "$O" $BIN/convert "$TMP/b4.gguf" -o "$O"
python3 $P "$TMP/tiny.gguf" "$TMP/b5.gguf" blk.0.attn_q.weight dim0 128 # twice the blocks the data holds
refuses "GGUF wrong block count" "$O" $BIN/convert "$TMP/b5.gguf" -o "$O"

# a paradec file with paradec.quant changed (header rewritten), or cut short
patch_quant() { python3 -c "
import json, struct, sys
src, dst, key, val = sys.argv[1:5]
b = open(src, 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n])
q = json.loads(h['__metadata__']['paradec.quant'])
if val == 'DROP': del q[key]
elif val == 'RENAME': q['no.such.tensor'] = q.pop(key)
else: q[key] = json.loads(val)
h['__metadata__']['paradec.quant'] = json.dumps(q)
j = json.dumps(h, separators=(',', ':')).encode(); j += b' ' * ((8 - (8 + len(j)) % 8) % 8)
open(dst, 'wb').write(struct.pack('<Q', len(j)) + j + b[8 + n:])" "$@"; }
W=model.layers.0.mlp.up_proj.weight
patch_quant "$TMP/s_q8_0.safetensors" "$TMP/p1.safetensors" $W '["Q5_1", 64]'
$BIN/convert "$TMP/p1.safetensors" -o "$O" 2>"$TMP/err"
check "paradec.quant unknown type names type and tensor ($(cat "$TMP/err"))" grep -q "tensor '$W': unknown block type 'Q5_1'" "$TMP/err"
refuses "paradec.quant unknown type" "$O" $BIN/convert "$TMP/p1.safetensors" -o "$O"
patch_quant "$TMP/s_q8_0.safetensors" "$TMP/p2.safetensors" $W '["Q8_0", 96]'
$BIN/convert "$TMP/p2.safetensors" -o "$O" 2>"$TMP/err"
check "paradec.quant wrong block count ($(cat "$TMP/err"))" grep -q "tensor '$W': rows of 68 bytes, but 96 Q8_0 elements are 3 blocks" "$TMP/err"
refuses "paradec.quant wrong block count" "$O" $BIN/convert "$TMP/p2.safetensors" -o "$O"
patch_quant "$TMP/s_q8_0.safetensors" "$TMP/p3.safetensors" $W RENAME
refuses "paradec.quant names a missing tensor" "$O" $BIN/convert "$TMP/p3.safetensors" -o "$O"
patch_quant "$TMP/s_q8_0.safetensors" "$TMP/p4.safetensors" $W DROP
refuses "paradec.quant leaves out a tensor (digest: a changed dtype)" "$O" $BIN/convert "$TMP/p4.safetensors" -o "$O"
head -c -9 "$TMP/s_q8_0.safetensors" >"$TMP/p5.safetensors"
refuses "paradec block file truncated" "$O" $BIN/convert "$TMP/p5.safetensors" -o "$O"

# ---- against gguf-py ----
if "$PY" -c "import numpy, gguf" 2>/dev/null; then
    if [ -f "$G" ]; then
        $BIN/convert "$G" -o "$TMP/smol.safetensors" 2>/dev/null
        check "quant_ref.py (random blocks, quantizers, SmolLM2)" "$PY" tests/ref/quant_ref.py "$Q" "$G" "$TMP/smol.safetensors"
    else
        echo "SKIP convert_quant: SmolLM2 part: $G is missing (make models)"
        check "quant_ref.py (random blocks, quantizers)" "$PY" tests/ref/quant_ref.py "$Q"
    fi
else
    echo "SKIP convert_quant: gguf-py comparison: the reference venv $PY is missing (make models)"
fi
finish convert_quant
