# test_kv_type — --kv-type bf16 and q8_0 end to end: every method `decode --help` lists
# emits, greedy, exactly what standard decoding emits with the same KV type, on a few
# prompts (the methods read what they need: the test exit heads, the test Medusa heads,
# a 2-layer draft folded from heads trained for a few steps); the type really changes
# the cache (the logits after a prompt differ from f32's, f32 given explicitly is the
# default's bits); a bad --kv-type is one line and a non-zero exit in every tool that
# takes it. serve with a q8_0 cache answers as decode does, alone and batched.
. tests/lib.sh
N=120

methods=$(decode_methods)
check "decode --help lists methods ($(echo $methods | tr '\n' ' '))" test "$(echo "$methods" | wc -l)" -ge 5

set -- "Once upon a time, there was a" "The little dog ran to the" "Lily and Ben were playing in the park when" \
    "One day, a big red ball" "Tom was sad because"
i=0
for p; do
    i=$((i + 1))
    $BIN/decode -m "$MODEL" -p "$p" -n $N --temp 0 >"$TMP/std.f32.$i" 2>/dev/null
done
for t in bf16 q8_0; do
    i=0 differ=0
    for p; do
        i=$((i + 1))
        $BIN/decode -m "$MODEL" -p "$p" -n $N --temp 0 --kv-type $t >"$TMP/std.$t.$i" 2>/dev/null
        check "$t: standard decodes prompt $i" test -s "$TMP/std.$t.$i"
        cmp -s "$TMP/std.$t.$i" "$TMP/std.f32.$i" || differ=$((differ + 1))
    done
    # else the parity below would hold for f32's text too and prove less
    check "$t: standard's greedy text differs from f32's on $differ of $# prompts (at least 1)" test $differ -ge 1
    for meth in $methods; do
        [ "$meth" = standard ] && continue
        f=$(method_flags "$meth")
        case $f in *NEED*)
            bad "$meth: $f (this test does not know how to give the method what it needs)"
            continue ;;
        esac
        same=0 i=0
        for p; do
            i=$((i + 1))
            $BIN/decode -m "$MODEL" -p "$p" -n $N --temp 0 --kv-type $t --method "$meth" $f >"$TMP/out" 2>"$TMP/err"
            cmp -s "$TMP/out" "$TMP/std.$t.$i" && same=$((same + 1)) || { echo "$meth prompt $i:"; head -2 "$TMP/err"; }
        done
        check "--kv-type $t, $meth: $same of $# greedy outputs are standard's with $t" test "$same" = $#
    done
done

# the type reaches the cache: the logits after a prompt
P="Once upon a time, there was a"
for t in default f32 bf16 q8_0; do
    k=; [ $t = default ] || k="--kv-type $t"
    $BIN/decode -m "$MODEL" -p "$P" --temp 0 $k --dump-logits "$TMP/l.$t" >/dev/null 2>&1
done
check "--kv-type f32: the default's logits, bit for bit" cmp -s "$TMP/l.default" "$TMP/l.f32"
check "--kv-type bf16 changes the logits" sh -c "test -s '$TMP/l.bf16' && ! cmp -s '$TMP/l.f32' '$TMP/l.bf16'"
check "--kv-type q8_0 changes the logits" sh -c "test -s '$TMP/l.q8_0' && ! cmp -s '$TMP/l.f32' '$TMP/l.q8_0'"
check "bf16 and q8_0 differ from each other" sh -c "! cmp -s '$TMP/l.bf16' '$TMP/l.q8_0'"

# bin/kvquality: f32 against itself is exact; q8_0 costs something, and says so
if need "kvquality on text" datasets/tinystories/tinystories_val_sample.txt.gz; then
    TS=$(data datasets/tinystories/tinystories_val_sample.txt.gz)
    $BIN/kvquality -m "$MODEL" --data "$TS" --kv-type f32 --positions 300 >"$TMP/q.f32" 2>&1
    check "kvquality f32 vs f32: 100% agreement, KL 0, the same perplexity" \
        grep -Eq "over 300 positions .*top-1 agreement 100.00% \(300\), mean KL 0 nats \(max 0\), perplexity ([0-9.]*) vs \1 \(\+0.000%\)" "$TMP/q.f32"
    $BIN/kvquality -m "$MODEL" --data "$TS" --kv-type q8_0 --positions 300 >"$TMP/q.q8" 2>&1
    check "kvquality q8_0: a KL above 0, 96 vs 256 bytes a position and layer" \
        sh -c "grep -q '(96 vs 256 bytes a position and layer)' '$TMP/q.q8' && ! grep -q 'mean KL 0 nats' '$TMP/q.q8'"
    refuses "kvquality --kv-type q4" "" $BIN/kvquality -m "$MODEL" --data "$TS" --kv-type q4
fi

# serve with --kv-type q8_0: answers alone and four at once (one batch) are decode's
if command -v curl >/dev/null && command -v jq >/dev/null; then
    . tests/serve_lib.sh
    B=$MODEL
    i=0
    for p; do
        i=$((i + 1))
        $BIN/decode -m "$MODEL" -p "$p" -n $N --temp 0 --kv-type q8_0 --json 2>/dev/null | jq -r .text >"$TMP/want.$i"
        printf '{"prompt": %s, "max_tokens": %d, "temperature": 0}' "$(printf %s "$p" | jq -Rs .)" $N >"$TMP/req.$i"
    done
    if start "$TMP/slog" --parallel 8 --kv-type q8_0; then
        check "serve says its KV type" grep -q "KV blocks of 16 in q8_0, methods:" "$TMP/slog"
        same=0
        for j in $(seq $i); do
            curl -s -m 60 "http://127.0.0.1:$PORT/v1/completions" -d "@$TMP/req.$j" | jq -r '.choices[0].text' >"$TMP/got.$j"
            cmp -s "$TMP/got.$j" "$TMP/want.$j" && same=$((same + 1))
        done
        check "serve --kv-type q8_0: $same of $i greedy answers alone are decode's with q8_0" test $same = $i
        P2=
        for j in $(seq $i); do
            curl -s -m 60 "http://127.0.0.1:$PORT/v1/completions" -d "@$TMP/req.$j" | jq -r '.choices[0].text' >"$TMP/con.$j" &
            P2="$P2 $!"
        done
        wait $P2
        same=0
        for j in $(seq $i); do cmp -s "$TMP/con.$j" "$TMP/want.$j" && same=$((same + 1)); done
        check "serve --kv-type q8_0: $same of $i concurrent greedy answers are decode's with q8_0" test $same = $i
        kill $SPID
        wait $SPID 2>/dev/null
    else
        bad "serve --kv-type q8_0 starts"
    fi
else
    echo "test_kv_type: curl or jq missing: serve not checked"
fi

# bad input: one line, exit != 0, in every tool that takes the flag
for bad_type in q4_0 Q8_0 "" f16; do
    refuses "decode --kv-type '$bad_type'" "" $BIN/decode -m "$MODEL" -p Once -n 4 --kv-type "$bad_type"
    refuses "verifycost --kv-type '$bad_type'" "" $BIN/verifycost -m "$MODEL" --kv-type "$bad_type"
    refuses "serve --kv-type '$bad_type'" "" $BIN/serve -m "$MODEL" --port 0 --kv-type "$bad_type"
    refuses "bench --kv-type '$bad_type'" "" $BIN/bench --recipe recipes/stories260k.yaml --kv-type "$bad_type"
done
$BIN/decode -m "$MODEL" -p Once -n 4 --kv-type q4_0 2>"$TMP/err"
check "the refusal names the flag, the value and the types" grep -q "^decode: --kv-type: 'q4_0' is not a KV cache type (f32, bf16 or q8_0)$" "$TMP/err"
refuses "decode --kv-type without a value" "" $BIN/decode -m "$MODEL" -p Once --kv-type
finish kv_type
