# test_convert_hf — bin/convert on Hugging Face directories and GGUF files, end to end.
# The same weights imported from llama2.c, from an HF directory and from a GGUF file
# give the same model (digest) and stories260K's greedy text; small HF checkpoints of
# several configs (GQA, F16 shards with an index, Qwen2 biases in BF16, llama3 RoPE
# scaling; written by test_hf) convert and decode; every bad input is refused with one
# line, a non-zero exit and no output file.
. tests/lib.sh
S=$(data models/stories260K)
TOK=$S/tok512.bin
story() { $BIN/decode -m "$1" -p "Once upon a time" -n 60 --temp 0 2>/dev/null; }
digest() { grep -ao '"paradec.digest":"[0-9a-f]*"' "$1"; }
# llama2.c's doc/stories260K.md, `./run stories260K.bin -z tok512.bin -t 0.0` (as test_tools)
GOLD="Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big, red ball. She wanted to play with it, but it was too high"

orig=$(story "$MODEL")
case "$orig" in "$GOLD"*) ok ;; *) bad "the original model's text: $orig" ;; esac

# ---- Hugging Face: widened stories260K written by widen --hf, imported back ----
$BIN/widen -m "$MODEL" --preset tiny -o "$TMP/w.safetensors" --hf "$TMP/hf" 2>/dev/null
check "widen --hf wrote config.json" test -s "$TMP/hf/config.json"
$BIN/convert "$TMP/hf" -o "$TMP/hf.safetensors" 2>"$TMP/log"
check "convert HF dir: exit 0 ($(cat "$TMP/log"))" test $? = 0
out=$(story "$TMP/hf.safetensors")
check "HF import: stories260K's greedy text (got: $out)" test "$out" = "$orig"
d0=$(digest "$TMP/w.safetensors") d1=$(digest "$TMP/hf.safetensors")
check "HF import: the widened model's digest ($d0 / $d1)" test -n "$d0" -a "$d0" = "$d1"
check "HF import: tokenizer.bin taken as llama2c" grep -aq '"paradec.tokenizer":"llama2c"' "$TMP/hf.safetensors"

# ---- GGUF: stories260K as llama.cpp would write it (Meta q/k rows), F32 and F16 ----
GG=$BUILD/tests/test_gguf
$GG --write-gguf "$MODEL" "$TMP/s.gguf" f32
$BIN/convert "$TMP/s.gguf" --tokenizer "$TOK" -o "$TMP/g.safetensors" 2>"$TMP/log"
check "convert GGUF: exit 0 ($(cat "$TMP/log"))" test $? = 0
out=$(story "$TMP/g.safetensors")
check "GGUF import: stories260K's greedy text (got: $out)" test "$out" = "$orig"
$BIN/convert "$S/stories260K.bin" --tokenizer "$TOK" -o "$TMP/v0.safetensors" 2>/dev/null
d0=$(digest "$TMP/v0.safetensors") d1=$(digest "$TMP/g.safetensors")
check "GGUF import: the llama2.c import's digest ($d0 / $d1)" test -n "$d0" -a "$d0" = "$d1"
out=$(cat "$TMP/s.gguf" | $BIN/convert - --tokenizer "$TOK" -o - 2>/dev/null | $BIN/decode -m - -p "Once upon a time" -n 60 --temp 0 2>/dev/null)
check "GGUF from stdin to stdout: the same text" test "$out" = "$orig"
$GG --write-gguf "$MODEL" "$TMP/s16.gguf" f16
$BIN/convert "$TMP/s16.gguf" --tokenizer "$TOK" -o "$TMP/g16.safetensors" 2>/dev/null
out=$($BIN/decode -m "$TMP/g16.safetensors" -p "Once upon a time" -n 20 --temp 0 2>/dev/null)
case "$out" in "Once upon a time, there was a little girl"*) ok ;; *) bad "F16 GGUF text: $out" ;; esac
# a quantised GGUF with its own vocabulary: the tokenizer travels as kind "gguf"
$GG --write-tiny "$TMP/tiny.gguf"
$BIN/convert "$TMP/tiny.gguf" -o "$TMP/tiny.safetensors" 2>"$TMP/log"
check "convert quantised GGUF: exit 0 ($(cat "$TMP/log"))" test $? = 0
check "quantised GGUF: tokenizer kind gguf" grep -aq '"paradec.tokenizer":"gguf"' "$TMP/tiny.safetensors"
check "quantised GGUF: chat template kept" grep -aq '"paradec.chat_template":"{% for m in messages %}' "$TMP/tiny.safetensors"

# ---- small HF checkpoints of several configs (test_hf writes them) ----
$BUILD/tests/test_hf --write-fixtures "$TMP/fx"
for fx in gqa-f16-shards qwen2-bf16-tied llama3-rope; do # (check and refuses use $d)
    $BIN/convert "$TMP/fx/$fx" -o "$TMP/$fx.safetensors" 2>"$TMP/log"
    check "convert $fx: exit 0 ($(cat "$TMP/log"))" test $? = 0
    $BIN/decode -m "$TMP/$fx.safetensors" -p "Once upon a time" -n 10 --temp 0 >/dev/null 2>"$TMP/log"
    check "decode $fx: exit 0 ($(cat "$TMP/log"))" test $? = 0
done

# ---- bad input ----
O=$TMP/out.safetensors
for fx in missing-shard absent-tensor bad-shape bad-dtype unknown-dtype bad-arch gelu mlp-bias \
          llama-attention-bias yarn extra-tensor missing-tensor no-config no-weights big-tokenizer wordpiece; do
    refuses "convert HF: $fx" "$O" $BIN/convert "$TMP/fx/bad-$fx" -o "$O"
done
$BIN/convert "$TMP/fx/bad-missing-shard" -o "$O" 2>"$TMP/err"
check "missing shard: the line names it" grep -q "shard 'model-00002-of-00003.safetensors' named by the index is missing" "$TMP/err"
$BIN/convert "$TMP/fx/bad-bad-arch" -o "$O" 2>"$TMP/err"
check "unsupported architecture: the line names it" grep -q "architecture 'GPT2LMHeadModel' is not supported" "$TMP/err"
$BIN/convert "$TMP/fx/bad-bad-shape" -o "$O" 2>"$TMP/err"
check "shape: the line gives both shapes" grep -q "has shape \[96, 64\] but config.json needs \[80, 64\]" "$TMP/err"
mkdir "$TMP/empty"
refuses "convert HF: an empty directory" "$O" $BIN/convert "$TMP/empty" -o "$O"
refuses "convert GGUF: no tokenizer inside, none given" "$O" $BIN/convert "$TMP/s.gguf" -o "$O"
{ printf 'GGUX'; tail -c +5 "$TMP/s.gguf"; } >"$TMP/magic.gguf"
refuses "convert GGUF: wrong magic" "$O" $BIN/convert "$TMP/magic.gguf" --tokenizer "$TOK" -o "$O"
head -c 200000 "$TMP/s.gguf" >"$TMP/trunc.gguf"
refuses "convert GGUF: truncated tensor data" "$O" $BIN/convert "$TMP/trunc.gguf" --tokenizer "$TOK" -o "$O"
head -c 300 "$TMP/s.gguf" >"$TMP/trunc2.gguf"
refuses "convert GGUF: truncated metadata" "$O" $BIN/convert "$TMP/trunc2.gguf" --tokenizer "$TOK" -o "$O"
refuses "convert GGUF: a tokenizer of another vocabulary" "$O" $BIN/convert "$TMP/tiny.gguf" --tokenizer "$TOK" -o "$O"
$BIN/convert "$TMP/trunc.gguf" --tokenizer "$TOK" -o "$O" 2>"$TMP/err"
check "truncated GGUF: the line says so" grep -q "truncated: tensor" "$TMP/err"

finish convert_hf
