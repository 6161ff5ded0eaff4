/* model.h — a checkpoint bound to the model it describes: every tensor found by its hub name,
 * checked against the shape the config implies, its storage format detected per tensor.
 * Projection weights stay in the mapped files (struct tdm_qweight); small vectors (norms, gates,
 * conv taps) are converted to FP32 at load. */
#ifndef TDM_MODEL_H
#define TDM_MODEL_H
#include "ckpt.h"
#include "config.h"
#include "linear.h"
#ifdef __cplusplus
extern "C" {
#endif

struct tdm_gdn {
    int grouped;                      /* qwen3_next: qkvz and ba grouped per key head */
    struct tdm_qweight qkvz, ba;      /* grouped: [2HkDk + 2HvDv, H], [2Hv, H] */
    struct tdm_qweight qkv, z, b, a;  /* separate (qwen3_5): [2HkDk + HvDv, H], [HvDv, H], [Hv, H] x2 */
    float *conv_w;                    /* [conv_dim][conv_kernel] */
    float *A_log, *dt_bias;           /* [Hv] */
    float *norm_w;                    /* [Dv], shared by the heads */
    struct tdm_qweight out;           /* [H, HvDv] */
};

struct tdm_attn {
    struct tdm_qweight q;             /* [2 Hq D, H]: per head the query, then the output gate */
    struct tdm_qweight k, v;          /* [Hkv D, H] */
    struct tdm_qweight o;             /* [H, Hq D] */
    float *q_norm, *k_norm;           /* [D] */
};

struct tdm_mlp { struct tdm_qweight gate, up, down; };  /* [I, H], [I, H], [H, I] */

struct tdm_moe {
    struct tdm_qweight router;        /* [E, H] */
    struct tdm_mlp *experts;          /* [E] */
    struct tdm_mlp shared;
    struct tdm_qweight shared_gate;   /* [1, H] */
};

struct tdm_layer {
    enum tdm_mixer mixer;
    float *in_norm, *post_norm;       /* [H] */
    struct tdm_gdn gdn;
    struct tdm_attn attn;
    int is_moe;
    struct tdm_mlp mlp;
    struct tdm_moe moe;
};

struct tdm_mtp {
    float *pre_fc_norm_embedding, *pre_fc_norm_hidden, *norm; /* [H] */
    struct tdm_qweight fc;            /* [H, 2H]: embedding half first */
    struct tdm_layer layer;           /* a full-attention decoder layer */
    /* TANDEM_DRAFT_FORMAT=nvfp4|fp8 (tdm_model_load): the layer's BF16 projections and fc above hold
     * requantizations to that format (requant: its enum tdm_wfmt; -1 as stored), and head a
     * requantized copy of the model's head (has_head; else the drafter reads the model's head).
     * draft_bytes: what a draft token's projections and head read as stored (model.c:
     * draft_weights); draft_bytes_now: as held. */
    struct tdm_qweight head;
    int has_head, requant;
    int64_t draft_bytes, draft_bytes_now;
};

struct tdm_model {
    char *dir;
    struct tdm_config cfg;
    struct tdm_ckpt *ck;
    struct tdm_qweight embed;         /* [V, H] */
    struct tdm_qweight head;          /* [V, H]; the embedding when tied */
    float *final_norm;                /* [H] */
    struct tdm_layer *layers;         /* [L] */
    int has_mtp;
    struct tdm_mtp mtp;
    /* TANDEM_HEAD_FORMAT=nvfp4|fp8 (tdm_model_load): head holds a requantization (head.fmt) of the
     * stored BF16 or F32 head, and head_bytes_stored what the stored head reads (0: head is as
     * stored). */
    int64_t head_bytes_stored;
    int nowned, capowned;
    void **owned;                     /* everything allocated at load */
};

/* How a model's MTP drafter reads its weights, for messages (into buf, returned): "as stored",
 * "requantized to NVFP4 (TANDEM_DRAFT_FORMAT)", or "as stored, the head requantized to FP8
 * (TANDEM_HEAD_FORMAT)" when only the model's head that it reads was. */
const char *tdm_model_draft_how(const struct tdm_model *m, char *buf, size_t n);
/* Loads config and checkpoint; returns NULL with tdm_err() naming the file and the fault. */
struct tdm_model *tdm_model_load(const char *dir);
void tdm_model_free(struct tdm_model *m);
/* Total bytes of projection weights (what a decode step streams), head included. */
int64_t tdm_model_projection_bytes(const struct tdm_model *m);
/* What one decode step (one token at position pos, 0-based) must move through memory: every
 * projection weight as stored (head included), each GDN layer's FP32 state read and written, and
 * each attention layer's BF16 K and V rows 0..pos read. MoE layers count every expert (an upper
 * bound: a token reads top_k of them). */
struct tdm_step_bytes { int64_t weights, gdn_state, kv, total; };
struct tdm_step_bytes tdm_model_step_bytes(const struct tdm_model *m, int64_t pos);
/* What R rows through the main model (a verify of R rows at positions pos..pos+R-1; R = 1 is a
 * decode step) must read: the projection weights, head included, with each MoE layer's routed
 * experts counted as R rows can touch them: at most min(E, R top_k) experts a layer (experts_max,
 * weights_max), and E (1 - (1 - top_k/E)^R) expected when every row picks its top_k uniformly
 * (experts_even, weights_even: about what a synthetic model's random router gives; a trained one
 * concentrates and touches fewer); and each attention layer's BF16 K and V rows 0..pos+R-1. For a
 * dense model both weights are tdm_model_projection_bytes and the expert counts 0. The GDN state
 * traffic depends on the pass (tdm_engine_round_bytes counts the engine's). */
struct tdm_pass_bytes { double weights_max, weights_even, experts_max, experts_even; int64_t kv; };
struct tdm_pass_bytes tdm_model_pass_bytes(const struct tdm_model *m, int64_t pos, int rows);
/* Calls fn for every projection weight of the main model (not the MTP layer), in forward order. */
void tdm_model_each_projection(const struct tdm_model *m, void (*fn)(void *ctx, const char *what,
                               const struct tdm_qweight *w), void *ctx);
#ifdef __cplusplus
}
#endif
#endif
