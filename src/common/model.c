#include "model.h"
#include "err.h"
#include "formats.h"
#include "settings.h"
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct binder {
    struct tdm_model *m;
    const char *dir;
    char prefix[64];    /* "model." or "model.language_model." */
};

/* p (allocated by the caller) freed with the model; returns p, or NULL (p freed) out of memory. */
static void *adopt(struct tdm_model *m, void *p)
{
    if (!p) return NULL;
    if (m->nowned == m->capowned) {
        int cap = m->capowned ? 2 * m->capowned : 256;
        void **n = realloc(m->owned, (size_t)cap * sizeof *n);
        if (!n) { free(p); return NULL; }
        m->owned = n;
        m->capowned = cap;
    }
    m->owned[m->nowned++] = p;
    return p;
}

static void *own(struct tdm_model *m, size_t bytes)
{
    return adopt(m, calloc(1, bytes ? bytes : 1));
}

static void shape_str(char *buf, size_t n, int nd, const int64_t *sh)
{
    size_t at = 0;
    at += (size_t)snprintf(buf + at, n - at, "[");
    for (int i = 0; i < nd && at < n; i++) at += (size_t)snprintf(buf + at, n - at, "%s%lld", i ? ", " : "", (long long)sh[i]);
    if (at < n) snprintf(buf + at, n - at, "]");
}

static const struct tdm_tensor *need(struct binder *b, const char *name)
{
    const struct tdm_tensor *t = tdm_ckpt_find(b->m->ck, name);
    if (!t) tdm_errf("%s: missing tensor '%s'", b->dir, name);
    return t;
}

static int check_shape(struct binder *b, const struct tdm_tensor *t, int nd, const int64_t *want, const char *why)
{
    int same = t->ndim == nd;
    for (int i = 0; same && i < nd; i++) same = t->shape[i] == want[i];
    if (same) return 0;
    char got[128], exp[128];
    shape_str(got, sizeof got, t->ndim, t->shape);
    shape_str(exp, sizeof exp, nd, want);
    return tdm_errf("%s: tensor '%s' has shape %s, the config implies %s (%s)", b->dir, t->name, got, exp, why);
}

/* A projection "<name>.weight" of n outputs and k inputs, in whatever format it is stored. */
static int bind_linear(struct binder *b, struct tdm_qweight *q, int64_t n, int64_t k, const char *why,
                       const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static int bind_linear(struct binder *b, struct tdm_qweight *q, int64_t n, int64_t k, const char *why,
                       const char *fmt, ...)
{
    char base[400], name[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(base, sizeof base, fmt, ap);
    va_end(ap);
    snprintf(name, sizeof name, "%s.weight", base);
    const struct tdm_tensor *w = need(b, name);
    if (!w) return -1;
    memset(q, 0, sizeof *q);
    q->n = n;
    q->k = k;
    q->w = w->data;
    const int64_t B = TDM_FP8_BLOCK;
    switch (w->dtype) {
    case TDM_DT_BF16:
    case TDM_DT_F32:
        q->fmt = w->dtype == TDM_DT_BF16 ? TDM_W_BF16 : TDM_W_F32;
        return check_shape(b, w, 2, (int64_t[]){n, k}, why);
    case TDM_DT_F8_E4M3: {
        q->fmt = TDM_W_FP8;
        if (check_shape(b, w, 2, (int64_t[]){n, k}, why)) return -1;
        snprintf(name, sizeof name, "%s.weight_scale_inv", base);
        const struct tdm_tensor *s = need(b, name);
        if (!s) return -1;
        if (s->dtype != TDM_DT_F32 && s->dtype != TDM_DT_BF16)
            return tdm_errf("%s: tensor '%s' is %s; block scales must be F32 or BF16", b->dir, name, tdm_dtype_name(s->dtype));
        if (check_shape(b, s, 2, (int64_t[]){(n + B - 1) / B, (k + B - 1) / B}, "one scale per 128x128 block")) return -1;
        q->scale = s->data;
        q->scale_dt = s->dtype;
        return 0;
    }
    case TDM_DT_U8: {
        q->fmt = TDM_W_NVFP4;
        if (k % TDM_NVFP4_GROUP)
            return tdm_errf("%s: tensor '%s': NVFP4 needs the input size %lld to be a multiple of 16", b->dir, name, (long long)k);
        if (check_shape(b, w, 2, (int64_t[]){n, k / 2}, why)) return -1;
        snprintf(name, sizeof name, "%s.weight_scale", base);
        const struct tdm_tensor *s = need(b, name);
        if (!s) return -1;
        if (s->dtype != TDM_DT_F8_E4M3)
            return tdm_errf("%s: tensor '%s' is %s; NVFP4 group scales must be F8_E4M3", b->dir, name, tdm_dtype_name(s->dtype));
        if (check_shape(b, s, 2, (int64_t[]){n, k / TDM_NVFP4_GROUP}, "one scale per 16 inputs")) return -1;
        q->scale = s->data;
        snprintf(name, sizeof name, "%s.weight_scale_2", base);
        const struct tdm_tensor *s2 = need(b, name);
        if (!s2) return -1;
        if (s2->dtype != TDM_DT_F32 || s2->numel != 1)
            return tdm_errf("%s: tensor '%s' must be one F32 value", b->dir, name);
        memcpy(&q->scale2, s2->data, 4);
        if (!(q->scale2 > 0.0f) || q->scale2 > 1e30f)
            return tdm_errf("%s: tensor '%s' = %g is not a positive scale", b->dir, name, (double)q->scale2);
        return 0;
    }
    default:
        return tdm_errf("%s: tensor '%s' has dtype %s, which is not a weight format (BF16, F32, F8_E4M3 + "
                        "weight_scale_inv, U8 NVFP4)", b->dir, name, tdm_dtype_name(w->dtype));
    }
}

/* A vector (norm weight, gate parameter) of n values stored as BF16, F16 or F32. */
static float *bind_vec(struct binder *b, int64_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static float *bind_vec(struct binder *b, int64_t n, const char *fmt, ...)
{
    char name[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    const struct tdm_tensor *t = need(b, name);
    if (!t) return NULL;
    if (t->numel != n) {
        char got[128];
        shape_str(got, sizeof got, t->ndim, t->shape);
        tdm_errf("%s: tensor '%s' has shape %s, the config implies %lld values", b->dir, name, got, (long long)n);
        return NULL;
    }
    float *v = own(b->m, (size_t)n * sizeof *v);
    if (!v) { tdm_errf("%s: out of memory", b->dir); return NULL; }
    for (int64_t i = 0; i < n; i++) {
        switch (t->dtype) {
        case TDM_DT_BF16: v[i] = tdm_bf16_to_f32(((const uint16_t *)t->data)[i]); break;
        case TDM_DT_F16: v[i] = tdm_f16_to_f32(((const uint16_t *)t->data)[i]); break;
        case TDM_DT_F32: v[i] = ((const float *)t->data)[i]; break;
        default:
            tdm_errf("%s: tensor '%s' has dtype %s; expected BF16, F16 or F32", b->dir, name, tdm_dtype_name(t->dtype));
            return NULL;
        }
    }
    return v;
}

static int bind_mlp(struct binder *b, struct tdm_mlp *mlp, int64_t inter, const char *base)
{
    const int64_t H = b->m->cfg.hidden;
    return bind_linear(b, &mlp->gate, inter, H, "MLP width x hidden_size", "%s.gate_proj", base) ||
           bind_linear(b, &mlp->up, inter, H, "MLP width x hidden_size", "%s.up_proj", base) ||
           bind_linear(b, &mlp->down, H, inter, "hidden_size x MLP width", "%s.down_proj", base);
}

/* Experts stored fused: experts.gate_up_proj [E, 2I, H] (gate rows first), experts.down_proj [E, H, I]. */
static int bind_fused_experts(struct binder *b, struct tdm_moe *moe, const char *base)
{
    const struct tdm_config *c = &b->m->cfg;
    const int64_t E = c->n_experts, I = c->moe_intermediate, H = c->hidden;
    char name[512];
    snprintf(name, sizeof name, "%s.experts.gate_up_proj", base);
    const struct tdm_tensor *gu = need(b, name);
    snprintf(name, sizeof name, "%s.experts.down_proj", base);
    const struct tdm_tensor *dn = need(b, name);
    if (!gu || !dn) return -1;
    if (check_shape(b, gu, 3, (int64_t[]){E, 2 * I, H}, "experts x 2 moe_intermediate_size x hidden_size") ||
        check_shape(b, dn, 3, (int64_t[]){E, H, I}, "experts x hidden_size x moe_intermediate_size"))
        return -1;
    if (gu->dtype != dn->dtype || (gu->dtype != TDM_DT_BF16 && gu->dtype != TDM_DT_F32))
        return tdm_errf("%s: fused expert tensors '%s' in %s: only BF16 or F32 fused experts are supported",
                        b->dir, gu->name, tdm_dtype_name(gu->dtype));
    enum tdm_wfmt f = gu->dtype == TDM_DT_BF16 ? TDM_W_BF16 : TDM_W_F32;
    size_t es = tdm_dtype_size(gu->dtype);
    for (int64_t e = 0; e < E; e++) {
        struct tdm_qweight whole = {.fmt = f, .n = 2 * I, .k = H, .w = (const char *)gu->data + (size_t)(e * 2 * I * H) * es};
        moe->experts[e].gate = tdm_qweight_rows(&whole, 0, I);
        moe->experts[e].up = tdm_qweight_rows(&whole, I, I);
        moe->experts[e].down = (struct tdm_qweight){.fmt = f, .n = H, .k = I, .w = (const char *)dn->data + (size_t)(e * H * I) * es};
    }
    return 0;
}

static int bind_moe(struct binder *b, struct tdm_moe *moe, const char *base)
{
    const struct tdm_config *c = &b->m->cfg;
    const int64_t H = c->hidden;
    moe->experts = own(b->m, (size_t)c->n_experts * sizeof *moe->experts);
    if (!moe->experts) return tdm_errf("%s: out of memory", b->dir);
    if (bind_linear(b, &moe->router, c->n_experts, H, "num_experts x hidden_size", "%s.gate", base)) return -1;
    char probe[512];
    snprintf(probe, sizeof probe, "%s.experts.gate_up_proj", base);
    if (tdm_ckpt_find(b->m->ck, probe)) {
        if (bind_fused_experts(b, moe, base)) return -1;
    } else {
        for (int e = 0; e < c->n_experts; e++) {
            char eb[400];
            snprintf(eb, sizeof eb, "%.360s.experts.%d", base, e);
            if (bind_mlp(b, &moe->experts[e], c->moe_intermediate, eb)) return -1;
        }
    }
    char sb[400];
    snprintf(sb, sizeof sb, "%.360s.shared_expert", base);
    if (bind_mlp(b, &moe->shared, c->shared_intermediate, sb)) return -1;
    return bind_linear(b, &moe->shared_gate, 1, H, "1 x hidden_size", "%s.shared_expert_gate", base);
}

static int bind_attn(struct binder *b, struct tdm_attn *a, const char *base)
{
    const struct tdm_config *c = &b->m->cfg;
    const int64_t H = c->hidden, D = c->head_dim;
    if (bind_linear(b, &a->q, 2 * c->n_q_heads * D, H, "2 x num_attention_heads x head_dim, hidden_size", "%s.q_proj", base) ||
        bind_linear(b, &a->k, c->n_kv_heads * D, H, "num_key_value_heads x head_dim, hidden_size", "%s.k_proj", base) ||
        bind_linear(b, &a->v, c->n_kv_heads * D, H, "num_key_value_heads x head_dim, hidden_size", "%s.v_proj", base) ||
        bind_linear(b, &a->o, H, c->n_q_heads * D, "hidden_size, num_attention_heads x head_dim", "%s.o_proj", base))
        return -1;
    a->q_norm = bind_vec(b, D, "%s.q_norm.weight", base);
    a->k_norm = a->q_norm ? bind_vec(b, D, "%s.k_norm.weight", base) : NULL;
    return a->k_norm ? 0 : -1;
}

static int bind_gdn(struct binder *b, struct tdm_gdn *g, const char *base)
{
    const struct tdm_config *c = &b->m->cfg;
    const int64_t H = c->hidden, Hk = c->gdn_k_heads, Hv = c->gdn_v_heads, Dk = c->gdn_k_dim, Dv = c->gdn_v_dim;
    const int64_t C = tdm_gdn_conv_dim(c);
    g->grouped = c->arch == TDM_ARCH_QWEN3_NEXT;
    if (g->grouped) {
        if (bind_linear(b, &g->qkvz, 2 * Hk * Dk + 2 * Hv * Dv, H, "2 Hk Dk + 2 Hv Dv, hidden_size", "%s.in_proj_qkvz", base) ||
            bind_linear(b, &g->ba, 2 * Hv, H, "2 x linear_num_value_heads, hidden_size", "%s.in_proj_ba", base))
            return -1;
    } else {
        if (bind_linear(b, &g->qkv, C, H, "2 Hk Dk + Hv Dv, hidden_size", "%s.in_proj_qkv", base) ||
            bind_linear(b, &g->z, Hv * Dv, H, "Hv Dv, hidden_size", "%s.in_proj_z", base) ||
            bind_linear(b, &g->b, Hv, H, "linear_num_value_heads, hidden_size", "%s.in_proj_b", base) ||
            bind_linear(b, &g->a, Hv, H, "linear_num_value_heads, hidden_size", "%s.in_proj_a", base))
            return -1;
    }
    char name[512];
    snprintf(name, sizeof name, "%s.conv1d.weight", base);
    const struct tdm_tensor *cw = need(b, name);
    if (!cw || check_shape(b, cw, 3, (int64_t[]){C, 1, c->conv_kernel}, "conv channels, 1, linear_conv_kernel_dim"))
        return -1;
    if (!(g->conv_w = bind_vec(b, C * c->conv_kernel, "%s", name)) ||
        !(g->A_log = bind_vec(b, Hv, "%s.A_log", base)) || !(g->dt_bias = bind_vec(b, Hv, "%s.dt_bias", base)) ||
        !(g->norm_w = bind_vec(b, Dv, "%s.norm.weight", base)))
        return -1;
    return bind_linear(b, &g->out, H, Hv * Dv, "hidden_size, Hv Dv", "%s.out_proj", base);
}

static int bind_layer(struct binder *b, struct tdm_layer *l, enum tdm_mixer mixer, int is_moe, const char *base)
{
    const struct tdm_config *c = &b->m->cfg;
    char sub[400];
    l->mixer = mixer;
    l->is_moe = is_moe;
    if (!(l->in_norm = bind_vec(b, c->hidden, "%s.input_layernorm.weight", base)) ||
        !(l->post_norm = bind_vec(b, c->hidden, "%s.post_attention_layernorm.weight", base)))
        return -1;
    if (mixer == TDM_MIXER_GDN) {
        snprintf(sub, sizeof sub, "%s.linear_attn", base);
        if (bind_gdn(b, &l->gdn, sub)) return -1;
    } else {
        snprintf(sub, sizeof sub, "%s.self_attn", base);
        if (bind_attn(b, &l->attn, sub)) return -1;
    }
    snprintf(sub, sizeof sub, "%s.mlp", base);
    return is_moe ? bind_moe(b, &l->moe, sub) : bind_mlp(b, &l->mlp, c->intermediate, sub);
}

/* The weights a draft token of the MTP layer reads besides its norms: fc, attention, a dense MLP
 * (an MoE MTP layer's experts, router and shared expert are left out) and the head (model.h: the
 * drafter's own when has_head). Returns their count; w gets pointers into m. */
static int draft_weights(struct tdm_model *m, struct tdm_qweight *w[9])
{
    struct tdm_mtp *t = &m->mtp;
    struct tdm_layer *l = &t->layer;
    int n = 0;
    w[n++] = &t->fc;
    w[n++] = &l->attn.q; w[n++] = &l->attn.k; w[n++] = &l->attn.v; w[n++] = &l->attn.o;
    if (!l->is_moe) { w[n++] = &l->mlp.gate; w[n++] = &l->mlp.up; w[n++] = &l->mlp.down; }
    w[n++] = t->has_head ? &t->head : &m->head;
    return n;
}

static int64_t draft_bytes(struct tdm_model *m)
{
    struct tdm_qweight *w[9];
    int64_t b = 0;
    for (int i = 0, n = draft_weights(m, w); i < n; i++) b += tdm_qweight_bytes(w[i]);
    return b;
}

/* The formats a stored BF16 or F32 weight may be requantized to at load: the values of
 * TANDEM_DRAFT_FORMAT and TANDEM_HEAD_FORMAT other than "stored" (settings.c), each with its
 * requantizer. */
static const struct requant_format {
    const char *name;
    enum tdm_wfmt fmt;
    int64_t k_multiple;   /* the input sizes it takes (NVFP4: whole groups) */
    int (*to)(const struct tdm_qweight *w, struct tdm_qweight *out, void **buf, int threads);
} requant_formats[] = {
    {"nvfp4", TDM_W_NVFP4, TDM_NVFP4_GROUP, tdm_qweight_to_nvfp4},
    {"fp8", TDM_W_FP8, 1, tdm_qweight_to_fp8},
};

/* The requantization a setting's value names; NULL for "stored" (the settings table has checked the
 * value). */
static const struct requant_format *requant_format_of(const char *setting)
{
    const char *v = tdm_setting(setting);
    for (size_t i = 0; i < sizeof requant_formats / sizeof requant_formats[0]; i++)
        if (strcmp(v, requant_formats[i].name) == 0) return &requant_formats[i];
    return NULL;
}

/* *w requantized to rf in place (on up to 16 threads) when it is BF16 or F32 and rf takes its k
 * (k_multiple); the new matrix is the model's. 1 when it was, 0 when not, -1 on failure (tdm_err). */
static int requant(struct tdm_model *m, struct tdm_qweight *w, const struct requant_format *rf)
{
    if ((w->fmt != TDM_W_BF16 && w->fmt != TDM_W_F32) || w->k % rf->k_multiple) return 0;
    long threads = sysconf(_SC_NPROCESSORS_ONLN);
    if (threads > 16) threads = 16;
    struct tdm_qweight q;
    void *buf;
    if (rf->to(w, &q, &buf, (int)threads) != 0 || !adopt(m, buf)) return -1;
    *w = q;
    return 1;
}

/* TANDEM_DRAFT_FORMAT=nvfp4|fp8: the drafter's BF16 and F32 weights of draft_weights() requantized
 * (NVFP4: where k is a multiple of 16), the head as a copy (model.h: has_head). The main model and
 * an MoE MTP layer's experts, router and shared expert keep their stored formats. */
static int draft_requant(struct tdm_model *m, const struct requant_format *rf)
{
    struct tdm_mtp *t = &m->mtp;
    t->head = m->head;
    t->has_head = 1;   /* requantized in place below, or left as the model's */
    struct tdm_qweight *w[9];
    int changed = 0;
    for (int i = 0, n = draft_weights(m, w); i < n; i++) {
        const int r = requant(m, w[i], rf);
        if (r < 0) return tdm_err_prefix("%s: TANDEM_DRAFT_FORMAT=%s", m->dir, rf->name);
        changed += r;
    }
    t->has_head = t->head.fmt != m->head.fmt;
    if (changed) t->requant = rf->fmt;
    return 0;
}

/* TANDEM_HEAD_FORMAT=nvfp4|fp8: the model's BF16 or F32 head requantized (a new matrix, so a tied
 * embedding keeps its format for the lookup); a head stored quantized is kept. The drafter's
 * requantized head (draft_requant) in the same format is the same function of the same rows, so
 * the two share it. */
static int head_requant(struct tdm_model *m, const struct requant_format *rf)
{
    const int64_t stored = tdm_qweight_bytes(&m->head);
    struct tdm_mtp *t = &m->mtp;
    if (m->has_mtp && t->has_head && t->head.fmt == rf->fmt) {   /* the drafter's copy of a BF16 or F32 head */
        m->head = t->head;
        t->has_head = 0;
    } else {
        const int r = requant(m, &m->head, rf);
        if (r <= 0) return r < 0 ? tdm_err_prefix("%s: TANDEM_HEAD_FORMAT=%s", m->dir, rf->name) : 0;
    }
    m->head_bytes_stored = stored;
    if (m->has_mtp) t->draft_bytes_now = draft_bytes(m);
    return 0;
}

const char *tdm_model_draft_how(const struct tdm_model *m, char *buf, size_t n)
{
    const struct tdm_mtp *t = &m->mtp;
    if (t->requant >= 0)
        snprintf(buf, n, "requantized to %s (TANDEM_DRAFT_FORMAT)", tdm_wfmt_title((enum tdm_wfmt)t->requant));
    else if (m->head_bytes_stored && !t->has_head)
        snprintf(buf, n, "as stored, the head requantized to %s (TANDEM_HEAD_FORMAT)", tdm_wfmt_title(m->head.fmt));
    else
        snprintf(buf, n, "as stored");
    return buf;
}

struct tdm_model *tdm_model_load(const char *dir)
{
    struct tdm_model *m = calloc(1, sizeof *m);
    if (!m) { tdm_errf("%s: out of memory", dir); return NULL; }
    m->mtp.requant = -1;
    m->dir = strdup(dir);
    if (!m->dir || tdm_config_load(dir, &m->cfg) != 0 || !(m->ck = tdm_ckpt_open(dir))) goto fail;
    struct tdm_config *c = &m->cfg;
    struct binder b = {.m = m, .dir = dir};
    snprintf(b.prefix, sizeof b.prefix, "%s",
             tdm_ckpt_find(m->ck, "model.language_model.embed_tokens.weight") ? "model.language_model." : "model.");
    char name[512];
    if (bind_linear(&b, &m->embed, c->vocab, c->hidden, "vocab_size x hidden_size", "%sembed_tokens", b.prefix)) goto fail;
    if (m->embed.fmt != TDM_W_BF16 && m->embed.fmt != TDM_W_F32) {
        tdm_errf("%s: %sembed_tokens.weight must be BF16 or F32", dir, b.prefix);
        goto fail;
    }
    if (c->tie_embeddings) {
        m->head = m->embed;
    } else if (bind_linear(&b, &m->head, c->vocab, c->hidden, "vocab_size x hidden_size", "lm_head")) {
        goto fail;
    }
    if (!(m->final_norm = bind_vec(&b, c->hidden, "%snorm.weight", b.prefix))) goto fail;
    m->layers = own(m, (size_t)c->n_layers * sizeof *m->layers);
    if (!m->layers) { tdm_errf("%s: out of memory", dir); goto fail; }
    for (int i = 0; i < c->n_layers; i++) {
        snprintf(name, sizeof name, "%slayers.%d", b.prefix, i);
        if (bind_layer(&b, &m->layers[i], c->mixer[i], c->is_moe[i], name)) goto fail;
    }
    /* A layer past the config's count means the config and the checkpoint disagree. */
    if (tdm_ckpt_findf(m->ck, "%slayers.%d.input_layernorm.weight", b.prefix, c->n_layers)) {
        tdm_errf("%s: the checkpoint has more layers than num_hidden_layers = %d", dir, c->n_layers);
        goto fail;
    }
    if (c->mtp_layers > 0) {
        struct tdm_mtp *t = &m->mtp;
        int mtp_moe = c->arch != TDM_ARCH_QWEN3_5;
        if (!(t->pre_fc_norm_embedding = bind_vec(&b, c->hidden, "mtp.pre_fc_norm_embedding.weight")) ||
            !(t->pre_fc_norm_hidden = bind_vec(&b, c->hidden, "mtp.pre_fc_norm_hidden.weight")) ||
            !(t->norm = bind_vec(&b, c->hidden, "mtp.norm.weight")) ||
            bind_linear(&b, &t->fc, c->hidden, 2 * c->hidden, "hidden_size x 2 hidden_size", "mtp.fc") ||
            bind_layer(&b, &t->layer, TDM_MIXER_ATTN, mtp_moe, "mtp.layers.0"))
            goto fail;
        m->has_mtp = 1;
        t->draft_bytes = draft_bytes(m);
        const struct requant_format *drf = requant_format_of("TANDEM_DRAFT_FORMAT");
        if (drf && draft_requant(m, drf) != 0) goto fail;
        t->draft_bytes_now = draft_bytes(m);
    }
    const struct requant_format *hrf = requant_format_of("TANDEM_HEAD_FORMAT");
    if (hrf && head_requant(m, hrf) != 0) goto fail;
    return m;
fail:
    tdm_model_free(m);
    return NULL;
}

void tdm_model_free(struct tdm_model *m)
{
    if (!m) return;
    for (int i = 0; i < m->nowned; i++) free(m->owned[i]);
    free(m->owned);
    tdm_ckpt_close(m->ck);
    tdm_config_free(&m->cfg);
    free(m->dir);
    free(m);
}

static void each_mlp(const struct tdm_mlp *p, void (*fn)(void *, const char *, const struct tdm_qweight *), void *ctx)
{
    fn(ctx, "mlp.gate", &p->gate);
    fn(ctx, "mlp.up", &p->up);
    fn(ctx, "mlp.down", &p->down);
}

void tdm_model_each_projection(const struct tdm_model *m,
                               void (*fn)(void *ctx, const char *what, const struct tdm_qweight *w), void *ctx)
{
    for (int i = 0; i < m->cfg.n_layers; i++) {
        const struct tdm_layer *l = &m->layers[i];
        if (l->mixer == TDM_MIXER_GDN) {
            const struct tdm_gdn *g = &l->gdn;
            if (g->grouped) { fn(ctx, "gdn.in_proj_qkvz", &g->qkvz); fn(ctx, "gdn.in_proj_ba", &g->ba); }
            else {
                fn(ctx, "gdn.in_proj_qkv", &g->qkv); fn(ctx, "gdn.in_proj_z", &g->z);
                fn(ctx, "gdn.in_proj_b", &g->b); fn(ctx, "gdn.in_proj_a", &g->a);
            }
            fn(ctx, "gdn.out_proj", &g->out);
        } else {
            fn(ctx, "attn.q_proj", &l->attn.q); fn(ctx, "attn.k_proj", &l->attn.k);
            fn(ctx, "attn.v_proj", &l->attn.v); fn(ctx, "attn.o_proj", &l->attn.o);
        }
        if (l->is_moe) {
            fn(ctx, "moe.router", &l->moe.router);
            for (int e = 0; e < m->cfg.n_experts; e++) each_mlp(&l->moe.experts[e], fn, ctx);
            each_mlp(&l->moe.shared, fn, ctx);
            fn(ctx, "moe.shared_gate", &l->moe.shared_gate);
        } else {
            each_mlp(&l->mlp, fn, ctx);
        }
    }
    fn(ctx, "lm_head", &m->head);
}

static void add_bytes(void *ctx, const char *what, const struct tdm_qweight *w)
{
    (void)what;
    *(int64_t *)ctx += tdm_qweight_bytes(w);
}

int64_t tdm_model_projection_bytes(const struct tdm_model *m)
{
    int64_t n = 0;
    tdm_model_each_projection(m, add_bytes, &n);
    return n;
}

/* Every attention layer's K and V rows 0..n-1, BF16. */
static int64_t kv_read_bytes(const struct tdm_config *c, int64_t n)
{
    int64_t b = 0;
    for (int i = 0; i < c->n_layers; i++)
        if (c->mixer[i] == TDM_MIXER_ATTN) b += 2 * n * (int64_t)c->n_kv_heads * c->head_dim * 2;
    return b;
}

struct tdm_step_bytes tdm_model_step_bytes(const struct tdm_model *m, int64_t pos)
{
    const struct tdm_config *c = &m->cfg;
    struct tdm_step_bytes b = {tdm_model_projection_bytes(m), 0, kv_read_bytes(c, pos + 1), 0};
    for (int i = 0; i < c->n_layers; i++)
        if (c->mixer[i] == TDM_MIXER_GDN)
            b.gdn_state += 2 * (int64_t)c->gdn_v_heads * c->gdn_k_dim * c->gdn_v_dim * 4;   /* FP32, read + write */
    b.total = b.weights + b.gdn_state + b.kv;
    return b;
}

struct tdm_pass_bytes tdm_model_pass_bytes(const struct tdm_model *m, int64_t pos, int rows)
{
    const struct tdm_config *c = &m->cfg;
    const double all = (double)tdm_model_projection_bytes(m);
    struct tdm_pass_bytes b = {all, all, 0, 0, kv_read_bytes(c, pos + rows)};
    const int E = c->n_experts, k = c->top_k;
    for (int i = 0; i < c->n_layers; i++) {
        if (!m->layers[i].is_moe) continue;
        int64_t experts = 0; /* the layer's routed experts, all of them (counted in `all`) */
        for (int e = 0; e < E; e++) {
            const struct tdm_mlp *x = &m->layers[i].moe.experts[e];
            experts += tdm_qweight_bytes(&x->gate) + tdm_qweight_bytes(&x->up) + tdm_qweight_bytes(&x->down);
        }
        const double touched_max = (double)rows * k < E ? (double)rows * k : E;
        const double touched_even = E * (1.0 - pow(1.0 - (double)k / E, rows));
        b.weights_max -= experts * (1.0 - touched_max / E);
        b.weights_even -= experts * (1.0 - touched_even / E);
        b.experts_max = touched_max;
        b.experts_even = touched_even;
    }
    return b;
}
