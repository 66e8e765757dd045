# lib.sh — helpers for the tool tests (sourced): ok/bad counters, data lookup,
# and `refuses`, which checks a tool fails with one clear line and no output file.
: "${BIN:=bin}" "${BUILD:=build}" "${MODEL:=build/stories260K.safetensors.zst}"
PASS=0 FAIL=0
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

ok()  { PASS=$((PASS + 1)); }
bad() { FAIL=$((FAIL + 1)); echo "FAIL: $*"; }
check() { # check DESCRIPTION COMMAND...
    d=$1; shift
    if "$@"; then ok; else bad "$d"; fi
}

data() { # data REL → path under $PARADEC_DATA, data/ or ../shared/data
    for r in "${PARADEC_DATA:-}" data ../shared/data; do
        [ -n "$r" ] && [ -e "$r/$1" ] && { echo "$r/$1"; return 0; }
    done
    echo "missing-data/$1"
}

# need WHAT REL...: 0 when every REL is found by `data`; else one line "SKIP test: WHAT:
# needs REL ..." (run.sh passes SKIP lines on) and 1. A clone without the shared data
# runs what it can: `need ... || { finish NAME; exit 0; }` skips a whole test,
# `if need ...; then ... fi` a part of one.
need() {
    what=$1; shift
    for r; do
        case $(data "$r") in missing-data/*)
            echo "SKIP $(basename "$0" .sh): $what: needs $r (not under \$PARADEC_DATA, data/ or ../shared/data)"
            return 1 ;;
        esac
    done
}

# the methods `decode --help` lists, one a line
decode_methods() { $BIN/decode --help | sed -n '/^Methods/,$p' | sed -n 's/^  \([a-z][a-z-]*\)  .*/\1/p'; }

# method_flags METHOD: what a method needs, from its help line (the test exit heads, the
# test Medusa heads, the test EAGLE head, a 2-layer draft folded from heads trained for a few steps, made
# once per test); a need this helper does not know prints a word with NEED in it
method_flags() {
    line=$($BIN/decode --help | sed -n "s/^  $1  *//p" | head -1)
    case $line in
    *"needs exit heads"*) echo "--heads ${TEST_HEADS:-$BUILD/test-heads.safetensors.zst}" ;;
    *"needs Medusa heads"*) echo "--heads ${TEST_MEDUSA:-$BUILD/test-medusa.safetensors.zst}" ;;
    *"needs an EAGLE head"*) echo "--heads ${TEST_EAGLE:-$BUILD/test-eagle.safetensors.zst}" ;;
    *"needs --draft"*)
        [ -n "${TEST_DRAFT:-}" ] && { echo "--draft $TEST_DRAFT"; return; } # made beforehand (make gpu-pack)
        if [ ! -s "$TMP/draft.safetensors" ]; then
            gzip -dc "$(data datasets/tinystories/tinystories_val_sample.txt.gz)" 2>/dev/null | head -c 20000 >"$TMP/small.txt"
            $BIN/distill-heads -m "$MODEL" --steps 3 --batch 2 --seq-len 64 --data "$TMP/small.txt" --layers 2 \
                --norm 1 -o "$TMP/h.safetensors" 2>/dev/null
            $BIN/convert "$MODEL" --layers 2 --heads "$TMP/h.safetensors" -o "$TMP/draft.safetensors" 2>/dev/null
        fi
        [ -s "$TMP/draft.safetensors" ] && echo "--draft $TMP/draft.safetensors" || echo "NEEDS-A-DRAFT" ;;
    *needs*) echo "UNKNOWN-NEED" ;;
    esac
}

# refuses DESCRIPTION OUTFILE COMMAND... : exit ≠ 0, exactly one line on stderr that
# names the tool, nothing on stdout, and OUTFILE (if not "") does not exist
refuses() {
    d=$1 out=$2; shift 2
    "$@" >"$TMP/stdout" 2>"$TMP/stderr"
    rc=$?
    lines=$(wc -l <"$TMP/stderr")
    if [ "$rc" = 0 ]; then bad "$d: exit 0"; return; fi
    if [ "$rc" -gt 2 ]; then bad "$d: exit $rc (a crash?)"; cat "$TMP/stderr"; return; fi
    if [ "$lines" != 1 ]; then bad "$d: $lines lines on stderr"; cat "$TMP/stderr"; return; fi
    if [ -s "$TMP/stdout" ]; then bad "$d: wrote to stdout"; return; fi
    if [ -n "$out" ] && ls "$out"* >/dev/null 2>&1; then bad "$d: left $(ls "$out"*)"; return; fi
    ok
}

finish() { # finish NAME
    echo "$1: $PASS passed, $FAIL failed"
    [ "$FAIL" = 0 ]
}
