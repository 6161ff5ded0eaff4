/* mkbad GOOD_MODEL_DIR OUT_ROOT — writes one broken model directory or token file per fault under
 * OUT_ROOT and prints "CASE<TAB>ARGS<TAB>EXPECTED" lines for t/bad-input.t: tandem-run given ARGS
 * must exit 2 with one line on stderr containing EXPECTED (and the file it names). */
#include "err.h"
#include "fileio.h"
#include "safetensors.h"
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *good, *root;

static char *dir_for(const char *name)
{
    static char p[4096];
    snprintf(p, sizeof p, "%s/%s", root, name);
    mkdir(p, 0777);
    return p;
}

static void copy_config(const char *dir)
{
    char src[4096], dst[4096], *buf;
    size_t n;
    snprintf(src, sizeof src, "%s/config.json", good);
    snprintf(dst, sizeof dst, "%s/config.json", dir);
    if (tdm_read_file(src, 1 << 24, &buf, &n) || tdm_write_file_atomic(dst, buf, n)) { fprintf(stderr, "%s\n", tdm_err()); exit(1); }
    free(buf);
}

/* A model directory with the good config and a safetensors file made of header JSON + data bytes. */
static void raw_case(const char *name, const char *expect, uint64_t hlen_override, const char *hdr, size_t data_bytes,
                     size_t file_bytes_override)
{
    char *dir = dir_for(name), path[4096];
    copy_config(dir);
    size_t hl = strlen(hdr);
    uint64_t hlen = hlen_override ? hlen_override : hl;
    size_t total = 8 + hl + data_bytes;
    unsigned char *b = calloc(1, total + 1);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(hlen >> (8 * i));
    memcpy(b + 8, hdr, hl);
    for (size_t i = 0; i < data_bytes; i++) b[8 + hl + i] = (unsigned char)(i * 7 + 1);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    tdm_write_file_atomic(path, b, file_bytes_override ? file_bytes_override : total);
    free(b);
    printf("%s\t-m %s\t%s\n", name, dir, expect);
}

/* The good checkpoint rewritten without one tensor. */
static void drop_tensor_case(const char *name, const char *drop)
{
    char src[4096], dst[4096];
    char *dir = dir_for(name);
    copy_config(dir);
    snprintf(src, sizeof src, "%s/model.safetensors", good);
    snprintf(dst, sizeof dst, "%s/model.safetensors", dir);
    struct tdm_stfile *f = tdm_st_open(src);
    if (!f) { fprintf(stderr, "%s\n", tdm_err()); exit(1); }
    struct tdm_st_desc *d = calloc((size_t)f->ntensors, sizeof *d);
    int n = 0;
    for (int i = 0; i < f->ntensors; i++) {
        const struct tdm_tensor *t = &f->tensors[i];
        if (strcmp(t->name, drop) == 0) continue;
        d[n] = (struct tdm_st_desc){.name = t->name, .dtype = t->dtype, .ndim = t->ndim, .data = t->data};
        memcpy(d[n].shape, t->shape, sizeof t->shape);
        n++;
    }
    if (tdm_st_write(dst, d, n)) { fprintf(stderr, "%s\n", tdm_err()); exit(1); }
    free(d);
    tdm_st_close(f);
    printf("%s\t-m %s\tmissing tensor '%s'\n", name, dir, drop);
}

/* The good checkpoint with its config edited: key set to value (NULL: removed); drop: a key removed too. */
static void config_case2(const char *name, const char *key, json_t *value, const char *drop, const char *expect);
static void config_case(const char *name, const char *key, json_t *value, const char *expect)
{
    config_case2(name, key, value, NULL, expect);
}
static void config_case2(const char *name, const char *key, json_t *value, const char *drop, const char *expect)
{
    char *dir = dir_for(name), src[4096], dst[4096];
    snprintf(src, sizeof src, "%s/model.safetensors", good);
    snprintf(dst, sizeof dst, "%s/model.safetensors", dir);
    unlink(dst);
    if (symlink(src, dst) != 0) { perror(dst); exit(1); }
    snprintf(src, sizeof src, "%s/config.json", good);
    json_t *c = json_load_file(src, 0, NULL), *t = json_object_get(c, "text_config");
    if (!t) t = c;
    if (value) json_object_set_new(t, key, value);
    else json_object_del(t, key);
    if (drop) json_object_del(t, drop);
    snprintf(dst, sizeof dst, "%s/config.json", dir);
    json_dump_file(c, dst, JSON_INDENT(1));
    json_decref(c);
    printf("%s\t-m %s\t%s\n", name, dir, expect);
}

static void tokens_case(const char *name, const char *text, const char *expect)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.tok", root, name);
    tdm_write_file_atomic(path, text, strlen(text));
    printf("%s\t-m %s -p %s\t%s\n", name, good, path, expect);
}

int main(int argc, char **argv)
{
    if (argc != 3) { fprintf(stderr, "usage: mkbad GOOD_MODEL_DIR OUT_ROOT\n"); return 2; }
    good = argv[1];
    root = argv[2];
    mkdir(root, 0777);
    const char *t1 = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    raw_case("truncated", "truncated", 0, "", 0, 5);
    raw_case("header-past-end", "runs past the end of the file", 5000, t1, 8, 0);
    raw_case("header-over-cap", "exceeds the cap", 0xffffffffffull, t1, 8, 0);
    raw_case("header-not-json", "header is not JSON", 0, "{\"a\": [1, 2", 0, 0);
    raw_case("header-not-object", "not a JSON object", 0, "[1, 2, 3]", 0, 0);
    raw_case("offsets-out-of-range", "past the end of the data",
             0, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, 0);
    raw_case("offsets-overlap", "overlaps",
             0, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, 0);
    raw_case("offsets-hole", "hole of 4 bytes",
             0, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 12, 0);
    raw_case("offsets-reversed", "bad data_offsets", 0, "{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}}", 8, 0);
    raw_case("unknown-dtype", "unknown dtype 'F7'", 0, "{\"a\":{\"dtype\":\"F7\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, 0);
    raw_case("size-mismatch", "shape x F32 needs 12", 0, "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, 0);
    raw_case("trailing-bytes", "not covered by any tensor", 0, t1, 12, 0);
    raw_case("duplicate-key", "header is not JSON", 0,
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, 0);
    raw_case("shape-negative", "shape[0] is not a non-negative integer", 0, "{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, 0);
    drop_tensor_case("missing-tensor", "model.language_model.layers.1.linear_attn.in_proj_z.weight");
    drop_tensor_case("missing-norm", "model.language_model.norm.weight");
    config_case("config-missing-key", "hidden_size", NULL, "missing key 'hidden_size'");
    config_case("config-shape-disagrees", "intermediate_size", json_integer(384), "the config implies");
    config_case("config-bad-type", "num_hidden_layers", json_string("four"), "'num_hidden_layers' is not an integer");
    config_case("config-heads-indivisible", "num_key_value_heads", json_integer(4), "not a multiple of num_key_value_heads");
    config_case2("config-fewer-layers", "num_hidden_layers", json_integer(3), "layer_types", "more layers than num_hidden_layers");
    config_case("config-layer-types-short", "num_hidden_layers", json_integer(3), "'layer_types' must list 3 layers");
    {
        char *dir = dir_for("config-not-json"), p[4096];
        snprintf(p, sizeof p, "%s/config.json", dir);
        tdm_write_file_atomic(p, "{\"model_type\": ", 15);
        printf("config-not-json\t-m %s\tnot JSON\n", dir);
    }
    printf("model-dir-absent\t-m %s/no-such-dir\tNo such file or directory\n", root);
    printf("model-dir-empty\t-m %s\tconfig.json\n", dir_for("empty"));
    printf("prompt-absent\t-m %s -p %s/no-such.tok\tNo such file or directory\n", good, root);
    tokens_case("prompt-non-numeric", "12 34 abc 5\n", "not a token id: 'abc'");
    tokens_case("prompt-negative", "12 -3\n", "negative token id '-3'");
    tokens_case("prompt-overflow", "12 99999999999999999999\n", "overflows");
    tokens_case("prompt-out-of-vocab", "12\n1024\n", "token id 1024 is out of the vocabulary (1024 ids)");
    tokens_case("prompt-empty", "# only a comment\n\n", "no token ids (empty prompt)");
    tokens_case("prompt-float", "1.5\n", "not a token id: '1.5'");
    return 0;
}
