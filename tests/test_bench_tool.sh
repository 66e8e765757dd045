# test_bench_tool — bin/bench, bin/recipe and bin/randmodel end to end, small: a recipe on
# stories260K with heads trained for a few steps, 2 prompts: every method runs, the tables
# are written, greedy parity is 100 %, the oracle sweep runs; a random-weights model with
# the real Llama-3 tokenizer runs the chat path; the self-distillation answers are jsonl;
# bad recipes and bad arguments are refused with one line and nothing left behind, by
# bench, by recipe and by `make recipe=...`.
. tests/lib.sh
need "every check (its recipes use TinyStories, GSM8K and the Llama 3 tokenizer)" datasets/tinystories/tinystories_val_sample.txt.gz datasets/gsm8k/test.jsonl.gz tokenizers/llama3/tokenizer.json.gz tokenizers/llama3/tokenizer_config.json || { finish bench_tool; exit 0; }
DATA=$(data datasets/tinystories/tinystories_val_sample.txt.gz)
gzip -dc "$DATA" | head -c 20000 >"$TMP/small.txt"
H=$TMP/exit.safetensors.zst MH=$TMP/medusa.safetensors.zst DR=$TMP/draft.safetensors
SMALL="--steps 3 --batch 2 --seq-len 64"
$BIN/distill-heads -m "$MODEL" --data "$TMP/small.txt" --layers 2,4 --norm 1 $SMALL -o "$H" 2>/dev/null
$BIN/train-medusa -m "$MODEL" --data "$TMP/small.txt" --heads 2 $SMALL -o "$MH" 2>/dev/null
EH=$TMP/eagle.safetensors.zst
$BIN/train-medusa -m "$MODEL" --data "$TMP/small.txt" --eagle $SMALL -o "$EH" 2>/dev/null
$BIN/convert "$MODEL" --layers 2 --heads "$H" -o "$DR" 2>/dev/null
FILES="--model $MODEL --exit-heads $H --medusa $MH --eagle $EH --draft $DR"
METHODS="standard adadecode self-speculative medusa eagle speculative prompt-lookup lookahead"

cat >"$TMP/r.yaml" <<EOF
about: test_bench_tool's recipe
model: {source: models/stories260K/stories260K.bin, tokenizer: models/stories260K/tok512.bin}
exit_heads: {layers: [2, 4], data: $TMP/small.txt, norm: 1}
draft: {layer: 2}
medusa: {heads: 2, data: $TMP/small.txt}
eagle: {data: $TMP/small.txt}
decoding:
  methods: [$(echo $METHODS | tr ' ' ',')]
  temp: 1
  oracle: [0.5, 1]
  oracle_samples: 1
datasets:
  - {name: tinystories, samples: 2, max_new: 32}
EOF
$BIN/bench --recipe "$TMP/r.yaml" $FILES --out "$TMP/out" >"$TMP/stdout" 2>"$TMP/log"
rc=$?
check "bench runs (exit $rc: $(tail -n 1 "$TMP/log"))" test "$rc" = 0
check "table.md written" test -s "$TMP/out/table.md"
check "table.csv written" test -s "$TMP/out/table.csv"
check "stdout is table.md" cmp -s "$TMP/stdout" "$TMP/out/table.md"
for m in $METHODS; do
    check "csv: $m on 2 prompts, parity 2/2" grep -q "^speed,tinystories,$m,[0-9.]*,,2,.*,2,2,real$" "$TMP/out/table.csv"
done
for m in adadecode medusa eagle speculative prompt-lookup lookahead; do
    check "md: $m parity 100 %" grep -q "^| $m | 100 % (2/2) |" "$TMP/out/table.md"
done
for m in $METHODS; do
    check "csv: $m sampled on 2 prompts" grep -q "^sampled,tinystories,$m,[0-9.]*,,2," "$TMP/out/table.csv"
done
check "md: the sampled table" grep -q "^## Sampled at temperature 1:" "$TMP/out/table.md"
# the mark bench writes for a mismatch, not a bare NO: the command line's mktemp path may hold one
check "md: no mismatch" sh -c "! grep -q '[*][*]NO' '$TMP/out/table.md'"
check "csv: 12 oracle rows (6 methods × 2 rates), parity 1/1" \
    test "$(grep -c '^oracle,tinystories,.*,1,1,oracle$' "$TMP/out/table.csv")" = 12
check "md: oracle figures are marked" grep -q "adadecode (oracle) | 1.00 |" "$TMP/out/table.md"
check "md: the real figures say they are real" grep -q "is \*\*real\*\*" "$TMP/out/table.md"
check "the summary line says parity held" grep -q "greedy parity 100 % on every run" "$TMP/log"
if command -v gnuplot >/dev/null 2>&1; then
    png() { head -c 8 "$1" | od -An -c | tr -d ' \n' | grep -q 'PNG'; }
    check "speed.png is a PNG" png "$TMP/out/speed.png"
    check "oracle.png is a PNG" png "$TMP/out/oracle.png"
fi
check "nothing half-written in the out folder" sh -c "! ls '$TMP/out' | grep -q tmp"

# --methods, --samples, --no-oracle
$BIN/bench --recipe "$TMP/r.yaml" $FILES --out "$TMP/out2" --methods prompt-lookup --samples 1 --no-oracle >/dev/null 2>&1
check "--methods: standard and the one asked" test "$(grep -c '^speed,' "$TMP/out2/table.csv")" = 2
check "--samples 1" grep -q "^speed,tinystories,prompt-lookup,[0-9.]*,,1," "$TMP/out2/table.csv"
check "--no-oracle" sh -c "! grep -q '^oracle,' '$TMP/out2/table.csv'"

# the Llama-3 path: random weights, the real tokenizer (128,256 tokens) and chat template
L3=$(data tokenizers/llama3/tokenizer.json.gz)
cat >"$TMP/cfg.json" <<EOF
{"architecture": "llama", "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
 "num_key_value_heads": 1, "head_dim": 8, "vocab_size": 128256, "max_position_embeddings": 256, "rms_norm_eps": 1e-5,
 "rope_theta": 500000.0, "tie_word_embeddings": true, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
 "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}
EOF
$BIN/randmodel --config "$TMP/cfg.json" --tokenizer "$L3" --chat-template "$(data tokenizers/llama3/tokenizer_config.json)" \
    --seed 2 -o "$TMP/l3.safetensors" 2>"$TMP/log"
check "randmodel writes a model" test -s "$TMP/l3.safetensors"
check "randmodel says the weights are random" grep -q "RANDOM weights" "$TMP/log"
check "the file says so too" grep -aq '"paradec.random_weights":"seed 2: random weights' "$TMP/l3.safetensors"
cat >"$TMP/l3.yaml" <<EOF
model:
  tokenizer: tokenizers/llama3/tokenizer.json.gz
  random: {config: {hidden_size: 16, intermediate_size: 32, num_hidden_layers: 2, num_attention_heads: 2,
           num_key_value_heads: 1, head_dim: 8, vocab_size: 128256, max_position_embeddings: 256,
           rms_norm_eps: 1.0e-5, rope_theta: 500000.0, tie_word_embeddings: true}}
answers: {datasets: [gsm8k], samples: 2, max_new: 6}
decoding: {methods: [prompt-lookup, lookahead]}
datasets:
  - {name: gsm8k, samples: 2, max_new: 8, chat: true}
EOF
$BIN/bench --recipe "$TMP/l3.yaml" --model "$TMP/l3.safetensors" --out "$TMP/out3" >/dev/null 2>"$TMP/log"
check "bench on the Llama-3 chat path" grep -q "^speed,gsm8k,lookahead,[0-9.]*,,2,.*,2,2,random-weights$" "$TMP/out3/table.csv"
check "its table says the figures mean nothing" grep -q "Random weights: every speed and acceptance figure below means nothing" \
    "$TMP/out3/table.md"
$BIN/recipe answers "$TMP/l3.yaml" -m "$TMP/l3.safetensors" -o "$TMP/answers.jsonl" 2>/dev/null
check "answers: 2 jsonl records, chat-formatted" test "$(grep -c '^{"text":"<|begin_of_text|><|start_header_id|>' "$TMP/answers.jsonl")" = 2
refuses "randmodel: a config without sizes" "$TMP/x.safetensors" $BIN/randmodel --config "$TMP/r.yaml" --tokenizer "$L3" -o "$TMP/x.safetensors"
echo '{"architecture": "llama", "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8, "vocab_size": 500, "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": true}' >"$TMP/cfg500.json"
refuses "randmodel: a tokenizer of another size" "$TMP/x.safetensors" \
    $BIN/randmodel --config "$TMP/cfg500.json" --tokenizer "$(data models/stories260K/tok512.bin)" -o "$TMP/x.safetensors"

# ---- bad input: one line, nothing written ----
sed 's/^exit_heads: {layers/exit_heads: {stepz: 3, layers/' "$TMP/r.yaml" >"$TMP/bad.yaml"
refuses "bench: unknown key" "$TMP/outbad" $BIN/bench --recipe "$TMP/bad.yaml" $FILES --out "$TMP/outbad"
check "the line names file, line and key" grep -q "^bench: $TMP/bad.yaml:3: key 'stepz': unknown key in exit_heads" "$TMP/stderr"
sed 's/samples: 2,/samples: two,/' "$TMP/r.yaml" >"$TMP/bad2.yaml"
refuses "bench: wrong type" "$TMP/outbad" $BIN/bench --recipe "$TMP/bad2.yaml" $FILES --out "$TMP/outbad"
check "wrong type: file:line:key" grep -q "bad2.yaml:13: key 'samples': 'two' is not a whole number" "$TMP/stderr"
sed 's/name: tinystories/name: squad/' "$TMP/r.yaml" >"$TMP/bad3.yaml"
refuses "bench: unknown dataset" "$TMP/outbad" $BIN/bench --recipe "$TMP/bad3.yaml" $FILES --out "$TMP/outbad"
sed "s|data: $TMP/small.txt, norm|data: $TMP/nope.txt, norm|" "$TMP/r.yaml" >"$TMP/bad4.yaml"
refuses "bench: missing data file" "$TMP/outbad" $BIN/bench --recipe "$TMP/bad4.yaml" $FILES --out "$TMP/outbad"
refuses "bench: missing recipe" "$TMP/outbad" $BIN/bench --recipe "$TMP/nope.yaml" --out "$TMP/outbad"
refuses "bench: the model not built" "$TMP/outbad" $BIN/bench --recipe "$TMP/r.yaml" --out "$TMP/outbad"
check "it says make builds it" grep -q "outbad/model.safetensors: not found (make recipe=r builds it, or give --model)" "$TMP/stderr"
refuses "bench: unknown method" "$TMP/outbad" $BIN/bench --recipe "$TMP/r.yaml" $FILES --out "$TMP/outbad" --methods warp
refuses "bench: a method without its heads" "$TMP/outbad" $BIN/bench --recipe "$TMP/l3.yaml" --model "$TMP/l3.safetensors" \
    --out "$TMP/outbad" --methods medusa
refuses "recipe rules: unknown key" "$TMP/bad.mk" $BIN/recipe rules "$TMP/bad.yaml" --stamps "$TMP/stamps" -o "$TMP/bad.mk"
check "recipe rules: no stamps either" test ! -e "$TMP/stamps"
sed 's/^exit_heads: {/exit_heads: {check_vocab: 32, /' "$TMP/r.yaml" >"$TMP/cv.yaml"
$BIN/recipe rules "$TMP/cv.yaml" --stamps "$TMP/cvstamps" -o "$TMP/cv.mk" 2>/dev/null
check "recipe rules: exit_heads.check_vocab becomes distill-heads --check-vocab" \
    sh -c "grep -q 'distill-heads .*--check-vocab 32' '$TMP/cv.mk' && grep -q 'distill-heads' '$TMP/cv.mk'"
sed 's/^eagle: {/eagle: {unroll: 3, /' "$TMP/r.yaml" >"$TMP/un.yaml"
$BIN/recipe rules "$TMP/un.yaml" --stamps "$TMP/unstamps" -o "$TMP/un.mk" 2>/dev/null
check "recipe rules: eagle.unroll becomes train-medusa --unroll" \
    grep -q 'train-medusa .*--eagle.*--unroll 3' "$TMP/un.mk"
# make -j starts a target's prerequisites left to right: the EAGLE head (the longest stage)
# before the exit and Medusa heads; the bundle keeps its heads in the order pack was given
check "recipe rules: the EAGLE head is the bench's first head prerequisite" \
    grep -q 'table.md: [^ ]* [^ ]*/model.safetensors [^ ]*/eagle-head.safetensors.zst [^ ]*/exit-heads[^ ]* [^ ]*/medusa-heads' "$TMP/un.mk"
check "recipe rules: pack is given the heads as before" \
    grep -q 'pack -m [^ ]*/model.safetensors [^ ]*/exit-heads[^ ]* [^ ]*/medusa-heads[^ ]* [^ ]*/eagle-head' "$TMP/un.mk"
sed 's/^eagle: {/eagle: {unroll: 3, unroll_from: 200, steps: 300, /' "$TMP/r.yaml" >"$TMP/uf.yaml"
$BIN/recipe rules "$TMP/uf.yaml" --stamps "$TMP/ufstamps" -o "$TMP/uf.mk" 2>/dev/null
check "recipe rules: eagle.unroll_from becomes train-medusa --unroll-from" \
    grep -q 'train-medusa .*--eagle.*--unroll 3 --unroll-from 200' "$TMP/uf.mk"
sed 's/^eagle: {/eagle: {unroll_from: 200, /' "$TMP/r.yaml" >"$TMP/uf1.yaml"
refuses "recipe rules: unroll_from without unroll" "$TMP/uf1.mk" \
    $BIN/recipe rules "$TMP/uf1.yaml" --stamps "$TMP/uf1stamps" -o "$TMP/uf1.mk"
sed 's/^eagle: {/eagle: {unroll: 2, unroll_from: 300, steps: 300, /' "$TMP/r.yaml" >"$TMP/uf2.yaml"
refuses "recipe rules: unroll_from at the last step" "$TMP/uf2.mk" \
    $BIN/recipe rules "$TMP/uf2.yaml" --stamps "$TMP/uf2stamps" -o "$TMP/uf2.mk"
sed 's/^eagle: {/eagle: {unroll: 9, /' "$TMP/r.yaml" >"$TMP/un9.yaml"
refuses "recipe rules: unroll past 8" "$TMP/un9.mk" \
    $BIN/recipe rules "$TMP/un9.yaml" --stamps "$TMP/un9stamps" -o "$TMP/un9.mk"
refuses "recipe: unknown command" "" $BIN/recipe cook "$TMP/r.yaml"
for r in recipes/*.yaml; do
    case $r in
    */llama3-8b.yaml | */codellama-34b.yaml)
        refuses "$r without PARADEC_CKPT" "" env -u PARADEC_CKPT $BIN/recipe check "$r"
        check "$r: the message names PARADEC_CKPT" grep -q "key 'source': \$PARADEC_CKPT is not set" "$TMP/stderr"
        refuses "$r with a wrong PARADEC_CKPT" "" env PARADEC_CKPT=/nonexistent/ckpt $BIN/recipe check "$r"
        check "$r: the message names the path" grep -q "'/nonexistent/ckpt' does not exist" "$TMP/stderr"
        ;;
    */smollm2-135m.yaml) # needs `make models`; offline it must say so in one line
        $BIN/recipe check "$r" >/dev/null 2>"$TMP/stderr" || check "$r: a missing GGUF is named" grep -q "make models" "$TMP/stderr" ;;
    *) check "$r parses" sh -c "$BIN/recipe check '$r' >/dev/null" ;;
    esac
done

# make recipe=FILE: a bad recipe, and a stage that fails, leave nothing in the out folder
SAN_FLAG=; [ "$BUILD" = build-san ] && SAN_FLAG=SAN=1
if command -v make >/dev/null 2>&1; then
    make -s $SAN_FLAG recipe="$TMP/bad.yaml" RECIPE_OUT="$TMP/mk" >/dev/null 2>"$TMP/log"
    check "make recipe=bad fails" test $? != 0
    check "make recipe=bad: the one-line reason" grep -q "^recipe: $TMP/bad.yaml:3: key 'stepz'" "$TMP/log"
    check "make recipe=bad: nothing in out/" test ! -e "$TMP/mk"
    sed "s|source: models/stories260K/stories260K.bin|source: $TMP/small.txt|" "$TMP/r.yaml" >"$TMP/notmodel.yaml"
    make -s $SAN_FLAG recipe="$TMP/notmodel.yaml" RECIPE_OUT="$TMP/mk" >/dev/null 2>"$TMP/log"
    check "make recipe=notmodel fails at convert" test $? != 0
    check "make recipe=notmodel: nothing in out/" test ! -e "$TMP/mk/notmodel"
fi
finish bench_tool
