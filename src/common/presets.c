#include "presets.h"
#include "err.h"
#include <stdlib.h>
#include <string.h>

const char *const tdm_preset_names = "tiny qwen3.8-27b qwen3-next-80b";

int tdm_config_set_layers(struct tdm_config *c, int n_layers, int attn_interval)
{
    free(c->mixer);
    free(c->is_moe);
    c->n_layers = n_layers;
    c->mixer = calloc((size_t)n_layers, sizeof *c->mixer);
    c->is_moe = calloc((size_t)n_layers, sizeof *c->is_moe);
    if (!c->mixer || !c->is_moe) return tdm_errf("out of memory");
    for (int i = 0; i < n_layers; i++) {
        c->mixer[i] = (i + 1) % attn_interval == 0 ? TDM_MIXER_ATTN : TDM_MIXER_GDN;
        c->is_moe[i] = c->arch != TDM_ARCH_QWEN3_5;
    }
    return 0;
}

int tdm_preset(const char *name, enum tdm_arch arch, struct tdm_config *c)
{
    memset(c, 0, sizeof *c);
    c->rms_eps = 1e-6f;
    c->rope_theta = 10000000.0;
    c->conv_kernel = 4;
    c->mtp_layers = 1;
    c->max_positions = 262144;
    int layers, interval = 4;
    if (strcmp(name, "tiny") == 0) {
        /* The fixtures' size: vocab 1024, hidden 256, 4 layers, heads of 64, rotary 16. */
        c->arch = arch;
        c->hidden = 256; c->vocab = 1024; layers = 4;
        c->head_dim = 64; c->rotary_dim = 16; c->n_kv_heads = 2;
        c->gdn_k_heads = 2; c->gdn_k_dim = 64; c->gdn_v_dim = 64;
        c->max_positions = 4096;
        if (arch == TDM_ARCH_QWEN3_5) {
            c->n_q_heads = 6; c->gdn_v_heads = 6; c->intermediate = 512;
        } else {
            c->n_q_heads = 4; c->gdn_v_heads = 4; c->intermediate = 512;
            c->n_experts = 8; c->top_k = 2; c->moe_intermediate = 128; c->shared_intermediate = 128; c->norm_topk = 1;
        }
    } else if (strcmp(name, "qwen3.8-27b") == 0) {
        /* models.md: H 5120, 64 layers (3:1), attention 24/4 heads of 256 (rotary 64), GDN 16/48
         * heads of 128, dense MLP 17408, vocab 248320, untied, 1 MTP layer. */
        c->arch = TDM_ARCH_QWEN3_5;
        c->hidden = 5120; c->vocab = 248320; layers = 64;
        c->n_q_heads = 24; c->n_kv_heads = 4; c->head_dim = 256; c->rotary_dim = 64;
        c->gdn_k_heads = 16; c->gdn_v_heads = 48; c->gdn_k_dim = 128; c->gdn_v_dim = 128;
        c->intermediate = 17408;
    } else if (strcmp(name, "qwen3-next-80b") == 0) {
        /* models.md: H 2048, 48 layers (3:1), attention 16/2 of 256, GDN 16/32 of 128, 512 experts
         * top-10 of width 512 + shared expert 512, vocab 151936, 1 MTP layer. */
        c->arch = TDM_ARCH_QWEN3_NEXT;
        c->hidden = 2048; c->vocab = 151936; layers = 48;
        c->n_q_heads = 16; c->n_kv_heads = 2; c->head_dim = 256; c->rotary_dim = 64;
        c->gdn_k_heads = 16; c->gdn_v_heads = 32; c->gdn_k_dim = 128; c->gdn_v_dim = 128;
        c->intermediate = 5120;
        c->n_experts = 512; c->top_k = 10; c->moe_intermediate = 512; c->shared_intermediate = 512; c->norm_topk = 1;
    } else {
        return tdm_errf("unknown shape '%s' (one of: %s)", name, tdm_preset_names);
    }
    snprintf(c->model_type, sizeof c->model_type, "%s", tdm_arch_name(c->arch));
    return tdm_config_set_layers(c, layers, interval);
}
