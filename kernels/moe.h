/* moe.h — the mixture-of-experts MLP's routed experts on the GPU (kernels/moe.cu): the experts of
 * one layer in a packed device layout, and the kernels that run the (row, expert) pairs a router
 * chose (kernels/layers.h: tdm_moe_route) and add each row's experts up with the shared expert.
 * Each replaces a function of the CPU reference (src/common/ref.c, named per launcher) and is
 * checked against it in t/unit/layers_gpu.c.
 *
 * Conventions as layers.h: activations BF16 (uint16_t) row-major, an explicit stream (cudaStream_t,
 * NULL = legacy default), every launch checked, 0 or -1 with tdm_err().
 *
 * Routing stays on the device: the grids are sized by the number of pairs M * k, which the host
 * knows, and the experts each pair uses are read from sel on the device, so that a decode step can
 * be captured in a CUDA graph. The pair (row r, slot j) — expert sel[r][j] for row r — owns its
 * programs on a grid axis; its arithmetic depends on its row's input and its expert only, never on
 * M or the other rows, and no kernel uses atomics: an M-row call gives every row the bits of a
 * one-row call. The pairs are launched in ascending expert id (tdm_moe_order), so that rows which
 * share an expert read its weights back to back.
 *
 * The expert matrices' dot products (gate, up, down) run in this fixed order, a function of the
 * matrix's format and k only: the stored row is cut into chunks of 16 bytes (32 k NVFP4, 16 k
 * FP8, 8 k BF16); a group of G lanes owns the row (G the fewest, a power of two up to 32, whose
 * lanes take at most 4 chunks each); lane l of the group takes chunks l, l + G, l + 2G, ... in
 * ascending order into one FP32 accumulator from 0, each chunk's products in ascending k by fused
 * multiply-add (the input x as FP32, the weight decoded in registers: BF16 as stored; FP8 the e4m3
 * code, the chunk's 16 products summed from 0 and then acc = fma(that, block scale, acc); NVFP4
 * e2m1 * e4m3 group scale * 2^-7, exact in BF16); the G sums are added in an xor butterfly over
 * G/2, ..., 2, 1; NVFP4 multiplies the total by scale_2 * 2^7. This is not tdm_dot's order
 * (t/unit/layers_gpu.c bounds the difference by a relative error). The input row is staged once
 * per block in shared memory as FP32. NVFP4 matrices whose k is a multiple of 128 (the 80B's and
 * the Qwen3.5 MoE's), and FP8 ones where TDM_MOE_MMA_FP8, run on the tensor cores instead (moe.cu,
 * TDM_MOE_MMA; FP8: each 128-k block's sum times its scale, added in order): k is cut into ks slices
 * (1 to 8, by k alone), each slice's sum is a chain of mma.m16n8k16 (BF16 operands: the weight
 * decoded as above, the input as stored; FP32 accumulation in the tensor cores' order, 4 chunks of
 * the slice an mma step), the slices' sums are added in ascending order, then (NVFP4) times scale_2 * 2^7. */
#ifndef TDM_MOE_H
#define TDM_MOE_H
#include "matmul.h"
#include "model.h"
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

/* The largest input size (k) of an expert matrix: the input row is staged in shared memory as
 * FP32 (hidden_size for gate and up, moe_intermediate_size for down). */
#define TDM_MOE_MAX_K 8192
/* The most pairs (rows x top_k) one call takes. */
#define TDM_MOE_MAX_PAIRS 4096

enum tdm_moe_kind { TDM_MOE_GATE, TDM_MOE_UP, TDM_MOE_DOWN, TDM_MOE_KINDS };

/* One kind of matrix (gate, up or down) of all E experts: E stored matrices of n x k back to back,
 * their scales back to back, as the checkpoint stores each (see src/common/linear.h): BF16; FP8
 * e4m3 with [ceil(n/128)][ceil(k/128)] block scales (F32 or BF16); NVFP4 packed pairs with e4m3
 * scales [n][k/16] and a global scale per expert. */
struct tdm_moe_mat {
    enum tdm_wfmt fmt;
    enum tdm_dtype scale_dt;   /* FP8 block scales */
    int n, k;                  /* one expert's matrix */
    const void *w;             /* device: expert e's rows at w + e * w_stride */
    const void *scale;         /* device: expert e's scales at scale + e * scale_stride (NULL for BF16) */
    const float *scale2;       /* device [E]: NVFP4 global scales (NULL otherwise) */
    int64_t w_stride, scale_stride; /* bytes */
};

/* A layer's routed experts on the device: gate, up [I, H] and down [H, I] of E experts. */
struct tdm_moe_experts {
    int E, H, I;
    struct tdm_moe_mat m[TDM_MOE_KINDS];
    void *owned;               /* the one allocation that holds them */
    size_t bytes;              /* its size */
};

/* 0 if the experts can be packed: every expert's matrix of one kind stored in one format (BF16,
 * FP8 with one scale dtype, or NVFP4), gate and up in the same one, gate and up [I, H], down [H, I], H and I in 1..TDM_MOE_MAX_K,
 * FP8 views starting on a 128-row block; else -1 with tdm_err() naming the expert and the fault. */
int tdm_moe_experts_check(const struct tdm_mlp *experts, int E);
/* Bytes tdm_moe_experts_upload allocates for them. */
size_t tdm_moe_experts_bytes(const struct tdm_mlp *experts, int E);
/* Copies experts[0..E-1] (host views, any row0) into one device allocation in the layout above. */
int tdm_moe_experts_upload(const struct tdm_mlp *experts, int E, struct tdm_moe_experts *d);
void tdm_moe_experts_free(struct tdm_moe_experts *d);

/* Scratch (device) for M rows of k experts: the pair order, the SwiGLU products [M k][I] and the
 * experts' outputs [M k][H]; the offsets are tdm_moe_scratch_*. */
size_t tdm_moe_scratch_bytes(int M, int k, int H, int I);
int32_t *tdm_moe_scratch_order(void *scratch);
uint16_t *tdm_moe_scratch_act(void *scratch, int M, int k);
uint16_t *tdm_moe_scratch_out(void *scratch, int M, int k, int I);

/* order [M k] = the pair indices p = r k + j sorted by (sel[p], p): the launch order of the pairs,
 * each entry p | e << 16 with e = sel[p] (0xffff where sel[p] is outside 0..65534), so an expert
 * kernel reads its pair and expert in one load. One block; a pair's rank is the count of pairs
 * before it. M k <= TDM_MOE_MAX_PAIRS. (The expert kernels write NaN for a pair whose expert is
 * outside 0..E-1.) */
int tdm_moe_order(const int32_t *sel, int M, int k, int32_t *order, void *stream);

/* act[r k + j][i] = bf16(bf16(silu(bf16(x_r . gate_e[i]))) * bf16(x_r . up_e[i])), e = sel[r][j]
 * (ref: tdm_ref_mlp_act on expert e; the dots in the order above), the pairs and their experts read
 * from order (tdm_moe_order's entries) alone. x [M][H] (row stride ldx); act
 * [M k][I]. Gate and up in one pass: a lane loads its chunks of both rows together. Grid: I in
 * blocks of 256 / G values (a group of G lanes a value; TDM_MOE_GU_THREADS in moe.cu) x the pairs
 * in order; 256 threads (the tensor-core form: I in blocks of 8, or 16 at TDM_MOE_MMA_TILES 2; ks
 * warps). Where moe.cu launches it programmatically (TDM_MOE_GU_PDL), its blocks may come up while
 * the kernel before it runs and wait for it before they read anything (that kernel is tdm_moe_order
 * in the engine). */
int tdm_moe_gate_up(const struct tdm_moe_experts *ex, const uint16_t *x, int64_t ldx, int M, int k,
                    const int32_t *order, uint16_t *act, void *stream);
/* y[p][h] = bf16(act[p] . down_e[h]) for every pair p = r k + j, e = sel[r][j] as order holds it
 * (ref: the tdm_ref_linear_bf16(down, act) of tdm_ref_mlp's experts; the dots in the order above).
 * y [M k][H].
 * Grid: H in blocks of 256 / G values x the pairs in order; past one row (M > 1) and where a lane
 * has one or two chunks of a row, each group takes 4 or 2 rows (moe.cu: the same sums; the
 * tensor-core form: H in blocks of 16, or 32 at TDM_MOE_MMA_TILES 2; ks warps; for every M). Where
 * moe.cu launches it programmatically (TDM_MOE_DOWN_PDL) it reads order while the kernel
 * before it in the stream may still run: it must be written before that kernel began, or before it
 * waited where it was itself launched programmatically (as tdm_moe_order, tdm_moe_gate_up,
 * tdm_moe_down in a row leave them: gate+up releases down only after its wait). */
int tdm_moe_down(const struct tdm_moe_experts *ex, const uint16_t *act, int M, int k, const int32_t *order, uint16_t *y,
                 void *stream);

/* gate[r] = bf16(sigmoid(bf16(x_r . shared_gate))) (F32 [M]): tdm_ref_moe_combine's scale of row r's
 * shared expert, the dot in tdm_dot's order; shared_gate [1, H] in any stored format, x [M][H] (row
 * stride ldx). A block a row: the engine launches it on the shared expert's stream. */
int tdm_moe_shared_gate(const struct tdm_dweight *shared_gate, const uint16_t *x, int64_t ldx, int M, int H,
                        float *gate, void *stream);
/* out[r] = tdm_ref_moe_combine of row r: its k experts' outputs y [M k][H] with the router's
 * weights w [M][k] (BF16) added in ascending (expert id, slot), k <= 64, then the shared expert's
 * output sh [M][H] (row stride ldsh) scaled by gate[r] (tdm_moe_shared_gate). out [M][H] (row stride
 * ldout) may not alias y or sh. A block for each row and slice of 256 outputs. */
int tdm_moe_combine(const uint16_t *y, const uint16_t *w, const int32_t *sel, int M, int k, int H, const float *gate,
                    const uint16_t *sh, int64_t ldsh, uint16_t *out, int64_t ldout, void *stream);

/* ---- the grouped form (prefill chunks) ----------------------------------------------------------
 * For M rows of a prefill chunk (any M; decode's and a verify's 1..32 rows keep the per-pair kernels
 * above) the M k pairs are sorted by expert, stably (ascending pair index, so ascending row, within an
 * expert), each expert's group padded to a multiple of TDM_MOE_GROUP_PAD slots and cut into tiles of
 * at most TDM_MOE_TILE_ROWS slots (tdm_moe_group). Then two tensor-core GEMMs (kernels/wide_tile.cuh,
 * the wide GEMM's main loop and decoders): a CTA takes one tile and one block of outputs, decodes that
 * expert's weight tile once into shared memory for all of the tile's rows, gathers the rows' inputs by
 * pair index and scatters its outputs to the pairs' rows of act [M k][I] and y [M k][H] (the per-pair
 * kernels' layout, tdm_moe_scratch_act / _out), so tdm_moe_combine follows unchanged. The sums run in
 * FP32 in the wide GEMM's order (BF16 products exact; FP8 block partial sums scaled; NVFP4 scale_2 *
 * 2^7 on the sum) with the per-pair kernels' roundings after them: not their bits (no twin contract),
 * checked by agreement with the CPU reference (t/unit/layers_gpu.c). Routing stays on the device: the
 * grids are sized for the most tiles M k pairs can make and the CTAs past the tiles made return. No
 * atomics. A pair whose expert is outside 0..E-1 gets NaN, as in the per-pair kernels. */
#define TDM_MOE_GROUP_PAD 16
#define TDM_MOE_TILE_ROWS 128

/* Bytes of the grouping (device) for M rows of k experts among E: the tiles, the pairs in slot order,
 * per-block counts. */
size_t tdm_moe_group_bytes(int M, int k, int E);
/* The grouping of the pairs of sel [M][k] into group (tdm_moe_group_bytes(M, k, E) bytes): three small
 * launches (counts per block of rows, the plan in one block, the scatter), no host sync. */
int tdm_moe_group(const int32_t *sel, int M, int k, int E, void *group, void *stream);
/* tdm_moe_gate_up's act (the same roundings: bf16(bf16(silu(bf16(g))) * bf16(u))) in the grouped
 * form, from tdm_moe_group's group of the same M, k and ex->E. Gate and up in one pass: a CTA's weight
 * tile holds 32 rows of each for the same 32 outputs. */
int tdm_moe_gate_up_grouped(const struct tdm_moe_experts *ex, const uint16_t *x, int64_t ldx, int M, int k,
                            const void *group, uint16_t *act, void *stream);
/* tdm_moe_down's y in the grouped form (y [p][h] = bf16(act[p] . down_e[h])). */
int tdm_moe_down_grouped(const struct tdm_moe_experts *ex, const uint16_t *act, int M, int k, const void *group,
                         uint16_t *y, void *stream);

/* Bytes the calls must move: the chosen experts' weights (every pair counted: an upper bound when
 * rows share experts) and the activations. */
int64_t tdm_moe_gate_up_bytes(const struct tdm_moe_experts *ex, int M, int k);
int64_t tdm_moe_down_bytes(const struct tdm_moe_experts *ex, int M, int k);
#ifdef __cplusplus
}
#endif
#endif
