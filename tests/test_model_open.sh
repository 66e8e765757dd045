# test_model_open — -m takes a GGUF file or a Hugging Face directory as well as a paradec
# file (import/model_open.h): decode, bench and verifycost on each give what they give on
# the file convert makes of it (greedy text, bench's counts), distill-heads and
# train-medusa train on it (heads that fit the converted file), with one note on stderr,
# nothing left in /dev/shm or $TMPDIR; a missing path, a directory that is no model and a
# GGUF that is no model are refused with one line. SmolLM2's own Q4_1 GGUF when present.
. tests/lib.sh
S=$(data models/stories260K)
C=${PARADEC_CACHE:-$HOME/.cache/paradec}
PY=$C/venv/bin/python
need "the stories260K tokenizer" models/stories260K/tok512.bin || { finish model_open; exit 0; }
story() { $BIN/decode -m "$1" -p "Once upon a time" -n 40 --temp 0 2>"$TMP/err"; }
# llama2.c's doc/stories260K.md, `./run stories260K.bin -z tok512.bin -t 0.0` (as test_convert_hf)
GOLD="Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day,"
mkdir -p "$TMP/tmpdir"
export TMPDIR=$TMP/tmpdir
leftovers() { ls /dev/shm/paradec-import-* "$TMPDIR"/* 2>/dev/null | wc -l; }
shm0=$(leftovers)
# note FILE TOOL SRC: exactly the one note on stderr (and nothing else but decode's summary)
note() {
    n=$(grep -c "^$2: importing $3 in memory (bin/convert $3 -o .*\.safetensors once loads faster)$" "$1")
    check "$2 -m $3: the note once on stderr ($(head -n 2 "$1"))" test "$n" = 1
}

# ---- sources: stories260K as a GGUF with its vocabulary inside (written by test_gguf,
# the vocabulary by gguf-py), and as a Hugging Face directory (widen --hf) ----
SRCS=""
if "$PY" -c "import gguf, numpy" 2>/dev/null; then
    $BUILD/tests/test_gguf --write-gguf "$MODEL" "$TMP/s.gguf" f32
    "$PY" tests/ref/gguf_with_vocab.py "$TMP/s.gguf" "$S/tok512.bin" "$TMP/stories.gguf"
    check "a GGUF with its vocabulary written" test -s "$TMP/stories.gguf"
    SRCS="$TMP/stories.gguf"
else
    echo "SKIP model_open: GGUF sources: gguf-py is not in $PY (make models sets it up)"
fi
$BIN/widen -m "$MODEL" --preset tiny -o "$TMP/w.safetensors" --hf "$TMP/hf" 2>/dev/null
check "widen --hf wrote an HF directory" test -s "$TMP/hf/config.json"
SRCS="$SRCS $TMP/hf"

cat >"$TMP/r.yaml" <<YAML
about: test_model_open's recipe
model: {source: models/stories260K/stories260K.bin, tokenizer: models/stories260K/tok512.bin}
decoding:
  methods: [standard, prompt-lookup]
datasets:
  - {name: tinystories, samples: 2, max_new: 24}
YAML
have_data=1
need "bench's and the trainers' checks" datasets/tinystories/tinystories_val_sample.txt.gz || have_data=0
[ $have_data = 1 ] && gzip -dc "$(data datasets/tinystories/tinystories_val_sample.txt.gz)" | head -c 20000 >"$TMP/small.txt"
# bench's table without what timing steers (the times; the drafters' sizes, so τ): the
# prompts, the tokens, greedy parity with standard
counts() { cut -d, -f1-7,14-16 "$1/table.csv"; }

for src in $SRCS; do
    $BIN/convert "$src" -o "$TMP/conv.safetensors" 2>/dev/null
    want=$(story "$TMP/conv.safetensors")
    case "$want" in "$GOLD"*) ok ;; *) bad "convert $src: stories260K's text: $want" ;; esac
    got=$(story "$src")
    check "decode -m $src: the converted file's greedy text (got: $got)" test "$got" = "$want"
    note "$TMP/err" decode "$src"
    check "decode -m $src: stderr is the note and the summary ($(cat "$TMP/err"))" test "$(wc -l <"$TMP/err")" = 2
    got=$($BIN/decode -m "$src" --no-verify -p "Once upon a time" -n 40 --temp 0 2>/dev/null)
    check "decode -m $src --no-verify: the same text" test "$got" = "$want"
    $BIN/verifycost -m "$src" --sizes 1,2,4 --reps 2 >"$TMP/vc" 2>"$TMP/err"
    check "verifycost -m $src: exit 0 and a row per size" test $? = 0 -a "$(grep -c '"ratio"' "$TMP/vc")" = 3
    note "$TMP/err" verifycost "$src"
    if [ $have_data = 1 ]; then
        $BIN/bench --recipe "$TMP/r.yaml" -m "$TMP/conv.safetensors" --no-oracle --out "$TMP/b0" >/dev/null 2>&1
        $BIN/bench --recipe "$TMP/r.yaml" -m "$src" --no-oracle --out "$TMP/b1" >/dev/null 2>"$TMP/err"
        check "bench -m $src: exit 0 ($(tail -n 1 "$TMP/err"))" test $? = 0
        check "bench -m $src: the converted file's token counts and parity ($(counts "$TMP/b1" | tail -n 1))" \
            test -n "$(counts "$TMP/b0")" -a "$(counts "$TMP/b0")" = "$(counts "$TMP/b1")"
        note "$TMP/err" bench "$src"
        TRAIN="--data $TMP/small.txt --steps 1 --batch 2 --seq-len 32"
        $BIN/distill-heads -m "$src" --layers 2 $TRAIN -o "$TMP/eh.safetensors" >/dev/null 2>"$TMP/err"
        check "distill-heads -m $src: exit 0 and heads written ($(tail -n 1 "$TMP/err"))" test $? = 0 -a -s "$TMP/eh.safetensors"
        note "$TMP/err" distill-heads "$src"
        # heads trained on the imported model carry its digest: the converted file takes them
        out=$($BIN/decode -m "$TMP/conv.safetensors" --method adadecode --heads "$TMP/eh.safetensors" \
            -p "Once upon a time" -n 40 --temp 0 2>"$TMP/err2")
        check "heads of the imported model on the converted file: standard's text ($(tail -n 1 "$TMP/err2"))" \
            test "$out" = "$want"
        $BIN/train-medusa -m "$src" --heads 1 $TRAIN -o "$TMP/mh.safetensors" >/dev/null 2>"$TMP/err"
        check "train-medusa -m $src: exit 0 and heads written ($(tail -n 1 "$TMP/err"))" test $? = 0 -a -s "$TMP/mh.safetensors"
        note "$TMP/err" train-medusa "$src"
    fi
done
# ---- block types: a Q8_0 copy (gguf-py's quantizer; ffn_down's 172-wide rows stay F32)
# and one whose v_proj is Q4_0 beside Q8_0 q/k (as llama.cpp's Q4_K_M mixes types in one
# layer): -m on the GGUF keeps the blocks as convert does, so both give the converted
# file's text; a layer mixing a float type with blocks in q/k/v is refused by name ----
if "$PY" -c "import gguf, numpy" 2>/dev/null; then
    "$PY" tests/ref/gguf_with_vocab.py "$TMP/s.gguf" "$S/tok512.bin" "$TMP/q8.gguf" "attn=Q8_0,ffn=Q8_0,token_embd=Q8_0"
    "$PY" tests/ref/gguf_with_vocab.py "$TMP/s.gguf" "$S/tok512.bin" "$TMP/mix.gguf" "attn_q=Q8_0,attn_k=Q8_0,attn_v=Q4_0"
    "$PY" tests/ref/gguf_with_vocab.py "$TMP/s.gguf" "$S/tok512.bin" "$TMP/fmix.gguf" "attn_q=Q8_0,attn_k=Q8_0"
    for g in q8 mix; do
        $BIN/convert "$TMP/$g.gguf" -o "$TMP/$g.safetensors" 2>/dev/null
        check "$g: the converted file keeps block types" grep -aq '"paradec.quant"' "$TMP/$g.safetensors"
        want=$(story "$TMP/$g.safetensors")
        got=$(story "$TMP/$g.gguf")
        case "$got" in "Once upon a time, there was a little girl"*) ok ;; *) bad "$g stories260K: $got" ;; esac
        check "decode -m $g.gguf: the converted file's text (got: $got / want: $want)" test "$got" = "$want"
    done
    $BIN/convert "$TMP/fmix.gguf" -o "$TMP/fmix.safetensors" 2>/dev/null
    refuses "decode a model whose q/k/v mix F32 and blocks" "" $BIN/decode -m "$TMP/fmix.safetensors" -p x -n 1
    grep -q "q_proj, k_proj, v_proj are Q8_0, Q8_0, F32" "$TMP/stderr" && ok || bad "float beside blocks: $(cat "$TMP/stderr")"
fi
check "nothing left in /dev/shm or \$TMPDIR ($(ls /dev/shm/paradec-import-* "$TMPDIR" 2>/dev/null | tr '\n' ' '))" \
    test "$(leftovers)" = "$shm0"

# ---- bad sources: one line, non-zero exit ----
refuses "decode -m a missing path" "" $BIN/decode -m "$TMP/nope.gguf" -p x -n 1
mkdir "$TMP/empty"
refuses "decode -m an empty directory" "" $BIN/decode -m "$TMP/empty" -p x -n 1
grep -q "without config.json" "$TMP/stderr" && ok || bad "empty directory: $(cat "$TMP/stderr")"
printf 'GGUF\003\000\000\000' >"$TMP/cut.gguf"
refuses "decode -m a truncated GGUF" "" $BIN/decode -m "$TMP/cut.gguf" -p x -n 1
if "$PY" -c "import gguf" 2>/dev/null; then
    "$PY" -c "
import gguf, numpy as np
w = gguf.GGUFWriter('$TMP/notmodel.gguf', 'llama')
w.add_tensor('foo', np.zeros((4, 4), dtype=np.float32))
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()"
    refuses "decode -m a GGUF that is no model" "" $BIN/decode -m "$TMP/notmodel.gguf" -p x -n 1
    refuses "bench -m a GGUF that is no model" "" $BIN/bench --recipe "$TMP/r.yaml" -m "$TMP/notmodel.gguf" --out "$TMP/b2"
    refuses "verifycost -m a GGUF that is no model" "" $BIN/verifycost -m "$TMP/notmodel.gguf"
fi
cp -r "$TMP/hf" "$TMP/hf-notok" && rm "$TMP/hf-notok/tokenizer.bin"
refuses "decode -m an HF directory without a tokenizer" "" $BIN/decode -m "$TMP/hf-notok" -p x -n 1
check "nothing left after the refusals" test "$(leftovers)" = "$shm0"

# ---- SmolLM2-135M-Instruct's own Q4_1 GGUF ----
G=$C/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f "$G" ]; then
    echo "SKIP model_open: SmolLM2: $G is missing (make models fetches it)"
else
    $BIN/convert "$G" -o "$TMP/smol.safetensors" 2>/dev/null
    ask() { $BIN/decode -m "$1" -p "What is the capital of France?" -n 24 --chat --temp 0 2>"$TMP/err"; }
    check "SmolLM2: the converted file keeps its Q4_1 blocks" grep -aq '"paradec.quant"' "$TMP/smol.safetensors"
    want=$(ask "$TMP/smol.safetensors")
    got=$(ask "$G")
    case "$got" in *Paris*) ok ;; *) bad "SmolLM2 -m GGUF: capital of France: $got" ;; esac
    check "SmolLM2 -m GGUF: the converted file's text (got: $got / want: $want)" test "$got" = "$want"
    note "$TMP/err" decode "$G"
    check "SmolLM2: nothing left behind" test "$(leftovers)" = "$shm0"
fi
finish model_open
