# test_weights_verify — checked weights (issue 21, point 5). A NaN or a flipped bit in
# one tensor of a copy of the model (plain, .zst, from stdin, inside a bundle, in a head
# set) is refused at load: exit 1, one line naming that tensor; --no-verify loads it;
# undamaged copies decode exactly as the model does. The digests a file records equal
# an independent computation (tests/ref/digests.py: xxhash over the bytes, by the
# format's definition). An older file without per-tensor digests still loads, and when
# damaged is refused naming the file; a writer refuses a non-finite weight.
. tests/lib.sh
P=$TMP/m.safetensors
zstd -q -d -c "$MODEL" >"$P"
run() { $BIN/decode -m "$@" -p "Once upon a time" -n 20 --temp 0 2>/dev/null; }
run "$MODEL" >"$TMP/want.txt"
check "the model decodes" test -s "$TMP/want.txt"

hlen() { od -A n -t u8 -N 8 "$1" | tr -d ' '; }
header() { tail -c +9 "$1" | head -c "$(hlen "$1")"; }
offset() { # offset FILE TENSOR: where its bytes start in the file
    echo $((8 + $(hlen "$1") + $(header "$1" | jq -r --arg n "$2" '.[$n].data_offsets[0]'))); }
put() { # put FILE AT OCTAL-ESCAPED-BYTES
    printf "$3" | dd of="$1" bs=1 seek="$2" conv=notrunc 2>/dev/null; }
nan_in() { # nan_in SRC TENSOR DST: its first element a NaN (f32 0x7fc00000)
    cp "$1" "$3" && put "$3" "$(offset "$1" "$2")" '\000\000\300\177'; }
flip_in() { # flip_in SRC TENSOR BYTE DST: the low bit of that byte of the tensor flipped
    cp "$1" "$4"
    at=$(($(offset "$1" "$2") + $3)) b=$(od -A n -t u1 -j "$at" -N 1 "$1" | tr -d ' ')
    put "$4" "$at" "\\$(printf '%03o' $((b ^ 1)))"; }
rehead() { # rehead SRC JQ-FILTER DST: the header rewritten, space-padded to its length
    h=$(hlen "$1")
    header "$1" | jq -c "$2" | tr -d '\n' >"$TMP/h.json"
    n=$(wc -c <"$TMP/h.json")
    { head -c 8 "$1"; cat "$TMP/h.json"; head -c $((h - n)) /dev/zero | tr '\0' ' '; tail -c +$((9 + h)) "$1"; } >"$3"; }
damaged() { # damaged DESCRIPTION TENSOR COMMAND...: exit 1, one line naming the tensor
    what=$1 tn=$2; shift 2 # (check sets d)
    "$@" >"$TMP/out" 2>"$TMP/err"
    rc=$?
    check "$what: exit 1 (got $rc)" test "$rc" = 1
    check "$what: one line on stderr" test "$(wc -l <"$TMP/err")" = 1
    check "$what: the line names '$tn'" grep -q "tensor '$tn' is damaged" "$TMP/err"
    check "$what: nothing on stdout" test ! -s "$TMP/out"
}

# the digests recorded = the independent computation, every tensor listed
if command -v python3 >/dev/null; then python3 tests/ref/digests.py "$P" >"$TMP/dig" 2>"$TMP/dig.err"; rc=$?; else rc=3; fi
case $rc in
3) echo "SKIP test_weights_verify: the independent digests: needs python3 with the xxhash module, or xxhsum and xxh128sum (pip install xxhash, or apt-get install xxhash)" ;;
0) check "every recorded digest = the independent one" awk '$2 != $3 { exit 1 }' "$TMP/dig"
   check "the whole-model digest is among them" grep -q '^paradec.digest [0-9a-f]\{32\} ' "$TMP/dig"
   check "every tensor has its digest" test "$(($(wc -l <"$TMP/dig") - 1))" = "$(header "$P" | jq 'del(.__metadata__) | length')" ;;
*) bad "digests.py failed: $(cat "$TMP/dig.err")" ;;
esac

# undamaged: plain, zst, stdin decode as the model
check "plain copy decodes as the model" sh -c "$BIN/decode -m '$P' -p 'Once upon a time' -n 20 --temp 0 2>/dev/null | cmp -s - '$TMP/want.txt'"
run - <"$MODEL" >"$TMP/stdin.txt"
check "the model from stdin decodes as the file" cmp -s "$TMP/stdin.txt" "$TMP/want.txt"

# damaged: a NaN, a flipped bit; plain, zst, stdin
V=model.layers.2.self_attn.v_proj.weight E=model.embed_tokens.weight N=model.norm.weight
nan_in "$P" $V "$TMP/nan.safetensors"
damaged "a NaN in $V" $V $BIN/decode -m "$TMP/nan.safetensors" -p "Once upon a time" -n 20 --temp 0
run "$TMP/nan.safetensors" --no-verify >"$TMP/nv.txt"
check "--no-verify loads it (and decodes, if garbage)" test -s "$TMP/nv.txt"
flip_in "$P" $E 1001 "$TMP/flip.safetensors"
damaged "a bit flipped in $E" $E $BIN/decode -m "$TMP/flip.safetensors" -p "Once upon a time" -n 5 --temp 0
flip_in "$P" $N 3 "$TMP/n.safetensors"
zstd -q -c "$TMP/n.safetensors" >"$TMP/n.safetensors.zst"
damaged "a .zst with a bit flipped in $N" $N $BIN/decode -m "$TMP/n.safetensors.zst" -p Once -n 5 --temp 0
damaged "the same from stdin" $N sh -c "$BIN/decode -m - -p Once -n 5 --temp 0 <'$TMP/n.safetensors.zst'"
run "$TMP/n.safetensors.zst" --no-verify >"$TMP/nv.txt"
check "--no-verify loads the .zst" test -s "$TMP/nv.txt"
flip_in "$P" tokenizer.bytes 100 "$TMP/tok.safetensors"
damaged "a bit flipped in the tokenizer" tokenizer.bytes $BIN/decode -m "$TMP/tok.safetensors" -p Once -n 5 --temp 0
G=model.layers.0.mlp.gate_proj.weight
rehead "$P" ".[\"$G\"].shape |= reverse" "$TMP/shape.safetensors"
refuses "a shape changed in the header" "" $BIN/decode -m "$TMP/shape.safetensors" -p Once -n 5 --temp 0
check "... is named as a header change" grep -q "header (a tensor's name, dtype or shape) was changed" "$TMP/stderr"

# head sets and bundles: text for the heads from the model itself (no dataset needed)
for s in 1 2 3 4; do $BIN/decode -m "$MODEL" -p "Once upon a time" -n 400 --temp 1 --seed $s 2>/dev/null; done >"$TMP/text.txt"
EH=$TMP/exit.safetensors MH=$TMP/medusa.safetensors.zst B=$TMP/b.safetensors
$BIN/distill-heads -m "$MODEL" --data "$TMP/text.txt" --layers 2,4 --steps 3 --batch 2 --seq-len 64 -o "$EH" 2>/dev/null
$BIN/train-medusa -m "$MODEL" --data "$TMP/text.txt" --heads 2 --steps 3 --batch 2 --seq-len 64 -o "$MH" 2>/dev/null
header "$EH" | jq -r '.__metadata__["paradec.digests"] | fromjson | map(.[0]) | join(",")' >"$TMP/hd" 2>&1
check "exit heads record their digests ($(cat "$TMP/hd"))" test "$(cat "$TMP/hd")" = "exit.2.T,exit.4.T"
$BIN/decode -m "$MODEL" --heads "$EH" --method adadecode -p "Once upon a time" -n 20 --temp 0 >"$TMP/ada.txt" 2>/dev/null
check "undamaged exit heads decode" cmp -s "$TMP/ada.txt" "$TMP/want.txt"
flip_in "$EH" exit.2.T 77 "$TMP/eh.safetensors"
damaged "exit heads with a bit flipped" exit.2.T $BIN/decode -m "$MODEL" --heads "$TMP/eh.safetensors" --method adadecode -p Once -n 5 --temp 0
zstd -q -d -c "$MH" >"$TMP/mh.safetensors"
nan_in "$TMP/mh.safetensors" medusa.1.w "$TMP/mhn.safetensors"
damaged "medusa heads with a NaN" medusa.1.w $BIN/decode -m "$MODEL" --heads "$TMP/mhn.safetensors" --method medusa -p Once -n 5 --temp 0
$BIN/pack -m "$P" "$EH" "$MH" -o "$B" 2>/dev/null
check "a bundle of the copy" test -s "$B"
$BIN/decode -m "$B" --method medusa -p "Once upon a time" -n 20 --temp 0 >"$TMP/bm.txt" 2>/dev/null
check "the undamaged bundle decodes" cmp -s "$TMP/bm.txt" "$TMP/want.txt"
nan_in "$B" $V "$TMP/bv.safetensors"
damaged "a bundle with a NaN in its model" $V $BIN/decode -m "$TMP/bv.safetensors" -p Once -n 5 --temp 0
flip_in "$B" heads.1/medusa.0.w 5 "$TMP/bh.safetensors"
damaged "a bundle with a bit flipped in a head set" medusa.0.w $BIN/decode -m "$TMP/bh.safetensors" --method medusa -p Once -n 5 --temp 0
damaged "pack of a damaged model" $V $BIN/pack -m "$TMP/nan.safetensors" "$EH" -o "$TMP/x.safetensors"
check "... leaves no bundle" test ! -e "$TMP/x.safetensors"
damaged "pack of damaged heads" exit.2.T $BIN/pack -m "$P" "$TMP/eh.safetensors" -o "$TMP/x.safetensors"
$BIN/pack --no-verify -m "$TMP/nan.safetensors" "$EH" -o "$TMP/x.safetensors" 2>/dev/null
check "pack --no-verify packs it" test -s "$TMP/x.safetensors"

# an older file: no paradec.digests (its whole digest still checked, the file named)
O=$TMP/old.safetensors
rehead "$P" 'del(.__metadata__["paradec.digests"])' "$O"
header "$O" | jq -r '.__metadata__ | has("paradec.digests"), has("paradec.digest")' | tr '\n' ' ' >"$TMP/od"
check "the older file: no per-tensor digests, the whole one kept ($(cat "$TMP/od"))" test "$(cat "$TMP/od")" = "false true "
run "$O" >"$TMP/old.txt"
check "the older file decodes as the model" cmp -s "$TMP/old.txt" "$TMP/want.txt"
nan_in "$O" model.layers.1.self_attn.q_proj.weight "$TMP/oldnan.safetensors"
refuses "a damaged older file" "" $BIN/decode -m "$TMP/oldnan.safetensors" -p Once -n 5 --temp 0
check "... named, and why no tensor is" grep -q "oldnan.safetensors: the weights do not match paradec.digest: .*predates per-tensor digests" "$TMP/stderr"
run "$TMP/oldnan.safetensors" --no-verify >"$TMP/nv.txt"
check "--no-verify loads the older file" test -s "$TMP/nv.txt"

# a writer refuses a non-finite weight (a NaN in the source checkpoint's embedding)
S=$(data models/stories260K)
cp "$S/stories260K.bin" "$TMP/nan.bin" && put "$TMP/nan.bin" $((28 + 4 * 100)) '\000\000\300\177'
refuses "convert of a checkpoint with a NaN" "$TMP/c.safetensors" $BIN/convert "$TMP/nan.bin" --tokenizer "$S/tok512.bin" -o "$TMP/c.safetensors"
check "... names the tensor and the element" grep -q "tensor '$E' element 100 is not finite" "$TMP/stderr"
$BIN/convert "$S/stories260K.bin" --tokenizer "$S/tok512.bin" --dtype bf16 -o "$TMP/bf16.safetensors" 2>/dev/null
run "$TMP/bf16.safetensors" >"$TMP/bf16.txt"
check "a bf16 file verifies and decodes" test -s "$TMP/bf16.txt"
finish weights_verify
