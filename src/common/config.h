/* config.h — a model's config.json as the engine needs it, for both layouts of the family:
 * qwen3_5 / qwen3_5_moe (vision-language wrapper, keys under text_config) and qwen3_next (keys at
 * the top level). A config that lacks a key the model needs is rejected, naming the key. */
#ifndef TDM_CONFIG_H
#define TDM_CONFIG_H
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

enum tdm_arch { TDM_ARCH_QWEN3_5, TDM_ARCH_QWEN3_5_MOE, TDM_ARCH_QWEN3_NEXT };
enum tdm_mixer { TDM_MIXER_GDN, TDM_MIXER_ATTN };

struct tdm_config {
    enum tdm_arch arch;
    char model_type[32];
    int hidden;             /* H */
    int n_layers;           /* L */
    int vocab;              /* V */
    float rms_eps;
    int tie_embeddings;
    /* gated attention */
    int n_q_heads, n_kv_heads, head_dim, rotary_dim;
    double rope_theta;
    /* Gated DeltaNet */
    int gdn_k_heads, gdn_v_heads, gdn_k_dim, gdn_v_dim, conv_kernel;
    /* MLP: dense width, and the mixture of experts */
    int intermediate;
    int n_experts, top_k, moe_intermediate, shared_intermediate, norm_topk;
    /* per layer */
    enum tdm_mixer *mixer; /* [L] */
    int *is_moe;           /* [L] */
    int mtp_layers;        /* 0: no MTP drafter */
    int max_positions;     /* max_position_embeddings, 0 when absent */
};

/* Loads DIR/config.json. Returns 0, or -1 with tdm_err() naming the file and the fault. */
int tdm_config_load(const char *dir, struct tdm_config *c);
void tdm_config_free(struct tdm_config *c);
const char *tdm_arch_name(enum tdm_arch a);
/* Derived sizes */
static inline int tdm_gdn_conv_dim(const struct tdm_config *c)
{
    return 2 * c->gdn_k_heads * c->gdn_k_dim + c->gdn_v_heads * c->gdn_v_dim;
}
#ifdef __cplusplus
}
#endif
#endif
