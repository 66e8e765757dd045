# test_distill_tool — bin/distill-heads end to end on stories260K with a few steps: the
# heads file it writes loads (heads_load, through test_exit_heads FILE), carries its
# training facts, is the same for the same seed, streams to stdout; jsonl on stdin
# works; --check-vocab heads carry their vocabulary and rest logits and decode as
# standard does; every kind of bad input is refused with one line and no output file.
. tests/lib.sh
need "every check (its heads train on TinyStories text)" datasets/tinystories/tinystories_val_sample.txt.gz || { finish distill_tool; exit 0; }
DATA=$(data datasets/tinystories/tinystories_val_sample.txt.gz)
# a small slice keeps this quick: ~9k tokens, 10 % held out
gzip -dc "$DATA" | head -c 20000 >"$TMP/small.txt"
H=$TMP/h.safetensors.zst
RUN="$BIN/distill-heads -m $MODEL --steps 3 --batch 2 --seq-len 64"

$RUN --data "$TMP/small.txt" --layers 2,4 -o "$H" 2>"$TMP/log"
check "a short run succeeds" test -s "$H"
loads() { "$BUILD/tests/test_exit_heads" "$1" >/dev/null; }
check "heads_load accepts the file" loads "$H"
check "the log has the per-layer table" grep -q "^ *4 .*/" "$TMP/log"
check "the log has the summary line" grep -q "3 steps of 2 sequences" "$TMP/log"
check "the log says what norm auto chose" grep -q "norm auto: .* training without" "$TMP/log"
zstd -q -d -c "$H" >"$TMP/h.safetensors"
for key in '"paradec.kind":"exit-heads"' '"paradec.exit.layers":"2,4"' '"paradec.exit.norm":"0"' \
    '"paradec.exit.steps":"3"' '"paradec.exit.norm_auto_kl":"' '"paradec.exit.data_digest":"' '"paradec.exit.4.kl_before":"' \
    '"paradec.exit.2.top1":"' '"paradec.exit.4.cover@0.75":"' '"paradec.model_digest":"' '"exit.2.T"'; do
    check "metadata $key" grep -aqF "$key" "$TMP/h.safetensors"
done
# same seed, same bytes; written to stdout
$RUN --data "$TMP/small.txt" --layers 2,4 -o - 2>/dev/null >"$TMP/h2.safetensors.zst"
check "same seed, same heads (stdout)" cmp -s "$H" "$TMP/h2.safetensors.zst"
$RUN --data "$TMP/small.txt" --layers 2,4 --seed 5 -o "$TMP/h3.safetensors.zst" 2>/dev/null
check "another seed, other heads" sh -c "! cmp -s '$H' '$TMP/h3.safetensors.zst'"
# two threads compute the very same heads (the kernels' sums never depend on the split)
$RUN --data "$TMP/small.txt" --layers 2,4 -t 2 -o "$TMP/h4.safetensors.zst" 2>/dev/null
check "-t 2, same heads" cmp -s "$H" "$TMP/h4.safetensors.zst"
# going on from trained heads (--init) keeps their layers and norm
$RUN --data "$TMP/small.txt" --init "$H" -o "$TMP/h5.safetensors.zst" 2>/dev/null
check "--init" loads "$TMP/h5.safetensors.zst"
zstd -q -d -c "$TMP/h5.safetensors.zst" >"$TMP/h5.safetensors"
check "--init keeps the layers" grep -aqF '"paradec.exit.layers":"2,4"' "$TMP/h5.safetensors"
# jsonl with named fields from stdin, gzip'd; --layers auto = 1..4 on 5 layers; --norm 1
head -c 4000 "$TMP/small.txt" | awk 'BEGIN { RS = "" } {
    gsub(/\\/, "\\\\"); gsub(/"/, "\\\""); gsub(/\t/, "\\t"); gsub(/\n/, "\\n")
    print "{\"id\": 1, \"story\": \"" $0 "\"}" }' | gzip >"$TMP/d.jsonl.gz"
$BIN/distill-heads -m "$MODEL" --steps 2 --batch 2 --seq-len 32 --fields story --norm 1 --data - \
    -o "$TMP/j.safetensors" <"$TMP/d.jsonl.gz" 2>"$TMP/log"
check "jsonl on stdin" loads "$TMP/j.safetensors"
check "auto layers 1..4, norm 1" sh -c "grep -aqF '\"paradec.exit.layers\":\"1,2,3,4\"' '$TMP/j.safetensors' && grep -aqF '\"paradec.exit.norm\":\"1\"' '$TMP/j.safetensors'"
# a check vocabulary (--check-vocab: the 64 most frequent tokens of the text, and the rest)
$RUN --data "$TMP/small.txt" --layers 2,4 --check-vocab 64 -o "$TMP/v.safetensors" 2>"$TMP/log"
check "--check-vocab 64: the heads load" loads "$TMP/v.safetensors"
for key in '"exit.vocab":{"dtype":"I32","shape":[64]' '"exit.2.rest":{"dtype":"F32","shape":[65]' '"exit.4.rest"' \
    '"paradec.exit.check_vocab":"64"'; do
    check "check vocabulary: $key" grep -aqF "$key" "$TMP/v.safetensors"
done
$RUN --data "$TMP/small.txt" --init "$TMP/v.safetensors" -o "$TMP/v2.safetensors" 2>/dev/null
check "--init keeps the check vocabulary" grep -aqF '"exit.vocab":{"dtype":"I32","shape":[64]' "$TMP/v2.safetensors"
for p in "Once upon a time" "Tom and Sue"; do
    $BIN/decode -m "$MODEL" -p "$p" -n 40 --temp 0 >"$TMP/std" 2>/dev/null
    $BIN/decode -m "$MODEL" --heads "$TMP/v.safetensors" --method adadecode --gamma 0.3 -p "$p" -n 40 --temp 0 \
        >"$TMP/ada" 2>/dev/null
    check "adadecode with a check vocabulary: standard's tokens ($p)" \
        sh -c "test -s '$TMP/std' && cmp -s '$TMP/std' '$TMP/ada'"
done

# ---- bad input ----
O=$TMP/out.safetensors.zst
D="--data $TMP/small.txt"
: >"$TMP/empty.txt"
printf ' \n\n\t\n' >"$TMP/blank.txt"
printf '{"title": "x"}\n' >"$TMP/notext.jsonl"
printf '{"text": "a"}\nnot json\n' >"$TMP/badline.jsonl"
refuses "layer out of range" "$O" $RUN $D --layers 5 -o "$O"
refuses "a check vocabulary as large as the vocabulary" "$O" $RUN $D --check-vocab 512 -o "$O"
refuses "--check-vocab with --init" "$O" $RUN $D --init "$H" --check-vocab 64 -o "$O"
refuses "layer 0" "$O" $RUN $D --layers 0,2 -o "$O"
refuses "layers not numbers" "$O" $RUN $D --layers two -o "$O"
refuses "a layer twice" "$O" $RUN $D --layers 2,2 -o "$O"
refuses "empty data" "$O" $RUN --data "$TMP/empty.txt" -o "$O"
refuses "blank data" "$O" $RUN --data "$TMP/blank.txt" -o "$O"
refuses "missing data" "$O" $RUN --data "$TMP/nope.txt" -o "$O"
refuses "data is a directory" "$O" $RUN --data "$TMP" -o "$O"
refuses "jsonl without text" "$O" $RUN --data "$TMP/notext.jsonl" -o "$O"
refuses "jsonl with a bad line" "$O" $RUN --data "$TMP/badline.jsonl" -o "$O"
refuses "binary data" "$O" $RUN --data "$MODEL" -o "$O"
printf 'Hi.\n' >"$TMP/tiny.txt"
refuses "one sequence of text" "$O" $RUN --data "$TMP/tiny.txt" -o "$O"
refuses "--steps -1" "$O" $RUN $D --steps -1 -o "$O"
refuses "--lr x" "$O" $RUN $D --lr x -o "$O"
refuses "--lr 0" "$O" $RUN $D --lr 0 -o "$O"
refuses "--batch 0" "$O" $RUN $D --batch 0 -o "$O"
refuses "--seq-len 0" "$O" $RUN $D --seq-len 0 -o "$O"
refuses "--seq-len past the context" "$O" $RUN $D --seq-len 100000 -o "$O"
refuses "--norm 2" "$O" $RUN $D --norm 2 -o "$O"
refuses "--heldout 1" "$O" $RUN $D --heldout 1 -o "$O"
refuses "-t 0" "$O" $RUN $D -t 0 -o "$O"
refuses "unknown flag" "$O" $RUN $D --frobnicate -o "$O"
refuses "flag without its value" "$O" $RUN $D -o
refuses "missing model" "$O" $BIN/distill-heads -m "$TMP/nope" $D -o "$O"
refuses "heads file as the model" "$O" $BIN/distill-heads -m "$H" $D -o "$O"
refuses "--init with --layers" "$O" $RUN $D --init "$H" --layers 2 -o "$O"
refuses "--init: a model file" "$O" $RUN $D --init "$MODEL" -o "$O"
refuses "--init: missing" "$O" $RUN $D --init "$TMP/nope" -o "$O"
refuses "output directory missing" "" $RUN $D -o "$TMP/no/dir/h.safetensors"
refuses "model and data both stdin" "$O" $BIN/distill-heads -m - --data - -o "$O"
finish distill_tool
