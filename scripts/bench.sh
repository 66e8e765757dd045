#!/bin/sh
# bench.sh — `make bench`: tok/s of standard greedy decoding, and the fraction of the
# memory-bandwidth roofline it reaches (weight bytes a token reads × tok/s ÷ the read
# bandwidth bin/membw measures in this same run). A benchmark, never a test.
#   stories260K: 256 tokens, 1 and 2 threads
#   stories260K widened (bin/widen) to 110m and 1b, stored f32 and bf16
# Peers, when given (never built or committed here): RUNC=path/to/llama2.c/run,
# LLAMA_BENCH=path/to/llama-bench with LLAMA_CONVERT=path/to/llama-convert-llama2c-to-ggml.
set -eu
: "${BIN:=bin}" "${BUILD:=build}" "${MODEL:=build/stories260K.safetensors.zst}"
: "${BENCH_DIR:=$BUILD/bench}" "${REPS:=3}" "${N:=256}" "${N_BIG:=64}" "${THREADS:=1 2}"
mkdir -p "$BENCH_DIR"
S=$(for r in "${PARADEC_DATA:-}" data ../shared/data; do [ -n "$r" ] && [ -d "$r/models/stories260K" ] && echo "$r/models/stories260K" && break; done)

field() { sed -E "s/.*\"$1\":([-0-9.e+]+).*/\1/"; }
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

# decode MODEL THREADS TOKENS → "tok/s weight_bytes" (median of REPS runs)
run_decode() {
    for i in $(seq "$REPS"); do
        $BIN/decode -m "$1" -p "Once upon a time" -n "$3" --temp 0 -t "$2" --json 2>/dev/null
    done >"$BENCH_DIR/last.json"
    tps=$(field tok_per_s <"$BENCH_DIR/last.json" | median)
    wb=$(head -n 1 "$BENCH_DIR/last.json" | field weight_bytes_per_token)
    echo "$tps $wb"
}

for p in 110m 1b; do
    for dt in f32 bf16; do
        f=$BENCH_DIR/$p-$dt.safetensors
        [ -f "$f" ] || $BIN/widen -m "$MODEL" --preset "$p" --dtype "$dt" -o "$f" ${RUNC:+--llama2c "$BENCH_DIR/$p-$dt.bin"}
    done
done

echo "| model | weights | threads | tok/s | read GB/s (membw, same run) | weight GB/s reached | roofline |"
echo "|---|---|---|---|---|---|---|"
for t in $THREADS; do
    bw=$($BIN/membw -t "$t" 2>/dev/null)
    for m in "stories260K:f32:$MODEL" "110m:f32:$BENCH_DIR/110m-f32.safetensors" "110m:bf16:$BENCH_DIR/110m-bf16.safetensors" \
             "1b:f32:$BENCH_DIR/1b-f32.safetensors" "1b:bf16:$BENCH_DIR/1b-bf16.safetensors"; do
        name=${m%%:*} rest=${m#*:} dt=${rest%%:*} file=${rest#*:}
        n=$N; [ "$name" = stories260K ] || n=$N_BIG  # big models: attention is negligible, tok/s flat
        set -- $(run_decode "$file" "$t" "$n")
        awk -v n="$name" -v d="$dt" -v t="$t" -v tps="$1" -v wb="$2" -v bw="$bw" 'BEGIN {
            got = tps * wb / 1e9; roof = n == "stories260K" ? "(in cache)" : sprintf("%.0f %%", 100 * got / bw)
            printf "| %s | %s | %d | %.1f | %.1f | %.1f | %s |\n", n, d, t, tps, bw, got, roof }'
    done
done

if [ -n "${RUNC:-}" ]; then
    echo
    echo "| peer | model | tok/s (median of $REPS) |"
    echo "|---|---|---|"
    for m in "stories260K:$S/stories260K.bin" "110m:$BENCH_DIR/110m-f32.bin"; do
        name=${m%%:*} file=${m#*:}
        tps=$(for i in $(seq "$REPS"); do "$RUNC" "$file" -z "$S/tok512.bin" -t 0.0 -n "$N" -i "Once upon a time" 2>&1 |
              sed -nE 's/.*achieved tok\/s: ([0-9.]+).*/\1/p'; done | median)
        echo "| llama2.c run.c | $name | $tps |"
    done
fi
if [ -n "${LLAMA_BENCH:-}" ] && [ -n "${LLAMA_CONVERT:-}" ]; then
    for m in "stories260K:$S/stories260K.bin" "110m:$BENCH_DIR/110m-f32.bin"; do
        name=${m%%:*} file=${m#*:} g=$BENCH_DIR/$name.gguf
        [ -f "$g" ] || "$LLAMA_CONVERT" --copy-vocab-from-model "$S/tok512.bin" --llama2c-model "$file" --llama2c-output-model "$g" >/dev/null 2>&1
        for t in $THREADS; do
            tps=$("$LLAMA_BENCH" -m "$g" -p 0 -n "$N" -t "$t" -r "$REPS" 2>/dev/null | sed -nE "s/.*tg$N *\| *([0-9.]+).*/\1/p")
            echo "| llama.cpp llama-bench (t=$t) | $name | $tps |"
        done
    done
fi
