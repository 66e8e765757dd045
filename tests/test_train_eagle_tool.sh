# test_train_eagle_tool — bin/train-medusa --eagle end to end on stories260K with a few
# steps: the head file it writes loads (eagle_load, through test_eagle_train FILE),
# carries its draft vocabulary, held-out top-1 and training facts, beats the start's
# top-1, is the same for the same seed, any -t and without the cache, streams to
# stdout; --init goes on from it, --generate trains on the model's own text, --unroll
# trains the draft on its own features (EAGLE-3's training-time test), --unroll-from after a
# first phase one step deep, as two runs through --init would; every
# kind of bad input is refused with one line and no output file.
. tests/lib.sh
need "every check (its head trains on TinyStories text)" datasets/tinystories/tinystories_val_sample.txt.gz ||
    { finish train_eagle_tool; exit 0; }
DATA=$(data datasets/tinystories/tinystories_val_sample.txt.gz)
# a small slice keeps this quick: ~9k tokens, 10 % held out
gzip -dc "$DATA" | head -c 20000 >"$TMP/small.txt"
H=$TMP/e.safetensors.zst
RUN="$BIN/train-medusa -m $MODEL --eagle --steps 40 --batch 4 --seq-len 64"

$RUN --data "$TMP/small.txt" --draft-vocab 200 -o "$H" 2>"$TMP/log"
check "a short run succeeds" test -s "$H"
loads() { "$BUILD/tests/test_eagle_train" "$1" >/dev/null; }
check "eagle_load accepts the file" loads "$H"
check "the log has the summary line" grep -q "40 steps of 4 sequences, .* an EAGLE head" "$TMP/log"
check "the log has the table" grep -q "CE before  CE after" "$TMP/log"
# the table's last row: CE before, after, feature loss before, after, top-1 before, after
row=$(grep -A1 "CE before  CE after" "$TMP/log" | tail -1)
check "held-out top-1 rises" awk -v r="$row" 'BEGIN { split(r, f, " "); exit !(f[6] > f[5] + 0.05) }'
check "held-out CE falls" awk -v r="$row" 'BEGIN { split(r, f, " "); exit !(f[2] < f[1]) }'
zstd -q -d -c "$H" >"$TMP/e.safetensors"
for key in '"paradec.kind":"eagle-head"' '"paradec.eagle.vocab":"200"' '"paradec.eagle.acc":"0.' \
    '"paradec.eagle.steps":"40"' '"paradec.eagle.reg_weight":"1"' '"paradec.eagle.ce_weight":"1"' \
    '"paradec.eagle.data_digest":"' '"paradec.eagle.top1_before":"' '"paradec.model_digest":"' '"eagle.fc"' \
    '"eagle.vocab"' '"model.layers.0.self_attn.q_proj.weight"'; do
    check "metadata $key" grep -aqF "$key" "$TMP/e.safetensors"
done
# same seed, same bytes; written to stdout; another seed, another head; -t 2 and no cache, the same
$RUN --data "$TMP/small.txt" --draft-vocab 200 -o - 2>/dev/null >"$TMP/e2.safetensors.zst"
check "same seed, same head (stdout)" cmp -s "$H" "$TMP/e2.safetensors.zst"
$RUN --data "$TMP/small.txt" --draft-vocab 200 --seed 5 -o "$TMP/e3.safetensors.zst" 2>/dev/null
check "another seed, another head" sh -c "! cmp -s '$H' '$TMP/e3.safetensors.zst'"
$RUN --data "$TMP/small.txt" --draft-vocab 200 -t 2 -o "$TMP/e4.safetensors.zst" 2>/dev/null
check "-t 2, same head" cmp -s "$H" "$TMP/e4.safetensors.zst"
$RUN --data "$TMP/small.txt" --draft-vocab 200 --cache-mb 0 -o "$TMP/e5.safetensors.zst" 2>/dev/null
check "no cache, same head" cmp -s "$H" "$TMP/e5.safetensors.zst"
# the default vocabulary (all 512 of stories260K's tokens), other weights, clipping, self-generated text
$RUN --data "$TMP/small.txt" --steps 3 --reg-weight 0.5 --ce-weight 2 --clip 1 --generate 8 \
    -o "$TMP/g.safetensors" 2>"$TMP/log"
check "--generate, weights, --clip" loads "$TMP/g.safetensors"
for key in '"paradec.eagle.vocab":"512"' '"paradec.eagle.generate":"8"' '"paradec.eagle.reg_weight":"0.5"' \
    '"paradec.eagle.ce_weight":"2"' '"paradec.eagle.clip":"1"'; do
    check "metadata $key" grep -aqF "$key" "$TMP/g.safetensors"
done
check "--generate judges the generated text" grep -q "held-out, the generated text" "$TMP/log"
# the training-time test: --unroll 3 trains the draft on its own features; the log gives top-1 by depth
$RUN --data "$TMP/small.txt" --draft-vocab 200 --unroll 3 -o "$TMP/u.safetensors" 2>"$TMP/log"
check "--unroll 3" loads "$TMP/u.safetensors"
check "metadata unroll 3" grep -aqF '"paradec.eagle.unroll":"3"' "$TMP/u.safetensors"
check "the log gives top-1 at depths 1..3" \
    grep -q "its own features, depth 1..3: 0\.[0-9]* 0\.[0-9]* 0\.[0-9]*$" "$TMP/log"
check "--unroll 3 makes another head" sh -c "! cmp -s '$H' '$TMP/u.safetensors'"
# --unroll-from: one run, one step deep and then three, is the head that two runs make, the
# second from the first's head through --init (the tensors' digest; the metadata differ)
$RUN --data "$TMP/small.txt" --draft-vocab 200 --steps 24 --unroll 3 --unroll-from 16 -o "$TMP/p.safetensors" \
    2>"$TMP/log"
check "--unroll-from" loads "$TMP/p.safetensors"
check "metadata unroll_from" grep -aqF '"paradec.eagle.unroll_from":"16"' "$TMP/p.safetensors"
$RUN --data "$TMP/small.txt" --draft-vocab 200 --steps 16 -o "$TMP/p1.safetensors" 2>/dev/null
$RUN --data "$TMP/small.txt" --init "$TMP/p1.safetensors" --steps 8 --unroll 3 -o "$TMP/p2.safetensors" 2>/dev/null
digest() { grep -ao '"paradec.digest":"[0-9a-f]*"' "$1"; }
check "--unroll-from: a digest" test -n "$(digest "$TMP/p.safetensors")"
check "--unroll-from: the head of two runs through --init" \
    test "$(digest "$TMP/p.safetensors")" = "$(digest "$TMP/p2.safetensors")"
check "--unroll-from: not the first run's head" \
    test "$(digest "$TMP/p.safetensors")" != "$(digest "$TMP/p1.safetensors")"
# --init goes on from a trained head (its vocabulary); --steps 0 evaluates it
$RUN --data "$TMP/small.txt" --init "$TMP/e.safetensors" --steps 0 -o "$TMP/i.safetensors" 2>"$TMP/log"
check "--init --steps 0" loads "$TMP/i.safetensors"
check "--init keeps the draft vocabulary" grep -aqF '"paradec.eagle.vocab":"200"' "$TMP/i.safetensors"
check "--init --steps 0 says so" grep -q "no training steps" "$TMP/log"
check "--init --steps 0: top-1 as trained" sh -c "grep -A1 'CE before' '$TMP/log' | tail -1 |
    awk '{ exit !(\$5 == \$6 && \$5 > 0) }'"

# ---- bad input ----
O=$TMP/out.safetensors.zst
D="--data $TMP/small.txt"
$BIN/train-medusa -m "$MODEL" $D --heads 1 --steps 1 --batch 2 --seq-len 32 -o "$TMP/m.safetensors" 2>/dev/null
refuses "--draft-vocab 0" "$O" $RUN $D --draft-vocab 0 -o "$O"
refuses "--draft-vocab past the vocabulary" "$O" $RUN $D --draft-vocab 513 -o "$O"
refuses "--draft-vocab x" "$O" $RUN $D --draft-vocab x -o "$O"
refuses "--draft-vocab without --eagle" "$O" $BIN/train-medusa -m "$MODEL" $D --heads 1 --draft-vocab 100 -o "$O"
refuses "--reg-weight without --eagle" "$O" $BIN/train-medusa -m "$MODEL" $D --heads 1 --reg-weight 1 -o "$O"
refuses "--clip without --eagle" "$O" $BIN/train-medusa -m "$MODEL" $D --heads 1 --clip 1 -o "$O"
refuses "--unroll without --eagle" "$O" $BIN/train-medusa -m "$MODEL" $D --heads 1 --unroll 2 -o "$O"
refuses "--unroll 0" "$O" $RUN $D --unroll 0 -o "$O"
refuses "--unroll 9" "$O" $RUN $D --unroll 9 -o "$O"
refuses "--unroll-from without --eagle" "$O" $BIN/train-medusa -m "$MODEL" $D --heads 1 --unroll-from 2 -o "$O"
refuses "--unroll-from without --unroll" "$O" $RUN $D --unroll-from 5 -o "$O"
refuses "--unroll-from at the last step" "$O" $RUN $D --unroll 2 --unroll-from 40 -o "$O"
refuses "--unroll-from -1" "$O" $RUN $D --unroll 2 --unroll-from -1 -o "$O"
refuses "--eagle with --heads" "$O" $RUN $D --heads 2 -o "$O"
refuses "--eagle with --own-lm-head" "$O" $RUN $D --own-lm-head -o "$O"
refuses "--eagle with --loss-weights" "$O" $RUN $D --loss-weights 1 -o "$O"
refuses "--eagle with --targets" "$O" $RUN $D --targets data -o "$O"
refuses "--eagle with --lm-lr" "$O" $RUN $D --lm-lr 1e-3 -o "$O"
refuses "--reg-weight -1" "$O" $RUN $D --reg-weight -1 -o "$O"
refuses "--ce-weight x" "$O" $RUN $D --ce-weight x -o "$O"
refuses "both weights 0" "$O" $RUN $D --reg-weight 0 --ce-weight 0 -o "$O"
refuses "--clip -1" "$O" $RUN $D --clip -1 -o "$O"
refuses "--lr 0" "$O" $RUN $D --lr 0 -o "$O"
refuses "--steps -1" "$O" $RUN $D --steps -1 -o "$O"
refuses "--seq-len 1" "$O" $RUN $D --seq-len 1 -o "$O"
refuses "--generate = --seq-len" "$O" $RUN $D --generate 64 -o "$O"
refuses "--init with --draft-vocab" "$O" $RUN $D --init "$H" --draft-vocab 100 -o "$O"
refuses "--init: Medusa heads" "$O" $RUN $D --init "$TMP/m.safetensors" -o "$O"
refuses "--init: a model file" "$O" $RUN $D --init "$MODEL" -o "$O"
refuses "--init: missing" "$O" $RUN $D --init "$TMP/nope" -o "$O"
refuses "missing data" "$O" $RUN --data "$TMP/nope.txt" -o "$O"
refuses "no --data" "$O" $RUN -o "$O"
refuses "output directory missing" "" $RUN $D -o "$TMP/no/dir/e.safetensors"
finish train_eagle_tool
