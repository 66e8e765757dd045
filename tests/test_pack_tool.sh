# test_pack_tool — bin/pack bundles a model with its head sets: decoding from the bundle
# finds its heads and says exactly what decoding with the separate files says; --list
# shows what is inside; heads for another model are refused naming both digests; and
# the tools chain in shell pipelines (issue 7, points 1-2), each pipeline's result equal
# to the file-based run's.
. tests/lib.sh
need "every check (the head sets it packs train on TinyStories text)" datasets/tinystories/tinystories_val_sample.txt.gz || { finish pack_tool; exit 0; }
DATA=$(data datasets/tinystories/tinystories_val_sample.txt.gz)
gzip -dc "$DATA" | head -c 20000 >"$TMP/small.txt"
EH=$TMP/exit.safetensors.zst MH=$TMP/medusa.safetensors.zst B=$TMP/b.safetensors.zst
DISTILL="$BIN/distill-heads -m $MODEL --steps 3 --batch 2 --seq-len 64 --layers 2,4"
MEDUSA="$BIN/train-medusa -m $MODEL --heads 2 --steps 3 --batch 2 --seq-len 64"
$DISTILL --data "$TMP/small.txt" -o "$EH" 2>/dev/null
$MEDUSA --data "$TMP/small.txt" -o "$MH" 2>/dev/null
$BIN/pack -m "$MODEL" "$EH" "$MH" -o "$B" 2>/dev/null
check "pack writes a bundle" test -s "$B"

# decoding from the bundle = decoding with the files
for m in "adadecode:$EH" "self-speculative:$EH" "medusa:$MH"; do
    meth=${m%%:*} heads=${m#*:}
    $BIN/decode -m "$MODEL" --heads "$heads" --method "$meth" -p "Once upon a time" -n 60 --temp 0 --json 2>/dev/null |
        sed 's/"tok_per_s".*//' >"$TMP/files.json"
    $BIN/decode -m "$B" --method "$meth" -p "Once upon a time" -n 60 --temp 0 --json 2>/dev/null |
        sed 's/"tok_per_s".*//' >"$TMP/bundle.json"
    check "$meth from the bundle = from the files" cmp -s "$TMP/files.json" "$TMP/bundle.json"
    check "$meth: tokens came out" grep -q '"n_gen":60' "$TMP/bundle.json"
done
$BIN/decode -m "$B" -p "Once upon a time" -n 20 --temp 0 >"$TMP/a.txt" 2>/dev/null
$BIN/decode -m "$MODEL" -p "Once upon a time" -n 20 --temp 0 >"$TMP/b.txt" 2>/dev/null
check "standard from the bundle = from the model" cmp -s "$TMP/a.txt" "$TMP/b.txt"
$BIN/pack --list "$B" >"$TMP/list" 2>&1
check "--list: the model" grep -q "^model: kind bundle" "$TMP/list"
check "--list: the exit heads" grep -q "^head set 0: kind exit-heads" "$TMP/list"
check "--list: the medusa heads" grep -q "^head set 1: kind medusa-heads" "$TMP/list"
check "--list: tensors with shapes" grep -q "medusa.1.w .*F32  \[64, 64\]" "$TMP/list"
check "--list: training facts" grep -q "paradec.exit.steps: 3" "$TMP/list"

# refusals: one line, no output
W=$TMP/wide.safetensors WH=$TMP/wide-heads.safetensors.zst
$BIN/widen -m "$MODEL" --preset tiny -o "$W" --heads "$EH" --heads-out "$WH" 2>/dev/null
refuses "heads for another model" "$TMP/x" $BIN/pack -m "$MODEL" "$WH" -o "$TMP/x.safetensors.zst"
$BIN/pack -m "$MODEL" "$WH" -o "$TMP/x.safetensors.zst" 2>"$TMP/err"
dw=$(zstd -dc "$WH" | grep -ao '"paradec.model_digest":"[0-9a-f]*"' | cut -d'"' -f4)
dm=$(zstd -dc "$MODEL" | grep -ao '"paradec.digest":"[0-9a-f]*"' | cut -d'"' -f4)
check "the message names both digests" sh -c "grep -q '$dw' '$TMP/err' && grep -q '$dm' '$TMP/err'"
refuses "a model as a head set" "$TMP/x" $BIN/pack -m "$MODEL" "$MODEL" -o "$TMP/x.safetensors.zst"
refuses "a head set as the model" "$TMP/x" $BIN/pack -m "$EH" -o "$TMP/x.safetensors.zst"
refuses "two inputs from stdin" "$TMP/x" $BIN/pack -m - - -o "$TMP/x.safetensors.zst"
refuses "a missing head file" "$TMP/x" $BIN/pack -m "$MODEL" "$TMP/none" -o "$TMP/x.safetensors.zst"
printf 'garbage' >"$TMP/garbage"
refuses "--list of garbage" "" $BIN/pack --list "$TMP/garbage"
refuses "an unknown flag" "" $BIN/pack --bogus
refuses "the bundle without the heads a method needs" "" \
    $BIN/decode -m "$($BIN/pack -m "$MODEL" "$MH" -o "$TMP/m-only.safetensors.zst" 2>/dev/null; echo "$TMP/m-only.safetensors.zst")" \
    --method adadecode -p hi -n 4

# pipelines, each against the file-based run
S=$(data models/stories260K)
$BIN/convert "$S/stories260K.bin" --tokenizer "$S/tok512.bin" -o - 2>/dev/null |
    $BIN/decode -m - -p "Once upon a time" -n 20 --temp 0 >"$TMP/pipe.txt" 2>/dev/null
check "convert | decode = decode of the file" cmp -s "$TMP/pipe.txt" "$TMP/b.txt"
$DISTILL --data - -o - <"$TMP/small.txt" 2>/dev/null | $BIN/pack -m "$MODEL" - -o "$TMP/p.safetensors.zst" 2>/dev/null
$BIN/pack -m "$MODEL" "$EH" -o "$TMP/f.safetensors.zst" 2>/dev/null
same_bytes() { zstd -dc "$1" >"$TMP/1.dec" && zstd -dc "$2" >"$TMP/2.dec" && cmp -s "$TMP/1.dec" "$TMP/2.dec"; }
check "distill-heads | pack = pack of the files" same_bytes "$TMP/p.safetensors.zst" "$TMP/f.safetensors.zst"
$MEDUSA --data - -o - <"$TMP/small.txt" 2>/dev/null | $BIN/pack -m "$MODEL" - -o "$TMP/pm.safetensors.zst" 2>/dev/null
$BIN/pack -m "$MODEL" "$MH" -o "$TMP/fm.safetensors.zst" 2>/dev/null
check "train-medusa | pack = pack of the files" same_bytes "$TMP/pm.safetensors.zst" "$TMP/fm.safetensors.zst"
$BIN/pack -m "$MODEL" "$EH" -o - 2>/dev/null | $BIN/decode -m - --method adadecode -p "Once upon a time" -n 60 --temp 0 --json 2>/dev/null |
    sed 's/"tok_per_s".*//' >"$TMP/pipe.json"
$BIN/decode -m "$B" --method adadecode -p "Once upon a time" -n 60 --temp 0 --json 2>/dev/null | sed 's/"tok_per_s".*//' >"$TMP/bundle.json"
check "pack | decode = decode of the bundle" cmp -s "$TMP/pipe.json" "$TMP/bundle.json"
finish pack_tool
