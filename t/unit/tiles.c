/* Tile tables: the default setting is valid and keyed by shape only, a table written by the
 * sweep's writer reads back, a missing shape or file falls back to the default, a malformed
 * table is an error that names the file, and the sweep's objectives pick as tiles.h says. And the
 * SwiGLU forms the engine's line names (tdm_matmul_swiglu_forms) on hand-written tables: no device,
 * the weights' and activations' addresses only checked for alignment. */
#include "err.h"
#include "jsonfile.h"
#include "matmul.h"
#include "mm_layout.h"
#include "tap.h"
#include "tiles.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[256];

static void write_text(const char *name, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/sm_90/%s", dir, name);
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
}

static void remove_table(const char *d, const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/sm_90/%s", d, name);
    remove(path);
}

static int load_fails_naming(const char *file, const char *fault)
{
    struct tdm_tiles *t = NULL;
    int rc = tdm_tiles_load(dir, "sm_90", &t);
    tdm_tiles_free(t);
    return rc != 0 && strstr(tdm_err(), file) && (!fault || strstr(tdm_err(), fault));
}

/* The sweep's objectives (tdm_tile_pick) on made-up timings at the narrow table's rows 1, 2, 4, 8, 16:
 * A the fastest at one row and over 1-8 rows, slow at 16 (nt 2); B within 1 % at one row with the
 * lowest sum over all rows (nt 2); C the fastest at 16 rows (nt 2); D faster still at 16 rows but
 * nt 1; E the lowest sum of all, 3 % slower at one row; F faster than everything, not timed. */
static void test_objectives(void)
{
    const int rows[5] = {1, 2, 4, 8, 16};
    const double us[6 * 5] = {
        10.0, 10.0, 10.0, 10.0, 30.0,   /* A: sum 70 */
        10.05, 10.2, 10.2, 10.2, 25.0,  /* B: sum 65.65 */
        12.0, 12.0, 12.0, 12.0, 15.0,   /* C: sum 63 */
        13.0, 13.0, 13.0, 13.0, 12.0,   /* D: sum 64 */
        10.3, 10.3, 10.3, 10.3, 20.0,   /* E: sum 61.2 */
        1.0, 1.0, 1.0, 1.0, 1.0,        /* F */
    };
    const int timed[6] = {1, 1, 1, 1, 1, 0}, nt[6] = {2, 2, 2, 1, 2, 2};
    enum { A, B, C, D, E };
    int pick, lo, lo_rows;
    ok(tdm_tile_pick(TDM_OBJ_SUM, rows, 5, 2, 6, us, timed, nt, &pick, &lo, &lo_rows) == 0 && pick == E && lo == A &&
       lo_rows == 2, "sum: the lowest sum (E); the fastest at one row (A, 1 %% faster there) as the few-row setting at rows "
       "1-2 (--lo-rows 2)");
    ok(tdm_tile_pick(TDM_OBJ_SUM, rows, 5, 8, 6, us, timed, nt, &pick, &lo, &lo_rows) == 0 && pick == E && lo == A &&
       lo_rows == 8, "sum with --lo-rows 8: the few-row setting serves every timed row up to 8 where it is faster");
    ok(tdm_tile_pick(TDM_OBJ_SUM, rows, 5, 0, 6, us, timed, nt, &pick, &lo, &lo_rows) == 0 && pick == E && lo == -1 &&
       lo_rows == 0, "sum with --lo-rows 0: no few-row setting");
    ok(tdm_tile_pick(TDM_OBJ_DECODE, rows, 5, 2, 6, us, timed, nt, &pick, &lo, &lo_rows) == 0 && pick == B && lo == -1,
       "decode: within 1 %% of the best one-row time (A, B), the lowest sum (B); A is not 1 %% faster at one row: none");
    ok(tdm_tile_pick(TDM_OBJ_SPLIT, rows, 5, 8, 6, us, timed, nt, &pick, &lo, &lo_rows) == 0 && pick == C && lo == A &&
       lo_rows == 8, "split: the few-row setting decode-first over rows 1-8 (A), serving 1-8; the main one the fastest "
       "above of A's nt (C, not D's nt 1)");
    const int nt1[6] = {1, 1, 1, 1, 1, 1};
    ok(tdm_tile_pick(TDM_OBJ_SPLIT, rows, 5, 8, 6, us, timed, nt1, &pick, &lo, &lo_rows) == 0 && pick == D && lo == A,
       "split with every nt the same: the fastest above (D)");
    const double one[5] = {10.0, 10.0, 10.0, 10.0, 30.0};
    ok(tdm_tile_pick(TDM_OBJ_SPLIT, rows, 5, 8, 1, one, timed, nt, &pick, &lo, &lo_rows) == 0 && pick == 0 && lo == -1 &&
       lo_rows == 0, "split with one candidate: it, and no few-row setting");
    ok(tdm_tile_objective_for(TDM_OBJ_SPLIT, rows, 4, 8) == TDM_OBJ_DECODE &&
       tdm_tile_pick(TDM_OBJ_SPLIT, rows, 4, 8, 6, us, timed, nt, &pick, &lo, &lo_rows) == 0 && pick == A,
       "split without timed rows above --lo-rows falls back to decode");
    const int wide[3] = {17, 24, 32};
    ok(tdm_tile_objective_for(TDM_OBJ_DECODE, wide, 3, 8) == TDM_OBJ_SUM &&
       tdm_tile_objective_for(TDM_OBJ_SPLIT, wide, 3, 8) == TDM_OBJ_SUM &&
       tdm_tile_objective_for(TDM_OBJ_SPLIT, rows, 5, 0) == TDM_OBJ_DECODE,
       "rows starting past one: sum whatever was asked; split without a few-row cap: decode");
    const int none[6] = {0, 0, 0, 0, 0, 0};
    ok(tdm_tile_pick(TDM_OBJ_DECODE, rows, 5, 2, 6, us, none, nt, &pick, &lo, &lo_rows) == -1 && pick == -1,
       "nothing timed: -1");
}

/* The forms the engine runs for a 27B MLP pair (17408x5120) at each row count, in the words of its
 * line, with every table setting nt 2 for the shape but BF16's (nt 1, as shipped): NVFP4's one launch
 * where tdm_matmul_swiglu_pays (every row count held tile-major, not 9-24 held in rows), FP8's at 1-16
 * rows and only from x's blocked copy, FP8's three launches at 17-24 (tdm_matmul_gated_pays), BF16
 * never one launch; TANDEM_MLP_FUSE's on and off. */
static void test_swiglu_forms(void)
{
    static const char *const kernels[] = {"nvfp4-skinny", "nvfp4-skinny-wide", "fp8", "bf16"};
    for (int i = 0; i < 4; i++) {
        char text[512], name[64];
        snprintf(text, sizeof text, "{\"kernel\": \"%s\", \"arch\": \"sm_90\", \"device\": \"x\", \"sweep\": \"none\", "
                 "\"shapes\": {\"17408,5120\": {\"nt\": %d, \"wn\": %d, \"wk\": %d, \"cs\": %d, \"pf\": 1, \"kchains\": 2}}}",
                 kernels[i], i == 3 ? 1 : 2, i == 3 ? 8 : i == 2 ? 1 : 3, i == 3 ? 1 : 2, i == 3 ? 2 : 1);   /* as shipped */
        snprintf(name, sizeof name, "%s.json", kernels[i]);
        write_text(name, text);
    }
    struct tdm_tiles *tl = NULL;
    if (tdm_tiles_load(dir, "sm_90", &tl) != 0) {
        ok(0, "the SwiGLU forms' tables load: %s", tdm_err());
        return;
    }
    const uintptr_t at = 4096;   /* an address aligned for every load; never read */
    /* each weight in the order the upload holds it in (tile-major NVFP4 in builds with TDM_MM_NVFP4_TILES) */
    struct tdm_dweight nv = {TDM_W_NVFP4, 17408, 5120, 0, (const void *)at, (const void *)at, TDM_DT_F8_E4M3, 1, NULL, 0};
    nv.order = tdm_dweight_order_for(nv.fmt, nv.n, nv.k);
    struct tdm_dweight f8 = nv, b16 = nv;
    f8.fmt = TDM_W_FP8;
    f8.scale_dt = TDM_DT_F32;
    f8.order = tdm_dweight_order_for(f8.fmt, f8.n, f8.k);
    b16.fmt = TDM_W_BF16;
    b16.scale = NULL;
    b16.order = tdm_dweight_order_for(b16.fmt, b16.n, b16.k);
    const uint16_t *x = (const uint16_t *)at, *xb = (const uint16_t *)(2 * at);
    /* NVFP4 under auto: one launch at every row count held tile-major; held in rows (a rows build),
     * the gated form at 9-24 */
    const char *nv_tiles = "one launch at 1-32 rows; three launches past 32 rows",
               *nv_rows_auto = "one launch at 1-8 and 25-32 rows; gate, then up with the SiLU x up at 9-24 rows; "
                               "three launches past 32 rows",
               *gated = "gate, then up with the SiLU x up at 1-32 rows; three launches past 32 rows";
    const char *nv_auto = nv.order == TDM_MM_ORDER_TILES ? nv_tiles : nv_rows_auto;
    const struct {
        enum tdm_mlp_fuse fuse;
        int fmt;   /* 0 NVFP4, 1 FP8, 2 BF16 */
        int with_xb;
        const char *want, *what;
    } cases[] = {
        {TDM_MLP_FUSE_AUTO, 0, 1, nv_auto, "NVFP4, auto (the upload's order)"},
        {TDM_MLP_FUSE_ON, 0, 1, nv_tiles, "NVFP4, on"},
        {TDM_MLP_FUSE_OFF, 0, 1, gated, "NVFP4, off"},
        {TDM_MLP_FUSE_AUTO, 1, 1,
         "one launch at 1-16 rows; three launches at 17-24 and past 32 rows; gate, then up with the SiLU x up at 25-32 rows",
         "FP8, auto, from x's blocked copy"},
        {TDM_MLP_FUSE_AUTO, 1, 0,
         "gate, then up with the SiLU x up at 1-16 and 25-32 rows; three launches at 17-24 and past 32 rows",
         "FP8, auto, x as written (no one launch)"},
        {TDM_MLP_FUSE_AUTO, 2, 1, gated, "BF16 (nt 1), auto"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const struct tdm_dweight *w = cases[i].fmt == 0 ? &nv : cases[i].fmt == 1 ? &f8 : &b16;
        char got[256];
        tdm_matmul_swiglu_forms(cases[i].fuse, w, w, x, 5120, cases[i].with_xb ? xb : NULL, tl, got, sizeof got);
        ok(strcmp(got, cases[i].want) == 0, "the SwiGLU forms, %s: %s", cases[i].what, got);
    }
    /* an NVFP4 weight held in rows where the build holds NVFP4 tile-major: the fast path does not read it,
     * so no one-launch form (the checked path's products) */
    struct tdm_dweight nv_rows = nv;
    nv_rows.order = TDM_MM_ORDER_ROWS;
    char got[256];
    tdm_matmul_swiglu_forms(TDM_MLP_FUSE_AUTO, &nv_rows, &nv_rows, x, 5120, xb, tl, got, sizeof got);
    const char *want = nv.order == TDM_MM_ORDER_TILES ? gated : nv_rows_auto;
    ok(strcmp(got, want) == 0, "the SwiGLU forms, NVFP4 held in rows (the build holds NVFP4 in %s), auto: %s",
       nv.order == TDM_MM_ORDER_TILES ? "tiles" : "rows", got);
    char small[24];
    tdm_matmul_swiglu_forms(TDM_MLP_FUSE_AUTO, &nv, &nv, x, 5120, xb, tl, small, sizeof small);
    ok(strlen(small) == sizeof small - 1 && strncmp(small, nv_auto, sizeof small - 1) == 0,
       "the words cut to the buffer: '%s'", small);
    tdm_tiles_free(tl);
    for (int i = 0; i < 4; i++) {
        char name[64];
        snprintf(name, sizeof name, "%s.json", kernels[i]);
        remove_table(dir, name);
    }
}

/* tdm_json_write_atomic (jsonfile.h), which writes the tables and the tools' --json reports: the
 * object reads back equal, the file ends with a newline, no temporary is left beside it; a path
 * that cannot be created fails naming the file and leaves nothing. */
static void test_json_write(const char *dir)
{
    char path[400], bad[400];
    snprintf(path, sizeof path, "%s/report.json", dir);
    snprintf(bad, sizeof bad, "%s/no-such-dir/report.json", dir);
    json_t *j = json_pack("{s:i, s:[f, s], s:{s:b}}", "n", 17408, "us", 20.5, "x", "k", "lo", "on", 1);
    int rc = tdm_json_write_atomic(path, j, JSON_INDENT(1) | JSON_SORT_KEYS);
    json_t *back = rc == 0 ? tdm_json_read_object(path, 1 << 20) : NULL;
    ok(rc == 0 && back && json_equal(j, back), "tdm_json_write_atomic: the object reads back equal%s%s", rc ? ": " : "",
       rc ? tdm_err() : "");
    FILE *f = fopen(path, "rb");
    int last = EOF;
    if (f) {
        for (int c; (c = fgetc(f)) != EOF;) last = c;
        fclose(f);
    }
    ok(last == '\n', "and the file ends with a newline");
    int tmps = 0;
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) tmps += strstr(e->d_name, ".tmp.") != NULL;
    if (d) closedir(d);
    ok(d && tmps == 0, "no temporary left beside it (%d)", tmps);
    rc = tdm_json_write_atomic(bad, j, 0);
    ok(rc == -1 && strstr(tdm_err(), bad) && access(bad, F_OK) != 0, "a path that cannot be created: -1 naming it (%s)",
       tdm_err());
    json_decref(back);
    json_decref(j);
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/tandem-tiles-XXXXXX");
    if (!mkdtemp(dir)) { printf("Bail out! mkdtemp\n"); return 1; }
    char sub[300];
    snprintf(sub, sizeof sub, "%s/sm_90", dir);
    mkdir(sub, 0777);

    /* defaults */
    const int64_t shapes[][2] = {{17408, 5120}, {5120, 17408}, {48, 5120}, {12288, 2048}, {2048, 512}, {300, 200}, {100, 1040}};
    int all_valid = 1, invariant = 1;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int kk = 0; kk < TDM_MMK_COUNT; kk++) {
            struct tdm_tile t = tdm_tile_default((enum tdm_mmk)kk, shapes[i][0], shapes[i][1]);
            if (tdm_tile_check((enum tdm_mmk)kk, shapes[i][0], shapes[i][1], &t) != 0) {
                all_valid = 0;
                printf("# %s %lld,%lld: %s\n", tdm_mmk_name(kk), (long long)shapes[i][0], (long long)shapes[i][1], tdm_err());
            }
            if (t.kchains != tdm_mm_kchains(shapes[i][0], shapes[i][1])) invariant = 0;
        }
    ok(all_valid, "every default setting passes the checks");
    ok(invariant, "the defaults' chains of K are tdm_mm_kchains(n, k): one sum order per shape for every kernel");
    ok(tdm_mm_kchains(17408, 5120) == 2 && tdm_mm_kchains(5120, 17408) == 8 && tdm_mm_kchains(10240, 5120) == 4 &&
           tdm_mm_kchains(48, 5120) == 8 && tdm_mm_kchains(100, 1040) == 2 && tdm_mm_kchains(248320, 5120) == 1 &&
           tdm_mm_kchains(6144, 5120) == 4 && tdm_mm_kchains(12288, 2048) == 2,
       "kchains: 27B MLP 2 and 8, in_proj_qkv 4, a 48-row shape 8, a short K of 9 slabs 2 (4 would leave a chain empty), "
       "the head 1, 6144x5120 4 (not 5: powers of two only), 12288x2048 2 (4 would pass 2816 warps)");
    ok(tdm_mm_chains_ok(5120, 7) && !tdm_mm_chains_ok(5120, 9) && tdm_mm_chains_ok(5120, 10) && !tdm_mm_chains_ok(1040, 6),
       "chain counts: 7 of 40 slabs yes, 9 (odd past 8) no, 10 yes, 6 of 9 slabs no (an empty chain)");
    struct tdm_tile t = tdm_tile_default(TDM_MMK_NVFP4, 17408, 5120);
    t.kchains = 4;
    t.cs = 4;
    ok(tdm_tile_check(TDM_MMK_NVFP4, 17408, 5120, &t) != 0 && strstr(tdm_err(), "sum order") &&
           tdm_tile_check_plan(TDM_MMK_NVFP4, 17408, 5120, &t) == 0,
       "a setting that changes the shape's chains of K is refused: %s", tdm_err());
    t = tdm_tile_default(TDM_MMK_FP8, 17408, 5120);
    t.nt = 4;
    ok(tdm_tile_check(TDM_MMK_FP8, 17408, 5120, &t) != 0, "FP8 with 4 n8-tiles a warp is refused: %s", tdm_err());
    /* wk 4 at 17-32 rows: the per-lane form from the blocked copy runs it as set; the staged form's
     * activations would need 384 KB, so a staged call splits the chains over the cluster */
    t = (struct tdm_tile){.nt = 2, .wn = 2, .wk = 4, .cs = 2, .pf = 1, .kchains = 8};
    struct tdm_tile st = t;
    ok(tdm_tile_check(TDM_MMK_NVFP4_WIDE, 5120, 17408, &t) == 0 && tdm_tile_smem(&t, 32, 0) > 232448 &&
           tdm_tile_staged_fit(&st, 32) == 0 && st.wk == 2 && st.cs == 4 && st.kchains == 8 && st.wn == 2 && st.nt == 2 &&
           tdm_tile_smem(&st, 32, 0) <= 232448,
       "NVFP4 wk 4 cs 2 at 17-32 rows is valid (per lane); staged it runs wk 2 cs 4, the same 8 chains: %s",
       tdm_tile_check(TDM_MMK_NVFP4_WIDE, 5120, 17408, &t) ? tdm_err() : "ok");
    st = t;
    ok(tdm_tile_staged_fit(&st, 16) == 0 && memcmp(&st, &t, sizeof st) == 0, "at 16 rows it fits staged as set");
    t.nt = 1;   /* nt 1 has no per-lane form at 17-32 rows: the staged form must fit as set */
    ok(tdm_tile_check(TDM_MMK_NVFP4_WIDE, 5120, 17408, &t) != 0 && strstr(tdm_err(), "shared memory"),
       "nt 1 wk 4 at 17-32 rows (staged only) is refused: %s", tdm_err());
    t = (struct tdm_tile){.nt = 2, .wn = 1, .wk = 8, .cs = 1, .pf = 1, .kchains = 8};
    st = t;
    ok(tdm_tile_staged_fit(&st, 32) == 0 && st.wk == 2 && st.cs == 4, "wk 8 cs 1 staged at 32 rows: wk 2 cs 4");
    t = (struct tdm_tile){.nt = 2, .wn = 1, .wk = 8, .cs = 2, .pf = 1, .kchains = 16};
    st = t;
    ok(tdm_tile_staged_fit(&st, 32) == 0 && st.wk == 2 && st.cs == 8, "16 chains at wk 8 cs 2 staged at 32 rows: wk 2 cs 8");
    /* FP8 has a per-lane form at nt 1 from the blocked copy (mm_layout.h: TDM_MM_DIRECT_XB): the same rule */
    t = (struct tdm_tile){.nt = 1, .wn = 2, .wk = 4, .cs = 2, .pf = 1, .kchains = 8};
    st = t;
    ok(tdm_tile_check(TDM_MMK_FP8, 5120, 17408, &t) == 0 && tdm_tile_staged_fit(&st, 32) == 0 && st.wk == 2 && st.cs == 4,
       "FP8 nt 1 wk 4 cs 2 at 32 rows is valid (per lane); staged it runs wk 2 cs 4: %s",
       tdm_tile_check(TDM_MMK_FP8, 5120, 17408, &t) ? tdm_err() : "ok");
    /* FP8 nt 2: per lane from the copy at 1-16 rows, elsewhere nt 1 over twice the warps
     * (mm_layout.h: TDM_MM_FORM_NT): pf 1 only, and the doubled warps within the CTA's bound */
    t = (struct tdm_tile){.nt = 2, .wn = 2, .wk = 2, .cs = 1, .pf = 1, .kchains = 2};
    ok(tdm_tile_check(TDM_MMK_FP8, 17408, 5120, &t) == 0 && TDM_MM_FORM_NT(TDM_MMF_FP8, 2, 1, 1) == 2 &&
           TDM_MM_FORM_NT(TDM_MMF_FP8, 2, 2, 1) == 1 && TDM_MM_FORM_NT(TDM_MMF_FP8, 2, 0, 0) == 1 &&
           TDM_MM_FORM_NT(TDM_MMF_NVFP4, 2, 2, 0) == 2,
       "FP8 nt 2 wn 2 wk 2 pf 1 is valid; it runs nt 2 per lane from the copy at 1-16 rows, else nt 1: %s",
       tdm_tile_check(TDM_MMK_FP8, 17408, 5120, &t) ? tdm_err() : "ok");
    t.pf = 3;
    ok(tdm_tile_check(TDM_MMK_FP8, 17408, 5120, &t) != 0 && strstr(tdm_err(), "built for"), "FP8 nt 2 at pf 3 is refused: %s",
       tdm_err());
    t = (struct tdm_tile){.nt = 2, .wn = 4, .wk = 2, .cs = 1, .pf = 1, .kchains = 2};
    ok(tdm_tile_check(TDM_MMK_FP8, 17408, 5120, &t) != 0 && strstr(tdm_err(), "twice the warps") &&
           tdm_tile_check(TDM_MMK_NVFP4, 17408, 5120, &t) == 0,
       "FP8 nt 2 wn 4 wk 2 (16 warps as nt 1) is refused, NVFP4's is valid: %s", tdm_err());
    ok(tdm_tile_check(TDM_MMK_BF16, 5120, 17408, &(struct tdm_tile){.nt = 1, .wn = 2, .wk = 4, .cs = 2, .pf = 1, .kchains = 8}) != 0,
       "BF16 (no per-lane form) keeps the staged bound at 32 rows: %s", tdm_err());
    ok(tdm_mmk_for(3 /* NVFP4 */, 16) == TDM_MMK_NVFP4 && tdm_mmk_for(3, 17) == TDM_MMK_NVFP4_WIDE &&
       tdm_mmk_for(2, 32) == TDM_MMK_FP8 && tdm_mmk_for(3, 33) == -1, "kernel by rows: NVFP4 1-16, 17-32; FP8; none above 32");

    /* no files: every shape takes the default */
    struct tdm_tiles *tl = NULL;
    ok(tdm_tiles_load(dir, "sm_90", &tl) == 0, "a directory without tables loads (defaults)");
    struct tdm_tile got = tdm_tiles_get(tl, TDM_MMK_NVFP4, 17408, 5120), want = tdm_tile_default(TDM_MMK_NVFP4, 17408, 5120);
    ok(memcmp(&got, &want, sizeof got) == 0 && !tdm_tiles_has(tl, TDM_MMK_NVFP4, 17408, 5120), "missing table: the default");
    tdm_tiles_free(tl);

    /* a table written by the writer reads back; a missing shape falls back */
    struct tdm_tile_entry e[2] = {{5120, 17408, tdm_tile_default(TDM_MMK_NVFP4, 5120, 17408), 12.5, "rows 1..16", 0},
                                  {1024, 5120, tdm_tile_default(TDM_MMK_NVFP4, 1024, 5120), 0, NULL, 0}};
    e[0].tile.nt = 1;
    e[0].tile.wn = 4;
    e[0].tile.wk = 2;
    e[0].tile.cs = 4;   /* kchains 8 = wk 2 x cs 4 */
    e[0].tile.pf = 3;
    e[0].tile.lo_rows = 2;   /* the few-row geometry: optional, read back */
    e[0].tile.lo = (struct tdm_tile_geom){2, 1, 2, 4, 1};
    e[0].us_lo = 4.5;
    struct tdm_tile_table tb = {TDM_MMK_NVFP4, "sm_90", "NVIDIA H200", "test", 2, e};
    char path[512];
    snprintf(path, sizeof path, "%s/sm_90/nvfp4-skinny.json", dir);
    ok(tdm_tile_table_write(path, &tb) == 0, "the writer writes %s", path);
    ok(tdm_tiles_load(dir, "sm_90", &tl) == 0, "and it loads: %s", tl ? "ok" : tdm_err());
    got = tdm_tiles_get(tl, TDM_MMK_NVFP4, 5120, 17408);
    ok(memcmp(&got, &e[0].tile, sizeof got) == 0 && tdm_tiles_has(tl, TDM_MMK_NVFP4, 5120, 17408), "the entry comes back");
    struct tdm_tile at1 = tdm_tile_at(&got, 1), at2 = tdm_tile_at(&got, 2), at3 = tdm_tile_at(&got, 3);
    ok(at1.nt == 2 && at1.wn == 1 && at1.wk == 2 && at1.cs == 4 && at1.pf == 1 && at1.kchains == 8 && at1.lo_rows == 0 &&
           memcmp(&at1, &at2, sizeof at1) == 0 && at3.nt == 1 && at3.wn == 4 && at3.pf == 3 && at3.lo_rows == 0,
       "the setting at 1 and 2 rows is the few-row geometry, at 3 rows the main one");
    {
        struct tdm_tile_entry *back = NULL;
        int nback = 0;
        const int rd = tdm_tile_table_read(path, TDM_MMK_NVFP4, "sm_90", &back, &nback);
        const struct tdm_tile_entry *b5 = rd == 0 && nback == 2 ? (back[0].n == 5120 ? &back[0] : &back[1]) : NULL,
                                    *b1 = b5 == &back[0] ? &back[1] : &back[0];
        ok(b5 && b5->us_lo == 4.5, "the few-row setting's time comes back");
        ok(b5 && b5->measured && strcmp(b5->measured, "rows 1..16") == 0 && b1->measured == NULL,
           "and what the time measured (none where the table has none): a sweep merging into it keeps it");
        free(back);
    }
    got = tdm_tiles_get(tl, TDM_MMK_NVFP4, 6144, 5120);
    want = tdm_tile_default(TDM_MMK_NVFP4, 6144, 5120);
    ok(memcmp(&got, &want, sizeof got) == 0, "a shape not in the table takes the default");
    got = tdm_tiles_get(tl, TDM_MMK_FP8, 17408, 5120);
    want = tdm_tile_default(TDM_MMK_FP8, 17408, 5120);
    ok(memcmp(&got, &want, sizeof got) == 0, "another kernel's table is separate");
    tdm_tiles_free(tl);

    e[0].tile.wn = 8; /* 8 x 2 warps: more than a CTA may have */
    ok(tdm_tile_table_write(path, &tb) != 0 && strstr(tdm_err(), "256 threads"), "the writer refuses an invalid setting: %s", tdm_err());
    remove(path);

    /* malformed tables: each an error naming the file */
    const char *hdr = "\"kernel\": \"fp8\", \"arch\": \"sm_90\", \"device\": \"x\", \"sweep\": \"none\"";
    char text[1024];
    write_text("fp8.json", "{ not json");
    ok(load_fails_naming("fp8.json", NULL), "not JSON: %s", tdm_err());
    snprintf(text, sizeof text, "{%s}", hdr);
    write_text("fp8.json", text);
    ok(load_fails_naming("fp8.json", "shapes"), "no shapes: %s", tdm_err());
    write_text("fp8.json", "{\"kernel\": \"nvfp4-skinny\", \"arch\": \"sm_90\", \"device\": \"x\", \"sweep\": \"none\", \"shapes\": {}}");
    ok(load_fails_naming("fp8.json", "kernel"), "another kernel's header: %s", tdm_err());
    static const struct {
        const char *shapes, *naming, *what;
    } bad_shape[] = {
        {"\"17408x5120\": {}", "17408x5120", "a key that is not N,K"},
        {"\"17408,5120\": {\"nt\": 2, \"wn\": 4, \"wk\": 1, \"cs\": 2, \"pf\": 1}", "kchains", "a missing field"},
        {"\"17408,5120\": {\"nt\": 1, \"wn\": 4, \"wk\": 1, \"cs\": 4, \"pf\": 1, \"kchains\": 4}", "sum order",
         "chains of K that are not the shape's"},
        {"\"17408,5120\": {\"nt\": 3, \"wn\": 4, \"wk\": 1, \"cs\": 2, \"pf\": 1, \"kchains\": 2}", "nt", "an invalid field value"},
        {"\"17408,5120\": {\"nt\": \"2\", \"wn\": 4, \"wk\": 1, \"cs\": 2, \"pf\": 1, \"kchains\": 2}", "integer",
         "a field of the wrong type"},
    };
    for (size_t i = 0; i < sizeof bad_shape / sizeof bad_shape[0]; i++) {
        snprintf(text, sizeof text, "{%s, \"shapes\": {%s}}", hdr, bad_shape[i].shapes);
        write_text("fp8.json", text);
        ok(load_fails_naming("fp8.json", bad_shape[i].naming), "%s: %s", bad_shape[i].what, tdm_err());
    }
    static const struct {
        const char *lo, *naming, *what;
    } bad_lo[] = {
        {"{\"rows\": 2, \"nt\": 1, \"wn\": 4, \"wk\": 1, \"cs\": 2, \"pf\": 2}", "lo: nt 1, pf 2", "a few-row load depth the kernel is not built for"},
        {"{\"rows\": 2, \"nt\": 1, \"wn\": 4, \"wk\": 2, \"cs\": 2, \"pf\": 1}", "lo: wk 2 x cs 2", "a few-row split that is not the shape's chains"},
        {"{\"rows\": 9, \"nt\": 1, \"wn\": 4, \"wk\": 1, \"cs\": 2, \"pf\": 1}", "rows 9", "a few-row setting past 8 rows"},
        {"{\"rows\": 0, \"nt\": 1, \"wn\": 4, \"wk\": 1, \"cs\": 2, \"pf\": 1}", "rows 0", "a few-row setting of no rows"},
        {"{\"rows\": 1, \"nt\": 1, \"wn\": 4, \"wk\": 1, \"cs\": 2}", "\"pf\"", "a few-row setting without its load depth"},
        {"{\"rows\": 1, \"nt\": 1, \"wn\": 8, \"wk\": 2, \"cs\": 1, \"pf\": 1}", "lo: wn 8 x wk 2", "a few-row CTA past 256 threads"},
        {"[2]", "\"lo\" is not an object", "a few-row setting that is not an object"},
    };
    for (size_t i = 0; i < sizeof bad_lo / sizeof bad_lo[0]; i++) {
        snprintf(text, sizeof text, "{%s, \"shapes\": {\"17408,5120\": {\"nt\": 1, \"wn\": 4, \"wk\": 1, \"cs\": 2, \"pf\": 1, "
                 "\"kchains\": 2, \"lo\": %s}}}", hdr, bad_lo[i].lo);
        write_text("fp8.json", text);
        ok(load_fails_naming("fp8.json", bad_lo[i].naming), "%s: %s", bad_lo[i].what, tdm_err());
    }
    remove_table(dir, "fp8.json");
    {   /* the table of 17-32 rows serves no row count a few-row setting could */
        char wide[1024];
        snprintf(wide, sizeof wide, "{\"kernel\": \"nvfp4-skinny-wide\", \"arch\": \"sm_90\", \"device\": \"x\", \"sweep\": \"none\", "
                 "\"shapes\": {\"17408,5120\": {\"nt\": 1, \"wn\": 4, \"wk\": 1, \"cs\": 2, \"pf\": 1, \"kchains\": 2, "
                 "\"lo\": {\"rows\": 1, \"nt\": 1, \"wn\": 2, \"wk\": 2, \"cs\": 1, \"pf\": 1}}}}");
        write_text("nvfp4-skinny-wide.json", wide);
        ok(load_fails_naming("nvfp4-skinny-wide.json", "serves no row count"), "a few-row setting in the 17-32-row table: %s", tdm_err());
        remove_table(dir, "nvfp4-skinny-wide.json");
    }
    snprintf(text, sizeof text, "{%s, \"shapes\": {\"17408,5120\": {\"nt\": 1, \"wn\": 5, \"wk\": 1, \"cs\": 2, \"pf\": 3, \"kchains\": 2, \"us\": 9.5, "
             "\"lo\": {\"rows\": 2, \"nt\": 1, \"wn\": 2, \"wk\": 2, \"cs\": 1, \"pf\": 1, \"us\": 3}}}}", hdr);
    write_text("fp8.json", text);
    ok(tdm_tiles_load(dir, "sm_90", &tl) == 0, "a valid hand-written table loads: %s", tdm_err());
    got = tdm_tiles_get(tl, TDM_MMK_FP8, 17408, 5120);
    ok(got.nt == 1 && got.wn == 5 && got.pf == 3 && got.lo_rows == 2 && got.lo.nt == 1 && got.lo.wn == 2 && got.lo.wk == 2,
       "and its entry is used (5 warps along n; at 1-2 rows 2 warps of 2 chains)");
    ok(tdm_tiles_device(tl, TDM_MMK_FP8) && strcmp(tdm_tiles_device(tl, TDM_MMK_FP8), "x") == 0 &&
           tdm_tiles_device(tl, TDM_MMK_BF16) == NULL && tdm_tiles_device(NULL, TDM_MMK_FP8) == NULL,
       "the card a table was swept on is its header's device; none without a table");
    tdm_tiles_free(tl);

    /* the shipped tables */
    const char *archs[] = {"sm_90", "sm_121"};
    for (int i = 0; i < 2; i++) {
        ok(tdm_tiles_load("tiles", archs[i], &tl) == 0, "the shipped tables tiles/%s load: %s", archs[i], tl ? "ok" : tdm_err());
        tdm_tiles_free(tl);
        tl = NULL;
    }
    remove_table(dir, "fp8.json");
    test_swiglu_forms();
    test_objectives();
    test_json_write(dir);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) printf("# could not remove %s\n", dir);
    return done_testing();
}
