# test_serve_openai — bin/serve through the official openai Python client, pinned in the
# test venv ($PARADEC_CACHE/venv, make models): tests/serve_openai.py checks every request
# field of issue 21 point 3 it can ask for (n, logprobs, echo, prompt arrays and token
# ids, the developer role, multi-part content, max_tokens 0, include_usage, refusals),
# logprobs against numpy's log-softmax of bin/decode --dump-logits, and every lossless
# method's logprobs against standard's. Without the venv or the client (offline) it
# skips, and says so.
. tests/lib.sh
PY=${PARADEC_CACHE:-$HOME/.cache/paradec}/venv/bin/python
if ! [ -x "$PY" ] || ! "$PY" -c "import openai, numpy" 2>/dev/null; then
    echo "test_serve_openai: skipped: no openai client in $PY (make models installs it; offline?)"
    finish test_serve_openai
    exit 0
fi
B=$TMP/bundle.safetensors.zst
EH=$BUILD/test-heads.safetensors.zst MH=$BUILD/test-medusa.safetensors.zst
METHODS="prompt-lookup lookahead speculative"
if [ -f "$EH" ] && [ -f "$MH" ]; then
    $BIN/pack -m "$MODEL" "$EH" "$MH" -o "$B" 2>/dev/null
    METHODS="$METHODS adadecode self-speculative medusa"
else
    echo "test_serve_openai: no trained test heads in $BUILD (make test builds them): head methods not checked"
    cp "$MODEL" "$B"
fi
$BIN/serve -m "$B" --port 0 --parallel 4 --chat-format chatml --draft "$MODEL" 2>"$TMP/log" &
SPID=$!
for _ in $(seq 100); do
    PORT=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$TMP/log")
    [ -n "$PORT" ] && break
    sleep 0.1
done
if [ -z "$PORT" ]; then echo "server did not start:"; cat "$TMP/log"; kill $SPID; bad "the server starts"; finish test_serve_openai; exit 1; fi
TOK=$(data models/stories260K/tok512.bin)
[ -f "$TOK" ] || TOK=
# the client's own line ("serve_openai: N passed, N failed") is the summary; its failures are ours
TOKENIZER=$TOK timeout 600 "$PY" tests/serve_openai.py "$PORT" "$MODEL" "$BIN" "$TMP" $METHODS
rc=$?
kill -TERM $SPID
wait $SPID
[ $rc = 0 ]
