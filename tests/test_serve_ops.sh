# test_serve_ops — bin/serve's operations (issue 21): half-open connections past
# --max-connections and past FD_SETSIZE leave the server answering, --timeout frees their
# slots but never cuts an answer being made, 503 when every connection is busy;
# /v1/models and --alias; ids unique across restarts; SIGTERM's grace (open streams end
# with a last chunk and [DONE], exit 0); the access log and libmicrohttpd's messages;
# --api-key; CORS; IPv6; the port in "address in use"; --ctx-size past the model's context
# refused; the latency and TTFT histograms; the llama.cpp-style CLI. Loopback only, every
# load bounded in count and time.
. tests/lib.sh
. tests/serve_lib.sh # reap (its start is replaced below)
for t in curl jq python3; do command -v $t >/dev/null || { echo "test_serve_ops: $t is missing (scripts/setup.sh installs it)"; finish test_serve_ops; exit 1; }; done
# requests that last: stories260K widened to the 110m preset in bf16 (same text, ~15 ms
# a token on one thread, so 200 tokens outlast --timeout 1 and a second request)
W=$TMP/wide.safetensors
$BIN/widen -m "$MODEL" --preset 110m --dtype bf16 -o "$W" 2>/dev/null || { echo "test_serve_ops: widen failed"; finish test_serve_ops; exit 1; }

start() { # start LOG MODEL ARGS... : a server on a free port; sets PORT, URL, SPID
    log=$1 m=$2; shift 2
    $BIN/serve -m "$m" --port 0 "$@" 2>"$log" &
    SPID=$!
    for _ in $(seq 100); do
        HP=$(sed -n 's/^serve: listening on http:\/\/\([^ ]*\) .*/\1/p' "$log")
        [ -n "$HP" ] && { PORT=${HP##*:} URL=http://$HP; return 0; }
        kill -0 $SPID 2>/dev/null || break
        sleep 0.1
    done
    echo "server did not start:"; cat "$log"; return 1
}
stop() { kill -"${1:-TERM}" $SPID; reap; } # stop [SIGNAL]: the server's exit status
srv() { timeout 20 $BIN/serve "$@"; } # a server that should refuse to start, and might not
code() { curl -s -m 30 -o "$TMP/body" -D "$TMP/head" -w "%{http_code}" "$@"; } # body and headers kept
header() { tr -d '\r' <"$TMP/head" | sed -n "s/^$1: //Ip"; }                    # header NAME (of the last code)
metric() { v=$(curl -s -m 10 "$URL/metrics" | sed -n "s/^paradec_$1 //p"); echo "${v:--1}"; } # -1: no answer
hold() { # hold N T1 T2 ... : N connections that send half a request line and hold; at Ti s
    # after the last one opened (or, for @FILE, once FILE exists), a line "Ti CLOSED": how
    # many the server has closed
    python3 - "$PORT" "$@" <<'EOF'
import os, socket, sys, time, resource
port, n = int(sys.argv[1]), int(sys.argv[2])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
if soft < n + 64:
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, n + 64), hard))
socks = []
for i in range(n):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le")
    s.setblocking(False)
    socks.append(s)
print("opened", len(socks), flush=True)
t0, closed = time.time(), set()
for t in sys.argv[3:]:
    if t[0] == "@":
        while not os.path.exists(t[1:]): time.sleep(0.05)
    else:
        t = float(t)
        time.sleep(max(0, t0 + t - time.time()))
    for i, s in enumerate(socks):
        if i in closed: continue
        try:
            if s.recv(1) == b"": closed.add(i)
        except BlockingIOError: pass
        except OSError: closed.add(i)
    print(t, len(closed), flush=True)
EOF
}
jqe() { jq -e "$@" >/dev/null; } # a jq condition holds
wait_line() { # wait_line FILE PATTERN: up to 20 s
    for _ in $(seq 200); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
    return 1
}

P='Once upon a time'
WANT=$($BIN/decode -m "$MODEL" -p "$P" -n 20 --temp 0 --json 2>/dev/null | jq -r .text)
REQ='{"prompt": "Once upon a time", "max_tokens": 20, "temperature": 0}'
$BIN/decode -m "$MODEL" -p "$P" -n 500 --temp 0 --json 2>/dev/null | jq -j .text >"$TMP/want500"

# ---- the CLI ----
refuses "an unknown flag" "" srv -m "$MODEL" --bogus
check "an unknown flag: the line names it ($(cat "$TMP/stderr"))" grep -q -- "^serve: --bogus: unknown flag (serve --help lists the flags)$" "$TMP/stderr"
refuses "an unexpected argument" "" srv -m "$MODEL" stray
check "an unexpected argument: the line names it ($(cat "$TMP/stderr"))" grep -q -- "^serve: stray: unexpected argument" "$TMP/stderr"
refuses "-np 0" "" srv -m "$MODEL" -np 0
check "-np 0: the line names -np and the range ($(cat "$TMP/stderr"))" grep -q -- "-np: '0' is not a whole number in \[1, 256\]" "$TMP/stderr"
refuses "-to 0" "" srv -m "$MODEL" -to 0
check "-to 0: the line names -to and the range ($(cat "$TMP/stderr"))" grep -q -- "-to: '0' is not a whole number in \[1, 86400\]" "$TMP/stderr"
refuses "--no-speculation with --spec-max-batch 2" "" srv -m "$MODEL" --no-speculation --spec-max-batch 2
check "--no-speculation with --spec-max-batch 2: the line names both" grep -q -- "--no-speculation: --spec-max-batch 2" "$TMP/stderr"
refuses "a flag without its value" "" srv -m "$MODEL" -c
refuses "no model" "" srv --port 0
check "no model: the line names -m" grep -q -- "-m MODEL" "$TMP/stderr"
refuses "--max-connections 0" "" srv -m "$MODEL" --max-connections 0
refuses "--timeout 0" "" srv -m "$MODEL" --timeout 0
refuses "--shutdown-grace -1" "" srv -m "$MODEL" --shutdown-grace -1
refuses "--port 70000" "" srv -m "$MODEL" --port 70000
refuses "an empty --api-key" "" srv -m "$MODEL" --api-key ""
refuses "--ctx-size past the model's context" "" srv -m "$MODEL" --port 0 --ctx-size 4096
check "--ctx-size past the context: the line says the model's context ($(cat "$TMP/stderr"))" grep -q -- "--ctx-size 4096: the model's context is 512" "$TMP/stderr"
$BIN/serve --version >"$TMP/out" 2>&1
check "--version: exit 0, the version, commit and backends" sh -c "[ $? = 0 ] && grep -q '^serve (paradec) .*commit' $TMP/out && grep -q '^backends: ' $TMP/out"
$BIN/serve --help >"$TMP/help" 2>&1
check "--help: exit 0" [ $? = 0 ]
for fd in "--model FILE.*(required)" "--no-verify .*(default: off)" "--host ADDR.*(default: 127.0.0.1)" "--port P.*(default: 8080)" \
          "--alias NAME.*(default: the model's file name)" "--parallel N.*(default: 16)" "--ctx-size C.*(default: the model's context" \
          "--threads T.*(default: every core)" "--kv-blocks B.*(default: N x C / 16)" "--kv-type TYPE.*(default: f32)" \
          "--draft MODEL.*(default: none)" "--chat-format F" "--spec-max-batch N.*(default: 256)" "--no-speculation .*(default: off)" \
          "--no-continuous .*(default: off)" "--max-queue N.*(default: 1024)" "--no-prefix-cache .*(default: off)" \
          "--max-body BYTES.*(default: 1048576)" "--max-connections N.*(default: 256)" \
          "--timeout S.*(default: 30)" "--shutdown-grace S.*(default: 5)" "--api-key KEY" "--cors ORIGIN.*(default: none)" "--version"; do
    check "--help: a line for $fd" grep -q -- "^  .*$fd" "$TMP/help"
done
for short in "-m, --model" "-a, --alias" "-np, --parallel" "-c, --ctx-size" "-t, --threads" "-to, --timeout" "-h, --help"; do
    check "--help: $short" grep -q -- "^  $short" "$TMP/help"
done
check "--help: the memory and the methods after the flags" sh -c "grep -q '^memory: about ' $TMP/help && grep -q '^Methods (--method NAME)' $TMP/help"
$BIN/serve -h >"$TMP/help2" 2>&1
check "-h = --help" cmp -s "$TMP/help" "$TMP/help2"

# ---- long forms, --alias, /v1/models, ids, the access log, histograms ----
start "$TMP/log1" "$MODEL" --threads 1 --ctx-size 256 --parallel 4 --alias story --chat-format chatml || { finish test_serve_ops; exit 1; }
check "long forms: the listening line says 4 parallel, context 256, the alias" grep -q "(story, 4 parallel, context 256," "$TMP/log1"
code "$URL/v1/models" >"$TMP/st"
check "/v1/models: 200 (got $(cat "$TMP/st"))" [ "$(cat "$TMP/st")" = 200 ]
check "/v1/models: OpenAI's list of one model named by --alias" jqe '.object == "list" and (.data | length) == 1 and .data[0].id == "story"
    and .data[0].object == "model" and (.data[0].created | type) == "number" and .data[0].created > 0 and (.data[0].owned_by | type) == "string"' "$TMP/body"
check "/v1/models/story: 200, the model" sh -c "[ \"\$(curl -s -o $TMP/m1 -w '%{http_code}' $URL/v1/models/story)\" = 200 ] && jq -e '.id == \"story\" and .object == \"model\"' $TMP/m1 >/dev/null"
code "$URL/v1/models/gpt-4" >"$TMP/st"
check "/v1/models/another: 404 in OpenAI's error shape" sh -c "[ $(cat "$TMP/st") = 404 ] && jq -e '.error.code == \"model_not_found\" and .error.type == \"invalid_request_error\" and (.error.message | test(\"gpt-4\")) and (.error | has(\"param\"))' $TMP/body >/dev/null"
check "POST /v1/models: 405" [ "$(code "$URL/v1/models" -d '{}')" = 405 ]
lat0=$(metric request_latency_seconds_count) ttft0=$(metric time_to_first_token_seconds_count)
curl -s -m 60 "$URL/v1/completions" -d "$REQ" >"$TMP/c1"
check "a completion: the model field is the alias" jqe '.model == "story"' "$TMP/c1"
check "a completion: the text is bin/decode's" [ "$(jq -r '.choices[0].text' "$TMP/c1")" = "$WANT" ]
curl -s -m 60 "$URL/v1/chat/completions" -d '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5, "temperature": 0}' >"$TMP/c2"
check "a chat completion: the model field is the alias" jqe '.model == "story"' "$TMP/c2"
curl -sN -m 60 "$URL/v1/completions" -d '{"prompt": "Once upon a time", "max_tokens": 7, "temperature": 0, "stream": true}' >"$TMP/c3"
check "a stream's chunks: the model field is the alias" sh -c "sed -n 's/^data: {/{/p' $TMP/c3 | jq -e -s 'length > 1 and all(.model == \"story\")' >/dev/null"
curl -s -m 10 "$URL/health" >/dev/null
id1=$(jq -r .id "$TMP/c1") id2=$(jq -r .id "$TMP/c2")
check "ids differ within a process ($id1, $id2)" [ "$id1" != "$id2" ]
# the histograms: three completions since lat0, /health not among them
check "/metrics: the latency histogram's type" sh -c "curl -s $URL/metrics | grep -q '^# TYPE paradec_request_latency_seconds histogram$'"
check "/metrics: the TTFT histogram's type" sh -c "curl -s $URL/metrics | grep -q '^# TYPE paradec_time_to_first_token_seconds histogram$'"
check "/metrics: latency counts the three completions, not /health ($lat0 → $(metric request_latency_seconds_count))" \
    [ $(($(metric request_latency_seconds_count) - lat0)) = 3 ]
check "/metrics: TTFT counts the three completions ($ttft0 → $(metric time_to_first_token_seconds_count))" \
    [ $(($(metric time_to_first_token_seconds_count) - ttft0)) = 3 ]
curl -s "$URL/metrics" >"$TMP/metrics"
for h in request_latency_seconds time_to_first_token_seconds; do
    check "/metrics: $h's buckets grow with le and end at +Inf = _count" awk -v h="paradec_${h}" '
        index($0, h "_bucket{le=\"") == 1 { if ($2 < last) bad = 1; last = $2; if ($0 ~ /le="\+Inf"/) inf = $2; n++ }
        $1 == h "_count" { count = $2 } $1 == h "_sum" { sum = $2 }
        END { exit !(n >= 10 && !bad && inf == count && count > 0 && sum > 0) }' "$TMP/metrics"
done
check "/metrics: TTFT's sum is at most the latency's" awk '$1 == "paradec_request_latency_seconds_sum" { l = $2 } $1 == "paradec_time_to_first_token_seconds_sum" { t = $2 } END { exit !(t > 0 && t <= l) }' "$TMP/metrics"
check "/metrics: open connections gauge" grep -q '^paradec_connections_open [0-9]' "$TMP/metrics"
# the access log: method, path, status, tokens, milliseconds
check "access log: the completion (20 tokens)" grep -Eq '^serve: POST /v1/completions 200 20 tok [0-9]+ ms$' "$TMP/log1"
check "access log: the chat completion" grep -Eq '^serve: POST /v1/chat/completions 200 [0-9]+ tok [0-9]+ ms$' "$TMP/log1"
check "access log: the stream (7 tokens)" grep -Eq '^serve: POST /v1/completions 200 7 tok [0-9]+ ms$' "$TMP/log1"
check "access log: the 404" grep -Eq '^serve: GET /v1/models/gpt-4 404 0 tok [0-9]+ ms$' "$TMP/log1"
check "access log: /health" grep -Eq '^serve: GET /health 200 0 tok [0-9]+ ms$' "$TMP/log1"
python3 -c 'import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)
s.sendall(b"GET /health HTTP/9.9\r\nHost: x\r\n\r\n")
s.recv(100)' "$PORT"
check "libmicrohttpd's own messages go to the same log" wait_line "$TMP/log1" '^serve: http: .*505'
# address in use: a second server on this port says which address and port
refuses "a port in use" "" srv -m "$MODEL" --port "$PORT"
check "a port in use: 'cannot listen on 127.0.0.1:$PORT: Address already in use' ($(cat "$TMP/stderr"))" \
    [ "$(cat "$TMP/stderr")" = "serve: cannot listen on 127.0.0.1:$PORT: Address already in use" ]
stop
check "SIGTERM on an idle server: exit 0" [ $? = 0 ]
start "$TMP/log1b" "$MODEL" -t 1 -c 256 -np 4 -a story || { finish test_serve_ops; exit 1; }
check "short forms: the listening line says 4 parallel, context 256, the alias" grep -q "(story, 4 parallel, context 256," "$TMP/log1b"
id3=$(curl -s -m 60 "$URL/v1/completions" -d "$REQ" | jq -r .id)
check "ids differ across restarts ($id1, then $id3)" sh -c "[ -n '$id3' ] && [ '$id3' != null ] && [ '$id3' != '$id1' ] && [ '$id3' != '$id2' ]"
stop INT
check "SIGINT: exit 0" [ $? = 0 ]
start "$TMP/log1c" "$MODEL" || { finish test_serve_ops; exit 1; }
check "without --alias the model is named by its file" sh -c "curl -s $URL/v1/models | jq -e '.data[0].id == \"$(basename "$MODEL")\"' >/dev/null"
st=$(code "$URL/health")
check "without --cors: no Access-Control-Allow-Origin" sh -c "[ $st = 200 ] && ! grep -qi '^access-control-allow-origin' $TMP/head"
st=$(code -X OPTIONS "$URL/v1/completions")
check "without --cors: OPTIONS is 204 with Allow, and no CORS" sh -c "[ $st = 204 ] && grep -qi '^allow: .*POST' $TMP/head && ! grep -qi '^access-control' $TMP/head"
stop

# ---- --api-key and --cors ----
O=http://app.example
start "$TMP/log2" "$MODEL" --api-key sk-test-123 --cors "$O" || { finish test_serve_ops; exit 1; }
st=$(code "$URL/v1/completions" -d "$REQ")
check "no key: 401 ($st)" [ "$st" = 401 ]
check "no key: OpenAI's error shape, code invalid_api_key" jqe '.error.code == "invalid_api_key" and .error.type == "invalid_request_error" and (.error.message | length) > 0' "$TMP/body"
check "no key: WWW-Authenticate: Bearer" [ "$(header WWW-Authenticate)" = Bearer ]
check "no key: the 401 carries CORS (a browser can read it)" [ "$(header Access-Control-Allow-Origin)" = "$O" ]
check "a wrong key: 401" [ "$(code "$URL/v1/completions" -H "Authorization: Bearer sk-test-124" -d "$REQ")" = 401 ]
check "a key of another length: 401" [ "$(code "$URL/v1/completions" -H "Authorization: Bearer sk-test-1234" -d "$REQ")" = 401 ]
check "the key without Bearer: 401" [ "$(code "$URL/v1/completions" -H "Authorization: sk-test-123" -d "$REQ")" = 401 ]
check "/v1/models without the key: 401" [ "$(code "$URL/v1/models")" = 401 ]
st=$(code "$URL/v1/completions" -H "Authorization: Bearer sk-test-123" -d "$REQ")
check "the key: 200 ($st)" [ "$st" = 200 ]
check "the key: the answer" [ "$(jq -r '.choices[0].text' "$TMP/body")" = "$WANT" ]
check "an answer carries Access-Control-Allow-Origin: $O" [ "$(header Access-Control-Allow-Origin)" = "$O" ]
check "/v1/models with the key: 200" [ "$(code "$URL/v1/models" -H "Authorization: Bearer sk-test-123")" = 200 ]
check "/health needs no key" [ "$(code "$URL/health")" = 200 ]
check "/metrics needs no key" [ "$(code "$URL/metrics")" = 200 ]
curl -sN -m 60 -D "$TMP/shead" "$URL/v1/completions" -H "Authorization: Bearer sk-test-123" -d '{"prompt": "Once", "max_tokens": 5, "stream": true}' >/dev/null
check "a stream carries Access-Control-Allow-Origin" grep -qi "^access-control-allow-origin: $O" "$TMP/shead"
st=$(code -X OPTIONS "$URL/v1/chat/completions" -H "Origin: $O" -H "Access-Control-Request-Method: POST" -H "Access-Control-Request-Headers: authorization, content-type, x-stainless-os")
check "preflight: 204 without the key ($st)" [ "$st" = 204 ]
check "preflight: Access-Control-Allow-Origin" [ "$(header Access-Control-Allow-Origin)" = "$O" ]
check "preflight: Allow-Methods has POST and GET" sh -c "tr -d '\r' <$TMP/head | grep -i '^access-control-allow-methods:' | grep -q 'POST' && tr -d '\r' <$TMP/head | grep -i '^access-control-allow-methods:' | grep -q 'GET'"
check "preflight: Allow-Headers has Authorization, Content-Type and what was asked" sh -c "h=\$(tr -d '\r' <$TMP/head | grep -i '^access-control-allow-headers:'); echo \"\$h\" | grep -qi authorization && echo \"\$h\" | grep -qi content-type && echo \"\$h\" | grep -qi x-stainless-os"
check "access log: the 401" grep -Eq '^serve: POST /v1/completions 401 0 tok [0-9]+ ms$' "$TMP/log2"
stop

# ---- IPv6, and host names ----
if python3 -c 'import socket; s = socket.socket(socket.AF_INET6); s.bind(("::1", 0))' 2>/dev/null; then
    start "$TMP/log3" "$MODEL" --host ::1 || { finish test_serve_ops; exit 1; }
    check "--host ::1: listening on http://[::1]:PORT" grep -q '^serve: listening on http://\[::1\]:[0-9]' "$TMP/log3"
    check "--host ::1: /health over IPv6" sh -c "curl -sg -m 10 'http://[::1]:$PORT/health' | grep -q ok"
    check "--host ::1: a completion over IPv6" [ "$(curl -sg -m 60 "http://[::1]:$PORT/v1/completions" -d "$REQ" | jq -r '.choices[0].text')" = "$WANT" ]
    refuses "--host [::1] on a port in use" "" srv -m "$MODEL" --host "[::1]" --port "$PORT"
    check "IPv6 in use: 'cannot listen on [::1]:$PORT: Address already in use'" \
        [ "$(cat "$TMP/stderr")" = "serve: cannot listen on [::1]:$PORT: Address already in use" ]
    stop
else
    echo "test_serve_ops: this machine has no IPv6 loopback: --host ::1 not checked"
fi
start "$TMP/log4" "$MODEL" --host localhost || { finish test_serve_ops; exit 1; }
check "--host localhost: listening on 127.0.0.1 and answering" sh -c "grep -q '^serve: listening on http://127.0.0.1:' $TMP/log4 && curl -s -m 10 $URL/health | grep -q ok"
stop

# ---- connection limits and the idle timeout ----
# 24 half-open connections past --max-connections 8: the longest idle make room, the
# server answers at once, and after --timeout every one of them is closed
start "$TMP/log5" "$MODEL" --max-connections 8 --timeout 2 || { finish test_serve_ops; exit 1; }
hold 24 1.5 5 >"$TMP/hold" &
HOLD=$!
wait_line "$TMP/hold" '^opened 24'
check "past the limit: /health answers" sh -c "curl -s -m 10 $URL/health | grep -q ok"
check "past the limit: a completion is right" [ "$(curl -s -m 60 "$URL/v1/completions" -d "$REQ" | jq -r '.choices[0].text')" = "$WANT" ]
open=$(metric connections_open) room=$(metric connections_closed_for_room_total)
check "past the limit: at most 8 open ($open)" [ "$open" -le 8 ]
check "past the limit: the longest idle were closed to make room ($room)" [ "$room" -ge 16 ]
wait $HOLD
c1=$(sed -n 's/^1.5 //p' "$TMP/hold") c2=$(sed -n 's/^5.0 //p' "$TMP/hold")
check "past the limit: 16 or more of the 24 closed at once ($c1)" [ "${c1:-0}" -ge 16 ]
check "after --timeout: all 24 closed ($c2)" [ "${c2:-0}" = 24 ]
check "after --timeout: only this scrape's connection is open ($(metric connections_open))" [ "$(metric connections_open)" = 1 ]
check "the closes were logged (libmicrohttpd's messages)" grep -q '^serve: http: ' "$TMP/log5"
stop
check "the server stops cleanly after the flood" [ $? = 0 ]

# past FD_SETSIZE: 1040 connections held at once, and the server still answers
TO=4
[ -n "${PARADEC_SAN:-}" ] && TO=15 # a slower build accepts them more slowly
if [ "$(ulimit -Hn)" = unlimited ] || [ "$(ulimit -Hn)" -ge 1600 ]; then
    start "$TMP/log6" "$MODEL" --max-connections 1100 --timeout $TO || { finish test_serve_ops; exit 1; }
    hold 1040 @"$TMP/held" @"$TMP/freed" >"$TMP/hold" &
    HOLD=$!
    wait_line "$TMP/hold" '^opened 1040'
    for _ in $(seq 100); do [ "$(metric connections_open)" -ge 1041 ] && break; sleep 0.1; done # accepted
    check "1040 half-open connections: all held ($(metric connections_open) open)" [ "$(metric connections_open)" -ge 1041 ]
    check "1040 half-open connections (past FD_SETSIZE): /health answers" sh -c "curl -s -m 10 $URL/health | grep -q ok"
    check "1040 half-open connections: a completion is right" [ "$(curl -s -m 60 "$URL/v1/completions" -d "$REQ" | jq -r '.choices[0].text')" = "$WANT" ]
    touch "$TMP/held"
    wait_line "$TMP/hold" "^@$TMP/held "
    for _ in $(seq $((TO * 10 + 200))); do [ "$(metric connections_open)" = 1 ] && break; sleep 0.1; done # the timeout
    touch "$TMP/freed"
    wait $HOLD
    c1=$(sed -n "s|^@$TMP/held ||p" "$TMP/hold") c2=$(sed -n "s|^@$TMP/freed ||p" "$TMP/hold")
    check "1040 half-open connections: none closed before --timeout ($c1)" [ "${c1:-x}" = 0 ]
    check "1040 half-open connections: all closed after --timeout ($c2)" [ "${c2:-0}" = 1040 ]
    stop
else
    echo "test_serve_ops: ulimit -Hn is $(ulimit -Hn): the FD_SETSIZE check needs 1600 descriptors, not run"
fi

# every connection busy: the next request gets 503 with a JSON error, /health still
# answers, and answers that take longer than --timeout are not cut
start "$TMP/log7" "$W" -t 1 --max-connections 2 --timeout 1 || { finish test_serve_ops; exit 1; }
$BIN/decode -m "$MODEL" -p "$P" -n 200 --temp 0 --json 2>/dev/null | jq -j .text >"$TMP/want200"
LONG='{"prompt": "Once upon a time", "max_tokens": 200, "temperature": 0, "stream": true}'
curl -sN -m 300 "$URL/v1/completions" -d "$LONG" >"$TMP/long1" &
L1=$!
wait_line "$TMP/long1" '^data: {' # its first event: a request is running (a connection with one is never closed for room)
curl -sN -m 300 "$URL/v1/completions" -d "$LONG" >"$TMP/long2" &
L2=$!
wait_line "$TMP/long2" '^data: {'
st=$(code "$URL/v1/completions" -d "$REQ")
if ! grep -q '^data: \[DONE\]' "$TMP/long1" "$TMP/long2"; then
    check "every connection busy: 503 ($st)" [ "$st" = 503 ]
    check "every connection busy: a JSON error naming --max-connections" jqe '.error.type == "server_error" and (.error.message | test("--max-connections"))' "$TMP/body"
    check "every connection busy: Retry-After" [ -n "$(header Retry-After)" ]
    check "every connection busy: /health still answers" [ "$(code "$URL/health")" = 200 ]
    check "every connection busy: the refusal is counted" [ "$(metric requests_refused_total)" = 1 ]
else
    echo "test_serve_ops: a long request ended before the third came: the 503 is not checked"
fi
wait $L1 $L2
for i in 1 2; do
    sed -n 's/^data: {/{/p' "$TMP/long$i" | jq -j '.choices[0].text' >"$TMP/long$i.txt"
    check "a stream longer than --timeout ($i): all its text" cmp -s "$TMP/long$i.txt" "$TMP/want200"
    check "a stream longer than --timeout ($i): [DONE]" sh -c "tail -n 2 $TMP/long$i | grep -q '^data: \[DONE\]'"
done
t0=$(date +%s)
curl -s -m 300 "$URL/v1/completions" -d '{"prompt": "Once upon a time", "max_tokens": 200, "temperature": 0}' | jq -j '.choices[0].text' >"$TMP/long3.txt"
t1=$(date +%s)
check "an answer longer than --timeout: whole" cmp -s "$TMP/long3.txt" "$TMP/want200"
[ $((t1 - t0)) -ge 2 ] || echo "test_serve_ops: the long answer took under 2 s: --timeout 1 was hardly tested"
check "after the busy spell: a request is answered" [ "$(curl -s -m 60 "$URL/v1/completions" -d "$REQ" | jq -r '.choices[0].text')" = "$WANT" ]
stop

# ---- SIGTERM with requests open ----
# a short request finishes within the grace; a long stream ends with a last chunk
# (finish_reason "abort") and [DONE]; a long plain request gets 503; new connections
# are refused; exit 0 soon after the grace
GRACE=3
[ -n "${PARADEC_SAN:-}" ] && GRACE=10 # the sanitizer build is ~10x slower
start "$TMP/log8" "$W" -t 1 --shutdown-grace $GRACE || { finish test_serve_ops; exit 1; }
$BIN/decode -m "$MODEL" -p "$P" -n 16 --temp 0 --json 2>/dev/null | jq -j .text >"$TMP/want16"
curl -sN -m 120 "$URL/v1/completions" -d '{"prompt": "Once upon a time", "max_tokens": 500, "temperature": 0, "stream": true}' >"$TMP/sA" &
A=$!
wait_line "$TMP/sA" '^data: {'
curl -s -m 120 -w '\n%{http_code}\n' "$URL/v1/completions" -d '{"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0}' >"$TMP/sB" &
B=$!
curl -s -m 120 -w '\n%{http_code}\n' "$URL/v1/completions" -d '{"prompt": "Once upon a time", "max_tokens": 500, "temperature": 0}' >"$TMP/sC" &
C=$!
for _ in $(seq 100); do [ "$(metric requests_running)" = 3 ] && break; sleep 0.05; done
t0=$(date +%s.%N)
kill -TERM $SPID
sleep 0.3
curl -s -m 5 "$URL/health" >/dev/null 2>&1
check "after SIGTERM: a new connection is refused (curl exit $?)" [ $? = 7 ]
reap
rc=$? t1=$(date +%s.%N)
wait $A $B $C
check "SIGTERM with requests open: exit 0 ($rc)" [ "$rc" = 0 ]
took=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
check "SIGTERM with requests open: gone within the grace ($GRACE s) and a second or two ($took s)" awk -v t="$took" -v g=$GRACE 'BEGIN { exit !(t < g + 2.5) }' 
check "SIGTERM: the log says it stops" grep -q '^serve: SIGTERM: stopping' "$TMP/log8"
head -n 1 "$TMP/sB" | jq -j '.choices[0].text' >"$TMP/sB.txt" 2>/dev/null
check "SIGTERM: the short request finished (200, length)" sh -c "[ \"\$(tail -n 1 $TMP/sB)\" = 200 ] && head -n 1 $TMP/sB | jq -e '.choices[0].finish_reason == \"length\"' >/dev/null"
check "SIGTERM: the short request's text is whole" cmp -s "$TMP/sB.txt" "$TMP/want16"
check "SIGTERM: the stream ends with [DONE]" sh -c "tail -n 2 $TMP/sA | grep -q '^data: \[DONE\]'"
if grep -q '^serve: ending the open requests' "$TMP/log8"; then
    check "SIGTERM: the stream's last chunk has finish_reason abort" sh -c "sed -n 's/^data: {/{/p' $TMP/sA | tail -n 1 | jq -e '.choices[0].finish_reason == \"abort\"' >/dev/null"
    sed -n 's/^data: {/{/p' "$TMP/sA" | jq -j '.choices[0].text' >"$TMP/sA.txt"
    n=$(wc -c <"$TMP/sA.txt")
    check "SIGTERM: the stream's text so far ($n bytes) is the start of the model's" sh -c "[ $n -gt 0 ] && head -c $n $TMP/want500 | cmp -s - $TMP/sA.txt"
    check "SIGTERM: the long plain request got 503 in OpenAI's error shape" sh -c "[ \"\$(tail -n 1 $TMP/sC)\" = 503 ] && head -n 1 $TMP/sC | jq -e '.error.type == \"server_error\"' >/dev/null"
else
    echo "test_serve_ops: the long requests finished within the grace: ending them was not checked"
fi
check "no sanitizer or UBSan report in any server's log" sh -c "! grep -l 'Sanitizer\|runtime error' $TMP/log*"
finish test_serve_ops
