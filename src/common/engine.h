/* engine.h — the CUDA engine: the forward of src/common/ref.c on the GPU for one sequence, with the
 * weights in their stored format (BF16, block FP8, NVFP4) uploaded once (kernels/matmul.h), the
 * layer kernels of kernels/layers.h and the glue of kernels/engine_glue.h. Host C only; no CUDA
 * headers. It serves the family's three layouts (models.md): dense qwen3_5 (Gated DeltaNet + gated
 * attention + dense SwiGLU MLP, e.g. Qwen3.8-27B), qwen3_next (grouped GDN projections, MoE MLP,
 * e.g. Qwen3-Next-80B-A3B) and qwen3_5_moe; the MTP layer is not run.
 *
 * Rounding points are the reference's (every projection ->bf16, residual adds ->bf16, ...); the
 * head returns FP32 logits. T tokens are processed in chunks of at most TDM_ENGINE_MAX_ROWS rows
 * through the M-row kernels, which are row-invariant by construction: forwarding T tokens in one
 * call gives the same bits as T one-token calls. Everything runs on the engine's own stream; the
 * forward returns after its logits are on the host. */
#ifndef TDM_ENGINE_H
#define TDM_ENGINE_H
#include "model.h"
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

#define TDM_ENGINE_MAX_ROWS 32

struct tdm_engine;

/* 0 if the engine can serve m (layout, shapes, formats), else -1 with tdm_err() saying why. Needs
 * no device. */
int tdm_engine_supported(const struct tdm_model *m);

/* Uploads m's weights to device 0 and allocates the state of one sequence of up to ctx tokens: per
 * attention layer BF16 K and V caches [ctx][Hkv][D], per GDN layer a BF16 conv state [K-1][C] and
 * an FP32 state [Hv][Dk][Dv], activations for TDM_ENGINE_MAX_ROWS rows. m must outlive the engine
 * (its small vectors are read at upload only, but its config is kept). Prints one "# " line with
 * the device memory it holds to stderr. Returns NULL with tdm_err() (no device, unsupported
 * layout, out of device memory naming what was being allocated). */
struct tdm_engine *tdm_engine_new(const struct tdm_model *m, int ctx);
void tdm_engine_free(struct tdm_engine *e);

/* Tokens consumed so far. */
int tdm_engine_pos(const struct tdm_engine *e);
/* Device bytes the engine holds: weights, state (KV caches, conv and GDN states), activations. */
struct tdm_engine_mem { size_t weights, kv, gdn, act; };
const struct tdm_engine_mem *tdm_engine_mem(const struct tdm_engine *e);

/* tdm_ref_forward's contract (without hidden/final_h): feeds T tokens at the current position;
 * logits NULL, or [T - logits_from][V] FP32 for rows logits_from..T-1 (copied to the host).
 * Returns 0, or -1 with tdm_err(): context full (nothing is consumed), a token id outside the
 * vocabulary (nothing consumed), a CUDA failure (the state is then undefined). */
int tdm_engine_forward(struct tdm_engine *e, const int32_t *ids, int T, int logits_from, float *logits);

/* Clears the sequence: position 0, KV caches, conv and GDN states zeroed. */
int tdm_engine_reset(struct tdm_engine *e);
#ifdef __cplusplus
}
#endif
#endif
