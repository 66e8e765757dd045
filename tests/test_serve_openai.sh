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
. tests/serve_lib.sh
METHODS="prompt-lookup lookahead speculative"
bundle test_serve_openai
start "$TMP/log" --parallel 4 --chat-format chatml --draft "$MODEL" --alias paradec-test --api-key sekret || { kill $SPID; bad "the server starts"; finish test_serve_openai; exit 1; }
TOK=$(data models/stories260K/tok512.bin)
[ -f "$TOK" ] || TOK=
# the client's own line ("serve_openai: N passed, N failed") is the summary; its failures are ours
TOKENIZER=$TOK timeout 600 "$PY" tests/serve_openai.py "$PORT" "$MODEL" "$BIN" "$TMP" $METHODS
rc=$?
kill -TERM $SPID
wait $SPID
[ $rc = 0 ]
