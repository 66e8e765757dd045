# test_widen_tool — bin/widen end to end on stories260K: the widened model tells the
# original's greedy story (as a paradec file, through the llama2.c export re-imported
# by bin/convert, in bf16 through the streamed writer); the export and the HF
# directory hold the same model; the seed decides the file; bad input is refused with
# one line, a non-zero exit and no output file.
. tests/lib.sh
S=$(data models/stories260K)
TOK=$S/tok512.bin
W=$BIN/widen
story() { $BIN/decode -m "$1" -p "Once upon a time" -n 60 --temp 0 2>/dev/null; }
digest() { grep -ao '"paradec.digest":"[0-9a-f]*"' "$1"; }

orig=$(story "$MODEL")
check "the original tells a story ($MODEL)" test -n "$orig"

# tiny, f32, with every output
$W -m "$MODEL" --preset tiny -o "$TMP/w.safetensors" --llama2c "$TMP/w.bin" --hf "$TMP/hf" 2>"$TMP/log"
check "widen tiny: exit 0 ($(cat "$TMP/log"))" test $? = 0
out=$(story "$TMP/w.safetensors")
check "tiny: the original's greedy text (got: $out)" test "$out" = "$orig"
$BIN/convert "$TMP/w.bin" --tokenizer "$TOK" -o "$TMP/back.safetensors" 2>/dev/null
out=$(story "$TMP/back.safetensors")
check "tiny via llama2.c export: the original's greedy text (got: $out)" test "$out" = "$orig"
d0=$(digest "$TMP/w.safetensors") d1=$(digest "$TMP/back.safetensors")
check "llama2.c export re-imported: same digest ($d0 / $d1)" test -n "$d0" -a "$d0" = "$d1"
check "hf: config.json says dim 256" grep -q '"hidden_size": 256' "$TMP/hf/config.json"
check "hf: config.json says 16 kv heads" grep -q '"num_key_value_heads": 16' "$TMP/hf/config.json"
check "hf: tokenizer.bin is tok512" cmp -s "$TMP/hf/tokenizer.bin" "$TOK"
check "hf: model.safetensors written" test -s "$TMP/hf/model.safetensors"

# tiny-gqa in bf16 goes through the streamed writer
$W -m "$MODEL" --preset tiny-gqa --dtype bf16 -o "$TMP/g.safetensors" 2>/dev/null
out=$(story "$TMP/g.safetensors")
check "tiny-gqa bf16: the original's greedy text (got: $out)" test "$out" = "$orig"
# same seed, same bytes; another seed, other bytes, same story
$W -m "$MODEL" --preset tiny-gqa --dtype bf16 --seed 1 -o "$TMP/g1.safetensors" 2>/dev/null
$W -m "$MODEL" --preset tiny-gqa --dtype bf16 --seed 2 -o "$TMP/g2.safetensors" 2>/dev/null
check "default seed is 1: same file" cmp -s "$TMP/g.safetensors" "$TMP/g1.safetensors"
check "seed 2: another file" sh -c "! cmp -s '$TMP/g1.safetensors' '$TMP/g2.safetensors'"
out=$(story "$TMP/g2.safetensors")
check "seed 2: the original's greedy text" test "$out" = "$orig"
check "--help lists the presets" sh -c "$W --help | grep -q '^  8b '"

# ---- bad input ----
O=$TMP/out
refuses "unknown preset" "$O" $W -m "$MODEL" --preset huge -o "$O.safetensors"
refuses "missing model" "$O" $W -m "$TMP/nope.safetensors" --preset tiny -o "$O.safetensors"
refuses "not a model" "$O" $W -m "$TOK" --preset tiny -o "$O.safetensors"
refuses "a preset too small for the model" "$O" $W -m "$TMP/w.safetensors" --preset tiny-gqa -o "$O.safetensors"
refuses "bad dtype" "$O" $W -m "$MODEL" --preset tiny --dtype f16 -o "$O.safetensors"
refuses "bad seed" "$O" $W -m "$MODEL" --preset tiny --seed x -o "$O.safetensors"
refuses "unknown flag" "$O" $W -m "$MODEL" --preset tiny --frobnicate -o "$O.safetensors"
refuses "no -o" "$O" $W -m "$MODEL" --preset tiny
refuses "output directory missing" "" $W -m "$MODEL" --preset tiny -o "$TMP/no/dir/x.safetensors"
refuses "--llama2c directory missing: -o taken back" "$O" $W -m "$MODEL" --preset tiny -o "$O.safetensors" --llama2c "$TMP/no/dir/x.bin"
$W -m "$MODEL" --preset tiny -o "$O.safetensors" --llama2c "$O.bin" --hf "$TMP/no/dir/hf" 2>"$TMP/err"
check "--hf parent missing: non-zero exit" test $? != 0
check "--hf parent missing: the line names it" grep -q "^widen: $TMP/no/dir/hf: cannot create" "$TMP/err"
check "--hf parent missing: -o and --llama2c taken back" sh -c "! ls '$O'* >/dev/null 2>&1"
$W -m "$MODEL" --preset huge -o "$O.safetensors" 2>"$TMP/err"
check "unknown preset: the line names it" grep -q "^widen: --preset: 'huge' is unknown" "$TMP/err"
$W -m "$TMP/w.safetensors" --preset tiny-gqa -o "$O.safetensors" 2>"$TMP/err"
check "too small: the line says why" grep -q "^widen: --preset tiny-gqa: cannot hold the model: dim 192 < the model's 256" "$TMP/err"

finish widen_tool
