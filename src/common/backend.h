/* backend.h — which backend a tool runs: --backend, else TANDEM_BACKEND, else auto. auto takes the
 * CUDA engine (src/common/engine.h) when a device is visible and the engine serves the model, else
 * the CPU reference, and says why. CUDA is touched only to count devices. */
#ifndef TDM_BACKEND_H
#define TDM_BACKEND_H
#include "model.h"
#ifdef __cplusplus
extern "C" {
#endif
enum tdm_backend { TDM_BACKEND_CPU, TDM_BACKEND_CUDA };
/* opt: the --backend argument or NULL (then TANDEM_BACKEND). m: the model (auto asks
 * tdm_engine_supported; NULL before it is read: then only the device count decides, so call again
 * once it is). Sets *why to a short explanation for the "# backend" line. Returns 0, or -1 with
 * tdm_err() (unknown name, or cuda asked for without a device). */
int tdm_backend_pick(const char *opt, const struct tdm_model *m, enum tdm_backend *out, const char **why);
const char *tdm_backend_name(enum tdm_backend b);
#ifdef __cplusplus
}
#endif
#endif
