/* engine.h — the CUDA engine: the forward of src/common/ref.c on the GPU for one sequence, with the
 * weights in their stored format (BF16, block FP8, NVFP4) uploaded once (kernels/matmul.h), the
 * layer kernels of kernels/layers.h and the glue of kernels/engine_glue.h. Host C only; no CUDA
 * headers. It serves the family's three layouts (models.md): dense qwen3_5 (Gated DeltaNet + gated
 * attention + dense SwiGLU MLP, e.g. Qwen3.8-27B), qwen3_next (grouped GDN projections, MoE MLP,
 * e.g. Qwen3-Next-80B-A3B) and qwen3_5_moe; the MTP layer runs as a drafter (engine_mtp.c) once
 * tdm_engine_mtp_init has uploaded it.
 *
 * Rounding points are the reference's (every projection ->bf16, residual adds ->bf16, ...); the
 * head returns FP32 logits. T tokens are processed in chunks of at most TDM_ENGINE_MAX_ROWS rows
 * through the M-row kernels, which are row-invariant by construction: forwarding T tokens in one
 * call gives the same bits as T one-token calls. Everything runs on the engine's own stream; the
 * forward returns after its logits (or its greedy ids: the _ids forms) are on the host. */
#ifndef TDM_ENGINE_H
#define TDM_ENGINE_H
#include "model.h"
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

#define TDM_ENGINE_MAX_ROWS 32

struct tdm_engine;

/* 0 if the engine can serve m (layout, shapes, formats), else -1 with tdm_err() saying why. Needs
 * no device. */
int tdm_engine_supported(const struct tdm_model *m);

/* Uploads m's weights to device 0 and allocates the state of one sequence of up to ctx tokens: per
 * attention layer BF16 K and V caches [ctx][Hkv][D], per GDN layer a BF16 conv state [K-1][C] and
 * an FP32 state [Hv][Dk][Dv], activations for TDM_ENGINE_MAX_ROWS rows. m must outlive the engine
 * (its small vectors are read at upload only, but its config is kept). qwen3_5's in_proj_b and
 * in_proj_a are uploaded as one weight where they concatenate exactly (TANDEM_GDN_FUSE_BA). Prints
 * one "# " line with the device memory it holds, in how many GDN layers in_proj_b and in_proj_a
 * are one product, and whether round commits are deferred (TANDEM_GDN_DEFER), to stderr. Returns NULL with tdm_err() (no device, unsupported
 * layout, out of device memory naming what was being allocated). */
struct tdm_engine *tdm_engine_new(const struct tdm_model *m, int ctx);
void tdm_engine_free(struct tdm_engine *e);

/* Tokens consumed so far. */
int tdm_engine_pos(const struct tdm_engine *e);
/* Device bytes the engine holds: weights, state (KV caches, conv and GDN states), activations
 * (with the verify rounds' kept inputs); gdn_state: the FP32 recurrent states alone (part of gdn). */
struct tdm_engine_mem { size_t weights, kv, gdn, act, gdn_state; };
const struct tdm_engine_mem *tdm_engine_mem(const struct tdm_engine *e);

/* tdm_ref_forward's contract (without hidden/final_h): feeds T tokens at the current position;
 * logits NULL, or [T - logits_from][V] FP32 for rows logits_from..T-1 (copied to the host).
 * Returns 0, or -1 with tdm_err(): context full (nothing is consumed), a token id outside the
 * vocabulary (nothing consumed), a CUDA failure (the state is then undefined). */
int tdm_engine_forward(struct tdm_engine *e, const int32_t *ids, int T, int logits_from, float *logits);

/* The prompt's forward: tdm_engine_forward's contract, in chunks of up to
 * tdm_engine_prefill_rows(e) tokens (TANDEM_PREFILL_CHUNK, at most ctx; 32 for MoE layouts with
 * TANDEM_MOE_GROUPED=off) whose projections run the wide GEMM past 32 rows (each weight tile decoded
 * once per chunk, not once per 32 rows), whose MoE experts run the grouped form past 32 rows (moe.h:
 * the pairs sorted by expert, each expert's weight tiles decoded once per chunk), whose attention runs the flash prefill kernel past 32 rows (tdm_attn_prefill, one
 * launch a layer; TANDEM_ATTN_PREFILL=off: the decode kernel 32 queries a launch) and whose GDN
 * layers, past 32 rows, run the prefill kernels (kernels/layers.h: tdm_gdn_conv_prefill,
 * tdm_gdn_recur_chunked; TANDEM_GDN_PREFILL=off keeps the token-serial ones). Not row-invariant:
 * its logits and state are close to, not the bits of, one-token steps (tandem-prefillcheck gates
 * the difference); tandem-run, the speculative rounds and
 * tandem-prefillcheck's chunked path prefill prompts with it. */
int tdm_engine_prefill(struct tdm_engine *e, const int32_t *ids, int T, int logits_from, float *logits);
int tdm_engine_prefill_rows(const struct tdm_engine *e);

/* Greedy ids chosen on the device. The _ids forms take, besides logits (NULL, or as in the plain
 * form), out_ids: NULL, or one int32 per row logits_from..T-1 (R-1 for a verify, n-1 for a tree
 * verify): the row's argmax over its FP32 logits, ties to the lower id, NaN never chosen
 * (kernels/layers.h: tdm_argmax_rows), run on the device over the logits buffer the head wrote, in
 * the same pass and the same CUDA graph (every pass whose head runs computes them; only the copy
 * depends on out_ids) — so the ids are the host tdm_argmax's choice on the same bits (they can
 * differ only on a row whose id 0 is NaN: tdm_argmax keeps 0 there). With logits NULL only the ids
 * cross to the host (4 bytes a row instead of 4V); the head runs for rows logits_from..T-1 when
 * either is asked for. The plain forms are the _ids forms with out_ids NULL. */
int tdm_engine_forward_ids(struct tdm_engine *e, const int32_t *ids, int T, int logits_from, float *logits,
                           int32_t *out_ids);
int tdm_engine_prefill_ids(struct tdm_engine *e, const int32_t *ids, int T, int logits_from, float *logits,
                           int32_t *out_ids);

/* Clears the sequence: position 0, KV caches, conv and GDN states zeroed. */
int tdm_engine_reset(struct tdm_engine *e);

/* ---- speculative rounds, chain and tree verify (engine_spec.c; speculative.md) ----
 * tdm_engine_verify feeds R = 1..TDM_ENGINE_MAX_ROWS rows at the current position (row r at
 * position pos + r: the last emitted token, then the draft tokens) and returns their logits
 * without consuming them: the K/V rows are written at pos..pos+R-1 and the GDN conv and recurrent
 * states are only read (kernels/layers.h: the verify forms); the rows' GDN inputs are kept. Each
 * row's logits are the bits R one-token steps would give (the M-row kernels are row-invariant).
 * logits NULL, or [R - logits_from][V] FP32 for rows logits_from..R-1 (logits_from = R: none, and
 * the head is skipped). tdm_engine_verify_ids also gives the rows' greedy ids (the _ids forms above:
 * a greedy round's acceptance needs only those). Every verify shape runs from a CUDA graph after
 * its first use (one graph per shape whether the logits, the ids or both are copied).
 * tdm_engine_commit(e, j) then consumes the first j rows (1 <= j <= R): the position advances by j,
 * the K/V rows of the rest are dropped (only the length counts), and the conv and recurrent
 * states are run over the j kept rows from the round's entry state with the forward's kernels —
 * the states of j one-token steps, bit for bit. Deferred (TANDEM_GDN_DEFER, the default) the
 * commit launches nothing for the GDN layers: the j rows become pending, and the next pass — a
 * verify, tree verify, forward or prefill chunk — applies them to each layer's conv state and,
 * inside its recurrence kernel, to the recurrent state as it loads it, before its own rows
 * (layers.h, Deferred commit): the same per-token arithmetic, so the same bits; a reset drops
 * them with the states. A forward, a reset or another verify drops an uncommitted round;
 * committing without one is an error.
 * Returns 0, or -1 with tdm_err(): bad R / logits_from / j, context full, a token id outside the
 * vocabulary, no round to commit (nothing changes), a CUDA failure (the state is then undefined). */
int tdm_engine_verify(struct tdm_engine *e, const int32_t *ids, int R, int logits_from, float *logits);
int tdm_engine_verify_ids(struct tdm_engine *e, const int32_t *ids, int R, int logits_from, float *logits,
                          int32_t *out_ids);
int tdm_engine_commit(struct tdm_engine *e, int j);
/* Tree rounds: tdm_engine_verify_tree feeds n = 1..TDM_ENGINE_MAX_ROWS nodes, node 0 the root (the
 * last emitted token, parent[0] = -1) and every other node after its parent (0 <= parent[t] < t;
 * spec.c's depth-first layout is one such order). Node t is at position pos + depth(t), sees the
 * committed tokens, its ancestors and itself, and its logits are the bits the one-token steps over
 * its root-to-node path give (kernels/layers.h, Trees: the tree kernels repeat the chain kernels'
 * arithmetic along each path, so there is no near-tie exception on the GPU); its K/V rows go to
 * pos + t, the GDN states are only read, the nodes' GDN inputs are kept. logits as for a chain;
 * tdm_engine_verify_tree_ids also gives the nodes' greedy ids.
 * Tree verifies run from a CUDA graph per (n, logits_from) after the first use, the parents read
 * from device memory. tdm_engine_commit_path then consumes a root-to-node path of the last verify
 * (chain or tree): path[0] = 0, path[j] a child of path[j-1], len >= 1: the path's K/V rows are
 * gathered in order to pos..pos+len-1 (the others dropped), the path's kept GDN inputs gathered in
 * order and run through the forward's conv and recurrence from the round's entry state (deferred:
 * left pending for the next pass, as for a chain) — the states of len one-token steps over the
 * path's tokens, bit for bit; the position advances by len.
 * tdm_engine_commit(e, j) is the path 0..j-1 (refused on a tree when that is not a path). A path
 * commit runs from a graph per len. Returns as above (a bad parent or path is refused, nothing
 * changes). */
int tdm_engine_verify_tree(struct tdm_engine *e, const int32_t *ids, const int *parent, int n, int logits_from,
                           float *logits);
int tdm_engine_verify_tree_ids(struct tdm_engine *e, const int32_t *ids, const int *parent, int n, int logits_from,
                               float *logits, int32_t *out_ids);
int tdm_engine_commit_path(struct tdm_engine *e, const int *path, int len);
/* GDN state bytes the rounds moved since the engine was made: a chain verify reads every recurrent
 * state once and writes none; a tree verify reads it once more for each node whose parent is not
 * the node before it (the recurrence rebuilds that parent's state from the entry state); a commit
 * reads and writes each once. Deferred: a verify (chain or tree) with rows pending also writes
 * each state once (the state after them), and a commit moves none — a round of verify + commit
 * reads each state once and writes it once. A forward or prefill that applies pending rows is
 * not a round and is not counted (it reads and writes the states anyway). */
struct tdm_engine_round_bytes { int64_t state_read, state_written; };
const struct tdm_engine_round_bytes *tdm_engine_round_bytes(const struct tdm_engine *e);
/* 1 when the GDN commit is deferred (TANDEM_GDN_DEFER, read by tdm_engine_new), else 0; the rows
 * of the last commit still pending (0 after any pass or a reset). */
int tdm_engine_gdn_defer(const struct tdm_engine *e);
int tdm_engine_gdn_pending(const struct tdm_engine *e);
/* For tests: 1 once a deferred commit with rows has happened on the engine (since tdm_engine_new;
 * a reset keeps it), else 0. Until then no pass launches anything for pending rows (plain decode's
 * launches and graphs are TANDEM_GDN_DEFER=off's); the first such commit drops the graphs captured
 * before it, and from then on every graphed forward and verify takes pending rows up (eager ones:
 * when rows are pending). tdm_engine_gdn_pend_passes: the passes (forward, prefill chunk, verify,
 * tree verify; eager, or a graph's replay) that took pending rows up — launched
 * tdm_gdn_conv_pending on every GDN layer and the recurrence's pending forms — since the engine was
 * made. */
int tdm_engine_gdn_taking(const struct tdm_engine *e);
long tdm_engine_gdn_pend_passes(const struct tdm_engine *e);
/* For tests: FNV-1a (ref.c's tdm_ref_state_hash's) over the committed state as the next pass will
 * use it — the position, every attention layer's K and V rows in use, every GDN layer's conv state
 * and recurrent state — with pending rows applied first (in place, with the pending forms'
 * kernels: the bits a pass would give them; the next pass then finds none). A verify's round
 * survives it. Returns 0, or -1 with tdm_err() on a CUDA failure. */
int tdm_engine_state_hash(struct tdm_engine *e, uint64_t *hash);

/* ---- the MTP drafter (engine_mtp.c; models.md "MTP drafter"; spec.h says how rounds use it) ----
 * tdm_engine_mtp_supported: 0 if the engine can run m's MTP layer (it has one; its projections BF16,
 * FP8 or NVFP4; an MoE MTP layer's experts as the MoE kernels take them), else -1 with tdm_err().
 * Needs no device.
 * tdm_engine_mtp_init uploads it on first use: mtp.pre_fc_norm_embedding, pre_fc_norm_hidden, fc,
 * norm and the full-attention decoder layer mtp.layers.0 with its own BF16 K and V caches
 * [ctx][Hkv][D]; the embedding and the head are the main model's. The drafter's position (the MTP
 * rows fed so far) starts at 0; tdm_engine_reset sets it to 0.
 * tdm_engine_mtp(e, pos, next_ids, T, k, drafts, logits) runs the drafter from its position pos
 * (0 <= pos <= tdm_engine_mtp_pos: a rewind drops the rows from pos on, whose K/V rows the next
 * rows overwrite; attention never reads above its own position):
 *   T >= 1 real rows at MTP positions pos..pos+T-1: row t takes token next_ids[t] (the token after
 *     the main model's row) and the main model's final-norm output of row t of the engine's last
 *     forward chunk or verify, read on the device (T <= those rows: a forward of more than
 *     TDM_ENGINE_MAX_ROWS tokens keeps only its last chunk's; a commit keeps its verify's rows);
 *   then, for k >= 1, k draft tokens: drafts[0] = argmax of the head on the last real row's output
 *     after mtp.norm; step j = 1..k-1 feeds (drafts[j-1], the previous step's output after mtp.norm)
 *     at position pos+T-1+j and drafts[j] = argmax of its head (ties to the lower id), the tokens
 *     chained on the device without a round trip. logits NULL or [k][V] FP32: the rows the drafts
 *     were chosen from. k = 0 runs no head (drafts and logits untouched). logits row 0
 *     is the last real row's: a tree's root takes its top-b from it.
 * ref.c's tdm_ref_mtp_h with its rounding points; row-invariant (any split of the real rows into
 * calls gives the same bits). Launches on the engine's stream, synchronised on return: with
 * TANDEM_CUDA_GRAPH on, from a CUDA graph per call shape (T, k, r0) captured on the shape's second
 * use (the same bits as eager launches). The position becomes pos + T + max(k - 1, 0).
 * Returns 0, or -1 with tdm_err(): no MTP uploaded, bad pos / T / k, context full, a token id
 * outside the vocabulary (nothing changes then), a CUDA failure (the state is then undefined). */
int tdm_engine_mtp_supported(const struct tdm_model *m);
int tdm_engine_mtp_init(struct tdm_engine *e);
int tdm_engine_mtp_pos(const struct tdm_engine *e);
int tdm_engine_mtp(struct tdm_engine *e, int pos, const int32_t *next_ids, int T, int k, int32_t *drafts, float *logits);
/* tdm_engine_mtp on real rows r0..r0+T-1 of the last chunk's final-norm rows (T <= 32 a call): a
 * prefill chunk of more than 32 tokens is fed to the drafter 32 rows at a time. */
int tdm_engine_mtp_at(struct tdm_engine *e, int pos, int r0, const int32_t *next_ids, int T, int k, int32_t *drafts,
                      float *logits);
/* tdm_engine_mtp on real rows rows[0..T-1] of those final-norm rows, in that order, gathered on the
 * device: rows increasing from row 0 or more, within 32 rows (a tree verify's accepted root-to-node
 * path: tdm_engine_commit_path leaves the verify's rows in place). Consecutive rows are
 * tdm_engine_mtp_at's call; others run from a CUDA graph per (T, k) whatever the rows (the same bits:
 * the rows are row-invariant). */
int tdm_engine_mtp_path(struct tdm_engine *e, int pos, const int *rows, const int32_t *next_ids, int T, int k,
                        int32_t *drafts, float *logits);
/* MTP trees (spec.c's expand; speculative.md): TDM_ENGINE_MTP_SLOTS slots on the device, each one
 * MTP output after mtp.norm (BF16 [H]). Every tdm_engine_mtp / _at / _path call keeps the output of
 * its last real row in slot 0: the tree's root, whose drafts are that call's first draft (argmax)
 * and first logits row (the top-b: tdm_topk on the host).
 * tdm_engine_mtp_node(e, pos, id, parent, slot, draft, logits) runs one draft row for a tree node
 * at MTP position pos (0 <= pos <= tdm_engine_mtp_pos: a rewind as above; a node at depth d >= 1
 * below a root whose last real row was at position p sits at p + d): it feeds (id, the output in
 * slot parent), keeps its own output in slot `slot`, and gives draft (NULL, or the argmax of its
 * head, ties to the lower id, chosen on the device) and logits (NULL or [V] FP32: the row the draft
 * was chosen from). A node's launches are a chained draft step's (its input copied in from the
 * slot, its output copied out: copies only), so a chain of node calls gives tdm_engine_mtp's drafts
 * and logits bit for bit. Depth-first expansion keeps the MTP K/V rows below each node its
 * ancestors' (siblings overwrite the rows they share), as the CPU reference's tree does. One CUDA
 * graph serves every node (position and slots read from device memory; the same bits as eager).
 * The position becomes pos + 1. Returns 0, or -1 with tdm_err(): no MTP uploaded, bad pos, a slot
 * outside 0..TDM_ENGINE_MTP_SLOTS-1, a parent slot nothing has written since the last reset, context
 * full, a token id outside the vocabulary (nothing changes then), a CUDA failure (the state is then
 * undefined). */
#define TDM_ENGINE_MTP_SLOTS (TDM_ENGINE_MAX_ROWS + 1)
int tdm_engine_mtp_node(struct tdm_engine *e, int pos, int32_t id, int parent, int slot, int32_t *draft, float *logits);
#ifdef __cplusplus
}
#endif
#endif
