# test_perplexity_tool — bin/perplexity on stories260K: llama-perplexity's protocol
# (chunks of CTX tokens, BOS first in each, the second half scored), its NLL against one
# recomputed by numpy from the logits it dumps, and bad input refused with one line.
. tests/lib.sh
P=$BIN/perplexity
need "held-out text" datasets/tinystories/tinystories_val_sample.txt.gz || { finish perplexity_tool; exit 0; }
gzip -dc "$(data datasets/tinystories/tinystories_val_sample.txt.gz)" | head -c 20000 >"$TMP/text.txt"
out=$($P -m "$MODEL" -f "$TMP/text.txt" -c 64 --chunks 5 --logits "$TMP/l.bin" 2>"$TMP/log")
check "runs ($(tail -n 1 "$TMP/log"))" test $? = 0
check "5 chunks of 64 score 5 × 31 tokens ($out)" sh -c "echo '$out' | grep -q '\"tokens_scored\":155,\"chunks\":5,\"ctx\":64'"
ppl=$(echo "$out" | sed -n 's/.*"ppl":\([0-9.]*\).*/\1/p')
check "a story model is far better than uniform over 512 pieces (ppl $ppl)" awk "BEGIN{exit !($ppl > 1 && $ppl < 30)}"
PY=${PARADEC_CACHE:-$HOME/.cache/paradec}/venv/bin/python
if [ -x "$PY" ]; then
    nll=$(echo "$out" | sed -n 's/.*"nll":\([0-9.]*\).*/\1/p')
    ref=$("$PY" -c "
import numpy as np, sys
raw = open('$TMP/l.bin', 'rb').read()
assert raw[:8] == b'PDLOGITS'
ctx, vocab, chunks, first = np.frombuffer(raw[8:24], np.int32)
tok = np.frombuffer(raw[24:24 + 4 * chunks * ctx], np.int32).reshape(chunks, ctx)
lg = np.frombuffer(raw[24 + 4 * chunks * ctx:], np.float32).reshape(chunks, ctx - 1 - first, vocab).astype(np.float64)
assert (tok[:, 0] == 1).all()  # BOS first in every chunk
z = lg - lg.max(axis=2, keepdims=True)
lp = z - np.log(np.exp(z).sum(axis=2, keepdims=True))
t = tok[:, first + 1:]
print('%.6f' % -np.take_along_axis(lp, t[:, :, None], 2).mean())
")
    check "NLL $nll = numpy's from the dumped logits ($ref)" test -n "$ref" -a "$nll" = "$ref"
else
    echo "SKIP perplexity_tool: the NLL cross-check needs the reference venv (make models)"
fi
head -c 60 "$TMP/text.txt" >"$TMP/short.txt"
refuses "a text shorter than two chunks" "$TMP/no.bin" $P -m "$MODEL" -f "$TMP/short.txt" -c 64 --logits "$TMP/no.bin"
refuses "a missing text" "" $P -m "$MODEL" -f "$TMP/none.txt"
refuses "-c past the model's context" "" $P -m "$MODEL" -f "$TMP/text.txt" -c 100000
finish perplexity_tool
