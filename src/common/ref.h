/* ref.h — the CPU reference forward: plain FP32 C with the BF16 rounding points of models.md.
 * Every GPU kernel's check() and every gate answers to it. One sequence: prefill over many
 * tokens and one-token decode share the same function, on persistent state (KV cache, conv
 * state, Gated DeltaNet state). */
#ifndef TDM_REF_H
#define TDM_REF_H
#include "model.h"
#include <stddef.h>
#include <stdint.h>
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

/* ---- speculative rounds (speculative.md) ----
 * A round verifies n <= TDM_SPEC_MAX_NODES nodes laid out depth-first: node 0 is the root, the last
 * emitted token not yet fed (rotary position tdm_ref_pos), parent[0] = -1, every other node's parent
 * is the most recent earlier node one level up (each subtree contiguous). Node t sits at rotary
 * position pos + depth(t). Nothing committed changes during a verify: attention writes the nodes'
 * K/V rows to scratch and each node attends to the committed cache plus its own ancestors (the
 * ancestor mask); the GDN conv of a node reads its ancestors' inputs and, past the root, the
 * committed conv state; the GDN state is only read.
 *   factored = 0 (chain; parent[t] = t - 1): the state is materialised step by step on a scratch
 *     copy with one-token decode's arithmetic, so each row has the bits of one-token decoding.
 *   factored = 1 (tree): each node's values are rebuilt from the entry state S0 (S0^T k, S0^T q) and
 *     its ancestors' factors (k_i, u_i, P_i) kept on a stack of one entry per depth; the order of
 *     arithmetic differs from one-token decode, so a near tie can go the other way.
 * logits [n][V] and final_h [n][H] (the final-norm output, for the MTP drafter) may be NULL. */
#define TDM_SPEC_MAX_NODES 32
int tdm_ref_verify(struct tdm_ref *r, const int32_t *ids, const int *parent, int n, int factored, float *logits,
                   float *final_h);
/* Commits the path path[0] = 0, path[j] a child of path[j-1], of the last verify: its K/V rows go
 * into the cache at pos..pos+len-1 (the other nodes' rows are dropped), the conv state advances
 * over the path's inputs, and the path's GDN factors become pending: the next load of each state
 * (the next verify, or a tdm_ref_forward) applies them first — a chain replays the steps
 * (bit-identical to one-token decode), a tree uses S = exp(P_L) S0 + sum exp(P_L - P_i) k_i u_i^T.
 * With deferral off (tdm_ref_set_defer(r, 0)) the factors are applied at once: the same
 * arithmetic, another time. pos advances by len. */
int tdm_ref_commit(struct tdm_ref *r, const int *path, int len);
void tdm_ref_set_defer(struct tdm_ref *r, int defer); /* default 1 */

/* Bytes of GDN state and factors the main model's layers moved (as a fused kernel would: a load
 * that applies pending factors and then updates the state writes it once). */
struct tdm_ref_stats { int64_t state_read, state_written, factor_read, factor_written; };
const struct tdm_ref_stats *tdm_ref_stats(const struct tdm_ref *r);
size_t tdm_ref_state_bytes(const struct tdm_ref *r); /* all GDN layers' states */

/* The MTP drafter with its output after mtp.norm (out_h [T][H], may be NULL; logits may be NULL):
 * what a chained draft step takes as the next h. tdm_ref_mtp_rewind drops the drafter's positions
 * from pos on (its KV rows there are overwritten by the next call). */
int tdm_ref_mtp_h(struct tdm_ref *r, const int32_t *next_ids, const float *h, int T, float *logits, float *out_h);
int tdm_ref_mtp_pos(const struct tdm_ref *r);
int tdm_ref_mtp_rewind(struct tdm_ref *r, int pos);

/* Snapshots of the recurrent state (positions, conv, GDN state, pending factors). KV rows are not
 * copied: rows below the saved positions must not have been rewritten when it is loaded (only a
 * tdm_ref_mtp_rewind below the saved MTP position does that). */
struct tdm_ref_snap;
struct tdm_ref_snap *tdm_ref_snap_new(const struct tdm_ref *r);
void tdm_ref_snap_save(const struct tdm_ref *r, struct tdm_ref_snap *s);
int tdm_ref_snap_load(struct tdm_ref *r, const struct tdm_ref_snap *s);
void tdm_ref_snap_free(struct tdm_ref_snap *s);

/* FNV-1a over the committed state as it would be used next: positions, KV rows in use (MTP's
 * too), conv states, GDN states with pending factors applied (on a copy). */
uint64_t tdm_ref_state_hash(const struct tdm_ref *r);

/* The indices of the k largest of x[n], largest first, ties to the lower index; returns
 * min(k, n). (The router's top-k and the drafters' branches.) */
int tdm_topk(const float *x, int n, int k, int32_t *out);
/* Greedy choice: the largest logit, ties to the lower id. */
int tdm_argmax(const float *logits, int n);
/* Top-1 minus top-2 logit. */
float tdm_margin(const float *logits, int n);

/* Building blocks, shared with the kernels' checks (all FP32 in, FP32 out with the rounding
 * points of models.md applied). */
void tdm_ref_rmsnorm(const float *x, const float *w, int n, float eps, float *y);       /* zero-centred, ->bf16 */
void tdm_ref_linear_bf16(const struct tdm_qweight *w, const float *x, int m, float *y);  /* x W^T ->bf16 */

/* The pieces of the layers that the GPU kernels replace, one function each (kernels/layers.h). */
/* qwen3_next's grouped GDN projections of one token into conv order (models.md, GDN step 1): qkvz
 * [Hk][2 Dk + 2 r Dv] and ba [Hk][2 r] (r = Hv / Hk value heads per key head) -> mixed [q | k | v]
 * (2 Hk Dk + Hv Dv), z [Hv Dv], b and a [Hv]. Copies only. */
void tdm_ref_gdn_ungroup(int Hk, int Hv, int Dk, int Dv, const float *qkvz, const float *ba, float *mixed, float *z,
                         float *b, float *a);
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
/* The SwiGLU MLP's product before down (dense MLP, shared and routed experts): act [T][I] =
 * bf16(bf16(silu(bf16(x Wgate^T))) * bf16(x Wup^T)); the MLP's output is tdm_ref_linear_bf16(down, act). */
void tdm_ref_mlp_act(const struct tdm_mlp *mlp, const float *x, int T, float *act);
/* One row's MoE output (models.md, MoE block) from its k chosen experts' outputs ye [k][H] (expert
 * sel[j]'s down output, BF16 values) with their weights w [k], the shared expert's output sh [H] and
 * its gate logit sg (BF16): o = 0; for the chosen experts in ascending expert id (then slot), o =
 * bf16(o + bf16(y w)); then o = bf16(o + bf16(bf16(sigmoid(sg)) sh)). */
void tdm_ref_moe_combine(int H, int k, const int *sel, const float *w, const float *ye, const float *sh, float sg,
                         float *o);
/* The router of one row: logits rl [E] -> softmax p [E], top-k sel [k] (descending, ties to the lower
 * id), weights w [k] (renormalised when norm_topk, ->bf16). */
void tdm_ref_route(const float *rl, int E, int k, int norm_topk, float *p, int *sel, float *w);
#ifdef __cplusplus
}
#endif
#endif
