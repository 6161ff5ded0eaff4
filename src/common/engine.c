/* engine.c — the CUDA engine's host orchestration (engine.h): upload, state, and the forward of
 * ref.c's tdm_ref_forward as a sequence of launches on one stream (and a second, below). Per
 * chunk of M <= 32 rows:
 *   h = embed[ids]
 *   per layer: xn = rmsnorm(h (+= previous y), in_norm); y = mixer(xn);
 *              xn = rmsnorm(h += y, post_norm); y = mlp(xn)
 *   xn = rmsnorm(h += y, final_norm); logits = xn head^T (FP32); greedy ids = argmax(logits)
 * with the layer kernels' own rounding points (they are ref.c's). qwen3_next's grouped GDN
 * projections go through tdm_gdn_ungroup; qwen3_5's in_proj_b and in_proj_a run as one product of
 * [2Hv, H] where they concatenate exactly (upload_layer, gates_of); a MoE layer's MLP is
 * engine_moe.c's. The passes of a
 * speculative round (a chain or tree verify that leaves the GDN states as they were, a commit of
 * the accepted rows or root-to-node path — deferred by default: applied inside the next pass's
 * GDN kernels) are the hooks of engine_impl.h; engine_spec.c drives them. The MTP drafter
 * (engine_mtp.c) borrows the activations between passes and reads the final-norm rows left in
 * xn. Where TANDEM_CONCURRENT is on, a pass of at most ROWS rows runs a layer's sibling
 * projections of one input on a second stream (side_fork, side_join). */
#include "engine.h"
#include "device.h"
#include "engine_glue.h"
#include "engine_impl.h"
#include "engine_moe.h"
#include "err.h"
#include "layers.h"
#include "matmul.h"
#include "mm_layout.h"
#include "settings.h"
#include "tiles.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ROWS TDM_ENGINE_MAX_ROWS
_Static_assert(ROWS <= TDM_TREE_MAX, "a tree verify of ROWS nodes must fit the tree kernels");
_Static_assert(ROWS <= TDM_GDN_PEND_MAX, "a commit of ROWS rows must fit the pending forms (deferred commit)");

struct dlayer {
    enum tdm_mixer mixer;
    float *in_norm, *post_norm;             /* [H] */
    /* Gated DeltaNet */
    int grouped;                            /* qwen3_next: qkvz, ba grouped per key head */
    int one_ba;                             /* qwen3_5: in_proj_b and in_proj_a as one product (ba) */
    struct tdm_dweight qkvz, ba;            /* grouped: [2HkDk + 2HvDv, H], [2Hv, H]; one_ba: ba = [b; a] [2Hv, H] */
    struct tdm_dweight qkv, z, b, a, out;   /* [C, H], [HvDv, H], [Hv, H] x2 (not one_ba), [H, HvDv] */
    float *conv_w, *A_log, *dt_bias, *gnorm; /* [C][K], [Hv], [Hv], [Dv] */
    uint16_t *conv_state;                   /* [K-1][C] BF16 */
    float *S;                               /* [Hv][Dk][Dv] */
    uint16_t *round_x, *round_g;            /* the last verify's in_proj_qkv rows [R][C], b and a rows [R][2Hv] (gates_of) */
    /* gated attention */
    struct tdm_dweight q, k, v, o;          /* [2HqD, H], [HkvD, H] x2, [H, HqD] */
    float *q_norm, *k_norm;                 /* [D] */
    uint16_t *kc, *vc;                      /* [ctx][Hkv][D] BF16 */
    /* dense MLP, or a mixture of experts (engine_moe.c) */
    int is_moe;
    struct tdm_dweight gate, up, down;      /* [I, H] x2, [H, I] */
};

struct tdm_engine {
    const struct tdm_model *m;
    int ctx, pos;
    tdm_stream st;
    struct tdm_tiles *tiles;
    struct dlayer *ly;                      /* [L] */
    int prow;                               /* rows of the activations: the prefill chunk (>= ROWS) */
    int fuse_ba, n_one_ba;                  /* TANDEM_GDN_FUSE_BA; the layers whose b and a are one product */
    enum tdm_mlp_fuse fuse_mlp;             /* TANDEM_MLP_FUSE: gate, up and SiLU x up as one product where it can */
    int mm_xb;                              /* TANDEM_MM_XB: the products' inputs also as blocked copies (xb) */
    int concurrent;                         /* TANDEM_CONCURRENT: sibling projections on e->side (side_ok) */
    tdm_stream side;                        /* the second stream (NULL when off) */
    tdm_event fork_ev, join_ev;             /* side_fork's and side_join's events */
    int attn_prefill;                       /* chunks past ROWS rows: tdm_attn_prefill (TANDEM_ATTN_PREFILL) */
    int moe_grouped;                        /* MoE layouts prefill e->prow rows, the experts grouped (TANDEM_MOE_GROUPED) */
    struct tdm_dweight head;                /* [V, H] */
    const void *embed;                      /* [V][H] BF16 or F32 on the device */
    int embed_f32;
    float *final_norm;                      /* [H] */
    /* activations, ROWS rows each */
    int32_t *ids;
    uint16_t *h, *xn, *y;                   /* [R][H] */
    uint16_t *mixed, *cv, *z, *o, *gn;      /* GDN: [R][C] x2, [R][HvDv] x3 */
    uint16_t *gates;                        /* GDN b and a rows [R][2Hv] (gates_of) */
    uint16_t *qkvz, *ba;                    /* grouped GDN projections: [R][2HkDk + 2HvDv], [R][2Hv] */
    uint16_t *qg, *kk, *vv, *q, *att;       /* attention: [R][2HqD], [R][HkvD] x2, [R][HqD] x2 */
    float *attn_scratch;
    float *gdn_scratch;                     /* the chunked delta rule's (TANDEM_GDN_PREFILL; NULL: off) */
    int gn_fused;                           /* TANDEM_GDN_FUSED_NORM: the recurrence runs the gated norm */
    uint16_t *g, *u;                        /* MLP: [R][I] x2 */
    /* the blocked copies (kernels/mm_layout.h: xb) of xn, gn, att and g at 1..TDM_MM_XB_ROWS rows,
     * written by the kernels that write those and read by the NVFP4 products (tdm_matmul_xb);
     * NULL when TANDEM_MM_XB is off or K has no full slab */
    uint16_t *xn_b, *gn_b, *att_b, *g_b;
    struct tdm_emoe *moe;                   /* the MoE layers' weights and activations */
    float *logits;                          /* [R][V] */
    int32_t *gid;                           /* [ROWS]: the greedy ids of the head's rows (tdm_argmax_rows) */
    void *amax;                             /* tdm_argmax_rows scratch for ROWS rows */
    /* the one-token decode step as a CUDA graph: captured on the second step, replayed after;
     * the position is read from d_pos (host pos0 ctx - M sizes the grids), ids from e->ids */
    int32_t *d_pos;
    tdm_graph step;
    int use_graph, eager_steps;
    /* speculative rounds: the rows of the last verify that a commit may still take (0: none) and
     * their parents (a chain's: r - 1); a graph per verify shape [rows][first logits row], chain
     * and tree, and per commit [rows], of the first rows and of a tree's path, captured the same
     * way. A tree's parents and a path are read from d_parent and d_path. */
    int round_rows, round_parent[ROWS];
    int32_t *d_parent, *d_path;
    tdm_graph verify_graph[ROWS + 1][ROWS + 1], commit_graph[ROWS + 1];
    int verify_eager[ROWS + 1][ROWS + 1], commit_eager[ROWS + 1];
    tdm_graph tree_graph[ROWS + 1][ROWS + 1], path_graph[ROWS + 1];
    int tree_eager[ROWS + 1][ROWS + 1], path_eager[ROWS + 1];
    struct tdm_engine_round_bytes round_bytes;
    /* the deferred GDN commit (TANDEM_GDN_DEFER; layers.h, Deferred commit): pend, the rows of the
     * last commit not yet run through the GDN states (0: none; rows 0..pend-1 of every GDN layer's
     * round_x and round_g), on the device in d_pend for the passes' kernels (copied before each
     * pass, as d_pos is, so one graph serves every count). The rows stay where their verify left
     * them: the next pass's first launch on a GDN layer (tdm_gdn_conv_pending) runs their conv
     * into pcv, advancing the conv state, and copies their gates to pg, before the pass's own
     * projections rewrite the round buffers (a verify's) — so a commit copies nothing, each layer needs no
     * second set of round buffers, and the graphs need no variant per buffer (double buffering
     * would have baked one buffer's address into each captured graph). pcv and pg are the
     * engine's, shared by the layers: a layer's recurrence consumes them before the next layer's
     * launch rewrites them, in stream order.
     * taking: a deferred commit with rows has happened since the engine was made (a reset keeps
     * it). Until then no pass takes pending rows up at all (take_pending): the count is 0 at every
     * pass, so tdm_gdn_conv_pending would do nothing and the pending forms would apply nothing, and
     * plain decode launches what it launches with TANDEM_GDN_DEFER=off. The first such commit
     * drops every graph captured before it (start_taking). pend_passes: the passes that took
     * pending rows up (tdm_engine_gdn_pend_passes). */
    int defer, pend, taking;
    long pend_passes;
    int32_t *d_pend;
    uint16_t *pcv, *pg;                     /* [ROWS][C], [ROWS][2Hv] */
    int fin_rows;                           /* rows of the last forward chunk or verify in xn (the MTP's h) */
    struct tdm_emtp *mtp;                   /* the MTP drafter (engine_mtp.c), once uploaded */
    struct tdm_engine_mem mem;
    void **allocs;
    int nalloc, capalloc;
};

/* ---- what the engine serves ---- */

struct proj_check { const char *bad; enum tdm_wfmt fmt; };
static void check_proj(void *ctx, const char *what, const struct tdm_qweight *w)
{
    struct proj_check *pc = ctx;
    if (!pc->bad && w->fmt != TDM_W_BF16 && w->fmt != TDM_W_FP8 && w->fmt != TDM_W_NVFP4) {
        pc->bad = what;
        pc->fmt = w->fmt;
    }
}

int tdm_engine_supported(const struct tdm_model *m)
{
    const struct tdm_config *c = &m->cfg;
    const char *dir = m->dir ? m->dir : "model";
    if (tdm_emoe_supported(m) != 0) return -1;
    const int D = c->head_dim, Dk = c->gdn_k_dim, Dv = c->gdn_v_dim;
    if (D != 64 && D != 128 && D != 256) return tdm_errf("%s: head_dim %d: the CUDA attention kernel takes 64, 128 or 256", dir, D);
    if (c->rotary_dim % 2 || c->rotary_dim > D) return tdm_errf("%s: rotary dims %d: must be even and <= head_dim %d", dir, c->rotary_dim, D);
    if (c->n_kv_heads <= 0 || c->n_q_heads % c->n_kv_heads)
        return tdm_errf("%s: %d query heads are not a multiple of %d KV heads", dir, c->n_q_heads, c->n_kv_heads);
    if (Dk != 64 && Dk != 128 && Dk != 256)
        return tdm_errf("%s: linear_key_head_dim %d: the CUDA GDN recurrence takes 64, 128 or 256", dir, Dk);
    if (Dv % 32 || Dv > 1024) return tdm_errf("%s: linear_value_head_dim %d: the CUDA GDN kernels take a multiple of 32 up to 1024", dir, Dv);
    if (c->gdn_k_heads <= 0 || c->gdn_v_heads % c->gdn_k_heads)
        return tdm_errf("%s: %d value heads are not a multiple of %d key heads", dir, c->gdn_v_heads, c->gdn_k_heads);
    if (c->conv_kernel < 2 || c->conv_kernel > 4) return tdm_errf("%s: conv kernel %d: the CUDA conv takes 2 to 4", dir, c->conv_kernel);
    if (c->hidden > 11264) return tdm_errf("%s: hidden_size %d: the CUDA RMSNorm takes at most 11264", dir, c->hidden);
    if (m->embed.fmt != TDM_W_BF16 && m->embed.fmt != TDM_W_F32)
        return tdm_errf("%s: embed_tokens stored %s: the CUDA engine gathers BF16 or F32 rows", dir, tdm_wfmt_name(m->embed.fmt));
    struct proj_check pc = {NULL, TDM_W_BF16};
    tdm_model_each_projection(m, check_proj, &pc);
    if (pc.bad)
        return tdm_errf("%s: %s stored %s: the CUDA matrix kernels take BF16, FP8 and NVFP4 weights", dir, pc.bad,
                        tdm_wfmt_name(pc.fmt));
    return 0;
}

/* ---- allocation ---- */

static int track(struct tdm_engine *e, void *p)
{
    if (e->nalloc == e->capalloc) {
        int cap = e->capalloc ? 2 * e->capalloc : 64;
        void **a = realloc(e->allocs, (size_t)cap * sizeof *a);
        if (!a) { tdm_cuda_free(p); return tdm_errf("CUDA engine: out of host memory"); }
        e->allocs = a;
        e->capalloc = cap;
    }
    e->allocs[e->nalloc++] = p;
    return 0;
}

static void *dalloc(struct tdm_engine *e, size_t bytes, size_t *count, const char *what)
{
    void *p;
    if (tdm_cuda_malloc(&p, bytes) != 0) {
        tdm_err_prefix("CUDA engine: %s (%.1f MB)", what, bytes / 1e6);
        return NULL;
    }
    if (track(e, p) != 0) return NULL;
    *count += bytes;
    return p;
}

static float *up_f32(struct tdm_engine *e, const float *src, size_t n, const char *what, int layer)
{
    char buf[96];
    snprintf(buf, sizeof buf, "layer %d %s", layer, what);
    float *p = dalloc(e, n * sizeof(float), &e->mem.weights, buf);
    if (p && tdm_cuda_h2d(p, src, n * sizeof(float)) != 0) return NULL;
    return p;
}

static int up_w(struct tdm_engine *e, const struct tdm_qweight *h, struct tdm_dweight *d, const char *what, int layer)
{
    if (tdm_dweight_upload(h, d) != 0)
        return layer >= 0 ? tdm_err_prefix("CUDA engine: layer %d %s", layer, what) : tdm_err_prefix("CUDA engine: %s", what);
    if (track(e, d->owned) != 0) return -1;
    d->owned = NULL; /* freed through the list */
    e->mem.weights += (size_t)tdm_qweight_bytes(h);
    return 0;
}

/* up_w for one weight of a's rows then b's (tdm_dweight_upload_cat: where that is exact). */
static int up_w_cat(struct tdm_engine *e, const struct tdm_qweight *a, const struct tdm_qweight *b, struct tdm_dweight *d,
                    const char *what, int layer)
{
    if (tdm_dweight_upload_cat(a, b, d) != 0) return tdm_err_prefix("CUDA engine: layer %d %s", layer, what);
    if (track(e, d->owned) != 0) return -1;
    d->owned = NULL;
    e->mem.weights += (size_t)(tdm_qweight_bytes(a) + tdm_qweight_bytes(b));
    return 0;
}

void tdm_engine_free(struct tdm_engine *e)
{
    if (!e) return;
    if (e->st) tdm_stream_sync(e->st);
    if (e->side) tdm_stream_sync(e->side);
    if (e->step) tdm_graph_destroy(e->step);
    tdm_emtp_free(e->mtp);
    tdm_emoe_free(e->moe);
    for (int m = 0; m <= ROWS; m++) {
        if (e->commit_graph[m]) tdm_graph_destroy(e->commit_graph[m]);
        if (e->path_graph[m]) tdm_graph_destroy(e->path_graph[m]);
        for (int f = 0; f <= ROWS; f++) {
            if (e->verify_graph[m][f]) tdm_graph_destroy(e->verify_graph[m][f]);
            if (e->tree_graph[m][f]) tdm_graph_destroy(e->tree_graph[m][f]);
        }
    }
    for (int i = 0; i < e->nalloc; i++) tdm_cuda_free(e->allocs[i]);
    free(e->allocs);
    free(e->ly);
    tdm_tiles_free(e->tiles);
    tdm_event_destroy(e->fork_ev);
    tdm_event_destroy(e->join_ev);
    if (e->side) tdm_stream_destroy(e->side);
    if (e->st) tdm_stream_destroy(e->st);
    free(e);
}

/* ---- set-up ---- */

static int upload_layer(struct tdm_engine *e, int i)
{
    const struct tdm_config *c = &e->m->cfg;
    const struct tdm_layer *l = &e->m->layers[i];
    struct dlayer *d = &e->ly[i];
    const int H = c->hidden;
    d->mixer = l->mixer;
    if (!(d->in_norm = up_f32(e, l->in_norm, (size_t)H, "input_layernorm", i)) ||
        !(d->post_norm = up_f32(e, l->post_norm, (size_t)H, "post_attention_layernorm", i)))
        return -1;
    if (l->mixer == TDM_MIXER_GDN) {
        const struct tdm_gdn *g = &l->gdn;
        const int C = tdm_gdn_conv_dim(c), K = c->conv_kernel, Hv = c->gdn_v_heads;
        d->grouped = g->grouped;
        /* qwen3_5's in_proj_b and in_proj_a: one [2Hv, H] weight, b's rows then a's, so one product
         * writes both (gates_of), where the rows concatenate exactly (tdm_qweight_cat_exact). They do
         * for BF16, as real FP8 and NVFP4 checkpoints store them, and for NVFP4 with one scale_2;
         * not for FP8-stored ones with Hv not a multiple of 128 (48 in the 27B: a 128-row scale
         * block would straddle b and a) nor NVFP4 with two scale_2: those keep two products, written
         * side by side into the same [R][2Hv] rows. */
        d->one_ba = !g->grouped && e->fuse_ba && tdm_qweight_cat_exact(&g->b, &g->a);
        if (g->grouped ? up_w(e, &g->qkvz, &d->qkvz, "in_proj_qkvz", i) || up_w(e, &g->ba, &d->ba, "in_proj_ba", i)
                       : up_w(e, &g->qkv, &d->qkv, "in_proj_qkv", i) || up_w(e, &g->z, &d->z, "in_proj_z", i) ||
                             (d->one_ba ? up_w_cat(e, &g->b, &g->a, &d->ba, "in_proj_b + in_proj_a", i)
                                        : up_w(e, &g->b, &d->b, "in_proj_b", i) || up_w(e, &g->a, &d->a, "in_proj_a", i)))
            return -1;
        e->n_one_ba += d->one_ba;
        if (up_w(e, &g->out, &d->out, "out_proj", i)) return -1;
        if (!(d->conv_w = up_f32(e, g->conv_w, (size_t)C * K, "conv1d", i)) ||
            !(d->A_log = up_f32(e, g->A_log, (size_t)Hv, "A_log", i)) ||
            !(d->dt_bias = up_f32(e, g->dt_bias, (size_t)Hv, "dt_bias", i)) ||
            !(d->gnorm = up_f32(e, g->norm_w, (size_t)c->gdn_v_dim, "linear_attn.norm", i)))
            return -1;
        if (!(d->conv_state = dalloc(e, (size_t)(K - 1) * C * 2, &e->mem.gdn, "conv state")) ||
            !(d->S = dalloc(e, (size_t)Hv * c->gdn_k_dim * c->gdn_v_dim * sizeof(float), &e->mem.gdn, "GDN state")))
            return -1;
        e->mem.gdn_state += (size_t)Hv * c->gdn_k_dim * c->gdn_v_dim * sizeof(float);
        if (!(d->round_x = dalloc(e, (size_t)ROWS * C * 2, &e->mem.act, "verify round inputs")) ||
            !(d->round_g = dalloc(e, (size_t)ROWS * 2 * Hv * 2, &e->mem.act, "verify round inputs")))
            return -1;
    } else {
        const struct tdm_attn *a = &l->attn;
        if (up_w(e, &a->q, &d->q, "q_proj", i) || up_w(e, &a->k, &d->k, "k_proj", i) ||
            up_w(e, &a->v, &d->v, "v_proj", i) || up_w(e, &a->o, &d->o, "o_proj", i))
            return -1;
        if (!(d->q_norm = up_f32(e, a->q_norm, (size_t)c->head_dim, "q_norm", i)) ||
            !(d->k_norm = up_f32(e, a->k_norm, (size_t)c->head_dim, "k_norm", i)))
            return -1;
        const size_t kv = (size_t)e->ctx * c->n_kv_heads * c->head_dim * 2;
        if (!(d->kc = dalloc(e, kv, &e->mem.kv, "K cache")) || !(d->vc = dalloc(e, kv, &e->mem.kv, "V cache"))) return -1;
    }
    d->is_moe = l->is_moe;
    if (!l->is_moe && (up_w(e, &l->mlp.gate, &d->gate, "mlp.gate_proj", i) || up_w(e, &l->mlp.up, &d->up, "mlp.up_proj", i) ||
                       up_w(e, &l->mlp.down, &d->down, "mlp.down_proj", i)))
        return -1;
    return 0;
}

static int alloc_act(struct tdm_engine *e)
{
    const struct tdm_config *c = &e->m->cfg;
    const size_t R = (size_t)e->prow, H = (size_t)c->hidden, C = (size_t)tdm_gdn_conv_dim(c);
    const size_t HvDv = (size_t)c->gdn_v_heads * c->gdn_v_dim, Hv = (size_t)c->gdn_v_heads;
    const size_t HqD = (size_t)c->n_q_heads * c->head_dim, HkvD = (size_t)c->n_kv_heads * c->head_dim;
    const size_t V = (size_t)c->vocab;
    size_t I = 0; /* the dense MLP's width, where a layer has one */
    int grouped = 0;
    for (int i = 0; i < c->n_layers; i++) {
        if (!e->ly[i].is_moe) I = (size_t)c->intermediate;
        grouped |= e->ly[i].grouped;
    }
    size_t *n = &e->mem.act;
#define A(field, bytes, what) if (!(e->field = dalloc(e, (bytes), n, what))) return -1
    A(ids, R * sizeof(int32_t), "token ids");
    A(h, R * H * 2, "activations");
    A(xn, R * H * 2, "activations");
    A(y, R * H * 2, "activations");
    A(mixed, R * C * 2, "GDN activations");
    A(cv, R * C * 2, "GDN activations");
    A(z, R * HvDv * 2, "GDN activations");
    A(gates, R * 2 * Hv * 2, "GDN activations");
    A(o, R * HvDv * 2, "GDN activations");
    A(gn, R * HvDv * 2, "GDN activations");
    if (grouped) {
        A(qkvz, R * (2 * (size_t)c->gdn_k_heads * c->gdn_k_dim + 2 * HvDv) * 2, "GDN activations");
        A(ba, R * 2 * Hv * 2, "GDN activations");
    }
    A(qg, R * 2 * HqD * 2, "attention activations");
    A(kk, R * HkvD * 2, "attention activations");
    A(vv, R * HkvD * 2, "attention activations");
    A(q, R * HqD * 2, "attention activations");
    A(att, R * HqD * 2, "attention activations");
    if (e->mm_xb) {   /* the blocked copies: only where K has a full slab */
        if (tdm_mm_xb_elems(H)) A(xn_b, (size_t)tdm_mm_xb_elems(H) * 2, "activations (blocked copies)");
        if (tdm_mm_xb_elems(HvDv)) A(gn_b, (size_t)tdm_mm_xb_elems(HvDv) * 2, "activations (blocked copies)");
        if (tdm_mm_xb_elems(HqD)) A(att_b, (size_t)tdm_mm_xb_elems(HqD) * 2, "activations (blocked copies)");
        if (I && tdm_mm_xb_elems(I)) A(g_b, (size_t)tdm_mm_xb_elems(I) * 2, "activations (blocked copies)");
    }
    A(attn_scratch, tdm_attn_scratch_bytes(ROWS, c->n_q_heads, c->head_dim, e->ctx), "attention scratch");
    int n_gdn = 0;
    for (int i = 0; i < c->n_layers; i++) n_gdn += c->mixer[i] == TDM_MIXER_GDN;
    if (n_gdn && e->prow > ROWS && strcmp(tdm_setting("TANDEM_GDN_PREFILL"), "off") != 0)
        A(gdn_scratch, tdm_gdn_recur_chunked_scratch_bytes(e->prow, c->gdn_v_heads), "GDN prefill scratch");
    e->gn_fused = n_gdn && c->gdn_v_dim <= TDM_GDN_FUSED_NORM_DV_MAX &&
                  strcmp(tdm_setting("TANDEM_GDN_FUSED_NORM"), "off") != 0;
    if (I) {
        A(g, R * I * 2, "MLP activations");
        A(u, R * I * 2, "MLP activations");
    }
    A(logits, (size_t)ROWS * V * sizeof(float), "logits");   /* the head runs ROWS rows at a time */
    A(gid, ROWS * sizeof(int32_t), "greedy ids");
    A(amax, tdm_argmax_scratch_bytes(ROWS, (int64_t)V), "argmax scratch");
    A(d_pos, sizeof(int32_t), "position");
    A(d_parent, R * sizeof(int32_t), "verify tree");
    A(d_path, R * sizeof(int32_t), "verify tree");
    if (e->defer) {
        A(d_pend, sizeof(int32_t), "pending rows");
        A(pcv, (size_t)ROWS * C * 2, "pending rows");
        A(pg, (size_t)ROWS * 2 * Hv * 2, "pending rows");
    }
#undef A
    return 0;
}

int tdm_engine_reset(struct tdm_engine *e)
{
    const struct tdm_config *c = &e->m->cfg;
    if (tdm_stream_sync(e->st) != 0) return -1;
    for (int i = 0; i < c->n_layers; i++) {
        struct dlayer *d = &e->ly[i];
        if (d->mixer == TDM_MIXER_GDN) {
            const size_t C = (size_t)tdm_gdn_conv_dim(c);
            if (tdm_cuda_memset(d->conv_state, 0, (size_t)(c->conv_kernel - 1) * C * 2) != 0 ||
                tdm_cuda_memset(d->S, 0, (size_t)c->gdn_v_heads * c->gdn_k_dim * c->gdn_v_dim * sizeof(float)) != 0)
                return -1;
        } else {
            const size_t kv = (size_t)e->ctx * c->n_kv_heads * c->head_dim * 2;
            if (tdm_cuda_memset(d->kc, 0, kv) != 0 || tdm_cuda_memset(d->vc, 0, kv) != 0) return -1;
        }
    }
    /* the engine's stream does not wait for the legacy stream: fence the memsets */
    if (tdm_cuda_sync() != 0) return -1;
    e->pos = 0;
    e->round_rows = 0;
    e->pend = 0; /* the pending rows' states are gone; e->taking stays (struct tdm_engine: the graphs
                  * captured since the first deferred commit take pending rows up, and with none
                  * pending they apply nothing) */
    e->fin_rows = 0;
    if (e->mtp) tdm_emtp_reset(e->mtp);
    return 0;
}

struct tdm_engine *tdm_engine_new(const struct tdm_model *m, int ctx)
{
    const struct tdm_config *c = &m->cfg;
    if (ctx < 1) { tdm_errf("CUDA engine: context %d: must be at least 1", ctx); return NULL; }
    if (tdm_engine_supported(m) != 0) return NULL;
    if (tdm_cuda_device_count() < 1) { tdm_errf("CUDA engine: no CUDA device visible"); return NULL; }
    struct tdm_device_info info;
    size_t free0 = 0, total = 0;
    if (tdm_cuda_device_info(0, &info) != 0 || tdm_cuda_mem_info(&free0, &total) != 0) return NULL;
    struct tdm_engine *e = calloc(1, sizeof *e);
    if (!e || !(e->ly = calloc((size_t)c->n_layers, sizeof *e->ly))) {
        free(e);
        tdm_errf("CUDA engine: out of host memory");
        return NULL;
    }
    e->m = m;
    e->ctx = ctx;
    char arch[16];
    tdm_tiles_arch(info.sm_major, info.sm_minor, arch, sizeof arch);
    if (tdm_tiles_load(NULL, arch, &e->tiles) != 0 || tdm_stream_create(&e->st) != 0) goto fail;
    e->fuse_ba = strcmp(tdm_setting("TANDEM_GDN_FUSE_BA"), "off") != 0;
    const char *fm = tdm_setting("TANDEM_MLP_FUSE");
    e->fuse_mlp = strcmp(fm, "off") == 0 ? TDM_MLP_FUSE_OFF : strcmp(fm, "on") == 0 ? TDM_MLP_FUSE_ON : TDM_MLP_FUSE_AUTO;
    e->mm_xb = strcmp(tdm_setting("TANDEM_MM_XB"), "off") != 0;
    e->concurrent = strcmp(tdm_setting("TANDEM_CONCURRENT"), "off") != 0;
    if (e->concurrent && (tdm_stream_create(&e->side) != 0 || tdm_event_create_sync(&e->fork_ev) != 0 ||
                          tdm_event_create_sync(&e->join_ev) != 0))
        goto fail;
    e->defer = strcmp(tdm_setting("TANDEM_GDN_DEFER"), "off") != 0;
    for (int i = 0; i < c->n_layers; i++)
        if (upload_layer(e, i) != 0) goto fail;
    if (!(e->final_norm = up_f32(e, m->final_norm, (size_t)c->hidden, "norm", -1))) goto fail;
    if (up_w(e, &m->head, &e->head, "lm_head", -1) != 0) goto fail;
    e->embed_f32 = m->embed.fmt == TDM_W_F32;
    if (c->tie_embeddings && !e->embed_f32 && m->head.w == m->embed.w && m->head.row0 == 0) {
        e->embed = e->head.w; /* the head is the embedding, already uploaded (not when requantized) */
    } else {
        const size_t eb = (size_t)tdm_qweight_bytes(&m->embed);
        void *p = dalloc(e, eb, &e->mem.weights, "embed_tokens");
        if (!p || tdm_cuda_h2d(p, m->embed.w, eb) != 0) goto fail;
        e->embed = p;
    }
    /* prefill chunks: TANDEM_PREFILL_CHUNK rows of activations (at least ROWS, at most ctx); MoE
     * layouts take them through the experts' grouped form (TANDEM_MOE_GROUPED; off: ROWS at a time) */
    long pchunk = 0;
    if (tdm_setting_int("TANDEM_PREFILL_CHUNK", &pchunk) != 0 || pchunk < 1) {
        tdm_errf("TANDEM_PREFILL_CHUNK must be a positive integer");
        goto fail;
    }
    /* the uploaded layers: MoE ones, and qwen3_5 GDN ones whose in_proj_b and in_proj_a stay two products */
    int n_moe = 0, n_sep = 0;
    for (int i = 0; i < c->n_layers; i++) {
        n_moe += e->ly[i].is_moe;
        n_sep += e->ly[i].mixer == TDM_MIXER_GDN && !e->ly[i].grouped && !e->ly[i].one_ba;
    }
    e->prow = pchunk < ctx ? (int)pchunk : ctx;
    e->moe_grouped = strcmp(tdm_setting("TANDEM_MOE_GROUPED"), "off") != 0;
    if (n_moe && !e->moe_grouped) e->prow = ROWS;
    if (e->prow < ROWS) e->prow = ROWS;
    if (!(e->moe = tdm_emoe_new(m, e->prow, &e->mem.weights, &e->mem.act))) goto fail;
    if (alloc_act(e) != 0 || tdm_engine_reset(e) != 0) goto fail;
    e->use_graph = strcmp(tdm_setting("TANDEM_CUDA_GRAPH"), "off") != 0;
    e->attn_prefill = strcmp(tdm_setting("TANDEM_ATTN_PREFILL"), "off") != 0;

    size_t free1 = 0;
    if (tdm_cuda_mem_info(&free1, &total) != 0) goto fail;
    const char *moe = !n_moe ? "" : e->moe_grouped ? ", MoE experts grouped" : ", MoE in chunks of 32 (TANDEM_MOE_GROUPED=off)";
    char fused[128] = "", mlp_forms[256] = "none (no dense MLP)";
    for (int i = 0; i < m->cfg.n_layers; i++)   /* what runs at each row count, from the first dense MLP's weights */
        if (!e->ly[i].is_moe) {
            tdm_matmul_swiglu_forms(e->fuse_mlp, &e->ly[i].gate, &e->ly[i].up, e->xn, m->cfg.hidden, e->xn_b, e->tiles,
                                    mlp_forms, sizeof mlp_forms);
            break;
        }
    if (e->n_one_ba || n_sep)
        snprintf(fused, sizeof fused, "; in_proj_b + in_proj_a one product in %d of %d GDN layers%s", e->n_one_ba,
                 e->n_one_ba + n_sep, e->fuse_ba ? "" : " (TANDEM_GDN_FUSE_BA=off)");
    fprintf(stderr,
            "# CUDA engine on %s (%s): weights %.1f MB, KV caches %.1f MB (ctx %d), GDN conv+state %.1f MB, "
            "activations %.1f MB (prefill chunks of %d tokens, their attention %s%s%s); device free %.0f -> %.0f MB of "
            "%.0f MB; decode steps %s; sibling projections %s%s; dense MLPs' gate, up and SiLU x up: %s (%s); GDN commits %s; "
            "%s; %s\n",
            info.name, arch, e->mem.weights / 1e6, e->mem.kv / 1e6, ctx, e->mem.gdn / 1e6, e->mem.act / 1e6, e->prow,
            e->attn_prefill ? "flash past 32 rows" : "32 rows a launch (TANDEM_ATTN_PREFILL=off)",
            e->gdn_scratch ? ", GDN chunked" : "", moe, free0 / 1e6, free1 / 1e6, total / 1e6,
            e->use_graph ? "from a CUDA graph" : "eager (TANDEM_CUDA_GRAPH=off)",
            e->concurrent ? "on two streams (passes of up to 32 rows)" : "on one stream (TANDEM_CONCURRENT=off)", fused,
            mlp_forms,
            e->fuse_mlp == TDM_MLP_FUSE_AUTO ? "TANDEM_MLP_FUSE=auto: the form measured faster at each row count"
            : e->fuse_mlp == TDM_MLP_FUSE_ON ? "TANDEM_MLP_FUSE=on: one launch wherever the setting allows"
                                             : "TANDEM_MLP_FUSE=off: no one launch",
            e->defer ? "deferred to the next pass (no pass takes them up before the first round)"
                     : "replayed at the commit (TANDEM_GDN_DEFER=off)",
            tdm_cuda_pdl() ? "programmatic launches" : "plain launches (TANDEM_PDL=off)",
            e->mm_xb ? "blocked product inputs at 1-32 rows" : "no blocked product inputs (TANDEM_MM_XB=off)");
    return e;
fail:
    tdm_engine_free(e);
    return NULL;
}

int tdm_engine_pos(const struct tdm_engine *e) { return e->pos; }
const struct tdm_engine_mem *tdm_engine_mem(const struct tdm_engine *e) { return &e->mem; }

/* ---- the forward ---- */

/* The launch sequences: a forward; a verify of a chain or of a tree (the rows' parents in
 * e->d_parent); a commit of a verify's first rows, or of a tree's root-to-node path (e->d_path). */
enum pass { PASS_FORWARD, PASS_VERIFY, PASS_TREE, PASS_COMMIT, PASS_COMMIT_PATH };

/* Where a GDN layer's b and a rows are, in a buffer of rows x 2Hv values (e->gates: e->prow rows;
 * a layer's round_g: ROWS rows). qwen3_5: per row b then a, row stride 2Hv (the one product's
 * [M][2Hv] output, or the two products written side by side). qwen3_next: as tdm_gdn_ungroup writes
 * them, b [rows][Hv] then a [rows][Hv], row stride Hv. Every reader of the rows (the recurrence's
 * forms, the commit, a tree commit's gather) takes them from here. */
struct gates { uint16_t *b, *a; int64_t ld; };
static struct gates gates_of(const struct dlayer *d, uint16_t *buf, int64_t rows, int Hv)
{
    if (d->grouped) return (struct gates){buf, buf + rows * Hv, Hv};
    return (struct gates){buf, buf + Hv, 2 * (int64_t)Hv};
}

/* The side stream (TANDEM_CONCURRENT): a layer's sibling projections read the same input (e->xn) and
 * write different buffers, so the smaller ones run on e->side beside the largest on e->st (and a MoE
 * layer's shared expert beside its router and routed experts: moe_mlp, engine_moe.h).
 * side_fork makes e->side wait for everything launched on e->st so far; side_join makes e->st wait
 * for everything launched on e->side so far. Captured into a CUDA graph, the pair forks the capture
 * into a branch on e->side and joins it back: a capture can only end with every forked stream
 * joined, so a mixer that forks joins on every path, a failed launch's too. Only in passes of at
 * most ROWS rows (side_ok): their products run the skinny kernels, which keep their partial sums
 * in shared and distributed shared memory and use no global scratch, so two at once share no
 * buffer; more rows (a prefill chunk) run the wide GEMM, kept on one stream. The kernels and their
 * arguments are those of one stream, so the bits are the same. */
static int side_ok(const struct tdm_engine *e, int M) { return e->concurrent && M <= ROWS; }

static int side_fork(struct tdm_engine *e) { return tdm_stream_after(e->side, e->st, e->fork_ev); }

static int side_join(struct tdm_engine *e) { return tdm_stream_after(e->st, e->side, e->join_ev); }

/* Layer i's MoE MLP of e->xn into e->y: the shared expert on e->side where side_ok (engine_moe.h). */
static int moe_mlp(struct tdm_engine *e, int i, int M)
{
    const struct tdm_emoe_side side = {e->side, e->fork_ev, e->join_ev};
    return tdm_emoe_forward(e->moe, i, e->xn, tdm_engine_blocked(e->xn_b, M), M, e->y, e->tiles, e->st,
                            side_ok(e, M) ? &side : NULL);
}

/* A GDN layer's conv of M rows of x into e->cv, in the form of the pass (gdn_mixer). */
static int gdn_conv(struct tdm_engine *e, const struct dlayer *d, const uint16_t *x, int M, enum pass p, int prefill)
{
    const struct tdm_config *c = &e->m->cfg;
    const int C = tdm_gdn_conv_dim(c), K = c->conv_kernel;
    void *st = e->st;
    if (p == PASS_TREE) return tdm_gdn_conv_tree(x, C, d->conv_w, d->conv_state, e->d_parent, M, C, K, e->cv, st);
    if (p == PASS_VERIFY) return tdm_gdn_conv_verify(x, C, d->conv_w, d->conv_state, M, C, K, e->cv, st);
    if (prefill) return tdm_gdn_conv_prefill(x, C, d->conv_w, d->conv_state, M, C, K, e->cv, st);
    return tdm_gdn_conv(x, C, d->conv_w, d->conv_state, M, C, K, e->cv, st);
}

/* A verify (chain or tree): the conv and recurrence only read their states, and the rows'
 * in_proj_qkv, b and a outputs stay in the layer's round buffers for the commit (commit_launches);
 * a tree's nodes run the tree kernels (layers.h, Trees). A forward of more than ROWS rows (a
 * prefill chunk) runs the prefill forms when TANDEM_GDN_PREFILL is on (e->gdn_scratch): the conv
 * parallel over tokens (the same bits) and the chunked delta rule (the same function, summed in
 * another order; layers.h).
 * Deferred commit (e->defer): a pass that takes pending rows up (take: take_pending) first takes
 * the last commit's pending rows (e->d_pend of them) out of the round buffers
 * (tdm_gdn_conv_pending: their conv, advancing the conv state, and their gates; struct tdm_engine
 * says why there), then the recurrence's pending form applies them as it loads the state, before
 * the pass's own rows, and writes the state once. The chunked prefill kernel has no pending form
 * (its scan loads the state chunk by chunk in shared memory): a prefill chunk applies the rows
 * with tdm_gdn_recur_pend over no rows of its own first — one more read and write of the state,
 * only for a prompt chunk right after a round. A pass that does not take them up launches the
 * plain forms, as with TANDEM_GDN_DEFER=off.
 * Two streams (side_ok): the fork comes after tdm_gdn_conv_pending, which reads the round buffers
 * that a verify's projections rewrite. qwen3_5: in_proj_qkv then the conv (which needs only x) on
 * e->st, in_proj_z and in_proj_b/a on e->side, joined before the recurrence (which needs the
 * gates; tdm_gdn_gated_norm, after it, needs z). qwen3_next: in_proj_qkvz on e->st, in_proj_ba
 * on e->side, joined before tdm_gdn_ungroup, which needs both. */
static int gdn_mixer(struct tdm_engine *e, struct dlayer *d, int M, enum pass p, int take)
{
    const int verify = p == PASS_VERIFY || p == PASS_TREE;
    const struct tdm_config *c = &e->m->cfg;
    const int H = c->hidden, C = tdm_gdn_conv_dim(c), Hk = c->gdn_k_heads, Hv = c->gdn_v_heads;
    const int Dk = c->gdn_k_dim, Dv = c->gdn_v_dim, K = c->conv_kernel;
    void *st = e->st;
    const struct tdm_tiles *t = e->tiles;
    const int64_t W = 2 * (int64_t)Hk * Dk + 2 * (int64_t)Hv * Dv; /* grouped qkvz */
    /* a verify keeps its rows' conv input and gates for the commit (engine_impl.h) */
    uint16_t *x = verify ? d->round_x : e->mixed;
    const struct gates g = verify ? gates_of(d, d->round_g, ROWS, Hv) : gates_of(d, e->gates, e->prow, Hv);
    const uint16_t *bb = g.b, *aa = g.a;
    const int64_t ld = g.ld;
    struct tdm_gdn_pend pd, *pend = NULL;
    if (take) {
        const struct gates pg = gates_of(d, e->pg, ROWS, Hv); /* round_g's layout, copied whole */
        pd = (struct tdm_gdn_pend){e->pcv, pg.b, pg.a, pg.ld, pg.ld, e->d_pend};
        pend = &pd;
        if (tdm_gdn_conv_pending(d->round_x, C, d->conv_w, d->conv_state, e->d_pend, C, K, e->pcv, d->round_g, e->pg,
                                 (int64_t)ROWS * 2 * Hv, st) != 0)
            return -1;
    }
    const int two = side_ok(e, M);
    void *ss = two ? e->side : st; /* the sibling products' stream */
    if (two && side_fork(e) != 0) return -1;
    const int prefill = p == PASS_FORWARD && M > ROWS && e->gdn_scratch;
    /* the gated norm's arguments: inside the recurrence (layers.h: struct tdm_gdn_gnorm), or for the
     * gated-norm kernel after it (TANDEM_GDN_FUSED_NORM off, and a prefill chunk's chunked recurrence,
     * which has no fused form) */
    const struct tdm_gdn_gnorm gnf = {e->z, (int64_t)Hv * Dv, d->gnorm, c->rms_eps, e->gn, tdm_engine_blocked(e->gn_b, M)};
    const struct tdm_gdn_gnorm *gn = e->gn_fused && !prefill ? &gnf : NULL;
    const uint16_t *xnb = tdm_engine_blocked(e->xn_b, M);
    int bad = d->grouped ? tdm_matmul_xb(&d->qkvz, e->xn, H, xnb, M, e->qkvz, W, TDM_MM_BF16, t, st) ||
                               tdm_matmul_xb(&d->ba, e->xn, H, xnb, M, e->ba, 2 * Hv, TDM_MM_BF16, t, ss)
                         : tdm_matmul_xb(&d->qkv, e->xn, H, xnb, M, x, C, TDM_MM_BF16, t, st) ||
                               tdm_matmul_xb(&d->z, e->xn, H, xnb, M, e->z, (int64_t)Hv * Dv, TDM_MM_BF16, t, ss) ||
                               (d->one_ba ? tdm_matmul_xb(&d->ba, e->xn, H, xnb, M, g.b, ld, TDM_MM_BF16, t, ss)
                                          : tdm_matmul_xb(&d->b, e->xn, H, xnb, M, g.b, ld, TDM_MM_BF16, t, ss) ||
                                                tdm_matmul_xb(&d->a, e->xn, H, xnb, M, g.a, ld, TDM_MM_BF16, t, ss)) ||
                               gdn_conv(e, d, x, M, p, prefill);
    if ((two && side_join(e) != 0) || bad) return -1;
    if (d->grouped && (tdm_gdn_ungroup(e->qkvz, W, e->ba, 2 * Hv, M, Hk, Hv, Dk, Dv, x, e->z, g.b, g.a, st) ||
                       gdn_conv(e, d, x, M, p, prefill)))
        return -1;
    if ((p == PASS_TREE ? (pend ? tdm_gdn_recur_tree_pend(e->cv, bb, ld, aa, ld, d->A_log, d->dt_bias, d->S, e->d_parent, M,
                                                          Hk, Hv, Dk, Dv, e->o, pend, gn, st)
                                : tdm_gdn_recur_tree(e->cv, bb, ld, aa, ld, d->A_log, d->dt_bias, d->S, e->d_parent, M, Hk,
                                                     Hv, Dk, Dv, e->o, gn, st))
         : verify ? (pend ? tdm_gdn_recur_verify_pend(e->cv, bb, ld, aa, ld, d->A_log, d->dt_bias, d->S, M, Hk, Hv, Dk, Dv,
                                                      e->o, pend, gn, st)
                          : tdm_gdn_recur_verify(e->cv, bb, ld, aa, ld, d->A_log, d->dt_bias, d->S, M, Hk, Hv, Dk, Dv, e->o,
                                                 gn, st))
         : prefill ? (pend && tdm_gdn_recur_pend(NULL, bb, ld, aa, ld, d->A_log, d->dt_bias, d->S, 0, Hk, Hv, Dk, Dv, NULL,
                                                 pend, NULL, st)) ||
                         tdm_gdn_recur_chunked(e->cv, bb, ld, aa, ld, d->A_log, d->dt_bias, d->S, M, Hk, Hv, Dk, Dv,
                                               e->gdn_scratch, e->o, st)
         : pend ? tdm_gdn_recur_pend(e->cv, bb, ld, aa, ld, d->A_log, d->dt_bias, d->S, M, Hk, Hv, Dk, Dv, e->o, pend, gn, st)
                : tdm_gdn_recur(e->cv, bb, ld, aa, ld, d->A_log, d->dt_bias, d->S, M, Hk, Hv, Dk, Dv, e->o, gn, st)) ||
        (!gn && tdm_gdn_gated_norm(e->o, gnf.z, gnf.ldz, gnf.w, M, Hv, Dv, gnf.eps, gnf.y, gnf.yb, st)) ||
        tdm_matmul_xb(&d->out, e->gn, (int64_t)Hv * Dv, tdm_engine_blocked(e->gn_b, M), M, e->y, H, TDM_MM_BF16, t, st))
        return -1;
    return 0;
}

/* The position arguments of the attention kernels for M rows: eager, the host position; graphed,
 * the device buffer, with ctx - M sizing the grids (the kernels take the device value and skip the
 * rest). */
static int pos_host(const struct tdm_engine *e, int M, int graphed) { return graphed ? e->ctx - M : e->pos; }

/* Attention of M rows whose K and V are in the cache already. A prefill chunk past ROWS rows (eager)
 * runs the flash prefill kernel in one launch; otherwise (TANDEM_ATTN_PREFILL=off too) the decode
 * kernel, ROWS queries a launch (each query still sees the cache up to itself). */
static int attn_rows(struct tdm_engine *e, struct dlayer *d, int M, int graphed)
{
    const struct tdm_config *c = &e->m->cfg;
    const int Hq = c->n_q_heads, Hkv = c->n_kv_heads, D = c->head_dim;
    const int64_t ldqg = 2 * (int64_t)Hq * D, HqD = (int64_t)Hq * D;
    if (M > ROWS && !graphed && e->attn_prefill)
        return tdm_attn_prefill(e->q, e->qg, ldqg, d->kc, d->vc, M, Hq, Hkv, D, e->pos, e->ctx, e->att, e->st);
    for (int r0 = 0; r0 < M; r0 += ROWS) {
        const int m = M - r0 < ROWS ? M - r0 : ROWS;
        if (tdm_attn_decode(e->q + r0 * HqD, e->qg + r0 * ldqg, ldqg, d->kc, d->vc, m, Hq, Hkv, D, pos_host(e, M, graphed) + r0,
                            graphed ? e->d_pos : NULL, e->ctx, e->attn_scratch, e->att + r0 * HqD,
                            r0 == 0 ? tdm_engine_blocked(e->att_b, M) : NULL, e->st) != 0)
            return -1;
    }
    return 0;
}

/* A tree's nodes: node r rotated at pos + depth, its K/V at row pos + r, attending to its
 * ancestors (layers.h, Trees). Two streams (side_ok): q_proj on e->st, k_proj and v_proj on
 * e->side, joined before the q/k norm and rotary kernel, which needs all three. */
static int attn_mixer(struct tdm_engine *e, struct dlayer *d, int M, int graphed, enum pass p)
{
    const struct tdm_config *c = &e->m->cfg;
    const int H = c->hidden, Hq = c->n_q_heads, Hkv = c->n_kv_heads, D = c->head_dim;
    const int64_t ldqg = 2 * (int64_t)Hq * D, ldkv = (int64_t)Hkv * D;
    void *st = e->st;
    const struct tdm_tiles *t = e->tiles;
    const int two = side_ok(e, M);
    void *ss = two ? e->side : st; /* the sibling products' stream */
    if (two && side_fork(e) != 0) return -1;
    const uint16_t *xnb = tdm_engine_blocked(e->xn_b, M);
    const int bad = tdm_matmul_xb(&d->q, e->xn, H, xnb, M, e->qg, ldqg, TDM_MM_BF16, t, st) ||
                    tdm_matmul_xb(&d->k, e->xn, H, xnb, M, e->kk, ldkv, TDM_MM_BF16, t, ss) ||
                    tdm_matmul_xb(&d->v, e->xn, H, xnb, M, e->vv, ldkv, TDM_MM_BF16, t, ss);
    if ((two && side_join(e) != 0) || bad) return -1;
    const int pos = pos_host(e, M, graphed);
    const int32_t *dpos = graphed ? e->d_pos : NULL;
    if (p == PASS_TREE ? tdm_qk_norm_rope_tree(e->qg, ldqg, e->kk, e->vv, ldkv, d->q_norm, d->k_norm, e->d_parent, M, Hq, Hkv,
                                               D, c->rotary_dim, c->rope_theta, c->rms_eps, pos, dpos, e->ctx, e->q, d->kc,
                                               d->vc, st) ||
                             tdm_attn_tree(e->q, e->qg, ldqg, d->kc, d->vc, e->d_parent, M, Hq, Hkv, D, pos, dpos, e->ctx,
                                           e->attn_scratch, e->att, tdm_engine_blocked(e->att_b, M), st)
                       : tdm_qk_norm_rope(e->qg, ldqg, e->kk, e->vv, ldkv, d->q_norm, d->k_norm, M, Hq, Hkv, D,
                                          c->rotary_dim, c->rope_theta, c->rms_eps, pos, dpos, e->ctx, e->q, d->kc, d->vc,
                                          st) ||
                             attn_rows(e, d, M, graphed))
        return -1;
    return tdm_matmul_xb(&d->o, e->att, (int64_t)Hq * D, tdm_engine_blocked(e->att_b, M), M, e->y, H, TDM_MM_BF16, t, st);
}

int tdm_engine_dense_mlp(enum tdm_mlp_fuse fuse, const struct tdm_dweight *gate, const struct tdm_dweight *up,
                         const struct tdm_dweight *down, const uint16_t *xn, const uint16_t *xnb, int H, int M,
                         uint16_t *g, uint16_t *u, uint16_t *gb, int64_t I, uint16_t *y, const struct tdm_tiles *t,
                         void *st)
{
    /* gate, up and SiLU x up in one launch, or the gate then up with the SiLU x up in its epilogue,
     * or three launches: the same bits, so the choice, made per row count, changes none */
    const enum tdm_swiglu_form form = tdm_matmul_swiglu_form(fuse, gate, up, xn, H, xnb, M, t);
    if (tdm_matmul_swiglu_run(form, gate, up, xn, H, xnb, M, g, u, gb, t, st) != 0 ||
        tdm_matmul_xb(down, g, I, gb, M, y, H, TDM_MM_BF16, t, st))
        return -1;
    return 0;
}

static int mlp(struct tdm_engine *e, struct dlayer *d, int M)
{
    return tdm_engine_dense_mlp(e->fuse_mlp, &d->gate, &d->up, &d->down, e->xn, tdm_engine_blocked(e->xn_b, M),
                                e->m->cfg.hidden, M, e->g, e->u, tdm_engine_blocked(e->g_b, M), e->m->cfg.intermediate,
                                e->y, e->tiles, e->st);
}

/* Whether a pass takes the pending rows of a deferred commit up (gdn_mixer: tdm_gdn_conv_pending on
 * each GDN layer, the recurrence's pending forms). Eager, the host knows the count (e->pend, which
 * pend_to_device copies before the pass): only when rows are pending. Graphed, a captured pass
 * serves every count (read from e->d_pend at replay): from the first deferred commit with rows on
 * (e->taking), never before — every graph captured before is dropped then (start_taking), so none
 * without the launches is replayed once rows can be pending. A pass that does not take them up runs
 * exactly the plain forms, and gives the same bits as the pending forms over a count of 0:
 * tdm_gdn_conv_pending over 0 rows only copies the gates to e->pg, which no kernel reads with
 * 0 rows pending, and the recurrence's pending forms are the plain ones' kernel, which with a
 * count of 0 runs no pending row and writes nothing more (gdn.cu, PENDING). So plain decode
 * before any round launches what it launches with TANDEM_GDN_DEFER=off: no launch a GDN layer
 * more, no read of the count, and a prefill chunk with nothing pending no extra pass over the
 * state. */
static int take_pending(const struct tdm_engine *e, int graphed)
{
    return e->defer && (graphed ? e->taking : e->pend > 0);
}

/* The launches of M <= ROWS rows from e->ids (already on the device) to the FP32 logits of rows
 * from..M-1 in e->logits and their greedy ids in e->gid (none when from >= M). graphed: positions
 * from e->d_pos. p: a forward, or a chain or tree verify (the mixers say what changes). The argmax
 * runs whenever the head does, so one graph per shape serves the callers that copy the logits, the
 * ids or both (two small launches over logits the head just wrote). */
static int launches(struct tdm_engine *e, int M, int from, int graphed, enum pass p)
{
    const struct tdm_config *c = &e->m->cfg;
    const int H = c->hidden, V = c->vocab;
    const float eps = c->rms_eps;
    void *st = e->st;
    const int take = take_pending(e, graphed);
    if (take && !graphed) e->pend_passes++; /* a graph's replays count in run_pass */
    if (tdm_embed_rows(e->embed, e->embed_f32, V, H, e->ids, M, e->h, st) != 0) return -1;
    const uint16_t *pend = NULL; /* the previous layer's MLP output, added by the next norm */
    for (int i = 0; i < c->n_layers; i++) {
        struct dlayer *d = &e->ly[i];
        if (tdm_add_rmsnorm(e->h, pend, H, d->in_norm, H, M, eps, e->xn, tdm_engine_blocked(e->xn_b, M), st) != 0) return -1;
        if ((d->mixer == TDM_MIXER_GDN ? gdn_mixer(e, d, M, p, take) : attn_mixer(e, d, M, graphed, p)) != 0) return -1;
        if (tdm_add_rmsnorm(e->h, e->y, H, d->post_norm, H, M, eps, e->xn, tdm_engine_blocked(e->xn_b, M), st) != 0 ||
            (d->is_moe ? moe_mlp(e, i, M) : mlp(e, d, M)) != 0)
            return -1;
        pend = e->y;
    }
    /* the final norm's blocked copy where the head reads it: every row from the first (a copy's rows
     * are where the product looks for them only from row 0) */
    uint16_t *fxb = from == 0 ? tdm_engine_blocked(e->xn_b, M) : NULL;
    if (tdm_add_rmsnorm(e->h, pend, H, e->final_norm, H, M, eps, e->xn, fxb, st) != 0) return -1;
    if (from < M && (tdm_matmul_xb(&e->head, e->xn + (size_t)from * H, H, fxb, M - from, e->logits, V, TDM_MM_F32, e->tiles,
                                   st) ||
                     tdm_argmax_rows(e->logits, V, M - from, V, e->amax, e->gid, st)))
        return -1;
    return 0;
}

/* A commit's launches (replayed, TANDEM_GDN_DEFER=off): every GDN layer's conv and recurrence over
 * the first j rows its last verify kept, from the states that verify read (and left), writing the
 * states; the outputs (e->cv, e->o) are dropped. Per token the arithmetic of the verify's read-only
 * forms (layers.h), so the states become those of j one-token steps. Deferred, there are none: the
 * next pass applies the rows (gdn_mixer). */
static int commit_launches(struct tdm_engine *e, int j)
{
    const struct tdm_config *c = &e->m->cfg;
    const int C = tdm_gdn_conv_dim(c), Hk = c->gdn_k_heads, Hv = c->gdn_v_heads, Dk = c->gdn_k_dim, Dv = c->gdn_v_dim;
    for (int i = 0; i < c->n_layers; i++) {
        struct dlayer *d = &e->ly[i];
        if (d->mixer != TDM_MIXER_GDN) continue;
        const struct gates g = gates_of(d, d->round_g, ROWS, Hv);
        if (tdm_gdn_conv(d->round_x, C, d->conv_w, d->conv_state, j, C, c->conv_kernel, e->cv, e->st) ||
            tdm_gdn_recur(e->cv, g.b, g.ld, g.a, g.ld, d->A_log, d->dt_bias, d->S, j, Hk, Hv, Dk, Dv, e->o, NULL, e->st))
            return -1;
    }
    return 0;
}

/* A tree path's commit: the path's rows (e->d_path, n of them) gathered in place to the front of
 * each GDN layer's kept inputs and of each attention layer's new K/V rows (tdm_rows_compact: rows
 * pos..pos+n-1 become the path's, the rest are dropped by the length), then commit_launches over
 * the n rows: the states and cache of n one-token steps over the path's tokens. Deferred, only the
 * gathers: the n rows at the front are the next pass's pending rows. A qwen3_5 layer's
 * b and a rows lie side by side (gates_of): one gather of 2Hv columns moves both. */
static int commit_path_launches(struct tdm_engine *e, int n, int graphed)
{
    const struct tdm_config *c = &e->m->cfg;
    const int C = tdm_gdn_conv_dim(c), Hv = c->gdn_v_heads, HkvD = c->n_kv_heads * c->head_dim;
    const int pos = pos_host(e, n, graphed);
    const int32_t *dpos = graphed ? e->d_pos : NULL;
    void *st = e->st;
    for (int i = 0; i < c->n_layers; i++) {
        struct dlayer *d = &e->ly[i];
        if (d->mixer != TDM_MIXER_GDN) {
            if (tdm_rows_compact(d->kc, HkvD, HkvD, pos, dpos, e->d_path, n, st) ||
                tdm_rows_compact(d->vc, HkvD, HkvD, pos, dpos, e->d_path, n, st))
                return -1;
            continue;
        }
        const struct gates g = gates_of(d, d->round_g, ROWS, Hv);
        if (tdm_rows_compact(d->round_x, C, C, 0, NULL, e->d_path, n, st) ||
            (d->grouped ? tdm_rows_compact(g.b, Hv, Hv, 0, NULL, e->d_path, n, st) ||
                              tdm_rows_compact(g.a, Hv, Hv, 0, NULL, e->d_path, n, st)
                        : tdm_rows_compact(g.b, g.ld, 2 * Hv, 0, NULL, e->d_path, n, st)))
            return -1;
    }
    return e->defer ? 0 : commit_launches(e, n);
}

static int pass_launches(struct tdm_engine *e, enum pass p, int M, int from, int graphed)
{
    if (p == PASS_COMMIT) return commit_launches(e, M);
    if (p == PASS_COMMIT_PATH) return commit_path_launches(e, M, graphed);
    return launches(e, M, from, graphed, p);
}

/* One pass from the CUDA graph *g when graphs are on (TANDEM_CUDA_GRAPH): captured on the shape's
 * second use, after one eager run (*eager_runs) has done every kernel's one-time set-up, and
 * replayed after with the position from e->d_pos: the same launches with the same arguments except
 * the position's source, so the same bits (t/gpu/engine.t, t/gpu/spec.t). A graph captured before
 * the first deferred commit holds no pending launches; that commit drops it (start_taking). */
static int run_pass(struct tdm_engine *e, enum pass p, int M, int from, tdm_graph *g, int *eager_runs)
{
    void *st = e->st;
    if (!e->use_graph) return pass_launches(e, p, M, from, 0);
    if (!*g && *eager_runs >= 1) {
        if (tdm_graph_begin(st) != 0) return -1;
        int rc = pass_launches(e, p, M, from, 1);
        tdm_graph cap = NULL;
        if (tdm_graph_end(st, &cap) != 0 || rc != 0) {
            if (cap) tdm_graph_destroy(cap);
            static const char *const names[] = {"forward", "verify", "tree verify", "commit", "path commit"};
            return tdm_err_prefix("capturing the CUDA graph of a %d-row %s", M, names[p]);
        }
        *g = cap;
    }
    if (*g) {
        /* a forward's or verify's graph holds the pending launches once e->taking (take_pending) */
        if (p != PASS_COMMIT && p != PASS_COMMIT_PATH && take_pending(e, 1)) e->pend_passes++;
        return tdm_copy_async(e->d_pos, &e->pos, sizeof(int32_t), st) != 0 || tdm_graph_launch(*g, st) != 0 ? -1 : 0;
    }
    ++*eager_runs;
    return pass_launches(e, p, M, from, 0);
}

/* The pending rows' count for the next pass's kernels (deferred commit), enqueued before the pass
 * (outside any graph capture) as run_pass enqueues the position. */
static int pend_to_device(struct tdm_engine *e)
{
    return e->defer ? tdm_copy_async(e->d_pend, &e->pend, sizeof(int32_t), e->st) : 0;
}

/* M <= ROWS tokens at e->pos; logits of rows from..M-1 into out and their greedy ids into gout
 * (either NULL; the head is skipped when both are, or from >= M). A one-token step with logits or
 * ids, and every verify, runs from a graph (run_pass); the copies to the host come after the
 * launch, outside the graph. p: a forward, or a verify (PASS_VERIFY, PASS_TREE with the parents
 * already in e->d_parent): the position stays, the GDN states stay (gdn_mixer), and the round may be
 * committed (engine_impl.h). */
static int chunk(struct tdm_engine *e, const int32_t *ids, int M, int from, float *out, int32_t *gout, enum pass p)
{
    const int verify = p != PASS_FORWARD;
    const int V = e->m->cfg.vocab;
    void *st = e->st;
    if (!out && !gout) from = M;
    e->round_rows = 0; /* a forward changes the states a pending round started from; a verify replaces it */
    e->fin_rows = 0;
    if (tdm_copy_async(e->ids, ids, (size_t)M * sizeof(int32_t), st) != 0 || pend_to_device(e) != 0) return -1;
    int rc;
    if (p == PASS_TREE) rc = run_pass(e, PASS_TREE, M, from, &e->tree_graph[M][from], &e->tree_eager[M][from]);
    else if (verify) rc = run_pass(e, PASS_VERIFY, M, from, &e->verify_graph[M][from], &e->verify_eager[M][from]);
    else if (M == 1 && from == 0) rc = run_pass(e, PASS_FORWARD, 1, 0, &e->step, &e->eager_steps);
    else rc = launches(e, M, from, 0, PASS_FORWARD);
    e->pend = 0; /* applied by the pass (or, on a failure, the state is undefined) */
    if (rc != 0) return -1;
    if (from < M && out && tdm_copy_async(out, e->logits, (size_t)(M - from) * V * sizeof(float), st) != 0) return -1;
    if (from < M && gout && tdm_copy_async(gout, e->gid, (size_t)(M - from) * sizeof(int32_t), st) != 0) return -1;
    if (tdm_stream_sync(st) != 0) return -1;
    e->fin_rows = M; /* launches() left the final-norm output in e->xn */
    if (verify) e->round_rows = M;
    else e->pos += M;
    return 0;
}

/* A prefill chunk of M <= e->prow tokens: the layers over all M rows at once (projections past 32
 * rows run the wide GEMM), then the head ROWS rows at a time for rows from..M-1: logits into out,
 * greedy ids into gout (either NULL). */
static int prefill_chunk(struct tdm_engine *e, const int32_t *ids, int M, int from, float *out, int32_t *gout)
{
    const int H = e->m->cfg.hidden, V = e->m->cfg.vocab;
    void *st = e->st;
    if (!out && !gout) from = M;
    e->round_rows = 0;
    e->fin_rows = 0;
    if (tdm_copy_async(e->ids, ids, (size_t)M * sizeof(int32_t), st) != 0 || pend_to_device(e) != 0) return -1;
    const int rc = launches(e, M, M, 0, PASS_FORWARD);
    e->pend = 0;
    if (rc != 0) return -1;
    for (int r0 = from; r0 < M; r0 += ROWS) {
        const int m = M - r0 < ROWS ? M - r0 : ROWS;
        /* same stream: the copies of one slice end before the next head launch overwrites it */
        if (tdm_matmul(&e->head, e->xn + (size_t)r0 * H, H, m, e->logits, V, TDM_MM_F32, e->tiles, st) != 0 ||
            (out && tdm_copy_async(out + (size_t)(r0 - from) * V, e->logits, (size_t)m * V * sizeof(float), st) != 0) ||
            (gout && (tdm_argmax_rows(e->logits, V, m, V, e->amax, e->gid, st) != 0 ||
                      tdm_copy_async(gout + (r0 - from), e->gid, (size_t)m * sizeof(int32_t), st) != 0)))
            return -1;
    }
    if (tdm_stream_sync(st) != 0) return -1;
    e->pos += M;
    e->fin_rows = M; /* launches() left the final-norm output of all M rows in e->xn */
    return 0;
}

static int forward_chunk(struct tdm_engine *e, const int32_t *ids, int M, int from, float *out, int32_t *gout)
{
    return chunk(e, ids, M, from, out, gout, PASS_FORWARD);
}

/* tdm_engine_forward_ids's contract for T tokens: checked whole (nothing is consumed on bad input),
 * then fed `rows` at a time through one_chunk. */
static int feed(struct tdm_engine *e, const char *who, const int32_t *ids, int T, int logits_from, float *logits,
                int32_t *gids, int rows, int (*one_chunk)(struct tdm_engine *, const int32_t *, int, int, float *, int32_t *),
                const char *what)
{
    const struct tdm_config *c = &e->m->cfg;
    if (T <= 0) return 0;
    if (logits_from < 0) return tdm_errf("%s: logits_from %d is negative", who, logits_from);
    if (e->pos + T > e->ctx) return tdm_errf("context full: %d + %d tokens exceed --ctx %d", e->pos, T, e->ctx);
    for (int t = 0; t < T; t++)
        if (ids[t] < 0 || ids[t] >= c->vocab) return tdm_errf("token id %d is out of the vocabulary (%d ids)", ids[t], c->vocab);
    for (int at = 0; at < T; at += rows) {
        const int M = T - at < rows ? T - at : rows;
        int from = logits_from - at;
        if (from < 0) from = 0;
        float *out = logits && from < M ? logits + (size_t)(at + from - logits_from) * c->vocab : NULL;
        int32_t *gout = gids && from < M ? gids + (at + from - logits_from) : NULL;
        if (one_chunk(e, ids + at, M, from, out, gout) != 0) return tdm_err_prefix("%s at position %d", what, e->pos);
    }
    return 0;
}

int tdm_engine_forward_ids(struct tdm_engine *e, const int32_t *ids, int T, int logits_from, float *logits,
                           int32_t *out_ids)
{
    return feed(e, "tdm_engine_forward", ids, T, logits_from, logits, out_ids, ROWS, forward_chunk, "CUDA engine");
}

int tdm_engine_forward(struct tdm_engine *e, const int32_t *ids, int T, int logits_from, float *logits)
{
    return tdm_engine_forward_ids(e, ids, T, logits_from, logits, NULL);
}

int tdm_engine_prefill_ids(struct tdm_engine *e, const int32_t *ids, int T, int logits_from, float *logits,
                           int32_t *out_ids)
{
    return feed(e, "tdm_engine_prefill", ids, T, logits_from, logits, out_ids, e->prow, prefill_chunk,
                "CUDA engine prefill");
}

int tdm_engine_prefill(struct tdm_engine *e, const int32_t *ids, int T, int logits_from, float *logits)
{
    return tdm_engine_prefill_ids(e, ids, T, logits_from, logits, NULL);
}

int tdm_engine_prefill_rows(const struct tdm_engine *e) { return e->prow; }

/* ---- the hooks of a speculative round (engine_impl.h) ---- */

const struct tdm_model *tdm_engine_model(const struct tdm_engine *e) { return e->m; }
int tdm_engine_ctx(const struct tdm_engine *e) { return e->ctx; }
int tdm_engine_round_rows(const struct tdm_engine *e) { return e->round_rows; }
const int *tdm_engine_round_parents(const struct tdm_engine *e) { return e->round_parent; }

/* A verify reads every state once; deferred, with rows pending, it also writes it once (the state
 * after them, gdn.cu's PENDING). */
static void count_verify_bytes(struct tdm_engine *e, int reads, int pending)
{
    e->round_bytes.state_read += reads * (int64_t)e->mem.gdn_state;
    if (pending) e->round_bytes.state_written += (int64_t)e->mem.gdn_state;
}

int tdm_engine_verify_rows(struct tdm_engine *e, const int32_t *ids, int R, int from, float *logits, int32_t *gids)
{
    const int pending = e->pend;
    if (chunk(e, ids, R, from, logits, gids, PASS_VERIFY) != 0) return -1;
    for (int r = 0; r < R; r++) e->round_parent[r] = r - 1;
    count_verify_bytes(e, 1, pending);
    return 0;
}

int tdm_engine_verify_tree_rows(struct tdm_engine *e, const int32_t *ids, const int *parent, int R, int from, float *logits,
                                int32_t *gids)
{
    int32_t par[ROWS];
    for (int r = 0; r < R; r++) par[r] = parent[r];
    const int pending = e->pend;
    e->round_rows = 0;
    if (tdm_copy_async(e->d_parent, par, (size_t)R * sizeof(int32_t), e->st) != 0 ||
        chunk(e, ids, R, from, logits, gids, PASS_TREE) != 0)
        return -1;
    /* the recurrence reads every state once, and again for each node whose parent is not the
     * node before it (gdn.cu: the reload that rebuilds the parent's state) */
    int reads = 1;
    for (int r = 1; r < R; r++) reads += parent[r] != r - 1;
    memcpy(e->round_parent, parent, (size_t)R * sizeof(int));
    count_verify_bytes(e, reads, pending);
    return 0;
}

/* The first deferred commit with rows (struct tdm_engine: taking): from here on a graphed pass
 * takes pending rows up (take_pending), so every graph captured before, of a pass that runs the
 * GDN layers, lacks the pending launches and is dropped, to be captured again with them on its
 * shape's second use from now (one eager run first, as at the start). Those are the one-token
 * step's and the chain and tree verifies'. The others stay: they launch nothing for pending rows
 * and read no count — a replayed commit (commit_graph) runs only with TANDEM_GDN_DEFER=off, a path
 * commit (path_graph) deferred only gathers rows, the MTP drafter's graphs (engine_mtp.c) run its
 * own attention layer and MLP and no GDN layer; a prefill chunk and a forward of more than one row
 * run eager. Nothing changes when it fails. */
static int start_taking(struct tdm_engine *e)
{
    if (tdm_stream_sync(e->st) != 0) return -1; /* no graph in flight when it is destroyed */
    if (e->step) tdm_graph_destroy(e->step);
    e->step = NULL;
    e->eager_steps = 0;
    for (int m = 0; m <= ROWS; m++)
        for (int f = 0; f <= ROWS; f++) {
            if (e->verify_graph[m][f]) tdm_graph_destroy(e->verify_graph[m][f]);
            if (e->tree_graph[m][f]) tdm_graph_destroy(e->tree_graph[m][f]);
            e->verify_graph[m][f] = e->tree_graph[m][f] = NULL;
            e->verify_eager[m][f] = e->tree_eager[m][f] = 0;
        }
    e->taking = 1;
    return 0;
}

/* After a commit's launches: the position advances; replayed, the states were read and written;
 * deferred, the rows (at the front of the round buffers) are pending and no state moved (the first
 * time, start_taking first). The verify before the commit consumed any earlier pending rows, so
 * there are none to lose. */
static int committed(struct tdm_engine *e, int n)
{
    if (e->defer) {
        if (n > 0 && !e->taking && start_taking(e) != 0) return -1;
        e->pos += n;
        e->pend = n;
        return 0;
    }
    e->pos += n;
    e->round_bytes.state_read += (int64_t)e->mem.gdn_state;
    e->round_bytes.state_written += (int64_t)e->mem.gdn_state;
    return 0;
}

int tdm_engine_commit_path_rows(struct tdm_engine *e, const int *path, int len)
{
    int identity = 1;
    for (int j = 0; j < len; j++) identity &= path[j] == j;
    if (identity) return tdm_engine_commit_rows(e, len);
    int32_t p32[ROWS];
    for (int j = 0; j < len; j++) p32[j] = path[j];
    e->round_rows = 0;
    if (tdm_copy_async(e->d_path, p32, (size_t)len * sizeof(int32_t), e->st) != 0 ||
        run_pass(e, PASS_COMMIT_PATH, len, 0, &e->path_graph[len], &e->path_eager[len]) != 0 || tdm_stream_sync(e->st) != 0)
        return -1;
    return committed(e, len);
}

int tdm_engine_commit_rows(struct tdm_engine *e, int j)
{
    e->round_rows = 0;
    if (e->defer) return committed(e, j); /* the rows are at the front of the round buffers already */
    if (run_pass(e, PASS_COMMIT, j, 0, &e->commit_graph[j], &e->commit_eager[j]) != 0 || tdm_stream_sync(e->st) != 0)
        return -1;
    return committed(e, j);
}

int tdm_engine_gdn_defer(const struct tdm_engine *e) { return e->defer; }
int tdm_engine_gdn_pending(const struct tdm_engine *e) { return e->pend; }
int tdm_engine_gdn_taking(const struct tdm_engine *e) { return e->taking; }
long tdm_engine_gdn_pend_passes(const struct tdm_engine *e) { return e->pend_passes; }

const struct tdm_engine_round_bytes *tdm_engine_round_bytes(const struct tdm_engine *e) { return &e->round_bytes; }

/* The pending rows applied now, outside a pass (tdm_engine_state_hash): per GDN layer the pass's
 * first launch (tdm_gdn_conv_pending) and the recurrence's pending form over no rows of its own —
 * the same kernels, so the same bits as a pass applying them. Eager. */
static int apply_pending(struct tdm_engine *e)
{
    const struct tdm_config *c = &e->m->cfg;
    const int C = tdm_gdn_conv_dim(c), Hk = c->gdn_k_heads, Hv = c->gdn_v_heads, Dk = c->gdn_k_dim, Dv = c->gdn_v_dim;
    if (!e->defer || !e->pend) return 0;
    if (pend_to_device(e) != 0) return -1;
    for (int i = 0; i < c->n_layers; i++) {
        struct dlayer *d = &e->ly[i];
        if (d->mixer != TDM_MIXER_GDN) continue;
        const struct gates pg = gates_of(d, e->pg, ROWS, Hv);
        const struct tdm_gdn_pend pd = {e->pcv, pg.b, pg.a, pg.ld, pg.ld, e->d_pend};
        if (tdm_gdn_conv_pending(d->round_x, C, d->conv_w, d->conv_state, e->d_pend, C, c->conv_kernel, e->pcv, d->round_g,
                                 e->pg, (int64_t)ROWS * 2 * Hv, e->st) != 0 ||
            tdm_gdn_recur_pend(NULL, pg.b, pg.ld, pg.a, pg.ld, d->A_log, d->dt_bias, d->S, 0, Hk, Hv, Dk, Dv, NULL, &pd,
                               NULL, e->st) != 0)
            return -1;
    }
    e->pend = 0;
    return tdm_stream_sync(e->st);
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

int tdm_engine_state_hash(struct tdm_engine *e, uint64_t *hash)
{
    const struct tdm_config *c = &e->m->cfg;
    const size_t C = (size_t)tdm_gdn_conv_dim(c), conv = (size_t)(c->conv_kernel - 1) * C * 2;
    const size_t S = (size_t)c->gdn_v_heads * c->gdn_k_dim * c->gdn_v_dim * sizeof(float);
    const size_t kv = (size_t)e->pos * c->n_kv_heads * c->head_dim * 2;
    if (apply_pending(e) != 0 || tdm_stream_sync(e->st) != 0) return -1;
    size_t big = conv > S ? conv : S;
    if (kv > big) big = kv;
    unsigned char *buf = malloc(big ? big : 1);
    if (!buf) return tdm_errf("tdm_engine_state_hash: out of host memory");
    uint64_t h = 1469598103934665603ull;
    h = fnv(h, &e->pos, sizeof e->pos);
    int rc = 0;
    for (int i = 0; i < c->n_layers && rc == 0; i++) {
        const struct dlayer *d = &e->ly[i];
        if (d->mixer == TDM_MIXER_GDN) {
            if ((rc = tdm_cuda_d2h(buf, d->conv_state, conv)) == 0) h = fnv(h, buf, conv);
            if (rc == 0 && (rc = tdm_cuda_d2h(buf, d->S, S)) == 0) h = fnv(h, buf, S);
        } else if (kv) {
            if ((rc = tdm_cuda_d2h(buf, d->kc, kv)) == 0) h = fnv(h, buf, kv);
            if (rc == 0 && (rc = tdm_cuda_d2h(buf, d->vc, kv)) == 0) h = fnv(h, buf, kv);
        }
    }
    free(buf);
    if (rc != 0) return -1;
    *hash = h;
    return 0;
}

/* ---- the hooks of the MTP drafter (engine_impl.h) ---- */

void tdm_engine_view(struct tdm_engine *e, struct tdm_engine_view *v)
{
    *v = (struct tdm_engine_view){
        .m = e->m, .ctx = e->ctx, .stream = e->st, .tiles = e->tiles, .embed = e->embed, .embed_f32 = e->embed_f32,
        .head = &e->head, .qg = e->qg, .kk = e->kk, .vv = e->vv, .q = e->q, .att = e->att, .y = e->y, .g = e->g,
        .u = e->u, .xn_b = e->xn_b, .att_b = e->att_b, .g_b = e->g_b, .fuse_mlp = e->fuse_mlp,
        .attn_scratch = e->attn_scratch, .logits = e->logits, .moe = e->moe, .final_xn = e->xn,
        .final_rows = e->fin_rows, .mem = &e->mem, .use_graph = e->use_graph};
}

struct tdm_emtp **tdm_engine_mtp_state(struct tdm_engine *e) { return &e->mtp; }
