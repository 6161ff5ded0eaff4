#!/bin/sh
# Speculative decoding on the CPU reference (t/gpu/spec.t: on the CUDA engine): the in-process checks (t/unit/spec.c: n-gram
# proposals, chain verify == one-token decode bit for bit, tree verify near it, deferred ==
# immediate commit, MTP rollback, the engine per drafter); tandem-run --spec gives the plain
# output; tandem-exactcheck passes (exit 0), fails on an injected difference (exit 1) and refuses
# bad usage (exit 2). Small synthetic models keep it fast under the sanitizers.
# The CPU tests pin the reference backend (auto takes the GPU where one is visible).
TANDEM_BACKEND=cpu; export TANDEM_BACKEND
MK=build/san/bin/tandem-mkmodel
RUN=build/san/bin/tandem-run
EC=build/san/bin/tandem-exactcheck
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
n=0
t() { n=$((n + 1)); if eval "$2"; then echo "ok $n - $1"; else echo "not ok $n - $1"; sed 's/^/# /' "$tmp/err" 2>/dev/null; fi; }
small="--hidden 128 --vocab 512 --intermediate 256 --head-dim 32 --rotary-dim 16 --q-heads 4 --kv-heads 2
       --gdn-key-heads 2 --gdn-value-heads 4 --gdn-key-dim 32 --gdn-value-dim 32"
# shellcheck disable=SC2086
$MK -o "$tmp/m" $small 2>"$tmp/err" && $MK -o "$tmp/d" $small --seed 7 --layers 2 --attn-every 2 --no-mtp 2>>"$tmp/err" &&
    $MK -o "$tmp/nomtp" $small --no-mtp 2>>"$tmp/err" && $MK -o "$tmp/tie" $small --tie --no-mtp 2>>"$tmp/err" ||
    { echo "Bail out! tandem-mkmodel failed"; exit 1; }
printf '5 17 99 3 250 7 400 42 8 9 10 11 5 17 99 3\n' >"$tmp/p.tok"

if build/san/t/spec "$tmp/m" >"$tmp/tap" 2>&1; then
    n=$((n + 1)); echo "ok $n - in-process checks ($(grep -c '^ok' "$tmp/tap") passed)"
else
    n=$((n + 1)); echo "not ok $n - in-process checks"; grep -v '^ok' "$tmp/tap" | sed 's/^/# /'
fi
grep '^ok' "$tmp/tap" | sed 's/^/#   /'

# tandem-run
$RUN -m "$tmp/m" -p "$tmp/p.tok" -n 20 >"$tmp/plain" 2>"$tmp/err"
for a in "--spec mtp" "--spec ngram --draft 3" "--spec draft --draft-model $tmp/d" "--spec draft --draft-model $tmp/m --draft 6" \
         "--spec draft --draft-model $tmp/m --tree 2,2,1"; do
    t "tandem-run $a gives the plain greedy tokens" \
      "$RUN -m $tmp/m -p $tmp/p.tok -n 20 $a >$tmp/out 2>$tmp/err && cmp -s $tmp/out $tmp/plain"
done
t "tandem-run --spec: statistics on stderr and in --json" \
  "$RUN -m $tmp/m -p $tmp/p.tok -n 12 --spec draft --draft-model $tmp/m --json $tmp/run.json >/dev/null 2>$tmp/err &&
   grep -q '^# acceptance by draft depth: 1:1.000' $tmp/err && grep -q '^# round shape chain of 5 nodes' $tmp/err &&
   grep -q '\"accepted_per_round\"' $tmp/run.json && grep -q '\"state_read_per_round\"' $tmp/run.json"
t "tandem-run --spec draft without --draft-model: exit 2" \
  "$RUN -m $tmp/m -p $tmp/p.tok --spec draft >/dev/null 2>$tmp/err; [ \$? -eq 2 ] && grep -q 'needs --draft-model' $tmp/err"
t "tandem-run --spec mtp on a model without MTP: exit 2 naming it" \
  "$RUN -m $tmp/nomtp -p $tmp/p.tok --spec mtp >/dev/null 2>$tmp/err; [ \$? -eq 2 ] && grep -q 'no MTP layer' $tmp/err"
t "tandem-run --tree 3,x: exit 2" "$RUN -m $tmp/m -p $tmp/p.tok --spec ngram --tree 3,x >/dev/null 2>$tmp/err; [ \$? -eq 2 ]"
t "tandem-run --spec with deferral off gives the same tokens and reads the state twice per round" \
  "TANDEM_SPEC_DEFER=off $RUN -m $tmp/m -p $tmp/p.tok -n 20 --spec mtp >$tmp/out 2>$tmp/err && cmp -s $tmp/out $tmp/plain &&
   grep -q 'immediate commit): 98304 B read, 49152 B written per round (state 49152 B)' $tmp/err"

t "TANDEM_DRAFT_FORMAT=nvfp4: tandem-run --spec mtp gives the plain tokens; the drafter's bytes on stderr and in --json" \
  "TANDEM_DRAFT_FORMAT=nvfp4 $RUN -m $tmp/m -p $tmp/p.tok -n 20 --spec mtp --json $tmp/q.json >$tmp/out 2>$tmp/err &&
   cmp -s $tmp/out $tmp/plain &&
   grep -q '^# drafter: the MTP layer, requantized to NVFP4 (TANDEM_DRAFT_FORMAT): a draft token.s projections and head read 0.1 MB (0.5 MB as stored)' $tmp/err &&
   [ \$(build/san/t/json_get $tmp/q.json drafter.format) = '\"nvfp4\"' ] &&
   [ \$(build/san/t/json_get $tmp/q.json drafter.bytes_per_draft) -eq 147456 ] &&
   $RUN -m $tmp/m -p $tmp/p.tok -n 4 --spec mtp >/dev/null 2>$tmp/err && grep -q '^# drafter: the MTP layer, as stored: .* read 0.5 MB' $tmp/err"
t "TANDEM_HEAD_FORMAT=nvfp4: tandem-run says so and --json records the head's bytes; --spec mtp gives its plain tokens" \
  "TANDEM_HEAD_FORMAT=nvfp4 $RUN -m $tmp/m -p $tmp/p.tok -n 20 --json $tmp/h.json >$tmp/hplain 2>$tmp/err &&
   grep -q '^# head: requantized to NVFP4 (TANDEM_HEAD_FORMAT): 0.0 MB a token (0.1 MB as stored)' $tmp/err &&
   [ \$(build/san/t/json_get $tmp/h.json head.format) = '\"nvfp4\"' ] &&
   [ \$(build/san/t/json_get $tmp/h.json head.bytes) -eq 36864 ] && [ \$(build/san/t/json_get $tmp/h.json head.bytes_stored) -eq 131072 ] &&
   TANDEM_HEAD_FORMAT=nvfp4 $RUN -m $tmp/m -p $tmp/p.tok -n 20 --spec mtp >$tmp/out 2>$tmp/err && cmp -s $tmp/out $tmp/hplain &&
   $RUN -m $tmp/m -p $tmp/p.tok -n 2 --json $tmp/s.json >/dev/null 2>$tmp/err && ! grep -q '^# head:' $tmp/err &&
   [ \$(build/san/t/json_get $tmp/s.json head.format) = '\"stored\"' ] && [ \$(build/san/t/json_get $tmp/s.json head.bytes) -eq 131072 ]"
t "TANDEM_DRAFT_FORMAT=fp8 and TANDEM_HEAD_FORMAT=fp8: the plain tokens under --spec mtp; the bytes and formats on stderr and in --json" \
  "TANDEM_DRAFT_FORMAT=fp8 $RUN -m $tmp/m -p $tmp/p.tok -n 20 --spec mtp --json $tmp/q8.json >$tmp/out 2>$tmp/err &&
   cmp -s $tmp/out $tmp/plain &&
   grep -q '^# drafter: the MTP layer, requantized to FP8 (TANDEM_DRAFT_FORMAT): a draft token.s projections and head read 0.3 MB (0.5 MB as stored)' $tmp/err &&
   [ \$(build/san/t/json_get $tmp/q8.json drafter.format) = '\"fp8\"' ] &&
   TANDEM_HEAD_FORMAT=fp8 $RUN -m $tmp/m -p $tmp/p.tok -n 20 --json $tmp/h8.json >$tmp/h8plain 2>$tmp/err &&
   grep -q '^# head: requantized to FP8 (TANDEM_HEAD_FORMAT): 0.1 MB a token (0.1 MB as stored)' $tmp/err &&
   [ \$(build/san/t/json_get $tmp/h8.json head.format) = '\"fp8\"' ] && [ \$(build/san/t/json_get $tmp/h8.json head.bytes) -eq 65552 ] &&
   TANDEM_HEAD_FORMAT=fp8 $RUN -m $tmp/m -p $tmp/p.tok -n 20 --spec mtp >$tmp/out 2>$tmp/err && cmp -s $tmp/out $tmp/h8plain &&
   grep -q '^# drafter: the MTP layer, as stored, the head requantized to FP8 (TANDEM_HEAD_FORMAT): ' $tmp/err"
# (near: within 0.3 relative L2; the random model's top-1 may flip even where logits_cmp calls a row clear)
t "TANDEM_HEAD_FORMAT=nvfp4 with tied embeddings: the head a requantized copy, the lookup as stored (prompt logits near the stored head's)" \
  "$RUN -m $tmp/tie -p $tmp/p.tok -n 0 --dump-logits $tmp/ta.st >/dev/null 2>$tmp/err &&
   TANDEM_HEAD_FORMAT=nvfp4 $RUN -m $tmp/tie -p $tmp/p.tok -n 0 --dump-logits $tmp/tb.st >/dev/null 2>>$tmp/err &&
   ! cmp -s $tmp/ta.st $tmp/tb.st && { build/san/t/logits_cmp $tmp/tb.st $tmp/ta.st 0.3 >$tmp/cmp; sed 's/^/#   /' $tmp/cmp;
   awk '/relative error/ { e = \$6 } END { exit !(e != \"\" && e + 0 < 0.3) }' $tmp/cmp; }"
t "TANDEM_HEAD_FORMAT=fp4: exit 2, one line naming the setting" \
  "TANDEM_HEAD_FORMAT=fp4 $RUN -m $tmp/m -p $tmp/p.tok -n 4 >/dev/null 2>$tmp/err; [ \$? -eq 2 ] &&
   [ \$(wc -l <$tmp/err) -eq 1 ] && grep -q 'TANDEM_HEAD_FORMAT=fp4' $tmp/err"
t "TANDEM_DRAFT_FORMAT=fp4: exit 2, one line naming the setting" \
  "TANDEM_DRAFT_FORMAT=fp4 $RUN -m $tmp/m -p $tmp/p.tok -n 4 --spec mtp >/dev/null 2>$tmp/err; [ \$? -eq 2 ] &&
   [ \$(wc -l <$tmp/err) -eq 1 ] && grep -q 'TANDEM_DRAFT_FORMAT=fp4' $tmp/err"

# tandem-exactcheck
ec="$EC -m $tmp/m -p $tmp/p.tok -n 12 --rows 6"
t "tandem-exactcheck passes on mtp, ngram and a draft model, chain and tree (exit 0)" \
  "$ec --draft-model $tmp/d --json $tmp/ec.json >$tmp/out 2>$tmp/err && [ \$(grep -c '^speculative' $tmp/out) -eq 6 ] &&
   grep -q '\"verdict\": \"pass\"' $tmp/ec.json"
t "TANDEM_DRAFT_FORMAT=nvfp4: tandem-exactcheck --spec mtp passes (chain and tree identical to one-token decode)" \
  "TANDEM_DRAFT_FORMAT=nvfp4 $ec --spec mtp >$tmp/outq 2>$tmp/err && [ \$(grep -c '^speculative mtp' $tmp/outq) -eq 2 ]"
t "TANDEM_HEAD_FORMAT=nvfp4: tandem-exactcheck --spec mtp passes (chain and tree identical to one-token decode)" \
  "TANDEM_HEAD_FORMAT=nvfp4 $ec --spec mtp >$tmp/outh 2>$tmp/err && [ \$(grep -c '^speculative mtp' $tmp/outh) -eq 2 ]"
t "TANDEM_DRAFT_FORMAT=fp8 TANDEM_HEAD_FORMAT=fp8: tandem-exactcheck --spec mtp passes (chain and tree identical to one-token decode)" \
  "TANDEM_DRAFT_FORMAT=fp8 TANDEM_HEAD_FORMAT=fp8 $ec --spec mtp >$tmp/out8 2>$tmp/err && [ \$(grep -c '^speculative mtp' $tmp/out8) -eq 2 ]"
t "tandem-exactcheck: twins checked bit for bit (text and JSON)" \
  "grep -q '^twins forward rows  M=2..6: identical' $tmp/out && grep -q '^twins chain verify  M=2..6: identical' $tmp/out &&
   grep -q '\"case\": \"chain verify\"' $tmp/ec.json"
t "tandem-exactcheck: graphed vs eager is reported not applicable on the cpu backend" \
  "grep -q 'graphed vs eager: not applicable on the cpu backend' $tmp/out && grep -q '\"verdict\": \"not applicable\"' $tmp/ec.json"
t "tandem-exactcheck: an injected difference (TANDEM_SPEC_FAULT=3) fails with exit 1" \
  "TANDEM_SPEC_FAULT=3 $ec --spec ngram >$tmp/out 2>$tmp/err; [ \$? -eq 1 ] && grep -q 'ngram chain 4 .*: fail at token 2' $tmp/out"
t "tandem-exactcheck: a missing prompt file exits 2 naming it" \
  "$EC -m $tmp/m -p $tmp/nope.tok >/dev/null 2>$tmp/err; [ \$? -eq 2 ] && grep -q 'nope.tok' $tmp/err"
t "tandem-exactcheck: no -m exits 2" "$EC -p $tmp/p.tok >/dev/null 2>$tmp/err; [ \$? -eq 2 ]"
t "tandem-exactcheck --backend cuda: exit 2, one line (no device visible, or head_dim 32 that the engine does not take)" \
  "$EC -m $tmp/m -p $tmp/p.tok --backend cuda >/dev/null 2>$tmp/err; [ \$? -eq 2 ] && [ \$(grep -vc '^# ' $tmp/err) -eq 1 ] &&
   grep -Eq 'no CUDA device visible|head_dim 32' $tmp/err"
t "tandem-exactcheck --backend cuda --spec mtp: exit 2, one line (no device visible, or head_dim 32 that the engine does not take)" \
  "$EC -m $tmp/m -p $tmp/p.tok --backend cuda --spec mtp >/dev/null 2>$tmp/err; [ \$? -eq 2 ] && [ \$(grep -vc '^# ' $tmp/err) -eq 1 ] &&
   grep -Eq 'no CUDA device visible|head_dim 32' $tmp/err"
t "tandem-exactcheck --spec draft without --draft-model exits 2" \
  "$EC -m $tmp/m -p $tmp/p.tok --spec draft >/dev/null 2>$tmp/err; [ \$? -eq 2 ]"
t "tandem-exactcheck --rows 40 exits 2" "$EC -m $tmp/m -p $tmp/p.tok --rows 40 >/dev/null 2>$tmp/err; [ \$? -eq 2 ]"

# A near tie, measured: with this seed's model the tree's first divergence from one-token decode is
# a flip across a gap of about 0.003 (found by trying seeds; if the reference's arithmetic changes,
# pick another seed). Reported and excused under the default margin; a failure under a tiny one.
# shellcheck disable=SC2086
$MK -o "$tmp/s6" $small --seed 6 2>"$tmp/err"
ec6="$EC -m $tmp/s6 -p $tmp/p.tok -n 114 --spec ngram --rows 2"
t "tandem-exactcheck: a tree divergence at a near tie is reported with its gap, exit 0" \
  "$ec6 --json $tmp/ec6.json >$tmp/out 2>$tmp/err && grep -q 'tree 3,2,1 .*: near-tie at token [0-9]* (.*gap' $tmp/out &&
   grep -q '(0 failures, 1 near ties)' $tmp/out && grep -q '\"near_ties\": 1' $tmp/ec6.json"
t "tandem-exactcheck: the same divergence under --tie-margin 0.0001 fails, exit 1" \
  "$ec6 --tie-margin 0.0001 >$tmp/out 2>$tmp/err; [ \$? -eq 1 ] && grep -q 'tree 3,2,1 .*: fail at token' $tmp/out"

# The fixture model (transformers' qwen3_5 layout with its MTP layer), when present.
FIX=${TANDEM_FIXTURES:-../shared/fixtures}
if [ -d "$FIX/qwen35-tiny/bf16" ]; then
    t "tandem-exactcheck on the qwen35-tiny fixture (mtp, ngram; chain and tree)" \
      "$EC -m $FIX/qwen35-tiny/bf16 -p $FIX/qwen35-tiny/prompt.tok -n 8 --rows 4 --spec mtp,ngram --tree 2,1 >$tmp/out 2>$tmp/err"
else
    n=$((n + 1)); echo "ok $n # SKIP fixtures not found in $FIX"
fi
echo "1..$n"
