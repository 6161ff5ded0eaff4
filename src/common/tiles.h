/* tiles.h — launch settings of the skinny matrix kernels and the JSON tile tables that hold them.
 *
 * A setting never changes a row's arithmetic except through `kchains`, the number of chains K is
 * cut into; kchains is a function of the weight's shape (N, K) only (tdm_mm_kchains), so every
 * table is keyed by "N,K" and a row's bits never depend on the row count. The other fields only
 * distribute the same work over warps, CTAs and clusters.
 *
 * Table files: TANDEM_TILES/<arch>/<kernel>.json, e.g. tiles/sm_90/nvfp4-skinny.json:
 *   {"kernel": "nvfp4-skinny", "arch": "sm_90", "device": "...", "sweep": "...",
 *    "shapes": {"17408,5120": {"nt": 4, "wn": 4, "wk": 1, "cs": 2, "pf": 1, "kchains": 2,
 *                              "lo": {"rows": 2, "nt": 2, "wn": 3, "wk": 2, "cs": 1, "pf": 1},
 *                              "us": 12.5, ...measurements...}, ...}}
 * ("lo", the few-row setting, is optional.)
 * A missing file or shape takes the default setting; a malformed file is an error naming it. */
#ifndef TDM_TILES_H
#define TDM_TILES_H
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

/* The kernels that have tables. */
enum tdm_mmk {
    TDM_MMK_NVFP4,      /* NVFP4 W4A16 skinny kernel, 1-16 rows: one mma per weight tile */
    TDM_MMK_NVFP4_WIDE, /* the same kernel at 17-32 rows: two mmas over the same decoded weights */
    TDM_MMK_FP8,        /* block-FP8 W8A16 skinny kernel, 1-32 rows */
    TDM_MMK_BF16,       /* BF16-weight skinny kernel, 1-32 rows */
    TDM_MMK_COUNT
};
const char *tdm_mmk_name(enum tdm_mmk kk);         /* "nvfp4-skinny", "nvfp4-skinny-wide", ... */
int tdm_mmk_from_name(const char *name);           /* -1 when unknown */
int tdm_mmk_fmt(enum tdm_mmk kk);                  /* its weight format (enum tdm_wfmt) */
/* The kernel that serves m rows (1..32) of a weight in format fmt; -1 if none. */
int tdm_mmk_for(int fmt, int64_t m);

/* How a setting spreads the work: everything but the sum order. */
struct tdm_tile_geom {
    int nt; /* n8 tiles per warp (8*nt weight rows) */
    int wn; /* warps along N per CTA: a CTA covers 8*nt*wn columns */
    int wk; /* chains per CTA (warp groups along K) */
    int cs; /* CTAs per cluster along K (one aligned block of wk chains each) */
    int pf; /* weight prefetch distance in slabs (pipeline depth - 1): a built one, TDM_MM_VARIANTS */
};

struct tdm_tile {
    int nt, wn, wk, cs, pf; /* as in struct tdm_tile_geom: the geometry of every other row count */
    int kchains; /* chains of K = wk * cs; fixed by the shape: tdm_mm_kchains */
    /* The few-row setting: rows 1..lo_rows (at most TDM_TILE_LO_ROWS_MAX; 0: none) run the
     * geometry lo, over the same kchains (lo.wk * lo.cs == kchains). The decode step is one row,
     * where small CTAs win; a verify of several rows prefers the main geometry. Only the spread of
     * the work differs, so a row's bits do not: the sweep keeps only bit-identical settings, and
     * t/gpu/matmul.t compares a setting with lo against one-row calls. */
    int lo_rows;
    struct tdm_tile_geom lo;
};
#define TDM_TILE_LO_ROWS_MAX 8
/* The geometry of t's main setting (nt, wn, wk, cs, pf), e.g. to make it another setting's lo. */
struct tdm_tile_geom tdm_tile_geom_of(const struct tdm_tile *t);
/* The setting that serves m rows: t itself, or its few-row geometry (lo_rows then 0). */
struct tdm_tile tdm_tile_at(const struct tdm_tile *t, int64_t m);

/* The number of chains K is cut into for a weight of shape (n, k): the only setting that enters
 * the arithmetic, a function of (n, k) alone. */
int tdm_mm_kchains(int64_t n, int64_t k);
/* Whether K may be cut into c chains (the rule's candidates): 1..8, or 10..16 even; every chain at
 * least two slabs of 128 and none empty. */
int tdm_mm_chains_ok(int64_t k, int c);
/* The default setting of kernel kk for shape (n, k) (row-invariant like every valid setting). */
struct tdm_tile tdm_tile_default(enum tdm_mmk kk, int64_t n, int64_t k);
/* Shared memory (bytes) a setting needs at m rows: the staged activations or the chains' sum; with
 * direct (the activations loaded per lane, tdm_mm_direct_rows), the chains' sum alone. */
size_t tdm_tile_smem(const struct tdm_tile *t, int m, int direct);
/* The setting t (its geometry at m rows, tdm_tile_at) as the staged form can run it at m rows:
 * where the staged activations of its wk chains a CTA exceed a CTA's shared memory (wk 4 at 17-32
 * rows, a setting only the per-lane forms run as set), its chains move from a CTA's warps to the
 * CTAs of its cluster, wk halved and cs doubled until they fit. Chain c is CTA c / wk's warp c % wk
 * either way and the sum tree over the chains is the same, so the bits are too. 0, or -1 with
 * tdm_err() when no split fits (t then unchanged). */
int tdm_tile_staged_fit(struct tdm_tile *t, int m);
/* 0 if t is a valid setting of kk for (n, k); else -1 with tdm_err() saying why. */
int tdm_tile_check(enum tdm_mmk kk, int64_t n, int64_t k, const struct tdm_tile *t);
/* tdm_tile_check without the rule that kchains is the shape's (tdm_mm_kchains): another sum order.
 * For choosing that rule (tandem-sweep --plan), never for serving: a table may not hold it. */
int tdm_tile_check_plan(enum tdm_mmk kk, int64_t n, int64_t k, const struct tdm_tile *t);
/* "nt=4 wn=4 wk=1 cs=2 pf=1" (and " lo<=2: nt=2 wn=3 wk=2 cs=1 pf=1") into buf. */
const char *tdm_tile_str(const struct tdm_tile *t, char *buf, size_t len);

/* Loaded tables of one architecture. */
struct tdm_tiles;
/* Loads dir/arch/<kernel>.json for every kernel (a missing file means defaults). dir NULL takes
 * TANDEM_TILES. Returns 0, or -1 with tdm_err() naming the file and the fault. */
int tdm_tiles_load(const char *dir, const char *arch, struct tdm_tiles **out);
void tdm_tiles_free(struct tdm_tiles *t);
/* The setting for kernel kk and shape (n, k): the table's entry, else the default. t may be NULL. */
struct tdm_tile tdm_tiles_get(const struct tdm_tiles *t, enum tdm_mmk kk, int64_t n, int64_t k);
/* The device kernel kk's table was swept on (its header's "device"), or NULL without a table. Tables
 * are keyed by architecture alone: an H100 and an H200 (both sm_90) read the same ones. */
const char *tdm_tiles_device(const struct tdm_tiles *t, enum tdm_mmk kk);
/* Whether the table has an entry for the shape (else the default is used). */
int tdm_tiles_has(const struct tdm_tiles *t, enum tdm_mmk kk, int64_t n, int64_t k);
/* The architecture directory name for a compute capability: "sm_90", "sm_121". */
const char *tdm_tiles_arch(int major, int minor, char *buf, size_t len);

/* One table as the sweep writes it. */
struct tdm_tile_entry {
    int64_t n, k;
    struct tdm_tile tile;
    double us;           /* the sweep's score: summed median microseconds over its row counts */
    const char *measured; /* free text: what `us` sums, e.g. "rows 1,4,8,16" */
    double us_lo;        /* the few-row setting's score (its medians summed over the timed rows it serves), when it has one */
};
struct tdm_tile_table {
    enum tdm_mmk kernel;
    const char *arch, *device, *sweep;
    int nentries;
    const struct tdm_tile_entry *entries;
};
/* Parses one table file (validating every entry); *entries is malloc'ed with the entries'
 * "measured" texts in the same block (free with free()). A missing file is an error here. */
int tdm_tile_table_read(const char *path, enum tdm_mmk kk, const char *arch,
                        struct tdm_tile_entry **entries, int *n);
/* Writes a table atomically (a temporary file in the same directory, then rename). */
int tdm_tile_table_write(const char *path, const struct tdm_tile_table *t);

/* ---- the sweep's objectives (tandem-sweep --objective) ----
 * How a table entry's setting is chosen among ncand bit-identical candidates timed at the nrows row
 * counts rows[] (ascending): us[c * nrows + r] is candidate c's median at rows[r], timed[c] whether
 * it was timed at all, nt[c] its n8-tiles a warp.
 * - sum: the lowest sum over the timed rows; then a few-row setting where one exists: the fastest
 *   at one row, where it beats the pick there by 1 % or more, serving the timed row counts up to
 *   lo_cap at each of which it is faster;
 * - decode: those within 1 % of the best one-row time, then the lowest sum; the few-row setting as
 *   for sum;
 * - split: the few-row setting picked as decode picks over the timed rows up to lo_cap, serving
 *   rows 1..lo_cap whole; the main setting, of its nt (a SwiGLU pair, nt 2, stays one launch at
 *   every row count), the lowest sum over the timed rows above; none when the two are one.
 * decode and split need rows[0] == 1, split timed rows on both sides of lo_cap (and lo_cap >= 1):
 * tdm_tile_objective_for gives the objective that applies (else sum, or decode for split). */
enum tdm_tile_objective { TDM_OBJ_SUM, TDM_OBJ_DECODE, TDM_OBJ_SPLIT };
enum tdm_tile_objective tdm_tile_objective_for(enum tdm_tile_objective want, const int *rows, int nrows, int lo_cap);
/* The pick (*pick) and the few-row setting (*lo: -1 for none; else it serves rows 1..*lo_rows)
 * under the objective that applies; 0, or -1 when no candidate was timed. */
int tdm_tile_pick(enum tdm_tile_objective want, const int *rows, int nrows, int lo_cap, int ncand, const double *us,
                  const int *timed, const int *nt, int *pick, int *lo, int *lo_rows);
#ifdef __cplusplus
}
#endif
#endif
