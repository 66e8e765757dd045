# test_answers — bin/recipe answers on stories260K: the engine's batched answers (8 in
# the running batch) are one-at-a-time's and `decode`'s, byte for byte; sampled answers
# repeat with their seed and differ from greedy; a run that could not write its output
# leaves its partial file, and the next run with the same settings takes it up (a torn
# last line dropped) while other settings start over; FILE.jsonl.zst is the same lines
# compressed, read by the trainers as they are.
. tests/lib.sh
need "every check (the prompts are TinyStories openings)" datasets/tinystories/tinystories_val_sample.txt.gz ||
    { finish answers; exit 0; }
recipe() { # recipe FILE ANSWERS-EXTRA
    cat >"$1" <<EOF
model:
  source: models/stories260K/stories260K.bin
  tokenizer: models/stories260K/tok512.bin
answers: {datasets: [{name: tinystories, template: '{text:6w} |'}], samples: 24, max_new: 40, chat: false$2}
datasets:
  - {name: tinystories, samples: 2, max_new: 8}
EOF
}
answer() { # answer FILE I: the text of line I (from 0)
    python3 -c "import json, sys; print(json.loads(open(sys.argv[1]).readlines()[int(sys.argv[2])])['text'])" "$@"
}
recipe "$TMP/p8.yaml" ", parallel: 8"
recipe "$TMP/p1.yaml" ", parallel: 1"
$BIN/recipe answers "$TMP/p8.yaml" -m "$MODEL" -o "$TMP/p8.jsonl" 2>"$TMP/err"
check "24 answers, 8 at a time ($(tail -n 1 "$TMP/err"))" test "$(wc -l <"$TMP/p8.jsonl")" = 24
$BIN/recipe answers "$TMP/p1.yaml" -m "$MODEL" -o "$TMP/p1.jsonl" 2>/dev/null
check "8 at a time: one at a time's answers, byte for byte" cmp -s "$TMP/p1.jsonl" "$TMP/p8.jsonl"
for i in 0 13 23; do # the prompt: the story's first 6 words and " |" (the template)
    answer "$TMP/p8.jsonl" $i >"$TMP/a"
    $BIN/decode -m "$MODEL" -p "$(head -n 1 "$TMP/a" | sed 's/ |.*/ |/')" -n 40 --temp 0 >"$TMP/d" 2>/dev/null
    check "answer $i is decode's greedy text" cmp -s "$TMP/a" "$TMP/d"
done
check "answers stop at max_new" sh -c "! grep -q partial '$TMP/err' && grep -q '960 tokens generated' '$TMP/err'"

recipe "$TMP/s.yaml" ", parallel: 8, temp: 0.9, seed: 5"
$BIN/recipe answers "$TMP/s.yaml" -m "$MODEL" -o "$TMP/s1.jsonl" 2>"$TMP/err"
check "sampled: said so ($(tail -n 1 "$TMP/err"))" grep -q "prompt tokens, sampled)" "$TMP/err"
$BIN/recipe answers "$TMP/s.yaml" -m "$MODEL" -o "$TMP/s2.jsonl" 2>/dev/null
check "sampled answers repeat with their seed" sh -c "test -s '$TMP/s1.jsonl' && cmp -s '$TMP/s1.jsonl' '$TMP/s2.jsonl'"
check "and differ from greedy" sh -c "! cmp -s '$TMP/s1.jsonl' '$TMP/p8.jsonl'"

# resuming: an output path that is a directory fails at the very end, the partial file kept
mkdir "$TMP/dir"
$BIN/recipe answers "$TMP/p8.yaml" -m "$MODEL" -o "$TMP/dir" 2>"$TMP/err"
rc=$?
check "a failed final write exits != 0 ($(tail -n 1 "$TMP/err")), its partial file kept" \
    sh -c "test $rc != 0 && test \$(wc -l <'$TMP/dir.partial') = 25"
# keep the settings line and 5 answers, one of them changed, and half of the next line
{ head -n 6 "$TMP/dir.partial" | sed '4s/"text":"/"text":"RESUMED /'; sed -n 7p "$TMP/dir.partial" | cut -c1-20; } \
    >"$TMP/r.jsonl.partial"
$BIN/recipe answers "$TMP/p8.yaml" -m "$MODEL" -o "$TMP/r.jsonl" 2>"$TMP/err"
check "the next run keeps the 5 answers it finds ($(head -n 1 "$TMP/err"))" \
    grep -q "5 answers from an earlier run kept" "$TMP/err"
answer "$TMP/r.jsonl" 2 >"$TMP/k"
check "the answer kept is the one it found" grep -q '^RESUMED ' "$TMP/k"
sed '3s/"text":"RESUMED /"text":"/' "$TMP/r.jsonl" >"$TMP/r2.jsonl"
check "the rest as an uninterrupted run's; the partial file gone" \
    sh -c "cmp -s '$TMP/r2.jsonl' '$TMP/p8.jsonl' && test ! -e '$TMP/r.jsonl.partial'"
head -n 6 "$TMP/dir.partial" >"$TMP/s3.jsonl.partial"
$BIN/recipe answers "$TMP/s.yaml" -m "$MODEL" -o "$TMP/s3.jsonl" 2>"$TMP/err"
check "other settings: it starts over" sh -c "! grep -q 'kept' '$TMP/err' && cmp -s '$TMP/s3.jsonl' '$TMP/s1.jsonl'"

# FILE.jsonl.zst: the same lines, zstd-compressed, which the trainers read as they are
$BIN/recipe answers "$TMP/p8.yaml" -m "$MODEL" -o "$TMP/z.jsonl.zst" 2>/dev/null
if command -v zstd >/dev/null; then
    zstd -dcq "$TMP/z.jsonl.zst" >"$TMP/z.jsonl" 2>/dev/null
    check "a .zst output is the jsonl, compressed" \
        sh -c "test -s '$TMP/z.jsonl' && cmp -s '$TMP/z.jsonl' '$TMP/p8.jsonl'"
fi
for f in p8.jsonl z.jsonl.zst; do
    $BIN/distill-heads -m "$MODEL" --data "$TMP/$f" --layers 2 --steps 2 --batch 2 --seq-len 32 \
        -o "$TMP/h.$f.st" 2>/dev/null
done
check "distill-heads reads it as the jsonl: the same heads" \
    sh -c "test -s '$TMP/h.p8.jsonl.st' && cmp -s '$TMP/h.p8.jsonl.st' '$TMP/h.z.jsonl.zst.st'"
head -c 100 "$TMP/z.jsonl.zst" >"$TMP/cut.jsonl.zst"
refuses "distill-heads: a truncated .zst" "$TMP/h.cut" $BIN/distill-heads -m "$MODEL" --data "$TMP/cut.jsonl.zst" \
    --layers 2 --steps 2 -o "$TMP/h.cut"
check "it says so" grep -q "truncated zstd data" "$TMP/stderr"
finish answers
