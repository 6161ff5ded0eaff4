#!/bin/sh
# What the CUDA engine accepts, on the host: the dense qwen3_5 layout in every format (tied or
# not); qwen3_5_moe and qwen3_next refused as not supported yet; shapes its kernels do not take
# refused naming the shape; without a device, set-up refused with one clear reason. The engine's
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
mk d32 --head-dim 32 --rotary-dim 8
mk dk32 --gdn-key-dim 32
exec build/san/t/engine_host "$tmp/bf16" ok "$tmp/fp8" ok "$tmp/nvfp4" ok "$tmp/tied" ok \
    "$tmp/moe" "not supported by the CUDA engine yet" "$tmp/next" "not supported by the CUDA engine yet" \
    "$tmp/d32" "head_dim 32" "$tmp/dk32" "linear_key_head_dim 32"
