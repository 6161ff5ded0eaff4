/* tandem-mkmodel — write a synthetic checkpoint directory of either layout and any shape, in
 * BF16, block FP8 or NVFP4, from a seed: config.json (+ hf_quant_config.json), model.safetensors
 * or shards with model.safetensors.index.json, in the hub layout, with an MTP layer. The same
 * seed gives the same BF16 weights in every format; FP8 and NVFP4 are quantized from them. */
#include "cli.h"
#include "config.h"
#include "err.h"
#include "jsonfile.h"
#include "formats.h"
#include "linear.h"
#include "parallel.h"
#include "presets.h"
#include "safetensors.h"
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *prog = "tandem-mkmodel";

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tandem-mkmodel -o DIR [options]\n"
            "Write a synthetic checkpoint (random weights from a seed) in the hub layout.\n"
            "\n"
            "  -o, --out DIR              output directory (created; files written atomically, config last)\n"
            "      --layout L             qwen3_5 (default), qwen3_5_moe or qwen3_next\n"
            "      --shape NAME           %s (default tiny)\n"
            "      --format F             bf16 (default), fp8 or nvfp4\n"
            "      --seed N               random seed (default 1)\n"
            "shape overrides:\n"
            "      --layers N             decoder layers\n"
            "      --attn-every N         layer i is attention iff (i+1) %% N == 0 (default 4)\n"
            "      --layer-types S        one letter a layer: G (Gated DeltaNet) or A (attention); written as\n"
            "                             layer_types in the config\n"
            "      --hidden N, --vocab N, --q-heads N, --kv-heads N, --head-dim N, --rotary-dim N\n"
            "      --gdn-key-heads N, --gdn-value-heads N, --gdn-key-dim N, --gdn-value-dim N\n"
            "      --intermediate N       dense MLP width\n"
            "      --experts N, --top-k N, --moe-intermediate N, --shared-intermediate N\n"
            "      --mlp-only-layers L    comma-separated layers with a dense MLP (MoE layouts)\n"
            "      --no-norm-topk         norm_topk_prob false (qwen3_next)\n"
            "      --tie                  tied embeddings (no lm_head tensor)\n"
            "      --no-mtp               no MTP layer\n"
            "storage:\n"
            "      --fp8-scales f32|bf16  dtype of the block-FP8 scales (default f32)\n"
            "      --pow2-scales          round FP8 block scales and the NVFP4 global scale up to powers of two\n"
            "      --bf16-exact-scales    round FP8 block scales up to 4 significant bits and the NVFP4 global\n"
            "                             scale up to 2, so that every dequantized weight is exact in BF16 (and a\n"
            "                             BF16 reference model computes the same function); not powers of two\n"
            "      --fused-experts        store experts as experts.gate_up_proj / experts.down_proj (BF16)\n"
            "      --shard-mb N           split into shards of about N MB with an index\n"
            "      --threads N            threads making the rows (default: the online CPUs, at most 64);\n"
            "                             the bytes written do not depend on it\n"
            "  -h, --help                 this text\n"
            "Exit status: 0 written, 2 bad usage (nothing is left under a final name on failure).\n",
            tdm_preset_names);
}

/* ---- random numbers: one stream per (seed, tensor name, row), so rows can be made in any order ---- */

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t hash_name(uint64_t seed, const char *name)
{
    uint64_t h = 1469598103934665603ull ^ seed;
    for (const char *p = name; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    return h;
}

/* n bell-shaped values of mean 0 and deviation std (a sum of four uniforms: only arithmetic, so
 * every machine makes the same bits), rounded to BF16 (the model's true weights are BF16). */
static void normal_row(uint64_t stream, int64_t row, float std, float *out, int64_t n)
{
    uint64_t s = stream ^ (0x632be59bd9b4e019ull * (uint64_t)(row + 1));
    for (int64_t i = 0; i < n; i++) {
        double u = 0.0;
        for (int j = 0; j < 4; j++) u += (double)(splitmix(&s) >> 11) * 0x1.0p-53;
        out[i] = tdm_bf16r((float)(std * (u - 2.0) * 1.7320508075688772));
    }
}

/* ---- rows in parallel: every row has its own stream, so threads change no byte ---- */

static int n_threads = 1;   /* tdm_parallel_rows' threads */

static float uniform01(uint64_t stream, int64_t i)
{
    uint64_t s = stream ^ (0xd1b54a32d192ed03ull * (uint64_t)(i + 1));
    return (float)((splitmix(&s) >> 11) * 0x1.0p-53);
}

/* ---- the tensors of a model ---- */

enum gen { G_PROJ, G_FUSED, G_ZC_NORM, G_ONE_NORM, G_ALOG, G_DTBIAS, G_CONV };

struct item {
    char name[256];       /* projections: base name (".weight" etc. added); vectors: full name */
    enum gen gen;
    int64_t n, k;         /* rows, columns (vectors: n values; conv: n channels x k taps) */
    float std;
    enum tdm_wfmt fmt;    /* projections */
    int f32;              /* vectors stored as F32 */
};

struct plan {
    struct item *it;
    int n, cap;
    struct tdm_config c;
    enum tdm_wfmt fmt;
    int fp8_bf16_scales, fused, tied;
    int fp8_scale_bits, nvfp4_scale2_bits; /* 0: as computed; 1: powers of two; else significant bits */
    char prefix[32];
    json_t *excluded;     /* module names left in BF16 */
    uint64_t seed;
};

static struct item *add(struct plan *p, enum gen g, int64_t n, int64_t k, float std, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static struct item *add(struct plan *p, enum gen g, int64_t n, int64_t k, float std, const char *fmt, ...)
{
    if (p->n == p->cap) {
        p->cap = p->cap ? 2 * p->cap : 256;
        p->it = realloc(p->it, (size_t)p->cap * sizeof *p->it);
        if (!p->it) { fprintf(stderr, "%s: out of memory\n", prog); exit(1); }
    }
    struct item *it = &p->it[p->n++];
    memset(it, 0, sizeof *it);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(it->name, sizeof it->name, fmt, ap);
    va_end(ap);
    it->gen = g;
    it->n = n;
    it->k = k;
    it->std = std;
    it->fmt = TDM_W_BF16;
    return it;
}

/* A projection; quantized unless `keep` (the format's recipe leaves it in BF16) or NVFP4 cannot hold K. */
static void proj(struct plan *p, const char *base, int64_t n, int64_t k, float gain, int keep_fp8, int keep_nvfp4)
{
    struct item *it = add(p, G_PROJ, n, k, gain / sqrtf((float)k), "%s", base);
    int keep = p->fmt == TDM_W_FP8 ? keep_fp8 : p->fmt == TDM_W_NVFP4 ? (keep_nvfp4 || k % TDM_NVFP4_GROUP) : 1;
    it->fmt = keep ? TDM_W_BF16 : p->fmt;
    if (keep && p->fmt != TDM_W_BF16) json_array_append_new(p->excluded, json_string(base));
}

static void vec(struct plan *p, enum gen g, int64_t n, float std, int f32, const char *name)
{
    add(p, g, n, 1, std, "%s", name)->f32 = f32;
}

static void mlp_items(struct plan *p, const char *base, int64_t inter, int in_mtp)
{
    const int64_t H = p->c.hidden;
    char b[256];
    const int nv = in_mtp; /* NVFP4 recipe leaves the MTP module in BF16 */
    snprintf(b, sizeof b, "%s.gate_proj", base); proj(p, b, inter, H, 1.0f, 0, nv);
    snprintf(b, sizeof b, "%s.up_proj", base); proj(p, b, inter, H, 1.0f, 0, nv);
    snprintf(b, sizeof b, "%s.down_proj", base); proj(p, b, H, inter, 1.0f, 0, nv);
}

static void layer_items(struct plan *p, const char *base, enum tdm_mixer mixer, int moe, int in_mtp)
{
    const struct tdm_config *c = &p->c;
    const int64_t H = c->hidden, D = c->head_dim, Hk = c->gdn_k_heads, Hv = c->gdn_v_heads, Dk = c->gdn_k_dim,
                  Dv = c->gdn_v_dim, C = tdm_gdn_conv_dim(c);
    const int next = c->arch == TDM_ARCH_QWEN3_NEXT, f32vec = !next;
    char b[256];
    snprintf(b, sizeof b, "%s.input_layernorm.weight", base); vec(p, G_ZC_NORM, H, 0.1f, 0, b);
    if (mixer == TDM_MIXER_GDN) {
        if (next) {
            snprintf(b, sizeof b, "%s.linear_attn.in_proj_qkvz", base); proj(p, b, 2 * Hk * Dk + 2 * Hv * Dv, H, 1.0f, 0, 1);
            snprintf(b, sizeof b, "%s.linear_attn.in_proj_ba", base); proj(p, b, 2 * Hv, H, 1.0f, 1, 1);
        } else {
            snprintf(b, sizeof b, "%s.linear_attn.in_proj_qkv", base); proj(p, b, C, H, 1.0f, 0, in_mtp);
            snprintf(b, sizeof b, "%s.linear_attn.in_proj_z", base); proj(p, b, Hv * Dv, H, 1.0f, 0, in_mtp);
            snprintf(b, sizeof b, "%s.linear_attn.in_proj_b", base); proj(p, b, Hv, H, 1.0f, 1, 1);
            snprintf(b, sizeof b, "%s.linear_attn.in_proj_a", base); proj(p, b, Hv, H, 1.0f, 1, 1);
        }
        snprintf(b, sizeof b, "%s.linear_attn.conv1d.weight", base); add(p, G_CONV, C, c->conv_kernel, 0.5f, "%s", b);
        snprintf(b, sizeof b, "%s.linear_attn.A_log", base); vec(p, G_ALOG, Hv, 0, f32vec, b);
        snprintf(b, sizeof b, "%s.linear_attn.dt_bias", base); vec(p, G_DTBIAS, Hv, 1.0f, 0, b);
        snprintf(b, sizeof b, "%s.linear_attn.norm.weight", base); vec(p, G_ONE_NORM, Dv, 0.1f, f32vec, b);
        snprintf(b, sizeof b, "%s.linear_attn.out_proj", base); proj(p, b, H, Hv * Dv, 1.0f, 0, in_mtp);
    } else {
        snprintf(b, sizeof b, "%s.self_attn.q_proj", base); proj(p, b, 2 * c->n_q_heads * D, H, 1.0f, 0, next || in_mtp);
        snprintf(b, sizeof b, "%s.self_attn.k_proj", base); proj(p, b, c->n_kv_heads * D, H, 1.0f, 0, next || in_mtp);
        snprintf(b, sizeof b, "%s.self_attn.v_proj", base); proj(p, b, c->n_kv_heads * D, H, 1.0f, 0, next || in_mtp);
        snprintf(b, sizeof b, "%s.self_attn.o_proj", base); proj(p, b, H, c->n_q_heads * D, 1.0f, 0, in_mtp);
        snprintf(b, sizeof b, "%s.self_attn.q_norm.weight", base); vec(p, G_ZC_NORM, D, 0.1f, 0, b);
        snprintf(b, sizeof b, "%s.self_attn.k_norm.weight", base); vec(p, G_ZC_NORM, D, 0.1f, 0, b);
    }
    snprintf(b, sizeof b, "%s.post_attention_layernorm.weight", base); vec(p, G_ZC_NORM, H, 0.1f, 0, b);
    if (!moe) {
        snprintf(b, sizeof b, "%s.mlp", base);
        mlp_items(p, b, c->intermediate, in_mtp);
        return;
    }
    snprintf(b, sizeof b, "%s.mlp.gate", base); proj(p, b, c->n_experts, H, 1.0f, 1, 1);
    if (p->fused) {
        snprintf(b, sizeof b, "%s.mlp.experts.gate_up_proj", base);
        add(p, G_FUSED, (int64_t)c->n_experts * 2 * c->moe_intermediate, H, 1.0f / sqrtf((float)H), "%s", b);
        snprintf(b, sizeof b, "%s.mlp.experts.down_proj", base);
        add(p, G_FUSED, (int64_t)c->n_experts * H, c->moe_intermediate, 1.0f / sqrtf((float)c->moe_intermediate), "%s", b);
    } else {
        for (int e = 0; e < c->n_experts; e++) {
            snprintf(b, sizeof b, "%s.mlp.experts.%d", base, e);
            mlp_items(p, b, c->moe_intermediate, in_mtp);
        }
    }
    snprintf(b, sizeof b, "%s.mlp.shared_expert", base);
    mlp_items(p, b, c->shared_intermediate, in_mtp);
    snprintf(b, sizeof b, "%s.mlp.shared_expert_gate", base); proj(p, b, 1, H, 1.0f, 1, 1);
}

static void plan_model(struct plan *p)
{
    const struct tdm_config *c = &p->c;
    const int64_t H = c->hidden, V = c->vocab;
    char b[256];
    snprintf(b, sizeof b, "%sembed_tokens", p->prefix);
    /* Embedding rows of unit deviation; a tied head reads them too, so then logits would spread
     * by sqrt(H): scale to a deviation of about 3 instead. */
    add(p, G_PROJ, V, H, p->tied ? 3.0f / sqrtf((float)H) : 1.0f, "%s", b);
    if (p->fmt != TDM_W_BF16) json_array_append_new(p->excluded, json_string(b));
    for (int i = 0; i < c->n_layers; i++) {
        snprintf(b, sizeof b, "%slayers.%d", p->prefix, i);
        layer_items(p, b, c->mixer[i], c->is_moe[i], 0);
    }
    snprintf(b, sizeof b, "%snorm.weight", p->prefix); vec(p, G_ZC_NORM, H, 0.1f, 0, b);
    if (!p->tied) proj(p, "lm_head", V, H, 3.0f, 1, 1);
    if (c->mtp_layers) {
        vec(p, G_ZC_NORM, H, 0.1f, 0, "mtp.pre_fc_norm_embedding.weight");
        vec(p, G_ZC_NORM, H, 0.1f, 0, "mtp.pre_fc_norm_hidden.weight");
        proj(p, "mtp.fc", H, 2 * H, 1.0f, 1, 1);
        layer_items(p, "mtp.layers.0", TDM_MIXER_ATTN, c->arch != TDM_ARCH_QWEN3_5, 1);
        vec(p, G_ZC_NORM, H, 0.1f, 0, "mtp.norm.weight");
    }
}

/* ---- writing ---- */

struct out {
    struct tdm_st_desc *d;   /* every tensor, in file order */
    int nd, capd;
    int *shard;              /* shard of each tensor */
    struct tdm_st_writer **w;
    int nshards, cur;
    size_t done;             /* bytes of tensor cur written */
    double written, total;
    double next_report;
};

static void desc(struct out *o, const char *name, enum tdm_dtype dt, int nd, int64_t d0, int64_t d1, int64_t d2)
{
    if (o->nd == o->capd) {
        o->capd = o->capd ? 2 * o->capd : 512;
        o->d = realloc(o->d, (size_t)o->capd * sizeof *o->d);
        if (!o->d) { fprintf(stderr, "%s: out of memory\n", prog); exit(1); }
    }
    struct tdm_st_desc *x = &o->d[o->nd++];
    memset(x, 0, sizeof *x);
    x->name = strdup(name);
    x->dtype = dt;
    x->ndim = nd;
    x->shape[0] = d0;
    x->shape[1] = d1;
    x->shape[2] = d2;
}

static void describe(struct plan *p, struct out *o)
{
    const int64_t B = TDM_FP8_BLOCK, G = TDM_NVFP4_GROUP;
    char nm[300];
    for (int i = 0; i < p->n; i++) {
        const struct item *it = &p->it[i];
        switch (it->gen) {
        case G_PROJ:
            snprintf(nm, sizeof nm, "%s.weight", it->name);
            if (it->fmt == TDM_W_BF16) desc(o, nm, TDM_DT_BF16, 2, it->n, it->k, 0);
            else if (it->fmt == TDM_W_FP8) {
                desc(o, nm, TDM_DT_F8_E4M3, 2, it->n, it->k, 0);
                snprintf(nm, sizeof nm, "%s.weight_scale_inv", it->name);
                desc(o, nm, p->fp8_bf16_scales ? TDM_DT_BF16 : TDM_DT_F32, 2, (it->n + B - 1) / B, (it->k + B - 1) / B, 0);
            } else {
                desc(o, nm, TDM_DT_U8, 2, it->n, it->k / 2, 0);
                snprintf(nm, sizeof nm, "%s.weight_scale", it->name);
                desc(o, nm, TDM_DT_F8_E4M3, 2, it->n, it->k / G, 0);
                snprintf(nm, sizeof nm, "%s.weight_scale_2", it->name);
                desc(o, nm, TDM_DT_F32, 0, 0, 0, 0);
                snprintf(nm, sizeof nm, "%s.input_scale", it->name);
                desc(o, nm, TDM_DT_F32, 0, 0, 0, 0);
            }
            break;
        case G_FUSED: {
            /* [E, rows per expert, k] */
            int64_t E = p->c.n_experts;
            desc(o, it->name, TDM_DT_BF16, 3, E, it->n / E, it->k);
            break;
        }
        case G_CONV: desc(o, it->name, TDM_DT_BF16, 3, it->n, 1, it->k); break;
        default: desc(o, it->name, it->f32 ? TDM_DT_F32 : TDM_DT_BF16, 1, it->n, 0, 0); break;
        }
    }
}

static int put(struct out *o, const void *data, size_t n)
{
    while (o->done == tdm_st_desc_bytes(&o->d[o->cur]) && o->cur + 1 < o->nd) { o->cur++; o->done = 0; }
    if (tdm_stw_put(o->w[o->shard[o->cur]], data, n) != 0) return -1;
    o->done += n;
    o->written += (double)n;
    if (o->written >= o->next_report) {
        fprintf(stderr, "# %s: %.2f of %.2f GB written\n", prog, o->written / 1e9, o->total / 1e9);
        o->next_report += 1e9;
    }
    return 0;
}

static int put_bf16_rows(struct out *o, const float *x, int64_t n)
{
    uint16_t buf[4096];
    for (int64_t i = 0; i < n; i += 4096) {
        int64_t m = n - i < 4096 ? n - i : 4096;
        for (int64_t j = 0; j < m; j++) buf[j] = tdm_f32_to_bf16(x[i + j]);
        if (put(o, buf, (size_t)m * 2)) return -1;
    }
    return 0;
}

/* ---- a projection's rows, made in parallel row blocks and written in order ---- */

enum { ROW_BLOCK = 2048 };   /* rows made a round (a multiple of the FP8 block) */

struct proj_job {
    const struct plan *p;
    const struct item *it;
    uint64_t st;
    int64_t r_base;          /* first row of the round */
    uint16_t *bf16;          /* BF16: [ROW_BLOCK][k] */
    uint8_t *codes;          /* FP8: [ROW_BLOCK][k]; NVFP4: packed [ROW_BLOCK][k/2] */
    char *scales;            /* FP8: the tensor's block scales; NVFP4: [n][k/16] */
    float s2;
    int oom;
    pthread_mutex_t mu;
};

static float *job_rows(struct proj_job *j, int64_t rows)
{
    float *f = malloc((size_t)(rows * j->it->k) * sizeof(float));
    if (!f) {
        pthread_mutex_lock(&j->mu);
        j->oom = 1;
        pthread_mutex_unlock(&j->mu);
    }
    return f;
}

static void job_bf16(void *ctx, int64_t r0, int64_t r1)
{
    struct proj_job *j = ctx;
    const int64_t k = j->it->k;
    float *row = job_rows(j, 1);
    if (!row) return;
    for (int64_t r = r0; r < r1; r++) {
        normal_row(j->st, j->r_base + r, j->it->std, row, k);
        for (int64_t c = 0; c < k; c++) j->bf16[r * k + c] = tdm_f32_to_bf16(row[c]);
    }
    free(row);
}

static void job_fp8(void *ctx, int64_t r0, int64_t r1)
{
    struct proj_job *j = ctx;
    const int64_t B = TDM_FP8_BLOCK, k = j->it->k, n = j->it->n, nb = (k + B - 1) / B;
    const int64_t es = j->p->fp8_bf16_scales ? 2 : 4;
    float *rows = job_rows(j, B);
    if (!rows) return;
    for (int64_t b0 = r0; b0 < r1; b0 += B) {   /* r0 is a multiple of B: one scale block a pass */
        const int64_t g0 = j->r_base + b0, m = n - g0 < B ? n - g0 : B;
        for (int64_t r = 0; r < m; r++) normal_row(j->st, g0 + r, j->it->std, rows + r * k, k);
        tdm_fp8_quantize(rows, m, k, j->p->fp8_scale_bits, j->codes + b0 * k, j->scales + (g0 / B) * nb * es,
                         j->p->fp8_bf16_scales ? TDM_DT_BF16 : TDM_DT_F32);
    }
    free(rows);
}

/* Row r of the tensor as generated (tdm_parallel_amax's row source). */
static void job_row(void *ctx, int64_t r, float *out)
{
    const struct proj_job *j = ctx;
    normal_row(j->st, r, j->it->std, out, j->it->k);
}

static void job_nvfp4(void *ctx, int64_t r0, int64_t r1)
{
    struct proj_job *j = ctx;
    const int64_t k = j->it->k, G = TDM_NVFP4_GROUP;
    float *row = job_rows(j, 1), s2 = j->s2;
    if (!row) return;
    for (int64_t r = r0; r < r1; r++) {
        const int64_t g = j->r_base + r;
        normal_row(j->st, g, j->it->std, row, k);
        tdm_nvfp4_quantize(row, 1, k, j->s2, j->codes + r * (k / 2), (uint8_t *)j->scales + g * (k / G), &s2);
    }
    free(row);
}

static int emit_proj(const struct plan *p, const struct item *it, uint64_t st, struct out *o)
{
    const int64_t B = TDM_FP8_BLOCK, G = TDM_NVFP4_GROUP, n = it->n, k = it->k;
    struct proj_job j = {.p = p, .it = it, .st = st};
    pthread_mutex_init(&j.mu, NULL);
    int rc = 0;
    if (it->fmt == TDM_W_BF16) {
        if (!(j.bf16 = malloc((size_t)(ROW_BLOCK * k) * 2))) rc = tdm_errf("out of memory");
        for (int64_t r0 = 0; r0 < n && !rc; r0 += ROW_BLOCK) {
            const int64_t m = n - r0 < ROW_BLOCK ? n - r0 : ROW_BLOCK;
            j.r_base = r0;
            tdm_parallel_rows(n_threads, m, 1, job_bf16, &j);
            rc = j.oom ? tdm_errf("out of memory") : put(o, j.bf16, (size_t)(m * k) * 2);
        }
    } else if (it->fmt == TDM_W_FP8) {
        const int64_t nb = (k + B - 1) / B, es = p->fp8_bf16_scales ? 2 : 4;
        const size_t sbytes = (size_t)(((n + B - 1) / B) * nb * es);
        j.codes = malloc((size_t)(ROW_BLOCK * k));
        j.scales = malloc(sbytes);
        if (!j.codes || !j.scales) rc = tdm_errf("out of memory");
        for (int64_t r0 = 0; r0 < n && !rc; r0 += ROW_BLOCK) {
            const int64_t m = n - r0 < ROW_BLOCK ? n - r0 : ROW_BLOCK;
            j.r_base = r0;
            tdm_parallel_rows(n_threads, m, B, job_fp8, &j);
            rc = j.oom ? tdm_errf("out of memory") : put(o, j.codes, (size_t)(m * k));
        }
        if (!rc) rc = put(o, j.scales, sbytes);
    } else {
        /* NVFP4: the global scale from the whole tensor's amax, then row by row */
        float amax = 0.0f;
        if (tdm_parallel_amax(n_threads, n, k, job_row, &j, &amax) != 0) j.oom = 1;
        j.s2 = tdm_round_up_bits(tdm_nvfp4_scale2(amax), p->nvfp4_scale2_bits);
        j.codes = malloc((size_t)(ROW_BLOCK * (k / 2)));
        j.scales = malloc((size_t)(n * (k / G)));
        if (j.oom || !j.codes || !j.scales) rc = tdm_errf("out of memory");
        for (int64_t r0 = 0; r0 < n && !rc; r0 += ROW_BLOCK) {
            const int64_t m = n - r0 < ROW_BLOCK ? n - r0 : ROW_BLOCK;
            j.r_base = r0;
            tdm_parallel_rows(n_threads, m, 1, job_nvfp4, &j);
            rc = j.oom ? tdm_errf("out of memory") : put(o, j.codes, (size_t)(m * (k / 2)));
        }
        float one = 1.0f;
        if (!rc) rc = put(o, j.scales, (size_t)(n * (k / G))) || put(o, &j.s2, 4) || put(o, &one, 4);
    }
    free(j.bf16);
    free(j.codes);
    free(j.scales);
    pthread_mutex_destroy(&j.mu);
    return rc ? -1 : 0;
}

static int emit(struct plan *p, struct out *o)
{
    for (int i = 0; i < p->n; i++) {
        const struct item *it = &p->it[i];
        const uint64_t st = hash_name(p->seed, it->name);
        if (it->gen == G_FUSED) {
            /* Rows from the per-expert tensors' streams, so that fused and per-expert checkpoints
             * of one seed hold the same weights: gate_up = [gate_e; up_e], down = down_e. */
            const int64_t E = p->c.n_experts, per = it->n / E, k = it->k;
            const int gate_up = strstr(it->name, "gate_up_proj") != NULL;
            char stem[256], nm[300];
            snprintf(stem, sizeof stem, "%.*s", (int)(strstr(it->name, gate_up ? "gate_up_proj" : "down_proj") - it->name), it->name);
            float *row = malloc((size_t)k * sizeof(float));
            if (!row) return tdm_errf("out of memory");
            int rc = 0;
            for (int64_t e = 0; e < E && !rc; e++)
                for (int64_t r = 0; r < per && !rc; r++) {
                    const char *part = !gate_up ? "down_proj" : r < per / 2 ? "gate_proj" : "up_proj";
                    snprintf(nm, sizeof nm, "%s%lld.%s", stem, (long long)e, part);
                    normal_row(hash_name(p->seed, nm), gate_up ? r % (per / 2) : r, it->std, row, k);
                    rc = put_bf16_rows(o, row, k);
                }
            free(row);
            if (rc) return -1;
            continue;
        }
        if (it->gen == G_PROJ) {
            if (emit_proj(p, it, st, o) != 0) return -1;
            continue;
        }
        /* vectors and conv taps */
        const int64_t n = it->n * it->k;
        float *v = malloc((size_t)n * sizeof(float));
        if (!v) return tdm_errf("out of memory");
        switch (it->gen) {
        case G_ZC_NORM: case G_CONV: case G_DTBIAS: normal_row(st, 0, it->std, v, n); break;
        case G_ONE_NORM:
            normal_row(st, 0, it->std, v, n);
            for (int64_t j = 0; j < n; j++) v[j] = tdm_bf16r(1.0f + v[j]);
            break;
        case G_ALOG: /* A in [1, 16): decays of moderate speed */
            for (int64_t j = 0; j < n; j++) v[j] = tdm_bf16r(logf(1.0f + 15.0f * uniform01(st, j)));
            break;
        default: break;
        }
        int rc = it->f32 ? put(o, v, (size_t)n * 4) : put_bf16_rows(o, v, n);
        free(v);
        if (rc) return -1;
    }
    return 0;
}

/* ---- config.json ---- */

static json_t *ints(const int *v, int n)
{
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(v[i]));
    return a;
}

static json_t *text_config(const struct plan *p, int explicit_types, const int *mlp_only, int n_mlp_only)
{
    const struct tdm_config *c = &p->c;
    const int next = c->arch == TDM_ARCH_QWEN3_NEXT;
    json_t *t = json_object();
    json_object_set_new(t, "model_type", json_string(next ? "qwen3_next" : c->arch == TDM_ARCH_QWEN3_5 ? "qwen3_5_text" : "qwen3_5_moe_text"));
    json_object_set_new(t, "hidden_size", json_integer(c->hidden));
    json_object_set_new(t, "num_hidden_layers", json_integer(c->n_layers));
    json_object_set_new(t, "vocab_size", json_integer(c->vocab));
    json_object_set_new(t, "rms_norm_eps", json_real(c->rms_eps));
    json_object_set_new(t, "tie_word_embeddings", json_boolean(p->tied));
    json_object_set_new(t, "hidden_act", json_string("silu"));
    json_object_set_new(t, "num_attention_heads", json_integer(c->n_q_heads));
    json_object_set_new(t, "num_key_value_heads", json_integer(c->n_kv_heads));
    json_object_set_new(t, "head_dim", json_integer(c->head_dim));
    json_object_set_new(t, "attn_output_gate", json_true());
    double factor = (double)c->rotary_dim / c->head_dim;
    json_object_set_new(t, "partial_rotary_factor", json_real(factor));
    if (next) {
        json_object_set_new(t, "rope_theta", json_real(c->rope_theta));
    } else {
        json_t *rp = json_pack("{s:f, s:f, s:s, s:b, s:[iii]}", "rope_theta", c->rope_theta, "partial_rotary_factor",
                               factor, "rope_type", "default", "mrope_interleaved", 1, "mrope_section",
                               c->rotary_dim / 2 - 2 * (c->rotary_dim / 2 * 3 / 8), c->rotary_dim / 2 * 3 / 8,
                               c->rotary_dim / 2 * 3 / 8);
        json_object_set_new(t, "rope_parameters", rp);
    }
    json_object_set_new(t, "linear_num_key_heads", json_integer(c->gdn_k_heads));
    json_object_set_new(t, "linear_num_value_heads", json_integer(c->gdn_v_heads));
    json_object_set_new(t, "linear_key_head_dim", json_integer(c->gdn_k_dim));
    json_object_set_new(t, "linear_value_head_dim", json_integer(c->gdn_v_dim));
    json_object_set_new(t, "linear_conv_kernel_dim", json_integer(c->conv_kernel));
    /* Layer kinds: full_attention_interval always; layer_types as qwen3_5 writes it, or when asked. */
    int interval = 0;
    for (int f = 1; f <= c->n_layers && !interval; f++) {
        int fits = 1;
        for (int i = 0; i < c->n_layers && fits; i++) fits = (c->mixer[i] == TDM_MIXER_ATTN) == ((i + 1) % f == 0);
        if (fits) interval = f;
    }
    if (interval) json_object_set_new(t, "full_attention_interval", json_integer(interval));
    if (explicit_types || !interval || !next) {
        json_t *lt = json_array();
        for (int i = 0; i < c->n_layers; i++)
            json_array_append_new(lt, json_string(c->mixer[i] == TDM_MIXER_ATTN ? "full_attention" : "linear_attention"));
        json_object_set_new(t, "layer_types", lt);
    }
    if (c->intermediate) json_object_set_new(t, "intermediate_size", json_integer(c->intermediate));
    if (c->arch != TDM_ARCH_QWEN3_5) {
        json_object_set_new(t, "num_experts", json_integer(c->n_experts));
        json_object_set_new(t, "num_experts_per_tok", json_integer(c->top_k));
        json_object_set_new(t, "moe_intermediate_size", json_integer(c->moe_intermediate));
        json_object_set_new(t, "shared_expert_intermediate_size", json_integer(c->shared_intermediate));
        json_object_set_new(t, "norm_topk_prob", json_boolean(c->norm_topk));
        json_object_set_new(t, "decoder_sparse_step", json_integer(1));
        json_object_set_new(t, "mlp_only_layers", ints(mlp_only, n_mlp_only));
    }
    json_object_set_new(t, next ? "num_nextn_predict_layers" : "mtp_num_hidden_layers", json_integer(c->mtp_layers));
    json_object_set_new(t, "max_position_embeddings", json_integer(c->max_positions));
    json_object_set_new(t, "dtype", json_string("bfloat16"));
    return t;
}

static int write_json(const char *dir, const char *file, json_t *j)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    return tdm_json_write_atomic(path, j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
}

/* ---- options ---- */

enum { O_LAYOUT = 256, O_SHAPE, O_FORMAT, O_SEED, O_LAYERS, O_ATTN_EVERY, O_LAYER_TYPES, O_HIDDEN, O_VOCAB, O_QH, O_KVH,
       O_HD, O_ROT, O_GKH, O_GVH, O_GKD, O_GVD, O_INTER, O_EXPERTS, O_TOPK, O_MOEI, O_SHI, O_MLPONLY, O_NONORM, O_TIE,
       O_NOMTP, O_FP8S, O_POW2, O_FUSED, O_SHARD, O_EXACT, O_THREADS };

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"out", 1, 0, 'o'}, {"layout", 1, 0, O_LAYOUT}, {"shape", 1, 0, O_SHAPE}, {"format", 1, 0, O_FORMAT},
        {"seed", 1, 0, O_SEED}, {"layers", 1, 0, O_LAYERS}, {"attn-every", 1, 0, O_ATTN_EVERY},
        {"layer-types", 1, 0, O_LAYER_TYPES}, {"hidden", 1, 0, O_HIDDEN}, {"vocab", 1, 0, O_VOCAB},
        {"q-heads", 1, 0, O_QH}, {"kv-heads", 1, 0, O_KVH}, {"head-dim", 1, 0, O_HD}, {"rotary-dim", 1, 0, O_ROT},
        {"gdn-key-heads", 1, 0, O_GKH}, {"gdn-value-heads", 1, 0, O_GVH}, {"gdn-key-dim", 1, 0, O_GKD},
        {"gdn-value-dim", 1, 0, O_GVD}, {"intermediate", 1, 0, O_INTER}, {"experts", 1, 0, O_EXPERTS},
        {"top-k", 1, 0, O_TOPK}, {"moe-intermediate", 1, 0, O_MOEI}, {"shared-intermediate", 1, 0, O_SHI},
        {"mlp-only-layers", 1, 0, O_MLPONLY}, {"no-norm-topk", 0, 0, O_NONORM}, {"tie", 0, 0, O_TIE},
        {"no-mtp", 0, 0, O_NOMTP}, {"fp8-scales", 1, 0, O_FP8S}, {"pow2-scales", 0, 0, O_POW2},
        {"fused-experts", 0, 0, O_FUSED}, {"shard-mb", 1, 0, O_SHARD}, {"bf16-exact-scales", 0, 0, O_EXACT},
        {"threads", 1, 0, O_THREADS}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    const char *out_dir = NULL, *layout = "qwen3_5", *shape = "tiny", *format = "bf16", *layer_types = NULL,
               *mlp_only_s = NULL;
    long seed = 1, shard_mb = 0, ov[O_EXACT + 1];
    for (int i = 0; i <= O_EXACT; i++) ov[i] = -1;
    struct plan p = {0};
    int o;
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    n_threads = online < 1 ? 1 : online > 64 ? 64 : (int)online;
    const long BIG = 1L << 24;
    while ((o = tdm_getopt(prog, argc, argv, "o:h", opts)) != -1) {
        switch (o) {
        case 'o': out_dir = optarg; break;
        case O_LAYOUT: layout = optarg; break;
        case O_SHAPE: shape = optarg; break;
        case O_FORMAT: format = optarg; break;
        case O_SEED: seed = tdm_opt_long(prog, "--seed", optarg, 0, 0x7fffffffL); break;
        case O_LAYER_TYPES: layer_types = optarg; break;
        case O_MLPONLY: mlp_only_s = optarg; break;
        case O_NONORM: ov[O_NONORM] = 1; break;
        case O_TIE: p.tied = 1; break;
        case O_NOMTP: ov[O_NOMTP] = 1; break;
        case O_FP8S:
            if (strcmp(optarg, "bf16") && strcmp(optarg, "f32")) {
                fprintf(stderr, "%s: --fp8-scales %s: expected f32 or bf16\n", prog, optarg);
                return TDM_EXIT_USAGE;
            }
            p.fp8_bf16_scales = strcmp(optarg, "bf16") == 0;
            break;
        case O_POW2: p.fp8_scale_bits = p.nvfp4_scale2_bits = 1; break;
        case O_EXACT: p.fp8_scale_bits = 4; p.nvfp4_scale2_bits = 2; break;
        case O_FUSED: p.fused = 1; break;
        case O_SHARD: shard_mb = tdm_opt_long(prog, "--shard-mb", optarg, 1, BIG); break;
        case O_THREADS: n_threads = (int)tdm_opt_long(prog, "--threads", optarg, 1, 64); break;
        case 'h': usage(stdout); return 0;
        default: ov[o] = tdm_opt_long(prog, opts[o - O_LAYOUT + 1].name, optarg, 1, BIG); break;
        }
    }
    if (optind < argc) { fprintf(stderr, "%s: unexpected argument '%s'\n", prog, argv[optind]); return TDM_EXIT_USAGE; }
    if (!out_dir) { fprintf(stderr, "%s: -o DIR is required (see --help)\n", prog); return TDM_EXIT_USAGE; }
    enum tdm_arch arch;
    if (strcmp(layout, "qwen3_5") == 0) arch = TDM_ARCH_QWEN3_5;
    else if (strcmp(layout, "qwen3_5_moe") == 0) arch = TDM_ARCH_QWEN3_5_MOE;
    else if (strcmp(layout, "qwen3_next") == 0) arch = TDM_ARCH_QWEN3_NEXT;
    else { fprintf(stderr, "%s: --layout %s: expected qwen3_5, qwen3_5_moe or qwen3_next\n", prog, layout); return TDM_EXIT_USAGE; }
    if (strcmp(format, "bf16") == 0) p.fmt = TDM_W_BF16;
    else if (strcmp(format, "fp8") == 0) p.fmt = TDM_W_FP8;
    else if (strcmp(format, "nvfp4") == 0) p.fmt = TDM_W_NVFP4;
    else { fprintf(stderr, "%s: --format %s: expected bf16, fp8 or nvfp4\n", prog, format); return TDM_EXIT_USAGE; }
    if (p.fused && p.fmt != TDM_W_BF16) { fprintf(stderr, "%s: --fused-experts is supported for --format bf16 only\n", prog); return TDM_EXIT_USAGE; }

    struct tdm_config *c = &p.c;
    if (tdm_preset(shape, arch, c) != 0) { fprintf(stderr, "%s: --shape: %s\n", prog, tdm_err()); return TDM_EXIT_USAGE; }
    if (strcmp(shape, "tiny") != 0 && c->arch != arch) {
        /* the real shapes carry their own layout; a MoE wrapper of the 80B shape is allowed */
        if (!(arch == TDM_ARCH_QWEN3_5_MOE && c->arch == TDM_ARCH_QWEN3_NEXT)) {
            fprintf(stderr, "%s: --shape %s is a %s model; --layout %s does not fit it\n", prog, shape,
                    tdm_arch_name(c->arch), layout);
            return TDM_EXIT_USAGE;
        }
        c->arch = arch;
    }
    if (ov[O_HIDDEN] > 0) c->hidden = (int)ov[O_HIDDEN];
    if (ov[O_VOCAB] > 0) c->vocab = (int)ov[O_VOCAB];
    if (ov[O_QH] > 0) c->n_q_heads = (int)ov[O_QH];
    if (ov[O_KVH] > 0) c->n_kv_heads = (int)ov[O_KVH];
    if (ov[O_HD] > 0) { c->rotary_dim = c->rotary_dim * (int)ov[O_HD] / c->head_dim; c->head_dim = (int)ov[O_HD]; }
    if (ov[O_ROT] > 0) c->rotary_dim = (int)ov[O_ROT];
    if (ov[O_GKH] > 0) c->gdn_k_heads = (int)ov[O_GKH];
    if (ov[O_GVH] > 0) c->gdn_v_heads = (int)ov[O_GVH];
    if (ov[O_GKD] > 0) c->gdn_k_dim = (int)ov[O_GKD];
    if (ov[O_GVD] > 0) c->gdn_v_dim = (int)ov[O_GVD];
    if (ov[O_INTER] > 0) c->intermediate = (int)ov[O_INTER];
    if (ov[O_EXPERTS] > 0) c->n_experts = (int)ov[O_EXPERTS];
    if (ov[O_TOPK] > 0) c->top_k = (int)ov[O_TOPK];
    if (ov[O_MOEI] > 0) c->moe_intermediate = (int)ov[O_MOEI];
    if (ov[O_SHI] > 0) c->shared_intermediate = (int)ov[O_SHI];
    if (ov[O_NONORM] > 0) c->norm_topk = 0;
    if (ov[O_NOMTP] > 0) c->mtp_layers = 0;
    if (c->arch == TDM_ARCH_QWEN3_5_MOE && !c->n_experts) {
        c->n_experts = 8; c->top_k = 2; c->moe_intermediate = 128; c->shared_intermediate = 128; c->norm_topk = 1;
    }
    if (c->arch == TDM_ARCH_QWEN3_5_MOE && ov[O_NONORM] > 0) {
        fprintf(stderr, "%s: qwen3_5_moe always renormalises the top-k weights (--no-norm-topk is qwen3_next only)\n", prog);
        return TDM_EXIT_USAGE;
    }
    int layers = ov[O_LAYERS] > 0 ? (int)ov[O_LAYERS] : layer_types ? (int)strlen(layer_types) : c->n_layers;
    if (tdm_config_set_layers(c, layers, ov[O_ATTN_EVERY] > 0 ? (int)ov[O_ATTN_EVERY] : 4)) tdm_die_input(prog);
    if (layer_types) {
        if ((int)strlen(layer_types) != layers) {
            fprintf(stderr, "%s: --layer-types has %zu letters for %d layers\n", prog, strlen(layer_types), layers);
            return TDM_EXIT_USAGE;
        }
        for (int i = 0; i < layers; i++) {
            if (layer_types[i] != 'G' && layer_types[i] != 'A') {
                fprintf(stderr, "%s: --layer-types: '%c' is not G or A\n", prog, layer_types[i]);
                return TDM_EXIT_USAGE;
            }
            c->mixer[i] = layer_types[i] == 'A' ? TDM_MIXER_ATTN : TDM_MIXER_GDN;
        }
    }
    int mlp_only[256];
    const int n_mlp_only = mlp_only_s ? tdm_parse_int_list(mlp_only_s, 0, layers - 1, mlp_only, 256) : 0;
    if (n_mlp_only < 0) {
        fprintf(stderr, "%s: --mlp-only-layers %s: expected comma-separated layer indices below %d\n", prog, mlp_only_s, layers);
        return TDM_EXIT_USAGE;
    }
    for (int i = 0; i < n_mlp_only && c->arch != TDM_ARCH_QWEN3_5; i++) c->is_moe[mlp_only[i]] = 0;
    if (n_mlp_only && c->arch == TDM_ARCH_QWEN3_5) {
        fprintf(stderr, "%s: --mlp-only-layers needs a MoE layout\n", prog);
        return TDM_EXIT_USAGE;
    }
    if (n_mlp_only && !c->intermediate) c->intermediate = 4 * c->moe_intermediate;
    if (c->n_q_heads % c->n_kv_heads || c->gdn_v_heads % c->gdn_k_heads || c->rotary_dim % 2 || c->rotary_dim > c->head_dim ||
        (c->arch != TDM_ARCH_QWEN3_5 && (c->top_k > c->n_experts))) {
        fprintf(stderr, "%s: inconsistent shape (heads must divide, rotary dims even and <= head dim, top-k <= experts)\n", prog);
        return TDM_EXIT_USAGE;
    }
    p.seed = (uint64_t)seed;
    snprintf(p.prefix, sizeof p.prefix, "%s", c->arch == TDM_ARCH_QWEN3_NEXT ? "model." : "model.language_model.");
    p.excluded = json_array();
    plan_model(&p);

    if (mkdir(out_dir, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "%s: %s: %s\n", prog, out_dir, strerror(errno));
        return TDM_EXIT_USAGE;
    }
    char cfgpath[4096];
    snprintf(cfgpath, sizeof cfgpath, "%s/config.json", out_dir);
    unlink(cfgpath); /* a half-made directory must not look like a model */

    struct out o2 = {0};
    describe(&p, &o2);
    o2.shard = calloc((size_t)o2.nd, sizeof *o2.shard);
    double shard_bytes = shard_mb ? shard_mb * 1e6 : 1e300, acc = 0;
    for (int i = 0; i < o2.nd; i++) {
        double b = (double)tdm_st_desc_bytes(&o2.d[i]);
        if (acc > 0 && acc + b > shard_bytes) { o2.nshards++; acc = 0; }
        o2.shard[i] = o2.nshards;
        acc += b;
        o2.total += b;
    }
    o2.nshards++;
    o2.w = calloc((size_t)o2.nshards, sizeof *o2.w);
    o2.next_report = 1e9;
    json_t *wmap = json_object();
    int rc = 0;
    for (int s = 0, first = 0; s < o2.nshards && !rc; s++) {
        int last = first;
        while (last < o2.nd && o2.shard[last] == s) last++;
        char name[64], path[4096];
        if (o2.nshards == 1) snprintf(name, sizeof name, "model.safetensors");
        else snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, o2.nshards);
        snprintf(path, sizeof path, "%s/%s", out_dir, name);
        if (!(o2.w[s] = tdm_stw_begin(path, o2.d + first, last - first))) rc = -1;
        for (int i = first; i < last; i++) json_object_set_new(wmap, o2.d[i].name, json_string(name));
        first = last;
    }
    if (!rc) rc = emit(&p, &o2);
    for (int s = 0; s < o2.nshards; s++) {
        if (!o2.w[s]) continue;
        if (rc) tdm_stw_abort(o2.w[s]);
        else if (tdm_stw_finish(o2.w[s]) != 0) rc = -1;
    }
    if (!rc && o2.nshards > 1) {
        json_t *idx = json_pack("{s:{s:I}, s:O}", "metadata", "total_size", (json_int_t)o2.total, "weight_map", wmap);
        rc = write_json(out_dir, "model.safetensors.index.json", idx);
        json_decref(idx);
    }
    if (!rc && p.fmt == TDM_W_NVFP4) {
        json_t *hq = json_pack("{s:{s:s}, s:{s:s, s:n, s:i, s:O}}", "producer", "name", "modelopt", "quantization",
                               "quant_algo", "NVFP4", "kv_cache_quant_algo", "group_size", 16, "exclude_modules", p.excluded);
        rc = write_json(out_dir, "hf_quant_config.json", hq);
        json_decref(hq);
    }
    if (!rc) {
        json_t *tc = text_config(&p, layer_types != NULL, mlp_only, n_mlp_only), *cfg;
        json_t *q = NULL;
        if (p.fmt == TDM_W_FP8)
            q = json_pack("{s:s, s:s, s:s, s:[ii], s:O}", "quant_method", "fp8", "fmt", "e4m3", "activation_scheme",
                          "dynamic", "weight_block_size", 128, 128, "modules_to_not_convert", p.excluded);
        else if (p.fmt == TDM_W_NVFP4)
            q = json_pack("{s:s, s:s, s:i, s:O}", "quant_method", "modelopt", "quant_algo", "NVFP4", "group_size", 16,
                          "exclude_modules", p.excluded);
        if (c->arch == TDM_ARCH_QWEN3_NEXT) {
            cfg = tc;
            json_object_set_new(cfg, "architectures", json_pack("[s]", "Qwen3NextForCausalLM"));
        } else {
            int moe = c->arch == TDM_ARCH_QWEN3_5_MOE;
            cfg = json_pack("{s:[s], s:s, s:o, s:b, s:{s:s, s:i}}", "architectures",
                            moe ? "Qwen3_5MoeForConditionalGeneration" : "Qwen3_5ForConditionalGeneration", "model_type",
                            moe ? "qwen3_5_moe" : "qwen3_5", "text_config", tc, "tie_word_embeddings", p.tied,
                            "vision_config", "model_type", moe ? "qwen3_5_moe_vision" : "qwen3_5_vision", "depth", 0);
        }
        if (q) json_object_set_new(cfg, "quantization_config", q);
        rc = write_json(out_dir, "config.json", cfg);
        json_decref(cfg);
    }
    json_decref(wmap);
    json_decref(p.excluded);
    if (rc) { fprintf(stderr, "%s: %s\n", prog, tdm_err()); return 1; }
    fprintf(stderr, "# %s: %s %s %s model, %d layers, %.1f MB in %d file%s -> %s\n", prog, tdm_arch_name(c->arch),
            shape, format, c->n_layers, o2.total / 1e6, o2.nshards, o2.nshards > 1 ? "s" : "", out_dir);
    for (int i = 0; i < o2.nd; i++) free((char *)o2.d[i].name);
    free(o2.d); free(o2.shard); free(o2.w); free(p.it);
    tdm_config_free(c);
    return 0;
}
