#!/bin/sh
# What the CUDA engine accepts, on the host: the dense qwen3_5 layout in every format (tied or
# not), qwen3_next (grouped GDN projections, MoE in every format, fused BF16 experts, dense
# mlp_only_layers) and qwen3_5_moe; shapes its kernels do not take refused naming the shape or the
# limit; without a device, set-up refused with one clear reason. The engine's
# numbers are checked on the GPU by t/gpu/engine.t.
MK=build/san/bin/tandem-mkmodel
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
mk() { name=$1; shift; $MK -o "$tmp/$name" "$@" >/dev/null 2>"$tmp/err" || { echo "Bail out! tandem-mkmodel $*: $(cat "$tmp/err")"; exit 1; }; }
mk bf16 --format bf16
mk fp8 --format fp8 --fp8-scales bf16
mk nvfp4 --format nvfp4
mk tied --tie
mk moe --layout qwen3_5_moe
mk next --layout qwen3_next
mk next-fp8 --layout qwen3_next --format fp8 --fp8-scales bf16
mk next-nvfp4 --layout qwen3_next --format nvfp4
mk next-fused --layout qwen3_next --fused-experts --mlp-only-layers 1
mk topk65 --layout qwen3_next --layers 1 --experts 66 --top-k 65 --no-mtp
mk d32 --head-dim 32 --rotary-dim 8
mk dk32 --gdn-key-dim 32
exec build/san/t/engine_host "$tmp/bf16" ok "$tmp/fp8" ok "$tmp/nvfp4" ok "$tmp/tied" ok \
    "$tmp/moe" ok "$tmp/next" ok "$tmp/next-fp8" ok "$tmp/next-nvfp4" ok "$tmp/next-fused" ok \
    "$tmp/topk65" "num_experts_per_tok 65: the CUDA router takes 1 to 64" \
    "$tmp/d32" "head_dim 32" "$tmp/dk32" "linear_key_head_dim 32"
