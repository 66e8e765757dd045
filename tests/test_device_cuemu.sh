# test_device_cuemu — --device cuemu (the CUDA kernels of kernels/cuda built for the
# host under cuemu.h) end to end on stories260K: every method `decode --help` lists,
# greedy, and sampled with a seed (its draft sizes fixed), emits exactly what it emits
# with --device cpu, with --graphs too (captured passes replayed, on both devices);
# AdaDecode's two-stream schedule gives standard's tokens on both; the logits after a
# prompt are the CPU's bit for bit (f32, bf16 and q8_0 KV caches), after a prompt longer
# than one FlashDecoding chunk, and with weights of every GGUF block type and a q|k|v of
# mixed types; both thread orders of the emulation agree; distill-heads trains the same
# and medusa heads (their products on the device too); a device not compiled in is refused in one line. PD_TEST_DEVICE=cuda
# (tests/gpu/run.sh, with a CUDA build's BIN) runs the same comparisons on a GPU,
# without cuemu's own checks.
. tests/lib.sh
N=40
DEV=${PD_TEST_DEVICE:-cuemu}

# a method's switches that fix its draft sizes: its size controller times the rounds, and
# a sampled output follows the drafts' random draws, so only fixed drafts are comparable
fixed_flags() {
    $BIN/decode --help | sed -n '/^Methods/,$p' | awk -v m="$1" '
        /^  [a-z]/ { on = $1 == m } on && /^      --(fixed-tree|draft-fixed) / { printf "%s ", $1 }'
}

set -- "Once upon a time, there was a" "The little dog ran to the" "Tom was sad because"
if [ -n "${PARADEC_SAN:-}" ]; then # under ASan an emulated thread costs ~50x: one prompt, short
    set -- "Once upon a time, there was a"
    N=10
fi
for meth in $(decode_methods); do
    f=$(method_flags "$meth")
    case $f in *NEED*)
        bad "$meth: $f (this test does not know how to give the method what it needs)"
        continue ;;
    esac
    for mode in "--temp 0" "--temp 0.8 --seed 7 $(fixed_flags "$meth")"; do
        same=0 i=0
        for p; do
            i=$((i + 1))
            $BIN/decode -m "$MODEL" -p "$p" -n $N $mode --method "$meth" $f -d cpu >"$TMP/cpu" 2>/dev/null
            $BIN/decode -m "$MODEL" -p "$p" -n $N $mode --method "$meth" $f -d $DEV >"$TMP/emu" 2>"$TMP/err"
            $BIN/decode -m "$MODEL" -p "$p" -n $N $mode --method "$meth" $f -d $DEV --graphs >"$TMP/gr" 2>>"$TMP/err"
            $BIN/decode -m "$MODEL" -p "$p" -n $N $mode --method "$meth" $f --graphs >"$TMP/cgr" 2>>"$TMP/err"
            if [ -s "$TMP/cpu" ] && cmp -s "$TMP/cpu" "$TMP/emu" && cmp -s "$TMP/cpu" "$TMP/gr" && cmp -s "$TMP/cpu" "$TMP/cgr"; then
                same=$((same + 1))
            else
                echo "$meth ($mode) prompt $i:"; head -2 "$TMP/err"
            fi
        done
        check "$meth, $mode: $same of $# outputs with --device $DEV, with and without --graphs (and cpu's with), are --device cpu's" test $same = $#
    done
done

P="Once upon a time, there was a"
# AdaDecode's two-stream schedule (a GPU's default): early tokens' deferred layers as calls
# of their own on a second runner, waited for by event, the same tokens as standard's
H=$(method_flags adadecode)
$BIN/decode -m "$MODEL" -p "$P" -n $N --temp 0 >"$TMP/std" 2>/dev/null
for d in cpu $DEV; do
    $BIN/decode -m "$MODEL" -p "$P" -n $N --temp 0 --method adadecode $H --oracle-exit 0.8 --streams 2 -d $d \
        >"$TMP/ada2.$d" 2>"$TMP/ada2.err"
    check "adadecode --streams 2 on $d (oracle exits 0.8: $(grep -o '[0-9]* early' "$TMP/ada2.err")): standard's tokens" \
        sh -c "test -s '$TMP/std' && cmp -s '$TMP/std' '$TMP/ada2.$d' && grep -q ' [1-9][0-9]* early' '$TMP/ada2.err'"
done
for t in f32 bf16 q8_0; do
    $BIN/decode -m "$MODEL" -p "$P" --temp 0 --kv-type $t --dump-logits "$TMP/l.cpu.$t" >/dev/null 2>&1
    $BIN/decode -m "$MODEL" -p "$P" --temp 0 --kv-type $t -d $DEV --dump-logits "$TMP/l.emu.$t" >/dev/null 2>&1
    check "--kv-type $t: the logits after a prompt on $DEV are the CPU's, bit for bit" \
        sh -c "test -s '$TMP/l.cpu.$t' && cmp -s '$TMP/l.cpu.$t' '$TMP/l.emu.$t'"
done
# past ATT_SPLIT keys (a 362-token prompt): FlashDecoding's chunks, split and recombined
# (not under ASan, where the emulation is ~50x slower: test_cuemu_attention has them)
if [ -z "${PARADEC_SAN:-}" ]; then
    LONG=$(for i in $(seq 1 30); do printf "Once upon a time, there was a little dog. "; done)
    for d in cpu $DEV; do
        $BIN/decode -m "$MODEL" -p "$LONG" --temp 0 -d $d --dump-logits "$TMP/long.$d" >/dev/null 2>&1
        $BIN/decode -m "$MODEL" -p "$LONG" -n 40 --temp 0 -d $d >"$TMP/long.$d.txt" 2>/dev/null
    done
    check "a 362-token prompt: the logits on $DEV are the CPU's, bit for bit" \
        sh -c "test -s '$TMP/long.cpu' && cmp -s '$TMP/long.cpu' '$TMP/long.$DEV'"
    check "a 362-token prompt: 40 greedy tokens on $DEV are the CPU's" \
        sh -c "test -s '$TMP/long.cpu.txt' && cmp -s '$TMP/long.cpu.txt' '$TMP/long.$DEV.txt'"
fi
if [ "$DEV" = cuemu ]; then
    CUEMU_ORDER=reverse $BIN/decode -m "$MODEL" -p "$P" --temp 0 -d cuemu --dump-logits "$TMP/l.rev" >/dev/null 2>&1
    check "threads last-to-first (CUEMU_ORDER=reverse): the same logits" cmp -s "$TMP/l.cpu.f32" "$TMP/l.rev"
fi

# training: the frozen model through a runner and every product of the backward pass on the
# device (model/product.h): under cuemu the CUDA sources' exact product, so the same heads
# byte for byte; on a GPU cuBLAS's, whose sums run in another order: heads that decode
if [ -z "${PARADEC_SAN:-}" ] && need "the trainers on text" datasets/tinystories/tinystories_val_sample.txt.gz; then
    gzip -dc "$(data datasets/tinystories/tinystories_val_sample.txt.gz)" | head -c 20000 >"$TMP/train.txt"
    T="--steps 2 --batch 2 --seq-len 64 --data $TMP/train.txt"
    for d in cpu $DEV; do
        $BIN/distill-heads -m "$MODEL" $T --layers 2 --norm 1 -d $d -o "$TMP/heads.$d.safetensors" 2>/dev/null
        $BIN/train-medusa -m "$MODEL" $T --heads 2 --own-lm-head -d $d -o "$TMP/medusa.$d.safetensors" 2>/dev/null
    done
    for h in heads medusa; do
        if [ "$DEV" = cuemu ]; then
            check "$h: training on $DEV writes what -d cpu writes" \
                sh -c "test -s '$TMP/$h.cpu.safetensors' && cmp -s '$TMP/$h.cpu.safetensors' '$TMP/$h.$DEV.safetensors'"
        else
            meth=adadecode
            [ $h = medusa ] && meth=medusa
            $BIN/decode -m "$MODEL" --heads "$TMP/$h.$DEV.safetensors" --method $meth -p "$1" -n $N --temp 0 -d $DEV \
                >"$TMP/$h.out" 2>/dev/null
            $BIN/decode -m "$MODEL" -p "$1" -n $N --temp 0 -d $DEV >"$TMP/$h.std" 2>/dev/null
            check "$h trained on $DEV: $meth with them gives standard's tokens" \
                sh -c "test -s '$TMP/$h.std' && cmp -s '$TMP/$h.std' '$TMP/$h.out'"
        fi
    done
fi
# the block types: the CUDA kernels read the file's blocks (the CPU its own packing); the
# K types' 256-element blocks hold stories260K's 64-wide rows as short rows
for q in q8_0 q4_0 q4_1 q5_0 q4_k q5_k q6_k; do
    $BIN/convert "$MODEL" --dtype $q -o "$TMP/$q.safetensors" 2>/dev/null
    for d in cpu $DEV; do
        $BIN/decode -m "$TMP/$q.safetensors" -p "$P" --temp 0 -d $d --dump-logits "$TMP/$q.$d" >/dev/null 2>&1
        $BIN/decode -m "$TMP/$q.safetensors" -p "$P" -n $N --temp 0 -d $d --method prompt-lookup >"$TMP/$q.$d.txt" \
            2>/dev/null
    done
    check "a $q model: the logits on $DEV are the CPU's, bit for bit" \
        sh -c "test -s '$TMP/$q.cpu' && cmp -s '$TMP/$q.cpu' '$TMP/$q.$DEV'"
    check "a $q model: $N greedy tokens (prompt-lookup) on $DEV are the CPU's" \
        sh -c "test -s '$TMP/$q.cpu.txt' && cmp -s '$TMP/$q.cpu.txt' '$TMP/$q.$DEV.txt'"
    rm -f "$TMP/$q.safetensors"
done
# a stacked matrix of mixed types (q, k in Q4_0, v in Q8_0, as llama.cpp's Q4_K_M mixes
# them): the CPU packs it as one; the CUDA kernels take it source by source (matmul_ld)
$BIN/convert "$MODEL" --dtype q4_0 -o "$TMP/q40.safetensors" 2>/dev/null
$BIN/convert "$MODEL" --dtype q8_0 -o "$TMP/q80.safetensors" 2>/dev/null
if command -v python3 >/dev/null; then
    python3 tests/ref/splice_tensor.py "$TMP/q40.safetensors" "$TMP/q80.safetensors" \
        model.layers.0.self_attn.v_proj.weight "$TMP/mixed.safetensors"
    for d in cpu $DEV; do
        $BIN/decode -m "$TMP/mixed.safetensors" --no-verify -p "$P" --temp 0 -d $d --dump-logits "$TMP/mx.$d" \
            >/dev/null 2>&1
        $BIN/decode -m "$TMP/mixed.safetensors" --no-verify -p "$P" -n $N --temp 0 -d $d >"$TMP/mx.$d.txt" 2>/dev/null
    done
    check "a mixed q|k|v (Q4_0, Q8_0): the logits on $DEV are the CPU's, bit for bit" \
        sh -c "test -s '$TMP/mx.cpu' && cmp -s '$TMP/mx.cpu' '$TMP/mx.$DEV'"
    check "a mixed q|k|v: $N greedy tokens on $DEV are the CPU's" \
        sh -c "test -s '$TMP/mx.cpu.txt' && cmp -s '$TMP/mx.cpu.txt' '$TMP/mx.$DEV.txt'"
else
    echo "SKIP a mixed q|k|v: no python3 here to splice the model"
fi
rm -f "$TMP"/q40.safetensors "$TMP"/q80.safetensors "$TMP"/mixed.safetensors
[ "$DEV" = cuemu ] || { finish device_$DEV; exit; } # the rest: refusals of this (CPU-only) build

# refusals: one line, exit != 0
for d in cuda gpu ""; do
    refuses "decode --device '$d'" "" $BIN/decode -m "$MODEL" -p Once -n 4 -d "$d"
done
$BIN/decode -m "$MODEL" -p Once -n 4 -d cuda 2>"$TMP/err"
check "the refusal names the device and the backends compiled in" \
    grep -q "^decode: --device: device 'cuda' is not compiled in (this build has: cpu cuemu)$" "$TMP/err"
for t in verifycost serve bench distill-heads train-medusa; do
    $BIN/$t --help >"$TMP/help" 2>&1
    check "$t --help lists -d, --device" grep -q -- "-d, --device" "$TMP/help"
done
refuses "verifycost --device nope" "" $BIN/verifycost -m "$MODEL" -d nope
refuses "--fast-prefill off the GPU" "" $BIN/decode -m "$MODEL" -p Once -n 4 -d cuemu --fast-prefill
$BIN/decode --version >"$TMP/v"
check "--version lists the backends" grep -q "^backends: cpu cuemu$" "$TMP/v"
finish device_cuemu
