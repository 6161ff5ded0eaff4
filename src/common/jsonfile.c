#include "jsonfile.h"
#include "err.h"
#include "fileio.h"
#include <stdio.h>
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

int tdm_json_write_atomic(const char *path, const json_t *j, size_t flags)
{
    struct tdm_atomic a;
    if (tdm_atomic_open(&a, path) != 0) return -1;
    /* a trailing newline keeps the file friendly to diff and cat */
    if (json_dumpf(j, a.f, flags) != 0 || fputc('\n', a.f) == EOF) {
        tdm_atomic_abort(&a);
        return tdm_errf("%s: cannot write the JSON", path);
    }
    return tdm_atomic_commit(&a);
}
