#include "tokens.h"
#include "err.h"
#include "fileio.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOKENS_FILE_CAP (256u << 20)

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

int tdm_tokens_parse(const char *name, const char *buf, size_t len, int64_t vocab, int allow_empty,
                     int32_t **ids, int *n)
{
    int32_t *v = NULL;
    int cnt = 0, cap = 0, line = 1;
    size_t i = 0;
    while (i < len) {
        char c = buf[i];
        if (c == '\n') { line++; i++; continue; }
        if (is_space(c)) { i++; continue; }
        if (c == '#') { while (i < len && buf[i] != '\n') i++; continue; }
        size_t j = i;
        while (j < len && !is_space(buf[j]) && buf[j] != '#') j++;
        /* token text buf[i..j) */
        int64_t val = 0;
        if (buf[i] == '-') { free(v); return tdm_errf("%s:%d: negative token id '%.*s'", name, line, (int)(j - i > 32 ? 32 : j - i), buf + i); }
        for (size_t k = i; k < j; k++) {
            if (buf[k] < '0' || buf[k] > '9') {
                free(v);
                return tdm_errf("%s:%d: not a token id: '%.*s'", name, line, (int)(j - i > 32 ? 32 : j - i), buf + i);
            }
            val = val * 10 + (buf[k] - '0');
            if (val > INT32_MAX) {
                free(v);
                return tdm_errf("%s:%d: token id '%.*s' overflows", name, line, (int)(j - i > 32 ? 32 : j - i), buf + i);
            }
        }
        if (vocab > 0 && val >= vocab) {
            free(v);
            return tdm_errf("%s:%d: token id %lld is out of the vocabulary (%lld ids)", name, line, (long long)val,
                            (long long)vocab);
        }
        if (cnt == cap) {
            cap = cap ? 2 * cap : 256;
            int32_t *nv = realloc(v, (size_t)cap * sizeof *v);
            if (!nv) { free(v); return tdm_errf("%s: out of memory", name); }
            v = nv;
        }
        v[cnt++] = (int32_t)val;
        i = j;
    }
    if (cnt == 0 && !allow_empty) { free(v); return tdm_errf("%s: no token ids (empty prompt)", name); }
    *ids = v;
    *n = cnt;
    return 0;
}

int tdm_tokens_read(const char *path, int64_t vocab, int allow_empty, int32_t **ids, int *n)
{
    char *buf = NULL;
    size_t len = 0;
    const char *name = path && strcmp(path, "-") ? path : "<stdin>";
    if (path && strcmp(path, "-")) {
        if (tdm_read_file(path, TOKENS_FILE_CAP, &buf, &len) != 0) return -1;
    } else {
        size_t cap = 0;
        for (;;) {
            if (len + 4096 > cap) {
                cap = cap ? 2 * cap : 65536;
                if (cap > TOKENS_FILE_CAP) { free(buf); return tdm_errf("%s: input too large", name); }
                char *nb = realloc(buf, cap);
                if (!nb) { free(buf); return tdm_errf("%s: out of memory", name); }
                buf = nb;
            }
            size_t got = fread(buf + len, 1, cap - len, stdin);
            len += got;
            if (got == 0) break;
        }
        if (ferror(stdin)) { free(buf); return tdm_errf("%s: read error", name); }
    }
    int rc = tdm_tokens_parse(name, buf ? buf : "", len, vocab, allow_empty, ids, n);
    free(buf);
    return rc;
}

int tdm_tokens_write(const char *path, const int32_t *ids, int n)
{
    struct tdm_atomic a;
    if (tdm_atomic_open(&a, path) != 0) return -1;
    for (int i = 0; i < n; i++) fprintf(a.f, "%d\n", ids[i]);
    return tdm_atomic_commit(&a);
}
