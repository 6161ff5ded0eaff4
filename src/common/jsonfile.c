#include "jsonfile.h"
#include "err.h"
#include "fileio.h"
#include <stdlib.h>
#include <string.h>

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
    char *text = json_dumps(j, flags);
    if (!text) return tdm_errf("%s: cannot format the JSON", path);
    const size_t len = strlen(text);
    char *nl = malloc(len + 2); /* a trailing newline keeps the file friendly to diff and cat */
    int rc = nl ? 0 : tdm_errf("%s: out of memory", path);
    if (nl) {
        memcpy(nl, text, len);
        nl[len] = '\n';
        rc = tdm_write_file_atomic(path, nl, len + 1);
        free(nl);
    }
    free(text);
    return rc;
}
