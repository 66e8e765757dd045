# test_train_medusa_tool — bin/train-medusa end to end on stories260K with a few steps:
# the heads file it writes loads (medusa_load, through test_medusa FILE), carries its
# training facts and rank accuracies, is the same for the same seed and any -t,
# streams to stdout; own LM heads, data targets, self-generated text and jsonl on stdin
# work; every kind of bad input is refused with one line and no output file.
. tests/lib.sh
need "every check (its heads train on TinyStories text)" datasets/tinystories/tinystories_val_sample.txt.gz || { finish train_medusa_tool; exit 0; }
DATA=$(data datasets/tinystories/tinystories_val_sample.txt.gz)
# a small slice keeps this quick: ~9k tokens, 10 % held out
gzip -dc "$DATA" | head -c 20000 >"$TMP/small.txt"
H=$TMP/h.safetensors.zst
RUN="$BIN/train-medusa -m $MODEL --steps 3 --batch 2 --seq-len 64"

$RUN --data "$TMP/small.txt" --heads 2 -o "$H" 2>"$TMP/log"
check "a short run succeeds" test -s "$H"
loads() { "$BUILD/tests/test_medusa" "$1" >/dev/null; }
check "medusa_load accepts the file" loads "$H"
check "the log has the per-head table" grep -q "^ *1  t+3 " "$TMP/log"
check "the log has the summary line" grep -q "3 steps of 2 sequences" "$TMP/log"
zstd -q -d -c "$H" >"$TMP/h.safetensors"
for key in '"paradec.kind":"medusa-heads"' '"paradec.medusa.heads":"2"' '"paradec.medusa.rank_acc":"[[' \
    '"paradec.medusa.steps":"3"' '"paradec.medusa.loss_weights":"1,0.8"' '"paradec.medusa.targets":"self"' \
    '"paradec.medusa.data_digest":"' '"paradec.medusa.0.top1_before":"' '"paradec.medusa.1.top5":"' \
    '"paradec.model_digest":"' '"medusa.0.w"' '"medusa.1.b"'; do
    check "metadata $key" grep -aqF "$key" "$TMP/h.safetensors"
done
check "no own lm_head unless asked" sh -c "! grep -aqF 'medusa.0.lm_head' '$TMP/h.safetensors'"
# same seed, same bytes; written to stdout; another seed, other heads; -t 2, the same
$RUN --data "$TMP/small.txt" --heads 2 -o - 2>/dev/null >"$TMP/h2.safetensors.zst"
check "same seed, same heads (stdout)" cmp -s "$H" "$TMP/h2.safetensors.zst"
$RUN --data "$TMP/small.txt" --heads 2 --seed 5 -o "$TMP/h3.safetensors.zst" 2>/dev/null
check "another seed, other heads" sh -c "! cmp -s '$H' '$TMP/h3.safetensors.zst'"
$RUN --data "$TMP/small.txt" --heads 2 -t 2 -o "$TMP/h4.safetensors.zst" 2>/dev/null
check "-t 2, same heads" cmp -s "$H" "$TMP/h4.safetensors.zst"
$RUN --data "$TMP/small.txt" --heads 2 --cache-mb 0 -o "$TMP/h5.safetensors.zst" 2>/dev/null
check "no cache, same heads" cmp -s "$H" "$TMP/h5.safetensors.zst"
# own LM heads, data targets, weights, self-generated text
$RUN --data "$TMP/small.txt" --heads 3 --own-lm-head --targets data --loss-weights 1,0.5,0.25 --generate 8 \
    -o "$TMP/o.safetensors" 2>"$TMP/log"
check "own lm_head, data targets, --generate" loads "$TMP/o.safetensors"
check "own lm_head stored" grep -aqF '"medusa.2.lm_head"' "$TMP/o.safetensors"
for key in '"paradec.medusa.targets":"data"' '"paradec.medusa.generate":"8"' '"paradec.medusa.own_lm_head":"1"' \
    '"paradec.medusa.loss_weights":"1,0.5,0.25"'; do
    check "metadata $key" grep -aqF "$key" "$TMP/o.safetensors"
done
check "--generate says what it made" grep -q "^medusa: generating: " "$TMP/log"
# --init goes on from trained heads (their number and LM heads); --steps 0 evaluates them
$RUN --data "$TMP/small.txt" --init "$TMP/o.safetensors" --steps 0 -o "$TMP/i.safetensors" 2>"$TMP/log"
check "--init --steps 0" loads "$TMP/i.safetensors"
check "--init keeps 3 heads and their LM heads" sh -c "grep -aqF '\"paradec.medusa.heads\":\"3\"' '$TMP/i.safetensors' && grep -aqF 'medusa.2.lm_head' '$TMP/i.safetensors'"
check "--init --steps 0 says so" grep -q "no training steps" "$TMP/log"
# bin/widen carries Medusa heads to the wide model (the file's kind decides)
$BIN/widen -m "$MODEL" --preset tiny -o "$TMP/w.safetensors" --heads "$TMP/o.safetensors" --heads-out "$TMP/wh.safetensors" 2>/dev/null
check "widened heads load against the wide model" sh -c "MODEL='$TMP/w.safetensors' '$BUILD/tests/test_medusa' '$TMP/wh.safetensors' >/dev/null"
check "widened heads record input_scale 2" grep -aqF '"paradec.medusa.input_scale":"2"' "$TMP/wh.safetensors"
check "widened heads refused for the small model" sh -c "! '$BUILD/tests/test_medusa' '$TMP/wh.safetensors' >/dev/null 2>&1"
# jsonl with a named field from stdin, gzip'd
head -c 4000 "$TMP/small.txt" | awk 'BEGIN { RS = "" } {
    gsub(/\\/, "\\\\"); gsub(/"/, "\\\""); gsub(/\t/, "\\t"); gsub(/\n/, "\\n")
    print "{\"id\": 1, \"story\": \"" $0 "\"}" }' | gzip >"$TMP/d.jsonl.gz"
$BIN/train-medusa -m "$MODEL" --heads 1 --steps 2 --batch 2 --seq-len 32 --fields story --data - \
    -o "$TMP/j.safetensors" <"$TMP/d.jsonl.gz" 2>/dev/null
check "jsonl on stdin" loads "$TMP/j.safetensors"

# ---- bad input ----
O=$TMP/out.safetensors.zst
D="--data $TMP/small.txt"
: >"$TMP/empty.txt"
printf ' \n\n\t\n' >"$TMP/blank.txt"
printf '{"title": "x"}\n' >"$TMP/notext.jsonl"
printf '{"text": "a"}\nnot json\n' >"$TMP/badline.jsonl"
printf 'Hi.\n' >"$TMP/tiny.txt"
refuses "--heads 0" "$O" $RUN $D --heads 0 -o "$O"
refuses "--heads 9" "$O" $RUN $D --heads 9 -o "$O"
refuses "--heads x" "$O" $RUN $D --heads x -o "$O"
refuses "no --heads" "$O" $RUN $D -o "$O"
refuses "--loss-weights: too few" "$O" $RUN $D --heads 2 --loss-weights 1 -o "$O"
refuses "--loss-weights: too many" "$O" $RUN $D --heads 2 --loss-weights 1,1,1 -o "$O"
refuses "--loss-weights: zero" "$O" $RUN $D --heads 2 --loss-weights 1,0 -o "$O"
refuses "--loss-weights: negative" "$O" $RUN $D --heads 2 --loss-weights 1,-0.5 -o "$O"
refuses "--loss-weights: not a number" "$O" $RUN $D --heads 2 --loss-weights 1,a -o "$O"
refuses "--loss-weights: empty entry" "$O" $RUN $D --heads 2 --loss-weights 1,,1 -o "$O"
refuses "--loss-weights: empty" "$O" $RUN $D --heads 1 --loss-weights "" -o "$O"
refuses "--loss-weights: nan" "$O" $RUN $D --heads 1 --loss-weights nan -o "$O"
refuses "--targets other" "$O" $RUN $D --heads 1 --targets teacher -o "$O"
refuses "--generate -1" "$O" $RUN $D --heads 1 --generate -1 -o "$O"
refuses "--generate x" "$O" $RUN $D --heads 1 --generate x -o "$O"
refuses "--generate = --seq-len" "$O" $RUN $D --heads 1 --generate 64 -o "$O"
refuses "--steps -1" "$O" $RUN $D --heads 1 --steps -1 -o "$O"
refuses "--lr x" "$O" $RUN $D --heads 1 --lr x -o "$O"
refuses "--lr 0" "$O" $RUN $D --heads 1 --lr 0 -o "$O"
refuses "--lm-lr -1" "$O" $RUN $D --heads 1 --lm-lr -1 -o "$O"
refuses "--batch 0" "$O" $RUN $D --heads 1 --batch 0 -o "$O"
refuses "--seq-len 1" "$O" $RUN $D --heads 1 --seq-len 1 -o "$O"
refuses "--seq-len past the context" "$O" $RUN $D --heads 1 --seq-len 100000 -o "$O"
refuses "--seed -1" "$O" $RUN $D --heads 1 --seed -1 -o "$O"
refuses "--heldout 1" "$O" $RUN $D --heads 1 --heldout 1 -o "$O"
refuses "--cache-mb -1" "$O" $RUN $D --heads 1 --cache-mb -1 -o "$O"
refuses "-t 0" "$O" $RUN $D --heads 1 -t 0 -o "$O"
refuses "empty data" "$O" $RUN --heads 1 --data "$TMP/empty.txt" -o "$O"
refuses "blank data" "$O" $RUN --heads 1 --data "$TMP/blank.txt" -o "$O"
refuses "missing data" "$O" $RUN --heads 1 --data "$TMP/nope.txt" -o "$O"
refuses "no --data" "$O" $RUN --heads 1 -o "$O"
refuses "data is a directory" "$O" $RUN --heads 1 --data "$TMP" -o "$O"
refuses "jsonl without text" "$O" $RUN --heads 1 --data "$TMP/notext.jsonl" -o "$O"
refuses "jsonl with a bad line" "$O" $RUN --heads 1 --data "$TMP/badline.jsonl" -o "$O"
refuses "binary data" "$O" $RUN --heads 1 --data "$MODEL" -o "$O"
refuses "one sequence of text" "$O" $RUN --heads 1 --data "$TMP/tiny.txt" -o "$O"
refuses "unknown flag" "$O" $RUN $D --heads 1 --frobnicate -o "$O"
refuses "flag without its value" "$O" $RUN $D --heads 1 -o
refuses "missing model" "$O" $BIN/train-medusa -m "$TMP/nope" $D --heads 1 -o "$O"
refuses "heads file as the model" "$O" $BIN/train-medusa -m "$H" $D --heads 1 -o "$O"
refuses "output directory missing" "" $RUN $D --heads 1 -o "$TMP/no/dir/h.safetensors"
refuses "model and data both stdin" "$O" $BIN/train-medusa -m - --data - --heads 1 -o "$O"
refuses "--init with --heads" "$O" $RUN $D --init "$H" --heads 2 -o "$O"
refuses "--init with --own-lm-head" "$O" $RUN $D --init "$H" --own-lm-head -o "$O"
refuses "--init: a model file" "$O" $RUN $D --init "$MODEL" -o "$O"
refuses "--init: missing" "$O" $RUN $D --init "$TMP/nope" -o "$O"
refuses "--init: --loss-weights count" "$O" $RUN $D --init "$H" --loss-weights 1 -o "$O"
finish train_medusa_tool
