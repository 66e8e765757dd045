# test_decode_cli — the llama.cpp-style command line (issue 21, points 4 and 7): long
# forms, -n -1, -c, -f, -p -, --stop, the random seed, every tool's --version, --help
# and bad arguments, method options refused where they do nothing, the stop reasons and
# times in --json, and the -cnv conversation driven through a pseudo-terminal.
. tests/lib.sh
D="$BIN/decode -m $MODEL"
P="Once upon a time"
jget() { jq -r "$1" "$2"; } # jget FILTER FILE

# ---- long forms = short forms ----
$D -p "$P" -n 20 --temp 0 >"$TMP/short" 2>/dev/null
for alt in "--model $MODEL --prompt" "--model=$MODEL --prompt"; do
    $BIN/decode $alt "$P" --n-predict 20 --temp 0 >"$TMP/long" 2>/dev/null
    check "long forms ($alt ... --n-predict) = short" cmp -s "$TMP/short" "$TMP/long"
done
$BIN/decode --model "$MODEL" --prompt="$P" --n-predict=20 --temp=0 >"$TMP/long" 2>/dev/null
check "--flag=value = --flag value" cmp -s "$TMP/short" "$TMP/long"
$D -p "$P" -n 20 --temp 0 -t 2 >"$TMP/long" 2>/dev/null
$D -p "$P" -n 20 --temp 0 --threads 2 >"$TMP/long2" 2>/dev/null
check "--threads 2 = -t 2 = one thread's text" sh -c "cmp -s '$TMP/short' '$TMP/long' && cmp -s '$TMP/long' '$TMP/long2'"
$D -p "$P" -c 30 --temp 0 --json >"$TMP/c.json" 2>/dev/null
$D -p "$P" --ctx-size 30 --temp 0 --json >"$TMP/c2.json" 2>/dev/null
check "--ctx-size = -c" test "$(jget .tokens "$TMP/c.json")" = "$(jget .tokens "$TMP/c2.json")"
$D -p "$P" -n 30 --temp 1 -s 11 >"$TMP/s1" 2>/dev/null
$D -p "$P" -n 30 --temp 1 --seed 11 >"$TMP/s2" 2>/dev/null
check "--seed = -s" cmp -s "$TMP/s1" "$TMP/s2"

# ---- -p -, -f FILE, -f - (one trailing newline dropped, as llama.cpp's -f) ----
echo "$P" | $D -p - -n 20 --temp 0 >"$TMP/stdin" 2>/dev/null
check "-p - reads the prompt from stdin" cmp -s "$TMP/short" "$TMP/stdin"
echo "$P" >"$TMP/prompt.txt"
$D -f "$TMP/prompt.txt" -n 20 --temp 0 >"$TMP/file" 2>/dev/null
check "-f FILE" cmp -s "$TMP/short" "$TMP/file"
$D --file - -n 20 --temp 0 <"$TMP/prompt.txt" >"$TMP/file" 2>/dev/null
check "--file -" cmp -s "$TMP/short" "$TMP/file"
refuses "-f and -p both" "" $D -f "$TMP/prompt.txt" -p "$P"
refuses "-f of a missing file" "" $D -f "$TMP/nope.txt"

# ---- -n -1 (the default) and the stop reasons, each provoked ----
$D -p "$P" -n -1 --temp 0 --json >"$TMP/all.json" 2>/dev/null
$D -p "$P" --temp 0 --json >"$TMP/dflt.json" 2>/dev/null
n_all=$(jget .n_gen "$TMP/all.json") np=$(jget .n_prompt "$TMP/all.json")
check "no -n = -n -1" test "$(jget .tokens "$TMP/all.json")" = "$(jget .tokens "$TMP/dflt.json")"
check "-n -1 stops at the end token (stop: $(jget .stop "$TMP/all.json"), $n_all tokens)" \
    test "$(jget .stop "$TMP/all.json")" = "end token" -a "$n_all" -lt $((512 - np))
# the model ended the story itself: a budget above what it wrote changes nothing
$D -p "$P" -n $((n_all + 7)) --temp 0 --json >"$TMP/more.json" 2>/dev/null
check "-n above the story: the same end" test "$(jget .tokens "$TMP/more.json")" = "$(jget .tokens "$TMP/all.json")" -a \
    "$(jget .stop "$TMP/more.json")" = "end token"
# ... and begins as llama2.c's run.c goes on (its 252 greedy tokens, tests/golden/README.md)
G=tests/golden/stories260K_runc_256.txt
$D -p "$P" --temp 0 >"$TMP/all.txt" 2>/dev/null
head -c $(($(wc -c <$G) - 1)) "$TMP/all.txt" >"$TMP/a" # the golden text without its newline
head -c $(($(wc -c <$G) - 1)) "$G" >"$TMP/b"
check "-n -1 text begins with run.c's" cmp -s "$TMP/a" "$TMP/b"
check "-c 30: stop context, prompt + output = 30" test "$(jget .stop "$TMP/c.json")" = "context" -a \
    "$(($(jget .n_prompt "$TMP/c.json") + $(jget .n_gen "$TMP/c.json")))" = 30
$D -p "$P" -n 20 --temp 0 --json >"$TMP/len.json" 2>/dev/null
check "-n 20: stop length, 20 tokens" test "$(jget .stop "$TMP/len.json")" = length -a "$(jget .n_gen "$TMP/len.json")" = 20
$D -p "$P" -n 100 -c 30 --temp 0 --json >"$TMP/ctx.json" 2>"$TMP/err"
check "-n past the context: stop context" test "$(jget .stop "$TMP/ctx.json")" = context -a "$(jget .n_gen "$TMP/ctx.json")" = "$((30 - np))"
check "-n past the context: a warning" grep -q "does not fit the context" "$TMP/err"
refuses "-c above the model's context" "" $D -p "$P" -c 513
refuses "-n -2" "" $D -p "$P" -n -2

# ---- --stop: the text up to before it, streamed and in --json ----
full=$(jget .text "$TMP/all.json")
$D -p "$P" --temp 0 --stop "e gi" >"$TMP/stop.txt" 2>"$TMP/err" # spans "little" and "girl"
printf '%s\n' "Once upon a time, there was a littl" >"$TMP/want"
check "--stop across tokens: printed up to before it" cmp -s "$TMP/stop.txt" "$TMP/want"
check "--stop: the summary says stop string" grep -q "stop: stop string" "$TMP/err"
$D -p "$P" --temp 0 --stop "zzz" --stop "Lily" --stop "park" --json >"$TMP/stop.json" 2>/dev/null
t=$(jget .text "$TMP/stop.json")
check "--stop repeated: the earliest ends it ('$t')" test "$t" = ", there was a little girl named " -a \
    "$(jget .stop "$TMP/stop.json")" = "stop string"
case "$full" in "$t"Lily*) ok ;; *) bad "--stop: the text is not the unstopped one's prefix" ;; esac
$D -p "$P" --temp 0 --stop "no such text anywhere" --json >"$TMP/nostop.json" 2>/dev/null
check "--stop never met: the whole text, held-back bytes flushed" test "$(jget .text "$TMP/nostop.json")" = "$full"
$D -p "$P" --temp 0 --stop "Lily. She" >"$TMP/stop2.txt" 2>/dev/null
printf '%s\n' "Once upon a time, there was a little girl named " >"$TMP/want"
check "--stop of several tokens: held back until it completes" cmp -s "$TMP/stop2.txt" "$TMP/want"
$D -p "$P" --temp 0 --stop "Lily?" >"$TMP/stop3.txt" 2>/dev/null # "Lily" is held back each time, then printed
check "--stop begun but never completed: the text whole" cmp -s "$TMP/stop3.txt" "$TMP/all.txt"
refuses "--stop ''" "" $D -p "$P" --stop ""
# stop strings cut from the text at fixed random places (1-12 bytes, across tokens and
# lines): what is printed is the prompt and the text up to the string's first place
python3 - "$TMP/all.json" $D -p "$P" --temp 0 >"$TMP/stops" <<'PY'
import json, random, subprocess, sys
full = json.load(open(sys.argv[1]))["text"]
cmd, rng, bad = sys.argv[2:], random.Random(21), 0
for _ in range(8):
    at = rng.randrange(len(full) - 12)
    s = full[at:at + rng.randint(1, 12)]
    out = subprocess.run(cmd + ["--stop", s], capture_output=True, text=True).stdout
    if out != cmd[cmd.index("-p") + 1] + full[:full.find(s)] + "\n":
        bad += 1
        print("--stop %r printed %r" % (s, out[-80:]))
print("mismatches", bad)
PY
check "--stop at 8 random places: printed up to the first ($(tail -n 1 "$TMP/stops"))" grep -qx "mismatches 0" "$TMP/stops"

# ---- the seed: random by default (getrandom), printed, reproducible with --seed ----
$D -p Once -n 30 --temp 1 --json >"$TMP/r1.json" 2>"$TMP/r1.err"
$D -p Once -n 30 --temp 1 --json >"$TMP/r2.json" 2>"$TMP/r2.err"
s1=$(jget .seed "$TMP/r1.json") s2=$(jget .seed "$TMP/r2.json")
check "two runs without --seed: two seeds ($s1, $s2)" test -n "$s1" -a "$s1" != "$s2"
check "the summary prints the seed" grep -q "seed $s1," "$TMP/r1.err"
$D -p Once -n 30 --temp 1 --seed "$s1" --json >"$TMP/r3.json" 2>/dev/null
check "--seed S repeats the run of seed S" test "$(jget .tokens "$TMP/r1.json")" = "$(jget .tokens "$TMP/r3.json")"

# ---- --json: method, stop, seed, times, rounded ----
j=$(cat "$TMP/len.json")
for key in method stop seed prefill_s decode_s total_s load_s tok_per_s; do
    case "$j" in *"\"$key\":"*) ok ;; *) bad "--json lacks $key: $j" ;; esac
done
check "--json method" test "$(jget .method "$TMP/len.json")" = standard
check "--json total_s >= prefill_s + decode_s - 1e-5" sh -c "jq -e '.total_s >= .prefill_s + .decode_s - 0.00001' '$TMP/len.json' >/dev/null"
check "--json tok/s to 0.1" sh -c "jq -e '(.tok_per_s * 10 | . == floor) and (.prefill_tok_per_s * 10 | . == floor)' '$TMP/len.json' >/dev/null"
check "--json no float printed past 6 decimals" sh -c "! grep -Eq '[0-9]\\.[0-9]{7,}' '$TMP/len.json'"
$D -p "$P" -n 40 --temp 0 --method prompt-lookup --json >"$TMP/pl.json" 2>"$TMP/err"
check "prompt-lookup --json: method, tau to 3 decimals" sh -c "jq -e '.method == \"prompt-lookup\" and (.tau * 1000 | . - floor < 1e-6)' '$TMP/pl.json' >/dev/null"
check "the summary: method, stop, seed, times" grep -Eq "^decode: prompt-lookup, [0-9]+ prompt \\+ 40 generated tokens, stop: length, seed [0-9]+, prefill [0-9.]+ m?s \\([0-9]+\\.[0-9] tok/s\\), decode [0-9.]+ m?s \\([0-9]+\\.[0-9] tok/s\\), total [0-9.]+ m?s" "$TMP/err"

# ---- method options refused where the method does not read them ----
refuses_naming() { # refuses_naming DESCRIPTION WORD COMMAND... : exit 1, one line naming WORD
    d=$1 w=$2; shift 2
    "$@" >"$TMP/stdout" 2>"$TMP/stderr"
    rc=$?
    if [ "$rc" != 1 ] || [ "$(wc -l <"$TMP/stderr")" != 1 ] || [ -s "$TMP/stdout" ] || ! grep -qe "$w" "$TMP/stderr"; then
        bad "$d: exit $rc, stderr: $(head -c 300 "$TMP/stderr")"
    else ok; fi
}
refuses_naming "--gamma with standard" "--gamma" $D -p Once --gamma 0.5
refuses_naming "--system without --chat" "--system" $D -p Once --system "Be brief."
refuses_naming "--draft without speculative" "--draft" $D -p Once --draft "$MODEL"
refuses_naming "--heads with standard" "--heads" $D -p Once --heads "$MODEL"
refuses_naming "--tree with prompt-lookup" "--tree" $D -p Once --method prompt-lookup --tree 0,00
refuses_naming "--window with medusa" "--window" $D -p Once --method medusa --window 4
refuses_naming "--ngram-max with lookahead" "--ngram-max" $D -p Once --method lookahead --ngram-max 2
refuses_naming "--max-pending with self-speculative" "--max-pending" $D -p Once --method self-speculative --max-pending 3
refuses_naming "--exit-layer with adadecode" "--exit-layer" $D -p Once --method adadecode --exit-layer 2
refuses_naming "--draft-fixed with prompt-lookup" "--draft-fixed" $D -p Once --method prompt-lookup --draft-fixed
refuses_naming "--fixed-tree with standard" "--fixed-tree" $D -p Once --fixed-tree
refuses_naming "--oracle-acceptance with standard" "--oracle" $D -p Once --temp 0 --oracle-acceptance 0.5
refuses_naming "--dump-logits with a method" "--dump-logits" $D -p Once --method lookahead --dump-logits "$TMP/l.f32"
out=$($D -p "$P" -n 30 --temp 0 --method lookahead --window 4 --ngram 3 --guess 2 --adaptive --fixed-tree 2>/dev/null)
check "lookahead takes its own options" test "$out" = "$($D -p "$P" -n 30 --temp 0 2>/dev/null)"
out=$($D -p "$P" -n 30 --temp 0 --method prompt-lookup --draft-max 5 --ngram-max 2 2>/dev/null)
check "prompt-lookup takes its own options" test "$out" = "$($D -p "$P" -n 30 --temp 0 2>/dev/null)"

# ---- bad arguments: exit 1, one line naming the argument, for every tool ----
refuses_naming "decode -n without its value" "-n" $D -p Once -n
refuses_naming "decode -n abc" "-n" $D -p Once -n abc
refuses_naming "decode --temp=x" "--temp" $D -p Once --temp=x
refuses_naming "decode --json=1 (a switch)" "--json" $D -p Once --json=1
refuses_naming "decode: a stray argument" "stray" $D -p Once stray
refuses_naming "decode: no prompt" "-p" $D
refuses_naming "decode: --messages not JSON" "--messages" $D --messages "$TMP/prompt.txt" --chat-format chatml
refuses_naming "decode: -cnv --json" "--json" $D -cnv --chat-format chatml --json
refuses_naming "decode: -cnv -p -" "stdin" $D -cnv --chat-format chatml -p -
refuses_naming "decode: -m - -p -" "stdin" $BIN/decode -m - -p - <"$MODEL"
refuses_naming "decode: -cnv without a chat format" "chat" $D -cnv </dev/null
for t in $BIN/*; do
    name=${t##*/}
    refuses_naming "$name --frobnicate" "--frobnicate" "$t" --frobnicate
done

# ---- --version and --help on every tool ----
for t in $BIN/*; do
    name=${t##*/}
    "$t" --version >"$TMP/v" 2>&1
    rc=$?
    if [ $rc = 0 ] && grep -Eq "^$name \\(paradec\\) [0-9][0-9.]*, commit [0-9a-f]{7,}" "$TMP/v" && grep -q "^backends: ." "$TMP/v" &&
        grep -q "^cpu features: ." "$TMP/v"; then ok; else bad "$name --version (exit $rc): $(cat "$TMP/v")"; fi
    "$t" --help >"$TMP/h" 2>"$TMP/herr"
    rc=$?
    n=$(grep -c '^  -' "$TMP/h") # one line a flag: spellings, value, help, default
    nodflt=$(grep '^  -' "$TMP/h" | grep -v -e '(default: [^)]' -e '(required' -e '^  -h, --help ' -e '^  --version ' | head -n 3)
    if [ $rc = 0 ] && [ ! -s "$TMP/herr" ] && [ "$n" -ge 3 ] && [ -z "$nodflt" ]; then ok; else bad "$name --help (exit $rc, $n flag lines): $nodflt"; fi
    "$t" -h >"$TMP/h2" 2>&1
    check "$name -h = --help" cmp -s "$TMP/h" "$TMP/h2"
done
# decode's --help names every long form the issue asks for
$BIN/decode --help >"$TMP/dh"
for f in --model --prompt --threads --n-predict --ctx-size --file --stop --seed -cnv --conversation --interactive; do
    check "decode --help lists $f" grep -Eq "^  (.*, )?$f[ ,]" "$TMP/dh"
done

# ---- -cnv: a conversation through a pseudo-terminal ----
U1="Tell me a story." U2="What did Lily do next?"
if command -v python3 >/dev/null && python3 -c 'import pty, termios' 2>/dev/null; then
    CNV="$D -cnv --chat-format chatml -n 40 --temp 0"
    python3 tests/pty_chat.py "$TMP/cnv.err" "turn:$U1" "turn:$U2" eof -- $CNV >"$TMP/cnv.json"
    check "-cnv: two turns, then Ctrl-D exits 0 ($(jget .error "$TMP/cnv.json"))" \
        test "$(jget .rc "$TMP/cnv.json")" = 0 -a "$(jget '.answers | length' "$TMP/cnv.json")" = 2
    # the second answer = one run on the whole conversation (the first answer as it was
    # printed, in the same template): the prompts are the same tokens, so greedy decoding
    # must give the same answer, whatever the cache kept
    jq --arg u1 "$U1" --arg u2 "$U2" '[{role: "user", content: $u1}, {role: "assistant", content: .answers[0]},
        {role: "user", content: $u2}]' "$TMP/cnv.json" >"$TMP/conv.json"
    $D --messages "$TMP/conv.json" --chat-format chatml -n 40 --temp 0 --json >"$TMP/one.json" 2>/dev/null
    check "-cnv: turn 2's answer = a one-shot run on the whole conversation" \
        test "$(jget .text "$TMP/one.json")" = "$(jget '.answers[1]' "$TMP/cnv.json")" -a -n "$(jget .text "$TMP/one.json")"
    $D --chat-format chatml -p "$U1" -n 40 --temp 0 --json >"$TMP/one1.json" 2>/dev/null
    check "-cnv: turn 1's answer = --chat -p's" test "$(jget .text "$TMP/one1.json")" = "$(jget '.answers[0]' "$TMP/cnv.json")"
    # the KV cache kept: turn 2 prefills only what turn 1 did not run: the tokens after
    # turn 1's prompt and answer, and the answer's last token (never fed: -n ended it)
    np1=$(jget .n_prompt "$TMP/one1.json") ng1=$(jget .n_gen "$TMP/one1.json") np2=$(jget .n_prompt "$TMP/one.json")
    line=$(grep "^decode: turn 2:" "$TMP/cnv.err")
    want="$np2 prompt + 40 generated tokens ($((np2 - np1 - ng1 + 1)) prefilled, $((np1 + ng1 - 1)) kept)"
    case "$line" in *"$want"*) ok ;; *) bad "-cnv turn 2: want '$want', got '$line'" ;; esac
    check "-cnv turn 1 prefilled all $np1" grep -q "^decode: turn 1: standard, $np1 prompt + 40 generated tokens ($np1 prefilled, 0 kept)" "$TMP/cnv.err"

    # Ctrl-C mid-answer: back at the prompt, the answer cut, the conversation goes on;
    # a random model that runs to its 2048-token context unless stopped (seconds)
    cat >"$TMP/cfg.json" <<EOF
{"architecture": "llama", "hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 2,
 "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 512, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
 "rope_theta": 10000.0, "tie_word_embeddings": false}
EOF
    $BIN/randmodel --config "$TMP/cfg.json" --tokenizer "$(data models/stories260K/tok512.bin)" --seed 3 -o "$TMP/r.safetensors" 2>/dev/null
    python3 tests/pty_chat.py "$TMP/int.err" "interrupt:Hello there" "interrupt:Again" sigint -- \
        $BIN/decode -m "$TMP/r.safetensors" -cnv --chat-format chatml --temp 0 >"$TMP/int.json"
    check "-cnv: Ctrl-C mid-answer twice, Ctrl-C at the prompt ends it ($(jget .error "$TMP/int.json"))" \
        test "$(jget '.answers | length' "$TMP/int.json")" = 2 -a "$(jget .rc "$TMP/int.json")" = 130
    check "-cnv: both answers stopped by Ctrl-C" test "$(grep -c 'stop: interrupted' "$TMP/int.err")" = 2
    n1=$(sed -n 's/^decode: turn 1: standard, \([0-9]*\) prompt.*/\1/p' "$TMP/int.err")
    kept=$(sed -n 's/^decode: turn 2: .* prefilled, \([0-9]*\) kept.*/\1/p' "$TMP/int.err")
    check "-cnv: after Ctrl-C the next turn still keeps turn 1's prompt ($kept of >= $n1)" test -n "$kept" -a "${kept:-0}" -ge "${n1:-1}"
else
    echo "decode_cli: SKIP the pseudo-terminal tests (python3 with pty is not there)"
fi

# ---- -cnv from a pipe, with the methods that continue a sequence ----
printf '%s\n%s\n%s\n' "$U1" "$U2" "And then?" >"$TMP/turns"
$D -cnv --chat-format chatml -n 30 --temp 0 <"$TMP/turns" >"$TMP/std.out" 2>"$TMP/std.err"
check "-cnv from a pipe: 3 turns" test "$(grep -c '^decode: turn' "$TMP/std.err")" = 3
for m in prompt-lookup lookahead; do
    $D -cnv --chat-format chatml -n 30 --temp 0 --method $m <"$TMP/turns" >"$TMP/m.out" 2>"$TMP/m.err"
    check "-cnv --method $m: the answers standard gives" cmp -s "$TMP/std.out" "$TMP/m.out"
    check "-cnv --method $m: the same tokens kept" test "$(grep -o '[0-9]* kept' "$TMP/m.err")" = "$(grep -o '[0-9]* kept' "$TMP/std.err")"
done
H=$TMP/heads.safetensors.zst
gzip -dc "$(data datasets/tinystories/tinystories_val_sample.txt.gz)" | head -c 20000 >"$TMP/small.txt" # heads of a few steps
$BIN/distill-heads -m "$MODEL" --data "$TMP/small.txt" --layers 2,4 --steps 10 --batch 2 --seq-len 64 --norm 1 -o "$H" 2>/dev/null
$BIN/train-medusa -m "$MODEL" --data "$TMP/small.txt" --heads 2 --steps 10 --batch 2 --seq-len 64 -o "$TMP/medusa.safetensors.zst" 2>/dev/null
for m in "adadecode --gamma 0.5 --heads $H" "self-speculative --heads $H" "medusa --heads $TMP/medusa.safetensors.zst"; do
    $D -cnv --chat-format chatml -n 30 --temp 0 --method $m <"$TMP/turns" >"$TMP/m.out" 2>"$TMP/m.err"
    check "-cnv --method ${m%% *}: the answers standard gives" cmp -s "$TMP/std.out" "$TMP/m.out"
done
$BIN/convert "$MODEL" --layers 2 --heads "$H" -o "$TMP/draft.safetensors" 2>/dev/null # the head at 2 as a draft
$D -cnv --chat-format chatml -n 30 --temp 0 --method speculative --draft "$TMP/draft.safetensors" <"$TMP/turns" >"$TMP/m.out" 2>/dev/null
check "-cnv --method speculative: the answers standard gives" cmp -s "$TMP/std.out" "$TMP/m.out"
finish decode_cli
