#!/bin/sh
# The layer kernels on the GPU (kernels/layers.h, kernels/moe.h): norms, GDN conv and recurrence,
# qwen3_next's grouped-projection de-interleave, decode and prefill attention, MoE router and
# experts, argmax — each against the CPU reference function it replaces, and verify twins (M =
# 2..32 rows against M one-row calls in sequence, bit for bit); the tree kernels (GDN conv and
# recurrence, q/k rotary, attention) on five trees of 32 nodes against the chain kernels on each
# node's path bit for bit, a chain as a tree against the chain kernels, and the reference along
# each path; prefill attention also against decode attention on the same inputs; the GDN prefill
# forms (the conv bit for bit against tdm_gdn_conv, the chunked delta rule within stated bounds of
# tdm_gdn_recur and the reference up to 4096 tokens); the deferred commit's forms (the conv and the
# recurrence with pending rows, the count in device memory) against the plain kernels over the same
# rows, bit for bit, eager and from graphs. Skips without a CUDA device. Arguments name the groups
# to run (attn: decode, tree and prefill attention; rest: the others; moe, gdn: the MoE layer's and
# the GDN layer's kernels alone, both parts of rest); none runs all.
exec build/t/layers_gpu "$@"
