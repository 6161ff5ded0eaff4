/* engine_impl.h — the hooks engine.c gives engine_spec.c (the speculative rounds' protocol) and
 * engine_mtp.c (the MTP drafter), so that the rounds' bookkeeping and the drafter live apart from
 * the engine's launch sequences. Not for tools: they take engine.h. */
#ifndef TDM_ENGINE_IMPL_H
#define TDM_ENGINE_IMPL_H
#include "engine.h"
#include "engine_moe.h"
#include "matmul.h"
#include "mm_layout.h"

const struct tdm_model *tdm_engine_model(const struct tdm_engine *e);
int tdm_engine_ctx(const struct tdm_engine *e);
/* Rows of the last verify that a commit may take; 0 when there is none (after a forward, a reset,
 * a commit, or a failed verify). */
int tdm_engine_round_rows(const struct tdm_engine *e);
/* The launches of a verify of R rows (checked by the caller: 1..TDM_ENGINE_MAX_ROWS, in the context,
 * ids in the vocabulary, 0 <= from <= R) and of a commit of j of them (1 <= j <= the round's rows),
 * as engine.h's tdm_engine_verify_ids and tdm_engine_commit describe (gids: the rows' greedy ids,
 * or NULL); the stream is synchronised on return. */
int tdm_engine_verify_rows(struct tdm_engine *e, const int32_t *ids, int R, int from, float *logits, int32_t *gids);
int tdm_engine_commit_rows(struct tdm_engine *e, int j);

/* What the MTP drafter uses of the engine. Borrowed activations: every pass of engine.c
 * synchronises the stream before it returns, so between passes they hold nothing that is needed
 * again (the head's logits buffer included); the MTP launches on the same stream. final_xn [R][H]:
 * the main model's final-norm output of the last forward chunk or verify (final_rows rows; 0 after
 * a reset or a failed pass); no pass but a forward or a verify writes it. */
struct tdm_engine_view {
    const struct tdm_model *m;
    int ctx;
    void *stream;
    const struct tdm_tiles *tiles;
    const void *embed;                          /* [V][H] BF16, or F32 when embed_f32 */
    int embed_f32;
    const struct tdm_dweight *head;             /* [V, H] */
    uint16_t *qg, *kk, *vv, *q, *att, *y;       /* attention and layer outputs, ROWS rows */
    uint16_t *g, *u;                            /* dense MLP [ROWS][I]; NULL when every layer is MoE */
    uint16_t *xn_b, *att_b, *g_b;               /* blocked copies of H-, Hq*D- and I-wide product inputs
                                                 * (TANDEM_MM_XB; NULL when off): tdm_engine_blocked */
    enum tdm_mlp_fuse fuse_mlp;                 /* TANDEM_MLP_FUSE (tdm_engine_dense_mlp) */
    float *attn_scratch;                        /* tdm_attn_scratch_bytes(ROWS, Hq, D, ctx) */
    float *logits;                              /* [ROWS][V] */
    struct tdm_emoe *moe;
    uint16_t *final_xn;
    int final_rows;
    struct tdm_engine_mem *mem;                 /* the drafter adds its device bytes */
    int use_graph;                              /* TANDEM_CUDA_GRAPH: passes replay CUDA graphs */
};
void tdm_engine_view(struct tdm_engine *e, struct tdm_engine_view *v);
/* A product input's blocked copy for M rows: the buffer at 1..TDM_MM_XB_ROWS rows, else NULL. The
 * kernel that writes an input and the products that read it take the same answer, so a product
 * reads a copy only where it was written. */
static inline uint16_t *tdm_engine_blocked(uint16_t *buf, int M) { return M <= TDM_MM_XB_ROWS ? buf : NULL; }
/* A dense MLP on M rows (the main layers' and the MTP layer's): y = down(silu(xn gate^T) * xn up^T)
 * with g [M][I] (and u, three launches) as its intermediate, in one SwiGLU launch where fuse
 * (enum tdm_mlp_fuse) and the setting allow, else
 * gate, up and SiLU x up; the same bits either way. xnb, gb: the blocked copies of xn (read) and g
 * (written, then read by down), or NULL. */
int tdm_engine_dense_mlp(enum tdm_mlp_fuse fuse, const struct tdm_dweight *gate, const struct tdm_dweight *up,
                         const struct tdm_dweight *down, const uint16_t *xn, const uint16_t *xnb, int H, int M,
                         uint16_t *g, uint16_t *u, uint16_t *gb, int64_t I, uint16_t *y, const struct tdm_tiles *t,
                         void *st);
/* The drafter's state, owned by the engine (NULL until tdm_engine_mtp_init): freed and reset with
 * it (engine_mtp.c). */
struct tdm_emtp;
struct tdm_emtp **tdm_engine_mtp_state(struct tdm_engine *e);
void tdm_emtp_free(struct tdm_emtp *x);
void tdm_emtp_reset(struct tdm_emtp *x);
/* A tree verify (parent checked by the caller: parent[0] = -1, 0 <= parent[r] < r) and the commit
 * of a root-to-node path of the last verify (checked against its parents: path[0] = 0, path[j]'s
 * parent path[j-1]); a path 0..len-1 commits as tdm_engine_commit_rows(e, len). */
int tdm_engine_verify_tree_rows(struct tdm_engine *e, const int32_t *ids, const int *parent, int R, int from,
                                float *logits, int32_t *gids);
int tdm_engine_commit_path_rows(struct tdm_engine *e, const int *path, int len);
/* The parents of the last verify's rows (a chain's are r - 1); valid while tdm_engine_round_rows
 * is not 0. */
const int *tdm_engine_round_parents(const struct tdm_engine *e);
#endif
