#!/bin/sh
# bench_drafters.sh — the second half of `make bench`: the drafters (Medusa, speculative,
# prompt lookup, lookahead) against standard decoding in the same run, 1 thread, greedy
# and temperature 1, on stories260K (100 TinyStories openings) and on the widened 110m
# model (30 openings), then the oracle curves on 110m (scripts/bench_drafters.py prints
# the tables; docs/benchmarks.md keeps the figures). Heads and draft models it needs are
# built first when missing (about 3 minutes of training: docs/medusa.md,
# docs/speculative.md). A benchmark, never a test.
set -eu
: "${BIN:=bin}" "${BUILD:=build}" "${MODEL:=build/stories260K.safetensors.zst}" "${BENCH_DIR:=$BUILD/bench}"
: "${TOKENS:=128}" "${REPS_SMALL:=3}" "${REPS_BIG:=1}"
D=$(for r in "${PARADEC_DATA:-}" data ../shared/data; do [ -n "$r" ] && [ -d "$r/datasets/tinystories" ] && echo "$r" && break; done)
STORIES=$D/datasets/tinystories/tinystories_val_sample.txt.gz
W=$BENCH_DIR/110m-f32.safetensors
NORM_HEADS=$BENCH_DIR/heads-260k-norm.safetensors.zst
MEDUSA=$BENCH_DIR/medusa-stories260K.safetensors.zst MEDUSA_W=$BENCH_DIR/medusa-110m.safetensors.zst
mkdir -p "$BENCH_DIR"

[ -f "$W" ] || $BIN/widen -m "$MODEL" --preset 110m -o "$W"
[ -f "$NORM_HEADS" ] || $BIN/distill-heads -m "$MODEL" --norm 1 --layers 1,2,3,4 --data "$STORIES" -o "$NORM_HEADS"
for l in 3 4; do
    f=$BENCH_DIR/draft-260k-L$l.safetensors
    [ -f "$f" ] || $BIN/convert "$MODEL" --layers $l --heads "$NORM_HEADS" -o "$f"
done
if [ ! -f "$MEDUSA" ]; then # trained without the paragraphs the prompts come from
    gzip -dc "$STORIES" | awk 'BEGIN { RS = ""; ORS = "\n\n" } NR > 102' |
        $BIN/train-medusa -m "$MODEL" --data - --heads 5 --own-lm-head --generate 8 --seq-len 136 --steps 6000 -o "$MEDUSA"
fi
[ -f "$MEDUSA_W" ] || $BIN/widen -m "$MODEL" --preset 110m -o "$BENCH_DIR/widen-tmp.safetensors" \
    --heads "$MEDUSA" --heads-out "$MEDUSA_W"
rm -f "$BENCH_DIR/widen-tmp.safetensors"

bench() { python3 scripts/bench_drafters.py --bin "$BIN" --tokens "$TOKENS" "$@"; }
L3=$BENCH_DIR/draft-260k-L3.safetensors L4=$BENCH_DIR/draft-260k-L4.safetensors
# fixed Medusa trees of 4 to 64 nodes (the engine's efficiency at each size): one
# quoted --config argument each, passed through "$@"
fixed_trees() {
    heads=$1
    shift
    for n in 4 8 16 32 64; do
        set -- "$@" --config "medusa, $n-node tree: --method medusa --heads $heads --fixed-tree --draft-max $((n - 1))"
    done
    bench "$@"
}

echo "## stories260K"
fixed_trees "$MEDUSA" --model "$MODEL" --label stories260K --prompts 100 --reps "$REPS_SMALL" \
    --config "medusa (size controller): --method medusa --heads $MEDUSA" \
    --config "speculative, 3-layer draft: --method speculative --draft $L3" \
    --config "prompt-lookup: --method prompt-lookup" \
    --config "lookahead: --method lookahead"
echo
echo "## 110m (stories260K widened)"
fixed_trees "$MEDUSA_W" --model "$W" --label 110m --prompts 30 --reps "$REPS_BIG" \
    --config "medusa (size controller): --method medusa --heads $MEDUSA_W" \
    --config "speculative, 3-layer draft: --method speculative --draft $L3" \
    --config "speculative, 4-layer draft: --method speculative --draft $L4" \
    --config "prompt-lookup: --method prompt-lookup" \
    --config "lookahead: --method lookahead"
echo
echo "## oracles (110m, greedy)"
bench --model "$W" --label 110m --prompts 10 --reps "$REPS_BIG" \
    --oracle "speculative k=4: --method speculative --draft $L3 --draft-fixed --draft-max 4 --draft-min 4 --fixed-tree" \
    --rates 0,0.2,0.4,0.6,0.8,0.9,1
bench --model "$W" --label 110m --prompts 10 --reps "$REPS_BIG" \
    --oracle "medusa, 5-node tree: --method medusa --heads $MEDUSA_W --fixed-tree --draft-max 4" \
    --rates 0.6,0.7,0.75,0.8,0.9,1
