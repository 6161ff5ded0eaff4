#include "ckpt.h"
#include "err.h"
#include "jsonfile.h"
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

static int add_file(struct tdm_ckpt *ck, const char *path)
{
    struct tdm_stfile *f = tdm_st_open(path);
    if (!f) return -1;
    struct tdm_stfile **nf = realloc(ck->files, (size_t)(ck->nfiles + 1) * sizeof *nf);
    if (!nf) { tdm_st_close(f); return tdm_errf("%s: out of memory", path); }
    ck->files = nf;
    ck->files[ck->nfiles++] = f;
    return 0;
}

static int open_index(struct tdm_ckpt *ck, const char *index)
{
    json_t *root = tdm_json_read_object(index, 64u << 20);
    if (!root) return -1;
    int rc = -1;
    json_t *map = json_object_get(root, "weight_map");
    if (!json_is_object(map)) { tdm_errf("%s: missing 'weight_map'", index); goto out; }
    /* Open each shard once, in order of first mention. */
    const char *name;
    json_t *v;
    json_object_foreach(map, name, v) {
        const char *shard = json_string_value(v);
        if (!shard) { tdm_errf("%s: weight_map['%s'] is not a file name", index, name); goto out; }
        if (strchr(shard, '/') || strcmp(shard, "..") == 0 || !*shard) {
            tdm_errf("%s: weight_map['%s'] = '%s' is not a plain file name", index, name, shard);
            goto out;
        }
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", ck->dir, shard);
        int have = 0;
        for (int i = 0; i < ck->nfiles && !have; i++) have = strcmp(ck->files[i]->path, path) == 0;
        if (!have && add_file(ck, path) != 0) goto out;
    }
    /* Every mapped tensor must be in the shard the index names. */
    json_object_foreach(map, name, v) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", ck->dir, json_string_value(v));
        for (int i = 0; i < ck->nfiles; i++)
            if (strcmp(ck->files[i]->path, path) == 0 && !tdm_st_find(ck->files[i], name)) {
                tdm_errf("%s: tensor '%s' is not in %s, where the index puts it", index, name, path);
                goto out;
            }
    }
    rc = 0;
out:
    json_decref(root);
    return rc;
}

struct tdm_ckpt *tdm_ckpt_open(const char *dir)
{
    struct stat st;
    if (stat(dir, &st) != 0) { tdm_errf("%s: %s", dir, strerror(errno)); return NULL; }
    if (!S_ISDIR(st.st_mode)) { tdm_errf("%s: not a model directory", dir); return NULL; }
    struct tdm_ckpt *ck = calloc(1, sizeof *ck);
    if (!ck || !(ck->dir = strdup(dir))) { free(ck); tdm_errf("%s: out of memory", dir); return NULL; }
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    int rc;
    if (exists(path)) {
        rc = open_index(ck, path);
    } else {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        rc = exists(path) ? add_file(ck, path)
                          : tdm_errf("%s: no model.safetensors or model.safetensors.index.json", dir);
    }
    if (rc) { tdm_ckpt_close(ck); return NULL; }
    return ck;
}

void tdm_ckpt_close(struct tdm_ckpt *ck)
{
    if (!ck) return;
    for (int i = 0; i < ck->nfiles; i++) tdm_st_close(ck->files[i]);
    free(ck->files);
    free(ck->dir);
    free(ck);
}

const struct tdm_tensor *tdm_ckpt_find(const struct tdm_ckpt *ck, const char *name)
{
    for (int i = 0; i < ck->nfiles; i++) {
        const struct tdm_tensor *t = tdm_st_find(ck->files[i], name);
        if (t) return t;
    }
    return NULL;
}

const struct tdm_tensor *tdm_ckpt_findf(const struct tdm_ckpt *ck, const char *fmt, ...)
{
    char name[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    return tdm_ckpt_find(ck, name);
}
