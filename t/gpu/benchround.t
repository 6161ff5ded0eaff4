#!/bin/sh
# tandem-benchround on the CUDA engine, a few repeats on the tiny fixtures: qwen35-tiny (dense, with
# its MTP layer) in BF16 and NVFP4, qwen3next-tiny (MoE, 8 experts, top 2, an MoE MTP layer), and a
# synthetic qwen3_5 without an MTP layer. Each: exit 0; one stdout line a series (step, the chains
# and trees asked for, spec k=1..4, the step again) and the acceptance table; the JSON has every
# figure with positive times, the trees' node counts and committed paths, the GDN state bytes the
# engine counts (deferred commit, the default: a chain round reads each state once and writes it
# once, in the verify that applies the previous commit's rows; TANDEM_GDN_DEFER=off: it reads it
# once to verify and once more to commit, and writes it once; a tree verify reads it again for
# every node whose parent is not the node before it), the
# routed experts the rows touch, the drafter timed where there is an MTP layer and said absent where
# not, and the targets; TANDEM_CUDA_GRAPH=off runs eager and says so. Skips without a CUDA device.
BR=bin/tandem-benchround
JG=build/t/json_get
. t/qwen35-tiny.sh
. t/gpu-skip.sh
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
# a rep is three rounds (one per verify variant): (2 warm-ups + 3 reps) x 3 x 32 rows + the prompt < 1024
ARGS="--reps 3 --prompt 40 --ctx 1024 --rows 1,2,32 --tree 3,2,1 --tree 8,3"
# shellcheck disable=SC2086
$BR -m "$F/bf16" $ARGS --json "$tmp/bf16.json" >"$tmp/bf16.out" 2>"$tmp/bf16.err"
rc=$?
skip_without_device $rc "$tmp/bf16.err"
n=0
t() { n=$((n + 1)); if eval "$2"; then echo "ok $n - $1"; else echo "not ok $n - $1"; sed 's/^/# /' "$tmp/err" 2>/dev/null; fi; }
# every path given is a number > 0
pos() {
    j=$1; shift
    for p in "$@"; do
        v=$($JG "$j" "$p") && awk -v v="$v" 'BEGIN { exit !(v + 0 > 0) }' || { echo "$p: ${v:-absent}" >>"$tmp/err"; return 1; }
    done
}
eq() { v=$($JG "$1" "$2") && [ "$v" = "$3" ] || { echo "$2: ${v:-absent}, expected $3" >>"$tmp/err"; return 1; }; }
# a number within 1e-9 of $3
near() {
    v=$($JG "$1" "$2") && awk -v v="$v" -v w="$3" 'BEGIN { d = v - w; exit !(d < 1e-9 && d > -1e-9) }' ||
        { echo "$2: ${v:-absent}, expected $3" >>"$tmp/err"; return 1; }
}
TIMES="verify_ms verify_ms_min verify_last_row_logits_ms commit_ms commit_ms_min round_ms round_ms_min x_step
       round_last_row_logits_ms x_step_last_row_logits verify_ids_ms verify_ids_ms_min round_ids_ms x_step_ids
       bytes.weights_even bytes.kv bytes.gdn_state bytes.total_even gb_per_s"
# the series' figures: $1 the JSON, $2 the array, $3 its length
series_ok() {
    i=0
    while [ $i -lt "$3" ]; do
        for f in $TIMES; do pos "$1" "$2.$i.$f" || return 1; done
        i=$((i + 1))
    done
    ! $JG "$1" "$2.$3" >/dev/null 2>&1
}
# Each figure is also timed with only the greedy ids copied (ids_ms, verify_ids_ms, round_ids_ms,
# x_step_ids, ids_speedup: tdm_engine_forward_ids / tdm_engine_verify_ids with no logits).
# $1 the model's name, $2 the JSON, $3 its stdout, $4 whether the drafter runs (true/false), $5 the
# FP32 GDN state bytes of the model (all layers), $6 its stderr
check_run() {
    t "$1: one stdout line a series and the acceptance table" \
      "[ \$(grep -c '^chain ' $3) -eq 3 ] && [ \$(grep -c '^tree ' $3) -eq 2 ] && [ \$(grep -c '^spec  k=' $3) -eq 4 ] &&
       grep -q '^step  1 ' $3 && grep -q '^step  again ' $3 && grep -q '^kind ' $3 && grep -q '^drafts ' $3 &&
       [ \$(grep -cE '^[1-4] ' $3) -eq 4 ]"
    : >"$tmp/err"
    t "$1: the JSON has the step's figures, positive" \
      "pos $2 step.ms step.ms_min step.tokens_per_s step.bytes.total_even step.gb_per_s step_again.ms &&
       pos $2 step.ids_ms step.ids_tokens_per_s step_again.ids_ms &&
       eq $2 step.includes_logits_copy true && eq $2 step.bytes.gdn_state $((2 * $5)).0"
    t "$1: every chain, tree and spec series has every figure, positive" \
      "series_ok $2 chain 3 && series_ok $2 tree 2 && series_ok $2 spec 4"
    t "$1: rows and committed paths: chains commit every row; tree 3,2,1 has 16 nodes and commits 4, tree 8,3 is cut at 32 and commits 3" \
      "eq $2 chain.2.rows 32 && eq $2 chain.2.committed 32 && eq $2 tree.0.rows 16 && eq $2 tree.0.committed 4 &&
       eq $2 tree.1.rows 32 && eq $2 tree.1.committed 3 && eq $2 spec.3.rows 5 && eq $2 spec.3.committed 5"
    # tree 3,2,1: 5 nodes whose parent is not the node before (4 6 9 11 14), so 6 reads; deferred, the
    # verify writes each state once (the previous commit's rows applied); replayed, the commit reads and writes it
    t "$1: deferred GDN commit (the default; stderr and the JSON say so); state bytes a round as the engine counts them: a chain 2x the state (one read, one write), tree 3,2,1 7x" \
      "eq $2 gdn_commit '\"deferred\"' && grep -q '^# GDN commit: deferred' $6 &&
       eq $2 chain.0.bytes.gdn_state $((2 * $5)).0 && eq $2 chain.2.bytes.gdn_state $((2 * $5)).0 &&
       eq $2 spec.3.bytes.gdn_state $((2 * $5)).0 && eq $2 tree.0.bytes.gdn_state $((7 * $5)).0"
    t "$1: the drafter: mtp.timed $4, spec draft_ms $( [ "$4" = true ] && echo positive || echo null)" \
      "eq $2 mtp.timed $4 && eq $2 spec.0.drafter $4 &&
       if [ $4 = true ]; then pos $2 spec.0.draft_ms spec.3.draft_ms acceptance.3.draft_ms; else eq $2 spec.0.draft_ms null; fi"
    t "$1: the acceptance table and the targets" \
      "pos $2 acceptance.0.round_ms acceptance.3.tokens_per_s acceptance.3.speedup targets.round32.x_step targets.speedup.best &&
       pos $2 acceptance.0.round_ids_ms acceptance.3.ids_tokens_per_s acceptance.3.ids_speedup &&
       pos $2 targets.round32.x_step_ids targets.speedup.best_ids &&
       near $2 acceptance.0.tokens_per_round 1.9 && near $2 acceptance.3.tokens_per_round 3.79 && eq $2 targets.round16 null &&
       eq $2 targets.speedup.drafter_timed $4"
}

# qwen35-tiny: 3 GDN layers of 6 x 64 x 64 FP32 states
S35=$((3 * 6 * 64 * 64 * 4))
t "qwen35-tiny bf16: exit 0 (exit $rc)" "[ $rc -eq 0 ] && grep -q '^# drafter: the MTP layer drafts on the engine' $tmp/bf16.err"
sed 's/^/#   /' "$tmp/bf16.out"
check_run "qwen35-tiny bf16" "$tmp/bf16.json" "$tmp/bf16.out" true $S35 "$tmp/bf16.err"
t "qwen35-tiny bf16: a dense model reads every weight at every row count (no experts)" \
  "eq $tmp/bf16.json chain.2.bytes.experts_max 0.0 && [ \$($JG $tmp/bf16.json chain.0.bytes.weights_even) = \$($JG $tmp/bf16.json chain.2.bytes.weights_even) ]"

# shellcheck disable=SC2086
t "qwen35-tiny nvfp4: exit 0" "$BR -m $F/nvfp4 $ARGS --json $tmp/nvfp4.json >$tmp/nvfp4.out 2>$tmp/nvfp4.err"
check_run "qwen35-tiny nvfp4" "$tmp/nvfp4.json" "$tmp/nvfp4.out" true $S35 "$tmp/nvfp4.err"

N=$FIX/qwen3next-tiny
if [ -d "$N" ]; then
    # qwen3next-tiny: 3 GDN layers of 4 x 64 x 64 FP32 states; 8 experts, top 2
    # shellcheck disable=SC2086
    t "qwen3next-tiny bf16: exit 0" "$BR -m $N/bf16 $ARGS --json $tmp/next.json >$tmp/next.out 2>$tmp/next.err"
    sed 's/^/#   /' "$tmp/next.out"
    check_run "qwen3next-tiny bf16" "$tmp/next.json" "$tmp/next.out" true $((3 * 4 * 64 * 64 * 4)) "$tmp/next.err"
    t "qwen3next-tiny: one row touches top_k = 2 experts a layer, 32 rows may touch all 8 (7.9 expected)" \
      "eq $tmp/next.json step.bytes.experts_max 2.0 && eq $tmp/next.json chain.0.bytes.experts_max 2.0 &&
       eq $tmp/next.json chain.2.bytes.experts_max 8.0 && pos $tmp/next.json chain.2.bytes.experts_even &&
       awk -v a=\$($JG $tmp/next.json chain.0.bytes.weights_even) -v b=\$($JG $tmp/next.json chain.2.bytes.weights_even) 'BEGIN { exit !(a < b) }'"
else
    n=$((n + 1)); echo "ok $n # SKIP fixture qwen3next-tiny not found in $FIX"
fi

if bin/tandem-mkmodel -o "$tmp/nomtp" --no-mtp >/dev/null 2>"$tmp/err"; then
    # the synthetic tiny qwen3_5: 3 GDN layers of 6 x 64 x 64 FP32 states
    # shellcheck disable=SC2086
    t "a model without an MTP layer: exit 0, stderr says the spec rounds run without a drafter" \
      "$BR -m $tmp/nomtp $ARGS --json $tmp/nomtp.json >$tmp/nomtp.out 2>$tmp/nomtp.err &&
       grep -q '^# drafter: the checkpoint has no MTP layer' $tmp/nomtp.err && grep -q 'no drafter time' $tmp/nomtp.err"
    check_run "no MTP layer" "$tmp/nomtp.json" "$tmp/nomtp.out" false $S35 "$tmp/nomtp.err"
    t "no MTP layer: the JSON says so" "eq $tmp/nomtp.json mtp.present false"
else
    n=$((n + 1)); echo "not ok $n - tandem-mkmodel --no-mtp failed"; sed 's/^/# /' "$tmp/err"
fi

t "TANDEM_GDN_DEFER=off: replayed commits, exit 0, stderr and the JSON say so; state bytes a round: a chain 3x the state (two reads, one write), tree 3,2,1 8x" \
  "TANDEM_GDN_DEFER=off $BR -m $F/bf16 --reps 2 --prompt 40 --ctx 512 --rows 4 --tree 3,2,1 --json $tmp/off.json >/dev/null 2>$tmp/err &&
   eq $tmp/off.json gdn_commit '\"replayed\"' && grep -q '^# GDN commit: replayed' $tmp/err &&
   eq $tmp/off.json chain.0.bytes.gdn_state $((3 * S35)).0 && eq $tmp/off.json tree.0.bytes.gdn_state $((8 * S35)).0 &&
   pos $tmp/off.json chain.0.commit_ms chain.0.round_ms tree.0.round_ms"
t "TANDEM_CUDA_GRAPH=off: eager rounds, exit 0, the JSON says so" \
  "TANDEM_CUDA_GRAPH=off $BR -m $F/bf16 --reps 2 --prompt 40 --ctx 512 --rows 4 --tree 2,1 --json $tmp/eager.json >/dev/null 2>$tmp/err &&
   eq $tmp/eager.json graphs '\"off\"' && pos $tmp/eager.json chain.0.round_ms tree.0.round_ms spec.3.round_ms"
echo "1..$n"
