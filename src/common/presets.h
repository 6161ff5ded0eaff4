/* presets.h — the model shapes the project knows by name: the tiny default (a qwen3_5 or
 * qwen3_next of the fixtures' size) and the real Qwen3.8-27B and Qwen3-Next-80B-A3B shapes of
 * models.md. A preset fills a struct tdm_config; one table, used by the model maker, the
 * benchmarks and the tests. */
#ifndef TDM_PRESETS_H
#define TDM_PRESETS_H
#include "config.h"
#ifdef __cplusplus
extern "C" {
#endif

/* Fills c (allocating its per-layer arrays) for the named preset and layout:
 * "tiny" (either layout), "qwen3.8-27b" (qwen3_5), "qwen3-next-80b" (qwen3_next).
 * arch picks the layout for "tiny"; the real presets carry their own. Returns 0 or -1 (tdm_err). */
int tdm_preset(const char *name, enum tdm_arch arch, struct tdm_config *c);
/* Space-separated list of the names, for --help texts. */
extern const char *const tdm_preset_names;
/* Re-derives the per-layer arrays after n_layers or the attention interval changed:
 * layer i is attention iff (i+1) % interval == 0; MoE everywhere for MoE layouts. */
int tdm_config_set_layers(struct tdm_config *c, int n_layers, int attn_interval);
#ifdef __cplusplus
}
#endif
#endif
