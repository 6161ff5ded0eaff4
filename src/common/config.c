#include "config.h"
#include "err.h"
#include "jsonfile.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *tdm_arch_name(enum tdm_arch a)
{
    return a == TDM_ARCH_QWEN3_5 ? "qwen3_5" : a == TDM_ARCH_QWEN3_5_MOE ? "qwen3_5_moe" : "qwen3_next";
}

struct reader { const char *path; json_t *obj; json_t *outer; };

static json_t *lookup(const struct reader *r, const char *key)
{
    json_t *v = json_object_get(r->obj, key);
    return v && !json_is_null(v) ? v : NULL;
}

static int get_int(const struct reader *r, const char *key, int required, int def, int min, int *out)
{
    json_t *v = lookup(r, key);
    if (!v) {
        if (required) return tdm_errf("%s: missing key '%s'", r->path, key);
        *out = def;
        return 0;
    }
    if (!json_is_integer(v)) return tdm_errf("%s: '%s' is not an integer", r->path, key);
    json_int_t x = json_integer_value(v);
    if (x < min || x > 1 << 30) return tdm_errf("%s: '%s' = %lld is out of range", r->path, key, (long long)x);
    *out = (int)x;
    return 0;
}

static int get_num(json_t *v, const char *path, const char *key, double *out)
{
    if (!json_is_number(v)) return tdm_errf("%s: '%s' is not a number", path, key);
    *out = json_number_value(v);
    if (!isfinite(*out)) return tdm_errf("%s: '%s' is not finite", path, key);
    return 0;
}

static int get_bool(const struct reader *r, const char *key, int def, int *out)
{
    json_t *v = lookup(r, key);
    if (!v && r->outer) v = json_object_get(r->outer, key);
    if (!v || json_is_null(v)) { *out = def; return 0; }
    if (!json_is_boolean(v)) return tdm_errf("%s: '%s' is not true/false", r->path, key);
    *out = json_is_true(v);
    return 0;
}

static int parse(struct reader *r, struct tdm_config *c)
{
    json_t *mt = json_object_get(r->outer, "model_type");
    if (!json_is_string(mt)) return tdm_errf("%s: missing key 'model_type'", r->path);
    const char *type = json_string_value(mt);
    if (strcmp(type, "qwen3_5") == 0 || strcmp(type, "qwen3_5_text") == 0) c->arch = TDM_ARCH_QWEN3_5;
    else if (strcmp(type, "qwen3_5_moe") == 0 || strcmp(type, "qwen3_5_moe_text") == 0) c->arch = TDM_ARCH_QWEN3_5_MOE;
    else if (strcmp(type, "qwen3_next") == 0) c->arch = TDM_ARCH_QWEN3_NEXT;
    else return tdm_errf("%s: model_type '%s' is not supported (qwen3_5, qwen3_5_moe, qwen3_next)", r->path, type);
    snprintf(c->model_type, sizeof c->model_type, "%s", type);
    if (c->arch != TDM_ARCH_QWEN3_NEXT) {
        json_t *tc = json_object_get(r->outer, "text_config");
        if (tc && !json_is_object(tc)) return tdm_errf("%s: 'text_config' is not an object", r->path);
        if (tc) r->obj = tc; /* the wrapper: the language model's keys live here */
    }
    if (get_int(r, "hidden_size", 1, 0, 1, &c->hidden) || get_int(r, "num_hidden_layers", 1, 0, 1, &c->n_layers) ||
        get_int(r, "vocab_size", 1, 0, 1, &c->vocab))
        return -1;
    json_t *eps = lookup(r, "rms_norm_eps");
    double d;
    if (!eps) return tdm_errf("%s: missing key 'rms_norm_eps'", r->path);
    if (get_num(eps, r->path, "rms_norm_eps", &d)) return -1;
    if (d <= 0 || d > 1) return tdm_errf("%s: 'rms_norm_eps' = %g is out of range", r->path, d);
    c->rms_eps = (float)d;
    if (get_bool(r, "tie_word_embeddings", 0, &c->tie_embeddings)) return -1;

    /* attention */
    if (get_int(r, "num_attention_heads", 1, 0, 1, &c->n_q_heads) ||
        get_int(r, "num_key_value_heads", 1, 0, 1, &c->n_kv_heads) ||
        get_int(r, "head_dim", 0, c->hidden / c->n_q_heads, 1, &c->head_dim))
        return -1;
    if (c->n_q_heads % c->n_kv_heads)
        return tdm_errf("%s: num_attention_heads %d is not a multiple of num_key_value_heads %d", r->path,
                        c->n_q_heads, c->n_kv_heads);
    json_t *rp = lookup(r, "rope_parameters");
    if (rp && !json_is_object(rp)) return tdm_errf("%s: 'rope_parameters' is not an object", r->path);
    json_t *theta = lookup(r, "rope_theta");
    if (!theta && rp) theta = json_object_get(rp, "rope_theta");
    if (!theta) return tdm_errf("%s: missing key 'rope_theta' (top level or in rope_parameters)", r->path);
    if (get_num(theta, r->path, "rope_theta", &c->rope_theta)) return -1;
    if (c->rope_theta <= 1) return tdm_errf("%s: 'rope_theta' = %g is out of range", r->path, c->rope_theta);
    json_t *prf = lookup(r, "partial_rotary_factor");
    if (!prf && rp) prf = json_object_get(rp, "partial_rotary_factor");
    double factor = 1.0;
    if (prf && get_num(prf, r->path, "partial_rotary_factor", &factor)) return -1;
    if (factor <= 0 || factor > 1) return tdm_errf("%s: 'partial_rotary_factor' = %g is out of range", r->path, factor);
    c->rotary_dim = (int)(c->head_dim * factor);
    if (c->rotary_dim < 2 || c->rotary_dim % 2)
        return tdm_errf("%s: rotary dims head_dim x partial_rotary_factor = %d is not a positive even number",
                        r->path, c->rotary_dim);
    if (rp) {
        json_t *rt = json_object_get(rp, "rope_type");
        if (rt && json_is_string(rt) && strcmp(json_string_value(rt), "default") != 0)
            return tdm_errf("%s: rope_type '%s' is not supported (default only)", r->path, json_string_value(rt));
    }

    /* Gated DeltaNet */
    if (get_int(r, "linear_num_key_heads", 1, 0, 1, &c->gdn_k_heads) ||
        get_int(r, "linear_num_value_heads", 1, 0, 1, &c->gdn_v_heads) ||
        get_int(r, "linear_key_head_dim", 1, 0, 1, &c->gdn_k_dim) ||
        get_int(r, "linear_value_head_dim", 1, 0, 1, &c->gdn_v_dim) ||
        get_int(r, "linear_conv_kernel_dim", 0, 4, 1, &c->conv_kernel))
        return -1;
    if (c->gdn_v_heads % c->gdn_k_heads)
        return tdm_errf("%s: linear_num_value_heads %d is not a multiple of linear_num_key_heads %d", r->path,
                        c->gdn_v_heads, c->gdn_k_heads);
    if (c->conv_kernel > 8) return tdm_errf("%s: linear_conv_kernel_dim %d is too large", r->path, c->conv_kernel);

    /* layer kinds */
    c->mixer = calloc((size_t)c->n_layers, sizeof *c->mixer);
    c->is_moe = calloc((size_t)c->n_layers, sizeof *c->is_moe);
    if (!c->mixer || !c->is_moe) return tdm_errf("%s: out of memory", r->path);
    json_t *lt = lookup(r, "layer_types");
    if (lt) {
        if (!json_is_array(lt) || (int)json_array_size(lt) != c->n_layers)
            return tdm_errf("%s: 'layer_types' must list %d layers", r->path, c->n_layers);
        for (int i = 0; i < c->n_layers; i++) {
            const char *s = json_string_value(json_array_get(lt, (size_t)i));
            if (s && strcmp(s, "linear_attention") == 0) c->mixer[i] = TDM_MIXER_GDN;
            else if (s && strcmp(s, "full_attention") == 0) c->mixer[i] = TDM_MIXER_ATTN;
            else return tdm_errf("%s: layer_types[%d] is not linear_attention or full_attention", r->path, i);
        }
    } else {
        int f;
        if (get_int(r, "full_attention_interval", 1, 0, 1, &f)) {
            tdm_errf("%s: missing key 'layer_types' or 'full_attention_interval'", r->path);
            return -1;
        }
        for (int i = 0; i < c->n_layers; i++) c->mixer[i] = (i + 1) % f == 0 ? TDM_MIXER_ATTN : TDM_MIXER_GDN;
    }

    /* MLP */
    int moe = c->arch != TDM_ARCH_QWEN3_5;
    if (get_int(r, "intermediate_size", !moe, 0, 1, &c->intermediate)) return -1;
    if (moe) {
        int step;
        if (get_int(r, "num_experts", 1, 0, 1, &c->n_experts) || get_int(r, "num_experts_per_tok", 1, 0, 1, &c->top_k) ||
            get_int(r, "moe_intermediate_size", 1, 0, 1, &c->moe_intermediate) ||
            get_int(r, "shared_expert_intermediate_size", 1, 0, 1, &c->shared_intermediate) ||
            get_int(r, "decoder_sparse_step", 0, 1, 1, &step))
            return -1;
        if (c->top_k > c->n_experts)
            return tdm_errf("%s: num_experts_per_tok %d exceeds num_experts %d", r->path, c->top_k, c->n_experts);
        if (c->arch == TDM_ARCH_QWEN3_5_MOE) c->norm_topk = 1;
        else if (get_bool(r, "norm_topk_prob", 1, &c->norm_topk)) return -1;
        for (int i = 0; i < c->n_layers; i++) c->is_moe[i] = (i + 1) % step == 0;
        json_t *only = lookup(r, "mlp_only_layers");
        if (only && !json_is_array(only)) return tdm_errf("%s: 'mlp_only_layers' is not a list", r->path);
        for (size_t j = 0; only && j < json_array_size(only); j++) {
            json_t *x = json_array_get(only, j);
            if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= c->n_layers)
                return tdm_errf("%s: mlp_only_layers[%zu] is not a layer index", r->path, j);
            c->is_moe[json_integer_value(x)] = 0;
        }
        for (int i = 0; i < c->n_layers; i++)
            if (!c->is_moe[i] && c->intermediate <= 0)
                return tdm_errf("%s: missing key 'intermediate_size' (layer %d has a dense MLP)", r->path, i);
    }
    const char *mtp_key = c->arch == TDM_ARCH_QWEN3_NEXT ? "num_nextn_predict_layers" : "mtp_num_hidden_layers";
    if (get_int(r, mtp_key, 0, 0, 0, &c->mtp_layers)) return -1;
    if (c->mtp_layers > 1) return tdm_errf("%s: %s = %d: one MTP layer is supported", r->path, mtp_key, c->mtp_layers);
    if (get_int(r, "max_position_embeddings", 0, 0, 0, &c->max_positions)) return -1;
    return 0;
}

int tdm_config_load(const char *dir, struct tdm_config *c)
{
    memset(c, 0, sizeof *c);
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *root = tdm_json_read_object(path, 16u << 20);
    if (!root) return -1;
    struct reader r = {path, root, root};
    int rc = parse(&r, c);
    json_decref(root);
    if (rc) tdm_config_free(c);
    return rc;
}

void tdm_config_free(struct tdm_config *c)
{
    free(c->mixer);
    free(c->is_moe);
    c->mixer = NULL;
    c->is_moe = NULL;
}
