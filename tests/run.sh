#!/bin/sh
# run.sh — runs every unit test binary and every tool test script; each prints a line
# "...: N passed, N failed"; a crash or a missing summary counts as one failure.
# Lines a test prints starting "SKIP" (or ending "skipped") are passed on: what it could
# not check here and why (a clone without ../shared/data). Each summary ends with the
# test's seconds, so that a CI log shows where the time goes. Last line: the totals.
set -u
: "${BUILD:=build}" "${BIN:=bin}"
export BUILD BIN MODEL
pass=0 fail=0
log=$(mktemp)
for t in "$BUILD"/tests/test_* tests/test_*.sh; do
    t0=$(date +%s)
    case "$t" in
    *.sh) sh "$t" >"$log" 2>&1 ;;
    *) [ -x "$t" ] || continue; "$t" >"$log" 2>&1 ;; # test binaries (a glob that matched nothing is not one)
    esac
    rc=$?
    line=$(grep -E '[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
    if [ -z "$line" ]; then
        echo "$t: crashed or printed no summary (exit $rc)"; tail -n 20 "$log"
        fail=$((fail + 1)); continue
    fi
    p=$(echo "$line" | sed -E 's/.* ([0-9]+) passed.*/\1/')
    f=$(echo "$line" | sed -E 's/.* ([0-9]+) failed.*/\1/')
    if [ "$rc" != 0 ] && [ "$f" = 0 ]; then f=1; fi
    [ "$f" != 0 ] && grep -E '^FAIL|error|Sanitizer' "$log" | head -n 20
    grep -E '^SKIP|skipped$' "$log" # what a test could not check here, and why
    echo "$line ($(($(date +%s) - t0)) s)"
    pass=$((pass + p)); fail=$((fail + f))
done
rm -f "$log"
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
