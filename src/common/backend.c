#include "backend.h"
#include "device.h"
#include "err.h"
#include "settings.h"
#include <string.h>

/* The CUDA engine (issue: the CUDA engine) is not built yet: cuda is refused with that reason. */
static const int cuda_engine_built = 0;

const char *tdm_backend_name(enum tdm_backend b) { return b == TDM_BACKEND_CUDA ? "cuda" : "cpu"; }

int tdm_backend_pick(const char *opt, enum tdm_backend *out, const char **why)
{
    const char *v = opt ? opt : tdm_setting("TANDEM_BACKEND");
    const char *src = opt ? "--backend" : "TANDEM_BACKEND";
    if (strcmp(v, "cpu") == 0) {
        *out = TDM_BACKEND_CPU;
        *why = opt ? "asked for" : "TANDEM_BACKEND";
        return 0;
    }
    if (strcmp(v, "cuda") == 0) {
        if (!cuda_engine_built) return tdm_errf("%s cuda: the CUDA engine is not built yet (use --backend cpu)", src);
        if (tdm_cuda_device_count() == 0) return tdm_errf("%s cuda: no CUDA device visible", src);
        *out = TDM_BACKEND_CUDA;
        *why = "asked for";
        return 0;
    }
    if (strcmp(v, "auto") == 0) {
        int n = cuda_engine_built ? tdm_cuda_device_count() : 0;
        *out = n > 0 ? TDM_BACKEND_CUDA : TDM_BACKEND_CPU;
        *why = n > 0 ? "a CUDA device is visible" : cuda_engine_built ? "no CUDA device visible" : "the CUDA engine is not built yet";
        return 0;
    }
    return tdm_errf("%s %s: expected cpu, cuda or auto", src, v);
}
