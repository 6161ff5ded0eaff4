#include "safetensors.h"
#include "err.h"
#include "fileio.h"
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static int cmp_name(const void *a, const void *b)
{
    return strcmp(((const struct tdm_tensor *)a)->name, ((const struct tdm_tensor *)b)->name);
}

struct span { uint64_t begin, end; int idx; };
static int cmp_span(const void *a, const void *b)
{
    const struct span *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end > y->end) - (x->end < y->end);
}

/* Parses one tensor entry of the header into t; data_size bounds the offsets. */
static int parse_entry(const char *fname, const char *key, json_t *v, uint64_t data_size,
                       struct tdm_tensor *t, struct span *sp)
{
    if (!json_is_object(v)) return tdm_errf("%s: tensor '%s': entry is not an object", fname, key);
    json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape"),
           *off = json_object_get(v, "data_offsets");
    if (!json_is_string(dt)) return tdm_errf("%s: tensor '%s': missing dtype", fname, key);
    t->dtype = tdm_dtype_from_name(json_string_value(dt));
    if (t->dtype == TDM_DT_INVALID)
        return tdm_errf("%s: tensor '%s': unknown dtype '%s'", fname, key, json_string_value(dt));
    if (!json_is_array(sh)) return tdm_errf("%s: tensor '%s': missing shape", fname, key);
    if (json_array_size(sh) > TDM_ST_MAX_DIMS)
        return tdm_errf("%s: tensor '%s': %zu dimensions (at most %d)", fname, key, json_array_size(sh),
                        TDM_ST_MAX_DIMS);
    t->ndim = (int)json_array_size(sh);
    uint64_t numel = 1;
    for (int i = 0; i < t->ndim; i++) {
        json_t *d = json_array_get(sh, (size_t)i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return tdm_errf("%s: tensor '%s': shape[%d] is not a non-negative integer", fname, key, i);
        uint64_t di = (uint64_t)json_integer_value(d);
        if (di && numel > UINT64_MAX / 16 / di)
            return tdm_errf("%s: tensor '%s': shape overflows", fname, key);
        numel *= di;
        t->shape[i] = (int64_t)di;
    }
    if (!json_is_array(off) || json_array_size(off) != 2 || !json_is_integer(json_array_get(off, 0)) ||
        !json_is_integer(json_array_get(off, 1)))
        return tdm_errf("%s: tensor '%s': data_offsets is not [begin, end]", fname, key);
    json_int_t b = json_integer_value(json_array_get(off, 0)), e = json_integer_value(json_array_get(off, 1));
    if (b < 0 || e < b) return tdm_errf("%s: tensor '%s': bad data_offsets [%lld, %lld]", fname, key,
                                        (long long)b, (long long)e);
    if ((uint64_t)e > data_size)
        return tdm_errf("%s: tensor '%s': data_offsets [%lld, %lld] past the end of the data (%llu bytes)",
                        fname, key, (long long)b, (long long)e, (unsigned long long)data_size);
    uint64_t want = numel * tdm_dtype_size(t->dtype);
    if ((uint64_t)(e - b) != want)
        return tdm_errf("%s: tensor '%s': %lld bytes stored, shape x %s needs %llu", fname, key,
                        (long long)(e - b), tdm_dtype_name(t->dtype), (unsigned long long)want);
    t->numel = (int64_t)numel;
    t->nbytes = (size_t)want;
    sp->begin = (uint64_t)b;
    sp->end = (uint64_t)e;
    return 0;
}

static void free_tensors(struct tdm_stfile *f)
{
    for (int i = 0; i < f->ntensors; i++) free((char *)f->tensors[i].name);
    for (int i = 0; i < f->ncopies; i++) free(f->copies[i]);
    free(f->tensors);
    free(f->copies);
}

static int parse_into(struct tdm_stfile *f, const char *fname, const unsigned char *buf, size_t size)
{
    if (size < 8) return tdm_errf("%s: truncated: %zu bytes, no header length", fname, size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | buf[i];
    if (hlen > TDM_ST_HEADER_CAP)
        return tdm_errf("%s: header length %llu exceeds the cap of %u bytes", fname, (unsigned long long)hlen,
                        TDM_ST_HEADER_CAP);
    if (hlen > size - 8)
        return tdm_errf("%s: header length %llu runs past the end of the file (%zu bytes)", fname,
                        (unsigned long long)hlen, size);
    json_error_t jerr;
    json_t *root = json_loadb((const char *)buf + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) return tdm_errf("%s: header is not JSON: %s (at byte %d)", fname, jerr.text, jerr.position);
    int rc = -1;
    struct span *sp = NULL;
    if (!json_is_object(root)) { tdm_errf("%s: header is not a JSON object", fname); goto out; }
    uint64_t data_size = size - 8 - hlen;
    size_t n = json_object_size(root);
    f->tensors = calloc(n ? n : 1, sizeof *f->tensors);
    sp = calloc(n ? n : 1, sizeof *sp);
    if (!f->tensors || !sp) { tdm_errf("%s: out of memory", fname); goto out; }
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (strcmp(key, "__metadata__") == 0) {
            const char *mk;
            json_t *mv;
            if (!json_is_object(v)) { tdm_errf("%s: __metadata__ is not an object", fname); goto out; }
            json_object_foreach(v, mk, mv) if (!json_is_string(mv)) {
                tdm_errf("%s: __metadata__ value '%s' is not a string", fname, mk);
                goto out;
            }
            continue;
        }
        struct tdm_tensor *t = &f->tensors[f->ntensors];
        t->name = strdup(key);
        if (!t->name) { tdm_errf("%s: out of memory", fname); goto out; }
        f->ntensors++;
        if (parse_entry(fname, key, v, data_size, t, &sp[f->ntensors - 1]) != 0) goto out;
        sp[f->ntensors - 1].idx = f->ntensors - 1;
    }
    /* Offsets must tile [0, data_size): sorted, each begins where the last ended. */
    qsort(sp, (size_t)f->ntensors, sizeof *sp, cmp_span);
    uint64_t at = 0;
    for (int i = 0; i < f->ntensors; i++) {
        const char *nm = f->tensors[sp[i].idx].name;
        if (sp[i].begin < at) { tdm_errf("%s: tensor '%s' overlaps the tensor before it", fname, nm); goto out; }
        if (sp[i].begin > at) { tdm_errf("%s: hole of %llu bytes before tensor '%s'", fname,
                                         (unsigned long long)(sp[i].begin - at), nm); goto out; }
        at = sp[i].end;
    }
    if (at != data_size) {
        tdm_errf("%s: %llu bytes after the last tensor are not covered by any tensor", fname,
                 (unsigned long long)(data_size - at));
        goto out;
    }
    /* Data pointers; re-align the rare tensor whose offset does not suit its element size. */
    const unsigned char *data = buf + 8 + hlen;
    f->copies = calloc((size_t)f->ntensors + 1, sizeof *f->copies);
    if (!f->copies) { tdm_errf("%s: out of memory", fname); goto out; }
    for (int i = 0; i < f->ntensors; i++) {
        struct tdm_tensor *t = &f->tensors[sp[i].idx];
        const unsigned char *p = data + sp[i].begin;
        size_t al = tdm_dtype_size(t->dtype);
        if ((uintptr_t)p % al) {
            void *c = malloc(t->nbytes ? t->nbytes : 1);
            if (!c) { tdm_errf("%s: out of memory", fname); goto out; }
            memcpy(c, p, t->nbytes);
            f->copies[f->ncopies++] = c;
            p = c;
        }
        t->data = p;
        t->file = f;
    }
    qsort(f->tensors, (size_t)f->ntensors, sizeof *f->tensors, cmp_name);
    for (int i = 0; i < f->ntensors; i++) f->tensors[i].file = f;
    rc = 0;
out:
    free(sp);
    json_decref(root);
    return rc;
}

struct tdm_stfile *tdm_st_parse(const char *name, const void *buf, size_t size)
{
    struct tdm_stfile *f = calloc(1, sizeof *f);
    if (!f) { tdm_errf("%s: out of memory", name); return NULL; }
    f->path = strdup(name);
    if (!f->path || parse_into(f, name, buf, size) != 0) {
        tdm_st_close(f);
        return NULL;
    }
    return f;
}

struct tdm_stfile *tdm_st_open(const char *path)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0) { tdm_errf("%s: %s", path, strerror(errno)); return NULL; }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        tdm_errf("%s: not a regular file", path);
        return NULL;
    }
    size_t size = (size_t)st.st_size;
    void *map = size ? mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
    close(fd);
    if (size && map == MAP_FAILED) { tdm_errf("%s: mmap: %s", path, strerror(errno)); return NULL; }
    struct tdm_stfile *f = calloc(1, sizeof *f);
    if (!f) { if (map) munmap(map, size); tdm_errf("%s: out of memory", path); return NULL; }
    f->path = strdup(path);
    f->map = map;
    f->size = size;
    if (!f->path || parse_into(f, path, map, size) != 0) {
        tdm_st_close(f);
        return NULL;
    }
    return f;
}

void tdm_st_close(struct tdm_stfile *f)
{
    if (!f) return;
    free_tensors(f);
    if (f->map) munmap(f->map, f->size);
    free(f->path);
    free(f);
}

const struct tdm_tensor *tdm_st_find(const struct tdm_stfile *f, const char *name)
{
    struct tdm_tensor key = {.name = name};
    return bsearch(&key, f->tensors, (size_t)f->ntensors, sizeof key, cmp_name);
}

/* ---- writer ---- */

struct tdm_st_writer {
    struct tdm_atomic out;
    const struct tdm_st_desc *d;
    int n, next;
    size_t done;   /* bytes of tensor `next` written so far */
};

size_t tdm_st_desc_bytes(const struct tdm_st_desc *d)
{
    size_t b = tdm_dtype_size(d->dtype);
    for (int i = 0; i < d->ndim; i++) b *= (size_t)d->shape[i];
    return b;
}

struct tdm_st_writer *tdm_stw_begin(const char *path, const struct tdm_st_desc *d, int n)
{
    json_t *root = json_object();
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        json_t *e = json_object(), *sh = json_array();
        for (int j = 0; j < d[i].ndim; j++) json_array_append_new(sh, json_integer(d[i].shape[j]));
        size_t nb = tdm_st_desc_bytes(&d[i]);
        json_object_set_new(e, "dtype", json_string(tdm_dtype_name(d[i].dtype)));
        json_object_set_new(e, "shape", sh);
        json_object_set_new(e, "data_offsets", json_pack("[II]", (json_int_t)at, (json_int_t)(at + nb)));
        json_object_set_new(root, d[i].name, e);
        at += nb;
    }
    char *hdr = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!hdr) { tdm_errf("%s: cannot encode header", path); return NULL; }
    size_t hl = strlen(hdr), padded = (hl + 7) / 8 * 8; /* data starts 8-aligned */
    struct tdm_st_writer *w = calloc(1, sizeof *w);
    if (!w || tdm_atomic_open(&w->out, path) != 0) { free(hdr); free(w); return NULL; }
    w->d = d;
    w->n = n;
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    int bad = fwrite(len8, 1, 8, w->out.f) != 8 || fwrite(hdr, 1, hl, w->out.f) != hl;
    for (size_t i = hl; i < padded && !bad; i++) bad = fputc(' ', w->out.f) == EOF;
    free(hdr);
    if (bad) { tdm_errf("%s: write failed", path); tdm_stw_abort(w); return NULL; }
    return w;
}

int tdm_stw_put(struct tdm_st_writer *w, const void *data, size_t nbytes)
{
    while (w->next < w->n && tdm_st_desc_bytes(&w->d[w->next]) == w->done) { w->next++; w->done = 0; }
    size_t left = w->next < w->n ? tdm_st_desc_bytes(&w->d[w->next]) - w->done : 0;
    if (nbytes > left)
        return tdm_errf("%s: tensor %d: %zu bytes given, %zu left", w->out.path, w->next, nbytes, left);
    if (nbytes && fwrite(data, 1, nbytes, w->out.f) != nbytes) return tdm_errf("%s: write failed", w->out.path);
    w->done += nbytes;
    return 0;
}

int tdm_stw_finish(struct tdm_st_writer *w)
{
    int rc;
    while (w->next < w->n && tdm_st_desc_bytes(&w->d[w->next]) == w->done) { w->next++; w->done = 0; }
    if (w->next != w->n) {
        rc = tdm_errf("%s: %d of %d tensors written", w->out.path, w->next, w->n);
        tdm_atomic_abort(&w->out);
    } else {
        rc = tdm_atomic_commit(&w->out);
    }
    free(w);
    return rc;
}

void tdm_stw_abort(struct tdm_st_writer *w)
{
    if (!w) return;
    tdm_atomic_abort(&w->out);
    free(w);
}

int tdm_st_write(const char *path, const struct tdm_st_desc *d, int n)
{
    struct tdm_st_writer *w = tdm_stw_begin(path, d, n);
    if (!w) return -1;
    for (int i = 0; i < n; i++)
        if (tdm_stw_put(w, d[i].data, tdm_st_desc_bytes(&d[i])) != 0) { tdm_stw_abort(w); return -1; }
    return tdm_stw_finish(w);
}
