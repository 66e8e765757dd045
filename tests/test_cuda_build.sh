#!/bin/sh
# test_cuda_build — every kernels/cuda/*.cu compiles with nvcc for sm_90a and sm_80 (one
# call per file, both targets) with -fmad=false, so that no a*b+c is fused behind the
# kernels' backs, and warnings as errors. Without nvcc (on PATH, or in /usr/local/cuda)
# one SKIP line. `make nvcc-check` runs this alone.
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
finish cuda_build
