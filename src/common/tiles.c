#include "tiles.h"
#include "err.h"
#include "jsonfile.h"
#include "linear.h"
#include "settings.h"
#include "shapes.h"
#include "mm_layout.h"
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SMEM_LIMIT 232448   /* the largest dynamic shared memory a CTA may ask for (sm_90) */
#define TILE_MAX_TABLE_BYTES (16u << 20)

/* Defaults (speed only: the chains fix the bits): nt n8-tiles a warp, wn warps along n a CTA, pf
 * slabs of weights in flight (bench/NOTES.md, v3). */
static const struct {
    const char *name;
    int fmt;
    int nt_default, wn_default, pf_default;
} kernels[TDM_MMK_COUNT] = {
    [TDM_MMK_NVFP4] = {"nvfp4-skinny", TDM_W_NVFP4, 2, 8, 3},
    [TDM_MMK_NVFP4_WIDE] = {"nvfp4-skinny-wide", TDM_W_NVFP4, 1, 8, 1},
    [TDM_MMK_FP8] = {"fp8", TDM_W_FP8, 1, 8, 1},
    [TDM_MMK_BF16] = {"bf16", TDM_W_BF16, 1, 8, 1},
};

const char *tdm_mmk_name(enum tdm_mmk kk) { return kk < TDM_MMK_COUNT ? kernels[kk].name : "?"; }
int tdm_mmk_fmt(enum tdm_mmk kk) { return kk < TDM_MMK_COUNT ? kernels[kk].fmt : -1; }

int tdm_mmk_from_name(const char *name)
{
    for (int i = 0; i < TDM_MMK_COUNT; i++)
        if (strcmp(kernels[i].name, name) == 0) return i;
    return -1;
}

int tdm_mmk_for(int fmt, int64_t m)
{
    if (m < 1 || m > 32) return -1;
    switch (fmt) {
    case TDM_W_NVFP4: return m <= 16 ? TDM_MMK_NVFP4 : TDM_MMK_NVFP4_WIDE;
    case TDM_W_FP8: return TDM_MMK_FP8;
    case TDM_W_BF16: return TDM_MMK_BF16;
    default: return -1;
    }
}

/* Whether kernel kk serves the rows of activation tile count mt (1: rows 1-16, 2: rows 17-32),
 * as tdm_mmk_for assigns them. */
static int serves(enum tdm_mmk kk, int mt) { return tdm_mmk_for(kernels[kk].fmt, mt == 1 ? 1 : 17) == (int)kk; }

static int64_t slabs_of(int64_t k) { return (k + TDM_MM_SLAB_K - 1) / TDM_MM_SLAB_K; }

int tdm_mm_chains_ok(int64_t k, int c)
{
    const int64_t slabs = slabs_of(k), L = (slabs + c - 1) / c;
    if (c < 1 || c > TDM_MM_MAX_CHAINS || (c > 8 && c % 2)) return 0; /* past 8: two a CTA (wk 2), clusters of c / 2 */
    return c == 1 || (L >= 2 && (c - 1) * L < slabs);             /* every chain two slabs or more, none empty */
}

/* The most chains of 1, 2, 4 or 8 (tdm_mm_chains_ok) whose warps, one a pair of n8-tiles and chain,
 * stay within TDM_MM_PLAN_WARPS (2816: about 21 warps a SM on a 132-SM part). Chosen by measurement
 * (tandem-sweep --plan on the H200, bench/NOTES.md v5): a chain count that is not a power of two
 * runs its chains as a cluster whose sum costs more than its extra warps give (10240x5120 at one
 * row: 16.2 us at 3 chains, 14.2 at 4; 5120x6144: 11.2 at 6, 10.0 at 8), and past about 2800 warps
 * the SMs overflow (17408x5120 stays at 2 chains, 2176 warps). A fixed rule of (n, k), not of the
 * device: the chains are the sum order. */
#define TDM_MM_PLAN_WARPS 2816
int tdm_mm_kchains(int64_t n, int64_t k)
{
    const int64_t pairs = (n + 15) / 16;
    int chains = 1;
    for (int c = 2; c <= 8; c *= 2)
        if (tdm_mm_chains_ok(k, c) && pairs * c <= TDM_MM_PLAN_WARPS) chains = c;
    return chains;
}

/* The default of kernel kk: its nt and wn, the shape's chains one a CTA in a cluster. */
struct tdm_tile tdm_tile_default(enum tdm_mmk kk, int64_t n, int64_t k)
{
    const int c = tdm_mm_kchains(n, k);
    struct tdm_tile t = {.nt = kernels[kk].nt_default, .wn = kernels[kk].wn_default, .wk = 1, .cs = c,
                         .pf = kernels[kk].pf_default, .kchains = c};
    return t;
}

struct tdm_tile_geom tdm_tile_geom_of(const struct tdm_tile *t)
{
    return (struct tdm_tile_geom){.nt = t->nt, .wn = t->wn, .wk = t->wk, .cs = t->cs, .pf = t->pf};
}

/* t's main geometry set to g (its kchains and lo kept). */
static void put_geom(struct tdm_tile *t, const struct tdm_tile_geom *g)
{
    t->nt = g->nt;
    t->wn = g->wn;
    t->wk = g->wk;
    t->cs = g->cs;
    t->pf = g->pf;
}

struct tdm_tile tdm_tile_at(const struct tdm_tile *t, int64_t m)
{
    struct tdm_tile r = *t;
    if (m >= 1 && m <= t->lo_rows) put_geom(&r, &t->lo);
    r.lo_rows = 0;
    memset(&r.lo, 0, sizeof r.lo);
    return r;
}

size_t tdm_tile_smem(const struct tdm_tile *t, int m, int direct)
{
    const size_t rows = m <= 16 ? 16 : 32, cols = 8 * (size_t)t->nt * t->wn;
    const size_t staged_rows = m <= 8 ? 8 : m <= 16 ? 16 : 32;   /* mm_skinny.cuh: ROWS8 */
    const size_t tree = (size_t)t->wk * rows * (cols + 8) * sizeof(float);   /* the chains' partial sums */
    if (direct) return tree;   /* activations loaded per lane: nothing staged */
    const size_t mt = m <= 16 ? 1 : 2;
    const size_t staged = (2 * 16 * staged_rows                       /* two raw activation chunks, rows padded to 8, 16 or 32 */
                           + TDM_MM_STEPS * mt * 32) * t->wk * TDM_MM_STAGE_SLABS * 16;   /* and the chunk's A quads */
    return tree > staged ? tree : staged;
}

int tdm_tile_staged_fit(struct tdm_tile *t, int m)
{
    struct tdm_tile s = *t;
    while (tdm_tile_smem(&s, m, 0) > SMEM_LIMIT) {
        if (s.wk < 2 || s.cs * 2 > 8)
            return tdm_errf("wk %d cs %d at %d rows: the staged form needs %zu bytes of shared memory (at most %d), and no "
                            "split of its %d chains over a cluster of up to 8 CTAs fits", t->wk, t->cs, m,
                            tdm_tile_smem(t, m, 0), SMEM_LIMIT, t->kchains);
        s.wk /= 2;
        s.cs *= 2;
    }
    *t = s;
    return 0;
}

static int pow2_upto(int v, int max) { return v >= 1 && v <= max && (v & (v - 1)) == 0; }

/* The geometry g of a setting over kchains chains, serving up to mmax rows (what: "" or "lo: "). */
static int check_geom(enum tdm_mmk kk, const struct tdm_tile_geom *g, int kchains, int mmax, const char *what)
{
    const int fmt = kernels[kk].fmt;
    for (int mt = 1; mt <= 2; mt++)
        if ((mt == 1 || mmax > 16) && serves(kk, mt) && !tdm_mm_variant_built(fmt, g->nt, mt, g->pf))
            return tdm_errf("%snt %d, pf %d: not a setting the kernel is built for at %s rows "
                            "(kernels/mm_layout.h: TDM_MM_VARIANTS)", what, g->nt, g->pf, mt == 1 ? "1-16" : "17-32");
    if (g->wn < 1 || g->wn > 8) return tdm_errf("%swn %d: expected 1..8", what, g->wn);
    /* wk a power of two: a CTA's chains are then an aligned block of the sum tree */
    if (!pow2_upto(g->wk, 8)) return tdm_errf("%swk %d: expected 1, 2, 4 or 8", what, g->wk);
    if (g->cs < 1 || g->cs > 8) return tdm_errf("%scs %d: expected 1..8", what, g->cs);
    if (g->wk * g->cs != kchains) return tdm_errf("%swk %d x cs %d is not kchains %d", what, g->wk, g->cs, kchains);
    /* the warps a CTA runs: FP8's nt 2 runs as nt 1 over twice the warps where it has no per-lane
     * form (kernels/mm_layout.h: tdm_mm_form_wn) */
    const int run_wn = tdm_mm_form_wn(fmt, g->nt, g->wn, 2, 0);
    if (32 * run_wn * g->wk > 256) /* kernels/mm_skinny.cuh: MAX_THREADS */
        return tdm_errf("%swn %d x wk %d warps exceed 256 threads%s", what, g->wn, g->wk,
                        run_wn != g->wn ? " (run as nt 1 over twice the warps)" : "");
    struct tdm_tile t = {.kchains = kchains};
    put_geom(&t, g);
    /* The staged form at the most rows served needs the most shared memory. Where the kernel has a
     * per-lane form for the setting there (NVFP4, FP8: mm_layout.h, TDM_MM_DIRECT_XB), that form needs only
     * the chains' sum, and a staged call runs the setting's chains split over the cluster instead
     * (tdm_tile_staged_fit: the same bits), so it is enough that such a split exists. */
    const int mt_max = tdm_mm_rows_mt(mmax);
    if (TDM_MM_DIRECT_XB(fmt, TDM_MM_FORM_NT(fmt, g->nt, mt_max, 1), mt_max)) {
        if (tdm_tile_smem(&t, mmax, 1) > SMEM_LIMIT)
            return tdm_errf("%sneeds %zu bytes of shared memory for its chains' sum at %d rows (at most %d)", what,
                            tdm_tile_smem(&t, mmax, 1), mmax, SMEM_LIMIT);
        if (tdm_tile_staged_fit(&t, mmax) != 0) return tdm_err_prefix("%s", what);
    } else if (tdm_tile_smem(&t, mmax, 0) > SMEM_LIMIT) {
        return tdm_errf("%sneeds %zu bytes of shared memory at %d rows (at most %d)", what, tdm_tile_smem(&t, mmax, 0),
                        mmax, SMEM_LIMIT);
    }
    return 0;
}

static int check_tile(enum tdm_mmk kk, int64_t n, int64_t k, const struct tdm_tile *t, int rule_chains)
{
    if (kk >= TDM_MMK_COUNT) return tdm_errf("unknown kernel");
    int want = tdm_mm_kchains(n, k);
    if (rule_chains && t->kchains != want)
        return tdm_errf("kchains %d: the sum order of shape %" PRId64 ",%" PRId64 " is %d chains "
                        "(tdm_mm_kchains); a table may not change it", t->kchains, n, k, want);
    const struct tdm_tile_geom main = tdm_tile_geom_of(t);
    if (check_geom(kk, &main, t->kchains, serves(kk, 2) ? 32 : 16, "") != 0) return -1;
    if (t->lo_rows < 0 || t->lo_rows > TDM_TILE_LO_ROWS_MAX)
        return tdm_errf("lo: rows %d: expected 1..%d", t->lo_rows, TDM_TILE_LO_ROWS_MAX);
    if (t->lo_rows && !serves(kk, 1)) return tdm_errf("lo: the table serves no row count 1..%d", t->lo_rows);
    return t->lo_rows ? check_geom(kk, &t->lo, t->kchains, t->lo_rows, "lo: ") : 0;
}

int tdm_tile_check(enum tdm_mmk kk, int64_t n, int64_t k, const struct tdm_tile *t) { return check_tile(kk, n, k, t, 1); }

int tdm_tile_check_plan(enum tdm_mmk kk, int64_t n, int64_t k, const struct tdm_tile *t)
{
    if (t->kchains < 1 || t->kchains > TDM_MM_MAX_CHAINS) return tdm_errf("kchains %d: expected 1..%d", t->kchains, TDM_MM_MAX_CHAINS);
    return check_tile(kk, n, k, t, 0);
}

const char *tdm_tile_str(const struct tdm_tile *t, char *buf, size_t len)
{
    int at = snprintf(buf, len, "nt=%d wn=%d wk=%d cs=%d pf=%d", t->nt, t->wn, t->wk, t->cs, t->pf);
    if (t->lo_rows && at >= 0 && (size_t)at < len)
        snprintf(buf + at, len - at, " lo<=%d: nt=%d wn=%d wk=%d cs=%d pf=%d", t->lo_rows, t->lo.nt, t->lo.wn, t->lo.wk,
                 t->lo.cs, t->lo.pf);
    return buf;
}

const char *tdm_tiles_arch(int major, int minor, char *buf, size_t len)
{
    snprintf(buf, len, "sm_%d%d", major, minor);
    return buf;
}

/* ---- tables ---------------------------------------------------------------------------------- */

struct table {
    int n;
    struct tdm_tile_entry *e;
    char device[128];   /* the header's "device": the card it was swept on ("" without a table) */
};
struct tdm_tiles {
    struct table t[TDM_MMK_COUNT];
};

static int get_int(const char *path, const char *key, json_t *o, const char *field, int *out)
{
    json_t *v = json_object_get(o, field);
    if (!v) return tdm_errf("%s: shape %s: missing \"%s\"", path, key, field);
    if (!json_is_integer(v)) return tdm_errf("%s: shape %s: \"%s\" is not an integer", path, key, field);
    json_int_t x = json_integer_value(v);
    if (x < -1000000 || x > 1000000) return tdm_errf("%s: shape %s: \"%s\" out of range", path, key, field);
    *out = (int)x;
    return 0;
}

static int want_string(const char *path, json_t *root, const char *field, const char *expect)
{
    json_t *v = json_object_get(root, field);
    if (!json_is_string(v)) return tdm_errf("%s: header: \"%s\" missing or not a string", path, field);
    if (expect && strcmp(json_string_value(v), expect) != 0)
        return tdm_errf("%s: header: \"%s\" is \"%s\", expected \"%s\"", path, field, json_string_value(v), expect);
    return 0;
}

/* tdm_tile_table_read, and the header's "device" into device[devlen] when device is not NULL. */
static int read_table(const char *path, enum tdm_mmk kk, const char *arch, struct tdm_tile_entry **entries, int *count,
                      char *device, size_t devlen)
{
    *entries = NULL;
    *count = 0;
    json_t *root = tdm_json_read_object(path, TILE_MAX_TABLE_BYTES);
    if (!root) return -1;
    int rc = -1;
    struct tdm_tile_entry *e = NULL;
    if (want_string(path, root, "kernel", tdm_mmk_name(kk)) || want_string(path, root, "arch", arch) ||
        want_string(path, root, "device", NULL) || want_string(path, root, "sweep", NULL))
        goto out;
    if (device) snprintf(device, devlen, "%s", json_string_value(json_object_get(root, "device")));
    json_t *shapes = json_object_get(root, "shapes");
    if (!json_is_object(shapes)) { tdm_errf("%s: \"shapes\" missing or not an object", path); goto out; }
    size_t n = json_object_size(shapes), i = 0, text = 0;
    const char *key;
    json_t *v;
    json_object_foreach(shapes, key, v) {   /* the entries' "measured" texts live after them, in one block */
        json_t *m = json_object_get(v, "measured");
        if (json_is_string(m)) text += strlen(json_string_value(m)) + 1;
    }
    e = calloc(1, (n ? n : 1) * sizeof *e + text);
    if (!e) { tdm_errf("%s: out of memory", path); goto out; }
    char *texts = (char *)(e + (n ? n : 1));
    json_object_foreach(shapes, key, v) {
        struct tdm_tile_entry *x = &e[i];
        if (tdm_parse_shape(key, &x->n, &x->k) != 0) {
            tdm_errf("%s: shape key \"%s\" is not \"N,K\" with N, K >= 1", path, key);
            goto out;
        }
        if (!json_is_object(v)) { tdm_errf("%s: shape %s: not an object", path, key); goto out; }
        struct tdm_tile *t = &x->tile;
        if (get_int(path, key, v, "nt", &t->nt) || get_int(path, key, v, "wn", &t->wn) ||
            get_int(path, key, v, "wk", &t->wk) || get_int(path, key, v, "cs", &t->cs) ||
            get_int(path, key, v, "pf", &t->pf) || get_int(path, key, v, "kchains", &t->kchains))
            goto out;
        json_t *lo = json_object_get(v, "lo");   /* optional: the few-row setting */
        if (lo) {
            char lokey[80];
            snprintf(lokey, sizeof lokey, "%s, lo", key);
            if (!json_is_object(lo)) { tdm_errf("%s: shape %s: \"lo\" is not an object", path, key); goto out; }
            if (get_int(path, lokey, lo, "rows", &t->lo_rows) || get_int(path, lokey, lo, "nt", &t->lo.nt) ||
                get_int(path, lokey, lo, "wn", &t->lo.wn) || get_int(path, lokey, lo, "wk", &t->lo.wk) ||
                get_int(path, lokey, lo, "cs", &t->lo.cs) || get_int(path, lokey, lo, "pf", &t->lo.pf))
                goto out;
            if (t->lo_rows < 1) { tdm_errf("%s: shape %s: lo: rows %d: expected 1..%d", path, key, t->lo_rows, TDM_TILE_LO_ROWS_MAX); goto out; }
        }
        if (tdm_tile_check(kk, x->n, x->k, t) != 0) {
            tdm_err_prefix("%s: shape %s", path, key);
            goto out;
        }
        json_t *us = json_object_get(v, "us");
        x->us = json_is_number(us) ? json_number_value(us) : 0.0;
        json_t *us_lo = lo ? json_object_get(lo, "us") : NULL;
        x->us_lo = json_is_number(us_lo) ? json_number_value(us_lo) : 0.0;
        json_t *measured = json_object_get(v, "measured");
        x->measured = NULL;
        if (json_is_string(measured)) {   /* kept, so that a sweep merging into the table keeps it */
            const size_t len = strlen(json_string_value(measured)) + 1;
            memcpy(texts, json_string_value(measured), len);
            x->measured = texts;
            texts += len;
        }
        i++;
    }
    *entries = e;
    *count = (int)n;
    e = NULL;
    rc = 0;
out:
    free(e);
    json_decref(root);
    return rc;
}

int tdm_tile_table_read(const char *path, enum tdm_mmk kk, const char *arch, struct tdm_tile_entry **entries, int *count)
{
    return read_table(path, kk, arch, entries, count, NULL, 0);
}

int tdm_tiles_load(const char *dir, const char *arch, struct tdm_tiles **out)
{
    *out = NULL;
    if (!dir) dir = tdm_setting("TANDEM_TILES");
    struct tdm_tiles *t = calloc(1, sizeof *t);
    if (!t) return tdm_errf("tiles: out of memory");
    for (int kk = 0; kk < TDM_MMK_COUNT; kk++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s/%s.json", dir, arch, kernels[kk].name);
        FILE *f = fopen(path, "rb");
        if (!f) {
            if (errno == ENOENT) continue; /* no table: defaults */
            tdm_errf("%s: %s", path, strerror(errno));
            tdm_tiles_free(t);
            return -1;
        }
        fclose(f);
        if (read_table(path, (enum tdm_mmk)kk, arch, &t->t[kk].e, &t->t[kk].n, t->t[kk].device, sizeof t->t[kk].device) != 0) {
            tdm_tiles_free(t);
            return -1;
        }
    }
    *out = t;
    return 0;
}

void tdm_tiles_free(struct tdm_tiles *t)
{
    if (!t) return;
    for (int kk = 0; kk < TDM_MMK_COUNT; kk++) free(t->t[kk].e);
    free(t);
}

static const struct tdm_tile_entry *lookup(const struct tdm_tiles *t, enum tdm_mmk kk, int64_t n, int64_t k)
{
    if (!t || kk >= TDM_MMK_COUNT) return NULL;
    for (int i = 0; i < t->t[kk].n; i++)
        if (t->t[kk].e[i].n == n && t->t[kk].e[i].k == k) return &t->t[kk].e[i];
    return NULL;
}

const char *tdm_tiles_device(const struct tdm_tiles *t, enum tdm_mmk kk)
{
    return t && kk < TDM_MMK_COUNT && t->t[kk].device[0] ? t->t[kk].device : NULL;
}

struct tdm_tile tdm_tiles_get(const struct tdm_tiles *t, enum tdm_mmk kk, int64_t n, int64_t k)
{
    const struct tdm_tile_entry *e = lookup(t, kk, n, k);
    return e ? e->tile : tdm_tile_default(kk, n, k);
}

int tdm_tiles_has(const struct tdm_tiles *t, enum tdm_mmk kk, int64_t n, int64_t k)
{
    return lookup(t, kk, n, k) != NULL;
}

int tdm_tile_table_write(const char *path, const struct tdm_tile_table *tb)
{
    for (int i = 0; i < tb->nentries; i++)   /* never write what the loader would refuse */
        if (tdm_tile_check(tb->kernel, tb->entries[i].n, tb->entries[i].k, &tb->entries[i].tile) != 0)
            return tdm_err_prefix("%s: shape %" PRId64 ",%" PRId64, path, tb->entries[i].n, tb->entries[i].k);
    json_t *root = json_object(), *shapes = json_object();
    if (!root || !shapes) return tdm_errf("%s: out of memory", path);
    json_object_set_new(root, "kernel", json_string(tdm_mmk_name(tb->kernel)));
    json_object_set_new(root, "arch", json_string(tb->arch));
    json_object_set_new(root, "device", json_string(tb->device ? tb->device : "?"));
    json_object_set_new(root, "sweep", json_string(tb->sweep ? tb->sweep : "none (defaults)"));
    for (int i = 0; i < tb->nentries; i++) {
        const struct tdm_tile_entry *e = &tb->entries[i];
        char key[64];
        snprintf(key, sizeof key, "%" PRId64 ",%" PRId64, e->n, e->k);
        json_t *o = json_object();
        json_object_set_new(o, "nt", json_integer(e->tile.nt));
        json_object_set_new(o, "wn", json_integer(e->tile.wn));
        json_object_set_new(o, "wk", json_integer(e->tile.wk));
        json_object_set_new(o, "cs", json_integer(e->tile.cs));
        json_object_set_new(o, "pf", json_integer(e->tile.pf));
        json_object_set_new(o, "kchains", json_integer(e->tile.kchains));
        if (e->tile.lo_rows) {
            const struct tdm_tile_geom *g = &e->tile.lo;
            json_t *lo = json_object();
            json_object_set_new(lo, "rows", json_integer(e->tile.lo_rows));
            json_object_set_new(lo, "nt", json_integer(g->nt));
            json_object_set_new(lo, "wn", json_integer(g->wn));
            json_object_set_new(lo, "wk", json_integer(g->wk));
            json_object_set_new(lo, "cs", json_integer(g->cs));
            json_object_set_new(lo, "pf", json_integer(g->pf));
            if (e->us_lo > 0) json_object_set_new(lo, "us", json_real(e->us_lo));
            json_object_set_new(o, "lo", lo);
        }
        if (e->us > 0) json_object_set_new(o, "us", json_real(e->us));
        if (e->measured) json_object_set_new(o, "measured", json_string(e->measured));
        json_object_set_new(shapes, key, o);
    }
    json_object_set_new(root, "shapes", shapes);
    const int rc = tdm_json_write_atomic(path, root, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(root);
    return rc;
}

enum tdm_tile_objective tdm_tile_objective_for(enum tdm_tile_objective want, const int *rows, int nrows, int lo_cap)
{
    if (want == TDM_OBJ_SUM || nrows < 1 || rows[0] != 1) return TDM_OBJ_SUM;
    if (want == TDM_OBJ_SPLIT && lo_cap >= 1 && rows[nrows - 1] > lo_cap) return TDM_OBJ_SPLIT;
    return TDM_OBJ_DECODE;
}

/* candidate c's medians summed over the timed rows [r0, r1) */
static double rows_sum(const double *us, int nrows, int c, int r0, int r1)
{
    double s = 0;
    for (int r = r0; r < r1; r++) s += us[(size_t)c * nrows + r];
    return s;
}

int tdm_tile_pick(enum tdm_tile_objective want, const int *rows, int nrows, int lo_cap, int ncand, const double *us,
                  const int *timed, const int *nt, int *pick, int *lo, int *lo_rows)
{
    const enum tdm_tile_objective obj = tdm_tile_objective_for(want, rows, nrows, lo_cap);
    int nlo = 0;   /* the timed rows up to lo_cap */
    while (nlo < nrows && rows[nlo] <= lo_cap) nlo++;
    *pick = *lo = -1;
    *lo_rows = 0;
    double row1 = 1e300;   /* the best one-row time */
    for (int c = 0; c < ncand; c++)
        if (timed[c] && us[(size_t)c * nrows] < row1) row1 = us[(size_t)c * nrows];
    /* sum: the lowest sum; decode (and split's few-row setting): within 1 % of row1, the lowest sum
     * over all timed rows (decode) or those up to lo_cap (split) */
    const int nsum = obj == TDM_OBJ_SPLIT ? nlo : nrows;
    double low = 1e300;
    for (int c = 0; c < ncand; c++) {
        if (!timed[c] || (obj != TDM_OBJ_SUM && us[(size_t)c * nrows] > row1 * 1.01)) continue;
        const double s = rows_sum(us, nrows, c, 0, nsum);
        if (s < low) low = s, *pick = c;
    }
    if (*pick < 0) return -1;
    if (obj == TDM_OBJ_SPLIT) {
        const int few = *pick;
        low = 1e300;
        for (int c = 0; c < ncand; c++) {
            if (!timed[c] || nt[c] != nt[few]) continue;
            const double s = rows_sum(us, nrows, c, nlo, nrows);
            if (s < low) low = s, *pick = c;
        }
        if (*pick != few) *lo = few, *lo_rows = lo_cap;
        return 0;
    }
    if (rows[0] != 1 || !lo_cap) return 0;
    int f = -1;   /* the fastest at one row */
    for (int c = 0; c < ncand; c++)
        if (timed[c] && (f < 0 || us[(size_t)c * nrows] < us[(size_t)f * nrows])) f = c;
    for (int r = 0; r < nrows && rows[r] <= lo_cap && us[(size_t)f * nrows + r] < us[(size_t)*pick * nrows + r] * (r ? 1.0 : 0.99);
         r++)
        *lo_rows = rows[r];
    if (*lo_rows) *lo = f;
    return 0;
}
