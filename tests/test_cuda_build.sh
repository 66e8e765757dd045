#!/bin/sh
# test_cuda_build — every kernels/cuda/*.cu compiles with nvcc for sm_90a and sm_80 (one
# call per file, both targets) with -fmad=false, so that no a*b+c is fused behind the
# kernels' backs, and warnings as errors. Then the CUDA build (make CUDA=1: the "cuda"
# device linked in) names cuda among its backends, runs test_device (the cuda device
# too where there is a GPU), and where there is none refuses --device cuda in one line.
# Without nvcc (on PATH, or in /usr/local/cuda) one SKIP line. `make nvcc-check` runs
# the compile checks alone (NVCC_ONLY=1).
. tests/lib.sh
NVCC=${NVCC:-$(command -v nvcc || true)}
[ -z "$NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ] && NVCC=/usr/local/cuda/bin/nvcc
if [ -z "$NVCC" ]; then
    echo "SKIP test_cuda_build: no nvcc on PATH or in /usr/local/cuda/bin: the .cu files were not compiled for the GPU"
    finish cuda_build
    exit 0
fi
for f in kernels/cuda/*.cu; do
    if "$NVCC" -fmad=false -Ikernels -Werror all-warnings -gencode arch=compute_90a,code=sm_90a \
        -gencode arch=compute_80,code=sm_80 -c "$f" -o "$TMP/$(basename "$f" .cu).o" 2>"$TMP/err"; then
        ok
    else
        bad "nvcc $f:"; head -n 20 "$TMP/err"
    fi
done
[ -n "${NVCC_ONLY:-}${PARADEC_SAN:-}" ] && { finish cuda_build; exit 0; } # the san run: the same build again

CB=build-cuda
if make -s -j2 CUDA=1 NVCC="$NVCC" $CB/bin/decode $CB/bin/verifycost $CB/tests/test_device >"$TMP/make" 2>&1; then
    ok
else
    bad "make CUDA=1:"; tail -n 20 "$TMP/make"
    finish cuda_build
    exit 0
fi
check "--version lists cuda" sh -c "$CB/bin/decode --version | grep -q '^backends: cpu cuemu cuda\$'"
$CB/tests/test_device >"$TMP/dev" 2>&1
check "test_device in the CUDA build: $(tail -n 1 "$TMP/dev")" grep -q "^device: [0-9]* passed, 0 failed" "$TMP/dev"
if grep -q "^SKIP device cuda" "$TMP/dev"; then # no GPU here: refused, one line, at once
    grep "^SKIP" "$TMP/dev"
    check "the refusal names the missing GPU" grep -q "no CUDA GPU" "$TMP/dev"
    refuses "decode --device cuda without a GPU" "" $CB/bin/decode -m "$MODEL" --device cuda -p Once -n 4
    refuses "verifycost -d cuda without a GPU" "" $CB/bin/verifycost -m "$MODEL" -d cuda --reps 1
fi
$BIN/decode -m "$MODEL" -p "Once upon a time" -n 24 --temp 0 >"$TMP/want" 2>/dev/null
$CB/bin/decode -m "$MODEL" -p "Once upon a time" -n 24 --temp 0 >"$TMP/got" 2>/dev/null
check "the CUDA build decodes on the CPU as the plain build does" sh -c "[ -s '$TMP/want' ] && cmp -s '$TMP/want' '$TMP/got'"
finish cuda_build
