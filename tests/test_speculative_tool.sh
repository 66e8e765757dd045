# test_speculative_tool — draft models end to end: heads trained for a few steps with the
# norm on, folded by `convert MODEL --layers L --heads H` into a draft that loads and
# drafts for `decode --method speculative` (greedy text equal to standard's, with and
# without the oracle); a draft larger than the model gets a warning, not a refusal;
# every kind of bad input (to convert and to decode) is refused with one line and no
# output file.
. tests/lib.sh
need "every check (its drafts fold heads trained on TinyStories text)" datasets/tinystories/tinystories_val_sample.txt.gz || { finish speculative_tool; exit 0; }
S=$(data models/stories260K)
DATA=$(data datasets/tinystories/tinystories_val_sample.txt.gz)
gzip -dc "$DATA" | head -c 20000 >"$TMP/small.txt"
HEADS="$BIN/distill-heads -m $MODEL --steps 3 --batch 2 --seq-len 64 --data $TMP/small.txt"
H=$TMP/h.safetensors
$HEADS --layers 2 --norm 1 -o "$H" 2>/dev/null
$HEADS --layers 2 --norm 0 -o "$TMP/h0.safetensors" 2>/dev/null
check "heads trained" test -s "$H" -a -s "$TMP/h0.safetensors"

DR=$TMP/draft.safetensors
$BIN/convert "$MODEL" --layers 2 --heads "$H" -o "$DR" 2>"$TMP/log"
check "convert --layers 2 --heads writes a draft" test -s "$DR"
check "convert says it made a draft" grep -q "draft: layers 0..1 and the exit head at layer 2" "$TMP/log"
src=$(zstd -q -d -c "$MODEL" | grep -ao '"paradec.digest":"[0-9a-f]*"' | sed 's/.*:"//; s/"//')
check "the draft names its source (paradec.draft_of $src)" grep -aqF "\"paradec.draft_of\":\"$src\"" "$DR"
check "the draft is a model of 2 layers" sh -c "grep -aqF '\"paradec.kind\":\"model\"' '$DR' && grep -aqF 'num_hidden_layers\\\":2' '$DR'"

# decoding with it: the same text as standard, greedy
P="Once upon a time, there was a"
std=$($BIN/decode -m "$MODEL" -p "$P" -n 80 --temp 0 2>/dev/null)
for flags in "" "--draft-max 4 --draft-min 2" "--draft-fixed --draft-max 3 --fixed-tree" \
    "--draft-fixed --draft-max 4 --fixed-tree --oracle-acceptance 0.8"; do
    out=$($BIN/decode -m "$MODEL" -p "$P" -n 80 --temp 0 --method speculative --draft "$DR" $flags 2>"$TMP/log")
    check "speculative $flags: the text of standard" test "$out" = "$std"
    check "speculative $flags: tau on the summary line" grep -q "speculative, .* tau " "$TMP/log"
done
$BIN/decode -m "$MODEL" -p "$P" -n 20 --temp 1 --seed 3 --method speculative --draft "$DR" --json >"$TMP/j" 2>/dev/null
check "sampling, --json with tau" grep -q '"tau":' "$TMP/j"
# rounds_by_nodes: a fixed tree of the root and 3 drafts runs 4 nodes a round (fewer only
# where the budget's end cuts it), one round per target pass after the prompt
$BIN/decode -m "$MODEL" -p "$P" -n 40 --temp 0 --method speculative --draft "$DR" --draft-fixed --draft-max 3 \
    --fixed-tree --json >"$TMP/j" 2>/dev/null
check "--json rounds_by_nodes: 4-node rounds, one per pass" jq -e '(.rounds_by_nodes | keys | map(tonumber) | max) == 4
    and ([.rounds_by_nodes[]] | add) == ((.n_gen - 1) / .tau | round)' "$TMP/j" >/dev/null # τ: tokens after the first per pass
# a draft larger than the model: a warning line, then it runs
out=$($BIN/decode -m "$DR" -p "$P" -n 20 --temp 0 --method speculative --draft "$MODEL" 2>"$TMP/log")
check "a larger draft runs" test -n "$out"
check "a larger draft gets a warning" grep -q "^decode: warning: the draft .* is larger than the model" "$TMP/log"

# ---- bad input: convert ----
O=$TMP/out.safetensors
$HEADS --layers 1 --norm 1 -m "$DR" -o "$TMP/hdraft.safetensors" 2>/dev/null # heads of another model
refuses "layer past the model" "$O" $BIN/convert "$MODEL" --layers 5 --heads "$H" -o "$O"
refuses "layer 0" "$O" $BIN/convert "$MODEL" --layers 0 --heads "$H" -o "$O"
refuses "no head at the layer" "$O" $BIN/convert "$MODEL" --layers 3 --heads "$H" -o "$O"
refuses "heads without the norm" "$O" $BIN/convert "$MODEL" --layers 2 --heads "$TMP/h0.safetensors" -o "$O"
refuses "heads of another model" "$O" $BIN/convert "$MODEL" --layers 1 --heads "$TMP/hdraft.safetensors" -o "$O"
refuses "--heads without --layers" "$O" $BIN/convert "$MODEL" --heads "$H" -o "$O"
refuses "--layers without --heads" "$O" $BIN/convert "$MODEL" --layers 2 -o "$O"
refuses "--tokenizer with --heads" "$O" $BIN/convert "$MODEL" --layers 2 --heads "$H" --tokenizer "$S/tok512.bin" -o "$O"
refuses "missing heads file" "$O" $BIN/convert "$MODEL" --layers 2 --heads "$TMP/nope" -o "$O"
refuses "source not a paradec model" "$O" $BIN/convert "$S/stories260K.bin" --layers 2 --heads "$H" -o "$O"
$BIN/convert "$MODEL" --layers 2 --heads "$TMP/h0.safetensors" -o "$O" 2>"$TMP/log"
check "the no-norm refusal says how to fix it" grep -q "distill-heads --norm 1" "$TMP/log"

# ---- bad input: decode ----
D="$BIN/decode -m $MODEL -p Once -n 8 --temp 0 --method speculative"
refuses "no --draft" "" $D
refuses "--draft missing file" "" $D --draft "$TMP/nope"
refuses "--draft-min above --draft-max" "" $D --draft "$DR" --draft-min 5 --draft-max 3
refuses "--draft-max 40" "" $D --draft "$DR" --draft-max 40
refuses "--draft-min 0" "" $D --draft "$DR" --draft-min 0
refuses "--draft-min not a number" "" $D --draft "$DR" --draft-min two
refuses "--oracle with sampling" "" $BIN/decode -m "$MODEL" -p Once -n 8 --temp 1 --method speculative --draft "$DR" --oracle-acceptance 0.5
# a vocabulary one token apart: the last piece's last byte changed (U+200A → U+200B)
head -c -1 "$S/tok512.bin" >"$TMP/alt.bin" && printf '\213' >>"$TMP/alt.bin"
$BIN/convert "$S/stories260K.bin" --tokenizer "$TMP/alt.bin" -o "$TMP/alt.safetensors" 2>/dev/null
refuses "a draft with another vocabulary" "" $D --draft "$TMP/alt.safetensors"
$D --draft "$TMP/alt.safetensors" 2>"$TMP/log"
check "the refusal names token 511" grep -q "differ first at token 511" "$TMP/log"
SMOL=${SMOLLM2:-$BUILD/smollm2.safetensors}
if [ -f "$SMOL" ]; then
    refuses "SmolLM2 as the draft of stories260K" "" $D --draft "$SMOL"
    $D --draft "$SMOL" 2>"$TMP/log"
    check "the refusal gives both sizes" grep -q "have 512 and 49152 tokens" "$TMP/log"
else
    echo "speculative_tool: no $SMOL: the SmolLM2 vocabulary check skipped"
fi
finish speculative_tool
