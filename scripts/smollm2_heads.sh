#!/bin/sh
# smollm2_heads.sh — exit heads for SmolLM2-135M-Instruct by self-distillation: the
# model answers the Spec-Bench and MT-Bench prompts (greedy, its chat format), and
# distill-heads learns layers 8, 16 and 24 on those answers (as the AdaDecode paper
# places heads in a 32-layer model). OUT defaults to build/bench/heads-smollm2.safetensors.zst.
set -eu
: "${BIN:=bin}" "${M:=build/smollm2.safetensors}" "${N:=60}" "${TOKENS:=128}" "${STEPS:=100}"
: "${OUT:=build/bench/heads-smollm2.safetensors.zst}"
D=$(for r in "${PARADEC_DATA:-}" data ../shared/data; do [ -n "$r" ] && [ -d "$r/datasets" ] && echo "$r/datasets" && break; done)
answers=$(mktemp)
trap 'rm -f "$answers"' EXIT
python3 - "$D" "$N" <<'PY' | while IFS= read -r p; do
import gzip, json, sys
d, n = sys.argv[1], int(sys.argv[2])
qs = [json.loads(l)["turns"][0] for l in gzip.open(d + "/spec_bench/question.jsonl.gz", "rt")]
qs += [json.loads(l)["turns"][0] for l in open(d + "/mt_bench/question.jsonl")]
for q in qs[::max(1, len(qs) // n)][:n]:
    print(json.dumps(q))
PY
    q=$(printf '%s' "$p" | python3 -c "import json,sys; print(json.loads(sys.stdin.read()))")
    $BIN/decode -m "$M" --chat -p "$q" -n "$TOKENS" --temp 0 2>/dev/null | python3 -c "import json,sys; print(json.dumps({'text': sys.stdin.read()}))" >>"$answers"
done
echo "smollm2_heads: $(wc -l <"$answers") answers, $(wc -c <"$answers") bytes" >&2
$BIN/distill-heads -m "$M" --data "$answers" --layers 8,16,24 --steps "$STEPS" --batch 4 --seq-len 128 -o "$OUT"
