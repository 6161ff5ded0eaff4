/* libFuzzer target: the token-file parser answers any bytes with ids or an error. */
#include "tokens.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    int32_t *ids = NULL;
    int n = 0;
    if (tdm_tokens_parse("fuzz", buf, size, 1000, 0, &ids, &n) == 0) {
        for (int i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= 1000) abort();
        free(ids);
    }
    free(buf);
    return 0;
}
