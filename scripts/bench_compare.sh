#!/bin/sh
# bench_compare.sh OLD_BIN NEW_BIN — two builds of paradec side by side, runs interleaved
# (old, new, old, new, ...) so that the machine's drift falls on both alike: greedy
# tok/s of standard decoding on stories260K and on the widened 110m, and of Medusa on the
# widened 110m (heads widened with the model); medians and new/old. It also checks that
# both builds write the same greedy text (stories260K on 20 TinyStories openings, the
# 110m, SmolLM2 when `make models` fetched it). A benchmark, never a test.
#   W=widened-110m.safetensors MEDUSA_W=its-medusa-heads (made when missing)
set -eu
OLD=$1 NEW=$2
: "${BUILD:=build}" "${MODEL:=$BUILD/stories260K.safetensors.zst}" "${REPS:=7}" "${DIR:=$BUILD/bench}"
: "${W:=$DIR/110m-f32.safetensors}" "${MEDUSA_W:=$DIR/medusa-110m-test.safetensors.zst}"
mkdir -p "$DIR"
[ -f "$W" ] && [ -f "$MEDUSA_W" ] || "$NEW/widen" -m "$MODEL" --preset 110m -o "$W" \
    --heads "$BUILD/test-medusa.safetensors.zst" --heads-out "$MEDUSA_W"

tps() { sed -E 's/.*"tok_per_s":([-0-9.e+]+).*/\1/'; }
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
# case NAME MODEL TOKENS ARGS...: REPS interleaved runs of each build
run_case() {
    name=$1 m=$2 n=$3; shift 3
    : >"$DIR/old.tps"; : >"$DIR/new.tps"
    for i in $(seq "$REPS"); do
        "$OLD/decode" -m "$m" -p "Once upon a time" -n "$n" --temp 0 -t 1 --json "$@" 2>/dev/null | tps >>"$DIR/old.tps"
        "$NEW/decode" -m "$m" -p "Once upon a time" -n "$n" --temp 0 -t 1 --json "$@" 2>/dev/null | tps >>"$DIR/new.tps"
    done
    o=$(median <"$DIR/old.tps") w=$(median <"$DIR/new.tps")
    printf '| %s | %s | %s | %.3f |\n' "$name" "$o" "$w" "$(echo "$w / $o" | bc -l)"
}

echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores;" \
    "read bandwidth $("$NEW/membw" 2>/dev/null | tail -n 1) GB/s (bin/membw, 1 thread)"
echo "old: $("$OLD/decode" --version | head -n 1); $("$OLD/decode" --version | sed -n 's/^cpu features: //p')"
echo "new: $("$NEW/decode" --version | head -n 1); $("$NEW/decode" --version | sed -n 's/^cpu features: //p')"
echo
echo "| greedy, 1 thread, median of $REPS | old tok/s | new tok/s | new/old |"
echo "| --- | --- | --- | --- |"
run_case "stories260K, standard, 256 tokens" "$MODEL" 256
run_case "110m (f32), standard, 64 tokens" "$W" 64
run_case "110m (f32), Medusa, 64 tokens" "$W" 64 --method medusa --heads "$MEDUSA_W"

same=0 total=0
S=$(for r in "${PARADEC_DATA:-}" data ../shared/data; do [ -n "$r" ] && [ -d "$r/datasets/tinystories" ] && echo "$r" && break; done)
if [ -n "$S" ]; then
    gzip -dc "$S"/datasets/tinystories/*.gz | awk 'NF { print $1, $2, $3, $4 }' | head -n 20 >"$DIR/prompts.txt"
    while read -r p; do
        total=$((total + 1))
        a=$("$OLD/decode" -m "$MODEL" -p "$p" -n 128 --temp 0 2>/dev/null | md5sum)
        b=$("$NEW/decode" -m "$MODEL" -p "$p" -n 128 --temp 0 2>/dev/null | md5sum)
        [ "$a" = "$b" ] && same=$((same + 1))
    done <"$DIR/prompts.txt"
fi
a=$("$OLD/decode" -m "$W" -p "Once upon a time" -n 64 --temp 0 2>/dev/null | md5sum)
b=$("$NEW/decode" -m "$W" -p "Once upon a time" -n 64 --temp 0 2>/dev/null | md5sum)
total=$((total + 1)); [ "$a" = "$b" ] && same=$((same + 1))
G=${PARADEC_CACHE:-$HOME/.cache/paradec}/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
if [ -f "$G" ]; then
    [ -f "$DIR/smollm2.safetensors" ] || "$NEW/convert" "$G" -o "$DIR/smollm2.safetensors" 2>/dev/null
    for p in "The capital of France is" "Write a haiku about the sea." "def fib(n):"; do
        a=$("$OLD/decode" -m "$DIR/smollm2.safetensors" -p "$p" -n 48 --temp 0 2>/dev/null | md5sum)
        b=$("$NEW/decode" -m "$DIR/smollm2.safetensors" -p "$p" -n 48 --temp 0 2>/dev/null | md5sum)
        total=$((total + 1)); [ "$a" = "$b" ] && same=$((same + 1))
    done
fi
echo
echo "greedy text byte-identical between the builds: $same of $total (stories260K 20 openings × 128 tokens," \
    "110m 64 tokens, SmolLM2 3 prompts × 48 tokens where present)"
