# test_tools — convert and decode end to end on stories260K, and every kind of bad
# input: one clear line, a non-zero exit, no output file.
. tests/lib.sh
S=$(data models/stories260K)
TOK=$S/tok512.bin

# the golden text: llama2.c's doc/stories260K.md, `./run stories260K.bin -z tok512.bin -t 0.0`
GOLD="Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big, red ball. She wanted to play with it, but it was too high"
out=$($BIN/decode -m "$MODEL" -p "Once upon a time" -n 60 --temp 0 2>/dev/null)
case "$out" in "$GOLD"*) ok ;; *) bad "greedy stories260K text: $out" ;; esac

# ... and goes on as llama2.c's run.c does: its -n 256 (positions, the last one
# included) prints 252 tokens after the 4 of the prompt (tests/golden/README.md)
$BIN/decode -m "$MODEL" -p "Once upon a time" -n 252 --temp 0 2>/dev/null >"$TMP/long.txt"
check "252 greedy tokens equal run.c's output" cmp -s "$TMP/long.txt" tests/golden/stories260K_runc_256.txt
# legacy and version-1 checkpoints hold the same weights: same digest, same text
$BIN/convert "$S/stories260K.bin" --tokenizer "$TOK" -o "$TMP/v0.safetensors" 2>/dev/null
if need "the version-1 checkpoint" models/stories260K/stories260K_v1.bin; then
    $BIN/convert "$(data models/stories260K/stories260K_v1.bin)" --tokenizer "$TOK" -o "$TMP/v1.safetensors" 2>/dev/null
    d0=$(grep -ao '"paradec.digest":"[0-9a-f]*"' "$TMP/v0.safetensors")
    d1=$(grep -ao '"paradec.digest":"[0-9a-f]*"' "$TMP/v1.safetensors")
    check "v1 and legacy digests ($d0 / $d1)" test -n "$d0" -a "$d0" = "$d1"
fi
# bf16 storage still tells the same story for 60 tokens
$BIN/convert "$S/stories260K.bin" --tokenizer "$TOK" --dtype bf16 -o "$TMP/bf16.safetensors" 2>/dev/null
out=$($BIN/decode -m "$TMP/bf16.safetensors" -p "Once upon a time" -n 30 --temp 0 -t 2 2>/dev/null)
case "$out" in "Once upon a time, there was a little girl named Lily"*) ok ;; *) bad "bf16 text: $out" ;; esac
# the zstd file is a standard one
check "zstd -d gives a plain safetensors" sh -c "zstd -q -d -c '$MODEL' | cmp -s - '$TMP/v0.safetensors'"
# a pipeline: convert to stdout, decode from stdin
out=$($BIN/convert "$S/stories260K.bin" --tokenizer "$TOK" -o - 2>/dev/null | $BIN/decode -m - -p "Once upon a time" -n 60 --temp 0 2>/dev/null)
case "$out" in "$GOLD"*) ok ;; *) bad "pipeline text: $out" ;; esac

# --json
j=$($BIN/decode -m "$MODEL" -p "Once upon a time" -n 20 --temp 0 --json 2>/dev/null)
for key in tokens text n_prompt n_gen tok_per_s target_passes; do
    case "$j" in *"\"$key\":"*) ok ;; *) bad "--json lacks $key: $j" ;; esac
done
check "--json n_gen 20" sh -c "echo '$j' | grep -q '\"n_gen\":20'"
check "--json target_passes 20" sh -c "echo '$j' | grep -q '\"target_passes\":20'"
# sampling is reproducible with a seed and differs across seeds
a=$($BIN/decode -m "$MODEL" -p "Once" -n 40 --temp 1 --seed 7 2>/dev/null)
b=$($BIN/decode -m "$MODEL" -p "Once" -n 40 --temp 1 --seed 7 2>/dev/null)
c=$($BIN/decode -m "$MODEL" -p "Once" -n 40 --temp 1 --seed 8 2>/dev/null)
check "same seed, same text" test "$a" = "$b"
check "other seed, other text" test "$a" != "$c"

# ---- bad input ----
O=$TMP/out.safetensors
refuses "convert: missing checkpoint" "$O" $BIN/convert "$TMP/nope.bin" --tokenizer "$TOK" -o "$O"
refuses "convert: missing tokenizer" "$O" $BIN/convert "$S/stories260K.bin" --tokenizer "$TMP/nope" -o "$O"
head -c 500000 "$S/stories260K.bin" >"$TMP/trunc.bin"
refuses "convert: truncated checkpoint" "$O" $BIN/convert "$TMP/trunc.bin" --tokenizer "$TOK" -o "$O"
head -c 20 "$S/stories260K.bin" >"$TMP/short.bin"
refuses "convert: 20-byte checkpoint" "$O" $BIN/convert "$TMP/short.bin" --tokenizer "$TOK" -o "$O"
need "a tokenizer of another vocabulary" tokenizers/llama2/tokenizer.bin &&
    refuses "convert: tokenizer of another vocabulary" "$O" $BIN/convert "$S/stories260K.bin" --tokenizer "$(data tokenizers/llama2/tokenizer.bin)" -o "$O"
refuses "convert: a tokenizer that is not one" "$O" $BIN/convert "$S/stories260K.bin" --tokenizer "$S/stories260K.bin" -o "$O"
refuses "convert: unknown flag" "$O" $BIN/convert "$S/stories260K.bin" --tokenizer "$TOK" --frobnicate -o "$O"
refuses "convert: bad dtype" "$O" $BIN/convert "$S/stories260K.bin" --tokenizer "$TOK" --dtype f8 -o "$O"
refuses "convert: output directory missing" "" $BIN/convert "$S/stories260K.bin" --tokenizer "$TOK" -o "$TMP/no/dir/x"
P="-p Once -n 10"
refuses "decode: missing model" "" $BIN/decode -m "$TMP/nope" $P
head -c 100000 "$TMP/v0.safetensors" >"$TMP/trunc.safetensors"
refuses "decode: truncated model" "" $BIN/decode -m "$TMP/trunc.safetensors" $P
head -c 100000 "$MODEL" >"$TMP/trunc.safetensors.zst"
refuses "decode: truncated compressed model" "" $BIN/decode -m "$TMP/trunc.safetensors.zst" $P
cp "$TMP/v0.safetensors" "$TMP/corrupt.safetensors"
printf 'XXXXXXXX' | dd of="$TMP/corrupt.safetensors" bs=1 seek=40 conv=notrunc 2>/dev/null
refuses "decode: corrupted header" "" $BIN/decode -m "$TMP/corrupt.safetensors" $P
refuses "decode: a checkpoint that is not a model file" "" $BIN/decode -m "$S/stories260K.bin" $P
long=$(yes "the dog ran to the park and" | head -n 200 | tr '\n' ' ')
refuses "decode: prompt longer than the context" "" $BIN/decode -m "$MODEL" -p "$long" -n 10
refuses "decode: -n 0" "" $BIN/decode -m "$MODEL" -p Once -n 0
refuses "decode: -n abc" "" $BIN/decode -m "$MODEL" -p Once -n abc
refuses "decode: --temp x" "" $BIN/decode -m "$MODEL" -p Once -n 5 --temp x
refuses "decode: --top-p 2" "" $BIN/decode -m "$MODEL" -p Once -n 5 --top-p 2
refuses "decode: -t 0" "" $BIN/decode -m "$MODEL" -p Once -n 5 -t 0
refuses "decode: unknown flag" "" $BIN/decode -m "$MODEL" -p Once -n 5 --bogus
refuses "decode: unknown method" "" $BIN/decode -m "$MODEL" -p Once -n 5 --method magic
refuses "decode: flag without its value" "" $BIN/decode -m "$MODEL" -p Once -n
# ---- methods with heads (trained on TinyStories text) ----
if need "the methods with heads" datasets/tinystories/tinystories_val_sample.txt.gz; then # (body not indented: a small diff)
H=$TMP/heads.safetensors.zst
$BIN/distill-heads -m "$MODEL" --data "$(data datasets/tinystories/tinystories_val_sample.txt.gz)" --layers 2,4 --steps 20 -o "$H" 2>/dev/null
for method in adadecode self-speculative; do
    out=$($BIN/decode -m "$MODEL" -p "Once upon a time" -n 60 --temp 0 --method $method --heads "$H" --gamma 0.5 2>/dev/null)
    case "$out" in "$GOLD"*) ok ;; *) bad "$method greedy text: $out" ;; esac
done
j=$($BIN/decode -m "$MODEL" -p "Once upon a time" -n 40 --temp 0 --method adadecode --heads "$H" --json 2>/dev/null)
for key in layer_passes_per_token token_layers_per_token early_rate_per_head_layer rejection_rate mean_pending; do
    case "$j" in *"\"$key\":"*) ok ;; *) bad "adadecode --json lacks $key" ;; esac
done
$BIN/widen -m "$MODEL" --preset tiny -o "$TMP/wide.safetensors" --heads "$H" --heads-out "$TMP/wide-heads.safetensors.zst" 2>/dev/null
refuses "decode: heads of another model" "" $BIN/decode -m "$MODEL" -p Once -n 5 --method adadecode --heads "$TMP/wide-heads.safetensors.zst"
refuses "decode: heads file that is a model" "" $BIN/decode -m "$MODEL" -p Once -n 5 --method adadecode --heads "$MODEL"
refuses "decode: adadecode without heads" "" $BIN/decode -m "$MODEL" -p Once -n 5 --method adadecode
refuses "decode: --gamma 0" "" $BIN/decode -m "$MODEL" -p Once -n 5 --method adadecode --heads "$H" --gamma 0
refuses "decode: --gamma 1.5" "" $BIN/decode -m "$MODEL" -p Once -n 5 --method adadecode --heads "$H" --gamma 1.5
refuses "decode: --exit-layer without a head" "" $BIN/decode -m "$MODEL" -p Once -n 5 --method self-speculative --heads "$H" --exit-layer 3
fi
# every tool states its memory footprint in --help
for t in bench convert decode distill-heads kvquality membw pack perplexity randmodel recipe serve tokenize train-medusa verifycost widen; do
    check "$t --help states its memory" sh -c "$BIN/$t --help | grep -q '^memory: about\\|^memory: check'"
done
finish tools
