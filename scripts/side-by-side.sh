#!/bin/sh
# side-by-side.sh — paradec against llama2.c's run.c on stories260K, greedy, in one run:
# per-token time = (wall time for 256 positions − wall time for 8) / 248, each the best
# of 15 process runs, so start-up and model loading cancel out and run.c's
# millisecond timer does not matter. RUNC=path/to/run (built outside the repo).
set -eu
: "${RUNC:?set RUNC to llama2.c's run binary}" "${BIN:=bin}" "${MODEL:=build/stories260K.safetensors.zst}"
S=$(for r in "${PARADEC_DATA:-}" data ../shared/data; do [ -n "$r" ] && [ -d "$r/models/stories260K" ] && echo "$r/models/stories260K" && break; done)
plain=$(mktemp --suffix=.safetensors)
trap 'rm -f "$plain"' EXIT
zstd -q -d -f "$MODEL" -o "$plain" # mapped, as a user would run a big model
python3 - "$RUNC" "$S" "$BIN/decode" "$plain" <<'PY'
import subprocess, sys, time
runc, S, dec, model = sys.argv[1:5]
def best(cmd):
    t = 1e9
    for _ in range(15):
        t0 = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        t = min(t, time.perf_counter() - t0)
    return t
run = [runc, S + '/stories260K.bin', '-z', S + '/tok512.bin', '-t', '0.0', '-i', 'Once upon a time', '-n']
ours = [dec, '-m', model, '-p', 'Once upon a time', '--temp', '0', '-n']
r = (best(run + ['256']) - best(run + ['8'])) / 248
for th in ['1', '2']:  # run.c -n 256 prints 252 tokens after the prompt's 4; -n 8, 4
    p = (best(ours + ['252', '-t', th]) - best(ours + ['4', '-t', th])) / 248
    print('| %s | %.0f | %.0f | %.2f |' % (th, 1 / r, 1 / p, r / p))
PY
