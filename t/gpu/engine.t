#!/bin/sh
# The CUDA engine on the GPU (src/common/engine.h). build/t/engine_gpu: its glue kernels against
# ref.c; the forward on the tiny fixtures (qwen35-tiny: dense qwen3_5; qwen3next-tiny: qwen3_next
# with grouped GDN projections and MoE) in BF16, FP8 and NVFP4 against the fixture's logits and the
# CPU reference; greedy ids; the prompt in one call against one-row and 5-row calls, bit for bit;
# context overflow refused. Then, for both fixtures, tandem-run --backend cuda through
# fixture_check (the CPU reference's gate, on the engine's dumps: prompt logits, greedy ids, step
# logits under --force; the greedy ids run without --dump-logits, so they are chosen on the device),
# graphed decode steps against eager ones bit for bit, and the greedy ids path (no --dump-logits:
# ids chosen on the device, no logits copied but the last step's) giving the logits path's tokens,
# graphed and eager, with every device id equal to the host argmax where the logits come;
# qwen35-tiny's in_proj_b and in_proj_a run as one product in each GDN layer (the engine's line says
# so); the real 27B layer shapes and the real Qwen3-Next-80B-A3B layer shapes (512 experts,
# top-10) in every format against the CPU reference, the 27B's also with in_proj_b and in_proj_a as
# two products (TANDEM_GDN_FUSE_BA=off) bit for bit as one; and a synthetic qwen3_5_moe model
# against the CPU reference, its prefill with the MoE experts grouped (TANDEM_MOE_GROUPED on) and
# in 32-row chunks (off); qwen3next-tiny's prompt with TANDEM_MOE_GROUPED off too.
# Skips without a CUDA device.
out=$(build/t/engine_gpu)
rc=$?
case "$out" in "1..0 # SKIP"*) echo "$out"; exit 0 ;; esac
printf '%s\n' "$out" | grep -v '^1\.\.[0-9]*$'
n=$(printf '%s\n' "$out" | grep -cE '^(not )?ok ')
t() { n=$((n + 1)); if eval "$2"; then echo "ok $n - $1"; else echo "not ok $n - $1"; fi; }
t "build/t/engine_gpu ran to its end (exit $rc: 0 passed, 1 a check failed)" "[ $rc -le 1 ] && printf '%s\n' \"\$out\" | grep -q '^1\.\.'"

FIX=${TANDEM_FIXTURES:-../shared/fixtures}
if [ ! -d "$FIX/qwen35-tiny" ]; then
    echo "1..$n"
    exit 0
fi
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
RUN="bin/tandem-run --backend cuda"
for model in qwen35-tiny qwen3next-tiny; do
F=$FIX/$model
[ -d "$F" ] || { echo "# $F not found: skipped"; continue; }
for fmt in bf16 fp8 nvfp4; do
    steps=$(grep -cv '^[[:space:]]*$' "$F/greedy-$fmt.tok")
    t "tandem-run --backend cuda, $model/$fmt: prompt dump, $steps greedy ids, forced steps" \
      "$RUN -m $F/$fmt -p $F/prompt.tok -n 0 --dump-logits $tmp/prompt.st 2>$tmp/err &&
       $RUN -m $F/$fmt -p $F/prompt.tok -n $steps >$tmp/greedy.tok 2>>$tmp/err &&
       $RUN -m $F/$fmt -p $F/prompt.tok --force $F/greedy-$fmt.tok --dump-logits $tmp/forced.st >/dev/null 2>>$tmp/err ||
       { sed 's/^/# /' $tmp/err; false; }"
    grep '^# CUDA engine' "$tmp/err" | head -1
    if [ $model = qwen35-tiny ]; then
        t "tandem-run --backend cuda, $model/$fmt: in_proj_b and in_proj_a one product in each of the 3 GDN layers" \
          "grep '^# CUDA engine' $tmp/err | head -1 | grep -q 'in_proj_b + in_proj_a one product in 3 of 3 GDN layers'"
    fi
    t "tandem-run --backend cuda, $model/$fmt: fixture_check bounds" \
      "build/t/fixture_check $F $fmt $tmp/prompt.st $tmp/greedy.tok $tmp/forced.st >$tmp/tap 2>&1;
       rc=\$?; sed 's/^/#   /' $tmp/tap; [ \$rc -eq 0 ]"
    if [ $model = qwen3next-tiny ]; then
        # the 40-token prompt: one prefill chunk through the experts' grouped form (the default), then
        # 32-row chunks through the per-pair kernels (TANDEM_MOE_GROUPED=off): both within fixture_check's bounds
        t "tandem-run --backend cuda, $model/$fmt: the prompt in one chunk, MoE experts grouped (TANDEM_MOE_GROUPED=on)" \
          "grep '^# CUDA engine' $tmp/err | head -1 | grep -q 'MoE experts grouped'"
        t "tandem-run --backend cuda, $model/$fmt, TANDEM_MOE_GROUPED=off (32-row chunks, per-pair experts): fixture_check bounds" \
          "TANDEM_MOE_GROUPED=off $RUN -m $F/$fmt -p $F/prompt.tok -n 0 --dump-logits $tmp/prompt-off.st 2>$tmp/err.off &&
           TANDEM_MOE_GROUPED=off $RUN -m $F/$fmt -p $F/prompt.tok -n $steps >$tmp/greedy-off.tok 2>>$tmp/err.off &&
           TANDEM_MOE_GROUPED=off $RUN -m $F/$fmt -p $F/prompt.tok --force $F/greedy-$fmt.tok --dump-logits $tmp/forced-off.st >/dev/null 2>>$tmp/err.off &&
           grep '^# CUDA engine' $tmp/err.off | head -1 | grep -q 'chunks of 32 tokens.*TANDEM_MOE_GROUPED=off' &&
           build/t/fixture_check $F $fmt $tmp/prompt-off.st $tmp/greedy-off.tok $tmp/forced-off.st >$tmp/tap 2>&1;
           rc=\$?; sed 's/^/#   /' $tmp/tap; [ \$rc -eq 0 ] || { sed 's/^/# /' $tmp/err.off; false; }"
    fi
    t "tandem-run --backend cuda, $model/$fmt: forced steps without --dump-logits (greedy ids on the device) print the argmax ids of the run with it" \
      "$RUN -m $F/$fmt -p $F/prompt.tok --force $F/greedy-$fmt.tok --dump-logits $tmp/forced.st >$tmp/forced-l.tok 2>$tmp/err &&
       $RUN -m $F/$fmt -p $F/prompt.tok --force $F/greedy-$fmt.tok >$tmp/forced-i.tok 2>>$tmp/err &&
       [ -s $tmp/forced-l.tok ] && cmp -s $tmp/forced-l.tok $tmp/forced-i.tok || { sed 's/^/# /' $tmp/err; false; }"
done
for fmt in bf16 nvfp4; do
    t "tandem-run --backend cuda, $model/$fmt: 24 greedy steps from the captured graph (TANDEM_CUDA_GRAPH=on) equal eager launches (off), every logit bit for bit" \
      "TANDEM_CUDA_GRAPH=on $RUN -m $F/$fmt -p $F/prompt.tok -n 24 --dump-logits $tmp/g.st >$tmp/g.tok 2>$tmp/err &&
       TANDEM_CUDA_GRAPH=off $RUN -m $F/$fmt -p $F/prompt.tok -n 24 --dump-logits $tmp/e.st >$tmp/e.tok 2>>$tmp/err &&
       cmp -s $tmp/g.st $tmp/e.st && cmp -s $tmp/g.tok $tmp/e.tok || { sed 's/^/# /' $tmp/err; false; }"
    t "tandem-run --backend cuda, $model/$fmt: 24 greedy steps on the ids path (no --dump-logits), graphed and eager, give the logits path's tokens; with --dump-logits the device's id equals the host argmax on all 23 steps" \
      "TANDEM_CUDA_GRAPH=on $RUN -m $F/$fmt -p $F/prompt.tok -n 24 --dump-logits $tmp/g.st >$tmp/g.tok 2>$tmp/err.l &&
       TANDEM_CUDA_GRAPH=on $RUN -m $F/$fmt -p $F/prompt.tok -n 24 >$tmp/gi.tok 2>$tmp/err.g &&
       TANDEM_CUDA_GRAPH=off $RUN -m $F/$fmt -p $F/prompt.tok -n 24 >$tmp/ei.tok 2>$tmp/err.e &&
       cmp -s $tmp/gi.tok $tmp/g.tok && cmp -s $tmp/ei.tok $tmp/g.tok &&
       grep -q '^# greedy ids chosen on the device: logits copied on 23 of 23 steps (--dump-logits); the device.s id equals their host argmax on 23 of 23' $tmp/err.l &&
       grep -q '^# greedy ids chosen on the device: logits copied on 1 of 23 steps (the last, for the hash); the device.s id equals their host argmax on 1 of 1' $tmp/err.g &&
       [ \"\$(grep '^# last logits hash' $tmp/err.l)\" = \"\$(grep '^# last logits hash' $tmp/err.g)\" ] ||
       { cat $tmp/err.l $tmp/err.g $tmp/err.e 2>/dev/null | sed 's/^/# /'; false; }"
done
done
# The real Qwen3.8-27B layer shapes (H 5120, attention 24/4 heads of 256, GDN 16/48 heads of 128,
# MLP 17408), two layers (GDN, attention) and a cut vocabulary, in each stored format: the engine's
# logits against the CPU reference's over a 6-token prompt and 3 greedy steps (teacher-forced on
# the CPU's ids). Bound 2e-2: the fixtures' bound for the GPU against the reference. Then the same
# forced run with in_proj_b and in_proj_a as two 48x5120 products (TANDEM_GDN_FUSE_BA=off): every
# logit bit for bit as the one 96x5120 product's (tdm_mm_kchains gives both shapes 8 chains, and
# nothing else of a shape changes a column's bits), and the engine's line says one product in 1 of
# 1 GDN layers, then 0 of 1; and with the gate's product and up's with the SiLU x up
# (TANDEM_MLP_FUSE=off) instead of one SwiGLU product (NVFP4 and FP8 with nt 2 settings; BF16 runs
# the two either way): the same; and a 12-row prompt under the default (auto) and with it on: the
# same, the engine's line naming the forms at each row count.
# And with every launch on one stream (TANDEM_CONCURRENT=off) instead of the sibling projections on
# two (the 6-row prompt eager, the steps from graphs with the branches in them): the same bits, and
# the engine's line says which. And with the products reading their inputs as written
# (TANDEM_MM_XB=off) instead of the blocked copies: the same bits.
printf '5 17 99 3 250 7\n' >"$tmp/p27.tok"
printf '5 17 99 3 250 7 11 42 8 1000 64 2\n' >"$tmp/p12.tok"
for fmt in bf16 fp8 nvfp4; do
    M27=$tmp/m27-$fmt
    t "27B layer shapes, $fmt: the engine's prompt logits (6 rows) and 3 steps' logits against the CPU reference" \
      "bin/tandem-mkmodel -o $M27 --shape qwen3.8-27b --format $fmt --layer-types GA --vocab 4096 --no-mtp 2>$tmp/err &&
       bin/tandem-run -m $M27 --backend cpu -p $tmp/p27.tok -n 0 --dump-logits $tmp/cpu0.st >/dev/null 2>>$tmp/err &&
       $RUN -m $M27 -p $tmp/p27.tok -n 0 --dump-logits $tmp/gpu0.st >/dev/null 2>>$tmp/err &&
       bin/tandem-run -m $M27 --backend cpu -p $tmp/p27.tok -n 3 --dump-logits $tmp/cpu.st >$tmp/cpu.tok 2>>$tmp/err &&
       $RUN -m $M27 -p $tmp/p27.tok --force $tmp/cpu.tok --dump-logits $tmp/gpu.st >/dev/null 2>$tmp/err.one &&
       build/t/logits_cmp $tmp/gpu0.st $tmp/cpu0.st 2e-2 >$tmp/cmp && build/t/logits_cmp $tmp/gpu.st $tmp/cpu.st 2e-2 >>$tmp/cmp;
       rc=\$?; sed 's/^/#   /' $tmp/cmp; [ \$rc -eq 0 ] || { sed 's/^/# /' $tmp/err $tmp/err.one; false; }"
    t "27B layer shapes, $fmt: in_proj_b and in_proj_a as two products (TANDEM_GDN_FUSE_BA=off) give one product's logits bit for bit" \
      "TANDEM_GDN_FUSE_BA=off $RUN -m $M27 -p $tmp/p27.tok --force $tmp/cpu.tok --dump-logits $tmp/gpu2.st >/dev/null 2>$tmp/err.two &&
       grep -q 'one product in 1 of 1 GDN layers' $tmp/err.one && grep -q 'one product in 0 of 1 GDN layers' $tmp/err.two &&
       cmp -s $tmp/gpu.st $tmp/gpu2.st || { sed 's/^/# /' $tmp/err.one $tmp/err.two; false; }"
    t "27B layer shapes, $fmt: the MLP as the gate's product and up's with the SiLU x up (TANDEM_MLP_FUSE=off) gives the one SwiGLU product's logits bit for bit" \
      "TANDEM_MLP_FUSE=off $RUN -m $M27 -p $tmp/p27.tok --force $tmp/cpu.tok --dump-logits $tmp/gpu3.st >/dev/null 2>$tmp/err.three &&
       cmp -s $tmp/gpu.st $tmp/gpu3.st || { sed 's/^/# /' $tmp/err.one $tmp/err.three; false; }"
    # the forms the engine's line names for this model's MLP on the shipped sm_90 tables (NVFP4 and FP8 nt 2
    # on 17408,5120, BF16 nt 1; tdm_matmul_swiglu_forms, checked on hand-written tables in t/tiles.t)
    case $fmt in
    nvfp4) auto='one launch at 1-32 rows; three launches past 32 rows' on=$auto ;;   # held tile-major
    fp8) auto='one launch at 1-16 rows; three launches at 17-24 and past 32 rows; gate, then up with the SiLU x up at 25-32 rows'
         on=$auto ;;
    *) auto='gate, then up with the SiLU x up at 1-32 rows; three launches past 32 rows' on=$auto ;;
    esac
    t "27B layer shapes, $fmt: a 12-row prompt under TANDEM_MLP_FUSE=auto gives its logits under on bit for bit, and the engine's line names the forms at each row count" \
      "$RUN -m $M27 -p $tmp/p12.tok -n 0 --dump-logits $tmp/gpu12a.st >/dev/null 2>$tmp/err.auto &&
       TANDEM_MLP_FUSE=on $RUN -m $M27 -p $tmp/p12.tok -n 0 --dump-logits $tmp/gpu12o.st >/dev/null 2>$tmp/err.on &&
       grep -qF \"SiLU x up: $auto (TANDEM_MLP_FUSE=auto\" $tmp/err.auto &&
       grep -qF \"SiLU x up: $on (TANDEM_MLP_FUSE=on\" $tmp/err.on &&
       cmp -s $tmp/gpu12a.st $tmp/gpu12o.st || { sed 's/^/# /' $tmp/err.auto $tmp/err.on; false; }"
    t "27B layer shapes, $fmt: every launch on one stream (TANDEM_CONCURRENT=off) gives the two streams' logits bit for bit" \
      "TANDEM_CONCURRENT=off $RUN -m $M27 -p $tmp/p27.tok --force $tmp/cpu.tok --dump-logits $tmp/gpu4.st >/dev/null 2>$tmp/err.seq &&
       grep -q 'sibling projections on two streams' $tmp/err.one && grep -q 'sibling projections on one stream (TANDEM_CONCURRENT=off)' $tmp/err.seq &&
       cmp -s $tmp/gpu.st $tmp/gpu4.st || { sed 's/^/# /' $tmp/err.one $tmp/err.seq; false; }"
    t "27B layer shapes, $fmt: plain launches (TANDEM_PDL=off) give the programmatic launches' prompt and step logits bit for bit, graphed and eager" \
      "TANDEM_PDL=off $RUN -m $M27 -p $tmp/p27.tok --force $tmp/cpu.tok --dump-logits $tmp/gpu5.st >/dev/null 2>$tmp/err.pdl &&
       TANDEM_PDL=off TANDEM_CUDA_GRAPH=off $RUN -m $M27 -p $tmp/p27.tok --force $tmp/cpu.tok --dump-logits $tmp/gpu6.st >/dev/null 2>>$tmp/err.pdl &&
       TANDEM_CUDA_GRAPH=off $RUN -m $M27 -p $tmp/p27.tok --force $tmp/cpu.tok --dump-logits $tmp/gpu7.st >/dev/null 2>>$tmp/err.pdl &&
       grep -q '; programmatic launches' $tmp/err.one && grep -q 'plain launches (TANDEM_PDL=off)' $tmp/err.pdl &&
       cmp -s $tmp/gpu.st $tmp/gpu5.st && cmp -s $tmp/gpu.st $tmp/gpu6.st && cmp -s $tmp/gpu.st $tmp/gpu7.st || { sed 's/^/# /' $tmp/err.one $tmp/err.pdl; false; }"
    t "27B layer shapes, $fmt: the NVFP4 activations loaded per lane at every row count (TANDEM_MM_DIRECT=on, graphed) and staged at every row count (off, eager) give the default's logits bit for bit" \
      "TANDEM_MM_DIRECT=on $RUN -m $M27 -p $tmp/p27.tok --force $tmp/cpu.tok --dump-logits $tmp/gpu8.st >/dev/null 2>$tmp/err.dir &&
       TANDEM_MM_DIRECT=off TANDEM_CUDA_GRAPH=off $RUN -m $M27 -p $tmp/p27.tok --force $tmp/cpu.tok --dump-logits $tmp/gpu9.st >/dev/null 2>>$tmp/err.dir &&
       cmp -s $tmp/gpu.st $tmp/gpu8.st && cmp -s $tmp/gpu.st $tmp/gpu9.st || { sed 's/^/# /' $tmp/err.dir; false; }"
    t "27B layer shapes, $fmt: the products reading x as written (TANDEM_MM_XB=off), graphed and eager, give the blocked copies' logits bit for bit; the engine's line says which" \
      "TANDEM_MM_XB=off $RUN -m $M27 -p $tmp/p27.tok --force $tmp/cpu.tok --dump-logits $tmp/gpu10.st >/dev/null 2>$tmp/err.xb &&
       TANDEM_MM_XB=off TANDEM_CUDA_GRAPH=off $RUN -m $M27 -p $tmp/p27.tok --force $tmp/cpu.tok --dump-logits $tmp/gpu11.st >/dev/null 2>>$tmp/err.xb &&
       grep -q '; blocked product inputs at 1-32 rows' $tmp/err.one && grep -q 'no blocked product inputs (TANDEM_MM_XB=off)' $tmp/err.xb &&
       cmp -s $tmp/gpu.st $tmp/gpu10.st && cmp -s $tmp/gpu.st $tmp/gpu11.st || { sed 's/^/# /' $tmp/err.one $tmp/err.xb; false; }"
    rm -rf "$M27"
done
# TANDEM_HEAD_FORMAT=nvfp4 (the head requantized at load): the engine against the CPU reference with
# the same requantized head, on the 27B's untied head and on a tiny model with tied embeddings (the
# engine must then upload the embedding for the lookup apart from the head).
MH=$tmp/mh; MT=$tmp/mt
bin/tandem-mkmodel -o $MH --shape qwen3.8-27b --layer-types GA --vocab 4096 --no-mtp 2>$tmp/err.mk &&
    bin/tandem-mkmodel -o $MT --tie --no-mtp 2>>$tmp/err.mk && mkok=1 || mkok=0
for hf in nvfp4:NVFP4 fp8:FP8; do
t "TANDEM_HEAD_FORMAT=${hf%:*}: the engine's prompt and step logits against the CPU reference's (27B shapes in BF16, and tied embeddings)" \
  "cp $tmp/err.mk $tmp/err; hok=$mkok
   for M in $MH $MT; do rm -f $tmp/cmp
     TANDEM_HEAD_FORMAT=${hf%:*} bin/tandem-run -m \$M --backend cpu -p $tmp/p27.tok -n 3 --dump-logits $tmp/hc.st >$tmp/hc.tok 2>>$tmp/err &&
     TANDEM_HEAD_FORMAT=${hf%:*} $RUN -m \$M -p $tmp/p27.tok --force $tmp/hc.tok --dump-logits $tmp/hg.st >/dev/null 2>$tmp/err.h &&
     grep -q '^# head: requantized to ${hf#*:}' $tmp/err.h &&
     build/t/logits_cmp $tmp/hg.st $tmp/hc.st 2e-2 >$tmp/cmp || hok=0; sed 's/^/#   /' $tmp/cmp 2>/dev/null;
   done; [ \$hok -eq 1 ] || { sed 's/^/# /' $tmp/err $tmp/err.h; false; }"
done
rm -rf "$MH" "$MT"
# The real Qwen3-Next-80B-A3B layer shapes (H 2048, attention 16/2 heads of 256, GDN 16/32 heads of
# 128, 512 experts of width 512, top-10, shared expert 512), two layers (GDN with the MoE MLP,
# attention with the dense MLP 5120 through mlp_only_layers: the experts are 1.6 G parameters a
# layer) and a cut vocabulary, in each stored format: the same comparison as the 27B's, and
# (grouped in_proj_qkvz beside in_proj_ba) one stream (TANDEM_CONCURRENT=off) against two, bit for bit.
for fmt in bf16 fp8 nvfp4; do
    M80=$tmp/m80-$fmt
    t "80B-A3B layer shapes, $fmt: the engine's prompt logits (6 rows) and 3 steps' logits against the CPU reference" \
      "bin/tandem-mkmodel -o $M80 --layout qwen3_next --shape qwen3-next-80b --format $fmt --layer-types GA --mlp-only-layers 1 --vocab 4096 --no-mtp 2>$tmp/err &&
       bin/tandem-run -m $M80 --backend cpu -p $tmp/p27.tok -n 0 --dump-logits $tmp/cpu0.st >/dev/null 2>>$tmp/err &&
       $RUN -m $M80 -p $tmp/p27.tok -n 0 --dump-logits $tmp/gpu0.st >/dev/null 2>>$tmp/err &&
       bin/tandem-run -m $M80 --backend cpu -p $tmp/p27.tok -n 3 --dump-logits $tmp/cpu.st >$tmp/cpu.tok 2>>$tmp/err &&
       $RUN -m $M80 -p $tmp/p27.tok --force $tmp/cpu.tok --dump-logits $tmp/gpu.st >/dev/null 2>$tmp/err.one &&
       build/t/logits_cmp $tmp/gpu0.st $tmp/cpu0.st 2e-2 >$tmp/cmp && build/t/logits_cmp $tmp/gpu.st $tmp/cpu.st 2e-2 >>$tmp/cmp;
       rc=\$?; sed 's/^/#   /' $tmp/cmp; grep '^# CUDA engine' $tmp/err | sed 's/^/#   /';
       [ \$rc -eq 0 ] || { sed 's/^/# /' $tmp/err $tmp/err.one; false; }"
    t "80B-A3B layer shapes, $fmt: every launch on one stream (TANDEM_CONCURRENT=off) gives the two streams' logits bit for bit" \
      "TANDEM_CONCURRENT=off $RUN -m $M80 -p $tmp/p27.tok --force $tmp/cpu.tok --dump-logits $tmp/gpu4.st >/dev/null 2>$tmp/err.seq &&
       grep -q 'sibling projections on two streams' $tmp/err.one && grep -q 'sibling projections on one stream (TANDEM_CONCURRENT=off)' $tmp/err.seq &&
       cmp -s $tmp/gpu.st $tmp/gpu4.st || { sed 's/^/# /' $tmp/err.one $tmp/err.seq; false; }"
    rm -rf "$M80"
done
# qwen3_5_moe (ungrouped GDN projections, MoE MLP, a dense layer through mlp_only_layers), tiny
# shapes, NVFP4: 40 prompt rows (one prefill chunk, the experts grouped) and 8 steps against the CPU
# reference, and graphed against eager.
MQ=$tmp/q35moe
seq 1 40 | awk '{print ($1 * 37) % 1000}' >"$tmp/p40.tok"
t "qwen3_5_moe (tiny, nvfp4, layer 1 dense): the engine's logits against the CPU reference; graphed steps equal eager" \
  "bin/tandem-mkmodel -o $MQ --layout qwen3_5_moe --format nvfp4 --mlp-only-layers 1 2>$tmp/err &&
   bin/tandem-run -m $MQ --backend cpu -p $tmp/p40.tok -n 8 --dump-logits $tmp/cpu.st >$tmp/cpu.tok 2>>$tmp/err &&
   $RUN -m $MQ -p $tmp/p40.tok --force $tmp/cpu.tok --dump-logits $tmp/gpu.st >/dev/null 2>>$tmp/err &&
   build/t/logits_cmp $tmp/gpu.st $tmp/cpu.st 2e-2 >$tmp/cmp &&
   TANDEM_CUDA_GRAPH=on $RUN -m $MQ -p $tmp/p40.tok -n 8 --dump-logits $tmp/g.st >/dev/null 2>>$tmp/err &&
   TANDEM_CUDA_GRAPH=off $RUN -m $MQ -p $tmp/p40.tok -n 8 --dump-logits $tmp/e.st >/dev/null 2>>$tmp/err &&
   cmp -s $tmp/g.st $tmp/e.st; rc=\$?; sed 's/^/#   /' $tmp/cmp; [ \$rc -eq 0 ] || { sed 's/^/# /' $tmp/err; false; }"
# The same model with a 300-token prompt (several 128-row expert tiles a chunk): the prompt's logits
# with TANDEM_MOE_GROUPED on (one chunk of 300 rows) and off (32-row chunks) against the CPU reference.
seq 1 300 | awk '{print ($1 * 53) % 1000}' >"$tmp/p300.tok"
for sw in on off; do
    t "qwen3_5_moe (tiny, nvfp4), 300 prompt rows, TANDEM_MOE_GROUPED=$sw: the engine's prompt logits against the CPU reference" \
      "bin/tandem-run -m $MQ --backend cpu -p $tmp/p300.tok -n 0 --dump-logits $tmp/cpu300.st >/dev/null 2>$tmp/err &&
       TANDEM_MOE_GROUPED=$sw $RUN -m $MQ -p $tmp/p300.tok -n 0 --dump-logits $tmp/gpu300.st >/dev/null 2>>$tmp/err &&
       build/t/logits_cmp $tmp/gpu300.st $tmp/cpu300.st 2e-2 >$tmp/cmp;
       rc=\$?; sed 's/^/#   /' $tmp/cmp; grep '^# CUDA engine' $tmp/err | sed 's/^/#   /'; [ \$rc -eq 0 ] || { sed 's/^/# /' $tmp/err; false; }"
done
echo "1..$n"
