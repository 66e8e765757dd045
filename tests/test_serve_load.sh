# test_serve_load — bin/serve under load (issue 26, point 5): 2,000 requests from 64
# concurrent clients (tests/serve_load.py) mixing methods, streamed and not, greedy
# (= bin/decode) and seeded sampling (= the same request alone), half the prompts
# sharing a long prefix (found in the prefix cache), ~5% streams cancelled mid-stream, on
# a KV pool too small for every running request (requests wait and are preempted); none lost, RSS, threads and KV blocks back to idle afterwards,
# the server healthy and right, SIGTERM exits 0. Loopback only; every wait is bounded.
. tests/lib.sh
for t in curl jq python3; do command -v $t >/dev/null || { echo "test_serve_load: $t is missing (scripts/setup.sh installs it)"; finish test_serve_load; exit 1; }; done
. tests/serve_lib.sh
T0=$(date +%s)
METHODS="standard prompt-lookup lookahead"
bundle test_serve_load
N=24

post() { curl -s -m 60 "http://127.0.0.1:$PORT$1" -d "$2"; }
metric() { v=$(curl -s -m 10 "http://127.0.0.1:$PORT/metrics" | sed -n "s/^paradec_$1 //p"); echo "${v:--1}"; } # -1: no answer
proc() { sed -n "s/^$1:[[:space:]]*\([0-9]*\).*/\1/p" /proc/$SPID/status; } # proc VmRSS|Threads (kB, count)

# the greedy references: bin/decode's text after each prompt (as test_serve.sh asks it)
SYS="Once upon a time, in a small town by the sea, there lived a kind old man named Sam. \
Every morning he walked to the beach with his little dog Spot to look for shells, and the \
children of the town liked to come with them. One day,"
cat >"$TMP/prompts" <<EOF
$SYS Sam found a big box
$SYS Spot ran into the water
$SYS a girl named Lily
$SYS the sun did not come up
$SYS they saw a boat
$SYS it began to rain
Once upon a time
The little dog
Tom and Lily went to the park
The cat saw a fish in the pond
Max the bear was hungry
It was a rainy day and
EOF
while read -r p; do
    $BIN/decode -m "$MODEL" -p "$p" -n $N --temp 0 --json 2>/dev/null | jq -c --arg p "$p" '{prompt: $p, text: .text}'
done <"$TMP/prompts" >"$TMP/refs"
check "bin/decode gave the 12 greedy references" [ "$(jq -s 'map(select(.text | length > 0)) | length' "$TMP/refs")" = 12 ]

# --kv-blocks 40: 16 running requests may need ~7 blocks each, so requests wait for room
# and running ones are preempted
start "$TMP/log" --parallel 16 -t 1 --kv-blocks 40 || { finish test_serve_load; exit 1; }

# the sampled references: each (prompt, seed) sent alone, before the load
for ps in "1 11" "3 12" "7 13" "8 14" "9 15" "12 16"; do
    set -- $ps
    p=$(sed -n "${1}p" "$TMP/prompts")
    jq -nc --arg p "$p" --argjson s $2 --argjson n $N \
        '{prompt: $p, max_tokens: $n, temperature: 0.8, seed: $s, method: "standard"}' >"$TMP/sreq"
    post /v1/completions "@$TMP/sreq" | jq -c --arg p "$p" --argjson s $2 '{prompt: $p, seed: $s, text: .choices[0].text}'
done >>"$TMP/refs"
check "the 6 seeded references alone" [ "$(jq -s 'map(select(.seed and (.text | type) == "string")) | length' "$TMP/refs")" = 6 ]

# idle: the references' connections closed, nothing running
for _ in $(seq 50); do [ "$(metric connections_open)" -le 1 ] && break; sleep 0.1; done
sleep 0.5
RSS0=$(proc VmRSS) THR0=$(proc Threads) KV0=$(metric kv_blocks_used) REQ0=$(metric requests_total)
echo "idle: RSS $RSS0 kB, $THR0 threads, $KV0 KV blocks used"

t=$(date +%s)
timeout 300 python3 tests/serve_load.py $PORT "$TMP/refs" "$METHODS" 2000 64 >"$TMP/load" 2>"$TMP/load.err"
rc=$?
cat "$TMP/load.err" "$TMP/load"
check "2000 requests from 64 clients: all answered, every text right (exit $rc, $(($(date +%s) - t)) s)" [ $rc = 0 ]
check "the server counted 2000 requests accepted ($(($(metric requests_total) - REQ0)))" [ $(($(metric requests_total) - REQ0)) = 2000 ]
# the streams the clients closed: the server saw them leave and stopped their jobs
left=$(grep -c '^serve: POST /v1/completions 200 .*, client left$' "$TMP/log")
check "cancelled streams logged as the client leaving ($left)" [ "$left" -gt 0 ]
check "requests waited for KV room ($(metric requests_waited_total))" [ "$(metric requests_waited_total)" -gt 0 ]
# the shared prefix was found in the cache, and running requests gave their blocks back
# to wait again (the greedy and seeded answers above say none was corrupted)
check "prefix cache hits ($(metric prefix_cache_hits_total) of $(metric prefix_cache_queries_total) blocks)" \
    [ "$(metric prefix_cache_hits_total)" -gt 1000 ]
check "requests preempted and resumed ($(metric requests_preempted_total))" [ "$(metric requests_preempted_total)" -gt 0 ]

# afterwards: back to idle
for _ in $(seq 200); do
    [ "$(metric requests_running)" = 0 ] && [ "$(metric requests_queued)" = 0 ] && [ "$(metric kv_blocks_used)" = "$KV0" ] && break
    sleep 0.1
done
check "nothing running or queued afterwards" [ "$(metric requests_running) $(metric requests_queued)" = "0 0" ]
check "KV blocks used back to idle ($(metric kv_blocks_used), idle $KV0)" [ "$(metric kv_blocks_used)" = "$KV0" ]
for _ in $(seq 100); do [ "$(proc Threads)" -le "$THR0" ] && break; sleep 0.1; done # connection threads exit when their client closes
check "threads back to idle ($(proc Threads), idle $THR0)" [ "$(proc Threads)" -le "$THR0" ]
# a margin, not equality: the connection threads' malloc arenas keep their pages after
# the frees (measured: +5.4 MB after a first 2,000 requests, +0.5 MB after a second, then
# flat); a leak of 8 KB a request would cross it
RSS=$(proc VmRSS)
echo "after: RSS $RSS kB (+$((RSS - RSS0)) kB)"
if [ -n "${PARADEC_SAN:-}" ] && [ "$PARADEC_SAN" != 0 ]; then # ASan's quarantine holds freed memory:
    echo "SKIP test_serve_load: RSS: AddressSanitizer keeps freed memory (LeakSanitizer checks the server's exit below)"
else
    check "RSS within idle + 16 MiB ($RSS kB, idle $RSS0 kB)" [ "$RSS" -le $((RSS0 + 16384)) ]
fi

check "/health answers 200 ok" [ "$(curl -s -m 10 -w '%{http_code}' "http://127.0.0.1:$PORT/health")" = '{"status":"ok"}200' ]
head -n 1 "$TMP/refs" | jq -c --argjson n $N '{prompt, max_tokens: $n, temperature: 0}' >"$TMP/req"
check "a greedy request afterwards still = bin/decode" \
    [ "$(post /v1/completions "@$TMP/req" | jq -c '.choices[0].text')" = "$(head -n 1 "$TMP/refs" | jq -c .text)" ]
kill -TERM $SPID
reap
st=$?
check "SIGTERM: the server exits 0 within 20 s (exit $st)" [ $st = 0 ]
echo "test_serve_load: $(($(date +%s) - T0)) s"
finish test_serve_load
