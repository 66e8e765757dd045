#!/bin/sh
# tests/gpu/run.sh — the GPU run, on a machine with an NVIDIA GPU, in one command of at
# most 8 minutes: what is present, the cuda device against the CPU bit for bit, every
# method's output on the GPU equal to the CPU's, then the figures docs/benchmarks.md takes
# (the widened stories260K at the 8b shape, bf16, made there by widen; --graphs and
# --fast-prefill against the plain passes).
# That machine reaches no registry: build here and carry the pack,
#   make gpu-pack            # build-gpu/: the CUDA build's tools, test_device, the models
# then there: sh tests/gpu/run.sh (the checks' failures are its exit status; FIGURES lines
# are the measurements, each with the command that made it; GPU_CHECKS_ONLY=1: no figures).
. tests/lib.sh
P=${GPU_PACK:-build-gpu}
BIN=$P/bin BUILD=$P MODEL=$P/stories260K.safetensors.zst
# the pack's libraries (those the Debian build machine had and this one may lack), cuBLAS
LD_LIBRARY_PATH=$P/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export LD_LIBRARY_PATH
export BIN BUILD MODEL TEST_HEADS=$P/test-heads.safetensors.zst TEST_MEDUSA=$P/test-medusa.safetensors.zst \
    TEST_EAGLE=$P/test-eagle.safetensors.zst TEST_DRAFT=$P/draft.safetensors
W=${GPU_TMP:-/tmp}/paradec-8b.safetensors
fig() { echo "FIGURES $*"; }

# ---- present ----
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >"$TMP/gpus" 2>&1; then
    echo "SKIP gpu: no NVIDIA GPU here (nvidia-smi: $(head -n 1 "$TMP/gpus" 2>/dev/null))"
    finish gpu
    exit 0
fi
fig "gpu: $(head -n 1 "$TMP/gpus")"
missing=""
for f in $BIN/decode $BIN/verifycost $BIN/widen $BIN/membw $BIN/distill-heads $BIN/train-medusa $P/tests/test_device \
    "$MODEL" "$TEST_HEADS" "$TEST_MEDUSA" "$TEST_EAGLE" "$TEST_DRAFT" $P/data/datasets/tinystories/tinystories_val_sample.txt.gz; do
    [ -e "$f" ] || missing="$missing $f"
done
[ -z "$missing" ] || { bad "missing (make gpu-pack, then carry $P):$missing"; finish gpu; exit 1; }
libs=$(ldd $BIN/decode 2>&1 | grep "not found" | awk '{print $1}' | tr '\n' ' ')
[ -z "$libs" ] || { bad "libraries missing here: $libs"; finish gpu; exit 1; }
$BIN/decode --version | grep -q "^backends: .*cuda" || bad "the pack's decode has no cuda backend"

# ---- the device and every method, against the CPU ----
$P/tests/test_device >"$TMP/dev" 2>&1
check "test_device on $(head -n 1 "$TMP/gpus" | cut -c1-40): $(tail -n 1 "$TMP/dev")" \
    sh -c "! grep -q SKIP '$TMP/dev' && grep -q '^device: [0-9]* passed, 0 failed' '$TMP/dev'"
grep "^FAIL" "$TMP/dev" | head -n 10
PARADEC_DATA=$P/data PD_TEST_DEVICE=cuda sh tests/test_device_cuemu.sh >"$TMP/methods" 2>&1
check "every method on cuda as on cpu: $(tail -n 1 "$TMP/methods")" \
    grep -q "^device_cuda: [0-9]* passed, 0 failed" "$TMP/methods"
grep -E "^(FAIL|SKIP)" "$TMP/methods" | head -n 20

[ -n "${GPU_CHECKS_ONLY:-}" ] && { finish gpu; exit; }

# ---- figures: the 8b shape, bf16 ----
t=$(date +%s)
timeout 150 $BIN/widen -m "$MODEL" --preset 8b --dtype bf16 -o "$W" --heads "$TEST_HEADS" \
    --heads-out "$W.exit.safetensors" 2>"$TMP/widen" &&
    timeout 90 $BIN/widen -m "$MODEL" --preset 8b --dtype bf16 --heads "$TEST_MEDUSA" \
        --heads-out "$W.medusa.safetensors" -o - 2>>"$TMP/widen" >/dev/null
[ -s "$W" ] || { bad "widen --preset 8b: $(tail -n 1 "$TMP/widen")"; finish gpu; exit 1; }
fig "widen 8b bf16: $(($(date +%s) - t)) s, $(du -h "$W" | cut -f1)"
bw=$($BIN/membw -d cuda --mib 4096 2>/dev/null)
fig "device-to-device copy (read + written): $bw GB/s   [$BIN/membw -d cuda --mib 4096]"
# tok/s at batch 1, greedy, 64 tokens; the weights each step reads ≈ the file's size
bytes=$(stat -c %s "$W")
run() { # run LABEL ARGS...: decode's own timing line
    label=$1; shift
    timeout 90 $BIN/decode -m "$W" --no-verify -d cuda -p "Once upon a time" -n 64 --temp 0 "$@" >/dev/null 2>"$TMP/run"
    tps=$(sed -n 's/.*decode [0-9.]* ms (\([0-9.]*\) tok\/s).*/\1/p' "$TMP/run" | tail -n 1)
    echo "$tps" >"$TMP/tps.$label"
    fig "$label: ${tps:-failed ($(tail -n 1 "$TMP/run"))} tok/s   [decode -m 8b-bf16 -d cuda -n 64 --temp 0 $*]"
}
run standard
run standard-graphs --graphs
std=$(cat "$TMP/tps.standard")
[ -n "$std" ] && [ -n "$bw" ] &&
    fig "exact mode: $(echo "$std $bytes $bw" | awk '{printf "%.1f", 100 * $1 * $2 / 1e9 / ($3 / 2)}') % of the HBM roofline (copy bandwidth / 2 = read bandwidth; target >= 85 %)"
timeout 120 $BIN/verifycost -m "$W" --no-verify -d cuda --sizes 1,2,4,8,16,32,64 --reps 5 >"$TMP/vc" 2>&1
fig "verification cost n = 1..64 (ratio to n = 1; target n = 8 <= 1.15): $(sed -n 's/.*"n":\([0-9]*\).*"ratio":\([0-9.]*\).*/\1:\2/p' "$TMP/vc" | tr '\n' ' ')"
run speculative-oracle-0.8 --method speculative --draft "$MODEL" --oracle-acceptance 0.8
run medusa-oracle-0.8 --method medusa --heads "$W.medusa.safetensors" --oracle-acceptance 0.8
run adadecode-oracle-0.8 --method adadecode --heads "$W.exit.safetensors" --oracle-exit 0.8
# AdaDecode's default on a GPU is two streams (deferred layers overlapping); one stream batches them
run adadecode-oracle-0.8-one-stream --method adadecode --heads "$W.exit.safetensors" --oracle-exit 0.8 --streams 1
run medusa-widened-heads --method medusa --heads "$W.medusa.safetensors"
run adadecode-widened-heads --method adadecode --heads "$W.exit.safetensors"
for m in standard-graphs speculative-oracle-0.8 medusa-oracle-0.8 adadecode-oracle-0.8 adadecode-oracle-0.8-one-stream \
    medusa-widened-heads adadecode-widened-heads; do
    v=$(cat "$TMP/tps.$m")
    [ -n "$v" ] && [ -n "$std" ] && fig "speedup $m: $(echo "$v $std" | awk '{printf "%.2f", $1 / $2}')x over standard"
done
# prefill of a long prompt: exact mode against --fast-prefill (cuBLAS; not exact mode's bits)
LONG=$(for i in $(seq 1 120); do printf "Once upon a time, there was a little dog. "; done)
for mode in exact fast; do
    f=""
    [ $mode = fast ] && f=--fast-prefill
    timeout 90 $BIN/decode -m "$W" --no-verify -d cuda -p "$LONG" -n 16 --temp 0 $f >"$TMP/p.$mode" 2>"$TMP/run"
    fig "prefill $mode: $(sed -n 's/.*prefill \([0-9.]* ms ([0-9.]* tok\/s)\).*/\1/p' "$TMP/run" | tail -n 1)   [decode -m 8b-bf16 -d cuda -p <1441 tokens> -n 16 --temp 0 $f]"
done
cmp -s "$TMP/p.exact" "$TMP/p.fast" && fig "fast prefill: the same 16 tokens as exact mode" ||
    fig "fast prefill: other tokens than exact mode (allowed: not exact mode's bits)"
rm -f "$W" "$W".*.safetensors
finish gpu
