#include "backend.h"
#include "device.h"
#include "engine.h"
#include "err.h"
#include "settings.h"
#include <stdio.h>
#include <string.h>

const char *tdm_backend_name(enum tdm_backend b) { return b == TDM_BACKEND_CUDA ? "cuda" : "cpu"; }

int tdm_backend_pick(const char *opt, const struct tdm_model *m, enum tdm_backend *out, const char **why)
{
    static char buf[512];
    const char *v = opt ? opt : tdm_setting("TANDEM_BACKEND");
    const char *src = opt ? "--backend" : "TANDEM_BACKEND";
    if (strcmp(v, "cpu") == 0) {
        *out = TDM_BACKEND_CPU;
        *why = opt ? "asked for" : "TANDEM_BACKEND";
        return 0;
    }
    if (strcmp(v, "cuda") == 0) {
        if (tdm_cuda_device_count() == 0) return tdm_errf("%s cuda: no CUDA device visible", src);
        *out = TDM_BACKEND_CUDA;
        *why = opt ? "asked for" : "TANDEM_BACKEND";
        return 0;
    }
    if (strcmp(v, "auto") == 0) {
        *out = TDM_BACKEND_CPU;
        if (tdm_cuda_device_count() == 0) {
            snprintf(buf, sizeof buf, "auto: no CUDA device visible");
        } else if (m && tdm_engine_supported(m) != 0) {
            snprintf(buf, sizeof buf, "auto: the CUDA engine does not serve this model: %s", tdm_err());
        } else {
            *out = TDM_BACKEND_CUDA;
            snprintf(buf, sizeof buf, "auto: a CUDA device is visible and the CUDA engine serves the model");
        }
        *why = buf;
        return 0;
    }
    return tdm_errf("%s %s: expected cpu, cuda or auto", src, v);
}
