#include "backend.h"
#include "device.h"
#include "err.h"
#include "settings.h"
#include <string.h>

const char *tdm_backend_name(enum tdm_backend b) { return b == TDM_BACKEND_CUDA ? "cuda" : "cpu"; }

int tdm_backend_pick(const char *opt, const char *no_cuda, enum tdm_backend *out, const char **why)
{
    const char *v = opt ? opt : tdm_setting("TANDEM_BACKEND");
    const char *src = opt ? "--backend" : "TANDEM_BACKEND";
    if (strcmp(v, "cpu") == 0) {
        *out = TDM_BACKEND_CPU;
        *why = opt ? "asked for" : "TANDEM_BACKEND";
        return 0;
    }
    if (strcmp(v, "cuda") == 0) {
        if (no_cuda) return tdm_errf("%s cuda: %s (use --backend cpu)", src, no_cuda);
        if (tdm_cuda_device_count() == 0) return tdm_errf("%s cuda: no CUDA device visible", src);
        *out = TDM_BACKEND_CUDA;
        *why = opt ? "asked for" : "TANDEM_BACKEND";
        return 0;
    }
    if (strcmp(v, "auto") == 0) {
        /* The CUDA engine is opt-in until it has passed t/gpu/engine.t on the device. */
        *out = TDM_BACKEND_CPU;
        *why = no_cuda ? no_cuda : "auto; the CUDA engine is opt-in for now: --backend cuda";
        return 0;
    }
    return tdm_errf("%s %s: expected cpu, cuda or auto", src, v);
}
