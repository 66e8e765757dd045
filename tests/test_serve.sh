# test_serve — bin/serve with a real client (curl) on loopback (issue 9, points 1-4):
# greedy answers equal bin/decode's, alone, among 16 concurrent others and through every
# method; streaming gives the same text; a client that leaves mid-stream gets its KV
# blocks back; a pool too small for all requests queues them without loss; bad
# requests get 400/404/405/413 and the server keeps serving after each.
. tests/lib.sh
for t in curl jq; do command -v $t >/dev/null || { echo "test_serve: $t is missing (scripts/setup.sh installs it)"; finish test_serve; exit 1; }; done
. tests/serve_lib.sh
METHODS="prompt-lookup lookahead"
bundle test_serve

post() { curl -s -m 120 "http://127.0.0.1:$PORT$1" -d "$2"; }
bg() { "$@" & PIDS="$PIDS $!"; }           # requests in flight together; `wait $PIDS` ends them
together() { wait $PIDS; PIDS=""; }        # (a bare wait would wait for the server too)
code() { curl -s -m 30 -o "$TMP/body" -w "%{http_code}" "$@"; }
metric() { curl -s "http://127.0.0.1:$PORT/metrics" | sed -n "s/^paradec_$1 //p"; }
json_str() { jq -Rs . ; } # stdin as a JSON string

# the prompts and what bin/decode says after each (standard, greedy)
cat >"$TMP/prompts" <<'EOF'
Once upon a time
Tom and Lily went to the park
The little dog was sad because
One day, a big bird
Sara had a red ball. She
The sun was hot and
Ben wanted to play with his toy car
There was a girl who loved to sing
Mom said it was time for bed
The cat saw a fish in the pond
A small boy found a shiny rock
It was a rainy day and
Max the bear was hungry
The princess looked at the stars
Lucy and her friend built a sandcastle
Grandpa told a story about
Once there was a tiny mouse
EOF
N=200
i=0
while read -r p; do
    i=$((i + 1))
    $BIN/decode -m "$MODEL" -p "$p" -n $N --temp 0 --json 2>/dev/null | jq -r .text >"$TMP/want.$i"
    printf '{"prompt": %s, "max_tokens": %d, "temperature": 0}' "$(printf %s "$p" | json_str)" $N >"$TMP/req.$i"
done <"$TMP/prompts"
NP=$i

start "$TMP/log" --parallel 16 --chat-format chatml || { finish test_serve; exit 1; }
check "/health answers ok" sh -c "curl -s http://127.0.0.1:$PORT/health | grep -q '\"ok\"'"

# alone, one after another
fails=0
for i in $(seq $NP); do
    post /v1/completions "@$TMP/req.$i" | jq -r '.choices[0].text' >"$TMP/got.$i"
    cmp -s "$TMP/got.$i" "$TMP/want.$i" || { fails=$((fails + 1)); echo "alone $i: '$(cat "$TMP/got.$i")' != '$(cat "$TMP/want.$i")'"; }
done
check "greedy answers alone = bin/decode's ($NP prompts, $fails differ)" [ $fails = 0 ]

# all at once: 17 requests share the batch
steps0=$(metric steps_total) gen0=$(metric generated_tokens_total)
for i in $(seq $NP); do bg sh -c "curl -s -m 120 http://127.0.0.1:$PORT/v1/completions -d @$TMP/req.$i >$TMP/conc.$i"; done
together
fails=0
for i in $(seq $NP); do
    jq -r '.choices[0].text' "$TMP/conc.$i" >"$TMP/got.$i"
    cmp -s "$TMP/got.$i" "$TMP/want.$i" || fails=$((fails + 1))
done
check "greedy answers among 16 concurrent others = alone ($fails of $NP differ)" [ $fails = 0 ]
steps=$(($(metric steps_total) - steps0)) gen=$(($(metric generated_tokens_total) - gen0))
check "the concurrent requests shared steps ($gen tokens in $steps steps)" [ $((steps * 2)) -lt $gen ]
check "the usage counts the tokens" [ "$(jq .usage.completion_tokens "$TMP/conc.1")" = $N ]

# every method: alone, and four and two at once (the drafters' rounds share each step's
# forward call, AdaDecode's take turns beside it)
for m in $METHODS; do
    before=$(metric method_tokens_total) again=$(metric method_prefill_tokens_total)
    jq ".method = \"$m\"" "$TMP/req.1" >"$TMP/mreq"
    post /v1/completions "@$TMP/mreq" | jq -r '.choices[0].text' >"$TMP/got"
    check "method $m alone = standard" cmp -s "$TMP/got" "$TMP/want.1"
    check "method $m alone decoded with the method" [ "$(metric method_tokens_total)" -gt "$before" ]
    before=$(metric method_tokens_total)
    for i in 2 3 4 5; do
        jq ".method = \"$m\"" "$TMP/req.$i" >"$TMP/mreq.$i"
        bg sh -c "curl -s -m 120 http://127.0.0.1:$PORT/v1/completions -d @$TMP/mreq.$i >$TMP/conc.$i"
    done
    together
    fails=0
    for i in 2 3 4 5; do jq -r '.choices[0].text' "$TMP/conc.$i" | cmp -s - "$TMP/want.$i" || fails=$((fails + 1)); done
    check "method $m, four at once = standard ($fails differ)" [ $fails = 0 ]
    check "method $m, four at once decoded with the method" [ "$(metric method_tokens_total)" -gt "$before" ]
    for i in 6 7; do
        jq ".method = \"$m\"" "$TMP/req.$i" >"$TMP/mreq.$i"
        bg sh -c "curl -s -m 120 http://127.0.0.1:$PORT/v1/completions -d @$TMP/mreq.$i >$TMP/conc.$i"
    done
    together
    fails=0
    for i in 6 7; do jq -r '.choices[0].text' "$TMP/conc.$i" | cmp -s - "$TMP/want.$i" || fails=$((fails + 1)); done
    check "method $m, two at once = standard ($fails differ)" [ $fails = 0 ]
    # EAGLE's head reads the prompt's states: its standard steps kept them for it
    [ $m = eagle ] && check "method eagle: its starts ran no token again" [ "$(metric method_prefill_tokens_total)" = "$again" ]
done
drafted=$(metric spec_draft_tokens_total) kept=$(metric spec_accepted_tokens_total)
check "the methods drafted $drafted tokens and $kept were kept" [ "$kept" -gt 0 -a "$drafted" -gt "$kept" ]

# sampling: a seeded request says the same alone and in company
S='{"prompt": "Once upon a time", "max_tokens": 40, "temperature": 0.9, "top_p": 0.95, "seed": 7}'
post /v1/completions "$S" | jq -r '.choices[0].text' >"$TMP/s1"
for i in 2 3 4 5 6; do bg sh -c "curl -s -m 120 http://127.0.0.1:$PORT/v1/completions -d @$TMP/req.$i >/dev/null"; done
post /v1/completions "$S" | jq -r '.choices[0].text' >"$TMP/s2"
together
check "a seeded sampled answer is the same alone and among others" cmp -s "$TMP/s1" "$TMP/s2"
check "a sampled answer differs from the greedy one" sh -c "! cmp -s $TMP/s1 $TMP/want.1"

# streaming: the events' text = the whole answer; chat streams open with the role
jq '.stream = true' "$TMP/req.1" >"$TMP/sreq"
curl -sN -m 60 "http://127.0.0.1:$PORT/v1/completions" -d "@$TMP/sreq" >"$TMP/sse"
sed -n 's/^data: {/{/p' "$TMP/sse" | jq -j '.choices[0].text' >"$TMP/got"
check "stream: the events' text = the answer" sh -c "printf '%s\n' \"\$(cat $TMP/got)\" | cmp -s - $TMP/want.1"
check "stream: ends with a finish_reason and [DONE]" sh -c "tail -n 2 $TMP/sse | grep -q '^data: \[DONE\]' && grep -q '\"finish_reason\":\"length\"' $TMP/sse"
C='{"messages": [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Tell a story."}], "max_tokens": 12, "temperature": 0}'
post /v1/chat/completions "$C" >"$TMP/chat"
check "chat: an assistant message" sh -c "jq -e '.object == \"chat.completion\" and .choices[0].message.role == \"assistant\" and (.choices[0].message.content | length) > 0' $TMP/chat >/dev/null"
curl -sN -m 60 "http://127.0.0.1:$PORT/v1/chat/completions" -d "$(echo "$C" | jq '.stream = true')" >"$TMP/csse"
check "chat stream: the first delta carries the role, the rest the same text" sh -c "
    sed -n 's/^data: {/{/p' $TMP/csse | head -n 1 | jq -e '.choices[0].delta.role == \"assistant\"' >/dev/null &&
    [ \"\$(sed -n 's/^data: {/{/p' $TMP/csse | jq -j '.choices[0].delta.content // empty')\" = \"\$(jq -j '.choices[0].message.content' $TMP/chat)\" ]"
post /v1/completions '{"prompt": "Once upon a time", "max_tokens": 40, "temperature": 0, "stop": [" named"]}' >"$TMP/stop"
check "a stop string: usage counts the tokens up to it ($(jq .usage.completion_tokens "$TMP/stop"))" \
    [ "$(jq .usage.completion_tokens "$TMP/stop")" -lt 20 ]
check "a stop string ends the answer before it" sh -c "[ \"\$(jq -r '.choices[0].text' $TMP/stop)\" = \"\$(sed 's/ named.*//' $TMP/want.1 | head -n 1)\" ] && jq -e '.choices[0].finish_reason == \"stop\"' $TMP/stop >/dev/null"

curl -sN -m 60 "http://127.0.0.1:$PORT/v1/completions" -d '{"prompt": "Once upon a time", "max_tokens": 40, "temperature": 0, "stop": [" named"], "stream": true}' |
    sed -n 's/^data: {/{/p' | jq -j '.choices[0].text' >"$TMP/sstop"
check "a stop string ends a stream there too (the text that might start it is held back)" sh -c "[ \"\$(cat $TMP/sstop)\" = \"\$(jq -r '.choices[0].text' $TMP/stop)\" ]"

# a client that leaves mid-stream: its request stops and its blocks come back
gen0=$(metric generated_tokens_total)
curl -sN -m 60 "http://127.0.0.1:$PORT/v1/completions" -d '{"prompt": "Once upon a time", "max_tokens": 100000, "temperature": 0.8, "seed": 3, "stream": true}' | head -c 400 >/dev/null
for _ in $(seq 50); do [ "$(metric requests_running)" = 0 ] && break; sleep 0.1; done
check "a client that left: nothing runs, every KV block is free" [ "$(metric kv_blocks_used)" = 0 ] && [ "$(metric requests_running)" = 0 ]
check "a client that left: its request stopped before the context's end" [ $(($(metric generated_tokens_total) - gen0)) -lt 500 ]

# bad requests, and the server keeps serving after each
URL=http://127.0.0.1:$PORT
serving() { # after a bad request: still answering, and right
    [ "$(curl -s -m 60 "$URL/v1/completions" -d "@$TMP/req.3" | jq -r '.choices[0].text')" = "$(cat "$TMP/want.3")" ]
}
refused() { # refused DESCRIPTION STATUS MESSAGE CURL-ARGS...
    d=$1 st=$2 msg=$3; shift 3
    got=$(code "$@")
    check "$d: $st (got $got)" [ "$got" = "$st" ]
    check "$d: the message says '$msg'" grep -q "$msg" "$TMP/body"
    check "$d: the server serves on" serving
}
long=$(yes "the cat sat on the mat and" | head -n 200 | tr '\n' ' ')
head -c 2000000 /dev/zero | tr '\0' ' ' >"$TMP/big"
refused "malformed JSON" 400 'malformed JSON at line 1' "$URL/v1/completions" -d '{"prompt": '
refused "a wrongly typed field" 400 "'prompt' must be a string" "$URL/v1/completions" -d '{"prompt": 3}'
refused "a prompt over the context" 400 'the context holds' "$URL/v1/completions" -d "{\"prompt\": \"$long\"}"
refused "an unknown method" 400 'known: standard' "$URL/v1/completions" -d '{"prompt": "a", "method": "telepathy"}'
refused "a wrong path" 404 'no such path' "$URL/v2/nothing" -d '{}'
refused "GET on a POST path" 405 'use POST' "$URL/v1/completions"
refused "an oversized body" 413 'too large' "$URL/v1/completions" --data-binary "@$TMP/big"
check "metrics: Prometheus text with the counters" sh -c "curl -s $URL/metrics | grep -q '^# TYPE paradec_kv_blocks_free gauge' && curl -s $URL/metrics | grep -q '^paradec_tokens_per_second '"
kill -TERM $SPID
wait $SPID
check "SIGTERM stops the server cleanly" [ $? = 0 ]

# a pool that holds one request at a time: the others wait in the queue, none is lost
start "$TMP/log2" --parallel 4 --kv-blocks 16 --no-speculation || { finish test_serve; exit 1; }
for i in 1 2 3 4; do bg sh -c "curl -s -m 120 http://127.0.0.1:$PORT/v1/completions -d @$TMP/req.$i >$TMP/q.$i"; done
together
fails=0
for i in 1 2 3 4; do jq -r '.choices[0].text' "$TMP/q.$i" | cmp -s - "$TMP/want.$i" || fails=$((fails + 1)); done
check "a small pool: all four answers complete and right ($fails differ)" [ $fails = 0 ]
check "a small pool: requests waited in the queue ($(metric requests_waited_total) of 4)" [ "$(metric requests_waited_total)" -ge 1 ]
check "a request larger than the pool: 400" [ "$(code "http://127.0.0.1:$PORT/v1/completions" -d '{"prompt": "a", "max_tokens": 300}')" = 400 ]
check "a model without a chat template: chat is refused with 400" [ "$(code "http://127.0.0.1:$PORT/v1/chat/completions" -d "$C")" = 400 ]
kill -TERM $SPID
wait $SPID

# a bounded queue: past --max-queue a request gets 503 with Retry-After, and the ones
# queued before it are answered in full (stories260K widened to the tiny preset, one
# thread: the same text at ~20x the cost, so the first request is still running)
W=$TMP/wide.safetensors.zst
$BIN/widen -m "$MODEL" --preset tiny -o "$W" 2>/dev/null
$BIN/serve -m "$W" --port 0 --parallel 1 --max-queue 2 -t 1 2>"$TMP/log3" &
SPID=$!
for _ in $(seq 100); do PORT=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$TMP/log3"); [ -n "$PORT" ] && break; sleep 0.1; done
for i in 1 2 3; do
    jq '.max_tokens = 400' "$TMP/req.$i" >"$TMP/long.$i"
    $BIN/decode -m "$MODEL" -p "$(jq -r .prompt "$TMP/req.$i")" -n 400 --temp 0 --json 2>/dev/null | jq -r .text >"$TMP/lwant.$i"
done
# one at a time, each seen in place before the next: sent together on a loaded machine,
# they can reach the server after the fourth, which then queues while one of them is refused
until_metric() { for _ in $(seq 600); do [ "$(metric $1)" = $2 ] && return; sleep 0.05; done; }
for i in 1 2 3; do
    bg sh -c "curl -s -m 300 http://127.0.0.1:$PORT/v1/completions -d @$TMP/long.$i >$TMP/q.$i"
    if [ $i = 1 ]; then until_metric requests_running 1; else until_metric requests_queued $((i - 1)); fi
done
check "a full queue: 503" [ "$(curl -s -m 30 -o "$TMP/body" -D "$TMP/head" -w "%{http_code}" "http://127.0.0.1:$PORT/v1/completions" -d @$TMP/req.4)" = 503 ]
check "a full queue: Retry-After, and a JSON error naming the queue" \
    sh -c "grep -qi '^Retry-After: 1' $TMP/head && jq -e '.error.message | test(\"wait already\")' $TMP/body >/dev/null"
together
fails=0
for i in 1 2 3; do jq -r '.choices[0].text' "$TMP/q.$i" | cmp -s - "$TMP/lwant.$i" || fails=$((fails + 1)); done
check "a full queue: the queued requests answered right ($fails differ)" [ $fails = 0 ]
check "a full queue: counted ($(metric requests_rejected_total))" [ "$(metric requests_rejected_total)" = 1 ]
kill -TERM $SPID
wait $SPID
finish test_serve
