/* ref.c — the CPU reference forward of models.md. Values between steps are FP32 arrays holding
 * BF16-representable numbers wherever transformers rounds to BF16 ("->bf16" in models.md). */
#include "ref.h"
#include "err.h"
#include "formats.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A GDN layer's pending factors: the last accepted path of a verify round, not yet applied to the
 * stored state (deferred commit, speculative.md). Per path node and value head. */
struct tdm_pend {
    int n, factored;    /* path length (0: nothing pending); tree rounds use the factored update */
    float *g, *P;       /* [MAX][Hv]: log-decay, cumulative log-decay along the path */
    float *k, *u;       /* [MAX][Hv][Dk], [MAX][Hv][Dv] */
};

/* One verify round: its nodes and the scratch a commit needs, valid until the commit. */
struct tdm_verify {
    int n, factored, valid;
    int parent[TDM_SPEC_MAX_NODES], depth[TDM_SPEC_MAX_NODES];
    int path[TDM_SPEC_MAX_NODES][TDM_SPEC_MAX_NODES]; /* [t][a]: node t's ancestor at depth a; [t][depth] = t */
    float **kv_k, **kv_v;           /* [n_attn][MAX][Hkv D]: the nodes' K and V rows */
    float **gdn_in;                 /* [n_gdn][MAX][conv_dim]: the nodes' conv inputs */
    float **fg, **fP, **fk, **fu;   /* [n_gdn][MAX][Hv] (x Dk, x Dv): the nodes' factors */
};

struct tdm_ref {
    const struct tdm_model *m;
    int ctx, pos, mtp_pos;
    int *slot;          /* per layer: index among the attention or among the GDN layers */
    int n_attn, n_gdn;
    float **k, **v;     /* [n_attn + 1][ctx][Hkv D]; the last is the MTP layer's */
    float **conv;       /* [n_gdn][K-1][conv_dim]: the last K-1 conv inputs, oldest first */
    float **S;          /* [n_gdn][Hv][Dk][Dv] */
    float *gap, *mtp_gap; /* [ctx]: per position, the smallest router margin of any MoE layer */
    struct tdm_pend *pend;      /* [n_gdn] */
    struct tdm_verify *vr_mem;  /* allocated at the first verify */
    struct tdm_verify *vr;      /* non-NULL while a verify runs the layers */
    int defer;
    struct tdm_ref_stats stats;
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

static void verify_free(struct tdm_ref *r);

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
    r->pend = xcalloc((size_t)r->n_gdn, sizeof *r->pend);
    r->defer = 1;
    return r;
}

void tdm_ref_free(struct tdm_ref *r)
{
    if (!r) return;
    for (int i = 0; i <= r->n_attn; i++) { free(r->k[i]); free(r->v[i]); }
    for (int i = 0; i < r->n_gdn; i++) {
        free(r->conv[i]); free(r->S[i]);
        free(r->pend[i].g); free(r->pend[i].P); free(r->pend[i].k); free(r->pend[i].u);
    }
    verify_free(r);
    free(r->pend);
    free(r->k); free(r->v); free(r->conv); free(r->S); free(r->slot); free(r->gap); free(r->mtp_gap);
    free(r);
}

int tdm_ref_pos(const struct tdm_ref *r) { return r->pos; }

const float *tdm_ref_router_gaps(const struct tdm_ref *r, int mtp) { return mtp ? r->mtp_gap : r->gap; }

/* ---- Gated DeltaNet ---- */

void tdm_ref_gdn_ungroup(int Hk, int Hv, int Dk, int Dv, const float *qkvz, const float *ba, float *mixed, float *z,
                         float *bb, float *aa)
{
    const int rep = Hv / Hk, W = 2 * Dk + 2 * rep * Dv;
    for (int grp = 0; grp < Hk; grp++) {
        const float *src = qkvz + (size_t)grp * W;
        memcpy(mixed + grp * Dk, src, (size_t)Dk * sizeof(float));
        memcpy(mixed + Hk * Dk + grp * Dk, src + Dk, (size_t)Dk * sizeof(float));
        memcpy(mixed + 2 * Hk * Dk + grp * rep * Dv, src + 2 * Dk, (size_t)rep * Dv * sizeof(float));
        memcpy(z + (size_t)grp * rep * Dv, src + 2 * Dk + rep * Dv, (size_t)rep * Dv * sizeof(float));
        const float *bsrc = ba + (size_t)grp * 2 * rep;
        memcpy(bb + grp * rep, bsrc, (size_t)rep * sizeof(float));
        memcpy(aa + grp * rep, bsrc + rep, (size_t)rep * sizeof(float));
    }
}

/* Step 1: projections, in conv order [q | k | v], plus z, b, a. */
static void gdn_project(const struct tdm_config *c, const struct tdm_gdn *g, const float *x, int T, float *mixed,
                        float *z, float *bb, float *aa)
{
    const int Hk = c->gdn_k_heads, Hv = c->gdn_v_heads, Dk = c->gdn_k_dim, Dv = c->gdn_v_dim;
    const int C = tdm_gdn_conv_dim(c);
    if (g->grouped) {
        const size_t W = (size_t)2 * Hk * Dk + (size_t)2 * Hv * Dv;
        float *qkvz = xmalloc((size_t)T * W * sizeof(float)), *ba = xmalloc((size_t)T * 2 * Hv * sizeof(float));
        tdm_ref_linear_bf16(&g->qkvz, x, T, qkvz);
        tdm_ref_linear_bf16(&g->ba, x, T, ba);
        for (int t = 0; t < T; t++)
            tdm_ref_gdn_ungroup(Hk, Hv, Dk, Dv, qkvz + (size_t)t * W, ba + (size_t)t * 2 * Hv, mixed + (size_t)t * C,
                                z + (size_t)t * Hv * Dv, bb + (size_t)t * Hv, aa + (size_t)t * Hv);
        free(qkvz);
        free(ba);
    } else {
        tdm_ref_linear_bf16(&g->qkv, x, T, mixed);
        tdm_ref_linear_bf16(&g->z, x, T, z);
        tdm_ref_linear_bf16(&g->b, x, T, bb);
        tdm_ref_linear_bf16(&g->a, x, T, aa);
    }
}

/* Step 2 for one token: in[j] holds the conv inputs of tap j (oldest first; tap K-1 is the token). */
static void gdn_conv_row(const float *conv_w, int C, int K, const float *const *in, float *out)
{
    for (int ch = 0; ch < C; ch++) {
        float acc = 0.0f;
        for (int j = 0; j < K; j++) acc += conv_w[(size_t)ch * K + j] * in[j][ch];
        out[ch] = bf(siluf(bf(acc)));
    }
}

/* Step 2 for T tokens of one sequence: the conv with the cached inputs cs ([K-1][C]), which it
 * then advances to the last K-1 inputs of (state ++ these tokens). */
void tdm_ref_gdn_conv(const float *conv_w, int C, int K, float *cs, const float *mixed, int T, float *conv)
{
    const float **in = xmalloc((size_t)K * sizeof *in);
    for (int t = 0; t < T; t++) {
        for (int j = 0; j < K; j++) {
            int s = t - (K - 1) + j;
            in[j] = s >= 0 ? mixed + (size_t)s * C : cs + (size_t)(K - 1 + s) * C;
        }
        gdn_conv_row(conv_w, C, K, in, conv + (size_t)t * C);
    }
    free(in);
    for (int j = 0; j < K - 1; j++) {
        int s = T - (K - 1) + j;
        float *dst = cs + (size_t)j * C;
        if (s >= 0) memcpy(dst, mixed + (size_t)s * C, (size_t)C * sizeof(float));
        else memcpy(dst, cs + (size_t)(j + T) * C, (size_t)C * sizeof(float)); /* j + T < K - 1: shift */
    }
}

/* Step 4 for one token: L2-normalised q (scaled by 1/sqrt(Dk)) and k of every key head. */
static void gdn_qk(int Hk, int Dk, const float *ct, float *qn, float *kn)
{
    memcpy(qn, ct, (size_t)Hk * Dk * sizeof(float));
    memcpy(kn, ct + Hk * Dk, (size_t)Hk * Dk * sizeof(float));
    for (int h = 0; h < Hk; h++) {
        l2norm(qn + h * Dk, Dk);
        l2norm(kn + h * Dk, Dk);
    }
    const float qscale = 1.0f / sqrtf((float)Dk);
    for (int i = 0; i < Hk * Dk; i++) qn[i] *= qscale;
}

/* Step 3 for one value head: beta and the log-decay g. */
static float gdn_beta(float b) { return bf(sigmoidf(b)); }
static float gdn_logdecay(const float *A_log, const float *dt_bias, int h, float a) { return -expf(A_log[h]) * softplusf(a + dt_bias[h]); }

/* Step 5, one token and value head, materialised: S = S*decay; u = beta (v - S^T k); S += k u^T;
 * o = S^T q. u may be NULL. Everything that replays a step (chain verify, a chain's deferred
 * commit) goes through these two functions, so it repeats one-token decode's arithmetic. */
static void state_decay_add(float *S, float decay, const float *k, const float *u, int Dk, int Dv)
{
    for (int i = 0; i < Dk * Dv; i++) S[i] *= decay;
    for (int i = 0; i < Dk; i++)
        for (int j = 0; j < Dv; j++) S[i * Dv + j] += k[i] * u[j];
}
static void delta_step(float *S, const float *k, const float *v, const float *q, float beta, float decay, int Dk,
                       int Dv, float *kv, float *ot)
{
    for (int i = 0; i < Dk * Dv; i++) S[i] *= decay;
    for (int j = 0; j < Dv; j++) kv[j] = 0.0f;
    for (int i = 0; i < Dk; i++)
        for (int j = 0; j < Dv; j++) kv[j] += S[i * Dv + j] * k[i];
    for (int j = 0; j < Dv; j++) kv[j] = (v[j] - kv[j]) * beta;
    for (int i = 0; i < Dk; i++)
        for (int j = 0; j < Dv; j++) S[i * Dv + j] += k[i] * kv[j];
    for (int j = 0; j < Dv; j++) ot[j] = 0.0f;
    for (int i = 0; i < Dk; i++)
        for (int j = 0; j < Dv; j++) ot[j] += S[i * Dv + j] * q[i];
}

/* Steps 3-5 for one token, every value head, materialised (one-token decode's arithmetic):
 * ct is the token's conv output [q | k | v], bt/at its b and a; scratch holds 2 Hk Dk + Dv floats. */
void tdm_ref_gdn_token(int Hk, int Hv, int Dk, int Dv, const float *A_log, const float *dt_bias, const float *ct,
                       const float *bt, const float *at, float *S_all, float *o, float *scratch)
{
    const int rep = Hv / Hk;
    float *qn = scratch, *kn = scratch + Hk * Dk, *kv = scratch + 2 * Hk * Dk;
    gdn_qk(Hk, Dk, ct, qn, kn);
    for (int h = 0; h < Hv; h++) {
        const float beta = gdn_beta(bt[h]);
        const float decay = expf(gdn_logdecay(A_log, dt_bias, h, at[h]));
        const float *q = qn + (h / rep) * Dk, *k = kn + (h / rep) * Dk, *v = ct + 2 * Hk * Dk + h * Dv;
        delta_step(S_all + (size_t)h * Dk * Dv, k, v, q, beta, decay, Dk, Dv, kv, o + (size_t)h * Dv);
    }
}

/* S^T x for one head (the factored form's one pass over the entry state). */
static void state_t_mul(const float *S, const float *x, int Dk, int Dv, float *y)
{
    for (int j = 0; j < Dv; j++) y[j] = 0.0f;
    for (int i = 0; i < Dk; i++)
        for (int j = 0; j < Dv; j++) y[j] += S[i * Dv + j] * x[i];
}

/* Step 6: gated RMSNorm (not centred) of one head's output: norm ->bf16, * w ->bf16, * silu(z) ->bf16. */
void tdm_ref_gated_norm(float *ot, const float *zt, const float *w, int Dv, float eps)
{
    for (int j = 0; j < Dv; j++) ot[j] = bf(ot[j]);
    float rr = 1.0f / sqrtf(tdm_dot(ot, ot, Dv) / (float)Dv + eps);
    for (int j = 0; j < Dv; j++) ot[j] = bf(bf(bf(ot[j] * rr) * w[j]) * siluf(zt[j]));
}
static void gdn_gated_norm(const struct tdm_config *c, const struct tdm_gdn *g, float *ot, const float *zt)
{
    tdm_ref_gated_norm(ot, zt, g->norm_w, c->gdn_v_dim, c->rms_eps);
}

static size_t state_bytes(const struct tdm_config *c)
{
    return (size_t)c->gdn_v_heads * (size_t)c->gdn_k_dim * (size_t)c->gdn_v_dim * sizeof(float);
}
static size_t factor_bytes(const struct tdm_config *c, int nodes)
{
    /* what a kernel would keep per node and value head: k (Dk), u (Dv), the log-decay */
    return (size_t)nodes * (size_t)c->gdn_v_heads * ((size_t)c->gdn_k_dim + (size_t)c->gdn_v_dim + 1) * sizeof(float);
}

/* Applies slot's pending factors (the last accepted path) to its stored state, once, the way the
 * path was verified: a chain replays each step (state_decay_add: one-token decode's arithmetic); a
 * tree uses S_new = exp(P_L) S0 + sum_i exp(P_L - P_i) k_i u_i^T (speculative.md). */
static void pend_apply(const struct tdm_config *c, const struct tdm_pend *pd, float *S)
{
    const int Hv = c->gdn_v_heads, Dk = c->gdn_k_dim, Dv = c->gdn_v_dim;
    for (int h = 0; h < Hv; h++) {
        float *Sh = S + (size_t)h * Dk * Dv;
        if (!pd->factored) {
            for (int i = 0; i < pd->n; i++) {
                const size_t f = (size_t)i * Hv + h;
                state_decay_add(Sh, expf(pd->g[f]), pd->k + f * Dk, pd->u + f * Dv, Dk, Dv);
            }
        } else {
            const float PL = pd->P[(size_t)(pd->n - 1) * Hv + h];
            const float eL = expf(PL);
            for (int x = 0; x < Dk * Dv; x++) Sh[x] *= eL;
            for (int i = 0; i < pd->n; i++) {
                const size_t f = (size_t)i * Hv + h;
                const float w = expf(PL - pd->P[f]);
                const float *k = pd->k + f * Dk, *u = pd->u + f * Dv;
                for (int a = 0; a < Dk; a++)
                    for (int b = 0; b < Dv; b++) Sh[a * Dv + b] += w * k[a] * u[b];
            }
        }
    }
}

/* Loads slot's state for use, pending factors applied. Counted as one read, plus one write when
 * factors were pending and the caller does not write the state anyway (a verify). */
static void state_load(struct tdm_ref *r, int slot, int caller_writes)
{
    const struct tdm_config *c = &r->m->cfg;
    r->stats.state_read += (int64_t)state_bytes(c);
    if (r->pend[slot].n) {
        r->stats.factor_read += (int64_t)factor_bytes(c, r->pend[slot].n);
        pend_apply(c, &r->pend[slot], r->S[slot]);
        r->pend[slot].n = 0;
        if (!caller_writes) r->stats.state_written += (int64_t)state_bytes(c);
    }
    if (caller_writes) r->stats.state_written += (int64_t)state_bytes(c);
}

static void gdn_forward(struct tdm_ref *r, const struct tdm_gdn *g, int slot, const float *x, int T, float *out)
{
    const struct tdm_config *c = &r->m->cfg;
    const int Hk = c->gdn_k_heads, Hv = c->gdn_v_heads, Dk = c->gdn_k_dim, Dv = c->gdn_v_dim;
    const int C = tdm_gdn_conv_dim(c), K = c->conv_kernel;
    float *mixed = xmalloc((size_t)T * C * sizeof(float)), *z = xmalloc((size_t)T * Hv * Dv * sizeof(float));
    float *bb = xmalloc((size_t)T * Hv * sizeof(float)), *aa = xmalloc((size_t)T * Hv * sizeof(float));
    gdn_project(c, g, x, T, mixed, z, bb, aa);

    /* 2. causal depthwise conv over [q | k | v] with the cached inputs, ->bf16, silu ->bf16 */
    float *conv = xmalloc((size_t)T * C * sizeof(float));
    tdm_ref_gdn_conv(g->conv_w, C, K, r->conv[slot], mixed, T, conv);

    /* 3-5. gates, L2 norms, the delta rule per value head, from the state with pending factors
     * applied; 6. the gated norm */
    state_load(r, slot, 1);
    float *o = xmalloc((size_t)T * Hv * Dv * sizeof(float));
    float *scratch = xmalloc((size_t)(2 * Hk * Dk + Dv) * sizeof(float));
    for (int t = 0; t < T; t++) {
        float *ot = o + (size_t)t * Hv * Dv;
        tdm_ref_gdn_token(Hk, Hv, Dk, Dv, g->A_log, g->dt_bias, conv + (size_t)t * C, bb + (size_t)t * Hv,
                          aa + (size_t)t * Hv, r->S[slot], ot, scratch);
        for (int h = 0; h < Hv; h++) gdn_gated_norm(c, g, ot + (size_t)h * Dv, z + (size_t)t * Hv * Dv + (size_t)h * Dv);
    }
    tdm_ref_linear_bf16(&g->out, o, T, out);
    free(mixed); free(z); free(bb); free(aa); free(conv); free(o); free(scratch);
}

/* A GDN layer over a verify round's nodes (depth-first, r->vr). Nothing committed is changed
 * except that pending factors are applied on load. The conv of each node reads its own ancestors'
 * inputs and, past the root, the committed conv state. Chain mode replays one-token decode's steps
 * on a scratch copy of the state; tree mode is the factored form of speculative.md, walking the
 * nodes with a stack of one set of factors (k, u, P) per depth. */
static void gdn_verify(struct tdm_ref *r, const struct tdm_gdn *g, int slot, const float *x, float *out)
{
    const struct tdm_config *c = &r->m->cfg;
    struct tdm_verify *vr = r->vr;
    const int n = vr->n;
    const int Hk = c->gdn_k_heads, Hv = c->gdn_v_heads, Dk = c->gdn_k_dim, Dv = c->gdn_v_dim;
    const int C = tdm_gdn_conv_dim(c), K = c->conv_kernel, rep = Hv / Hk;
    float *mixed = vr->gdn_in[slot], *z = xmalloc((size_t)n * Hv * Dv * sizeof(float));
    float *bb = xmalloc((size_t)n * Hv * sizeof(float)), *aa = xmalloc((size_t)n * Hv * sizeof(float));
    gdn_project(c, g, x, n, mixed, z, bb, aa);

    float *cs = r->conv[slot], *conv = xmalloc((size_t)n * C * sizeof(float));
    const float **in = xmalloc((size_t)K * sizeof *in);
    for (int t = 0; t < n; t++) {
        const int d = vr->depth[t];
        for (int j = 0; j < K; j++) {
            int s = d - (K - 1) + j; /* the depth of this tap's token; < 0: committed */
            in[j] = s >= 0 ? mixed + (size_t)vr->path[t][s] * C : cs + (size_t)(K - 1 + s) * C;
        }
        gdn_conv_row(g->conv_w, C, K, in, conv + (size_t)t * C);
    }
    free(in);

    state_load(r, slot, 0);
    const float *S0 = r->S[slot];
    float *o = xmalloc((size_t)n * Hv * Dv * sizeof(float));
    float *qn = xmalloc((size_t)n * Hk * Dk * sizeof(float)), *kn = xmalloc((size_t)n * Hk * Dk * sizeof(float));
    for (int t = 0; t < n; t++) gdn_qk(Hk, Dk, conv + (size_t)t * C, qn + (size_t)t * Hk * Dk, kn + (size_t)t * Hk * Dk);
    float *fg = vr->fg[slot], *fP = vr->fP[slot], *fk = vr->fk[slot], *fu = vr->fu[slot];
    for (int t = 0; t < n; t++)
        for (int h = 0; h < Hv; h++) {
            const size_t f = (size_t)t * Hv + h;
            fg[f] = gdn_logdecay(g->A_log, g->dt_bias, h, aa[f]);
            fP[f] = (vr->parent[t] < 0 ? 0.0f : fP[(size_t)vr->parent[t] * Hv + h]) + fg[f];
            memcpy(fk + f * Dk, kn + (size_t)t * Hk * Dk + (size_t)(h / rep) * Dk, (size_t)Dk * sizeof(float));
        }
    if (!vr->factored) {
        float *S = xmalloc(state_bytes(c));
        memcpy(S, S0, state_bytes(c));
        for (int t = 0; t < n; t++)
            for (int h = 0; h < Hv; h++) {
                const size_t f = (size_t)t * Hv + h;
                const float *v = conv + (size_t)t * C + 2 * Hk * Dk + h * Dv;
                delta_step(S + (size_t)h * Dk * Dv, fk + f * Dk, v, qn + (size_t)t * Hk * Dk + (h / rep) * Dk,
                           gdn_beta(bb[f]), expf(fg[f]), Dk, Dv, fu + f * Dv, o + f * Dv);
            }
        free(S);
    } else {
        /* the stack: entry a holds the factors of the current path's node at depth a */
        float *sk = xmalloc((size_t)TDM_SPEC_MAX_NODES * Dk * sizeof(float));
        float *su = xmalloc((size_t)TDM_SPEC_MAX_NODES * Dv * sizeof(float));
        float sP[TDM_SPEC_MAX_NODES];
        float *s0k = xmalloc((size_t)Dv * sizeof(float)), *s0q = xmalloc((size_t)Dv * sizeof(float));
        for (int h = 0; h < Hv; h++) {
            const float *Sh = S0 + (size_t)h * Dk * Dv;
            for (int t = 0; t < n; t++) {
                const int d = vr->depth[t];
                const size_t f = (size_t)t * Hv + h;
                const float *k = fk + f * Dk, *q = qn + (size_t)t * Hk * Dk + (h / rep) * Dk;
                const float *v = conv + (size_t)t * C + 2 * Hk * Dk + h * Dv;
                const float P = fP[f], eP = expf(P), beta = gdn_beta(bb[f]);
                float *u = fu + f * Dv, *ot = o + f * Dv;
                state_t_mul(Sh, k, Dk, Dv, s0k);
                state_t_mul(Sh, q, Dk, Dv, s0q);
                /* a_n S_p^T k_n = exp(P_n) S0^T k_n + sum over the ancestors i of exp(P_n - P_i) u_i (k_i . k_n) */
                for (int j = 0; j < Dv; j++) u[j] = eP * s0k[j];
                for (int a = 0; a < d; a++) {
                    const float w = expf(P - sP[a]) * tdm_dot(sk + (size_t)a * Dk, k, Dk);
                    for (int j = 0; j < Dv; j++) u[j] += w * su[(size_t)a * Dv + j];
                }
                for (int j = 0; j < Dv; j++) u[j] = (v[j] - u[j]) * beta;
                memcpy(sk + (size_t)d * Dk, k, (size_t)Dk * sizeof(float));
                memcpy(su + (size_t)d * Dv, u, (size_t)Dv * sizeof(float));
                sP[d] = P;
                /* o_n = exp(P_n) S0^T q_n + sum over the path, n included, of exp(P_n - P_i) u_i (k_i . q_n) */
                for (int j = 0; j < Dv; j++) ot[j] = eP * s0q[j];
                for (int a = 0; a <= d; a++) {
                    const float w = expf(P - sP[a]) * tdm_dot(sk + (size_t)a * Dk, q, Dk);
                    for (int j = 0; j < Dv; j++) ot[j] += w * su[(size_t)a * Dv + j];
                }
            }
        }
        free(sk);
        free(su);
        free(s0k);
        free(s0q);
    }
    for (int t = 0; t < n; t++)
        for (int h = 0; h < Hv; h++) gdn_gated_norm(c, g, o + ((size_t)t * Hv + h) * Dv, z + ((size_t)t * Hv + h) * Dv);
    tdm_ref_linear_bf16(&g->out, o, n, out);
    free(z); free(bb); free(aa); free(conv); free(o); free(qn); free(kn);
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

/* Steps 1-3 for T rows: q (with its gate) and k normed and rotated at pos[t], v. */
static void attn_project(const struct tdm_config *c, const struct tdm_attn *at, const float *x, int T, const int *pos,
                         float *qg, float *kk, float *vv)
{
    const int Hq = c->n_q_heads, Hkv = c->n_kv_heads, D = c->head_dim;
    tdm_ref_linear_bf16(&at->q, x, T, qg);
    tdm_ref_linear_bf16(&at->k, x, T, kk);
    tdm_ref_linear_bf16(&at->v, x, T, vv);
    float *tmp = xmalloc((size_t)D * sizeof(float));
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < Hq; h++) {
            float *q = qg + ((size_t)t * Hq + h) * 2 * D;
            tdm_ref_rmsnorm(q, at->q_norm, D, c->rms_eps, tmp);
            memcpy(q, tmp, (size_t)D * sizeof(float));
            tdm_ref_rope_bf16(q, c->rotary_dim, pos[t], c->rope_theta);
        }
        for (int h = 0; h < Hkv; h++) {
            float *k = kk + ((size_t)t * Hkv + h) * D;
            tdm_ref_rmsnorm(k, at->k_norm, D, c->rms_eps, tmp);
            memcpy(k, tmp, (size_t)D * sizeof(float));
            tdm_ref_rope_bf16(k, c->rotary_dim, pos[t], c->rope_theta);
        }
    }
    free(tmp);
}

/* Step 4-5 for one query head: keys and values are the nc committed cache rows (kc, vc; row
 * floats apart) followed by ne extra rows (ke[i], ve[i]: a verify's ancestors, root first). The
 * order of every sum is the order of the keys, so a node sees the bits one-token decode sees. */
static void attn_core(const float *q, const float *gate, const float *kc, const float *vc, size_t row, int nc,
                      const float *const *ke, const float *const *ve, size_t off, int ne, int D, float *p, float *o)
{
    const int n = nc + ne;
    const float scale = 1.0f / sqrtf((float)D);
    float mx = -INFINITY, sum = 0.0f;
    for (int j = 0; j < n; j++) {
        const float *kj = j < nc ? kc + (size_t)j * row : ke[j - nc] + off;
        p[j] = tdm_dot(q, kj, D) * scale;
        mx = fmaxf(mx, p[j]);
    }
    /* Flash-attention rounding, as transformers' SDPA path computes it: the unnormalised
     * probabilities exp(s - max) enter the product with V in BF16, the sum that divides them
     * stays FP32. Measured against transformers: this halves an attention layer's distance
     * (0.31 % -> 0.14 % of the layer output) compared with FP32 probabilities. */
    for (int j = 0; j < n; j++) { p[j] = expf(p[j] - mx); sum += p[j]; }
    for (int d = 0; d < D; d++) o[d] = 0.0f;
    for (int j = 0; j < n; j++) {
        const float *vj = j < nc ? vc + (size_t)j * row : ve[j - nc] + off;
        const float pj = bf(p[j]);
        for (int d = 0; d < D; d++) o[d] += pj * vj[d];
    }
    for (int d = 0; d < D; d++) o[d] /= sum;
    for (int d = 0; d < D; d++) o[d] = bf(bf(o[d]) * bf(sigmoidf(gate[d])));
}

void tdm_ref_attn_head(const float *q, const float *gate, const float *kc, const float *vc, size_t row, int n, int D,
                       float *p, float *o)
{
    attn_core(q, gate, kc, vc, row, n, NULL, NULL, 0, 0, D, p, o);
}

/* Step 4-5 for one query head: keys and values are the nc committed cache rows (kc, vc) followed
 * by ne extra rows (ke[i], ve[i]: a verify's ancestors, root first). The order of every sum is
 * the order of the keys, so a node sees the bits one-token decode sees. */
static void attend(const struct tdm_config *c, const float *q, const float *kc, const float *vc, int nc,
                   const float *const *ke, const float *const *ve, int ne, int kvh, float *p, float *o)
{
    const int D = c->head_dim;
    const size_t off = (size_t)kvh * D;
    attn_core(q, q + D, kc + off, vc + off, (size_t)c->n_kv_heads * D, nc, ke, ve, off, ne, D, p, o);
}

static int attn_forward(struct tdm_ref *r, const struct tdm_attn *at, int slot, const float *x, int T, int pos0, float *out)
{
    const struct tdm_config *c = &r->m->cfg;
    const int Hq = c->n_q_heads, Hkv = c->n_kv_heads, D = c->head_dim, grp = Hq / Hkv;
    if (pos0 + T > r->ctx) return tdm_errf("context full: %d + %d tokens exceed --ctx %d", pos0, T, r->ctx);
    float *qg = xmalloc((size_t)T * Hq * 2 * D * sizeof(float));
    float *kk = xmalloc((size_t)T * Hkv * D * sizeof(float)), *vv = xmalloc((size_t)T * Hkv * D * sizeof(float));
    int *pos = xmalloc((size_t)T * sizeof(int));
    for (int t = 0; t < T; t++) pos[t] = pos0 + t;
    attn_project(c, at, x, T, pos, qg, kk, vv);
    const size_t row = (size_t)Hkv * D;
    memcpy(r->k[slot] + (size_t)pos0 * row, kk, (size_t)T * row * sizeof(float));
    memcpy(r->v[slot] + (size_t)pos0 * row, vv, (size_t)T * row * sizeof(float));
    float *att = xmalloc((size_t)T * Hq * D * sizeof(float)), *p = xmalloc((size_t)(pos0 + T) * sizeof(float));
    for (int t = 0; t < T; t++)
        for (int h = 0; h < Hq; h++)
            attend(c, qg + ((size_t)t * Hq + h) * 2 * D, r->k[slot], r->v[slot], pos0 + t + 1, NULL, NULL, 0, h / grp, p,
                   att + ((size_t)t * Hq + h) * D);
    tdm_ref_linear_bf16(&at->o, att, T, out);
    free(qg); free(kk); free(vv); free(pos); free(att); free(p);
    return 0;
}

/* An attention layer over a verify round's nodes: node t at rotary position pos + depth, seeing
 * the committed cache, its ancestors and itself (the ancestor mask). Its K and V rows stay in the
 * round's scratch until a commit copies the accepted path's rows into the cache. */
static void attn_verify(struct tdm_ref *r, const struct tdm_attn *at, int slot, const float *x, float *out)
{
    const struct tdm_config *c = &r->m->cfg;
    struct tdm_verify *vr = r->vr;
    const int n = vr->n, Hq = c->n_q_heads, Hkv = c->n_kv_heads, D = c->head_dim, grp = Hq / Hkv;
    const size_t row = (size_t)Hkv * D;
    float *qg = xmalloc((size_t)n * Hq * 2 * D * sizeof(float));
    float *kk = vr->kv_k[slot], *vv = vr->kv_v[slot];
    int pos[TDM_SPEC_MAX_NODES];
    for (int t = 0; t < n; t++) pos[t] = r->pos + vr->depth[t];
    attn_project(c, at, x, n, pos, qg, kk, vv);
    const float *ke[TDM_SPEC_MAX_NODES], *ve[TDM_SPEC_MAX_NODES];
    float *att = xmalloc((size_t)n * Hq * D * sizeof(float)), *p = xmalloc((size_t)(r->pos + n) * sizeof(float));
    for (int t = 0; t < n; t++) {
        const int d = vr->depth[t];
        for (int a = 0; a <= d; a++) {
            ke[a] = kk + (size_t)vr->path[t][a] * row;
            ve[a] = vv + (size_t)vr->path[t][a] * row;
        }
        for (int h = 0; h < Hq; h++)
            attend(c, qg + ((size_t)t * Hq + h) * 2 * D, r->k[slot], r->v[slot], r->pos, ke, ve, d + 1, h / grp, p,
                   att + ((size_t)t * Hq + h) * D);
    }
    tdm_ref_linear_bf16(&at->o, att, n, out);
    free(qg); free(att); free(p);
}

/* ---- MLPs ---- */

void tdm_ref_mlp_act(const struct tdm_mlp *mlp, const float *x, int T, float *act)
{
    const int64_t I = mlp->gate.n;
    float *up = xmalloc((size_t)(T * I) * sizeof(float));
    tdm_ref_linear_bf16(&mlp->gate, x, T, act);
    tdm_ref_linear_bf16(&mlp->up, x, T, up);
    for (int64_t i = 0; i < T * I; i++) act[i] = bf(bf(siluf(act[i])) * up[i]);
    free(up);
}

static void mlp_forward(const struct tdm_mlp *mlp, const float *x, int T, float *out)
{
    float *act = xmalloc((size_t)(T * mlp->gate.n) * sizeof(float));
    tdm_ref_mlp_act(mlp, x, T, act);
    tdm_ref_linear_bf16(&mlp->down, act, T, out);
    free(act);
}

/* The router for one row: softmax of the logits rl[E] into p, the top k (ties to the lower expert
 * id) into sel, their weights (renormalised when norm_topk) rounded to BF16 into w. */
void tdm_ref_route(const float *rl, int E, int k, int norm_topk, float *p, int *sel, float *w)
{
    float mx = -INFINITY, sum = 0.0f;
    for (int e = 0; e < E; e++) mx = fmaxf(mx, rl[e]);
    for (int e = 0; e < E; e++) { p[e] = expf(rl[e] - mx); sum += p[e]; }
    for (int e = 0; e < E; e++) p[e] /= sum;
    /* top-k by probability, ties to the lower expert id */
    tdm_topk(p, E, k, sel);
    for (int j = 0; j < k; j++) w[j] = p[sel[j]];
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

void tdm_ref_moe_combine(int H, int k, const int *sel, const float *w, const float *ye, const float *sh, float sg,
                         float *o)
{
    for (int i = 0; i < H; i++) o[i] = 0.0f;
    /* the experts' contributions added in BF16, ascending (expert id, slot) */
    for (int n = 0, ls = 0, li = -1; n < k; n++) {
        int j = -1;
        for (int i = 0; i < k; i++)
            if ((li < 0 || sel[i] > ls || (sel[i] == ls && i > li)) && (j < 0 || sel[i] < sel[j] || (sel[i] == sel[j] && i < j)))
                j = i;
        ls = sel[j];
        li = j;
        const float *y = ye + (size_t)j * H;
        for (int i = 0; i < H; i++) o[i] = bf(o[i] + bf(y[i] * w[j]));
    }
    const float g = bf(sigmoidf(sg));
    for (int i = 0; i < H; i++) o[i] = bf(o[i] + bf(g * sh[i]));
}

static void moe_forward(const struct tdm_model *m, const struct tdm_moe *moe, const float *x, int T, float *out, float *gap)
{
    const struct tdm_config *c = &m->cfg;
    const int H = c->hidden, E = c->n_experts, k = c->top_k;
    float *rl = xmalloc((size_t)T * E * sizeof(float)), *p = xmalloc((size_t)E * sizeof(float));
    float *ye = xmalloc((size_t)k * H * sizeof(float)), *sh = xmalloc((size_t)T * H * sizeof(float));
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
        for (int j = 0; j < k; j++) mlp_forward(&moe->experts[sel[j]], xt, 1, ye + (size_t)j * H);
        tdm_ref_linear_bf16(&moe->shared_gate, xt, 1, &sg);
        tdm_ref_moe_combine(H, k, sel, w, ye, sh + (size_t)t * H, sg, out + (size_t)t * H);
    }
    free(rl); free(p); free(ye); free(sh); free(sel); free(w);
}

/* ---- decoder layer ---- */

static int layer_forward(struct tdm_ref *r, const struct tdm_layer *l, int slot, float *h, int T, int pos0, float *gap)
{
    const struct tdm_config *c = &r->m->cfg;
    const int H = c->hidden;
    float *xn = xmalloc((size_t)T * H * sizeof(float)), *y = xmalloc((size_t)T * H * sizeof(float));
    for (int t = 0; t < T; t++) tdm_ref_rmsnorm(h + (size_t)t * H, l->in_norm, H, c->rms_eps, xn + (size_t)t * H);
    int rc = 0;
    if (r->vr) {
        if (l->mixer == TDM_MIXER_GDN) gdn_verify(r, &l->gdn, slot, xn, y);
        else attn_verify(r, &l->attn, slot, xn, y);
    } else if (l->mixer == TDM_MIXER_GDN) gdn_forward(r, &l->gdn, slot, xn, T, y);
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
    return tdm_ref_mtp_h(r, next_ids, hfin, T, logits, NULL);
}

int tdm_ref_mtp_h(struct tdm_ref *r, const int32_t *next_ids, const float *hfin, int T, float *logits, float *out_h)
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
        if (logits) tdm_linear_ref(mt->has_head ? &mt->head : &m->head, cat, T, logits); /* FP32 logits */
        if (out_h) memcpy(out_h, cat, (size_t)T * H * sizeof(float));
        r->mtp_pos += T;
    }
    free(cat); free(e); free(x);
    return rc;
}

int tdm_topk(const float *x, int n, int k, int32_t *out)
{
    int got = 0;
    for (; got < k && got < n; got++) {
        int best = -1;
        for (int i = 0; i < n; i++) {
            int taken = 0;
            for (int j = 0; j < got; j++) taken |= out[j] == i;
            if (!taken && (best < 0 || x[i] > x[best])) best = i;
        }
        out[got] = best;
    }
    return got;
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

/* ---- speculative rounds: verify, commit, snapshots ---- */

static void verify_free(struct tdm_ref *r)
{
    struct tdm_verify *v = r->vr_mem;
    if (!v) return;
    for (int i = 0; i < r->n_attn; i++) { free(v->kv_k[i]); free(v->kv_v[i]); }
    for (int i = 0; i < r->n_gdn; i++) { free(v->gdn_in[i]); free(v->fg[i]); free(v->fP[i]); free(v->fk[i]); free(v->fu[i]); }
    free(v->kv_k); free(v->kv_v); free(v->gdn_in); free(v->fg); free(v->fP); free(v->fk); free(v->fu);
    free(v);
}

static struct tdm_verify *verify_mem(struct tdm_ref *r)
{
    if (r->vr_mem) return r->vr_mem;
    const struct tdm_config *c = &r->m->cfg;
    const size_t N = TDM_SPEC_MAX_NODES, Hv = (size_t)c->gdn_v_heads;
    struct tdm_verify *v = xcalloc(1, sizeof *v);
    v->kv_k = xcalloc((size_t)r->n_attn + 1, sizeof *v->kv_k);
    v->kv_v = xcalloc((size_t)r->n_attn + 1, sizeof *v->kv_v);
    for (int i = 0; i < r->n_attn; i++) {
        v->kv_k[i] = xmalloc(N * (size_t)c->n_kv_heads * (size_t)c->head_dim * sizeof(float));
        v->kv_v[i] = xmalloc(N * (size_t)c->n_kv_heads * (size_t)c->head_dim * sizeof(float));
    }
    float ***arrs[] = {&v->gdn_in, &v->fg, &v->fP, &v->fk, &v->fu};
    const size_t widths[] = {(size_t)tdm_gdn_conv_dim(c), Hv, Hv, Hv * (size_t)c->gdn_k_dim, Hv * (size_t)c->gdn_v_dim};
    for (int a = 0; a < 5; a++) {
        *arrs[a] = xcalloc((size_t)r->n_gdn + 1, sizeof(float *));
        for (int i = 0; i < r->n_gdn; i++) (*arrs[a])[i] = xmalloc(N * widths[a] * sizeof(float));
    }
    for (int i = 0; i < r->n_gdn; i++) {
        struct tdm_pend *p = &r->pend[i];
        p->g = xmalloc(N * Hv * sizeof(float));
        p->P = xmalloc(N * Hv * sizeof(float));
        p->k = xmalloc(N * Hv * (size_t)c->gdn_k_dim * sizeof(float));
        p->u = xmalloc(N * Hv * (size_t)c->gdn_v_dim * sizeof(float));
    }
    return r->vr_mem = v;
}

int tdm_ref_verify(struct tdm_ref *r, const int32_t *ids, const int *parent, int n, int factored, float *logits,
                   float *final_h)
{
    const struct tdm_model *m = r->m;
    const struct tdm_config *c = &m->cfg;
    const int H = c->hidden, L = c->n_layers;
    if (n < 1 || n > TDM_SPEC_MAX_NODES) return tdm_errf("verify: %d nodes (1 to %d)", n, TDM_SPEC_MAX_NODES);
    struct tdm_verify *v = verify_mem(r);
    /* depth-first layout: the root first; each node's parent is on the previous node's path
     * (the stack), so every subtree is contiguous */
    int maxd = 0;
    for (int t = 0; t < n; t++) {
        if (ids[t] < 0 || ids[t] >= c->vocab) return tdm_errf("token id %d is out of the vocabulary (%d ids)", ids[t], c->vocab);
        int p = parent[t];
        if (t == 0 ? p != -1 : (p < 0 || p >= t || v->depth[p] > v->depth[t - 1] || v->path[t - 1][v->depth[p]] != p))
            return tdm_errf("verify: node %d's parent %d breaks the depth-first layout", t, p);
        if (!factored && t > 0 && p != t - 1) return tdm_errf("verify: a chain needs parent[%d] = %d", t, t - 1);
        v->depth[t] = t == 0 ? 0 : v->depth[p] + 1;
        if (t > 0) memcpy(v->path[t], v->path[p], (size_t)v->depth[p] * sizeof(int) + sizeof(int));
        v->path[t][v->depth[t]] = t;
        v->parent[t] = p;
        if (v->depth[t] > maxd) maxd = v->depth[t];
    }
    if (r->pos + maxd + 1 > r->ctx) return tdm_errf("context full: %d + %d tokens exceed --ctx %d", r->pos, maxd + 1, r->ctx);
    v->n = n;
    v->factored = factored;
    v->valid = 0;
    float *h = xmalloc((size_t)n * H * sizeof(float));
    for (int t = 0; t < n; t++) tdm_qweight_row(&m->embed, ids[t], h + (size_t)t * H);
    r->vr = v;
    for (int i = 0; i < L; i++) layer_forward(r, &m->layers[i], r->slot[i], h, n, r->pos, NULL);
    r->vr = NULL;
    float *xn = xmalloc((size_t)n * H * sizeof(float));
    for (int t = 0; t < n; t++) tdm_ref_rmsnorm(h + (size_t)t * H, m->final_norm, H, c->rms_eps, xn + (size_t)t * H);
    if (final_h) memcpy(final_h, xn, (size_t)n * H * sizeof(float));
    if (logits) head_forward(m, xn, n, logits);
    v->valid = 1;
    free(h);
    free(xn);
    return 0;
}

int tdm_ref_commit(struct tdm_ref *r, const int *path, int len)
{
    const struct tdm_config *c = &r->m->cfg;
    struct tdm_verify *v = r->vr_mem;
    if (!v || !v->valid) return tdm_errf("commit: no verified round");
    if (len < 1 || path[0] != 0) return tdm_errf("commit: a path starts at the root");
    for (int j = 1; j < len; j++)
        if (path[j] <= 0 || path[j] >= v->n || v->parent[path[j]] != path[j - 1])
            return tdm_errf("commit: node %d is not a child of node %d", path[j], path[j - 1]);
    /* attention: the path's K and V rows into the cache; the other nodes' rows are dropped */
    const size_t row = (size_t)c->n_kv_heads * (size_t)c->head_dim;
    for (int i = 0; i < r->n_attn; i++)
        for (int j = 0; j < len; j++) {
            memcpy(r->k[i] + (size_t)(r->pos + j) * row, v->kv_k[i] + (size_t)path[j] * row, row * sizeof(float));
            memcpy(r->v[i] + (size_t)(r->pos + j) * row, v->kv_v[i] + (size_t)path[j] * row, row * sizeof(float));
        }
    const int C = tdm_gdn_conv_dim(c), K = c->conv_kernel, Hv = c->gdn_v_heads, Dk = c->gdn_k_dim, Dv = c->gdn_v_dim;
    for (int i = 0; i < r->n_gdn; i++) {
        /* conv state: the last K-1 inputs of (state ++ path) */
        float *cs = r->conv[i];
        for (int j = 0; j < K - 1; j++) {
            int s = len - (K - 1) + j;
            if (s >= 0) memcpy(cs + (size_t)j * C, v->gdn_in[i] + (size_t)path[s] * C, (size_t)C * sizeof(float));
            else memmove(cs + (size_t)j * C, cs + (size_t)(j + len) * C, (size_t)C * sizeof(float));
        }
        /* GDN state: the path's factors become pending; applied now unless deferred */
        struct tdm_pend *pd = &r->pend[i];
        pd->n = len;
        pd->factored = v->factored;
        for (int j = 0; j < len; j++) {
            const size_t src = (size_t)path[j] * Hv, dst = (size_t)j * Hv;
            memcpy(pd->g + dst, v->fg[i] + src, (size_t)Hv * sizeof(float));
            memcpy(pd->P + dst, v->fP[i] + src, (size_t)Hv * sizeof(float));
            memcpy(pd->k + dst * Dk, v->fk[i] + src * Dk, (size_t)Hv * Dk * sizeof(float));
            memcpy(pd->u + dst * Dv, v->fu[i] + src * Dv, (size_t)Hv * Dv * sizeof(float));
        }
        r->stats.factor_written += (int64_t)factor_bytes(c, len);
        if (!r->defer) state_load(r, i, 0);
    }
    r->pos += len;
    v->valid = 0;
    return 0;
}

void tdm_ref_set_defer(struct tdm_ref *r, int defer) { r->defer = defer; }
const struct tdm_ref_stats *tdm_ref_stats(const struct tdm_ref *r) { return &r->stats; }
size_t tdm_ref_state_bytes(const struct tdm_ref *r) { return (size_t)r->n_gdn * state_bytes(&r->m->cfg); }

int tdm_ref_mtp_pos(const struct tdm_ref *r) { return r->mtp_pos; }
int tdm_ref_mtp_rewind(struct tdm_ref *r, int pos)
{
    if (pos < 0 || pos > r->mtp_pos) return tdm_errf("MTP rewind to %d: only %d positions", pos, r->mtp_pos);
    r->mtp_pos = pos;
    return 0;
}

struct tdm_ref_snap {
    int pos, mtp_pos;
    float **conv, **S;
    struct tdm_pend *pend;
};

struct tdm_ref_snap *tdm_ref_snap_new(const struct tdm_ref *r)
{
    const struct tdm_config *c = &r->m->cfg;
    const size_t N = TDM_SPEC_MAX_NODES, Hv = (size_t)c->gdn_v_heads;
    struct tdm_ref_snap *s = xcalloc(1, sizeof *s);
    s->conv = xcalloc((size_t)r->n_gdn + 1, sizeof *s->conv);
    s->S = xcalloc((size_t)r->n_gdn + 1, sizeof *s->S);
    s->pend = xcalloc((size_t)r->n_gdn + 1, sizeof *s->pend);
    for (int i = 0; i < r->n_gdn; i++) {
        s->conv[i] = xmalloc((size_t)(c->conv_kernel - 1) * (size_t)tdm_gdn_conv_dim(c) * sizeof(float));
        s->S[i] = xmalloc(state_bytes(c));
        s->pend[i].g = xmalloc(N * Hv * sizeof(float));
        s->pend[i].P = xmalloc(N * Hv * sizeof(float));
        s->pend[i].k = xmalloc(N * Hv * (size_t)c->gdn_k_dim * sizeof(float));
        s->pend[i].u = xmalloc(N * Hv * (size_t)c->gdn_v_dim * sizeof(float));
    }
    s->pos = -1;
    return s;
}

static void pend_copy(const struct tdm_config *c, struct tdm_pend *dst, const struct tdm_pend *src)
{
    const size_t Hv = (size_t)c->gdn_v_heads, n = (size_t)src->n;
    dst->n = src->n;
    dst->factored = src->factored;
    if (!n) return;
    memcpy(dst->g, src->g, n * Hv * sizeof(float));
    memcpy(dst->P, src->P, n * Hv * sizeof(float));
    memcpy(dst->k, src->k, n * Hv * (size_t)c->gdn_k_dim * sizeof(float));
    memcpy(dst->u, src->u, n * Hv * (size_t)c->gdn_v_dim * sizeof(float));
}

void tdm_ref_snap_save(const struct tdm_ref *r, struct tdm_ref_snap *s)
{
    const struct tdm_config *c = &r->m->cfg;
    s->pos = r->pos;
    s->mtp_pos = r->mtp_pos;
    for (int i = 0; i < r->n_gdn; i++) {
        memcpy(s->conv[i], r->conv[i], (size_t)(c->conv_kernel - 1) * (size_t)tdm_gdn_conv_dim(c) * sizeof(float));
        memcpy(s->S[i], r->S[i], state_bytes(c));
        pend_copy(c, &s->pend[i], &r->pend[i]);
    }
}

int tdm_ref_snap_load(struct tdm_ref *r, const struct tdm_ref_snap *s)
{
    const struct tdm_config *c = &r->m->cfg;
    if (s->pos < 0) return tdm_errf("snapshot: nothing saved");
    if (s->pend[0].g == NULL && r->n_gdn) return tdm_errf("snapshot: not made for this state");
    if (r->n_gdn && !r->pend[0].g) verify_mem(r); /* pending arrays live with the verify scratch */
    r->pos = s->pos;
    r->mtp_pos = s->mtp_pos;
    for (int i = 0; i < r->n_gdn; i++) {
        memcpy(r->conv[i], s->conv[i], (size_t)(c->conv_kernel - 1) * (size_t)tdm_gdn_conv_dim(c) * sizeof(float));
        memcpy(r->S[i], s->S[i], state_bytes(c));
        pend_copy(c, &r->pend[i], &s->pend[i]);
    }
    if (r->vr_mem) r->vr_mem->valid = 0;
    return 0;
}

void tdm_ref_snap_free(struct tdm_ref_snap *s)
{
    if (!s) return;
    for (int i = 0; s->S[i]; i++) {
        free(s->conv[i]); free(s->S[i]);
        free(s->pend[i].g); free(s->pend[i].P); free(s->pend[i].k); free(s->pend[i].u);
    }
    free(s->conv); free(s->S); free(s->pend);
    free(s);
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

uint64_t tdm_ref_state_hash(const struct tdm_ref *r)
{
    const struct tdm_config *c = &r->m->cfg;
    const size_t row = (size_t)c->n_kv_heads * (size_t)c->head_dim;
    uint64_t h = 1469598103934665603ull;
    h = fnv(h, &r->pos, sizeof r->pos);
    h = fnv(h, &r->mtp_pos, sizeof r->mtp_pos);
    for (int i = 0; i < r->n_attn; i++) {
        h = fnv(h, r->k[i], (size_t)r->pos * row * sizeof(float));
        h = fnv(h, r->v[i], (size_t)r->pos * row * sizeof(float));
    }
    if (r->m->has_mtp) {
        h = fnv(h, r->k[r->n_attn], (size_t)r->mtp_pos * row * sizeof(float));
        h = fnv(h, r->v[r->n_attn], (size_t)r->mtp_pos * row * sizeof(float));
    }
    float *S = xmalloc(state_bytes(c));
    for (int i = 0; i < r->n_gdn; i++) {
        h = fnv(h, r->conv[i], (size_t)(c->conv_kernel - 1) * (size_t)tdm_gdn_conv_dim(c) * sizeof(float));
        memcpy(S, r->S[i], state_bytes(c));
        if (r->pend[i].n) pend_apply(c, &r->pend[i], S);
        h = fnv(h, S, state_bytes(c));
    }
    free(S);
    return h;
}
