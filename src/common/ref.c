/* ref.c — the CPU reference forward of models.md. Values between steps are FP32 arrays holding
 * BF16-representable numbers wherever transformers rounds to BF16 ("->bf16" in models.md). */
#include "ref.h"
#include "err.h"
#include "formats.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct tdm_ref {
    const struct tdm_model *m;
    int ctx, pos, mtp_pos;
    int *slot;          /* per layer: index among the attention or among the GDN layers */
    int n_attn, n_gdn;
    float **k, **v;     /* [n_attn + 1][ctx][Hkv D]; the last is the MTP layer's */
    float **conv;       /* [n_gdn][K-1][conv_dim]: the last K-1 conv inputs, oldest first */
    float **S;          /* [n_gdn][Hv][Dk][Dv] */
    float *gap, *mtp_gap; /* [ctx]: per position, the smallest router margin of any MoE layer */
};

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) { fprintf(stderr, "tandem: out of memory (%zu bytes)\n", n); abort(); }
    return p;
}
static void *xcalloc(size_t n, size_t s)
{
    void *p = calloc(n ? n : 1, s ? s : 1);
    if (!p) { fprintf(stderr, "tandem: out of memory (%zu bytes)\n", n * s); abort(); }
    return p;
}

static float bf(float x) { return tdm_bf16r(x); }
static void round_bf16(float *x, size_t n) { for (size_t i = 0; i < n; i++) x[i] = bf(x[i]); }
static float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }
static float siluf(float x) { return x / (1.0f + expf(-x)); }
static float softplusf(float x) { return x > 20.0f ? x : log1pf(expf(x)); } /* torch's threshold 20 */

/* ---- building blocks ---- */

void tdm_ref_rmsnorm(const float *x, const float *w, int n, float eps, float *y)
{
    float r = 1.0f / sqrtf(tdm_dot(x, x, n) / (float)n + eps);
    for (int i = 0; i < n; i++) y[i] = bf(x[i] * r * (1.0f + w[i]));
}

void tdm_ref_linear_bf16(const struct tdm_qweight *w, const float *x, int m, float *y)
{
    tdm_linear_ref(w, x, m, y);
    round_bf16(y, (size_t)m * (size_t)w->n);
}

/* L2 normalisation of q and k per head, in FP32. models.md says transformers' fallback normalises
 * the BF16 tensors; the fixtures' oracle (transformers 5.17, torch 2.11) does it in FP32 — measured:
 * with FP32 norms and a BF16 beta, layer 0's gated-norm output matches it in 99.7 % of elements,
 * against 59 % with BF16-rounded norms. */
static void l2norm(float *x, int n)
{
    float inv = 1.0f / sqrtf(tdm_dot(x, x, n) + 1e-6f);
    for (int i = 0; i < n; i++) x[i] *= inv;
}

/* ---- state ---- */

struct tdm_ref *tdm_ref_new(const struct tdm_model *m, int ctx)
{
    const struct tdm_config *c = &m->cfg;
    struct tdm_ref *r = xcalloc(1, sizeof *r);
    r->m = m;
    r->ctx = ctx;
    r->slot = xcalloc((size_t)c->n_layers, sizeof *r->slot);
    for (int i = 0; i < c->n_layers; i++) r->slot[i] = c->mixer[i] == TDM_MIXER_ATTN ? r->n_attn++ : r->n_gdn++;
    size_t kv = (size_t)ctx * (size_t)c->n_kv_heads * (size_t)c->head_dim;
    r->k = xcalloc((size_t)r->n_attn + 1, sizeof *r->k);
    r->v = xcalloc((size_t)r->n_attn + 1, sizeof *r->v);
    for (int i = 0; i < r->n_attn + (m->has_mtp ? 1 : 0); i++) {
        r->k[i] = xcalloc(kv, sizeof(float));
        r->v[i] = xcalloc(kv, sizeof(float));
    }
    r->gap = xmalloc((size_t)ctx * sizeof(float));
    r->mtp_gap = xmalloc((size_t)ctx * sizeof(float));
    for (int i = 0; i < ctx; i++) r->gap[i] = r->mtp_gap[i] = INFINITY;
    r->conv = xcalloc((size_t)r->n_gdn, sizeof *r->conv);
    r->S = xcalloc((size_t)r->n_gdn, sizeof *r->S);
    for (int i = 0; i < r->n_gdn; i++) {
        r->conv[i] = xcalloc((size_t)(c->conv_kernel - 1) * (size_t)tdm_gdn_conv_dim(c), sizeof(float));
        r->S[i] = xcalloc((size_t)c->gdn_v_heads * (size_t)c->gdn_k_dim * (size_t)c->gdn_v_dim, sizeof(float));
    }
    return r;
}

void tdm_ref_free(struct tdm_ref *r)
{
    if (!r) return;
    for (int i = 0; i <= r->n_attn; i++) { free(r->k[i]); free(r->v[i]); }
    for (int i = 0; i < r->n_gdn; i++) { free(r->conv[i]); free(r->S[i]); }
    free(r->k); free(r->v); free(r->conv); free(r->S); free(r->slot); free(r->gap); free(r->mtp_gap);
    free(r);
}

int tdm_ref_pos(const struct tdm_ref *r) { return r->pos; }

const float *tdm_ref_router_gaps(const struct tdm_ref *r, int mtp) { return mtp ? r->mtp_gap : r->gap; }

/* ---- Gated DeltaNet ---- */

void tdm_ref_gdn_conv(const float *conv_w, int C, int K, float *cs, const float *mixed, int T, float *conv)
{
    for (int t = 0; t < T; t++)
        for (int ch = 0; ch < C; ch++) {
            float acc = 0.0f;
            for (int j = 0; j < K; j++) {
                int s = t - (K - 1) + j;
                float in = s >= 0 ? mixed[(size_t)s * C + ch] : cs[(size_t)(K - 1 + s) * C + ch];
                acc += conv_w[(size_t)ch * K + j] * in;
            }
            conv[(size_t)t * C + ch] = bf(siluf(bf(acc)));
        }
    /* the new conv state: the last K-1 inputs of (state ++ this chunk) */
    for (int j = 0; j < K - 1; j++) {
        int s = T - (K - 1) + j;
        float *dst = cs + (size_t)j * C;
        if (s >= 0) memcpy(dst, mixed + (size_t)s * C, (size_t)C * sizeof(float));
        else memcpy(dst, cs + (size_t)(j + T) * C, (size_t)C * sizeof(float)); /* j + T < K - 1: shift */
    }
}

void tdm_ref_gdn_token(int Hk, int Hv, int Dk, int Dv, const float *A_log, const float *dt_bias, const float *ct,
                       const float *bt, const float *at, float *S_all, float *o, float *scratch)
{
    const int rep = Hv / Hk;
    float *qn = scratch, *kn = scratch + Hk * Dk, *kv = scratch + 2 * Hk * Dk;
    const float qscale = 1.0f / sqrtf((float)Dk);
    memcpy(qn, ct, (size_t)Hk * Dk * sizeof(float));
    memcpy(kn, ct + Hk * Dk, (size_t)Hk * Dk * sizeof(float));
    for (int h = 0; h < Hk; h++) {
        l2norm(qn + h * Dk, Dk);
        l2norm(kn + h * Dk, Dk);
    }
    for (int i = 0; i < Hk * Dk; i++) qn[i] *= qscale;
    for (int h = 0; h < Hv; h++) {
        const float beta = bf(sigmoidf(bt[h]));
        const float gt = -expf(A_log[h]) * softplusf(at[h] + dt_bias[h]);
        const float decay = expf(gt);
        const float *q = qn + (h / rep) * Dk, *k = kn + (h / rep) * Dk, *v = ct + 2 * Hk * Dk + h * Dv;
        float *S = S_all + (size_t)h * Dk * Dv;
        for (int i = 0; i < Dk * Dv; i++) S[i] *= decay;
        for (int j = 0; j < Dv; j++) kv[j] = 0.0f;
        for (int i = 0; i < Dk; i++)
            for (int j = 0; j < Dv; j++) kv[j] += S[i * Dv + j] * k[i];
        for (int j = 0; j < Dv; j++) kv[j] = (v[j] - kv[j]) * beta;
        for (int i = 0; i < Dk; i++)
            for (int j = 0; j < Dv; j++) S[i * Dv + j] += k[i] * kv[j];
        float *ot = o + (size_t)h * Dv;
        for (int j = 0; j < Dv; j++) ot[j] = 0.0f;
        for (int i = 0; i < Dk; i++)
            for (int j = 0; j < Dv; j++) ot[j] += S[i * Dv + j] * q[i];
    }
}

/* 6. gated RMSNorm (not centred): norm ->bf16, * w ->bf16, * silu(z) ->bf16 */
void tdm_ref_gated_norm(float *ot, const float *zt, const float *w, int Dv, float eps)
{
    for (int j = 0; j < Dv; j++) ot[j] = bf(ot[j]);
    float rr = 1.0f / sqrtf(tdm_dot(ot, ot, Dv) / (float)Dv + eps);
    for (int j = 0; j < Dv; j++) ot[j] = bf(bf(bf(ot[j] * rr) * w[j]) * siluf(zt[j]));
}

static void gdn_forward(struct tdm_ref *r, const struct tdm_gdn *g, int slot, const float *x, int T, float *out)
{
    const struct tdm_config *c = &r->m->cfg;
    const int H = c->hidden, Hk = c->gdn_k_heads, Hv = c->gdn_v_heads, Dk = c->gdn_k_dim, Dv = c->gdn_v_dim;
    const int C = tdm_gdn_conv_dim(c), K = c->conv_kernel, rep = Hv / Hk;
    float *mixed = xmalloc((size_t)T * C * sizeof(float)), *z = xmalloc((size_t)T * Hv * Dv * sizeof(float));
    float *bb = xmalloc((size_t)T * Hv * sizeof(float)), *aa = xmalloc((size_t)T * Hv * sizeof(float));

    /* 1. projections, in conv order [q | k | v] */
    if (g->grouped) {
        const int W = 2 * Dk + 2 * rep * Dv;
        float *qkvz = xmalloc((size_t)T * Hk * W * sizeof(float)), *ba = xmalloc((size_t)T * 2 * Hv * sizeof(float));
        tdm_ref_linear_bf16(&g->qkvz, x, T, qkvz);
        tdm_ref_linear_bf16(&g->ba, x, T, ba);
        for (int t = 0; t < T; t++)
            for (int grp = 0; grp < Hk; grp++) {
                const float *src = qkvz + (size_t)t * Hk * W + (size_t)grp * W;
                float *mt = mixed + (size_t)t * C;
                memcpy(mt + grp * Dk, src, (size_t)Dk * sizeof(float));
                memcpy(mt + Hk * Dk + grp * Dk, src + Dk, (size_t)Dk * sizeof(float));
                memcpy(mt + 2 * Hk * Dk + grp * rep * Dv, src + 2 * Dk, (size_t)rep * Dv * sizeof(float));
                memcpy(z + (size_t)t * Hv * Dv + (size_t)grp * rep * Dv, src + 2 * Dk + rep * Dv, (size_t)rep * Dv * sizeof(float));
                const float *bsrc = ba + (size_t)t * 2 * Hv + (size_t)grp * 2 * rep;
                memcpy(bb + (size_t)t * Hv + grp * rep, bsrc, (size_t)rep * sizeof(float));
                memcpy(aa + (size_t)t * Hv + grp * rep, bsrc + rep, (size_t)rep * sizeof(float));
            }
        free(qkvz);
        free(ba);
    } else {
        tdm_ref_linear_bf16(&g->qkv, x, T, mixed);
        tdm_ref_linear_bf16(&g->z, x, T, z);
        tdm_ref_linear_bf16(&g->b, x, T, bb);
        tdm_ref_linear_bf16(&g->a, x, T, aa);
    }

    /* 2. causal depthwise conv over [q | k | v] with the cached inputs, ->bf16, silu ->bf16 */
    float *conv = xmalloc((size_t)T * C * sizeof(float));
    tdm_ref_gdn_conv(g->conv_w, C, K, r->conv[slot], mixed, T, conv);

    /* 3-5. gates, L2 norms, the delta rule per value head; 6. the gated norm per head */
    float *o = xmalloc((size_t)T * Hv * Dv * sizeof(float));
    float *scratch = xmalloc((size_t)(2 * Hk * Dk + Dv) * sizeof(float));
    for (int t = 0; t < T; t++) {
        float *ot = o + (size_t)t * Hv * Dv;
        tdm_ref_gdn_token(Hk, Hv, Dk, Dv, g->A_log, g->dt_bias, conv + (size_t)t * C, bb + (size_t)t * Hv,
                          aa + (size_t)t * Hv, r->S[slot], ot, scratch);
        for (int h = 0; h < Hv; h++)
            tdm_ref_gated_norm(ot + (size_t)h * Dv, z + (size_t)t * Hv * Dv + (size_t)h * Dv, g->norm_w, Dv, c->rms_eps);
    }
    tdm_ref_linear_bf16(&g->out, o, T, out);
    (void)H;
    free(mixed); free(z); free(bb); free(aa); free(conv); free(o); free(scratch);
}

/* ---- gated attention ---- */

void tdm_ref_rope_bf16(float *x, int R, int pos, double theta)
{
    for (int i = 0; i < R / 2; i++) {
        float inv = 1.0f / powf((float)theta, (float)(2 * i) / (float)R);
        float ang = (float)pos * inv;
        float cs = bf(cosf(ang)), sn = bf(sinf(ang));
        float a = x[i], b = x[i + R / 2];
        x[i] = bf(bf(a * cs) + bf(-b * sn));
        x[i + R / 2] = bf(bf(b * cs) + bf(a * sn));
    }
}

void tdm_ref_attn_head(const float *q, const float *gate, const float *kc, const float *vc, size_t row, int n, int D,
                       float *p, float *o)
{
    const float scale = 1.0f / sqrtf((float)D);
    float mx = -INFINITY, sum = 0.0f;
    for (int j = 0; j < n; j++) {
        p[j] = tdm_dot(q, kc + (size_t)j * row, D) * scale;
        mx = fmaxf(mx, p[j]);
    }
    /* Flash-attention rounding, as transformers' SDPA path computes it: the unnormalised
     * probabilities exp(s - max) enter the product with V in BF16, the sum that divides them
     * stays FP32. Measured against transformers: this halves an attention layer's distance
     * (0.31 % -> 0.14 % of the layer output) compared with FP32 probabilities. */
    for (int j = 0; j < n; j++) { p[j] = expf(p[j] - mx); sum += p[j]; }
    for (int d = 0; d < D; d++) o[d] = 0.0f;
    for (int j = 0; j < n; j++) {
        const float *vj = vc + (size_t)j * row;
        const float pj = bf(p[j]);
        for (int d = 0; d < D; d++) o[d] += pj * vj[d];
    }
    for (int d = 0; d < D; d++) o[d] /= sum;
    for (int d = 0; d < D; d++) o[d] = bf(bf(o[d]) * bf(sigmoidf(gate[d])));
}

static int attn_forward(struct tdm_ref *r, const struct tdm_attn *at, int slot, const float *x, int T, int pos0, float *out)
{
    const struct tdm_config *c = &r->m->cfg;
    const int Hq = c->n_q_heads, Hkv = c->n_kv_heads, D = c->head_dim, grp = Hq / Hkv;
    if (pos0 + T > r->ctx) return tdm_errf("context full: %d + %d tokens exceed --ctx %d", pos0, T, r->ctx);
    float *qg = xmalloc((size_t)T * Hq * 2 * D * sizeof(float));
    float *kk = xmalloc((size_t)T * Hkv * D * sizeof(float)), *vv = xmalloc((size_t)T * Hkv * D * sizeof(float));
    tdm_ref_linear_bf16(&at->q, x, T, qg);
    tdm_ref_linear_bf16(&at->k, x, T, kk);
    tdm_ref_linear_bf16(&at->v, x, T, vv);
    float *tmp = xmalloc((size_t)D * sizeof(float));
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < Hq; h++) {
            float *q = qg + ((size_t)t * Hq + h) * 2 * D;
            tdm_ref_rmsnorm(q, at->q_norm, D, c->rms_eps, tmp);
            memcpy(q, tmp, (size_t)D * sizeof(float));
            tdm_ref_rope_bf16(q, c->rotary_dim, pos0 + t, c->rope_theta);
        }
        for (int h = 0; h < Hkv; h++) {
            float *k = kk + ((size_t)t * Hkv + h) * D;
            tdm_ref_rmsnorm(k, at->k_norm, D, c->rms_eps, tmp);
            memcpy(k, tmp, (size_t)D * sizeof(float));
            tdm_ref_rope_bf16(k, c->rotary_dim, pos0 + t, c->rope_theta);
        }
    }
    const size_t row = (size_t)Hkv * D;
    memcpy(r->k[slot] + (size_t)pos0 * row, kk, (size_t)T * row * sizeof(float));
    memcpy(r->v[slot] + (size_t)pos0 * row, vv, (size_t)T * row * sizeof(float));
    float *att = xmalloc((size_t)T * Hq * D * sizeof(float)), *p = xmalloc((size_t)(pos0 + T) * sizeof(float));
    for (int t = 0; t < T; t++)
        for (int h = 0; h < Hq; h++) {
            const float *q = qg + ((size_t)t * Hq + h) * 2 * D;
            const int kvh = h / grp, n = pos0 + t + 1;
            tdm_ref_attn_head(q, q + D, r->k[slot] + (size_t)kvh * D, r->v[slot] + (size_t)kvh * D, row, n, D, p,
                              att + ((size_t)t * Hq + h) * D);
        }
    tdm_ref_linear_bf16(&at->o, att, T, out);
    free(qg); free(kk); free(vv); free(tmp); free(att); free(p);
    return 0;
}

/* ---- MLPs ---- */

static void mlp_forward(const struct tdm_mlp *mlp, const float *x, int T, float *out)
{
    const int64_t I = mlp->gate.n;
    float *gt = xmalloc((size_t)(T * I) * sizeof(float)), *up = xmalloc((size_t)(T * I) * sizeof(float));
    tdm_ref_linear_bf16(&mlp->gate, x, T, gt);
    tdm_ref_linear_bf16(&mlp->up, x, T, up);
    for (int64_t i = 0; i < T * I; i++) gt[i] = bf(bf(siluf(gt[i])) * up[i]);
    tdm_ref_linear_bf16(&mlp->down, gt, T, out);
    free(gt);
    free(up);
}

void tdm_ref_route(const float *rl, int E, int k, int norm_topk, float *p, int *sel, float *w)
{
    float mx = -INFINITY, sum = 0.0f;
    for (int e = 0; e < E; e++) mx = fmaxf(mx, rl[e]);
    for (int e = 0; e < E; e++) { p[e] = expf(rl[e] - mx); sum += p[e]; }
    for (int e = 0; e < E; e++) p[e] /= sum;
    /* top-k by probability, ties to the lower expert id */
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int i = 0; i < j; i++) taken |= sel[i] == e;
            if (!taken && (best < 0 || p[e] > p[best])) best = e;
        }
        sel[j] = best;
        w[j] = p[best];
    }
    if (norm_topk) {
        float s = 0.0f;
        for (int j = 0; j < k; j++) s += w[j];
        for (int j = 0; j < k; j++) w[j] /= s;
    }
    /* The weights are rounded to BF16 before they scale the experts' outputs. models.md says
     * transformers multiplies by p in FP32; the fixtures' oracle (transformers 5.17) rounds p
     * first — measured: layer 0's routed sum matches it bit for bit this way, 60 % otherwise. */
    for (int j = 0; j < k; j++) w[j] = bf(w[j]);
}

static void moe_forward(const struct tdm_model *m, const struct tdm_moe *moe, const float *x, int T, float *out, float *gap)
{
    const struct tdm_config *c = &m->cfg;
    const int H = c->hidden, E = c->n_experts, k = c->top_k;
    float *rl = xmalloc((size_t)T * E * sizeof(float)), *p = xmalloc((size_t)E * sizeof(float));
    float *y = xmalloc((size_t)H * sizeof(float)), *sh = xmalloc((size_t)T * H * sizeof(float));
    int *sel = xmalloc((size_t)k * sizeof(int));
    float *w = xmalloc((size_t)k * sizeof(float)), sg;
    tdm_ref_linear_bf16(&moe->router, x, T, rl);
    mlp_forward(&moe->shared, x, T, sh);
    for (int t = 0; t < T; t++) {
        const float *xt = x + (size_t)t * H;
        tdm_ref_route(rl + (size_t)t * E, E, k, c->norm_topk, p, sel, w);
        /* the router margin: the k-th chosen logit over the best one left out */
        if (gap && k < E) {
            float out_best = -INFINITY;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int i = 0; i < k; i++) taken |= sel[i] == e;
                if (!taken) out_best = fmaxf(out_best, rl[(size_t)t * E + e]);
            }
            gap[t] = fminf(gap[t], rl[(size_t)t * E + sel[k - 1]] - out_best);
        }
        /* the experts' contributions added in BF16, ascending expert id */
        float *o = out + (size_t)t * H;
        for (int i = 0; i < H; i++) o[i] = 0.0f;
        for (int e = 0; e < E; e++)
            for (int j = 0; j < k; j++) {
                if (sel[j] != e) continue;
                mlp_forward(&moe->experts[e], xt, 1, y);
                for (int i = 0; i < H; i++) o[i] = bf(o[i] + bf(y[i] * w[j]));
            }
        tdm_ref_linear_bf16(&moe->shared_gate, xt, 1, &sg);
        sg = bf(sigmoidf(sg));
        for (int i = 0; i < H; i++) o[i] = bf(o[i] + bf(sg * sh[(size_t)t * H + i]));
    }
    free(rl); free(p); free(y); free(sh); free(sel); free(w);
}

/* ---- decoder layer ---- */

static int layer_forward(struct tdm_ref *r, const struct tdm_layer *l, int slot, float *h, int T, int pos0, float *gap)
{
    const struct tdm_config *c = &r->m->cfg;
    const int H = c->hidden;
    float *xn = xmalloc((size_t)T * H * sizeof(float)), *y = xmalloc((size_t)T * H * sizeof(float));
    for (int t = 0; t < T; t++) tdm_ref_rmsnorm(h + (size_t)t * H, l->in_norm, H, c->rms_eps, xn + (size_t)t * H);
    int rc = 0;
    if (l->mixer == TDM_MIXER_GDN) gdn_forward(r, &l->gdn, slot, xn, T, y);
    else rc = attn_forward(r, &l->attn, slot, xn, T, pos0, y);
    if (rc == 0) {
        for (size_t i = 0; i < (size_t)T * H; i++) h[i] = bf(h[i] + y[i]);
        for (int t = 0; t < T; t++) tdm_ref_rmsnorm(h + (size_t)t * H, l->post_norm, H, c->rms_eps, xn + (size_t)t * H);
        if (l->is_moe) moe_forward(r->m, &l->moe, xn, T, y, gap);
        else mlp_forward(&l->mlp, xn, T, y);
        for (size_t i = 0; i < (size_t)T * H; i++) h[i] = bf(h[i] + y[i]);
    }
    free(xn);
    free(y);
    return rc;
}

static void head_forward(const struct tdm_model *m, const float *xn, int T, float *logits)
{
    tdm_linear_ref(&m->head, xn, T, logits); /* FP32 logits */
}

int tdm_ref_forward(struct tdm_ref *r, const int32_t *ids, int T, int logits_from, float *logits,
                    float *hidden, float *final_h)
{
    const struct tdm_model *m = r->m;
    const struct tdm_config *c = &m->cfg;
    const int H = c->hidden, L = c->n_layers;
    if (T <= 0) return 0;
    if (r->pos + T > r->ctx) return tdm_errf("context full: %d + %d tokens exceed --ctx %d", r->pos, T, r->ctx);
    for (int t = 0; t < T; t++)
        if (ids[t] < 0 || ids[t] >= c->vocab) return tdm_errf("token id %d is out of the vocabulary (%d ids)", ids[t], c->vocab);
    float *h = xmalloc((size_t)T * H * sizeof(float));
    for (int t = 0; t < T; t++) tdm_qweight_row(&m->embed, ids[t], h + (size_t)t * H);
    if (hidden) memcpy(hidden, h, (size_t)T * H * sizeof(float));
    for (int i = 0; i < L; i++) {
        if (layer_forward(r, &m->layers[i], r->slot[i], h, T, r->pos, r->gap + r->pos) != 0) { free(h); return -1; }
        if (hidden) memcpy(hidden + (size_t)(i + 1) * T * H, h, (size_t)T * H * sizeof(float));
    }
    float *xn = xmalloc((size_t)T * H * sizeof(float));
    for (int t = 0; t < T; t++) tdm_ref_rmsnorm(h + (size_t)t * H, m->final_norm, H, c->rms_eps, xn + (size_t)t * H);
    if (hidden) memcpy(hidden + (size_t)(L + 1) * T * H, xn, (size_t)T * H * sizeof(float));
    if (final_h) memcpy(final_h, xn, (size_t)T * H * sizeof(float));
    if (logits && logits_from < T) head_forward(m, xn + (size_t)logits_from * H, T - logits_from, logits);
    r->pos += T;
    free(h);
    free(xn);
    return 0;
}

int tdm_ref_mtp(struct tdm_ref *r, const int32_t *next_ids, const float *hfin, int T, float *logits)
{
    const struct tdm_model *m = r->m;
    const struct tdm_config *c = &m->cfg;
    const int H = c->hidden;
    if (!m->has_mtp) return tdm_errf("%s: the checkpoint has no MTP layer", m->dir);
    if (T <= 0) return 0;
    if (r->mtp_pos + T > r->ctx) return tdm_errf("context full: MTP %d + %d tokens exceed --ctx %d", r->mtp_pos, T, r->ctx);
    const struct tdm_mtp *mt = &m->mtp;
    float *cat = xmalloc((size_t)T * 2 * H * sizeof(float)), *e = xmalloc((size_t)H * sizeof(float));
    float *x = xmalloc((size_t)T * H * sizeof(float));
    for (int t = 0; t < T; t++) {
        if (next_ids[t] < 0 || next_ids[t] >= c->vocab) {
            free(cat); free(e); free(x);
            return tdm_errf("token id %d is out of the vocabulary (%d ids)", next_ids[t], c->vocab);
        }
        tdm_qweight_row(&m->embed, next_ids[t], e);
        tdm_ref_rmsnorm(e, mt->pre_fc_norm_embedding, H, c->rms_eps, cat + (size_t)t * 2 * H);
        tdm_ref_rmsnorm(hfin + (size_t)t * H, mt->pre_fc_norm_hidden, H, c->rms_eps, cat + (size_t)t * 2 * H + H);
    }
    tdm_ref_linear_bf16(&mt->fc, cat, T, x);
    int rc = layer_forward(r, &mt->layer, r->n_attn, x, T, r->mtp_pos, r->mtp_gap + r->mtp_pos);
    if (rc == 0) {
        for (int t = 0; t < T; t++) tdm_ref_rmsnorm(x + (size_t)t * H, mt->norm, H, c->rms_eps, cat + (size_t)t * H);
        head_forward(m, cat, T, logits);
        r->mtp_pos += T;
    }
    free(cat); free(e); free(x);
    return rc;
}

int tdm_argmax(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

float tdm_margin(const float *x, int n)
{
    int b = tdm_argmax(x, n);
    float second = -INFINITY;
    for (int i = 0; i < n; i++)
        if (i != b && x[i] > second) second = x[i];
    return x[b] - second;
}
