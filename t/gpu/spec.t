#!/bin/sh
# Speculative rounds on the CUDA engine (engine.h: tdm_engine_verify / tdm_engine_verify_tree /
# tdm_engine_commit / tdm_engine_commit_path, and the MTP drafter tdm_engine_mtp). First
# build/t/spec_gpu: chain verify + commit against one-token decode bit for bit on the tiny qwen3_5
# fixture in BF16, FP8 and NVFP4 (every row count 1..32 and committed count, graphed and eager),
# tree rounds (every node against the one-token steps along its path, root-to-node paths
# committed), the round protocol's refusals, the MTP drafter's logits against the CPU reference
# and the fixture (qwen35-tiny in every format, qwen3next-tiny's MoE MTP in BF16), MTP trees on the
# engine (tdm_engine_mtp_node, tdm_engine_mtp_path: a chain of nodes = the chain bit for bit, a tree's
# drafts = the CPU reference's top-b on the same inputs except at near ties, graphed = eager),
# tdm_spec_generate's mtp, ngram and draft chains and trees against plain CUDA
# decode (and without logits, the greedy ids chosen on the device, its tokens, graphed and eager).
# Then the tools on the fixtures: tandem-run --backend cuda --spec mtp, ngram and draft,
# chains and --tree, give plain --backend cuda decode's tokens and logits dump byte for byte, and
# without --dump-logits (the greedy ids path: no logits copied) its tokens, with
# the round statistics on stderr and in --json (mtp chains and trees: the CPU reference's acceptance
# per depth); tandem-exactcheck --backend cuda passes (exit 0: twins with
# tree verify and tree commit, the device's greedy ids of the twins' rows equal to the host argmax
# of their logits, speculative chains and trees of every drafter bit for bit, graphed vs eager, the
# greedy ids path giving the tokens of the runs with logits) and
# fails on an injected difference (exit 1). All of it with the deferred GDN commit (the default);
# exactcheck and tandem-run again with TANDEM_GDN_DEFER=off (the replayed commit): the same bits.
# A draft model's chain and tree with every launch on one stream (TANDEM_CONCURRENT=off): the
# tokens and logits of the sibling projections on two (the default), byte for byte.
# Skips without a CUDA device.
out=$(build/t/spec_gpu)
rc=$?
case "$out" in "1..0 # SKIP"*) echo "$out"; exit 0 ;; esac
printf '%s\n' "$out" | grep -v '^1\.\.[0-9]*$'
n=$(printf '%s\n' "$out" | grep -cE '^(not )?ok ')
t() { n=$((n + 1)); if eval "$2"; then echo "ok $n - $1"; else echo "not ok $n - $1"; sed 's/^/# /' "$tmp/err" 2>/dev/null; fi; }
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
t "build/t/spec_gpu ran to its end (exit $rc: 0 passed, 1 a check failed)" "[ $rc -le 1 ] && printf '%s\n' \"\$out\" | grep -q '^1\.\.'"

FIX=${TANDEM_FIXTURES:-../shared/fixtures}
F=$FIX/qwen35-tiny
if [ ! -d "$F" ]; then
    echo "1..$n"
    exit 0
fi
RUN="bin/tandem-run --backend cuda -p $F/prompt.tok -n 32"
for fmt in bf16 fp8 nvfp4; do
    $RUN -m "$F/$fmt" --dump-logits "$tmp/plain.st" >"$tmp/plain.tok" 2>"$tmp/err" || { sed 's/^/# /' "$tmp/err"; }
    t "$fmt: tandem-run --backend cuda without --dump-logits (greedy ids on the device), graphed and eager, gives the tokens of the run with it" \
      "TANDEM_CUDA_GRAPH=on $RUN -m $F/$fmt >$tmp/ids.tok 2>$tmp/err && [ -s $tmp/plain.tok ] && cmp -s $tmp/ids.tok $tmp/plain.tok &&
       TANDEM_CUDA_GRAPH=off $RUN -m $F/$fmt >$tmp/ids.tok 2>>$tmp/err && cmp -s $tmp/ids.tok $tmp/plain.tok"
    other=bf16; [ $fmt = bf16 ] && other=nvfp4
    for a in "--spec mtp" "--spec mtp --draft 12" "--spec ngram" "--spec ngram --draft 12" "--spec draft --draft-model $F/$fmt" \
             "--spec draft --draft-model $F/$fmt --draft 31" "--spec draft --draft-model $F/$other --draft 3" \
             "--spec ngram --tree 3,2,1" "--spec draft --draft-model $F/$fmt --tree 3,2,1" \
             "--spec mtp --tree 3,2,1" "--spec mtp --tree 2,2,2,1" \
             "--spec draft --draft-model $F/$other --tree 2,2,2,1"; do
        t "$fmt: tandem-run --backend cuda $a gives plain cuda decode's tokens and logits dump, byte for byte, and its tokens without --dump-logits (greedy ids on the device)" \
          "$RUN -m $F/$fmt $a --dump-logits $tmp/spec.st >$tmp/spec.tok 2>$tmp/err && [ -s $tmp/plain.tok ] &&
           cmp -s $tmp/spec.tok $tmp/plain.tok && cmp -s $tmp/spec.st $tmp/plain.st &&
           $RUN -m $F/$fmt $a >$tmp/ids.tok 2>$tmp/err.ids && cmp -s $tmp/ids.tok $tmp/plain.tok"
        printf '#   %s: %s\n' "$a" "$(grep '^# speculative:' "$tmp/err" | sed 's/^# //')"
    done
done
t "tandem-run --backend cuda --spec draft: statistics on stderr and in --json" \
  "$RUN -m $F/bf16 --spec draft --draft-model $F/bf16 --json $tmp/run.json >/dev/null 2>$tmp/err &&
   grep -q '^# acceptance by draft depth: 1:1.000' $tmp/err && grep -q '^# round shape chain of 5 nodes' $tmp/err &&
   grep -q '^# GDN state traffic (deferred commit)' $tmp/err && grep -q '\"accepted_per_round\"' $tmp/run.json &&
   [ \$(build/t/json_get $tmp/run.json backend) = '\"cuda\"' ]"
t "tandem-run --backend cuda --spec mtp: statistics on stderr and in --json; acceptance per depth as the CPU reference's" \
  "$RUN -m $F/bf16 --spec mtp --json $tmp/run.json >/dev/null 2>$tmp/err &&
   grep -q '^# round shape chain of 5 nodes' $tmp/err && grep -q '^# GDN state traffic (deferred commit)' $tmp/err &&
   grep -q '\"accepted_per_round\"' $tmp/run.json && grep '^# acceptance by draft depth' $tmp/err >$tmp/acc.cuda &&
   bin/tandem-run --backend cpu -m $F/bf16 -p $F/prompt.tok -n 32 --spec mtp >/dev/null 2>$tmp/err.cpu &&
   grep '^# acceptance by draft depth' $tmp/err.cpu >$tmp/acc.cpu && cmp -s $tmp/acc.cuda $tmp/acc.cpu"
printf '#   cuda %s\n#   cpu  %s\n' "$(cat "$tmp/acc.cuda" 2>/dev/null)" "$(cat "$tmp/acc.cpu" 2>/dev/null)"
t "tandem-run --backend cuda --spec draft --tree 3,2,1: tree round shapes and full acceptance on stderr" \
  "$RUN -m $F/bf16 --spec draft --draft-model $F/bf16 --tree 3,2,1 >/dev/null 2>$tmp/err &&
   grep -q '^# acceptance by draft depth: 1:1.000 2:1.000 3:1.000' $tmp/err && grep -q '^# round shape tree of 16 nodes' $tmp/err"
for df in nvfp4:NVFP4 fp8:FP8; do
t "TANDEM_DRAFT_FORMAT=${df%:*}: tandem-run --backend cuda --spec mtp, chain and tree, graphed and eager, gives plain cuda decode's tokens; the drafter's bytes on stderr" \
  "$RUN -m $F/bf16 >$tmp/plain.tok 2>$tmp/err &&
   TANDEM_DRAFT_FORMAT=${df%:*} $RUN -m $F/bf16 --spec mtp >$tmp/q.tok 2>$tmp/err && cmp -s $tmp/q.tok $tmp/plain.tok &&
   grep -q '^# drafter: the MTP layer, requantized to ${df#*:}' $tmp/err &&
   TANDEM_DRAFT_FORMAT=${df%:*} TANDEM_CUDA_GRAPH=off $RUN -m $F/bf16 --spec mtp --tree 3,2,1 >$tmp/q.tok 2>>$tmp/err && cmp -s $tmp/q.tok $tmp/plain.tok &&
   TANDEM_DRAFT_FORMAT=${df%:*} $RUN -m $F/nvfp4 --spec mtp --tree 3,2,1 >$tmp/q.tok 2>>$tmp/err &&
   $RUN -m $F/nvfp4 >$tmp/plain4.tok 2>>$tmp/err && cmp -s $tmp/q.tok $tmp/plain4.tok"
t "TANDEM_DRAFT_FORMAT=${df%:*}: tandem-exactcheck --backend cuda --spec mtp: exit 0" \
  "TANDEM_DRAFT_FORMAT=${df%:*} bin/tandem-exactcheck --backend cuda -p $F/prompt.tok -n 24 -m $F/bf16 --spec mtp >$tmp/out 2>$tmp/err &&
   grep -q '^speculative mtp   chain 4 .*: identical' $tmp/out"
done
# An MTP tree's drafts are the CPU reference's up to MTP near ties (build/t/spec_gpu reports the
# margins), so the acceptance per depth is the CPU's when both emit the same tokens (the CPU's tree is
# the factored form, which may flip a near tie of the main model: then there is nothing to compare).
t "tandem-run --backend cuda --spec mtp --tree 3,2,1: tree round shapes on stderr; acceptance per depth as the CPU reference's (when its tokens are the same)" \
  "$RUN -m $F/bf16 --spec mtp --tree 3,2,1 >$tmp/tok.cuda 2>$tmp/err && grep -q '^# round shape tree of 16 nodes' $tmp/err &&
   grep -q '^# GDN state traffic (deferred commit)' $tmp/err && grep '^# acceptance by draft depth' $tmp/err >$tmp/acc.cuda &&
   bin/tandem-run --backend cpu -m $F/bf16 -p $F/prompt.tok -n 32 --spec mtp --tree 3,2,1 >$tmp/tok.cpu 2>$tmp/err.cpu &&
   grep '^# acceptance by draft depth' $tmp/err.cpu >$tmp/acc.cpu && { ! cmp -s $tmp/tok.cuda $tmp/tok.cpu || cmp -s $tmp/acc.cuda $tmp/acc.cpu; }"
printf '#   cuda %s\n#   cpu  %s\n#   the tokens: %s\n' "$(cat "$tmp/acc.cuda" 2>/dev/null)" "$(cat "$tmp/acc.cpu" 2>/dev/null)" \
    "$(cmp -s "$tmp/tok.cuda" "$tmp/tok.cpu" && echo the same || echo 'differ: acceptance not compared')"

EC="bin/tandem-exactcheck --backend cuda -p $F/prompt.tok -n 24"
for fmt in bf16 nvfp4; do
    t "tandem-exactcheck --backend cuda, $fmt, mtp, ngram and a draft model, chains and trees: exit 0, twins identical, graphed = eager" \
      "$EC -m $F/$fmt --draft-model $F/bf16 --json $tmp/ec.json >$tmp/out 2>$tmp/err &&
       [ \$(grep -c '^twins .*: identical' $tmp/out) -eq 5 ] && grep -q '^twins tree+commit ' $tmp/out &&
       grep -q '^speculative mtp   chain 4 .*: identical' $tmp/out &&
       grep -q '^speculative ngram chain 4 .*: identical' $tmp/out && grep -q '^speculative draft chain 4 .*: identical' $tmp/out &&
       grep -q '^speculative ngram tree 3,2,1 .*: identical; .*differing in bits 0 of' $tmp/out &&
       grep -q '^speculative draft tree 3,2,1 .*: identical; .*differing in bits 0 of' $tmp/out &&
       grep -q '^speculative mtp   tree 3,2,1 .*: identical; .*differing in bits 0 of' $tmp/out &&
       [ \$(grep -c '^graphed vs eager .*: identical' $tmp/out) -eq 7 ] &&
       [ \$(grep -c '^greedy ids path .*: identical' $tmp/out) -eq 7 ] &&
       grep -q '^device greedy ids of (a).s rows vs the host argmax of their logits: [1-9][0-9]* rows: identical (0 differ)' $tmp/out &&
       [ \$(build/t/json_get $tmp/ec.json device_ids.verdict) = '\"identical\"' ] &&
       [ \$(build/t/json_get $tmp/ec.json graphs.ids_path_verdict) = '\"identical\"' ] &&
       [ \$(build/t/json_get $tmp/ec.json verdict) = '\"pass\"' ] && [ \$(build/t/json_get $tmp/ec.json graphs.verdict) = '\"identical\"' ]"
    sed 's/^/#   /' "$tmp/out"
done
# in_proj_b and in_proj_a as two products (TANDEM_GDN_FUSE_BA=off) writing their rows side by side
# as the one product does: verify, commit and tree commit still equal one-token decode, and the
# outputs equal the one product's bit for bit (6x256 and 12x256 both sum in one chain).
t "TANDEM_GDN_FUSE_BA=off: tandem-exactcheck --backend cuda, bf16, ngram: exit 0, twins (tree+commit too) and ngram chain and tree identical" \
  "TANDEM_GDN_FUSE_BA=off $EC -m $F/bf16 --spec ngram >$tmp/out 2>$tmp/err &&
   grep -q 'one product in 0 of 3 GDN layers' $tmp/err && [ \$(grep -c '^twins .*: identical' $tmp/out) -eq 5 ] &&
   grep -q '^speculative ngram chain 4 .*: identical' $tmp/out &&
   grep -q '^speculative ngram tree 3,2,1 .*: identical; .*differing in bits 0 of' $tmp/out"
sed 's/^/#   /' "$tmp/out"
t "TANDEM_GDN_FUSE_BA=off: tandem-run --backend cuda --spec ngram --tree 3,2,1 gives one product's plain decode, byte for byte" \
  "$RUN -m $F/bf16 --dump-logits $tmp/plain.st >$tmp/plain.tok 2>$tmp/err &&
   TANDEM_GDN_FUSE_BA=off $RUN -m $F/bf16 --spec ngram --tree 3,2,1 --dump-logits $tmp/spec.st >$tmp/spec.tok 2>$tmp/err &&
   [ -s $tmp/plain.tok ] && cmp -s $tmp/spec.tok $tmp/plain.tok && cmp -s $tmp/spec.st $tmp/plain.st"
# the replayed commit (TANDEM_GDN_DEFER=off; deferred is the default, run everywhere above): the
# same bits, the engine's line and the statistics say so, the state read twice a chain round
t "TANDEM_GDN_DEFER=off: tandem-exactcheck --backend cuda, bf16, mtp, ngram, a draft model: exit 0, twins, chains and trees identical, graphed = eager" \
  "TANDEM_GDN_DEFER=off $EC -m $F/bf16 --draft-model $F/bf16 >$tmp/out 2>$tmp/err &&
   grep -q 'GDN commits replayed at the commit (TANDEM_GDN_DEFER=off)' $tmp/err &&
   [ \$(grep -c '^twins .*: identical' $tmp/out) -eq 5 ] && grep -q '^twins tree+commit ' $tmp/out &&
   grep -q '^speculative mtp   chain 4 .*: identical' $tmp/out && grep -q '^speculative ngram chain 4 .*: identical' $tmp/out &&
   grep -q '^speculative ngram tree 3,2,1 .*: identical; .*differing in bits 0 of' $tmp/out &&
   [ \$(grep -c '^graphed vs eager .*: identical' $tmp/out) -eq 7 ]"
sed 's/^/#   /' "$tmp/out"
t "TANDEM_GDN_DEFER=off: tandem-run --backend cuda --spec mtp and --spec ngram --tree 3,2,1 give the deferred runs' tokens and logits, byte for byte; the statistics say replayed" \
  "$RUN -m $F/bf16 --spec mtp --dump-logits $tmp/d.st >$tmp/d.tok 2>$tmp/err &&
   TANDEM_GDN_DEFER=off $RUN -m $F/bf16 --spec mtp --dump-logits $tmp/r.st >$tmp/r.tok 2>$tmp/err &&
   grep -q '^# GDN state traffic (replayed commit)' $tmp/err && [ -s $tmp/d.tok ] && cmp -s $tmp/d.tok $tmp/r.tok &&
   cmp -s $tmp/d.st $tmp/r.st &&
   $RUN -m $F/bf16 --spec ngram --tree 3,2,1 --dump-logits $tmp/d.st >$tmp/d.tok 2>$tmp/err &&
   TANDEM_GDN_DEFER=off $RUN -m $F/bf16 --spec ngram --tree 3,2,1 --dump-logits $tmp/r.st >$tmp/r.tok 2>$tmp/err &&
   cmp -s $tmp/d.tok $tmp/r.tok && cmp -s $tmp/d.st $tmp/r.st"
# one stream (TANDEM_CONCURRENT=off) against two: the verifies' and tree verifies' graphs, with and
# without the side branches, and the draft model's steps give the same bits
for a in "--spec draft --draft-model $F/bf16" "--spec draft --draft-model $F/bf16 --tree 3,2,1"; do
    t "TANDEM_CONCURRENT=off: tandem-run --backend cuda $a gives the two streams' tokens and logits, byte for byte; the engine's line says one stream" \
      "$RUN -m $F/bf16 $a --dump-logits $tmp/c2.st >$tmp/c2.tok 2>$tmp/err &&
       grep -q 'sibling projections on two streams' $tmp/err &&
       TANDEM_CONCURRENT=off $RUN -m $F/bf16 $a --dump-logits $tmp/c1.st >$tmp/c1.tok 2>$tmp/err &&
       grep -q 'sibling projections on one stream (TANDEM_CONCURRENT=off)' $tmp/err &&
       [ -s $tmp/c2.tok ] && cmp -s $tmp/c1.tok $tmp/c2.tok && cmp -s $tmp/c1.st $tmp/c2.st"
done
# the products reading x as written (TANDEM_MM_XB=off) against the blocked copies, NVFP4 (the form
# that reads them): the verifies' rows, chain and tree, give the same bits
for a in "--spec ngram" "--spec mtp --tree 3,2,1"; do
    t "TANDEM_MM_XB=off: tandem-run --backend cuda -m nvfp4 $a gives the blocked copies' tokens and logits, byte for byte" \
      "$RUN -m $F/nvfp4 $a --dump-logits $tmp/x1.st >$tmp/x1.tok 2>$tmp/err &&
       grep -q '; blocked product inputs at 1-32 rows' $tmp/err &&
       TANDEM_MM_XB=off $RUN -m $F/nvfp4 $a --dump-logits $tmp/x0.st >$tmp/x0.tok 2>$tmp/err &&
       [ -s $tmp/x1.tok ] && cmp -s $tmp/x0.tok $tmp/x1.tok && cmp -s $tmp/x0.st $tmp/x1.st"
done
t "tandem-exactcheck --backend cuda: an injected difference (TANDEM_SPEC_FAULT=3) fails with exit 1" \
  "TANDEM_SPEC_FAULT=3 $EC -m $F/bf16 --spec ngram >$tmp/out 2>$tmp/err; [ \$? -eq 1 ] &&
   grep -q '^speculative ngram chain 4 .*: fail at token 2' $tmp/out"
if [ -d "$FIX/qwen3next-tiny" ]; then
    t "tandem-exactcheck --backend cuda --spec mtp on qwen3next-tiny (MoE MTP layer): exit 0, the chain and the tree identical, graphed = eager" \
      "$EC -m $FIX/qwen3next-tiny/bf16 -p $FIX/qwen3next-tiny/prompt.tok --spec mtp >$tmp/out 2>$tmp/err &&
       grep -q '^speculative mtp   chain 4 .*: identical' $tmp/out &&
       grep -q '^speculative mtp   tree 3,2,1 .*: identical; .*differing in bits 0 of' $tmp/out &&
       [ \$(grep -c '^graphed vs eager .*: identical' $tmp/out) -eq 3 ] &&
       [ \$(grep -c '^greedy ids path .*: identical' $tmp/out) -eq 3 ]"
    sed 's/^/#   /' "$tmp/out"
else
    n=$((n + 1)); echo "ok $n # SKIP fixture qwen3next-tiny not found in $FIX"
fi
echo "1..$n"
