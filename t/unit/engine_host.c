/* engine_host DIR EXPECT [DIR EXPECT ...]
 * What the CUDA engine accepts, checked on the host (no device needed): tdm_engine_supported on
 * each model directory, EXPECT "ok" or a fragment of the refusal it must give. Then, where no
 * device is visible, tdm_engine_new must refuse with "no CUDA device visible". TAP. */
#include "device.h"
#include "engine.h"
#include "err.h"
#include "model.h"
#include "tap.h"
#include <string.h>

int main(int argc, char **argv)
{
    if (argc < 3 || argc % 2 == 0) { fprintf(stderr, "usage: engine_host DIR EXPECT [DIR EXPECT ...]\n"); return 2; }
    struct tdm_model *first_ok = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *dir = argv[i], *want = argv[i + 1];
        struct tdm_model *m = tdm_model_load(dir);
        if (!m) { printf("Bail out! %s\n", tdm_err()); return 1; }
        int rc = tdm_engine_supported(m);
        if (strcmp(want, "ok") == 0) {
            ok(rc == 0, "%s: supported by the CUDA engine%s%s", dir, rc ? ": " : "", rc ? tdm_err() : "");
            if (rc == 0 && !first_ok) { first_ok = m; continue; }
        } else {
            ok(rc != 0 && strstr(tdm_err(), want), "%s: refused with '%s' (%s)", dir, want, rc ? tdm_err() : "accepted");
        }
        tdm_model_free(m);
    }
    if (first_ok && tdm_cuda_device_count() == 0) {
        struct tdm_engine *e = tdm_engine_new(first_ok, 16);
        ok(!e && strstr(tdm_err(), "no CUDA device visible"), "without a device tdm_engine_new refuses (%s)",
           e ? "accepted" : tdm_err());
        tdm_engine_free(e);
    }
    tdm_model_free(first_ok);
    return done_testing();
}
