/* engine_mtp.c — the MTP drafter on the CUDA engine (engine.h: tdm_engine_mtp): ref.c's
 * tdm_ref_mtp_h as launches on the engine's stream. Per call of M <= 32 rows at MTP position pos:
 *   emb = embed[ids]; cat = [rmsnorm(emb, pre_fc_norm_embedding) | rmsnorm(h, pre_fc_norm_hidden)]
 *   x = cat fc^T
 *   xn = rmsnorm(x, in_norm); y = attention(xn) (own KV cache, rotary position pos + r)
 *   xn = rmsnorm(x += y, post_norm); y = mlp(xn) (dense, or the MoE of engine_moe.c's slot L)
 *   oh = rmsnorm(x += y, mtp.norm); logits = oh head^T (FP32, the draft rows only); id = argmax
 * where h is the main model's final-norm row (engine_impl.h's final_xn) for real rows, the previous
 * step's oh for a chained draft step, and ids of a chained step are the previous step's argmax on
 * the device. The launches of the decoder layer are engine.c's attn_mixer and mlp with the MTP's
 * weights, cache and residual buffers (the same kernels, arguments and order). Activations other
 * than the MTP's own are borrowed from the engine between its passes.
 * Trees (tdm_engine_mtp_node): every call keeps the oh of its last real row in slot 0 of the slots
 * (x->sl), and a node call runs one chained step on the oh its parent's call kept in another slot,
 * keeping its own oh in its slot. Real rows that are not consecutive final-norm rows (the accepted
 * path of a tree verify: tdm_engine_mtp_path) are gathered into x->hg first.
 * Graphs (TANDEM_CUDA_GRAPH): a call's launches run from a CUDA graph per shape (real rows T, drafts
 * k, first real row r0), captured on the shape's second use and replayed after, as engine.c's
 * passes are. Eager, the host position sizes and positions the attention; graphed, each
 * mtp_rows call reads its position from d_posv (written before every launch: pos, then pos + T +
 * j - 1 for draft step j) and ctx - M sizes the grids, so one graph serves every position. The
 * token ids go in, gathered real rows are gathered, and the drafts and logits come out outside the
 * graph. A node call is the shape (T = 0, k = 1, r0 = -1): its slots come from device memory
 * (x->d_node, tdm_rows_compact's row terms), so one graph serves every node. */
#include "device.h"
#include "engine.h"
#include "engine_glue.h"
#include "engine_impl.h"
#include "err.h"
#include "layers.h"
#include <stdio.h>
#include <stdlib.h>

#define ROWS TDM_ENGINE_MAX_ROWS
#define MAXALLOC 28
#define MTP_GRAPHS 64   /* call shapes with a graph; a call of another shape past these runs eager */
#define SLOTS TDM_ENGINE_MTP_SLOTS

struct mtp_graph {
    int T, k, r0;       /* the shape (r0 = -1: gathered real rows; T = 0: a tree node) */
    int eager_runs;     /* captured on the second use */
    tdm_graph g;
};

struct tdm_emtp {
    int pos;                                  /* MTP rows fed so far (the drafter's position) */
    float *pre_e, *pre_h, *norm;              /* [H]: pre_fc_norm_embedding, pre_fc_norm_hidden, norm */
    struct tdm_dweight fc;                    /* [H, 2H]: embedding half first */
    float *in_norm, *post_norm;               /* [H] */
    struct tdm_dweight q, k, v, o;            /* [2HqD, H], [HkvD, H] x2, [H, HqD] */
    float *q_norm, *k_norm;                   /* [D] */
    uint16_t *kc, *vc;                        /* [ctx][Hkv][D] BF16 */
    int is_moe;                               /* MoE MLP: engine_moe.c's slot n_layers */
    struct tdm_dweight gate, up, down;        /* dense MLP [I, H] x2, [H, I] */
    struct tdm_dweight head;                  /* [V, H]: the drafter's own head (model.h: mtp.has_head) */
    const struct tdm_dweight *draft_head;     /* &head, or the engine's head */
    /* own activations, ROWS rows */
    int32_t *ids, *draft;                     /* [ROWS]: the real rows' tokens; the drafts */
    uint16_t *emb, *cat;                      /* [R][H], [R][2H] */
    uint16_t *cat_b;                          /* cat's blocked copy (TANDEM_MM_XB; NULL when off, or where H
                                               * is not whole slabs: the halves' copies then do not abut) */
    uint16_t *x, *xn, *oh;                    /* [R][H]: residual, layer norms' output, mtp.norm output */
    void *amax;                               /* tdm_argmax_rows scratch for one row */
    uint16_t *hg;                             /* [R][H]: real rows gathered from the final-norm rows */
    int32_t *d_rows;                          /* [ROWS]: their rows, less the first, for tdm_rows_compact */
    uint16_t *sl;                             /* [SLOTS + 2][H]: row 0 a node call's h (its parent's slot),
                                               * rows 1..SLOTS the slots, row SLOTS + 1 a node's oh on its
                                               * way to its slot */
    int32_t *d_node;                          /* [3]: a node call's 1 + parent, 1 + slot, SLOTS - slot */
    int32_t node[3];                          /* its host copy */
    uint64_t slots_set;                       /* bit s: slot s holds an oh (since the last reset) */
    int32_t *d_posv;                          /* [ROWS]: each mtp_rows call's position, graphed */
    int32_t posv[ROWS];                       /* its host copy */
    struct mtp_graph graphs[MTP_GRAPHS];
    int ngraphs;
    void *alloc[MAXALLOC];
    int nalloc;
};

/* ---- what the engine runs ---- */

static const char *bad_format(const struct tdm_qweight *w)
{
    return w->fmt == TDM_W_BF16 || w->fmt == TDM_W_FP8 || w->fmt == TDM_W_NVFP4 ? NULL : tdm_wfmt_name(w->fmt);
}

int tdm_engine_mtp_supported(const struct tdm_model *m)
{
    const char *dir = m->dir ? m->dir : "model";
    if (!m->has_mtp) return tdm_errf("%s: the checkpoint has no MTP layer", dir);
    const struct tdm_mtp *t = &m->mtp;
    const struct tdm_layer *l = &t->layer;
    const struct { const char *what; const struct tdm_qweight *w; } p[] = {
        {"mtp.fc", &t->fc}, {"mtp.layers.0.self_attn.q_proj", &l->attn.q}, {"mtp.layers.0.self_attn.k_proj", &l->attn.k},
        {"mtp.layers.0.self_attn.v_proj", &l->attn.v}, {"mtp.layers.0.self_attn.o_proj", &l->attn.o},
        {"mtp.layers.0.mlp.gate_proj", l->is_moe ? NULL : &l->mlp.gate},
        {"mtp.layers.0.mlp.up_proj", l->is_moe ? NULL : &l->mlp.up},
        {"mtp.layers.0.mlp.down_proj", l->is_moe ? NULL : &l->mlp.down},
        {"mtp.layers.0.mlp.gate", l->is_moe ? &l->moe.router : NULL},
        {"mtp.layers.0.mlp.shared_expert.gate_proj", l->is_moe ? &l->moe.shared.gate : NULL},
        {"mtp.layers.0.mlp.shared_expert.up_proj", l->is_moe ? &l->moe.shared.up : NULL},
        {"mtp.layers.0.mlp.shared_expert.down_proj", l->is_moe ? &l->moe.shared.down : NULL},
        {"mtp.layers.0.mlp.shared_expert_gate", l->is_moe ? &l->moe.shared_gate : NULL},
    };
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) {
        const char *f = p[i].w ? bad_format(p[i].w) : NULL;
        if (f) return tdm_errf("%s: %s stored %s: the CUDA matrix kernels take BF16, FP8 and NVFP4 weights", dir, p[i].what, f);
    }
    if (l->is_moe) {
        int main_moe = 0;
        for (int i = 0; i < m->cfg.n_layers; i++) main_moe |= m->layers[i].is_moe;
        if (!main_moe) return tdm_errf("%s: an MoE MTP layer on a model without MoE layers: not supported by the CUDA engine", dir);
    }
    return 0;
}

/* ---- set-up ---- */

void tdm_emtp_free(struct tdm_emtp *x)
{
    if (!x) return;
    struct tdm_dweight *w[] = {&x->fc, &x->q, &x->k, &x->v, &x->o, &x->gate, &x->up, &x->down, &x->head};
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) tdm_dweight_free(w[i]);
    for (int i = 0; i < x->ngraphs; i++)
        if (x->graphs[i].g) tdm_graph_destroy(x->graphs[i].g);
    for (int i = 0; i < x->nalloc; i++) tdm_cuda_free(x->alloc[i]);
    free(x);
}

void tdm_emtp_reset(struct tdm_emtp *x)
{
    x->pos = 0;
    x->slots_set = 0;
}

static void *dalloc(struct tdm_emtp *x, size_t bytes, size_t *count, const char *what)
{
    void *p;
    if (x->nalloc == MAXALLOC) { tdm_errf("CUDA engine: MTP layer: more than %d allocations", MAXALLOC); return NULL; }
    if (tdm_cuda_malloc(&p, bytes) != 0) {
        tdm_err_prefix("CUDA engine: MTP layer %s (%.1f MB)", what, bytes / 1e6);
        return NULL;
    }
    x->alloc[x->nalloc++] = p;
    *count += bytes;
    return p;
}

static float *up_f32(struct tdm_emtp *x, struct tdm_engine_mem *mem, const float *src, size_t n, const char *what)
{
    float *p = dalloc(x, n * sizeof(float), &mem->weights, what);
    if (p && tdm_cuda_h2d(p, src, n * sizeof(float)) != 0) return NULL;
    return p;
}

static int up_w(struct tdm_engine_mem *mem, const struct tdm_qweight *h, struct tdm_dweight *d, const char *what)
{
    if (tdm_dweight_upload(h, d) != 0) return tdm_err_prefix("CUDA engine: %s", what);
    mem->weights += (size_t)tdm_qweight_bytes(h);
    return 0;
}

static int upload(struct tdm_emtp *x, const struct tdm_engine_view *v)
{
    const struct tdm_model *m = v->m;
    const struct tdm_config *c = &m->cfg;
    const struct tdm_mtp *t = &m->mtp;
    const struct tdm_layer *l = &t->layer;
    const size_t H = (size_t)c->hidden, D = (size_t)c->head_dim;
    struct tdm_engine_mem *mem = v->mem;
    if (!(x->pre_e = up_f32(x, mem, t->pre_fc_norm_embedding, H, "mtp.pre_fc_norm_embedding")) ||
        !(x->pre_h = up_f32(x, mem, t->pre_fc_norm_hidden, H, "mtp.pre_fc_norm_hidden")) ||
        !(x->norm = up_f32(x, mem, t->norm, H, "mtp.norm")) ||
        !(x->in_norm = up_f32(x, mem, l->in_norm, H, "mtp.layers.0.input_layernorm")) ||
        !(x->post_norm = up_f32(x, mem, l->post_norm, H, "mtp.layers.0.post_attention_layernorm")) ||
        !(x->q_norm = up_f32(x, mem, l->attn.q_norm, D, "mtp.layers.0.self_attn.q_norm")) ||
        !(x->k_norm = up_f32(x, mem, l->attn.k_norm, D, "mtp.layers.0.self_attn.k_norm")))
        return -1;
    if (up_w(mem, &t->fc, &x->fc, "mtp.fc") || up_w(mem, &l->attn.q, &x->q, "mtp.layers.0.self_attn.q_proj") ||
        up_w(mem, &l->attn.k, &x->k, "mtp.layers.0.self_attn.k_proj") ||
        up_w(mem, &l->attn.v, &x->v, "mtp.layers.0.self_attn.v_proj") ||
        up_w(mem, &l->attn.o, &x->o, "mtp.layers.0.self_attn.o_proj"))
        return -1;
    x->draft_head = v->head;
    if (t->has_head) {
        if (up_w(mem, &t->head, &x->head, "the drafter's head (TANDEM_DRAFT_FORMAT)") != 0) return -1;
        x->draft_head = &x->head;
    }
    x->is_moe = l->is_moe;
    if (l->is_moe) {
        if (tdm_emoe_upload_mtp(v->moe, &mem->weights) != 0) return -1;
    } else {
        if (!v->g || !v->u) return tdm_errf("CUDA engine: a dense MTP MLP on a model whose layers are all MoE: not supported");
        if (up_w(mem, &l->mlp.gate, &x->gate, "mtp.layers.0.mlp.gate_proj") ||
            up_w(mem, &l->mlp.up, &x->up, "mtp.layers.0.mlp.up_proj") ||
            up_w(mem, &l->mlp.down, &x->down, "mtp.layers.0.mlp.down_proj"))
            return -1;
    }
    const size_t kv = (size_t)v->ctx * c->n_kv_heads * D * 2;
    if (!(x->kc = dalloc(x, kv, &mem->kv, "K cache")) || !(x->vc = dalloc(x, kv, &mem->kv, "V cache"))) return -1;
    const size_t R = ROWS;
    size_t *a = &mem->act;
    if (!(x->ids = dalloc(x, R * sizeof(int32_t), a, "token ids")) || !(x->draft = dalloc(x, R * sizeof(int32_t), a, "draft ids")) ||
        !(x->emb = dalloc(x, R * H * 2, a, "activations")) || !(x->cat = dalloc(x, R * 2 * H * 2, a, "activations")) ||
        (v->xn_b && H % TDM_MM_SLAB_K == 0 &&
         !(x->cat_b = dalloc(x, (size_t)tdm_mm_xb_elems(2 * (int64_t)H) * 2, a, "activations (blocked copies)"))) ||
        !(x->x = dalloc(x, R * H * 2, a, "activations")) || !(x->xn = dalloc(x, R * H * 2, a, "activations")) ||
        !(x->oh = dalloc(x, R * H * 2, a, "activations")) ||
        !(x->d_posv = dalloc(x, R * sizeof(int32_t), a, "positions")) ||
        !(x->amax = dalloc(x, tdm_argmax_scratch_bytes(1, c->vocab), a, "argmax scratch")) ||
        !(x->hg = dalloc(x, R * H * 2, a, "gathered rows")) || !(x->d_rows = dalloc(x, R * sizeof(int32_t), a, "row list")) ||
        !(x->sl = dalloc(x, (SLOTS + 2) * H * 2, a, "tree slots")) ||
        !(x->d_node = dalloc(x, sizeof x->node, a, "tree slot terms")))
        return -1;
    return 0;
}

int tdm_engine_mtp_init(struct tdm_engine *e)
{
    struct tdm_emtp **slot = tdm_engine_mtp_state(e);
    if (*slot) return 0;
    struct tdm_engine_view v;
    tdm_engine_view(e, &v);
    if (tdm_engine_mtp_supported(v.m) != 0) return -1;
    struct tdm_emtp *x = calloc(1, sizeof *x);
    if (!x) return tdm_errf("CUDA engine: out of host memory");
    if (upload(x, &v) != 0) {
        tdm_emtp_free(x);
        return -1;
    }
    *slot = x;
    fprintf(stderr, "# CUDA engine: MTP layer uploaded (%s MLP, KV caches of ctx %d)\n", x->is_moe ? "MoE" : "dense", v.ctx);
    return 0;
}

int tdm_engine_mtp_pos(const struct tdm_engine *e)
{
    const struct tdm_emtp *x = *tdm_engine_mtp_state((struct tdm_engine *)e); /* read only */
    return x ? x->pos : 0;
}

/* ---- the launches ---- */

/* M rows at x->pos: token ids (device) ids[r], h rows h + r H (device, BF16); the output after
 * mtp.norm into x->oh rows 0..M-1. The MTP's K/V rows at x->pos..x->pos+M-1 are written; x->pos
 * advances. dpos: NULL eager; graphed, the device copy of x->pos (the kernels read it, and ctx - M
 * sizes their grids). */
static int mtp_rows(struct tdm_emtp *x, const struct tdm_engine_view *v, const int32_t *ids, uint16_t *h, int M,
                    const int32_t *dpos)
{
    const struct tdm_config *c = &v->m->cfg;
    const int H = c->hidden, V = c->vocab, Hq = c->n_q_heads, Hkv = c->n_kv_heads, D = c->head_dim;
    const int64_t ldqg = 2 * (int64_t)Hq * D, ldkv = (int64_t)Hkv * D, I = c->intermediate;
    const float eps = c->rms_eps;
    void *st = v->stream;
    const struct tdm_tiles *t = v->tiles;
    const int pos = dpos ? v->ctx - M : x->pos;
    /* the fc's input: [pre_fc_norm_embedding(embed) | pre_fc_norm_hidden(h)] per row, each norm
     * writing its half of the rows and of their blocked copy (whole slabs of H: the second half's
     * copy starts tdm_mm_xb_elems(H) in) */
    uint16_t *catb = tdm_engine_blocked(x->cat_b, M);
    const int64_t H2 = 2 * (int64_t)H;
    if (tdm_embed_rows(v->embed, v->embed_f32, V, H, ids, M, x->emb, st) ||
        tdm_add_rmsnorm_to(x->emb, NULL, 0, x->pre_e, H, M, eps, x->cat, H2, catb, st) ||
        tdm_add_rmsnorm_to(h, NULL, 0, x->pre_h, H, M, eps, x->cat + H, H2, catb ? catb + tdm_mm_xb_elems(H) : NULL, st) ||
        tdm_matmul_xb(&x->fc, x->cat, H2, catb, M, x->x, H, TDM_MM_BF16, t, st))
        return -1;
    /* the decoder layer: engine.c's attn_mixer and mlp on the MTP's weights, cache and residual, the
     * products reading the blocked copies of their inputs as the main layers' do (the engine's
     * buffers, borrowed between its passes; NULL where TANDEM_MM_XB is off) */
    uint16_t *xnb = tdm_engine_blocked(v->xn_b, M), *attb = tdm_engine_blocked(v->att_b, M);
    if (tdm_add_rmsnorm(x->x, NULL, 0, x->in_norm, H, M, eps, x->xn, xnb, st) ||
        tdm_matmul_xb(&x->q, x->xn, H, xnb, M, v->qg, ldqg, TDM_MM_BF16, t, st) ||
        tdm_matmul_xb(&x->k, x->xn, H, xnb, M, v->kk, ldkv, TDM_MM_BF16, t, st) ||
        tdm_matmul_xb(&x->v, x->xn, H, xnb, M, v->vv, ldkv, TDM_MM_BF16, t, st) ||
        tdm_qk_norm_rope(v->qg, ldqg, v->kk, v->vv, ldkv, x->q_norm, x->k_norm, M, Hq, Hkv, D, c->rotary_dim, c->rope_theta,
                         eps, pos, dpos, v->ctx, v->q, x->kc, x->vc, st) ||
        tdm_attn_decode(v->q, v->qg, ldqg, x->kc, x->vc, M, Hq, Hkv, D, pos, dpos, v->ctx, v->attn_scratch, v->att, attb, st) ||
        tdm_matmul_xb(&x->o, v->att, (int64_t)Hq * D, attb, M, v->y, H, TDM_MM_BF16, t, st) ||
        tdm_add_rmsnorm(x->x, v->y, H, x->post_norm, H, M, eps, x->xn, xnb, st))
        return -1;
    if (x->is_moe ? tdm_emoe_forward(v->moe, c->n_layers, x->xn, xnb, M, v->y, t, st, NULL)
                  : tdm_engine_dense_mlp(v->fuse_mlp, &x->gate, &x->up, &x->down, x->xn, xnb, H, M, v->g, v->u,
                                         tdm_engine_blocked(v->g_b, M), I, v->y, t, st))
        return -1;
    /* oh and its blocked copy, which the head reads for row 0 (mtp_head) */
    if (tdm_add_rmsnorm(x->x, v->y, H, x->norm, H, M, eps, x->oh, xnb, st) != 0) return -1;
    x->pos += M;
    return 0;
}

/* The head on oh row r: FP32 logits into v->logits row j, the argmax into x->draft[j]. Row 0 reads
 * the blocked copy mtp_rows wrote beside oh (a one-row product reads the copy's row 0 wherever the
 * copy holds more rows; the other rows are not where a one-row product looks). */
static int mtp_head(struct tdm_emtp *x, const struct tdm_engine_view *v, int r, int j)
{
    const int H = v->m->cfg.hidden, V = v->m->cfg.vocab;
    float *lg = v->logits + (size_t)j * V;
    const uint16_t *xb = r == 0 ? tdm_engine_blocked(v->xn_b, 1) : NULL;
    if (tdm_matmul_xb(x->draft_head, x->oh + (size_t)r * H, H, xb, 1, lg, V, TDM_MM_F32, v->tiles, v->stream) ||
        tdm_argmax_rows(lg, V, 1, V, x->amax, x->draft + j, v->stream))
        return -1;
    return 0;
}

/* A tree node's device work (engine.h: tdm_engine_mtp_node) from its id in x->ids[0] and its slot
 * terms in x->d_node: its parent's slot to row 0 of x->sl, one row on it (a chained draft step's
 * launches), the head into v->logits row 0 and x->draft[0], and its oh to its slot by way of row
 * SLOTS + 1 (tdm_rows_compact with its rows from device memory, so the graph serves every node). */
static int node_body(struct tdm_emtp *x, const struct tdm_engine_view *v, int graphed)
{
    const int H = v->m->cfg.hidden;
    void *st = v->stream;
    return tdm_rows_compact(x->sl, H, H, 0, NULL, x->d_node, 1, st) ||
                   mtp_rows(x, v, x->ids, x->sl, 1, graphed ? x->d_posv : NULL) || mtp_head(x, v, 0, 0) ||
                   tdm_copy_async(x->sl + (size_t)(SLOTS + 1) * H, x->oh, (size_t)H * 2, st) ||
                   tdm_rows_compact(x->sl, H, H, 0, x->d_node + 1, x->d_node + 2, 1, st)
               ? -1
               : 0;
}

/* The device work of a call (engine.h: tdm_engine_mtp) from ids already in x->ids: the T real rows
 * (final-norm rows r0.., or with r0 = -1 the rows gathered into x->hg), their last oh kept in slot 0,
 * then k chained drafts into x->draft and v->logits rows 0..k-1; T = 0: a tree node (node_body).
 * graphed: positions from d_posv. */
static int mtp_body(struct tdm_emtp *x, const struct tdm_engine_view *v, int r0, int T, int k, int graphed)
{
    if (T == 0) return node_body(x, v, graphed);
    const int H = v->m->cfg.hidden;
    uint16_t *h = r0 >= 0 ? v->final_xn + (size_t)r0 * H : x->hg;
    if (mtp_rows(x, v, x->ids, h, T, graphed ? x->d_posv : NULL) != 0 ||
        tdm_copy_async(x->sl + (size_t)H, x->oh + (size_t)(T - 1) * H, (size_t)H * 2, v->stream) != 0)
        return -1;
    if (k == 0) return 0;
    if (mtp_head(x, v, T - 1, 0) != 0) return -1;
    for (int j = 1; j < k; j++) {
        /* (the previous draft, the previous output after mtp.norm): oh row T-1 for the first step, then row 0 */
        uint16_t *prev = x->oh + (size_t)(j == 1 ? T - 1 : 0) * H;
        if (mtp_rows(x, v, x->draft + j - 1, prev, 1, graphed ? x->d_posv + j : NULL) != 0 || mtp_head(x, v, 0, j) != 0)
            return -1;
    }
    return 0;
}

/* The graph of a call shape: found, or a new entry (NULL when MTP_GRAPHS shapes have one). */
static struct mtp_graph *shape_graph(struct tdm_emtp *x, int T, int k, int r0)
{
    for (int i = 0; i < x->ngraphs; i++)
        if (x->graphs[i].T == T && x->graphs[i].k == k && x->graphs[i].r0 == r0) return &x->graphs[i];
    if (x->ngraphs == MTP_GRAPHS) return NULL;
    x->graphs[x->ngraphs] = (struct mtp_graph){.T = T, .k = k, .r0 = r0};
    return &x->graphs[x->ngraphs++];
}

/* A call's device work, from its shape's graph when graphs are on: captured on the shape's second
 * use, after an eager run has done every kernel's one-time set-up (engine.c's run_pass). x->pos is
 * the call's position on entry and advances by its rows, as mtp_rows advances it eagerly. */
static int mtp_run(struct tdm_emtp *x, const struct tdm_engine_view *v, int r0, int T, int k)
{
    struct mtp_graph *sg = v->use_graph ? shape_graph(x, T, k, r0) : NULL;
    if (!sg) return mtp_body(x, v, r0, T, k, 0);
    void *st = v->stream;
    const int pos = x->pos, rows = T + (k > 0 ? k - 1 : 0) + (T == 0);
    x->posv[0] = pos;
    for (int j = 1; j < k; j++) x->posv[j] = pos + T + j - 1;
    if (!sg->g && sg->eager_runs >= 1) {
        if (tdm_graph_begin(st) != 0) return -1;
        int rc = mtp_body(x, v, r0, T, k, 1);
        tdm_graph cap = NULL;
        if (tdm_graph_end(st, &cap) != 0 || rc != 0) {
            if (cap) tdm_graph_destroy(cap);
            if (T == 0) return tdm_err_prefix("capturing the CUDA graph of an MTP tree node");
            return tdm_err_prefix("capturing the CUDA graph of an MTP call of %d rows and %d drafts", T, k);
        }
        sg->g = cap;
    }
    if (sg->g) {
        x->pos = pos + rows;
        return tdm_copy_async(x->d_posv, x->posv, sizeof x->posv, st) != 0 || tdm_graph_launch(sg->g, st) != 0 ? -1 : 0;
    }
    sg->eager_runs++;
    return mtp_body(x, v, r0, T, k, 0);
}

/* A call's inputs to the device, its device work and its outputs to the host: T >= 1 real rows
 * (final-norm rows r0..r0+T-1, or rows[0..T-1] gathered into x->hg when rows is not NULL), or
 * T = 0 a tree node (its id in ids[0], its slot terms in x->node); k drafts (drafts, logits: NULL
 * or where they go). */
static int mtp_launches(struct tdm_emtp *x, const struct tdm_engine_view *v, int r0, const int *rows,
                        const int32_t *ids, int T, int k, int32_t *drafts, float *logits)
{
    const int V = v->m->cfg.vocab, H = v->m->cfg.hidden;
    void *st = v->stream;
    if (tdm_copy_async(x->ids, ids, (size_t)(T ? T : 1) * sizeof(int32_t), st) != 0) return -1;
    if (rows) { /* rows rows[0]..rows[T-1] to x->hg, then each to its place (rows increasing: in place) */
        int32_t rel[ROWS];
        for (int t = 0; t < T; t++) rel[t] = rows[t] - rows[0];
        if (tdm_copy_async(x->hg, v->final_xn + (size_t)rows[0] * H, (size_t)(rel[T - 1] + 1) * H * 2, st) != 0 ||
            tdm_copy_async(x->d_rows, rel, (size_t)T * sizeof(int32_t), st) != 0 ||
            tdm_rows_compact(x->hg, H, H, 0, NULL, x->d_rows, T, st) != 0)
            return -1;
    }
    if (T == 0 && tdm_copy_async(x->d_node, x->node, sizeof x->node, st) != 0) return -1;
    if (mtp_run(x, v, rows ? -1 : r0, T, k) != 0) return -1;
    if (k > 0 && ((drafts && tdm_copy_async(drafts, x->draft, (size_t)k * sizeof(int32_t), st) != 0) ||
                  (logits && tdm_copy_async(logits, v->logits, (size_t)k * V * sizeof(float), st) != 0)))
        return -1;
    return tdm_stream_sync(st);
}

/* tdm_engine_mtp_at (rows NULL: final-norm rows r0..r0+T-1) and tdm_engine_mtp_path (rows). */
static int mtp_call(struct tdm_engine *e, int pos, int r0, const int *rows, const int32_t *next_ids, int T, int k,
                    int32_t *drafts, float *logits)
{
    struct tdm_emtp *x = *tdm_engine_mtp_state(e);
    if (!x) return tdm_errf("tdm_engine_mtp: the MTP layer is not on the device (tdm_engine_mtp_init)");
    struct tdm_engine_view v;
    tdm_engine_view(e, &v);
    const struct tdm_config *c = &v.m->cfg;
    if (pos < 0 || pos > x->pos) return tdm_errf("tdm_engine_mtp: position %d: the drafter has fed %d rows", pos, x->pos);
    if (T < 1 || T > ROWS) return tdm_errf("tdm_engine_mtp: %d real rows: 1 to %d a call", T, ROWS);
    if (rows) {
        int inc = rows[0] >= 0, run = 1; /* increasing; consecutive (no gather needed) */
        for (int t = 1; t < T; t++) {
            inc &= rows[t] > rows[t - 1];
            run &= rows[t] == rows[0] + t;
        }
        if (!inc || rows[T - 1] - rows[0] >= ROWS)
            return tdm_errf("tdm_engine_mtp_path: real rows %d..%d: not increasing from row 0 or more, within %d rows",
                            rows[0], rows[T - 1], ROWS);
        r0 = rows[0];
        if (run) rows = NULL;
    }
    const int last = rows ? rows[T - 1] : r0 + T - 1;
    if (r0 < 0 || last >= v.final_rows)
        return tdm_errf("tdm_engine_mtp: real rows %d..%d: the last forward chunk, verify or prefill chunk left %d "
                        "final-norm rows", r0, last, v.final_rows);
    if (k < 0 || k > ROWS - 1) return tdm_errf("tdm_engine_mtp: %d drafts: 0 to %d", k, ROWS - 1);
    if (k > 0 && !drafts) return tdm_errf("tdm_engine_mtp: %d drafts and nowhere to put them", k);
    const int n = T + (k > 0 ? k - 1 : 0);
    if (pos + n > v.ctx) return tdm_errf("context full: MTP %d + %d rows exceed --ctx %d", pos, n, v.ctx);
    for (int t = 0; t < T; t++)
        if (next_ids[t] < 0 || next_ids[t] >= c->vocab)
            return tdm_errf("token id %d is out of the vocabulary (%d ids)", next_ids[t], c->vocab);
    x->pos = pos;
    if (mtp_launches(x, &v, r0, rows, next_ids, T, k, drafts, logits) != 0)
        return tdm_err_prefix("CUDA engine: MTP drafter at position %d", pos);
    x->slots_set |= 1;
    return 0;
}

int tdm_engine_mtp(struct tdm_engine *e, int pos, const int32_t *next_ids, int T, int k, int32_t *drafts, float *logits)
{
    return mtp_call(e, pos, 0, NULL, next_ids, T, k, drafts, logits);
}

int tdm_engine_mtp_at(struct tdm_engine *e, int pos, int r0, const int32_t *next_ids, int T, int k, int32_t *drafts,
                      float *logits)
{
    return mtp_call(e, pos, r0, NULL, next_ids, T, k, drafts, logits);
}

int tdm_engine_mtp_path(struct tdm_engine *e, int pos, const int *rows, const int32_t *next_ids, int T, int k,
                        int32_t *drafts, float *logits)
{
    if (!rows) return tdm_errf("tdm_engine_mtp_path: no rows");
    return mtp_call(e, pos, 0, rows, next_ids, T, k, drafts, logits);
}

int tdm_engine_mtp_node(struct tdm_engine *e, int pos, int32_t id, int parent, int slot, int32_t *draft, float *logits)
{
    struct tdm_emtp *x = *tdm_engine_mtp_state(e);
    if (!x) return tdm_errf("tdm_engine_mtp_node: the MTP layer is not on the device (tdm_engine_mtp_init)");
    struct tdm_engine_view v;
    tdm_engine_view(e, &v);
    if (pos < 0 || pos > x->pos)
        return tdm_errf("tdm_engine_mtp_node: position %d: the drafter has fed %d rows", pos, x->pos);
    if (pos + 1 > v.ctx) return tdm_errf("context full: MTP %d + 1 rows exceed --ctx %d", pos, v.ctx);
    if (parent < 0 || parent >= SLOTS || slot < 0 || slot >= SLOTS)
        return tdm_errf("tdm_engine_mtp_node: slots %d -> %d: 0 to %d", parent, slot, SLOTS - 1);
    if (!(x->slots_set >> parent & 1)) return tdm_errf("tdm_engine_mtp_node: slot %d holds no MTP output", parent);
    if (id < 0 || id >= v.m->cfg.vocab) return tdm_errf("token id %d is out of the vocabulary (%d ids)", id, v.m->cfg.vocab);
    x->node[0] = 1 + parent;
    x->node[1] = 1 + slot;
    x->node[2] = SLOTS - slot;
    x->pos = pos;
    if (mtp_launches(x, &v, -1, NULL, &id, 0, 1, draft, logits) != 0)
        return tdm_err_prefix("CUDA engine: MTP tree node at position %d", pos);
    x->slots_set |= (uint64_t)1 << slot;
    return 0;
}
