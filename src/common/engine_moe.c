/* engine_moe.c — the CUDA engine's MoE MLP (engine_moe.h). */
#include "engine_moe.h"
#include "device.h"
#include "engine.h"
#include "engine_glue.h"
#include "err.h"
#include "layers.h"
#include "matmul.h"
#include "moe.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct moe_layer {
    struct tdm_dweight router;                     /* [E, H] */
    struct tdm_dweight sh_gate, sh_up, sh_down;    /* [Is, H] x2, [H, Is] */
    struct tdm_dweight shared_gate;                /* [1, H] */
    struct tdm_moe_experts ex;
};

struct tdm_emoe {
    const struct tdm_model *m;
    int rows;
    struct moe_layer **ly;        /* [L + 1]; NULL for a dense layer; [L]: the MTP layer's, once uploaded */
    /* activations, `rows` rows */
    uint16_t *logits;             /* [R][E] */
    int32_t *sel;                 /* [R][k] */
    uint16_t *w;                  /* [R][k] */
    void *scratch;                /* tdm_moe_scratch_bytes(R, k, H, I) */
    void *group;                  /* tdm_moe_group_bytes(R, k, E) when R > TDM_ENGINE_MAX_ROWS (the grouped form) */
    uint16_t *g, *u, *sh;         /* shared expert: [R][Is] x2, [R][H] */
    float *gate;                  /* [R]: the shared expert's scale (tdm_moe_shared_gate) */
};

int tdm_emoe_supported(const struct tdm_model *m)
{
    const struct tdm_config *c = &m->cfg;
    const char *dir = m->dir ? m->dir : "model";
    for (int i = 0; i < c->n_layers; i++) {
        const struct tdm_layer *l = &m->layers[i];
        if (!l->is_moe) continue;
        const int E = c->n_experts, k = c->top_k;
        if (E < 1 || E > TDM_ROUTE_MAX_E)
            return tdm_errf("%s: num_experts %d: the CUDA router takes 1 to %d", dir, E, TDM_ROUTE_MAX_E);
        if (k < 1 || k > E || k > TDM_ROUTE_MAX_K)
            return tdm_errf("%s: num_experts_per_tok %d: the CUDA router takes 1 to %d and at most num_experts", dir, k,
                            TDM_ROUTE_MAX_K);
        if (c->hidden > TDM_MOE_MAX_K)
            return tdm_errf("%s: hidden_size %d: the CUDA expert kernels take at most %d", dir, c->hidden, TDM_MOE_MAX_K);
        if (c->moe_intermediate < 1 || c->moe_intermediate > TDM_MOE_MAX_K)
            return tdm_errf("%s: moe_intermediate_size %d: the CUDA expert kernels take 1 to %d", dir, c->moe_intermediate,
                            TDM_MOE_MAX_K);
        if (tdm_moe_experts_check(l->moe.experts, E) != 0) return tdm_err_prefix("%s: layer %d mlp", dir, i);
    }
    return 0;
}

static int up_w(const struct tdm_qweight *h, struct tdm_dweight *d, size_t *bytes, const char *what, int layer)
{
    if (tdm_dweight_upload(h, d) != 0) return tdm_err_prefix("CUDA engine: layer %d mlp.%s", layer, what);
    *bytes += (size_t)tdm_qweight_bytes(h);
    return 0;
}

static void *act_alloc(size_t bytes, size_t *count, const char *what)
{
    void *p;
    if (tdm_cuda_malloc(&p, bytes) != 0) {
        tdm_err_prefix("CUDA engine: %s (%.1f MB)", what, bytes / 1e6);
        return NULL;
    }
    *count += bytes;
    return p;
}

static void layer_free(struct moe_layer *d)
{
    if (!d) return;
    tdm_dweight_free(&d->router);
    tdm_dweight_free(&d->sh_gate);
    tdm_dweight_free(&d->sh_up);
    tdm_dweight_free(&d->sh_down);
    tdm_dweight_free(&d->shared_gate);
    tdm_moe_experts_free(&d->ex);
    free(d);
}

void tdm_emoe_free(struct tdm_emoe *x)
{
    if (!x) return;
    for (int i = 0; x->ly && i <= x->m->cfg.n_layers; i++) layer_free(x->ly[i]);
    free(x->ly);
    tdm_cuda_free(x->logits);
    tdm_cuda_free(x->sel);
    tdm_cuda_free(x->w);
    tdm_cuda_free(x->scratch);
    tdm_cuda_free(x->group);
    tdm_cuda_free(x->g);
    tdm_cuda_free(x->u);
    tdm_cuda_free(x->sh);
    tdm_cuda_free(x->gate);
    free(x);
}

static int upload_layer(struct tdm_emoe *x, int i, const struct tdm_moe *moe, size_t *weights)
{
    struct moe_layer *d = calloc(1, sizeof *d);
    if (!d) return tdm_errf("CUDA engine: out of host memory");
    x->ly[i] = d;
    if (up_w(&moe->router, &d->router, weights, "gate (router)", i) ||
        up_w(&moe->shared.gate, &d->sh_gate, weights, "shared_expert.gate_proj", i) ||
        up_w(&moe->shared.up, &d->sh_up, weights, "shared_expert.up_proj", i) ||
        up_w(&moe->shared.down, &d->sh_down, weights, "shared_expert.down_proj", i) ||
        up_w(&moe->shared_gate, &d->shared_gate, weights, "shared_expert_gate", i))
        return -1;
    if (tdm_moe_experts_upload(moe->experts, x->m->cfg.n_experts, &d->ex) != 0)
        return tdm_err_prefix("CUDA engine: layer %d mlp", i);
    *weights += d->ex.bytes;
    return 0;
}

struct tdm_emoe *tdm_emoe_new(const struct tdm_model *m, int rows, size_t *weights, size_t *act)
{
    const struct tdm_config *c = &m->cfg;
    struct tdm_emoe *x = calloc(1, sizeof *x);
    if (!x || !(x->ly = calloc((size_t)c->n_layers + 1, sizeof *x->ly))) {
        free(x);
        tdm_errf("CUDA engine: out of host memory");
        return NULL;
    }
    x->m = m;
    x->rows = rows;
    int any = 0;
    for (int i = 0; i < c->n_layers; i++) {
        if (!m->layers[i].is_moe) continue;
        any = 1;
        if (upload_layer(x, i, &m->layers[i].moe, weights) != 0) goto fail;
    }
    if (!any) return x;
    const size_t R = (size_t)rows, H = (size_t)c->hidden, E = (size_t)c->n_experts, k = (size_t)c->top_k;
    const size_t Is = (size_t)c->shared_intermediate;
    if (!(x->logits = act_alloc(R * E * 2, act, "router logits")) || !(x->sel = act_alloc(R * k * 4, act, "routing")) ||
        !(x->w = act_alloc(R * k * 2, act, "routing")) ||
        !(x->scratch = act_alloc(tdm_moe_scratch_bytes(rows, c->top_k, c->hidden, c->moe_intermediate), act,
                                 "expert activations")) ||
        !(x->g = act_alloc(R * Is * 2, act, "shared expert activations")) ||
        !(x->u = act_alloc(R * Is * 2, act, "shared expert activations")) ||
        !(x->sh = act_alloc(R * H * 2, act, "shared expert activations")) ||
        !(x->gate = act_alloc(R * 4, act, "shared expert activations")) ||
        (rows > TDM_ENGINE_MAX_ROWS &&
         !(x->group = act_alloc(tdm_moe_group_bytes(rows, c->top_k, c->n_experts), act, "expert grouping"))))
        goto fail;
    return x;
fail:
    tdm_emoe_free(x);
    return NULL;
}

int tdm_emoe_upload_mtp(struct tdm_emoe *x, size_t *weights)
{
    const struct tdm_model *m = x->m;
    const int L = m->cfg.n_layers;
    if (!m->has_mtp || !m->mtp.layer.is_moe) return tdm_errf("CUDA engine: the MTP layer has no MoE MLP");
    if (x->ly[L]) return 0;
    if (!x->logits) /* the activations exist when a main layer is MoE (every layout with an MoE MTP layer) */
        return tdm_errf("%s: an MoE MTP layer on a model without MoE layers: not supported by the CUDA engine", m->dir);
    if (tdm_moe_experts_check(m->mtp.layer.moe.experts, m->cfg.n_experts) != 0)
        return tdm_err_prefix("%s: mtp.layers.0 mlp", m->dir);
    if (upload_layer(x, L, &m->mtp.layer.moe, weights) != 0) {
        layer_free(x->ly[L]);
        x->ly[L] = NULL;
        return tdm_err_prefix("MTP layer (slot %d)", L);
    }
    return 0;
}

int tdm_emoe_forward(struct tdm_emoe *x, int layer, const uint16_t *xn, const uint16_t *xnb, int M, uint16_t *y,
                     const struct tdm_tiles *tiles, void *stream, const struct tdm_emoe_side *side)
{
    const struct tdm_config *c = &x->m->cfg;
    const struct moe_layer *d = layer >= 0 && layer <= c->n_layers ? x->ly[layer] : NULL;
    if (!d) return tdm_errf("CUDA engine: layer %d has no MoE weights on the device", layer);
    if (M < 1 || M > x->rows) return tdm_errf("CUDA engine: MoE of %d rows (at most %d)", M, x->rows);
    if (side && M > TDM_ENGINE_MAX_ROWS)
        return tdm_errf("CUDA engine: MoE of %d rows on two streams (at most %d)", M, TDM_ENGINE_MAX_ROWS);
    const int H = c->hidden, E = c->n_experts, k = c->top_k, I = c->moe_intermediate;
    const int64_t Is = d->sh_gate.n;
    int32_t *order = tdm_moe_scratch_order(x->scratch);
    uint16_t *act = tdm_moe_scratch_act(x->scratch, M, k), *ye = tdm_moe_scratch_out(x->scratch, M, k, I);
    void *ss = side ? side->stream : stream; /* the shared expert's stream */
    if (side && tdm_stream_after(ss, stream, side->fork) != 0) return tdm_err_prefix("layer %d MoE", layer);
    const int bad =
        tdm_matmul_xb(&d->sh_gate, xn, H, xnb, M, x->g, Is, TDM_MM_BF16, tiles, ss) ||
        tdm_matmul_xb(&d->sh_up, xn, H, xnb, M, x->u, Is, TDM_MM_BF16, tiles, ss) ||
        tdm_silu_mul(x->g, x->u, Is, M, x->g, NULL, ss) ||
        tdm_matmul(&d->sh_down, x->g, Is, M, x->sh, H, TDM_MM_BF16, tiles, ss) ||
        tdm_moe_shared_gate(&d->shared_gate, xn, H, M, H, x->gate, ss) ||
        tdm_matmul_xb(&d->router, xn, H, xnb, M, x->logits, E, TDM_MM_BF16, tiles, stream) ||
        tdm_moe_route(x->logits, E, M, E, k, c->norm_topk, x->sel, x->w, stream) ||
        (M > TDM_ENGINE_MAX_ROWS
             ? tdm_moe_group(x->sel, M, k, E, x->group, stream) ||
                   tdm_moe_gate_up_grouped(&d->ex, xn, H, M, k, x->group, act, stream) ||
                   tdm_moe_down_grouped(&d->ex, act, M, k, x->group, ye, stream)
             : tdm_moe_order(x->sel, M, k, order, stream) ||
                   tdm_moe_gate_up(&d->ex, xn, H, M, k, order, act, stream) ||
                   tdm_moe_down(&d->ex, act, M, k, order, ye, stream));
    /* a capture must join every stream it forked, a failed launch's too */
    if ((side && tdm_stream_after(stream, ss, side->join) != 0) || bad ||
        tdm_moe_combine(ye, x->w, x->sel, M, k, H, x->gate, x->sh, H, y, H, stream))
        return tdm_err_prefix("layer %d MoE", layer);
    return 0;
}
