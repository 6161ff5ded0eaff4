#include "shapes.h"
#include "presets.h"
#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* The tables are derived from the presets (presets.c holds each model's numbers once): the
 * projections of one token's forward, named as the checkpoints name them, with how many of each
 * the forward runs. Routed experts and the MTP layer count 0 (they run outside the plain per-token
 * chain). */
#define MAX_PROJ 16
static struct tdm_proj_shape tables[2][MAX_PROJ];
static struct tdm_model_shapes models[2] = {
    {"qwen3.8-27b", "Qwen3.8-27B (dense, H 5120, 64 layers)", 0, tables[0]},
    {"qwen3-next-80b", "Qwen3-Next-80B-A3B (MoE, H 2048, 48 layers)", 0, tables[1]},
};

const char *const tdm_model_names[] = {"qwen3.8-27b", "qwen3-next-80b", NULL};

/* Appends a shape to model i's table (tables[i], which models[i].shapes points at). */
static void add(int i, const char *name, int64_t n, int64_t k, int per_token)
{
    tables[i][models[i].nshapes++] = (struct tdm_proj_shape){name, n, k, per_token};
}

static int derive(int i)
{
    struct tdm_model_shapes *m = &models[i];
    struct tdm_config c;
    if (tdm_preset(m->model, TDM_ARCH_QWEN3_5, &c) != 0) return -1;
    int n_gdn = 0, n_attn = 0;
    for (int i = 0; i < c.n_layers; i++) c.mixer[i] == TDM_MIXER_ATTN ? n_attn++ : n_gdn++;
    const int64_t H = c.hidden, HkDk = (int64_t)c.gdn_k_heads * c.gdn_k_dim, HvDv = (int64_t)c.gdn_v_heads * c.gdn_v_dim;
    const int64_t QD = (int64_t)c.n_q_heads * c.head_dim, KVD = (int64_t)c.n_kv_heads * c.head_dim;
    m->nshapes = 0;
    if (c.arch == TDM_ARCH_QWEN3_5) {
        add(i, "linear_attn.in_proj_qkv", 2 * HkDk + HvDv, H, n_gdn);
        add(i, "linear_attn.in_proj_z", HvDv, H, n_gdn);
        add(i, "linear_attn.in_proj_b", c.gdn_v_heads, H, n_gdn);
        add(i, "linear_attn.in_proj_a", c.gdn_v_heads, H, n_gdn);
    } else {
        add(i, "linear_attn.in_proj_qkvz", 2 * HkDk + 2 * HvDv, H, n_gdn);
        add(i, "linear_attn.in_proj_ba", 2 * c.gdn_v_heads, H, n_gdn);
    }
    add(i, "linear_attn.out_proj", H, HvDv, n_gdn);
    add(i, "self_attn.q_proj", 2 * QD, H, n_attn);   /* query and output gate */
    add(i, "self_attn.k_proj", KVD, H, n_attn);
    add(i, "self_attn.v_proj", KVD, H, n_attn);
    add(i, "self_attn.o_proj", H, QD, n_attn);
    if (c.n_experts == 0) {
        add(i, "mlp.gate_proj", c.intermediate, H, c.n_layers);
        add(i, "mlp.up_proj", c.intermediate, H, c.n_layers);
        add(i, "mlp.down_proj", H, c.intermediate, c.n_layers);
    } else {
        add(i, "mlp.shared_expert.gate_proj", c.shared_intermediate, H, c.n_layers);
        add(i, "mlp.shared_expert.up_proj", c.shared_intermediate, H, c.n_layers);
        add(i, "mlp.shared_expert.down_proj", H, c.shared_intermediate, c.n_layers);
        add(i, "mlp.experts.gate_up_proj", 2 * (int64_t)c.moe_intermediate, H, 0);   /* one expert's fused [gate; up] */
        add(i, "mlp.experts.down_proj", H, c.moe_intermediate, 0);
    }
    add(i, "mtp.fc", H, 2 * H, 0);
    tdm_config_free(&c);
    return 0;
}

const struct tdm_model_shapes *tdm_model_shapes(const char *model)
{
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++)
        if (strcmp(models[i].model, model) == 0) {
            if (models[i].nshapes == 0 && derive((int)i) != 0) return NULL;
            return &models[i];
        }
    return NULL;
}

int tdm_model_distinct_shapes(const struct tdm_model_shapes *m, int64_t (*nk)[2], int max)
{
    int cnt = 0;
    for (int i = 0; i < m->nshapes; i++) {
        int seen = 0;
        for (int j = 0; j < cnt; j++)
            if (nk[j][0] == m->shapes[i].n && nk[j][1] == m->shapes[i].k) seen = 1;
        if (!seen && cnt < max) {
            nk[cnt][0] = m->shapes[i].n;
            nk[cnt][1] = m->shapes[i].k;
            cnt++;
        }
    }
    return cnt;
}

int64_t tdm_model_token_params(const struct tdm_model_shapes *m)
{
    int64_t p = 0;
    for (int i = 0; i < m->nshapes; i++) p += m->shapes[i].n * m->shapes[i].k * m->shapes[i].per_token;
    return p;
}

int tdm_parse_shape(const char *s, int64_t *n, int64_t *k)
{
    char *end;
    errno = 0;
    long long a = strtoll(s, &end, 10);
    if (errno || end == s || *end != ',' || a < 1) return -1;
    const char *p = end + 1;
    long long b = strtoll(p, &end, 10);
    if (errno || end == p || *end || b < 1) return -1;
    *n = a;
    *k = b;
    return 0;
}
