# serve_lib.sh — what the serve tests share (sourced after lib.sh): the bundle they
# serve, a server started on a free port, and its end awaited.
bundle() { # bundle NAME : B = the model with the trained test heads; METHODS += the head methods
    B=$TMP/bundle.safetensors.zst
    EH=$BUILD/test-heads.safetensors.zst MH=$BUILD/test-medusa.safetensors.zst EA=$BUILD/test-eagle.safetensors.zst
    if [ -f "$EH" ] && [ -f "$MH" ] && [ -f "$EA" ]; then
        $BIN/pack -m "$MODEL" "$EH" "$MH" "$EA" -o "$B" 2>/dev/null
        METHODS="$METHODS adadecode self-speculative medusa eagle"
    else
        echo "$1: no trained test heads in $BUILD (make test builds them): head methods not checked"
        cp "$MODEL" "$B"
    fi
}

start() { # start LOG ARGS... : a server of $B on a free port; sets PORT and SPID
    log=$1; shift
    $BIN/serve -m "$B" --port 0 "$@" 2>"$log" &
    SPID=$!
    for _ in $(seq 100); do
        PORT=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$log")
        [ -n "$PORT" ] && return 0
        sleep 0.1
    done
    echo "server did not start:"; cat "$log"; return 1
}

reap() { # waits for the server, 20 s at most (then kills it: 137)
    ( sleep 20; kill -KILL $SPID 2>/dev/null ) &
    dog=$!
    wait $SPID
    st=$?
    kill $dog 2>/dev/null
    return $st
}
