/* tandem-sweep — picks the launch setting of a skinny matrix kernel per weight shape (N, K):
 * enumerates candidate settings, drops every candidate whose output is not bit-identical to the
 * default setting's at every row count 1..32 (random inputs, rows that share inputs; NVFP4 and FP8
 * also from x's blocked copy, the per-lane forms the engine runs), times the
 * survivors over a cold working set, and writes the fastest into the kernel's tile table
 * (atomically, merged with the table's other shapes). A table that serves one row also gets a
 * few-row setting (tiles.h: lo) where another geometry is faster at one row and at every timed row
 * count up to --lo-rows. Progress on stderr; --json reports every candidate with its verdict and
 * time. */
#include "device.h"
#include "err.h"
#include "jsonfile.h"
#include "formats.h"
#include "matmul.h"
#include "settings.h"
#include "model.h"
#include "shapes.h"
#include "tiles.h"
#include "mm_layout.h"
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static const char *prog = "tandem-sweep";

/* The most rows a few-row setting serves by default. Measured inside the engine (16-layer 27B,
 * bench/NOTES.md, the few-row setting): the one-row picks of a sweep made the verify 3 % faster
 * at one row and 2 % at two, the same at three, and 1-3 % slower at 4-16 rows, where their lone
 * timing had them faster. */
#define SWEEP_LO_ROWS 2
#define SWEEP_NOTE_MAX 600   /* --note's characters at most */
/* --objective's names, by enum tdm_tile_objective (tiles.h) */
static const char *const objective_names[] = {[TDM_OBJ_SUM] = "sum", [TDM_OBJ_DECODE] = "decode", [TDM_OBJ_SPLIT] = "split"};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: %s [options]\n"
            "Sweeps the launch settings of the skinny matrix kernels per weight shape and writes the\n"
            "tile tables <dir>/<kernel>.json. Only settings whose output is bit-identical to the\n"
            "default's at every row count 1..32 survive (NVFP4, FP8: with and without x's blocked copy);\n"
            "the fastest over a cold working set wins.\n"
            "A table that serves one row also gets a few-row setting (\"lo\") where another of the\n"
            "identical settings is faster at one row: the fastest there, for the timed row counts up\n"
            "to --lo-rows at which it is still faster than the pick.\n"
            "  --shape N,K            a weight shape, N outputs by K inputs (repeatable)\n"
            "  --model-shapes NAME    every distinct projection shape of a model: qwen3.8-27b or\n"
            "                         qwen3-next-80b (repeatable)\n"
            "  -m, --model DIR        every distinct projection shape of a checkpoint directory\n"
            "                         (its main model's projections, head included; repeatable)\n"
            "  --kernel NAME          nvfp4-skinny, nvfp4-skinny-wide, fp8, bf16 or all (repeatable;\n"
            "                         default: nvfp4-skinny, nvfp4-skinny-wide and fp8)\n"
            "  --out DIR              directory of the tables (default: $TANDEM_TILES/<arch>)\n"
            "  --reps N               timed repeats per row count, median taken (default 10)\n"
            "  --json FILE            report every candidate: setting, verdict, times\n"
            "  --objective NAME       how the fastest is chosen among the identical settings: sum (the\n"
            "                         sum of the timed row counts' medians; default), decode (those\n"
            "                         within 1 %% of the best one-row time, then the lowest sum) or split\n"
            "                         (the few-row setting picked as decode picks over the timed rows up\n"
            "                         to --lo-rows, which it then serves whole; the main setting, of the\n"
            "                         same nt, the lowest sum over the timed rows above); a table whose\n"
            "                         rows start past 1, nvfp4-skinny-wide, is chosen by sum\n"
            "  --lo-rows N            the most rows the few-row setting may serve, 0..%d; 0: none\n"
            "                         (default %d, split %d: in the engine's rounds the small CTAs that\n"
            "                         win at one row tie at 3 rows and lose from 4, where the lone timing\n"
            "                         has them win)\n"
            "  --note TEXT            appended to the header line that says how the table was made\n"
            "                         (its \"sweep\"; at most %d characters): why, on what card, what\n"
            "                         the sweep was for. A merge rewrites that line for the whole table\n"
            "  --write-defaults       write tables holding each shape's default setting; needs no GPU\n"
            "  --arch NAME            architecture for --write-defaults (default sm_90)\n"
            "  --device NAME          device named in the header for --write-defaults (default \"any\")\n"
            "  --plan                 choose the chain rule instead: for every chain count of K the\n"
            "                         rule may pick, time every setting (no bit-identity check: each\n"
            "                         count is another sum order; NVFP4 and FP8 from x's blocked copy, as\n"
            "                         the engine runs it) and print the best per count and the\n"
            "                         rule's own pick; writes no table\n"
            "  -h, --help             this text\n"
            "Exit 0; 1 when the default setting fails or does not reproduce its own bits; 2 on bad\n"
            "usage, a malformed existing table, or when no CUDA device is visible.\n",
            prog, TDM_TILE_LO_ROWS_MAX, SWEEP_LO_ROWS, TDM_TILE_LO_ROWS_MAX, SWEEP_NOTE_MAX);
}


#define MAX_SHAPES 64
static int64_t shapes[MAX_SHAPES][2];
static int nshapes;

static void add_shape(int64_t n, int64_t k)
{
    for (int i = 0; i < nshapes; i++)
        if (shapes[i][0] == n && shapes[i][1] == k) return;
    if (nshapes == MAX_SHAPES) tdm_die_usage(prog, "too many shapes", NULL);
    shapes[nshapes][0] = n;
    shapes[nshapes][1] = k;
    nshapes++;
}

/* A checkpoint's projection: its shape (the view's n, k). */
static void add_projection(void *ctx, const char *what, const struct tdm_qweight *w)
{
    (void)ctx;
    (void)what;
    add_shape(w->n, w->k);
}

/* The row counts a table's timing covers: the rows it serves (at most MAX_TIMED_ROWS of them). */
#define MAX_TIMED_ROWS 5
static int timed_rows(enum tdm_mmk kk, int rows[MAX_TIMED_ROWS])
{
    static const int narrow[] = {1, 2, 4, 8, 16}, wide[] = {17, 24, 32, 0, 0}, all[] = {1, 2, 8, 16, 32};
    _Static_assert(sizeof narrow == sizeof wide && sizeof wide == sizeof all &&
                       sizeof all / sizeof *all == MAX_TIMED_ROWS, "each table's row counts, 0-padded to MAX_TIMED_ROWS");
    const int *r = kk == TDM_MMK_NVFP4 ? narrow : kk == TDM_MMK_NVFP4_WIDE ? wide : all;
    int n = 0;
    while (n < MAX_TIMED_ROWS && r[n] > 0) rows[n] = r[n], n++;
    return n;
}

/* Every valid setting of kk for (n, k) with c chains (tdm_tile_check_plan: c need not be the
 * shape's chain count). */
static int chain_candidates(enum tdm_mmk kk, int64_t n, int64_t k, int c, struct tdm_tile *out, int max)
{
    int cnt = 0;
    for (int nt = 1; nt <= 4; nt *= 2)
        for (int wn = 1; wn <= 8; wn++)
            for (int wk = 1; wk <= 8; wk *= 2)
                for (int pf = 1; pf <= 4; pf++) {
                    struct tdm_tile t = {.nt = nt, .wn = wn, .wk = wk, .cs = c / wk, .pf = pf, .kchains = c};
                    if (c % wk || cnt == max || tdm_tile_check_plan(kk, n, k, &t) != 0) continue;
                    out[cnt++] = t;
                }
    return cnt;
}

/* Every valid setting of kk for (n, k): the default first, then the others with the shape's
 * chains (for those tdm_tile_check_plan is tdm_tile_check). */
static int candidates(enum tdm_mmk kk, int64_t n, int64_t k, struct tdm_tile *out, int max)
{
    const struct tdm_tile def = tdm_tile_default(kk, n, k);
    out[0] = def;
    const int found = chain_candidates(kk, n, k, def.kchains, out + 1, max - 1);
    int cnt = 1;
    for (int i = 0; i < found; i++)
        if (memcmp(&out[1 + i], &def, sizeof def) != 0) out[cnt++] = out[1 + i];
    return cnt;
}

/* ---- running ---- */
struct run {
    const struct tdm_dweight *w;
    const uint16_t *x;
    void *y;
    int64_t m;
    const struct tdm_tile *tile;
    struct tdm_wset *ws;   /* timing: rotate over its copies */
    uint16_t *xbuf;        /* timing NVFP4, FP8: room for x's blocked copy (time_rows packs it at 1-32 rows), or NULL */
    const uint16_t *xb;    /* the copy the call reads, or NULL */
};

static int run_call(void *p, int i, void *stream)
{
    struct run *r = p;
    const struct tdm_dweight *w = r->ws ? &r->ws->w[i % r->ws->copies] : r->w;
    return tdm_matmul_skinny_xb(w, r->x, w->k, r->xb, r->m, r->y, w->n, TDM_MM_F32, r->tile, stream);
}
static int run_call_plan(void *p, int i, void *stream)
{
    struct run *r = p;
    const struct tdm_dweight *w = &r->ws->w[i % r->ws->copies];
    return tdm_matmul_skinny_plan(w, r->x, w->k, r->xb, r->m, r->y, w->n, TDM_MM_F32, r->tile, stream);
}

static void tile_json(json_t *o, const struct tdm_tile *t);

/* Times r at each of the rows (its m set per row count) into times {"rows": us}, us[ri] (NULL: not
 * wanted) and their sum; 0, or -1 with tdm_err(). */
static int time_rows(tdm_launch_fn fn, struct run *r, const int *rows, int nrows, long reps, tdm_stream st,
                     json_t *times, double *us, double *score)
{
    *score = 0;
    for (int ri = 0; ri < nrows; ri++) {
        r->m = rows[ri];
        /* NVFP4 and FP8 at 1-32 rows read x's blocked copy, as the engine's kernels write it beside x */
        const int64_t k = r->ws->w[0].k;
        r->xb = NULL;
        if (r->xbuf && tdm_mm_xb_serves(r->m, k)) {
            if (tdm_mm_pack_xb(r->x, k, r->m, k, r->xbuf, st) != 0) return -1;
            r->xb = r->xbuf;
        }
        double ms;
        if (tdm_time_calls(fn, r, r->ws->copies, (int)reps, 1, st, &ms) != 0) return -1;
        char key[16];
        snprintf(key, sizeof key, "%d", rows[ri]);
        json_object_set_new(times, key, json_real(ms * 1e3));
        if (us) us[ri] = ms * 1e3;
        *score += ms * 1e3;
    }
    return 0;
}

/* --plan: per kernel and shape, the best setting at every chain count the rule may pick. */
static int plan_mode(const int *want, long reps, const char *json_path)
{
    struct tdm_device_info info;
    if (tdm_cuda_device_count() < 1) tdm_die_usage(prog, "no CUDA device visible", NULL);
    if (tdm_cuda_device_info(0, &info) != 0) tdm_die_check(prog);
    const size_t l2 = info.l2_bytes ? info.l2_bytes : (60u << 20);
    tdm_stream st;
    if (tdm_stream_create(&st) != 0) tdm_die_check(prog);
    json_t *report = json_array();
    printf("# tandem-sweep --plan on %s: best setting per chain count (sum of median us over the rows; reps %ld)\n",
           info.name, reps);
    printf("%-18s %-12s %6s %10s  %-34s %s\n", "kernel", "N,K", "chains", "us", "setting", "");
    for (int kk = 0; kk < TDM_MMK_COUNT; kk++) {
        if (!want[kk]) continue;
        const enum tdm_wfmt fmt = (enum tdm_wfmt)tdm_mmk_fmt((enum tdm_mmk)kk);
        const char *kname = tdm_mmk_name((enum tdm_mmk)kk);
        int rows[MAX_TIMED_ROWS], nrows = timed_rows((enum tdm_mmk)kk, rows);
        for (int si = 0; si < nshapes; si++) {
            const int64_t n = shapes[si][0], k = shapes[si][1];
            struct tdm_wset tset;
            if (tdm_wset_alloc(&tset, fmt, n, k, TDM_DT_F32, 8 * l2, 2, 3000 + si) != 0) tdm_die_check(prog);
            uint16_t *x, *xbuf = NULL;   /* NVFP4, FP8: x's blocked copy, packed per row count (time_rows) */
            float *y;
            if (tdm_cuda_malloc((void **)&x, (size_t)(32 * k * 2)) != 0 || tdm_cuda_malloc((void **)&y, (size_t)(32 * n * 4)) != 0 ||
                tdm_dev_fill_bf16(x, (size_t)(32 * k), 77 + si, 2.0f, st) != 0 ||
                (tdm_mm_fmt_reads_xb(fmt) && tdm_cuda_malloc((void **)&xbuf, (size_t)tdm_mm_xb_elems(k) * 2 + 16) != 0))
                tdm_die_check(prog);
            const int rule = tdm_mm_kchains(n, k);
            double best_all = 1e300;
            int best_c = 0;
            for (int c = 1; c <= TDM_MM_MAX_CHAINS; c++) {
                if (!tdm_mm_chains_ok(k, c)) continue;
                static struct tdm_tile cand[1024];
                const int ncand = chain_candidates((enum tdm_mmk)kk, n, k, c, cand, 1024);
                double best = 1e300;
                int besti = -1;
                for (int ci = 0; ci < ncand; ci++) {
                    double score;
                    json_t *times = json_object();
                    struct run r = {NULL, x, y, 0, &cand[ci], &tset, xbuf, NULL};
                    const int ok = time_rows(run_call_plan, &r, rows, nrows, reps, st, times, NULL, &score) == 0;
                    if (!ok) fprintf(stderr, "# %s %" PRId64 ",%" PRId64 ": chains %d: %s\n", kname, n, k, c, tdm_err());
                    json_t *rec = json_object(), *setting = json_object();
                    json_object_set_new(rec, "kernel", json_string(kname));
                    json_object_set_new(rec, "n", json_integer((json_int_t)n));
                    json_object_set_new(rec, "k", json_integer((json_int_t)k));
                    tile_json(setting, &cand[ci]);
                    json_object_set_new(rec, "setting", setting);
                    json_object_set_new(rec, "us", times);
                    if (ok) json_object_set_new(rec, "score_us", json_real(score));
                    json_array_append_new(report, rec);
                    if (ok && score < best) {
                        best = score;
                        besti = ci;
                    }
                }
                if (besti < 0) continue;
                char ts[96], key[32];
                snprintf(key, sizeof key, "%" PRId64 ",%" PRId64, n, k);
                printf("%-18s %-12s %6d %10.2f  %-34s %s\n", kname, key, c, best, tdm_tile_str(&cand[besti], ts, sizeof ts),
                       c == rule ? "(the rule's count)" : "");
                fflush(stdout);
                if (best < best_all) {
                    best_all = best;
                    best_c = c;
                }
            }
            printf("# %s %" PRId64 ",%" PRId64 ": fastest at %d chains, the rule picks %d\n", kname, n, k, best_c, rule);
            tdm_cuda_free(x);
            tdm_cuda_free(y);
            tdm_cuda_free(xbuf);
            tdm_wset_free(&tset);
        }
    }
    if (json_path && tdm_json_write_atomic(json_path, report, JSON_INDENT(1)) != 0) {
        fprintf(stderr, "%s: %s\n", prog, tdm_err());
        return TDM_EXIT_USAGE;
    }
    json_decref(report);
    tdm_stream_destroy(st);
    return 0;
}

/* Runs every row count 1..32 into out[m-1] (poisoned first): setting t where kernel kk serves m
 * rows, the serving kernel's default elsewhere (NVFP4 has one table for 1-16 rows and one for
 * 17-32; the rows of the other table still check that the candidate's rows agree with it). With
 * xbuf (NVFP4, FP8), each call reads x's blocked copy packed there where the copy serves m rows, as the
 * engine's calls do (the per-lane forms); without, none does (the staged forms at 17-32 rows). */
static int run_all_rows(enum tdm_mmk kk, const struct tdm_dweight *w, const uint16_t *x, uint16_t *xbuf,
                        const struct tdm_tile *t, float **out, tdm_stream st)
{
    for (int m = 1; m <= 32; m++) {
        const int serving = tdm_mmk_for(w->fmt, m);
        const struct tdm_tile def = tdm_tile_default((enum tdm_mmk)serving, w->n, w->k);
        const uint16_t *xb = xbuf && tdm_mm_xb_serves(m, w->k) ? xbuf : NULL;
        if (xb && tdm_mm_pack_xb(x, w->k, m, w->k, xbuf, st) != 0) return -1;
        if (tdm_dev_fill_bytes(out[m - 1], (size_t)(m * w->n * 4), 0, 0, 0xff, st) != 0) return -1;
        if (tdm_matmul_skinny_xb(w, x, w->k, xb, m, out[m - 1], w->n, TDM_MM_F32, serving == (int)kk ? t : &def, st) != 0)
            return -1;
    }
    return tdm_stream_sync(st);
}

/* The first row count at which got differs from ref (n outputs a row), its differing bytes in *d;
 * 0 when none does. */
static int first_diff(float **ref, float **got, int64_t n, int64_t *d, tdm_stream st)
{
    for (int m = 1; m <= 32; m++) {
        if (tdm_dev_count_diff(ref[m - 1], got[m - 1], (size_t)(m * n * 4), d, st) != 0) tdm_die_check(prog);
        if (*d) return m;
    }
    return 0;
}

static void tile_json(json_t *o, const struct tdm_tile *t)
{
    json_object_set_new(o, "nt", json_integer(t->nt));
    json_object_set_new(o, "wn", json_integer(t->wn));
    json_object_set_new(o, "wk", json_integer(t->wk));
    json_object_set_new(o, "cs", json_integer(t->cs));
    json_object_set_new(o, "pf", json_integer(t->pf));
    json_object_set_new(o, "kchains", json_integer(t->kchains));
}

/* Merges new entries into the table at path (its other shapes kept) and writes it atomically. */
static void write_table(const char *path, enum tdm_mmk kk, const char *arch, const char *device, const char *sweep,
                        const struct tdm_tile_entry *fresh, int nfresh)
{
    struct tdm_tile_entry *old = NULL, *all;
    int nold = 0;
    FILE *f = fopen(path, "rb");
    if (f) {
        fclose(f);
        if (tdm_tile_table_read(path, kk, arch, &old, &nold) != 0) tdm_die_input(prog);
    }
    all = calloc((size_t)(nold + nfresh + 1), sizeof *all);
    if (!all) tdm_die_usage(prog, "out of memory", NULL);
    int n = 0;
    for (int i = 0; i < nold; i++) {
        int replaced = 0;
        for (int j = 0; j < nfresh; j++)
            if (fresh[j].n == old[i].n && fresh[j].k == old[i].k) replaced = 1;
        if (!replaced) all[n++] = old[i];
    }
    for (int j = 0; j < nfresh; j++) all[n++] = fresh[j];
    struct tdm_tile_table tb = {kk, arch, device, sweep, n, all};
    if (tdm_tile_table_write(path, &tb) != 0) tdm_die_check(prog);
    fprintf(stderr, "# %s: wrote %s (%d shapes)\n", prog, path, n);
    free(all);
    free(old);
}

static void make_dirs(const char *dir)
{
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", dir);
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(buf, 0777);
            *p = '/';
        }
    if (mkdir(buf, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "%s: %s: %s\n", prog, dir, strerror(errno));
        exit(TDM_EXIT_USAGE);
    }
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"shape", required_argument, 0, 's'}, {"model-shapes", required_argument, 0, 'M'},
        {"kernel", required_argument, 0, 'k'}, {"out", required_argument, 0, 'o'},
        {"reps", required_argument, 0, 'r'}, {"json", required_argument, 0, 'j'},
        {"write-defaults", no_argument, 0, 'D'}, {"arch", required_argument, 0, 'a'},
        {"device", required_argument, 0, 'd'}, {"model", required_argument, 0, 'm'},
        {"plan", no_argument, 0, 'P'}, {"objective", required_argument, 0, 'O'},
        {"lo-rows", required_argument, 0, 'L'}, {"note", required_argument, 0, 'N'},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0},
    };
    int want[TDM_MMK_COUNT] = {0}, any_kernel = 0, defaults_only = 0, plan_only = 0;
    enum tdm_tile_objective objective = TDM_OBJ_SUM;
    int lo_cap = -1;   /* -1: the objective's default */
    long reps = 10;
    const char *out_dir = NULL, *json_path = NULL, *arch_opt = NULL, *device_opt = NULL, *note = NULL;
    int c;
    while ((c = tdm_getopt(prog, argc, argv, "hm:", opts)) != -1) {
        switch (c) {
        case 'O': {
            int o = 0;
            while (o <= TDM_OBJ_SPLIT && strcmp(optarg, objective_names[o]) != 0) o++;
            if (o > TDM_OBJ_SPLIT) tdm_die_usage(prog, "--objective: expected sum, decode or split, not", optarg);
            objective = (enum tdm_tile_objective)o;
            break;
        }
        case 'N':
            if (strlen(optarg) > SWEEP_NOTE_MAX) {
                char want_s[64];
                snprintf(want_s, sizeof want_s, "--note: at most %d characters, not %zu", SWEEP_NOTE_MAX, strlen(optarg));
                tdm_die_usage(prog, want_s, NULL);
            }
            note = optarg;
            break;
        case 'L': {
            char *end;
            long v = strtol(optarg, &end, 10);
            if (end == optarg || *end || v < 0 || v > TDM_TILE_LO_ROWS_MAX) {
                char want_s[64];
                snprintf(want_s, sizeof want_s, "--lo-rows: expected an integer in 0..%d, not", TDM_TILE_LO_ROWS_MAX);
                tdm_die_usage(prog, want_s, optarg);
            }
            lo_cap = (int)v;
            break;
        }
        case 's': {
            int64_t n, k;
            if (tdm_parse_shape(optarg, &n, &k) != 0) tdm_die_usage(prog, "--shape: expected N,K with positive integers, not", optarg);
            add_shape(n, k);
            break;
        }
        case 'M': {
            const struct tdm_model_shapes *m = tdm_model_shapes(optarg);
            if (!m) tdm_die_usage(prog, "--model-shapes: expected qwen3.8-27b or qwen3-next-80b, not", optarg);
            int64_t nk[MAX_SHAPES][2];
            int cnt = tdm_model_distinct_shapes(m, nk, MAX_SHAPES);
            for (int i = 0; i < cnt; i++) add_shape(nk[i][0], nk[i][1]);
            break;
        }
        case 'm': {
            struct tdm_model *md = tdm_model_load(optarg);
            if (!md) tdm_die_input(prog);
            tdm_model_each_projection(md, add_projection, NULL);
            tdm_model_free(md);
            break;
        }
        case 'k':
            any_kernel = 1;
            if (strcmp(optarg, "all") == 0) {
                for (int i = 0; i < TDM_MMK_COUNT; i++) want[i] = 1;
            } else {
                int kk = tdm_mmk_from_name(optarg);
                if (kk < 0) tdm_die_usage(prog, "--kernel: expected nvfp4-skinny, nvfp4-skinny-wide, fp8, bf16 or all, not", optarg);
                want[kk] = 1;
            }
            break;
        case 'o': out_dir = optarg; break;
        case 'r': {
            char *end;
            reps = strtol(optarg, &end, 10);
            if (end == optarg || *end || reps < 1 || reps > 10000) tdm_die_usage(prog, "--reps: expected an integer in 1..10000, not", optarg);
            break;
        }
        case 'j': json_path = optarg; break;
        case 'D': defaults_only = 1; break;
        case 'P': plan_only = 1; break;
        case 'a': arch_opt = optarg; break;
        case 'd': device_opt = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return TDM_EXIT_USAGE;
        }
    }
    if (optind < argc) tdm_die_usage(prog, "unexpected argument", argv[optind]);
    if (lo_cap < 0) lo_cap = objective == TDM_OBJ_SPLIT ? TDM_TILE_LO_ROWS_MAX : SWEEP_LO_ROWS;
    if (objective == TDM_OBJ_SPLIT && !lo_cap) tdm_die_usage(prog, "--objective split needs a few-row setting: --lo-rows 1 or more, not", "0");
    if (!nshapes) tdm_die_usage(prog, "no shapes: give --shape N,K, --model-shapes NAME or --model DIR", NULL);
    if (!any_kernel) want[TDM_MMK_NVFP4] = want[TDM_MMK_NVFP4_WIDE] = want[TDM_MMK_FP8] = 1;
    for (int kk = 0; kk < TDM_MMK_COUNT; kk++)
        for (int i = 0; want[kk] && i < nshapes; i++)
            if (tdm_mmk_fmt((enum tdm_mmk)kk) == TDM_W_NVFP4 && shapes[i][1] % 16) {
                char s[64];
                snprintf(s, sizeof s, "%" PRId64 ",%" PRId64, shapes[i][0], shapes[i][1]);
                tdm_die_usage(prog, "NVFP4 needs K a multiple of 16", s);
            }
    if (tdm_settings_check() != 0) tdm_die_input(prog);
    if (plan_only) {
        if (defaults_only || out_dir || note)
            tdm_die_usage(prog, "--plan writes no table: not with --write-defaults, --out or --note", NULL);
        return plan_mode(want, reps, json_path);
    }

    char arch[32], dir[4096], sweep_desc[SWEEP_NOTE_MAX + 512];
    struct tdm_device_info info;
    memset(&info, 0, sizeof info);
    if (defaults_only) {
        snprintf(arch, sizeof arch, "%s", arch_opt ? arch_opt : "sm_90");
        snprintf(info.name, sizeof info.name, "%s", device_opt ? device_opt : "any");
        snprintf(sweep_desc, sizeof sweep_desc, "none (defaults)%s%s", note ? "; " : "", note ? note : "");
    } else {
        if (arch_opt || device_opt) tdm_die_usage(prog, "--arch and --device go with --write-defaults", NULL);
        if (tdm_cuda_device_count() < 1) tdm_die_usage(prog, "no CUDA device visible", NULL);
        if (tdm_cuda_device_info(0, &info) != 0) tdm_die_check(prog);
        tdm_tiles_arch(info.sm_major, info.sm_minor, arch, sizeof arch);
        time_t now = time(NULL);
        char date[32];
        strftime(date, sizeof date, "%Y-%m-%d", gmtime(&now));
        snprintf(sweep_desc, sizeof sweep_desc, "tandem-sweep %s, reps %ld, objective %s, lo-rows %d, bit-identical to the "
                 "default at rows 1..32, timed in a CUDA graph over a cold working set%s%s", date, reps,
                 objective_names[objective], lo_cap, note ? "; " : "", note ? note : "");
    }
    if (out_dir) snprintf(dir, sizeof dir, "%s", out_dir);
    else snprintf(dir, sizeof dir, "%s/%s", tdm_setting("TANDEM_TILES"), arch);
    make_dirs(dir);

    if (defaults_only) {
        for (int kk = 0; kk < TDM_MMK_COUNT; kk++) {
            if (!want[kk]) continue;
            struct tdm_tile_entry e[MAX_SHAPES];
            for (int i = 0; i < nshapes; i++) {
                memset(&e[i], 0, sizeof e[i]);
                e[i].n = shapes[i][0];
                e[i].k = shapes[i][1];
                e[i].tile = tdm_tile_default((enum tdm_mmk)kk, e[i].n, e[i].k);
            }
            char path[4200];
            snprintf(path, sizeof path, "%s/%s.json", dir, tdm_mmk_name((enum tdm_mmk)kk));
            write_table(path, (enum tdm_mmk)kk, arch, info.name, sweep_desc, e, nshapes);
        }
        return 0;
    }

    const size_t l2 = info.l2_bytes ? info.l2_bytes : (60u << 20);
    tdm_stream st;
    if (tdm_stream_create(&st) != 0) tdm_die_check(prog);
    json_t *report = json_array();
    int status = 0;
    for (int kk = 0; kk < TDM_MMK_COUNT; kk++) {
        if (!want[kk]) continue;
        const enum tdm_wfmt fmt = (enum tdm_wfmt)tdm_mmk_fmt((enum tdm_mmk)kk);
        struct tdm_tile_entry picked[MAX_SHAPES];
        int npicked = 0;
        int rows[MAX_TIMED_ROWS], nrows = timed_rows((enum tdm_mmk)kk, rows);
        /* the objective that applies to this table's timed rows (tiles.h) */
        const enum tdm_tile_objective obj = tdm_tile_objective_for(objective, rows, nrows, lo_cap);
        const int by_split = obj == TDM_OBJ_SPLIT, by_decode = obj == TDM_OBJ_DECODE;
        char measured[512];
        if (by_split)
            snprintf(measured, sizeof measured, "sum of median us at rows %d..%d (%d counts); picked split: lo decode-first "
                     "over the timed rows up to %d (within 1 %% of the best one-row time, then the lowest sum there) and "
                     "serving rows 1..%d, the main setting (lo's nt) the lowest sum over the timed rows above; lo: its "
                     "median us summed over the timed rows it serves", rows[0], rows[nrows - 1], nrows, lo_cap, lo_cap);
        else
            snprintf(measured, sizeof measured, "sum of median us at rows %d..%d (%d counts)%s%s", rows[0], rows[nrows - 1], nrows,
                     by_decode ? "; picked decode-first: within 1 % of the best one-row time, then the lowest sum" : "",
                     rows[0] == 1 && lo_cap ? "; lo: its median us summed over the timed rows it serves" : "");
        for (int si = 0; si < nshapes; si++) {
            const int64_t n = shapes[si][0], k = shapes[si][1];
            const char *kname = tdm_mmk_name((enum tdm_mmk)kk);
            struct tdm_wset vset, tset;
            if (tdm_wset_alloc(&vset, fmt, n, k, TDM_DT_F32, 0, 1, 1000 + si) != 0) tdm_die_check(prog);
            if (tdm_wset_alloc(&tset, fmt, n, k, TDM_DT_F32, 8 * l2, 2, 2000 + si) != 0) tdm_die_check(prog);
            /* activations: 32 random BF16 rows; rows 9 and 21 repeat row 0, row 30 repeats row 3 */
            uint16_t *x, *hx = malloc((size_t)(32 * k * 2));
            if (!hx) tdm_die_usage(prog, "out of memory", NULL);
            uint64_t s = 0x9e3779b97f4a7c15ull ^ (uint64_t)(si + 1);
            for (int64_t i = 0; i < 32 * k; i++) {
                s ^= s << 13; s ^= s >> 7; s ^= s << 17;
                hx[i] = tdm_f32_to_bf16((float)((s >> 40) & 0xffffff) / 4194304.0f - 2.0f);
            }
            const int same[3][2] = {{9, 0}, {21, 0}, {30, 3}};
            for (int i = 0; i < 3; i++) memcpy(hx + same[i][0] * k, hx + same[i][1] * k, (size_t)(k * 2));
            if (tdm_cuda_malloc((void **)&x, (size_t)(32 * k * 2)) != 0 || tdm_cuda_h2d(x, hx, (size_t)(32 * k * 2)) != 0) tdm_die_check(prog);
            free(hx);
            float *ref[32], *got[32], *tim;
            for (int m = 1; m <= 32; m++)
                if (tdm_cuda_malloc((void **)&ref[m - 1], (size_t)(m * n * 4)) != 0 ||
                    tdm_cuda_malloc((void **)&got[m - 1], (size_t)(m * n * 4)) != 0)
                    tdm_die_check(prog);
            uint16_t *xbuf;
            if (tdm_cuda_malloc((void **)&tim, (size_t)(32 * n * 4)) != 0 ||
                tdm_cuda_malloc((void **)&xbuf, (size_t)tdm_mm_xb_elems(k) * 2 + 16) != 0)
                tdm_die_check(prog);

            struct tdm_tile cand[512];
            int ncand = candidates((enum tdm_mmk)kk, n, k, cand, 512);
            /* the default twice: it must reproduce its own bits (a race would not) */
            if (run_all_rows((enum tdm_mmk)kk, &vset.w[0], x, NULL, &cand[0], ref, st) != 0 || run_all_rows((enum tdm_mmk)kk, &vset.w[0], x, NULL, &cand[0], got, st) != 0) {
                fprintf(stderr, "%s: %s %" PRId64 ",%" PRId64 ": the default setting fails: %s\n", prog, kname, n, k, tdm_err());
                exit(TDM_EXIT_CHECK);
            }
            int64_t d;
            const int dm = first_diff(ref, got, n, &d, st);
            if (dm) {
                fprintf(stderr, "%s: %s %" PRId64 ",%" PRId64 ": the default does not reproduce its bits at m=%d\n", prog,
                        kname, n, k, dm);
                exit(TDM_EXIT_CHECK);
            }
            /* per candidate: whether it was timed, its sum, its time at timed row count ri at
             * cand_us[ci * nrows + ri] (tdm_tile_pick's layout), its nt */
            static double cand_score[512], cand_us[512 * MAX_TIMED_ROWS];
            static int cand_timed[512], cand_nt[512];
            for (int ci = 0; ci < ncand; ci++) {
                char ts[96], verdict[256] = "identical";
                int dm2;
                cand_nt[ci] = cand[ci].nt;
                tdm_tile_str(&cand[ci], ts, sizeof ts);
                /* every row count as the staged forms run it, then (NVFP4, FP8) from the blocked copy as the
                 * per-lane forms do: a setting may run as set in the one and split over its cluster in
                 * the other (tdm_tile_staged_fit) */
                for (int form = 0; form < (tdm_mm_fmt_reads_xb(fmt) ? 2 : 1) && strcmp(verdict, "identical") == 0; form++) {
                    const char *how = form ? " from the blocked copy" : "";
                    if (run_all_rows((enum tdm_mmk)kk, &vset.w[0], x, form ? xbuf : NULL, &cand[ci], got, st) != 0) {
                        snprintf(verdict, sizeof verdict, "failed%s: %s", how, tdm_err());
                    } else if ((dm2 = first_diff(ref, got, n, &d, st)) != 0) {
                        snprintf(verdict, sizeof verdict, "differs%s at m=%d (%" PRId64 " bytes)", how, dm2, d);
                    }
                }
                json_t *rec = json_object(), *times = json_object();
                json_object_set_new(rec, "kernel", json_string(kname));
                json_object_set_new(rec, "n", json_integer((json_int_t)n));
                json_object_set_new(rec, "k", json_integer((json_int_t)k));
                json_t *setting = json_object();
                tile_json(setting, &cand[ci]);
                json_object_set_new(rec, "setting", setting);
                json_object_set_new(rec, "default", json_boolean(ci == 0));
                double score = 0;
                int timed = strcmp(verdict, "identical") == 0;
                struct run r = {NULL, x, tim, 0, &cand[ci], &tset, tdm_mm_fmt_reads_xb(fmt) ? xbuf : NULL, NULL};
                if (timed && time_rows(run_call, &r, rows, nrows, reps, st, times, &cand_us[ci * nrows], &score) != 0) {
                    snprintf(verdict, sizeof verdict, "timing failed: %s", tdm_err());
                    timed = 0;
                }
                json_object_set_new(rec, "verdict", json_string(verdict));
                json_object_set_new(rec, "us", times);
                cand_timed[ci] = timed;
                cand_score[ci] = score;
                if (timed) json_object_set_new(rec, "score_us", json_real(score));
                json_array_append_new(report, rec);
                fprintf(stderr, "# %s %" PRId64 ",%" PRId64 ": %d/%d %s%s: %s", kname, n, k, ci + 1, ncand, ts,
                        ci == 0 ? " (default)" : "", verdict);
                if (timed) fprintf(stderr, ", %.2f us", score);
                fprintf(stderr, "\n");
            }
            /* the pick and its few-row setting under the objective (tiles.h) */
            int besti, lo, lo_rows;
            if (tdm_tile_pick(objective, rows, nrows, lo_cap, ncand, cand_us, cand_timed, cand_nt, &besti, &lo, &lo_rows) != 0) {
                fprintf(stderr, "%s: %s %" PRId64 ",%" PRId64 ": no setting could be timed\n", prog, kname, n, k);
                status = TDM_EXIT_CHECK;
            } else {
                struct tdm_tile_entry *e = &picked[npicked++];
                e->n = n;
                e->k = k;
                e->tile = cand[besti];
                e->us = cand_score[besti];
                e->us_lo = 0;
                if (lo_rows) {
                    e->tile.lo_rows = lo_rows;
                    e->tile.lo = tdm_tile_geom_of(&cand[lo]);
                    for (int ri = 0; ri < nrows && rows[ri] <= lo_rows; ri++) e->us_lo += cand_us[lo * nrows + ri];
                }
                e->measured = measured;
                char ts[96];
                fprintf(stderr, "# %s %" PRId64 ",%" PRId64 ": picked %s, %.2f us\n", kname, n, k,
                        tdm_tile_str(&e->tile, ts, sizeof ts), e->us);
            }
            for (int m = 1; m <= 32; m++) {
                tdm_cuda_free(ref[m - 1]);
                tdm_cuda_free(got[m - 1]);
            }
            tdm_cuda_free(tim);
            tdm_cuda_free(xbuf);
            tdm_cuda_free(x);
            tdm_wset_free(&vset);
            tdm_wset_free(&tset);
        }
        if (npicked) {
            char path[4200];
            snprintf(path, sizeof path, "%s/%s.json", dir, tdm_mmk_name((enum tdm_mmk)kk));
            write_table(path, (enum tdm_mmk)kk, arch, info.name, sweep_desc, picked, npicked);
        }
    }
    if (json_path && tdm_json_write_atomic(json_path, report, JSON_INDENT(1)) != 0) {
        fprintf(stderr, "%s: %s\n", prog, tdm_err());
        return TDM_EXIT_USAGE;
    }
    json_decref(report);
    tdm_stream_destroy(st);
    return status;
}
