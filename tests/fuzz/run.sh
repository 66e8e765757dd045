#!/bin/sh
# run.sh — runs the libFuzzer targets one after another (make fuzz-run SECONDS=N or
# RUNS=N), each from its seeds in tests/fuzz/corpus/NAME/; what it finds new goes to
# build-fuzz/corpus/NAME/ (the seeds stay as they are), a crash, leak or hang to
# build-fuzz/crash-NAME-*. One line per target: executions, seconds, result.
# usage: tests/fuzz/run.sh [SECONDS] [RUNS] [TARGET...]   (0 = no limit of that kind)
set -u
secs=${1:-60} runs=${2:-0}
shift 2 2>/dev/null || shift $#
D=${FUZZ_DIR:-build-fuzz}
[ $# -gt 0 ] || set -- $(cd "$D" && ls fuzz_* | sed 's/^fuzz_//')
# serve_generate runs a model: a one-layer random one is quick under the fuzz build's
# coverage counters (stories260K takes seconds an input there)
if [ -z "${PARADEC_FUZZ_MODEL:-}" ] && echo " $* " | grep -q ' serve_generate '; then
    for d in "${PARADEC_DATA:-}" data ../shared/data; do
        [ -n "$d" ] && [ -f "$d/models/stories260K/tok512.bin" ] && tok="$d/models/stories260K/tok512.bin" && break
    done
    printf '{"architecture": "llama", "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8, "vocab_size": 512, "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000, "tie_word_embeddings": true}' >"$D/tiny-model.json"
    if [ -n "${tok:-}" ] && "${BIN:-bin}/randmodel" --config "$D/tiny-model.json" --tokenizer "$tok" -o "$D/tiny-model.safetensors" 2>/dev/null; then
        export PARADEC_FUZZ_MODEL="$D/tiny-model.safetensors"
    else
        echo "serve_generate: no tiny model (bin/randmodel, tok512.bin): it runs on \$MODEL or stories260K, slowly"
    fi
fi
status=0
for t in "$@"; do
    mkdir -p "$D/corpus/$t"
    log="$D/fuzz-$t.log"
    # one worker, bounded memory, a hang is anything over 10 s per input
    "$D/fuzz_$t" -max_total_time="$secs" -runs="$( [ "$runs" = 0 ] && echo -1 || echo "$runs")" \
        -rss_limit_mb=2048 -malloc_limit_mb=2048 -timeout=10 -print_final_stats=1 \
        -artifact_prefix="$D/crash-$t-" "$D/corpus/$t" "tests/fuzz/corpus/$t" >"$log" 2>&1
    rc=$?
    n=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    s=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log")
    if [ "$rc" = 0 ]; then
        echo "$t: ${n:-?} executions in ${s:-?} s, no crash, leak or hang"
    else
        echo "$t: FAILED after ${n:-?} executions (exit $rc): see $log and $D/crash-$t-*"
        grep -E 'ERROR|SUMMARY|Test unit written' "$log" | head -n 5
        status=1
    fi
done
exit $status
