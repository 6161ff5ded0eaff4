/* ref.h — the CPU reference forward: plain FP32 C with the BF16 rounding points of models.md.
 * Every GPU kernel's check() and every gate answers to it. One sequence: prefill over many
 * tokens and one-token decode share the same function, on persistent state (KV cache, conv
 * state, Gated DeltaNet state). */
#ifndef TDM_REF_H
#define TDM_REF_H
#include "model.h"
#ifdef __cplusplus
extern "C" {
#endif

struct tdm_ref;

/* State for one sequence of up to ctx tokens. */
struct tdm_ref *tdm_ref_new(const struct tdm_model *m, int ctx);
void tdm_ref_free(struct tdm_ref *r);
int tdm_ref_pos(const struct tdm_ref *r);  /* tokens consumed so far */

/* Feeds T tokens at the current position.
 * logits: NULL, or [T - logits_from][V] FP32 for rows logits_from..T-1.
 * hidden: NULL, or [L + 2][T][H]: embedding output, each layer's output, final-norm output.
 * final_h: NULL, or [T][H]: the final-norm output (what the MTP drafter takes).
 * Returns 0, or -1 with tdm_err() (context full). */
int tdm_ref_forward(struct tdm_ref *r, const int32_t *ids, int T, int logits_from, float *logits,
                    float *hidden, float *final_h);

/* The MTP drafter over T draft positions, continuing its own KV cache: row t takes the token at
 * position pos+1 (next_ids[t]) and the main model's final-norm output at pos (h[t]), rotary
 * position pos = the drafter's own count so far; logits [T][V] predict the token at pos+2. */
int tdm_ref_mtp(struct tdm_ref *r, const int32_t *next_ids, const float *h, int T, float *logits);

/* Per position (main model, or the MTP drafter's positions when mtp), the smallest router margin
 * of any MoE layer: the k-th chosen expert's router logit minus the best expert left out
 * (+infinity without MoE). A small margin is a routing near tie: another implementation may
 * choose differently there, and that position's output then differs by far more than rounding. */
const float *tdm_ref_router_gaps(const struct tdm_ref *r, int mtp);

/* Greedy choice: the largest logit, ties to the lower id. */
int tdm_argmax(const float *logits, int n);
/* Top-1 minus top-2 logit. */
float tdm_margin(const float *logits, int n);

/* Building blocks, shared with the kernels' checks (all FP32 in, FP32 out with the rounding
 * points of models.md applied). */
void tdm_ref_rmsnorm(const float *x, const float *w, int n, float eps, float *y);       /* zero-centred, ->bf16 */
void tdm_ref_linear_bf16(const struct tdm_qweight *w, const float *x, int m, float *y);  /* x W^T ->bf16 */

/* The pieces of the layers that the GPU kernels replace, one function each (kernels/layers.h). */
/* Causal depthwise conv of T tokens [T][C] over the state [K-1][C] (the last K-1 inputs, oldest
 * first; updated), taps w [C][K]: y [T][C] = bf16(silu(bf16(conv))). */
void tdm_ref_gdn_conv(const float *w, int C, int K, float *state, const float *x, int T, float *y);
/* One token of the Gated DeltaNet: conv output ct [2 Hk Dk + Hv Dv], b and a [Hv]; gates, FP32 L2
 * norms of q and k, the delta rule on S [Hv][Dk][Dv] (updated); o [Hv][Dv] FP32 (not rounded).
 * scratch: 2 Hk Dk + Dv floats. */
void tdm_ref_gdn_token(int Hk, int Hv, int Dk, int Dv, const float *A_log, const float *dt_bias, const float *ct,
                       const float *b, const float *a, float *S, float *o, float *scratch);
/* The GDN gated RMSNorm of one head, in place: o ->bf16, norm ->bf16, * w ->bf16, * silu(z) ->bf16. */
void tdm_ref_gated_norm(float *o, const float *z, const float *w, int n, float eps);
/* Rotary on the first R dims of one head at position pos, BF16 arithmetic (models.md). */
void tdm_ref_rope_bf16(float *x, int R, int pos, double theta);
/* One query head against n cached positions: q and gate [D], K and V rows of the query's KV head
 * at kc + j*row, vc + j*row; p: n floats of scratch; o [D] = bf16(bf16(attn) * bf16(sigmoid(gate))). */
void tdm_ref_attn_head(const float *q, const float *gate, const float *kc, const float *vc, size_t row, int n, int D,
                       float *p, float *o);
/* The router of one row: logits rl [E] -> softmax p [E], top-k sel [k] (descending, ties to the lower
 * id), weights w [k] (renormalised when norm_topk, ->bf16). */
void tdm_ref_route(const float *rl, int E, int k, int norm_topk, float *p, int *sel, float *w);
#ifdef __cplusplus
}
#endif
#endif
