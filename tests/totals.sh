#!/bin/sh
# totals.sh RUNS — make test's last step: passes the output of RUNS runs of tests/run.sh
# through line by line (as it comes: a shell loop, no buffering awk), marks each run's
# own total "(...)", and ends with one line "N passed, N failed" that sums them. A run
# that ended without its total counts as a failure.
set -u
runs=$1 n=0 p=0 f=0
while IFS= read -r line; do
    if printf '%s\n' "$line" | grep -qE '^[0-9]+ passed, [0-9]+ failed$'; then
        set -- $line
        p=$((p + $1)) f=$((f + $3))
        [ $n = 0 ] && line="($line)" || line="(sanitizers: $line)"
        n=$((n + 1))
    fi
    printf '%s\n' "$line"
done
[ $n -ge "$runs" ] || { echo "$((runs - n)) run(s) ended without their totals"; f=$((f + 1)); }
echo "$p passed, $f failed"
[ $f = 0 ]
