# test_smollm2 — the real SmolLM2-135M-Instruct (make models fetches it) against
# independent references: llama.cpp's own Python package and numpy for the logits,
# Hugging Face's tokenizers for the tokenizer; and chat answers that make sense.
# Skips (and says so) when the model or the reference venv is not there.
. tests/lib.sh
C=${PARADEC_CACHE:-$HOME/.cache/paradec}
G=$C/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
PY=$C/venv/bin/python
if [ ! -f "$G" ] || ! "$PY" -c "import numpy, gguf, tokenizers" 2>/dev/null; then
    echo "SKIP smollm2: $G or the reference venv is missing (make models fetches both)"
    finish smollm2
    exit 0
fi
M=$BUILD/smollm2.safetensors MQ=$TMP/smollm2-q4_1.safetensors
[ "$M" -nt "$BIN/convert" ] || $BIN/convert "$G" --dtype f32 -o "$M" 2>/dev/null
check "convert SmolLM2's Q4_1 GGUF to f32" test -f "$M"
$BIN/convert "$G" -o "$MQ" 2>/dev/null
check "convert SmolLM2's Q4_1 GGUF keeping its blocks" grep -aq '"paradec.quant"' "$MQ"

# logits of a fixed prompt against numpy float64 on gguf-py's dequantised weights
ids=$(printf "The capital of France is" | $BIN/tokenize --tokenizer "$G")
"$PY" tests/ref/smollm2_logits.py "$G" "$TMP/ref.f32" $ids
$BIN/decode -m "$M" -p "The capital of France is" -n 1 --dump-logits "$TMP/ours.f32" 2>/dev/null
check "logits within 1e-4 of the reference (relative to the largest)" "$PY" -c "
import numpy as np, sys
a = np.fromfile('$TMP/ref.f32', np.float32).astype(float); b = np.fromfile('$TMP/ours.f32', np.float32).astype(float)
rel = abs(a - b).max() / abs(a).max() if len(a) == len(b) == 49152 else 1
print('smollm2 logits: max relative difference %.2e, argmax %d / %d' % (rel, a.argmax(), b.argmax()))
sys.exit(not (rel < 1e-4 and a.argmax() == b.argmax()))"
# the Q4_1 blocks run as they are, x quantized to 8 bits: the same next token, a small KL
$BIN/decode -m "$MQ" -p "The capital of France is" -n 1 --dump-logits "$TMP/q.f32" 2>/dev/null
check "Q4_1 kept: the reference's next token, KL < 0.01" "$PY" -c "
import numpy as np, sys
a = np.fromfile('$TMP/ref.f32', np.float32).astype(float); b = np.fromfile('$TMP/q.f32', np.float32).astype(float)
if len(a) != len(b): sys.exit(1)
la, lb = a - a.max() - np.log(np.exp(a - a.max()).sum()), b - b.max() - np.log(np.exp(b - b.max()).sum())
kl = (np.exp(la) * (la - lb)).sum()
print('smollm2 Q4_1: KL %.2e, argmax %d / %d' % (kl, a.argmax(), b.argmax()))
sys.exit(not (kl < 0.01 and a.argmax() == b.argmax()))"
# the CUDA kernels on the file's Q4_1 blocks (cuemu): the CPU's logits bit for bit (not under
# ASan, where the emulation is ~50x slower: test_cuemu_ops has the kernels)
if [ -z "${PARADEC_SAN:-}" ]; then
    $BIN/decode -m "$MQ" -p "The capital of France is" -n 1 -d cuemu --dump-logits "$TMP/qe.f32" 2>/dev/null
    check "Q4_1 kept, on cuemu: the CPU's logits, bit for bit" sh -c "test -s '$TMP/q.f32' && cmp -s '$TMP/q.f32' '$TMP/qe.f32'"
fi

# the tokenizer against Hugging Face tokenizers on llama.cpp's strings and the datasets
check "tokenizer agrees with HF tokenizers" "$PY" tests/ref/smollm2_tokenizer.py --gguf "$G" --tool "$BIN/tokenize"

# greedy chat answers (ChatML from the model's own template) from the Q4_1 file as kept
ask() { $BIN/decode -m "$MQ" -p "$1" -n 60 --chat --temp 0 2>/dev/null; }
a=$(ask "What is the capital of France?")
case "$a" in *Paris*) ok ;; *) bad "capital of France: $a" ;; esac
a=$(ask "Name three colors.")
n=0; for c in red blue green yellow black white orange purple pink; do echo "$a" | grep -qi "\b$c\b" && n=$((n + 1)); done
check "three colours named ($a)" test "$n" -ge 3
a=$(ask "Write one sentence about the sea.")
words=$(echo "$a" | wc -w)
check "a sentence about the sea ($a)" sh -c "echo '$a' | grep -qi sea && test $words -ge 6"
finish smollm2
