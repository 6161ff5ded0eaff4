/* layers.h — the per-layer GPU kernels other than the projection products: norms, the Gated
 * DeltaNet conv and recurrence, decode attention, the MoE router and the greedy head (the MoE
 * experts are in kernels/moe.h). Each replaces one function of the CPU reference
 * (src/common/ref.c, named per launcher) and is checked against it in t/unit/layers_gpu.c.
 *
 * Conventions (as kernels/matmul.h): activations BF16 on the device (uint16_t), row-major, rows
 * contiguous unless a row stride (ld, in elements) is given; recurrent state FP32; weights of the
 * norms, conv taps, A_log and dt_bias FP32 (as src/common/model.h holds them). Every launcher
 * takes an explicit stream (a cudaStream_t, NULL = legacy default), checks its arguments and the
 * launch, and returns 0 or -1 with tdm_err() set.
 *
 * Row invariance: M is the number of rows of one sequence (1..32 for a verify; the launchers
 * accept more). Row r of an M-row call is the same bits as a one-row call on that row; for the
 * stateful kernels (conv, recurrence, KV append, attention) as M one-row calls made in sequence.
 * No kernel uses atomics; every reduction has a fixed order that depends on the shape only.
 *
 * Positions: pos0 is the position of row 0 (row r is at pos0 + r). d_pos0, when not NULL, is a
 * device int32 holding pos0 instead (so that one captured CUDA graph serves every round); the host
 * pos0 is then only used to size the grid and must be >= the device value.
 *
 * Trees (the *_tree launchers, a tree verify round; speculative.md): the M <= TDM_TREE_MAX rows are
 * the nodes of a tree, each after its parent: parent [M] int32 in device memory (so that one graph
 * serves every tree of M nodes), parent[r] in -1..r-1, -1 for a root (a child of the committed
 * state; a round has one, row 0). The caller checks the array (the kernels cannot report a bad
 * one). Node r at depth d (its distance from a root) is at position pos0 + d and its row of any
 * cache is pos0 + r. The contract of every tree kernel: node r's outputs are the bits the chain
 * kernel gives for r's root-to-node path fed as a chain (its ancestors, root first, then r), so a
 * chain (parent[r] = r - 1) gives the chain kernel's bits. */
#ifndef TDM_LAYERS_H
#define TDM_LAYERS_H
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

/* The most nodes of a tree launch (the kernels keep a node set as a 32-bit mask). */
#define TDM_TREE_MAX 32

/* ---- norms (kernels/norm.cu) ---------------------------------------------------------------- */

/* Residual add and zero-centred RMSNorm (decoder layer, final and MTP norms; ref: layer_forward's
 * h = bf16(h + y), then tdm_ref_rmsnorm). h [M][H]: when y is not NULL, h = bf16(h + y) in place
 * (y [M][H], row stride ldy); then out [M][H] = bf16(h * rsqrt(mean(h^2) + eps) * (1 + w)).
 * One block a row; the sum of squares is a fixed tree over 256 threads (not the CPU's order).
 * H <= 11264. out must not overlap h or y.
 * outb (here and in the other kernels that write a product's input): NULL, or where out's blocked
 * copy goes as well, for M <= TDM_MM_XB_ROWS rows (matmul.h: tdm_matmul_xb; mm_layout.h: xb). */
int tdm_add_rmsnorm(uint16_t *h, const uint16_t *y, int64_t ldy, const float *w, int H, int M, float eps,
                    uint16_t *out, uint16_t *outb, void *stream);
/* The same with out's rows ldo >= H apart (the MTP's fc input: two norms side by side in one row). */
int tdm_add_rmsnorm_to(uint16_t *h, const uint16_t *y, int64_t ldy, const float *w, int H, int M, float eps,
                       uint16_t *out, int64_t ldo, uint16_t *outb, void *stream);
int64_t tdm_add_rmsnorm_bytes(int H, int M, int add);

/* The GDN gated RMSNorm (ref: tdm_ref_gated_norm) per value head: o [M][Hv][Dv] (the recurrence's
 * BF16 output), z [M][Hv*Dv] (row stride ldz), w [Dv]; y [M][Hv*Dv] = bf16(bf16(bf16(norm(o)) * w)
 * * silu(z)). The sum of squares in the reference's order (tdm_dot). Dv <= 1024. */
int tdm_gdn_gated_norm(const uint16_t *o, const uint16_t *z, int64_t ldz, const float *w, int M, int Hv, int Dv,
                       float eps, uint16_t *y, uint16_t *yb, void *stream);
int64_t tdm_gdn_gated_norm_bytes(int M, int Hv, int Dv);

/* Attention's q and k head norms (zero-centred RMSNorm, the sum in the reference's order) and
 * rotary on the first R dims at position pos0 + r (ref: tdm_ref_rmsnorm, tdm_ref_rope_bf16), and
 * the KV-cache append. qg [M][Hq][2D] (row stride ldqg: per head the query, then the gate); k, v
 * [M][Hkv][D] (row stride ldkv); q_norm, k_norm [D]. Writes q_out [M][Hq][D], and k (normed,
 * rotated) and v (as given) into the BF16 caches [ctx][Hkv][D] at rows pos0 + r. D <= 1024,
 * R even, R <= D. */
int tdm_qk_norm_rope(const uint16_t *qg, int64_t ldqg, const uint16_t *k, const uint16_t *v, int64_t ldkv,
                     const float *q_norm, const float *k_norm, int M, int Hq, int Hkv, int D, int R, double theta,
                     float eps, int pos0, const int32_t *d_pos0, int ctx, uint16_t *q_out, uint16_t *kcache,
                     uint16_t *vcache, void *stream);
int64_t tdm_qk_norm_rope_bytes(int M, int Hq, int Hkv, int D);
/* The same for the nodes of a tree (see Trees above): node r rotated at position pos0 + depth(r)
 * (ref: attn_verify's attn_project), its K and V written at cache row pos0 + r. */
int tdm_qk_norm_rope_tree(const uint16_t *qg, int64_t ldqg, const uint16_t *k, const uint16_t *v, int64_t ldkv,
                          const float *q_norm, const float *k_norm, const int32_t *parent, int M, int Hq, int Hkv, int D,
                          int R, double theta, float eps, int pos0, const int32_t *d_pos0, int ctx, uint16_t *q_out,
                          uint16_t *kcache, uint16_t *vcache, void *stream);

/* ---- Gated DeltaNet (kernels/gdn.cu) -------------------------------------------------------- */

/* qwen3_next's grouped projections into the order the kernels below take (ref: tdm_ref_gdn_ungroup,
 * per row): qkvz [M][Hk][2 Dk + 2 r Dv] (row stride ldqkvz; per key head q, k, the v and then the z
 * of its r = Hv / Hk value heads) and ba [M][Hk][2 r] (row stride ldba; per key head the b, then
 * the a of its value heads) -> mixed [M][2 Hk Dk + Hv Dv] ([q | k | v], conv order), z [M][Hv Dv],
 * b and a [M][Hv], all contiguous. Copies only: bit for bit. A block for each row and key-head group. */
int tdm_gdn_ungroup(const uint16_t *qkvz, int64_t ldqkvz, const uint16_t *ba, int64_t ldba, int M, int Hk, int Hv,
                    int Dk, int Dv, uint16_t *mixed, uint16_t *z, uint16_t *b, uint16_t *a, void *stream);

/* Causal depthwise conv + SiLU over the channels [q | k | v] (C = 2 Hk Dk + Hv Dv) for M tokens
 * in order (ref: tdm_ref_gdn_conv): x [M][C] (row stride ldx: the in_proj_qkv output, already in
 * conv order; qwen3_next's grouped in_proj_qkvz goes through tdm_gdn_ungroup first), taps w [C][K]
 * FP32, state [K-1][C] BF16 (the last K-1 inputs, oldest first; BF16 holds them exactly; updated);
 * y [M][C] = bf16(silu(bf16(conv))), each output from its own window of K inputs with the
 * reference's arithmetic: a channel's tokens side by side in one block, then the state written
 * (copies of the last K-1 inputs). y may not overlap x or the state (a token reads the inputs of the
 * K-1 before it). K in 2..4. */
int tdm_gdn_conv(const uint16_t *x, int64_t ldx, const float *w, uint16_t *state, int M, int C, int K, uint16_t *y,
                 void *stream);
int64_t tdm_gdn_conv_bytes(int M, int C, int K);

/* The prefill form of tdm_gdn_conv (a prompt chunk, M in the thousands): the same arguments, the
 * same y and final state bit for bit. Each output is a function of its K inputs alone, so the
 * tokens run in parallel: one thread per (channel, block of 16 tokens) reads the block's first
 * window from x or, before token 0, from the state, then runs tdm_gdn_conv's sum and roundings per
 * token; a second launch then writes the state (the last K-1 inputs of state ++ x, copies).
 * M <= 65535 * 16. */
int tdm_gdn_conv_prefill(const uint16_t *x, int64_t ldx, const float *w, uint16_t *state, int M, int C, int K,
                         uint16_t *y, void *stream);

/* The GDN gated norm inside the recurrence (TANDEM_GDN_FUSED_NORM): every recurrence launcher below
 * but the chunked one takes gn, NULL or tdm_gdn_gated_norm's arguments, and then also gives y (and
 * yb) for its M rows, the bits tdm_gdn_gated_norm(o, z, ldz, w, M, Hv, Dv, eps, y, yb) would give
 * after it: a value head's Dv/32 blocks run as one thread block cluster, and after a cluster
 * barrier each normalises its own columns of the head's rows with that kernel's per-(row, head)
 * device code, the row's o gathered from the blocks (no value depends on which block reads it).
 * Dv <= TDM_GDN_FUSED_NORM_DV_MAX (a cluster of at most 8 blocks) and <= rec_tb * Dk floats of the
 * block's scratch (Dk 64: 512). */
#define TDM_GDN_FUSED_NORM_DV_MAX (8 * 32)
struct tdm_gdn_gnorm {
    const uint16_t *z;
    int64_t ldz;
    const float *w;
    float eps;
    uint16_t *y, *yb;
};

/* Gates, FP32 L2 norms of q and k (the reference's order) and the delta rule for M tokens of one
 * sequence in order (ref: tdm_ref_gdn_token): qkv [M][C] (the conv output), b and a [M][Hv] (row
 * strides ldb, lda), A_log and dt_bias [Hv]; S [Hv][Dk][Dv] FP32, updated; o [M][Hv][Dv] =
 * bf16(S^T q). One block per (value head, 32 columns of Dv): the state columns live in registers
 * across the tokens; S^T k and S^T q are summed over Dk as 8 serial partials of Dk/8 rows (fused
 * multiply-adds) added in warp order (the CPU sums serially, a product then an add). Dk in {64, 128,
 * 256}, Dv a multiple of 32, Hv a multiple of Hk. */
int tdm_gdn_recur(const uint16_t *qkv, const uint16_t *b, int64_t ldb, const uint16_t *a, int64_t lda,
                  const float *A_log, const float *dt_bias, float *S, int M, int Hk, int Hv, int Dk, int Dv,
                  uint16_t *o, const struct tdm_gdn_gnorm *gn, void *stream);
int64_t tdm_gdn_recur_bytes(int M, int Hk, int Hv, int Dk, int Dv);

/* The chunked form of tdm_gdn_recur for a prompt chunk (prefill; not a twin: checked by agreement,
 * t/unit/layers_gpu.c): the same arguments and function — o [M][Hv][Dv] and the final S — plus
 * scratch, device memory of tdm_gdn_recur_chunked_scratch_bytes(M, Hv) bytes (16-byte aligned;
 * qkv and o 8-byte aligned). The inputs are rounded as tdm_ref_gdn_token rounds them: k = k / |k|
 * and q = q / |q| * Dk^-1/2 in FP32 with the norms summed in tdm_dot's order, beta =
 * bf16(sigmoid(b)), g = -exp(A_log) softplus(a + dt_bias) in FP32; the state is FP32 throughout and
 * o is rounded to BF16 once. Only the order of the sums differs from the token-serial form, and
 * the decays: exp(G_t - G_s) of the running sum G of g (summed in FP64, the difference rounded to
 * FP32 once) in place of the product of the tokens' exp(g).
 *
 * Per chunk of C = 64 tokens t = 0..n-1 of one value head, from the state S0 [Dk][Dv] at its start,
 * G_t = g_0 + ... + g_t, k_t, q_t, v_t rows, (the token recurrence S_t = e^g_t S_{t-1} + k_t u_t^T,
 * u_t = beta_t (v_t - e^g_t S_{t-1}^T k_t), o_t = S_t^T q_t, unrolled):
 *   L[t][s] = beta_t e^(G_t - G_s) (k_t . k_s)  for s < t, else 0;   T = (I + L)^-1 (unit lower)
 *   P[t][s] = e^(G_t - G_s) (q_t . k_s)          for s <= t, else 0
 *   u_t = sum_s T[t][s] beta_s (v_s - e^G_s S0^T k_s)             (U = T (beta V) - W S0,
 *                                                                  W = T (beta e^G K))
 *   o_t = e^G_t S0^T q_t + sum_{s<=t} P[t][s] u_s
 *   S   = e^G_{n-1} S0 + sum_t k_t (e^(G_{n-1} - G_t) u_t)^T      (the next chunk's S0)
 * Exponents are never positive (g <= 0, s <= t), so nothing overflows; what underflows is a decay
 * below FP32's range. Two launches: a block per (chunk, value head) computes the normalised q, k,
 * the gates, L, P and T (forward substitution in FP32, a column a thread) into the scratch, all
 * chunks at once; then a block per (value head, 32 columns of Dv) walks the chunks in order with
 * its state slice in shared memory: K S0 and Q S0, U = T R, o, the new S — FP32 FMA products,
 * the sums over Dk and over the chunk in a fixed order (no atomics; the same bits every run). The
 * scan's block takes 98.75 KiB of shared memory at Dk 128 (two blocks an SM on sm_90; within
 * sm_121's 99 KiB), 179 KiB at Dk 256; where the device cannot give it, the call runs
 * tdm_gdn_recur instead. Dk in {64, 128,
 * 256}, Dv a multiple of 32, Hv a multiple of Hk. */
size_t tdm_gdn_recur_chunked_scratch_bytes(int M, int Hv);
int tdm_gdn_recur_chunked(const uint16_t *qkv, const uint16_t *b, int64_t ldb, const uint16_t *a, int64_t lda,
                          const float *A_log, const float *dt_bias, float *S, int M, int Hk, int Hv, int Dk, int Dv,
                          float *scratch, uint16_t *o, void *stream);

/* The verify forms of the two stateful GDN kernels (a speculative round, src/common/engine_spec.c):
 * the same kernels with the state only read — y and o are the bits tdm_gdn_conv and tdm_gdn_recur
 * give, and the state stays the round's entry state. The commit then runs tdm_gdn_conv and
 * tdm_gdn_recur over the accepted rows' kept inputs from that state (or, deferred, the next pass's
 * pending forms below do): the same arithmetic per token, so the states become those of one-token
 * steps over the accepted tokens, bit for bit. */
int tdm_gdn_conv_verify(const uint16_t *x, int64_t ldx, const float *w, const uint16_t *state, int M, int C, int K,
                        uint16_t *y, void *stream);
int tdm_gdn_recur_verify(const uint16_t *qkv, const uint16_t *b, int64_t ldb, const uint16_t *a, int64_t lda,
                         const float *A_log, const float *dt_bias, const float *S, int M, int Hk, int Hv, int Dk, int Dv,
                         uint16_t *o, const struct tdm_gdn_gnorm *gn, void *stream);

/* The verify forms over the nodes of a tree (see Trees above; ref: gdn_verify): node r's conv
 * output reads its own ancestors' inputs and, past the root, the committed state, and its
 * recurrence output is that of r's root-to-node path run from the entry state S — the bits
 * tdm_gdn_conv_verify and tdm_gdn_recur_verify give for that path as a chain. Both states are only
 * read. The recurrence keeps each node's factors (its normed k, u = beta (v - S_p^T k) and decay)
 * in shared memory; when the next node's parent is not the node just done, the block reloads S and
 * replays the parent's path from the factors with the step's own operations (S = S decay;
 * S += k u^T), which rebuilds the parent's state bit for bit without a second S^T k. M <=
 * TDM_TREE_MAX. The commit of an accepted path gathers its rows (tdm_rows_compact,
 * engine_glue.h) and runs tdm_gdn_conv and tdm_gdn_recur over them, as for a chain. */
int tdm_gdn_conv_tree(const uint16_t *x, int64_t ldx, const float *w, const uint16_t *state, const int32_t *parent, int M,
                      int C, int K, uint16_t *y, void *stream);
int tdm_gdn_recur_tree(const uint16_t *qkv, const uint16_t *b, int64_t ldb, const uint16_t *a, int64_t lda,
                       const float *A_log, const float *dt_bias, const float *S, const int32_t *parent, int M, int Hk,
                       int Hv, int Dk, int Dv, uint16_t *o, const struct tdm_gdn_gnorm *gn, void *stream);

/* Deferred commit (speculative.md; the CUDA engine's TANDEM_GDN_DEFER): a round's commit only
 * records its accepted rows; the next pass applies them to each GDN layer's states as it loads
 * them, so the recurrent state moves through memory once a round instead of twice. The pending
 * rows' count n lives in device memory (d_n: an int32 in 0..TDM_GDN_PEND_MAX; larger values are
 * taken as the maximum), so one CUDA graph serves every count. (The CUDA engine launches none of
 * this before its first deferred commit: its passes run the plain forms until then, which give
 * the pending forms' bits over a count of 0; engine.c, take_pending.)
 *
 * tdm_gdn_conv_pending: tdm_gdn_conv over the first n rows of x (the kept conv inputs) from state,
 * state advanced (written) and their outputs y [n][C] — the same kernel with the count read from
 * d_n, so the bits of tdm_gdn_conv over those rows. Besides, the launch copies gcount BF16 values
 * gsrc -> gdst first (gcount >= 0; the pending rows' b and a, which the recurrence reads after the
 * pass's own projections have overwritten gsrc), so that taking the pending rows out of the
 * buffers a verify rewrites costs one launch a layer.
 *
 * The recurrence's pending forms take the pending rows as a struct tdm_gdn_pend (qkv: their conv
 * outputs [n][C]; b, a: their gates [n][Hv], row strides ldb, lda) and run them through the same
 * per-token device code as tdm_gdn_recur, with no output, on the state each block has just
 * loaded, before the call's own M rows — so the state after them is, bit for bit, the state
 * tdm_gdn_recur over those n rows would leave:
 *   tdm_gdn_recur_pend: a forward (then the M rows; M may be 0: only the pending rows, qkv and o
 *     unused), the state written once after the last row;
 *   tdm_gdn_recur_verify_pend, tdm_gdn_recur_tree_pend: a verify; when n > 0 the state after the
 *     pending rows is written to S (its only write), and the M rows (nodes) then run from it
 *     read-only as tdm_gdn_recur_verify / tdm_gdn_recur_tree run from S (a tree's reloads read
 *     the state the block wrote). */
#define TDM_GDN_PEND_MAX 32
struct tdm_gdn_pend {
    const uint16_t *qkv, *b, *a;
    int64_t ldb, lda;
    const int32_t *d_n;
};
int tdm_gdn_conv_pending(const uint16_t *x, int64_t ldx, const float *w, uint16_t *state, const int32_t *d_n, int C,
                         int K, uint16_t *y, const uint16_t *gsrc, uint16_t *gdst, int64_t gcount, void *stream);
int tdm_gdn_recur_pend(const uint16_t *qkv, const uint16_t *b, int64_t ldb, const uint16_t *a, int64_t lda,
                       const float *A_log, const float *dt_bias, float *S, int M, int Hk, int Hv, int Dk, int Dv,
                       uint16_t *o, const struct tdm_gdn_pend *pend, const struct tdm_gdn_gnorm *gn, void *stream);
int tdm_gdn_recur_verify_pend(const uint16_t *qkv, const uint16_t *b, int64_t ldb, const uint16_t *a, int64_t lda,
                              const float *A_log, const float *dt_bias, float *S, int M, int Hk, int Hv, int Dk, int Dv,
                              uint16_t *o, const struct tdm_gdn_pend *pend, const struct tdm_gdn_gnorm *gn, void *stream);
int tdm_gdn_recur_tree_pend(const uint16_t *qkv, const uint16_t *b, int64_t ldb, const uint16_t *a, int64_t lda,
                            const float *A_log, const float *dt_bias, float *S, const int32_t *parent, int M, int Hk,
                            int Hv, int Dk, int Dv, uint16_t *o, const struct tdm_gdn_pend *pend,
                            const struct tdm_gdn_gnorm *gn, void *stream);

/* ---- decode attention (kernels/attn.cu) ----------------------------------------------------- */

/* Positions per KV chunk: chunk boundaries are multiples of this, whatever the call's M. */
#define TDM_ATTN_CHUNK 256

/* Scratch (device, FP32) that tdm_attn_decode needs for M rows of Hq heads and a cache of ctx
 * positions: per (row, head, chunk) the partial output [D] and its max and sum. */
size_t tdm_attn_scratch_bytes(int M, int Hq, int D, int ctx);

/* Causal GQA attention of M new queries against the BF16 cache (ref: tdm_ref_attn_head): query r
 * (at position pos0 + r) sees cache rows 0..pos0 + r (the new rows must already be in the cache:
 * tdm_qk_norm_rope). q [M][Hq][D] (normed, rotated); the gate is the second half of each head of
 * qg [M][Hq][2D] (row stride ldqg); caches [ctx][Hkv][D]; out [M][Hq*D] = bf16(bf16(attn) *
 * bf16(sigmoid(gate))). Flash-decoding: one block per (chunk of TDM_ATTN_CHUNK positions, q head),
 * its eight warps each over a sub-chunk of 32 positions for every row; per sub-chunk the scores (q K^T
 * on the tensor cores), the max, the sum of exp(s - max) and the BF16-rounded probabilities times V
 * (on the tensor cores: the same k steps for every row and form), added over the sub-chunks in
 * ascending order into the chunk's; a second kernel adds the chunks in ascending order. The
 * probabilities are rounded relative to the sub-chunk's max (the reference: the row's max), so
 * the check has a bound. D in {64, 128, 256}, Hq a multiple of Hkv. outb: out's blocked copy (see
 * tdm_add_rmsnorm). */
int tdm_attn_decode(const uint16_t *q, const uint16_t *qg, int64_t ldqg, const uint16_t *kcache,
                    const uint16_t *vcache, int M, int Hq, int Hkv, int D, int pos0, const int32_t *d_pos0, int ctx,
                    float *scratch, uint16_t *out, uint16_t *outb, void *stream);
int64_t tdm_attn_decode_bytes(int M, int Hq, int Hkv, int D, int pos0);
/* The same for the nodes of a tree (see Trees above; ref: attn_verify): node r sees cache rows
 * 0..pos0-1 and the rows pos0 + a of its ancestors a and itself (the ancestor mask), in path order:
 * the kernel runs the chain kernel's arithmetic over a virtual sequence in which position pos0 + i
 * is r's ancestor at depth i, so chunk boundaries and every sum fall where they fall for the path
 * fed as a chain. The nodes' K/V rows must already be in the cache (tdm_qk_norm_rope_tree). */
int tdm_attn_tree(const uint16_t *q, const uint16_t *qg, int64_t ldqg, const uint16_t *kcache, const uint16_t *vcache,
                  const int32_t *parent, int M, int Hq, int Hkv, int D, int pos0, const int32_t *d_pos0, int ctx,
                  float *scratch, uint16_t *out, uint16_t *outb, void *stream);

/* ---- prefill attention (kernels/attn_prefill.cu) -------------------------------------------- */

/* tdm_attn_decode's function for a prompt chunk of M rows in one launch (the same arguments less
 * the scratch and d_pos0; eager only): query r at position pos0 + r sees cache rows 0..pos0 + r (a
 * lower-right causal mask, the chunk may start past position 0), out [M][Hq*D] = bf16(bf16(attn) *
 * bf16(sigmoid(gate))). FlashAttention-2 on the tensor cores: a block per (64 queries, q head), K/V
 * tiles of 64 positions in ascending order, S = Q K^T in FP32 (mma, BF16 inputs), an online softmax
 * in FP32 (exp2 of the scores scaled by log2(e)/sqrt(D)), the probabilities summed in FP32 and
 * rounded to BF16 for P V relative to the running max (the reference: the row's max), O in FP32,
 * divided by the sum and rounded to BF16 before the gate. No row invariance: close to the reference
 * and to tdm_attn_decode (t/unit/layers_gpu.c states the bounds), not their bits. D in {64, 128,
 * 256}, Hq a multiple of Hkv; q, qg, the caches and out 16-byte aligned, ldqg a multiple of 8. No
 * scratch. */
int tdm_attn_prefill(const uint16_t *q, const uint16_t *qg, int64_t ldqg, const uint16_t *kcache, const uint16_t *vcache,
                     int M, int Hq, int Hkv, int D, int pos0, int ctx, uint16_t *out, void *stream);
int64_t tdm_attn_prefill_bytes(int M, int Hq, int Hkv, int D, int pos0);

/* ---- MoE router (kernels/moe_route.cu) ------------------------------------------------------ */

/* The router's limits: experts (one row's probabilities in shared memory) and chosen experts. */
#define TDM_ROUTE_MAX_E 8192
#define TDM_ROUTE_MAX_K 64

/* Per row (ref: tdm_ref_route): softmax of the BF16 router logits [M][E] (row stride ld) in FP32,
 * top-k by probability (ties to the lower expert id), sel [M][k] in descending order; weights
 * w [M][k] BF16 (renormalised over the k when norm_topk, in selection order, then ->bf16). One
 * block a row; the max is exact, the softmax sum a fixed tree (not the CPU's order). E <=
 * TDM_ROUTE_MAX_E, k <= TDM_ROUTE_MAX_K. */
int tdm_moe_route(const uint16_t *logits, int64_t ld, int M, int E, int k, int norm_topk, int32_t *sel, uint16_t *w,
                  void *stream);
int64_t tdm_moe_route_bytes(int M, int E, int k);

/* ---- greedy head (kernels/head.cu) ---------------------------------------------------------- */

/* Scratch (device) for tdm_argmax_rows. */
size_t tdm_argmax_scratch_bytes(int M, int64_t V);
/* ids[r] = argmax of FP32 logits row r [M][V] (row stride ld), ties to the lower id (ref:
 * tdm_argmax; NaN is never chosen, an all-NaN row gives 0). Blocks over fixed slices of V, then
 * one warp a row; a max with ties to the lower id does not depend on the order at all. */
int tdm_argmax_rows(const float *logits, int64_t ld, int M, int64_t V, void *scratch, int32_t *ids, void *stream);
int64_t tdm_argmax_rows_bytes(int M, int64_t V);

#ifdef __cplusplus
}
#endif
#endif
