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
#ifdef __cplusplus
}
#endif
#endif
