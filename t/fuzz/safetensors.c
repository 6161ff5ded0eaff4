/* libFuzzer target: the safetensors header and layout validation must answer any bytes with a
 * parsed file or an error, never a crash, a hang or an out-of-bounds read. */
#include "safetensors.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* A private copy whose end is the end of an allocation, so ASan sees any read past it. */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    struct tdm_stfile *f = tdm_st_parse("fuzz", buf, size);
    if (f) {
        for (int i = 0; i < f->ntensors; i++) {
            const struct tdm_tensor *t = &f->tensors[i];
            volatile uint8_t sink = 0;
            if (t->nbytes) sink ^= ((const uint8_t *)t->data)[t->nbytes - 1] ^ ((const uint8_t *)t->data)[0];
            (void)sink;
            if (tdm_st_find(f, t->name) != t) abort();
        }
        tdm_st_close(f);
    }
    free(buf);
    return 0;
}
