#include "fileio.h"
#include "err.h"
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int tdm_read_file(const char *path, size_t max_bytes, char **buf, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return tdm_errf("%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return tdm_errf("%s: not a regular file", path);
    }
    if ((size_t)st.st_size > max_bytes) {
        fclose(f);
        return tdm_errf("%s: file too large (%lld bytes, limit %zu)", path, (long long)st.st_size, max_bytes);
    }
    char *b = malloc((size_t)st.st_size + 1);
    if (!b) { fclose(f); return tdm_errf("%s: out of memory", path); }
    size_t n = fread(b, 1, (size_t)st.st_size, f);
    int bad = ferror(f);
    fclose(f);
    if (bad || n != (size_t)st.st_size) { free(b); return tdm_errf("%s: read error", path); }
    b[n] = 0;
    *buf = b;
    *len = n;
    return 0;
}

int tdm_atomic_open(struct tdm_atomic *a, const char *path)
{
    memset(a, 0, sizeof *a);
    size_t n = strlen(path) + 32;
    a->path = strdup(path);
    a->tmp = malloc(n);
    if (!a->path || !a->tmp) { tdm_atomic_abort(a); return tdm_errf("%s: out of memory", path); }
    snprintf(a->tmp, n, "%s.tmp.%ld", path, (long)getpid());
    a->f = fopen(a->tmp, "wb");
    if (!a->f) {
        int e = errno;
        tdm_atomic_abort(a);
        return tdm_errf("%s: cannot create: %s", path, strerror(e));
    }
    return 0;
}

void tdm_atomic_abort(struct tdm_atomic *a)
{
    if (a->f) { fclose(a->f); a->f = NULL; }
    if (a->tmp) unlink(a->tmp);
    free(a->tmp);
    free(a->path);
    a->tmp = a->path = NULL;
}

int tdm_atomic_commit(struct tdm_atomic *a)
{
    int bad = fflush(a->f) != 0 || ferror(a->f) || fsync(fileno(a->f)) != 0;
    int e = errno;
    bad |= fclose(a->f) != 0;
    a->f = NULL;
    if (bad) {
        tdm_errf("%s: write failed: %s", a->path, strerror(e));
        tdm_atomic_abort(a);
        return -1;
    }
    if (rename(a->tmp, a->path) != 0) {
        tdm_errf("%s: rename failed: %s", a->path, strerror(errno));
        tdm_atomic_abort(a);
        return -1;
    }
    free(a->tmp);
    free(a->path);
    a->tmp = a->path = NULL;
    return 0;
}

int tdm_write_file_atomic(const char *path, const void *data, size_t len)
{
    struct tdm_atomic a;
    if (tdm_atomic_open(&a, path) != 0) return -1;
    if (len && fwrite(data, 1, len, a.f) != len) {
        tdm_atomic_abort(&a);
        return tdm_errf("%s: write failed", path);
    }
    return tdm_atomic_commit(&a);
}
