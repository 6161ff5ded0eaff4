/* engine_moe.h — the CUDA engine's mixture-of-experts MLP (qwen3_next, qwen3_5_moe), for
 * src/common/engine.c only: the MoE layers' weights on the device and ref.c's moe_forward as
 * launches on the engine's stream, the routing on the device (no host sync: a decode step that
 * contains it can be captured in a CUDA graph):
 *   logits = bf16(x Wr^T) (tdm_matmul); sel, w = tdm_moe_route;
 *   shared = down_s(silu(gate_s x) * up_s x) (tdm_matmul, tdm_silu_mul), its scale
 *   bf16(sigmoid(x Wsg^T)) (tdm_moe_shared_gate);
 *   the chosen (row, expert) pairs in ascending expert id: tdm_moe_order, tdm_moe_gate_up,
 *   tdm_moe_down; y = tdm_moe_combine (experts in ascending id, + the scaled shared expert).
 * Row-invariant up to TDM_ENGINE_MAX_ROWS rows: the router, the shared expert's products (1..32
 * rows), the pairs and the combination each give a row the bits of a one-row call. A prefill chunk
 * of more rows (activations for them: TANDEM_MOE_GROUPED, engine.c) runs the experts' grouped form
 * instead (moe.h: tdm_moe_group, tdm_moe_gate_up_grouped, tdm_moe_down_grouped; checked by
 * agreement). Host C only. */
#ifndef TDM_ENGINE_MOE_H
#define TDM_ENGINE_MOE_H
#include "model.h"
#include "tiles.h"
#include <stddef.h>
#include <stdint.h>

struct tdm_emoe;

/* 0 if the engine's MoE kernels take m's MoE layers (router size, top-k, expert shapes and
 * formats), else -1 with tdm_err() naming the model directory, the layer and the limit. 0 for a
 * model without MoE layers. Needs no device. */
int tdm_emoe_supported(const struct tdm_model *m);

/* Uploads every MoE layer of m and allocates the activations of `rows` rows; adds the device bytes
 * to *weights and *act. NULL with tdm_err() (out of device memory naming what). For a model
 * without MoE layers it returns an empty, valid handle. */
struct tdm_emoe *tdm_emoe_new(const struct tdm_model *m, int rows, size_t *weights, size_t *act);
void tdm_emoe_free(struct tdm_emoe *x);

/* Uploads the MTP layer's MoE MLP (mtp.layers.0.mlp) as layer slot L = n_layers, once; adds the
 * device bytes to *weights. -1 with tdm_err() when the model's MTP layer is dense, when no main layer
 * is MoE (no activations), for an expert format the kernels do not take, or out of device memory. */
int tdm_emoe_upload_mtp(struct tdm_emoe *x, size_t *weights);

/* A second stream for the shared expert (tdm_emoe_forward): it forks from the caller's stream at the
 * MoE's start (fork: an event recorded there) and joins back before the combine (join). */
struct tdm_emoe_side {
    void *stream, *fork, *join;
};

/* y [M][H] = layer's MoE MLP of xn [M][H] (both contiguous; xnb: xn's blocked copy, matmul.h, or
 * NULL), M <= rows (past TDM_ENGINE_MAX_ROWS: the grouped form); layer n_layers is the MTP layer's
 * (tdm_emoe_upload_mtp). With side (not NULL; only for M <= TDM_ENGINE_MAX_ROWS: the skinny
 * products use no global scratch) the shared expert's products run there beside the router and the
 * routed experts: the same kernels and arguments, the same bits. */
int tdm_emoe_forward(struct tdm_emoe *x, int layer, const uint16_t *xn, const uint16_t *xnb, int M, uint16_t *y,
                     const struct tdm_tiles *tiles, void *stream, const struct tdm_emoe_side *side);
#endif
