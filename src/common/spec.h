/* spec.h — speculative decoding on the CPU reference or the CUDA engine: drafters, rounds (draft,
 * verify, greedy acceptance, commit), statistics. The algebra is speculative.md's; the round
 * functions are tdm_ref_verify / tdm_ref_commit (ref.h) on the CPU and tdm_engine_verify /
 * tdm_engine_verify_tree / tdm_engine_commit_path (engine.h: the accepted path's GDN conv and
 * recurrence run from the round's entry state — in the next pass's kernels, or replayed at the
 * commit with TANDEM_GDN_DEFER=off; a tree's nodes get the bits of one-token decoding along their
 * paths, not the CPU's factored form) on the GPU.
 *
 * A round: the root is the last emitted token (not yet fed). The drafter proposes a chain of k
 * tokens, or a tree whose node at depth d has up to branch[d] children (the drafter's top-b
 * tokens there), at most TDM_SPEC_MAX_NODES nodes with the root, laid out depth-first. One verify
 * computes every node's logits; greedy acceptance takes the longest path whose every token is the
 * argmax of its parent's logits, plus the bonus token (the argmax at the path's end). The path is
 * committed; the other nodes' KV rows are dropped, the GDN factors of the path become pending
 * (deferred commit) unless TANDEM_SPEC_DEFER=off (the CPU) or TANDEM_GDN_DEFER=off (the GPU).
 *
 * Drafters and how each stays consistent after a rejection:
 *  - mtp: the model's MTP layer, chained (a draft step feeds the drafted token and the MTP's own
 *    output after mtp.norm as the next h, at the next position). Its KV cache lives in the main
 *    tdm_ref. Rule: MTP positions below the round's root position hold only real inputs (committed
 *    tokens and the main model's final-norm output h); the steps fed with drafted tokens and the
 *    MTP's own h sit above and are always discarded (tdm_ref_mtp_rewind), whether accepted or not.
 *    After a commit of L+1 rows, the drafter is rewound to the old root position and fed the L+1
 *    real rows (accepted tokens / bonus, and the verify's h of the path nodes): its last row drafts
 *    the next round's first token. In a tree, a node at depth d is drafted at MTP position
 *    root - 1 + d after rewinding there; in depth-first order the rows below belong to its
 *    ancestors, the same stack argument as the GDN factors'. On the CUDA engine the same rows and
 *    positions run in one call (tdm_engine_mtp_path) right after the commit: rewind, the L+1 real
 *    rows with h read on the device from the verify's final-norm rows of the accepted path, then for
 *    a chain the next round's whole chain of drafts, each token the argmax of the previous step,
 *    chained on the device; the prompt is fed chunk by chunk (at most TDM_ENGINE_MAX_ROWS rows) as
 *    the prefill runs. A tree on the engine takes that call's first draft and logits row as the
 *    root's, and drafts each node with one MTP row (tdm_engine_mtp_node: the h of a node's parent
 *    kept on the device in a slot per node, the top-1 chosen on the device, a top-b from its logits
 *    on the host), at the CPU's positions in the CPU's order: the CPU's tree drafts up to near ties
 *    of the MTP logits (the engine's sums run in another order).
 *  - ngram: prompt lookup without a model: the longest suffix (n..1 tokens) of the history (prompt,
 *    emitted tokens, the node's path) that occurred earlier, most recent match first; it proposes
 *    the token that followed (for a tree: distinct followers of the longest, then shorter matches).
 *    No state to roll back.
 *  - draft: a separate model of the same vocabulary with its own tdm_ref. At the round start its
 *    recurrent state is snapshotted; a node is drafted by feeding its token on top of its parent's
 *    state (a snapshot per depth where a node has several children); after the commit the snapshot
 *    is loaded and the accepted path is fed again in one call, so the draft model's state is
 *    always that of the committed tokens. On the CUDA engine the draft model is a second engine
 *    and needs no snapshot: a node is drafted by a verify of its path (root..node) on top of the
 *    committed tokens, and after the main commit the draft engine commits the accepted path (its
 *    last verify when that began with the path, else a verify of the path first).
 */
#ifndef TDM_SPEC_H
#define TDM_SPEC_H
#include "backend.h"
#include "model.h"
#include "ref.h"
#include <jansson.h>
#include <stdio.h>
#ifdef __cplusplus
extern "C" {
#endif

enum tdm_spec_kind { TDM_SPEC_OFF, TDM_SPEC_MTP, TDM_SPEC_NGRAM, TDM_SPEC_DRAFT };
const char *tdm_spec_name(enum tdm_spec_kind k);
/* "off", "mtp", "ngram", "draft"; returns 0 or -1 with tdm_err(). */
int tdm_spec_parse(const char *s, enum tdm_spec_kind *out);

#define TDM_SPEC_DEFAULT_DRAFT 4
#define TDM_SPEC_DEFAULT_NGRAM 3

struct tdm_spec_opts {
    enum tdm_spec_kind kind;
    int draft;                          /* chain: draft tokens per round (1..31) */
    int tree_depth;                     /* 0: chain; else the tree's depth, branch[0..depth-1] */
    int branch[TDM_SPEC_MAX_NODES];
    int ngram_max;                      /* the longest suffix the n-gram drafter matches */
    const struct tdm_model *draft_model;
    int defer;                          /* deferred commit of the GDN state (TANDEM_SPEC_DEFER) */
    long fault_at;                      /* TANDEM_SPEC_FAULT: testing only (settings.c) */
    int prefill_chunk;                  /* TANDEM_PREFILL_CHUNK */
    enum tdm_backend backend;           /* the verified model (and a draft model) on the CPU reference
                                         * or the CUDA engine (chain and tree rounds with every drafter) */
};
/* Defaults: chain of TDM_SPEC_DEFAULT_DRAFT, n-gram up to TDM_SPEC_DEFAULT_NGRAM, switches from
 * the settings table. Returns 0 or -1 with tdm_err() (a bad switch value). */
int tdm_spec_opts_init(struct tdm_spec_opts *o);
/* "3,2,1": branching per depth (each 1..16, at most 31 depths; the tree is cut at 32 nodes). */
int tdm_spec_parse_tree(const char *spec, struct tdm_spec_opts *o);
/* The tree of o's branching when the drafter proposes every child it is asked for: depth-first
 * (the layout of the rounds, a node's subtree before its next sibling), cut at TDM_SPEC_MAX_NODES
 * nodes with the root, so the first nodes of the depth-first order are kept. parent [n] (-1 for the
 * root), depth [n] (or NULL), n returned. */
int tdm_spec_tree_layout(const struct tdm_spec_opts *o, int *parent, int *depth);
/* "chain 5" or "tree 3,2,1", for reports. */
void tdm_spec_shape_name(const struct tdm_spec_opts *o, char *buf, size_t n);

#define TDM_SPEC_MAX_SHAPES 64
struct tdm_spec_stats {
    int rounds;
    long accepted;                              /* drafted tokens accepted, all rounds */
    long drafted_at[TDM_SPEC_MAX_NODES];        /* [d]: rounds with a draft at depth d (d >= 1) */
    long accepted_at[TDM_SPEC_MAX_NODES];       /* [d]: rounds that accepted depth d */
    int nshapes;
    struct { int nodes, tree; int rounds; double ms; } shapes[TDM_SPEC_MAX_SHAPES];
    double prefill_ms, decode_ms;
    struct tdm_ref_stats bytes;                 /* GDN state/factor bytes of the decode rounds */
    int64_t state_bytes;                        /* all GDN states, once */
    const char *commit;                         /* "deferred", "immediate" (CPU), "deferred", "replayed" (CUDA) */
};

/* Prefill the prompt (>= 1 token) and emit n_new tokens by speculative rounds (o->kind != OFF) or
 * one token at a time (OFF), on o->backend. out [n_new]; out_logits NULL or [n_new][V]: the logits
 * row each token was chosen from. Greedy acceptance needs only each row's argmax: on the CUDA
 * engine the ids are chosen on the device (engine.h: the _ids forms) and the logits cross to the
 * host only when out_logits is given or TANDEM_SPEC_FAULT is set (the tokens are then picked from
 * them on the host, as the CPU's are); on the CPU reference the ids are tdm_argmax of its logits.
 * A draft engine's chain drafts come the same way (top-1 ids; a tree's top-b still reads logits).
 * Returns 0; -1 with tdm_err() for bad options or input, an
 * unsupported combination, no device or out of device memory; -2 with tdm_err() when a CUDA call
 * failed during the run (the tools exit 1 then, 2 for -1). */
int tdm_spec_generate(const struct tdm_model *m, const struct tdm_spec_opts *o, const int32_t *prompt, int n_prompt,
                      int n_new, int32_t *out, float *out_logits, struct tdm_spec_stats *st);

/* The n-gram drafter's proposals: up to want distinct tokens that followed earlier occurrences of
 * the history's suffix, longest suffix (ngram_max..1) first, most recent occurrence first. */
int tdm_ngram_propose(const int32_t *hist, int n, int ngram_max, int want, int32_t *out);

/* "# " lines on f; a JSON object (new reference). */
void tdm_spec_stats_print(FILE *f, const struct tdm_spec_stats *st);
json_t *tdm_spec_stats_json(const struct tdm_spec_stats *st);
#ifdef __cplusplus
}
#endif
#endif
