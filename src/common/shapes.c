#include "shapes.h"
#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Qwen3.8-27B (qwen3_5 dense): H 5120, 64 layers, 48 Gated DeltaNet + 16 gated attention; GDN 16
 * key / 48 value heads of 128; attention 24 Q / 4 KV heads of 256; dense MLP 17408. One token:
 * 24.3 G projection parameters = 13.7 GB at NVFP4. */
static const struct tdm_proj_shape qwen38_27b[] = {
    {"linear_attn.in_proj_qkv", 10240, 5120, 48}, /* 2*16*128 + 48*128 */
    {"linear_attn.in_proj_z", 6144, 5120, 48},
    {"linear_attn.in_proj_b", 48, 5120, 48},
    {"linear_attn.in_proj_a", 48, 5120, 48},
    {"linear_attn.out_proj", 5120, 6144, 48},
    {"self_attn.q_proj", 12288, 5120, 16},        /* 2 * 24 * 256: query and output gate */
    {"self_attn.k_proj", 1024, 5120, 16},
    {"self_attn.v_proj", 1024, 5120, 16},
    {"self_attn.o_proj", 5120, 6144, 16},
    {"mlp.gate_proj", 17408, 5120, 64},
    {"mlp.up_proj", 17408, 5120, 64},
    {"mlp.down_proj", 5120, 17408, 64},
    {"mtp.fc", 5120, 10240, 0},
};

/* Qwen3-Next-80B-A3B: H 2048, 48 layers (36 GDN + 12 attention); GDN 16 key / 32 value heads of
 * 128; attention 16 Q / 2 KV of 256; 512 experts (top 10) of width 512 and a shared expert of 512.
 * Routed experts run through the MoE kernels: per_token 0 here. */
static const struct tdm_proj_shape qwen3_next_80b[] = {
    {"linear_attn.in_proj_qkvz", 12288, 2048, 36}, /* 2*16*128 + 2*32*128 */
    {"linear_attn.in_proj_ba", 64, 2048, 36},
    {"linear_attn.out_proj", 2048, 4096, 36},
    {"self_attn.q_proj", 8192, 2048, 12},          /* 2 * 16 * 256 */
    {"self_attn.k_proj", 512, 2048, 12},
    {"self_attn.v_proj", 512, 2048, 12},
    {"self_attn.o_proj", 2048, 4096, 12},
    {"mlp.shared_expert.gate_proj", 512, 2048, 48},
    {"mlp.shared_expert.up_proj", 512, 2048, 48},
    {"mlp.shared_expert.down_proj", 2048, 512, 48},
    {"mlp.experts.gate_up_proj", 1024, 2048, 0},  /* one expert's fused [gate; up] */
    {"mlp.experts.down_proj", 2048, 512, 0},
    {"mtp.fc", 2048, 4096, 0},
};

static const struct tdm_model_shapes models[] = {
    {"qwen3.8-27b", "Qwen3.8-27B (dense, H 5120, 64 layers)", sizeof qwen38_27b / sizeof qwen38_27b[0], qwen38_27b},
    {"qwen3-next-80b", "Qwen3-Next-80B-A3B (MoE, H 2048, 48 layers)", sizeof qwen3_next_80b / sizeof qwen3_next_80b[0],
     qwen3_next_80b},
};

const char *const tdm_model_names[] = {"qwen3.8-27b", "qwen3-next-80b", NULL};

const struct tdm_model_shapes *tdm_model_shapes(const char *model)
{
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++)
        if (strcmp(models[i].model, model) == 0) return &models[i];
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
