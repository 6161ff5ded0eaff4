#!/bin/sh
# The compiled kernels' resources, as ptxas reported them when the build compiled each object
# (build/kernels/*.res, written by the Makefile's nvcc --resource-usage; no GPU and no cuobjdump
# needed), for both targets (sm_90, sm_121a):
#   - no skinny matrix kernel (kernels/*_skinny.cu), no decode attention kernel, no form of the GDN
#     recurrence (recur_kernel, kernels/gdn.cu: its token loop runs once a token of every round) and no
#     per-pair MoE expert kernel (gate_up_kernel, down_kernel in kernels/moe.cu, every decode step and
#     round of a MoE model; down's forms of 2 and 4 rows a group spilled at 64 registers and hold up to
#     128) uses a stack frame or spills to local memory: the register caps (skinny_regs, mm_skinny.cuh) are set where ptxas
#     spills nothing, and a change that makes one spill fails here. One exception, measured: the
#     17-32-row forms that read the blocked copy (NVFP4 nt 2, pf 1, the plain and the SwiGLU form,
#     sm_90) are capped at 96 registers (TDM_MM_XB32_REGS) for 5 warps a scheduler, where ptxas
#     spilled 40 + 44 and 12 + 24 bytes when measured (12 + 16 and 20 + 32 with nvcc 13.0), and their
#     17-24-row instantiations (mt 3, TDM_MM_HI24: the SwiGLU form 12 + 20, the plain 20 + 24, nvcc 13.0); up to 32
#     bytes of stack and 96 spilled bytes pass for them alone, at most 96 registers (bench/NOTES.md,
#     the 17-32-row forms at 96 registers: 7-8 %
#     faster than at 128 with its 4 spilled bytes); and FP8's per-lane forms from the blocked copy
#     (nt 1, sm_90), capped at 96 (TDM_MM_FP8_XB_REGS), where ptxas spills 4 + 4 bytes at 1-8 rows and
#     20 + 28 at 17-32, under the same limits (bench/NOTES.md, FP8 per lane from the blocked copy:
#     2-9 % faster than at 113-126 registers), and their nt 2 forms at 1-16 rows, plain and SwiGLU
#     (8 + 12 bytes at 9-16 rows with nvcc 13.0; bench/NOTES.md, FP8 at nt 2 with the weights as A;
#     the SwiGLU form 8 + 20 at 1-8 rows: bench/NOTES.md, FP8 SwiGLU);
#   - the one-row decode's instantiations (NVFP4 nt 2, at most 8 rows, pf 1 and 3, the activations
#     staged, loaded per lane (TANDEM_MM_DIRECT) and loaded per lane from the blocked copy
#     (TANDEM_MM_XB); the plain and the SwiGLU form of each) use at
#     most 96 registers on sm_90: past 96 a scheduler holds 4 warps, not 5, and
#     the 27B's 6-warp CTAs fit 2 a SM instead of 3 (bench/NOTES.md, the register cliff).
objs="build/kernels/nvfp4_skinny.o build/kernels/fp8_skinny.o build/kernels/bf16_skinny.o build/kernels/attn.o build/kernels/gdn.o build/kernels/moe.o"
for o in $objs; do
    [ -f "$o" ] && [ -f "${o%.o}.res" ] || { echo "Bail out! $o or its ptxas report ${o%.o}.res is not built (make all first)"; exit 1; }
done
tmp=$(mktemp) || exit 1
trap 'rm -f "$tmp"' EXIT
# one line a kernel: object arch function REG STACK SPILL (spill: bytes stored plus loaded)
for o in $objs; do
    awk -v o="$o" '
        /Compiling entry function/ { f = $0; sub(/.*function \047/, "", f); sub(/\047.*/, "", f)
                                     arch = $0; sub(/.* for \047/, "", arch); sub(/\047.*/, "", arch); s = l = "" }
        / bytes stack frame, / { s = $1; l = $5 + $9 }
        /Used [0-9]+ registers/ && f != "" { r = $0; sub(/.*Used /, "", r); sub(/ registers.*/, "", r)
                                            print o, arch, f, r, s, l; f = "" }' "${o%.o}.res"
done | grep -E 'skinny_kernel|attn_partial_kernel|recur_kernel|gate_up_kernel|down_kernel' >"$tmp"
n=$(wc -l <"$tmp")
HOT=' sm_90 _ZN6tdm_mm13skinny_kernelILi3ELi2ELi0ELi[13]ELb1ELb[01]ELb[01]ELb[01]ELb0EEE'
hot=$(grep -cE "$HOT" "$tmp")
echo "1..$((n + 3))"
t=0
XB32='_ZN6tdm_mm13skinny_kernelILi3ELi2ELi[23]ELi1ELb1ELb[01]ELb1ELb1ELb[01]EEE|_ZN6tdm_mm13skinny_kernelILi2ELi1ELi[012]ELi[13]ELb1ELb0ELb1ELb1ELb[01]EEE|_ZN6tdm_mm13skinny_kernelILi2ELi2ELi[01]ELi1ELb1ELb[01]ELb1ELb1ELb0EEE'
while read -r o arch f r s l; do
    t=$((t + 1))
    if [ "$s" = 0 ] && [ "$l" = 0 ]; then
        echo "ok $t - $o $arch $f: $r registers, no stack, no spills"
    elif [ "$arch" = sm_90 ] && echo "$f" | grep -qE "^($XB32)" && [ "$l" -le 96 ] && [ "$s" -le 32 ] && [ "$r" -le 96 ]; then
        echo "ok $t - $o $arch $f: $r registers, stack $s, spilled bytes $l (the measured exception)"
    else
        echo "not ok $t - $o $arch $f: $r registers, stack $s, spilled bytes $l"
    fi
done <"$tmp"
t=$((t + 1))
if [ "$n" -ge 50 ]; then echo "ok $t - $n kernels read"; else echo "not ok $t - only $n kernels read"; fi
t=$((t + 1))
if [ "$hot" -eq 12 ]; then echo "ok $t - the twelve one-row NVFP4 forms found for sm_90"; else
    echo "not ok $t - $hot one-row NVFP4 forms found for sm_90 (want pf 1 and 3, the plain and the SwiGLU, staged, direct and from the blocked copy)"; fi
t=$((t + 1))
over=$(grep -E "$HOT" "$tmp" | awk '$4 > 96' | wc -l)
if [ "$hot" -eq 12 ] && [ "$over" -eq 0 ]; then
    echo "ok $t - the one-row NVFP4 forms use at most 96 registers on sm_90"
else
    echo "not ok $t - $over one-row NVFP4 forms use more than 96 registers on sm_90"
fi
