/* shapes.h — the projection shapes of the served models (models.md), derived from their presets
 * (presets.c), in one table that the benchmark, the sweep and the tests read. A projection y = x W^T has W of n rows (outputs) and
 * k columns (inputs); `per_token` says how many of it one token's forward runs (all layers). */
#ifndef TDM_SHAPES_H
#define TDM_SHAPES_H
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

struct tdm_proj_shape {
    const char *name;   /* e.g. "mlp.gate_proj" */
    int64_t n, k;
    int per_token;      /* occurrences in one token's forward over all layers (0: MTP or routed) */
};

struct tdm_model_shapes {
    const char *model;  /* "qwen3.8-27b", "qwen3-next-80b" */
    const char *desc;
    int nshapes;
    const struct tdm_proj_shape *shapes;
};

/* The model's table, or NULL for an unknown name. */
const struct tdm_model_shapes *tdm_model_shapes(const char *model);
/* The known model names, NULL-terminated. */
extern const char *const tdm_model_names[];
/* Distinct (n, k) of a model, in table order: writes up to max pairs, returns the count. */
int tdm_model_distinct_shapes(const struct tdm_model_shapes *m, int64_t (*nk)[2], int max);
/* Parses "N,K" (positive integers). Returns 0 or -1. */
int tdm_parse_shape(const char *s, int64_t *n, int64_t *k);
/* Parameters one token's forward reads through the projections (sum of n * k * per_token). */
int64_t tdm_model_token_params(const struct tdm_model_shapes *m);
#ifdef __cplusplus
}
#endif
#endif
