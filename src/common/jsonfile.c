#include "jsonfile.h"
#include "err.h"
#include "fileio.h"
#include <stdlib.h>

json_t *tdm_json_read_object(const char *path, size_t cap)
{
    char *buf;
    size_t len;
    if (tdm_read_file(path, cap, &buf, &len) != 0) return NULL;
    json_error_t e;
    json_t *root = json_loadb(buf, len, 0, &e);
    free(buf);
    if (!root) {
        tdm_errf("%s: not JSON: %s (line %d)", path, e.text, e.line);
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        tdm_errf("%s: not a JSON object", path);
        return NULL;
    }
    return root;
}
