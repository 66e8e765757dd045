# test_killwrite — no lost or half-written output: every writing tool (convert,
# distill-heads, train-medusa, pack, bench) is killed again and again, and what its
# output path holds afterwards is nothing, the complete file that was there before, or
# the complete new one — never a truncated file — and nothing else is left in the folder.
# Two kinds of kill:
# - SIGKILL at delays spread over the tool's whole run, and as soon as the tool is seen
#   writing (it holds an unnamed temp file in the output folder with bytes in it); the
#   test counts the kills that landed while it was writing;
# - a kill inside write() at exact byte offsets of the output (a quarter, a half, three
#   quarters): the file-size limit (ulimit -f) makes the kernel end the tool with SIGXFSZ
#   there, no handler runs: as abrupt as SIGKILL, and surely mid-write.
# Under the sanitizer build (PARADEC_SAN=1, tools ~10× slower) fewer delays are tried.
. tests/lib.sh
need "every check (the writers it kills train on TinyStories text)" datasets/tinystories/tinystories_val_sample.txt.gz || { finish killwrite; exit 0; }
DATA=$(data datasets/tinystories/tinystories_val_sample.txt.gz)
S=$(dirname "$(data models/stories260K/stories260K.bin)")
gzip -dc "$DATA" | head -c 20000 >"$TMP/small.txt"
D=$TMP/out
mkdir -p "$D"
DELAYS=${PARADEC_SAN:+4}
DELAYS=${DELAYS:-10}
now_ms() { echo $(($(date +%s%N) / 1000000)); }

# writing PID DIR: the tool holds an unnamed (O_TMPFILE) or temp file in DIR with bytes
# in it; a named one means the filesystem has no O_TMPFILE, and a killed writer's temp
# file (OUT.tmpPID, never OUT itself) may stay behind
NAMED=
writing() {
    find /proc/$1/fd \( -lname "$2/#*" -o -lname "$2/*.tmp[0-9]*" \) -printf '%p %l\n' 2>/dev/null >"$TMP/fds"
    grep -q '\.tmp[0-9]*$' "$TMP/fds" && NAMED=1
    while read -r fd _; do
        [ "$(stat -L -c %s "$fd" 2>/dev/null || echo 0)" -gt 0 ] && return 0
    done <"$TMP/fds"
    return 1
}

# after a kill: each output is absent (fresh run), the previous file, or the new one
# (as `same` judges), and the folder holds nothing else
left_ok() { # left_ok WHAT MODE OUTS...
    what=$1 mode=$2
    shift 2
    for f in "$@"; do
        b=$(basename "$f")
        if [ ! -e "$f" ]; then
            [ "$mode" = fresh ] || { bad "$what: the previous $b is lost"; return; }
        elif ! same "$f" "$TMP/new/$b" && ! { [ "$mode" = prev ] && cmp -s "$f" "$TMP/prev/$b"; }; then
            bad "$what: $b is neither the previous file nor the complete new one ($(wc -c <"$f") bytes)"
            return
        fi
    done
    for e in $(ls -A "$D" | grep -v -x -F "$(for f in "$@"; do basename "$f"; done)"); do
        # a kill between naming the finished temp file and renaming it leaves it whole
        # (OUT.tmpPID); with no O_TMPFILE, any temp file may stay (but OUT is whole)
        case $e in *.tmp[0-9]*) { [ -n "$NAMED" ] || same "$D/$e" "$TMP/new/${e%.tmp*}"; } && continue ;; esac
        bad "$what: left behind: $e ($(wc -c <"$D/$e") bytes)"
        return
    done
    ok
}

prepare() { # prepare MODE OUTS...: the folder as it is before a run
    mode=$1
    shift
    rm -rf "$D" && mkdir -p "$D"
    [ "$mode" = prev ] && for o in "$@"; do cp "$TMP/prev/$(basename "$o")" "$o"; done
    return 0
}

# killed NAME "OUTS" CMD...: CMD writes OUTS (in $D); $TMP/prev holds older complete
# versions of them. Runs CMD once whole (the reference), then kills it many times.
killed() {
    name=$1 outs=$2
    shift 2
    rm -rf "$TMP/new" "$D" && mkdir -p "$TMP/new" "$D"
    t0=$(now_ms)
    "$@" >/dev/null 2>&1 || { bad "$name: a whole run failed"; return; }
    t=$(($(now_ms) - t0))
    for o in $outs; do cp "$o" "$TMP/new/"; done
    midwrite=0 kills=0 caught=0
    for mode in fresh prev; do
        i=1
        while [ $i -le "$DELAYS" ]; do
            prepare $mode $outs
            "$@" >/dev/null 2>&1 &
            pid=$!
            sleep "$(awk "BEGIN { print $t * $i / ($DELAYS + 1) / 1000 }")"
            writing $pid "$D" && midwrite=$((midwrite + 1))
            kill -9 $pid 2>/dev/null
            wait $pid 2>/dev/null
            kills=$((kills + 1))
            left_ok "$name: SIGKILL at $i/$((DELAYS + 1)) of ${t} ms ($mode)" $mode $outs
            i=$((i + 1))
        done
        i=1
        while [ $i -le 3 ]; do # SIGKILL as soon as the tool is seen writing
            prepare $mode $outs
            "$@" >/dev/null 2>&1 &
            pid=$!
            until writing $pid "$D" || [ -z "$(ls /proc/$pid/fd 2>/dev/null)" ]; do :; done
            writing $pid "$D" && caught=$((caught + 1))
            kill -9 $pid 2>/dev/null
            wait $pid 2>/dev/null
            left_ok "$name: SIGKILL when seen writing ($mode)" $mode $outs
            i=$((i + 1))
        done
        for q in 1 2 3; do
            for o in $outs; do
                blocks=$(($(wc -c <"$TMP/new/$(basename "$o")") * q / 4 / 512))
                [ "$blocks" -gt 0 ] || continue
                prepare $mode $outs
                sh -c 'ulimit -c 0 && ulimit -f "$0" && "$@"' $blocks "$@" >/dev/null 2>&1
                rc=$?
                case $o in # (a child writes bench's PNGs: the cut ends gnuplot, bench goes on)
                *.png) ;;
                *) check "$name: cut at $q/4 of $(basename "$o") ends it by SIGXFSZ (exit $rc, $mode)" test $rc = 153 ;;
                esac
                left_ok "$name: cut at $q/4 of $(basename "$o") ($mode)" $mode $outs
            done
        done
    done
    echo "killwrite: $name: $kills SIGKILLs at delays over ${t} ms ($midwrite while writing), $caught of 6 SIGKILLs" \
        "when seen writing; cuts at 1/4, 1/2, 3/4 of each output${NAMED:+ (named temp files: no O_TMPFILE here)}"
}

same() { cmp -s "$1" "$2"; } # the tools are deterministic: complete = identical

M=$TMP/m.safetensors.zst
EH=$D/exit.safetensors.zst MH=$D/medusa.safetensors.zst
SMALL="--steps 3 --batch 2 --seq-len 64 -t 1"
mkdir -p "$TMP/prev" "$TMP/in"

# convert: the older version is the bf16 one
$BIN/convert "$S/stories260K.bin" --tokenizer "$S/tok512.bin" --dtype bf16 -o "$TMP/prev/m.safetensors.zst" 2>/dev/null
killed convert "$D/m.safetensors.zst" $BIN/convert "$S/stories260K.bin" --tokenizer "$S/tok512.bin" -o "$D/m.safetensors.zst"
cp "$TMP/new/m.safetensors.zst" "$M"

# the head trainers: the older versions trained for fewer steps
$BIN/distill-heads -m "$M" --data "$TMP/small.txt" --layers 2,4 --steps 1 --batch 2 --seq-len 64 -o "$TMP/prev/exit.safetensors.zst" 2>/dev/null
killed distill-heads "$EH" $BIN/distill-heads -m "$M" --data "$TMP/small.txt" --layers 2,4 $SMALL -o "$EH"
cp "$TMP/new/exit.safetensors.zst" "$TMP/in/"
$BIN/train-medusa -m "$M" --data "$TMP/small.txt" --heads 2 --steps 1 --batch 2 --seq-len 64 -o "$TMP/prev/medusa.safetensors.zst" 2>/dev/null
killed train-medusa "$MH" $BIN/train-medusa -m "$M" --data "$TMP/small.txt" --heads 2 $SMALL -o "$MH"
cp "$TMP/new/medusa.safetensors.zst" "$TMP/in/"

# pack: the older bundle holds the exit heads only
$BIN/pack -m "$M" "$TMP/in/exit.safetensors.zst" -o "$TMP/prev/b.safetensors.zst" 2>/dev/null
killed pack "$D/b.safetensors.zst" $BIN/pack -m "$M" "$TMP/in/exit.safetensors.zst" "$TMP/in/medusa.safetensors.zst" -o "$D/b.safetensors.zst"

# bench: four files; their figures differ run to run, so complete = the reference's
# shape: the CSV's rows, the markdown's lines at least (a note follows when gnuplot
# failed), the last one whole; a PNG that ends with its IEND chunk
cat >"$TMP/r.yaml" <<EOF
model: {source: $M}
exit_heads: {layers: [2, 4], data: $TMP/small.txt, norm: 1}
decoding: {methods: [standard, adadecode], oracle: [0.5, 1], oracle_samples: 1}
datasets:
  - {name: tinystories, samples: 2, max_new: 24}
EOF
same() { # same FILE REFERENCE: judged by the reference's name (FILE may be OUT.tmpPID)
    case $2 in
    *.png) tail -c 8 "$1" | od -An -tx1 | tr -d ' \n' | grep -q '^49454e44ae426082$' ;;
    *.csv) [ "$(wc -l <"$1")" = "$(wc -l <"$2")" ] && [ "$(tail -c 1 "$1" | od -An -tx1 | tr -d ' ')" = 0a ] ;;
    *) [ "$(wc -l <"$1")" -ge "$(wc -l <"$2")" ] && [ "$(tail -c 1 "$1" | od -An -tx1 | tr -d ' ')" = 0a ] ;;
    esac
}
BENCH="$BIN/bench --recipe $TMP/r.yaml --model $M --exit-heads $TMP/in/exit.safetensors.zst --out $D -t 1"
$BENCH >/dev/null 2>&1
outs="$D/table.md $D/table.csv"
command -v gnuplot >/dev/null 2>&1 && outs="$outs $D/speed.png $D/oracle.png"
for o in $outs; do cp "$o" "$TMP/prev/"; done
killed bench "$outs" $BENCH
finish killwrite
