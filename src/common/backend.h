/* backend.h — which backend a tool runs: --backend, else TANDEM_BACKEND, else auto. auto runs the
 * CPU reference for now: the CUDA engine (src/common/engine.h, dense qwen3_5 only) is opt-in with
 * cuda until its GPU test (t/gpu/engine.t) has passed on the device. CUDA is touched only to count
 * devices. */
#ifndef TDM_BACKEND_H
#define TDM_BACKEND_H
#ifdef __cplusplus
extern "C" {
#endif
enum tdm_backend { TDM_BACKEND_CPU, TDM_BACKEND_CUDA };
/* opt: the --backend argument or NULL. no_cuda: NULL when the tool has a CUDA path, else why it
 * has none (cuda is then refused with that reason). Sets *why to a short explanation for the "# "
 * line. Returns 0, or -1 with tdm_err() (unknown name, or cuda asked for where it cannot run). */
int tdm_backend_pick(const char *opt, const char *no_cuda, enum tdm_backend *out, const char **why);
const char *tdm_backend_name(enum tdm_backend b);
#ifdef __cplusplus
}
#endif
#endif
