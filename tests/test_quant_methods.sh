# test_quant_methods — every decoding method on quantized copies of stories260K (convert
# --dtype q8_0 and q4_k; its 64-wide rows are short rows for Q4_K's 256-element blocks):
# the method tests' greedy parity with standard decoding on the same quantized model, all
# 200 prompts (PARADEC_PARITY_ONLY: the sampling checks run on the float model only).
# Trained heads belong to the float model, so the tests' own heads stand in; the
# speculative test folds its drafts from the quantized model itself.
. tests/lib.sh
need "the method tests' prompts" datasets/tinystories/tinystories_val_sample.txt.gz || { finish quant_methods; exit 0; }
types="q8_0 q4_k"
[ "${PARADEC_SAN:-0}" = 0 ] || types=q4_k # the sanitizer run: the short-row type alone
for q in $types; do
    $BIN/convert "$MODEL" --dtype $q -o "$TMP/$q.safetensors" 2>"$TMP/log"
    check "convert --dtype $q ($(tail -n 1 "$TMP/log"))" test -s "$TMP/$q.safetensors"
    Q=$(echo $q | tr a-z A-Z)
    check "$q: the file holds $Q blocks" sh -c "head -c 4096 '$TMP/$q.safetensors' | grep -aq 'paradec.quant.*\\\\\"$Q\\\\\"'"
    for t in methods lookup_decode medusa_decode speculative_decode; do
        MODEL=$TMP/$q.safetensors PARADEC_PARITY_ONLY=1 TEST_HEADS=$TMP/none TEST_MEDUSA=$TMP/none \
            TEST_DRAFT_HEADS=$TMP/none "$BUILD/tests/test_$t" >"$TMP/out" 2>&1
        rc=$?
        line=$(grep -E '[0-9]+ passed, [0-9]+ failed' "$TMP/out" | tail -n 1)
        check "$q: test_$t: exit $rc, $line" sh -c "test $rc = 0 && echo '$line' | grep -q ' 0 failed'"
        [ $rc = 0 ] || grep -E "^FAIL|differ" "$TMP/out" | grep -v " 0/" | head -n 5
    done
done
finish quant_methods
