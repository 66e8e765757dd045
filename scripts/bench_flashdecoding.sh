#!/bin/sh
# bench_flashdecoding.sh — FlashDecoding's split attention against the unsplit kernel on
# SmolLM2-135M (context 8192): one decode step (verifycost's 1-node tree, the median of
# 10) after 1k, 4k and 8k positions, on 1 and 2 threads. Attention's part is the step at
# P positions less the step at 64 (where attention is a few keys). The unsplit build is
# this tree compiled with -DATT_SPLIT=65536 into build-unsplit/; runs alternate between
# the builds. Then the attention kernel alone (scripts/bench_attention.c, both builds,
# two alternating runs each): milliseconds per layer. A benchmark, never a test:
# nothing else may run meanwhile.
#   M=model (default: build/smollm2-bf16.safetensors, made from `make models`' GGUF)
set -eu
: "${BUILD:=build}" "${M:=$BUILD/smollm2-bf16.safetensors}" "${CTXS:=1024 4096 8000}" "${THREADS:=1 2}"
G=$HOME/.cache/paradec/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$M" ] || bin/convert "$G" --dtype bf16 -o "$M"
CFLAGS=-DATT_SPLIT=65536 make -s BUILD=build-unsplit BIN=build-unsplit/bin build-unsplit/bin/verifycost
step() { # BIN CTX THREADS: seconds of one step
    "$1/verifycost" -m "$M" --sizes 1 --ctx "$2" --reps 10 -t "$3" 2>/dev/null | sed -E 's/.*"seconds":([0-9.e+-]+).*/\1/'
}
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores;" \
    "read bandwidth (bin/membw) $(bin/membw 2>/dev/null | tail -n 1) GB/s on 1 thread, $(bin/membw -t 2 2>/dev/null | tail -n 1) on 2"
echo "| positions | threads | step unsplit (ms) | step split (ms) | attention unsplit (ms) | attention split (ms) | tok/s unsplit | tok/s split | split/unsplit tok/s |"
echo "|---|---|---|---|---|---|---|---|---|"
for t in $THREADS; do
    b0=$(step build-unsplit/bin 64 "$t") b1=$(step bin 64 "$t")
    for c in $CTXS; do
        u=$(step build-unsplit/bin "$c" "$t") s=$(step bin "$c" "$t")
        echo "$c $t $u $s $b0 $b1" | awk '{ printf "| %d | %d | %.2f | %.2f | %.2f | %.2f | %.1f | %.1f | %.2f |\n",
            $1, $2, $3 * 1e3, $4 * 1e3, ($3 - $5) * 1e3, ($4 - $6) * 1e3, 1 / $3, 1 / $4, $3 / $4 }'
    done
done

F="-std=c11 -O2 -march=native -ffp-contract=off -pthread -D_GNU_SOURCE -Ilibcore -Ikernels"
cc $F scripts/bench_attention.c "$BUILD/libcore.a" -o "$BUILD/bench_attention" -lm -lstdc++ -lpthread
cc $F -DATT_SPLIT=65536 scripts/bench_attention.c kernels/cpu/attention.c "$BUILD/libcore.a" \
    -o build-unsplit/bench_attention -lm -lstdc++ -lpthread
echo
echo "| positions | threads | attention/layer unsplit (ms) | split (ms) | unsplit (2nd run) | split (2nd run) |"
echo "|---|---|---|---|---|---|"
for t in $THREADS; do
    for c in $CTXS; do
        echo "| $c | $t | $(build-unsplit/bench_attention $c $t 30) | $("$BUILD/bench_attention" $c $t 30) |" \
            "$(build-unsplit/bench_attention $c $t 30) | $("$BUILD/bench_attention" $c $t 30) |"
    done
done
