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
