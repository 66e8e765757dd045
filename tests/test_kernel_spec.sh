# test_kernel_spec — the scalar kernels are the exact spec: this machine's kernels
# (AVX-512 or AVX2, whichever the build found), its AVX2 paths alone (the build without
# AVX-512 or VNNI), the AVX2 paths with AVX-VNNI (where the CPU has it) and the scalar-only build of the same sources, run on the same fresh random
# inputs (tests/kernel_dump.c), agree bit for bit in every output of every kernel.
# SEED=N repeats a run.
. tests/lib.sh
seed=${SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
mkdir -p "$TMP/native" "$TMP/avx2" "$TMP/scalar"
check "native kernels run (seed $seed)" "$BUILD/kspec/native" "$seed" "$TMP/native"
check "AVX2 kernels run (seed $seed)" "$BUILD/kspec/avx2" "$seed" "$TMP/avx2"
if grep -qw avx_vnni /proc/cpuinfo; then
    mkdir -p "$TMP/avxvnni"
    check "AVX2 + AVX-VNNI kernels run (seed $seed)" "$BUILD/kspec/avxvnni" "$seed" "$TMP/avxvnni"
else
    echo "SKIP kernel_spec: the AVX2 + AVX-VNNI build: this CPU has no avx_vnni"
fi
check "scalar kernels run (seed $seed)" "$BUILD/kspec/scalar" "$seed" "$TMP/scalar"
echo "kernel_spec: seed $seed; native build: $("$BIN/decode" --version 2>/dev/null | sed -n "s/^cpu features: //p")"
for f in "$TMP"/native/*.bin "$TMP"/avx2/*.bin "$TMP"/avxvnni/*.bin; do
    [ -e "$f" ] || continue
    k=$(basename "$f" .bin) build=$(basename "$(dirname "$f")")
    bytes=$(wc -c <"$f")
    differ=$(cmp -l "$f" "$TMP/scalar/$k.bin" 2>/dev/null | wc -l)
    check "$build $k: $bytes bytes of output, $differ differ from the scalar spec (seed $seed)" \
        test "$differ" = 0 -a "$bytes" -gt 0 -a "$bytes" = "$(wc -c <"$TMP/scalar/$k.bin")"
done
check "every kernel's output was written (13 files)" test "$(ls "$TMP"/native | grep -vc '^kv8_\|^qk_\|^q32_')" = 13
check "every KV type's output was written (3 kv8_* files)" test "$(ls "$TMP"/native | grep -c '^kv8_')" = 3
check "every K block type's output was written (4 qk_* files)" test "$(ls "$TMP"/native | grep -c '^qk_')" = 4
check "every 32-element block type's output was written (4 q32_* files)" test "$(ls "$TMP"/native | grep -c '^q32_')" = 4
finish kernel_spec
