# test_serve_api — bin/serve's request fields through curl (issue 21): every scalar and
# array shape of "stop" on both endpoints gets its answer (an empty stop string once
# hung a thread for good), and the server answers /health at once after each; every
# method (the bundle's heads, a draft model) gives the logprobs standard decoding gives,
# bit for bit, greedy and alone or four at once; unsupported fields get a 400 naming them.
. tests/lib.sh
for t in curl jq; do command -v $t >/dev/null || { echo "test_serve_api: $t is missing (scripts/setup.sh installs it)"; finish test_serve_api; exit 1; }; done
. tests/serve_lib.sh
METHODS="prompt-lookup lookahead speculative"
bundle test_serve_api

code() { curl -s -m 10 -o "$TMP/body" -w "%{http_code}" "$@"; } # a hang shows as 000
healthy() { [ "$(curl -s -m 2 "http://127.0.0.1:$PORT/health" | jq -r .status 2>/dev/null)" = ok ]; }

start "$TMP/log" --parallel 4 --chat-format chatml --draft "$MODEL" || { finish test_serve_api; exit 1; }
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
# logprobs: every method says what standard says, to the bit (greedy: the same tokens)
lp() { curl -s -m 60 "$URL/v1/completions" -d "$1" | jq -c '.choices[0].logprobs'; }
L='{"prompt": "Once upon a time, there was a little girl named", "max_tokens": 40, "temperature": 0, "logprobs": 5, "echo": true}'
lp "$L" >"$TMP/lp.standard"
check "logprobs: the standard answer lists 40 tokens and the prompt's" [ "$(jq '.tokens | length' "$TMP/lp.standard")" -gt 40 ]
metric() { curl -s "$URL/metrics" | sed -n "s/^paradec_$1 //p"; }
for m in $METHODS; do
    before=$(metric method_tokens_total)
    lp "$(echo "$L" | jq -c ".method = \"$m\"")" >"$TMP/lp.$m"
    check "logprobs: $m alone = standard's" cmp -s "$TMP/lp.$m" "$TMP/lp.standard"
    check "logprobs: $m alone decoded with the method ($(($(metric method_tokens_total) - before)) tokens)" \
        [ "$(metric method_tokens_total)" -gt "$before" ]
done
for m in $METHODS; do
    PIDS=""
    for i in 1 2 3 4; do
        sh -c "curl -s -m 60 $URL/v1/completions -d '$(echo "$L" | jq -c ".method = \"$m\"")' | jq -c .choices[0].logprobs >$TMP/lp4.$i" &
        PIDS="$PIDS $!"
    done
    wait $PIDS
    fails=0
    for i in 1 2 3 4; do cmp -s "$TMP/lp4.$i" "$TMP/lp.standard" || fails=$((fails + 1)); done
    check "logprobs: $m, four at once (standard steps take over) = standard's ($fails differ)" [ $fails = 0 ]
done
C='{"messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 30, "temperature": 0, "logprobs": true, "top_logprobs": 3}'
curl -s -m 60 "$URL/v1/chat/completions" -d "$C" | jq -c '.choices[0].logprobs' >"$TMP/clp.standard"
check "chat logprobs: 30 tokens with 3 alternatives each" sh -c "[ \"\$(jq '.content | length' $TMP/clp.standard)\" = 30 ] && [ \"\$(jq '[.content[].top_logprobs | length] | unique' -c $TMP/clp.standard)\" = '[3]' ]"
for m in $METHODS; do
    curl -s -m 60 "$URL/v1/chat/completions" -d "$(echo "$C" | jq -c ".method = \"$m\"")" | jq -c '.choices[0].logprobs' >"$TMP/clp.$m"
    check "chat logprobs: $m = standard's" cmp -s "$TMP/clp.$m" "$TMP/clp.standard"
done

# a field this server does not support is refused by name, never ignored
refused_field() { # refused_field PATH NAME FIELDS (JSON members added to a valid body)
    case $1 in
    completions) body="{\"prompt\": \"a\", $3}" ;;
    *) body="{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], $3}" ;;
    esac
    got=$(code "$URL/v1/$1" -d "$body")
    check "/v1/$1 with $3: 400 naming '$2' (got $got)" sh -c "[ $got = 400 ] && grep -q \"'$2'\" $TMP/body"
}
refused_field completions best_of '"best_of": 2'
refused_field completions suffix '"suffix": "x"'
refused_field completions presence_penalty '"presence_penalty": 1'
refused_field completions frequency_penalty '"frequency_penalty": 0.5'
refused_field completions logit_bias '"logit_bias": {"1": 5}'
refused_field completions unknown_knob '"unknown_knob": 1'
refused_field chat/completions tools '"tools": [{"type": "function", "function": {"name": "f"}}]'
refused_field chat/completions tool_choice '"tool_choice": "auto"'
refused_field chat/completions functions '"functions": [{"name": "f"}]'
refused_field chat/completions response_format '"response_format": {"type": "json_object"}'
refused_field chat/completions top_logprobs '"logprobs": true, "top_logprobs": 21'
refused_field chat/completions n '"n": 0'
refused_field chat/completions store '"store": true'
refused_field chat/completions echo '"echo": true'
check "the server still answers /health after the refusals" healthy

stopped() { # SIGTERM, then at most 10 s for the exit (a spinning thread once kept it alive)
    kill -TERM $SPID
    for _ in $(seq 100); do kill -0 $SPID 2>/dev/null || break; sleep 0.1; done
    kill -0 $SPID 2>/dev/null && { kill -KILL $SPID; wait $SPID; return 1; }
    wait $SPID
}
check "SIGTERM stops the server cleanly after all of them" stopped
finish test_serve_api
