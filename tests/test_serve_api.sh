# test_serve_api — bin/serve's request fields through curl (issue 21): every scalar and
# array shape of "stop" on both endpoints gets its answer (an empty stop string once
# hung a thread for good), and the server answers /health at once after each.
. tests/lib.sh
for t in curl jq; do command -v $t >/dev/null || { echo "test_serve_api: $t is missing (scripts/setup.sh installs it)"; finish test_serve_api; exit 1; }; done

start() { # start LOG ARGS... : a server on a free port; sets PORT and SPID
    log=$1; shift
    $BIN/serve -m "$MODEL" --port 0 "$@" 2>"$log" &
    SPID=$!
    for _ in $(seq 100); do
        PORT=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$log")
        [ -n "$PORT" ] && return 0
        sleep 0.1
    done
    echo "server did not start:"; cat "$log"; return 1
}
code() { curl -s -m 10 -o "$TMP/body" -w "%{http_code}" "$@"; } # a hang shows as 000
healthy() { [ "$(curl -s -m 2 "http://127.0.0.1:$PORT/health" | jq -r .status 2>/dev/null)" = ok ]; }

start "$TMP/log" --parallel 4 --chat-format chatml || { finish test_serve_api; exit 1; }
URL=http://127.0.0.1:$PORT

# stop SHAPE STATUS: the shape on both endpoints, streamed and not
stop() {
    for path in completions chat/completions; do
        case $path in
        completions) body='{"prompt": "Once", "max_tokens": 8, "temperature": 0, "stop": '"$1"'}' ;;
        *) body='{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "temperature": 0, "stop": '"$1"'}' ;;
        esac
        for stream in false true; do
            got=$(code "$URL/v1/$path" -d "$(echo "$body" | jq -c ".stream = $stream")")
            check "stop $1 on /v1/$path (stream $stream): $2 (got $got)" [ "$got" = "$2" ]
            [ "$2" = 400 ] && check "stop $1 on /v1/$path: the message names 'stop'" grep -q "'stop'" "$TMP/body"
            check "stop $1 on /v1/$path (stream $stream): /health answers after it" healthy
        done
    done
}
stop '""' 400
stop '"x"' 200
stop '" "' 200
stop '"Once upon a time, there was a very long stop string that the answer never holds"' 200
stop null 200
stop '[]' 200
stop '["a"]' 200
stop '["a", "b"]' 200
stop '["a", "b", "c"]' 200
stop '["a", "b", "c", "d"]' 200
stop '["a", "b", "c", "d", "e"]' 400
stop '[""]' 400
stop '["a", ""]' 400
stop '["", "", "", ""]' 400
stop '[null]' 400
stop '["a", null]' 400
stop '[1]' 400
stop '[true]' 400
stop '[["a"]]' 400
stop '[{}]' 400
stop 3 400
stop 0 400
stop true 400
stop '{}' 400
stop '{"a": "b"}' 400

# a stop string that matches at once ends the answer empty, and the server goes on
got=$(code "$URL/v1/completions" -d '{"prompt": "Once", "max_tokens": 8, "temperature": 0, "stop": [" ", "a", "e", "."]}')
check "a stop string met at once: 200 (got $got)" [ "$got" = 200 ]
check "a stop string met at once: finish_reason stop" sh -c "jq -e '.choices[0].finish_reason == \"stop\"' $TMP/body >/dev/null"
check "the server still answers /health" healthy
stopped() { # SIGTERM, then at most 10 s for the exit (a spinning thread once kept it alive)
    kill -TERM $SPID
    for _ in $(seq 100); do kill -0 $SPID 2>/dev/null || break; sleep 0.1; done
    kill -0 $SPID 2>/dev/null && { kill -KILL $SPID; wait $SPID; return 1; }
    wait $SPID
}
check "SIGTERM stops the server cleanly after all of them" stopped
finish test_serve_api
