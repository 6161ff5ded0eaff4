/* The matrix kernels on the GPU (skips without a device), per format and shape:
 *   check: the 32-row product (FP32 and BF16 output) against tdm_linear_ref on the CPU, on every
 *     output column when n <= 96, else on 96 columns (both edges and a spread):
 *     |y - ref| <= 1e-4 * sum_k |x w| per element (FP32 output; BF16 output adds 2^-8 |ref|);
 *   twins: for m = 2..32, every row of the m-row call equals the one-row call on that row, bit for
 *     bit, on the whole output, with rows that share inputs; outputs are poisoned before every run
 *     and every element must be written; the tile tables' setting gives the default's bits, and
 *     so does one with a few-row geometry of its own at 1-8 rows (tiles.h: lo);
 *   graph: graph replay equals eager, bit for bit (m = 5 and 32);
 *   wide: 33 and 100 rows (the wide GEMM) against the reference with the same bound;
 *   orders: an NVFP4 or FP8 weight as the upload holds it (tile-major where the build holds the format
 *     so: mm_layout.h) against the same weight in rows, bit for bit, at 1-32 rows with and without x's
 *     blocked copy and in the wide GEMM;
 *   NVFP4 and FP8 at 1-32 rows in each activation form (TANDEM_MM_DIRECT on: NVFP4 loaded per lane
 *     at 1-16 rows; off: staged; per lane from x's blocked copy, mm_layout.h: xb) against the
 *     one-row calls, bit for bit, and tdm_mm_pack_xb against the layout's index on the host;
 *   SwiGLU in one launch (NVFP4; FP8 at 1-16 rows from the blocked copy, the 27B's MLP with the
 *     shipped table and edge shapes with a table written here) = gate, up and SiLU x up bit for bit,
 *     every row its one-row call's; from the blocked copy, writing y's, the copy equal to y packed.
 * And the programmatic launches (kernels/pdl.cuh, TANDEM_PDL): a chain of norm -> product pairs
 * through one reused activation buffer, each product launched while its norm may still run, gives
 * the plain launches' bits, eager and from a graph (a product that read its input before the norm
 * had finished would read the previous pair's activations).
 * Shapes: every projection shape of Qwen3.8-27B and Qwen3-Next-80B-A3B (src/common/shapes.c), the
 * engine's one product of qwen3_5's in_proj_b and in_proj_a (the 27B's 96x5120), edge shapes and
 * the tiny fixtures' shapes (12x256: qwen35-tiny's in_proj_b and in_proj_a as one). */
#include "device.h"
#include "engine_glue.h"
#include "err.h"
#include "layers.h"
#include "formats.h"
#include "linear.h"
#include "matmul.h"
#include "mm_layout.h"
#include "shapes.h"
#include "tap.h"
#include "tiles.h"
#include "tiletest.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x853c49e6748fea9bull;
static uint64_t next(void)
{
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return rng;
}
static float frand(void) { return (float)((next() >> 40) & 0xffffff) / 8388608.0f - 1.0f; }

static struct tdm_tiles *tiles;
static tdm_stream st;
static int fp8_nt2_cases;   /* FP8 shapes whose nt 2 setting ran (run_case) */

struct hweight {
    struct tdm_qweight q;
    void *w, *scale;
};

/* Random codes straight into the stored format (quantizing floats would be slow at these sizes). */
static void make_weight(struct hweight *h, enum tdm_wfmt fmt, int64_t rows, int64_t k, enum tdm_dtype sdt)
{
    memset(h, 0, sizeof *h);
    h->q.fmt = fmt;
    h->q.n = rows;
    h->q.k = k;
    h->q.scale_dt = sdt;
    size_t wb = fmt == TDM_W_NVFP4 ? rows * k / 2 : fmt == TDM_W_FP8 ? rows * k : rows * k * 2;
    h->w = malloc(wb);
    uint8_t *b = h->w;
    if (fmt == TDM_W_BF16) {
        uint16_t *p = h->w;
        for (int64_t i = 0; i < rows * k; i++) p[i] = tdm_f32_to_bf16(frand() * 0.05f);
    } else {
        for (size_t i = 0; i < wb; i += 8) {
            uint64_t r = next();
            for (int j = 0; j < 8 && i + j < wb; j++) b[i + j] = (uint8_t)(r >> (8 * j));
        }
        if (fmt == TDM_W_FP8)
            for (size_t i = 0; i < wb; i++) if ((b[i] & 0x7f) == 0x7f) b[i] ^= 0x08; /* no NaN codes */
    }
    if (fmt == TDM_W_NVFP4) {
        int64_t nsc = rows * k / 16;
        uint8_t *s = malloc(nsc);
        for (int64_t i = 0; i < nsc; i++) s[i] = (uint8_t)(0x18 + next() % 0x40); /* 2^-4 .. 2^4, some subnormal-free */
        h->scale = s;
        h->q.scale2 = 0.0123f;
    } else if (fmt == TDM_W_FP8) {
        int64_t nsc = ((rows + 127) / 128) * ((k + 127) / 128);
        if (sdt == TDM_DT_BF16) {
            uint16_t *s = malloc(nsc * 2);
            for (int64_t i = 0; i < nsc; i++) s[i] = tdm_f32_to_bf16(0.001f + 0.01f * (frand() + 1));
            h->scale = s;
        } else {
            float *s = malloc(nsc * 4);
            for (int64_t i = 0; i < nsc; i++) s[i] = 0.001f + 0.01f * (frand() + 1);
            h->scale = s;
        }
    }
    h->q.w = h->w;
    h->q.scale = h->scale;
}

/* Host BF16 activations [rows][k]: rows 9 and 21 repeat row 0, row 30 repeats row 3. */
static void make_x(uint16_t *x, float *xf, int rows, int64_t k)
{
    for (int64_t i = 0; i < rows * k; i++) x[i] = tdm_f32_to_bf16(frand() * 2.0f);
    const int same[3][2] = {{9, 0}, {21, 0}, {30, 3}};
    for (int i = 0; i < 3; i++)
        if (same[i][0] < rows) memcpy(x + same[i][0] * k, x + same[i][1] * k, k * 2);
    for (int64_t i = 0; i < rows * k; i++) xf[i] = tdm_bf16_to_f32(x[i]);
}

/* Checks y (FP32 or BF16, [m][n]) against the reference on the columns `cols`. */
static int check_ref(const struct tdm_qweight *view, const float *xf, int m, const void *y, int is_f32, const int64_t *cols,
                     int ncols, double *worst_out)
{
    const int64_t n = view->n, k = view->k;
    float *row = malloc(sizeof *row * k);
    double worst = 0;
    int bad = 0;
    for (int c = 0; c < ncols; c++) {
        tdm_qweight_row(view, cols[c], row);
        for (int r = 0; r < m; r++) {
            const float *xr = xf + r * k;
            float ref = tdm_dot(xr, row, k);
            double mag = 0;
            for (int64_t i = 0; i < k; i++) mag += fabs((double)xr[i] * row[i]);
            double got = is_f32 ? ((const float *)y)[r * n + cols[c]] : tdm_bf16_to_f32(((const uint16_t *)y)[r * n + cols[c]]);
            double tol = 1e-4 * mag + (is_f32 ? 0 : ldexp(fabs(ref), -8)) + 1e-30;
            double e = fabs(got - ref) / (mag + 1e-30);
            if (!(fabs(got - ref) <= tol)) bad++;
            if (!(e <= worst)) worst = e;
        }
    }
    free(row);
    *worst_out = worst;
    return bad;
}

/* rows x k random activations (make_x: BF16 hx and their floats xf, both malloc'd) and their device
 * copy dx; 0, or -1 with tdm_err set. */
static int make_dx(int rows, int64_t k, uint16_t **hx, float **xf, uint16_t **dx)
{
    *hx = malloc(sizeof **hx * rows * k);
    *xf = malloc(sizeof **xf * rows * k);
    if (!*hx || !*xf) return tdm_errf("out of memory");
    make_x(*hx, *xf, rows, k);
    return tdm_cuda_malloc((void **)dx, sizeof **hx * rows * k) || tdm_cuda_h2d(*dx, *hx, sizeof **hx * rows * k) ? -1 : 0;
}

/* A few-row geometry for setting t of kernel kk on (n, k) that differs from t's own (another nt,
 * warps, split of the chains over warps and CTAs, or load depth) and is valid at 1-8 rows; its nt
 * is 0 when none is. */
static struct tdm_tile_geom other_geom(enum tdm_mmk kk, int64_t n, int64_t k, const struct tdm_tile *t)
{
    const int c = t->kchains;
    const int wk = c % 2 == 0 && t->wk == 1 ? 2 : 1;
    const struct tdm_tile_geom tries[] = {
        {t->nt == 2 ? 1 : 2, 2, wk, c / wk, t->pf == 1 ? 3 : 1},
        {t->nt == 2 ? 1 : 2, 2, wk, c / wk, t->pf},
        {t->nt, t->wn == 2 ? 3 : 2, wk, c / wk, t->pf},
    };
    for (size_t i = 0; i < sizeof tries / sizeof tries[0]; i++) {
        struct tdm_tile x = *t;
        x.lo_rows = TDM_TILE_LO_ROWS_MAX;
        x.lo = tries[i];
        if (tdm_tile_check(kk, n, k, &x) == 0) return tries[i];
    }
    return (struct tdm_tile_geom){0, 0, 0, 0, 0};
}

/* NVFP4 or FP8 at m = m0..m1 rows with the tables (t NULL) or the setting t, staged
 * (TANDEM_MM_DIRECT=off), on without the copy (NVFP4: per lane at 1-16 rows, staged at 17-32; FP8:
 * staged) and per lane from x's blocked copy (tdm_mm_pack_xb; the
 * copy's own poisoned elements past m rows are never read): in bad[0..2] the rows that differ from
 * the one-row calls' outputs y1 (FP32, n a row). Nonzero when a call fails. */
static int forms_vs_one_row(const struct tdm_dweight *d, const uint16_t *dx, int64_t k, int64_t n,
                            const struct tdm_tile *t, int m0, int m1, const float *y1, float *ym, void *dy, int bad[3])
{
    uint16_t *dxb = NULL;
    const size_t xbb = (size_t)tdm_mm_xb_elems(k) * 2;
    int rc = tdm_cuda_malloc((void **)&dxb, xbb + 16);
    for (int f = 0; f < 3 && !rc; f++)
        for (int m = m0; m <= m1 && !rc; m++) {
            const uint16_t *xb = f == 2 && xbb ? dxb : NULL;
            if (xb) rc = tdm_dev_fill_bytes(dxb, xbb, 7 + m, 0xff, 0, st) || tdm_mm_pack_xb(dx, k, m, k, dxb, st);
            tdm_mm_set_direct(f ? TDM_MM_DIRECT_ON : TDM_MM_DIRECT_OFF);
            rc = rc || tdm_dev_fill_bytes(dy, (size_t)m * n * 4, 0, 0, 0xff, st) ||
                 (t ? tdm_matmul_skinny_xb(d, dx, k, xb, m, dy, n, TDM_MM_F32, t, st)
                    : tdm_matmul_xb(d, dx, k, xb, m, dy, n, TDM_MM_F32, tiles, st)) ||
                 tdm_stream_sync(st) || tdm_cuda_d2h(ym, dy, (size_t)m * n * 4);
            tdm_mm_set_direct(-1);
            for (int r = 0; r < m && !rc; r++)
                if (memcmp(ym + r * n, y1 + r * n, (size_t)n * 4) != 0) bad[f]++;
        }
    tdm_cuda_free(dxb);
    return rc;
}

/* tdm_mm_pack_xb against the layout's index on the host (mm_layout.h: xb): m rows of hx [][k].
 * Returns the elements that differ, or -1 when a call fails. */
static int64_t pack_vs_host(const uint16_t *hx, const uint16_t *dx, int64_t k, int m)
{
    const int64_t ne = tdm_mm_xb_elems(k), kf = k / TDM_MM_SLAB_K * TDM_MM_SLAB_K;
    if (ne == 0) return 0;
    uint16_t *want = calloc((size_t)ne, 2), *got = malloc((size_t)ne * 2), *dxb = NULL;
    for (int r = 0; r < m; r++)
        for (int64_t c = 0; c < kf; c++) want[tdm_mm_xb_index(r, c)] = hx[r * k + c];
    int64_t diff = -1;
    if (tdm_cuda_malloc((void **)&dxb, (size_t)ne * 2) == 0 && tdm_dev_fill_bytes(dxb, (size_t)ne * 2, 0, 0, 0, st) == 0 &&
        tdm_mm_pack_xb(dx, k, m, k, dxb, st) == 0 && tdm_stream_sync(st) == 0 && tdm_cuda_d2h(got, dxb, (size_t)ne * 2) == 0) {
        diff = 0;
        for (int64_t i = 0; i < ne; i++) diff += want[i] != got[i];
    }
    tdm_cuda_free(dxb);
    free(want);
    free(got);
    return diff;
}

static void run_case(const char *label, enum tdm_wfmt fmt, enum tdm_dtype sdt, int64_t rows, int64_t k, int64_t row0, int64_t n)
{
    struct hweight h;
    make_weight(&h, fmt, rows, k, sdt);
    struct tdm_qweight hv = tdm_qweight_rows(&h.q, row0, n);
    struct tdm_dweight d;
    if (tdm_dweight_upload(&hv, &d) != 0) {
        ok(0, "%s: upload: %s", label, tdm_err());
        return;
    }
    const int XR = 100;
    uint16_t *hx, *dx;
    float *xf;
    void *dy, *dy2;
    const size_t ybytes = (size_t)XR * n * 4;
    if (make_dx(XR, k, &hx, &xf, &dx) != 0 || tdm_cuda_malloc(&dy, ybytes) || tdm_cuda_malloc(&dy2, ybytes)) {
        ok(0, "%s: device memory: %s", label, tdm_err());
        return;
    }
    float *y = malloc(ybytes), *y1 = malloc((size_t)32 * n * 4), *ym = malloc((size_t)32 * n * 4);
    /* the reference's columns: all for small shapes, else both edges and a spread */
    int64_t *cols = malloc(sizeof *cols * 96);
    int ncols = 0;
    if (n <= 96) {
        for (int64_t c = 0; c < n; c++) cols[ncols++] = c;
    } else {
        for (int i = 0; i < 8; i++) cols[ncols++] = i;
        for (int i = 0; i < 8; i++) cols[ncols++] = n - 8 + i;
        for (int i = 0; i < 80; i++) cols[ncols++] = 8 + (n - 16) * i / 80;
    }
    int rc = 0;

    /* check: 32 rows, FP32 and BF16 outputs */
    for (int f32 = 1; f32 >= 0; f32--) {
        rc = tdm_dev_fill_bytes(dy, ybytes, 0, 0, 0xff, st) || tdm_matmul(&d, dx, k, 32, dy, n, f32 ? TDM_MM_F32 : TDM_MM_BF16, tiles, st) ||
             tdm_stream_sync(st) || tdm_cuda_d2h(y, dy, (size_t)32 * n * (f32 ? 4 : 2));
        double worst = 0;
        int bad = rc ? -1 : check_ref(&hv, xf, 32, y, f32, cols, ncols, &worst);
        ok(bad == 0, "%s: check, 32 rows, %s output: %d of %d outside the bound, worst %.2e of sum|xw|%s%s", label,
           f32 ? "FP32" : "BF16", bad, 32 * ncols, worst, rc ? ": " : "", rc ? tdm_err() : "");
    }

    /* twins: one-row calls, then m = 2..32 against them, whole outputs, FP32 */
    int twin_bad = 0, unwritten = 0, table_bad = 0, lo_bad = 0, lo_runs = 0;
    rc = 0;
    for (int r = 0; r < 32 && !rc; r++) {
        rc = tdm_dev_fill_bytes(dy, (size_t)n * 4, 0, 0, 0xff, st) || tdm_matmul(&d, dx + r * k, k, 1, dy, n, TDM_MM_F32, tiles, st) ||
             tdm_stream_sync(st) || tdm_cuda_d2h(y1 + r * n, dy, (size_t)n * 4);
    }
    {   /* a few-row geometry at one row (below, 2-8 rows) against the table's one-row call */
        const enum tdm_mmk kk1 = (enum tdm_mmk)tdm_mmk_for(fmt, 1);
        struct tdm_tile t1 = tdm_tile_default(kk1, n, k);
        t1.lo_rows = TDM_TILE_LO_ROWS_MAX;
        t1.lo = other_geom(kk1, n, k, &t1);
        if (!rc && t1.lo.nt) {
            lo_runs++;
            rc = tdm_dev_fill_bytes(dy2, (size_t)n * 4, 0, 0, 0xff, st) || tdm_matmul_skinny(&d, dx, k, 1, dy2, n, TDM_MM_F32, &t1, st) ||
                 tdm_stream_sync(st) || tdm_cuda_d2h(ym, dy2, (size_t)n * 4);
            if (!rc && memcmp(ym, y1, (size_t)n * 4) != 0) lo_bad++;
        }
    }
    for (int m = 2; m <= 32 && !rc; m++) {
        rc = tdm_dev_fill_bytes(dy, (size_t)m * n * 4, 0, 0, 0xff, st) || tdm_matmul(&d, dx, k, m, dy, n, TDM_MM_F32, tiles, st) ||
             tdm_stream_sync(st) || tdm_cuda_d2h(ym, dy, (size_t)m * n * 4);
        for (int r = 0; r < m && !rc; r++) {
            if (memcmp(ym + r * n, y1 + r * n, (size_t)n * 4) != 0) twin_bad++;
            for (int64_t c = 0; c < n; c++) if (isnan(ym[r * n + c])) unwritten++;
        }
        /* the default setting must give the table's bits */
        struct tdm_tile t = tdm_tile_default((enum tdm_mmk)tdm_mmk_for(fmt, m), n, k);
        rc = rc || tdm_dev_fill_bytes(dy2, (size_t)m * n * 4, 0, 0, 0xff, st) || tdm_matmul_skinny(&d, dx, k, m, dy2, n, TDM_MM_F32, &t, st);
        int64_t diff = 0;
        rc = rc || tdm_dev_count_diff(dy, dy2, (size_t)m * n * 4, &diff, st);
        if (diff) table_bad++;
        /* a few-row geometry of its own at 1-8 rows (the table's lo) only spreads the work: the same bits */
        struct tdm_tile tl = t;
        tl.lo_rows = TDM_TILE_LO_ROWS_MAX;
        tl.lo = other_geom((enum tdm_mmk)tdm_mmk_for(fmt, m), n, k, &t);
        if (m <= TDM_TILE_LO_ROWS_MAX && tl.lo.nt) {
            lo_runs++;
            rc = rc || tdm_dev_fill_bytes(dy2, (size_t)m * n * 4, 0, 0, 0xff, st) || tdm_matmul_skinny(&d, dx, k, m, dy2, n, TDM_MM_F32, &tl, st);
            diff = 0;
            rc = rc || tdm_dev_count_diff(dy, dy2, (size_t)m * n * 4, &diff, st);
            if (diff) lo_bad++;
        }
    }
    ok(!rc && lo_bad == 0 && lo_runs > 0, "%s: a setting with a few-row geometry of its own (lo, at 1-8 rows) gives the table's "
       "bits (%d of %d row counts differ)", label, lo_bad, lo_runs);
    ok(!rc && twin_bad == 0 && unwritten == 0, "%s: twins, m = 2..32 rows equal one-row calls bit for bit (%d rows differ, "
       "%d outputs unwritten)%s%s", label, twin_bad, unwritten, rc ? ": " : "", rc ? tdm_err() : "");
    /* NVFP4 and FP8, each form at every row count 1..32 (TANDEM_MM_DIRECT on: NVFP4's activations
     * loaded per lane at 1-16 rows; off: staged; and per lane from the blocked copy; the one-row calls
     * above ran the default, auto, without a copy: NVFP4 per lane, FP8 staged): every row its one-row
     * call's bits */
    if (tdm_mm_fmt_reads_xb(fmt)) {
        int direct_bad[3] = {0, 0, 0};
        rc = rc || forms_vs_one_row(&d, dx, k, n, NULL, 1, 32, y1, ym, dy2, direct_bad);
        ok(!rc && direct_bad[0] == 0 && direct_bad[1] == 0 && direct_bad[2] == 0, "%s: m = 1..32 staged "
           "(TANDEM_MM_DIRECT=off), on without the copy (NVFP4 per lane to 16 rows, else staged) and per lane from the "
           "blocked copy: every row equals the one-row call bit for bit (%d, %d, %d rows differ)%s%s", label, direct_bad[0],
           direct_bad[1], direct_bad[2], rc ? ": " : "", rc ? tdm_err() : "");
    }
    if (fmt == TDM_W_FP8) {
        /* FP8 nt 2 (mm_layout.h: TDM_MM_FORM_NT): the weights as the mma's A operand per lane from the
         * blocked copy at 1-16 rows, nt 1 over twice the warps elsewhere: every row at 1..32 rows its
         * one-row call's bits (the table's nt 1), where the setting is valid for the shape */
        struct tdm_tile t2 = tdm_tile_default(TDM_MMK_FP8, n, k);
        t2.nt = 2;
        t2.wn = t2.wk >= 4 ? 1 : 2;
        if (t2.wk > 4) {   /* at most 8 warps as nt 1: 2 wn wk */
            t2.wk = 4;
            t2.cs = t2.kchains / 4;
        }
        t2.pf = 1;
        t2.lo_rows = 0;
        if (!rc && tdm_tile_check(TDM_MMK_FP8, n, k, &t2) == 0) {
            int nt2_bad[3] = {0, 0, 0};
            fp8_nt2_cases++;
            rc = forms_vs_one_row(&d, dx, k, n, &t2, 1, 32, y1, ym, dy2, nt2_bad);
            ok(!rc && nt2_bad[0] == 0 && nt2_bad[1] == 0 && nt2_bad[2] == 0, "%s: nt 2 (wn %d wk %d) at m = 1..32, staged, "
               "on without the copy and per lane from the blocked copy: every row equals the one-row call bit for bit (%d, "
               "%d, %d rows differ)%s%s", label, t2.wn, t2.wk, nt2_bad[0], nt2_bad[1], nt2_bad[2], rc ? ": " : "",
               rc ? tdm_err() : "");
        }
    }
    if (fmt == TDM_W_NVFP4) {
        const int64_t pk = rc ? -1 : pack_vs_host(hx, dx, k, TDM_MM_XB_ROWS);
        ok(pk == 0, "%s: tdm_mm_pack_xb of 32 rows = the layout's index on the host (%lld elements differ)", label,
           (long long)pk);
        /* four n8-tiles a warp (nt 4, built for tandem-sweep to time; per lane at most 8 rows, staged
         * at 9-16, TDM_MM_DIRECT): every row at 1..16 rows its one-row call's bits, where the setting
         * is valid for the shape */
        struct tdm_tile t4 = tdm_tile_default(TDM_MMK_NVFP4, n, k);
        t4.nt = 4;
        t4.wn = 2;
        t4.pf = 1;
        if (!rc && tdm_tile_check(TDM_MMK_NVFP4, n, k, &t4) == 0) {
            int nt4_bad[3] = {0, 0, 0};
            rc = forms_vs_one_row(&d, dx, k, n, &t4, 1, 16, y1, ym, dy2, nt4_bad);
            ok(!rc && nt4_bad[0] == 0 && nt4_bad[1] == 0 && nt4_bad[2] == 0, "%s: nt 4 (four n8-tiles a warp, wn 2) at m = "
               "1..16, staged, per lane and from the blocked copy: every row equals the one-row call bit for bit (%d, %d, %d "
               "rows differ)%s%s", label, nt4_bad[0], nt4_bad[1], nt4_bad[2], rc ? ": " : "", rc ? tdm_err() : "");
        }
        /* four chains a CTA at 17-32 rows (wk 4): per lane from the blocked copy as set, staged with the
         * chains split over the cluster (tiles.h: tdm_tile_staged_fit); where the shape's chains allow */
        struct tdm_tile tw = tdm_tile_default(TDM_MMK_NVFP4_WIDE, n, k);
        tw.nt = 2;
        tw.wn = 2;
        tw.wk = 4;
        tw.cs = tw.kchains / 4;
        tw.pf = 1;
        if (!rc && tw.kchains % 4 == 0 && tdm_tile_check(TDM_MMK_NVFP4_WIDE, n, k, &tw) == 0) {
            int wk4_bad[3] = {0, 0, 0};
            rc = forms_vs_one_row(&d, dx, k, n, &tw, 17, 32, y1, ym, dy2, wk4_bad);
            ok(!rc && wk4_bad[0] == 0 && wk4_bad[1] == 0 && wk4_bad[2] == 0, "%s: wk 4 cs %d at m = 17..32, staged (its "
               "chains over the cluster) and per lane from the blocked copy (as set): every row equals the one-row call bit "
               "for bit (%d, %d, %d rows differ)%s%s", label, tw.cs, wk4_bad[0], wk4_bad[1], wk4_bad[2], rc ? ": " : "",
               rc ? tdm_err() : "");
        }
    }
    ok(!rc && table_bad == 0, "%s: the tile tables' setting gives the default setting's bits (%d row counts differ)", label, table_bad);

    /* graph replay against eager */
    int graph_bad = 0;
    for (int mi = 0; mi < 2 && !rc; mi++) {
        const int m = mi ? 32 : 5;
        tdm_graph g = NULL;
        rc = tdm_dev_fill_bytes(dy, (size_t)m * n * 4, 0, 0, 0xff, st) || tdm_matmul(&d, dx, k, m, dy, n, TDM_MM_BF16, tiles, st) ||
             tdm_stream_sync(st) || tdm_dev_fill_bytes(dy2, (size_t)m * n * 4, 0, 0, 0xff, st) || tdm_graph_begin(st) ||
             tdm_matmul(&d, dx, k, m, dy2, n, TDM_MM_BF16, tiles, st) || tdm_graph_end(st, &g) || tdm_graph_launch(g, st) ||
             tdm_graph_launch(g, st) || tdm_stream_sync(st);
        int64_t diff = 0;
        rc = rc || tdm_dev_count_diff(dy, dy2, (size_t)m * n * 2, &diff, st);
        if (diff) graph_bad++;
        tdm_graph_destroy(g);
    }
    ok(!rc && graph_bad == 0, "%s: graph replay equals eager bit for bit (m = 5, 32)%s%s", label, rc ? ": " : "",
       rc ? tdm_err() : "");

    /* the wide GEMM */
    for (int mi = 0; mi < 2; mi++) {
        const int m = mi ? 100 : 33;
        rc = tdm_dev_fill_bytes(dy, (size_t)m * n * 4, 0, 0, 0xff, st) || tdm_matmul(&d, dx, k, m, dy, n, TDM_MM_F32, tiles, st) ||
             tdm_stream_sync(st) || tdm_cuda_d2h(y, dy, (size_t)m * n * 4);
        double worst = 0;
        int bad = rc ? -1 : check_ref(&hv, xf, m, y, 1, cols, ncols, &worst);
        ok(bad == 0, "%s: wide GEMM, %d rows: %d outside the bound, worst %.2e%s%s", label, m, bad, worst, rc ? ": " : "",
           rc ? tdm_err() : "");
    }
    tdm_cuda_free(dx);
    tdm_cuda_free(dy);
    tdm_cuda_free(dy2);
    tdm_dweight_free(&d);
    free(hx);
    free(xf);
    free(y);
    free(y1);
    free(ym);
    free(cols);
    free(h.w);
    free(h.scale);
}


/* A SwiGLU's gate and up weights of one shape and format on the device (up with its own NVFP4 global
 * scale; the host copies freed); 0, or -1 after a failed test line naming label. */
static int make_gate_up(const char *label, enum tdm_wfmt fmt, int64_t n, int64_t k, struct tdm_dweight *g,
                        struct tdm_dweight *u)
{
    struct hweight hg, hu;
    make_weight(&hg, fmt, n, k, TDM_DT_F32);
    make_weight(&hu, fmt, n, k, TDM_DT_F32);
    hu.q.scale2 = 0.0321f;
    const int up = tdm_dweight_upload(&hg.q, g) == 0 && tdm_dweight_upload(&hu.q, u) == 0;
    free(hg.w); free(hg.scale); free(hu.w); free(hu.scale);
    if (!up) {
        ok(0, "%s: upload: %s", label, tdm_err());
        return -1;
    }
    return 0;
}

/* SwiGLU in one product (tdm_matmul_swiglu) against tdm_matmul of gate and of up, then
 * tdm_silu_mul, bit for bit, at every row count 1..32 the tables tl let it run (nt 2 settings), with
 * rows that share inputs; and each row against its one-row call (the twin). n not a multiple of a
 * CTA's outputs exercises the last CTA's guard. FP8 runs as one product only from x's blocked copy
 * (1-16 rows), so with from_xb every SwiGLU call reads the copy of its own rows (the references never
 * do); else the first calls read x and a second pass the copy, writing y's. Counts the row counts
 * it ran at: at least want (NVFP4 with the shipped sm_90 tables: every one for the 27B's 17408x5120;
 * FP8 1-16). */
static void run_swiglu(const char *label, enum tdm_wfmt fmt, int64_t n, int64_t k, const struct tdm_tiles *tl, int from_xb,
                       int want)
{
    struct tdm_dweight g, u;
    if (make_gate_up(label, fmt, n, k, &g, &u) != 0) return;
    const int R = 32;
    uint16_t *hx, *dx;
    float *xf;
    uint16_t *dg, *du, *dref, *dglu;
    const size_t yb = (size_t)R * n * 2;
    if (make_dx(R, k, &hx, &xf, &dx) != 0 || tdm_cuda_malloc((void **)&dg, yb) || tdm_cuda_malloc((void **)&du, yb) ||
        tdm_cuda_malloc((void **)&dref, yb) || tdm_cuda_malloc((void **)&dglu, yb)) {
        ok(0, "%s: device memory: %s", label, tdm_err());
        return;
    }
    uint16_t *ref = malloc(yb), *glu = malloc(yb), *one = malloc((size_t)n * 2);
    int ran = 0, same = 0, twins = 0, fails = 0, xb_ran = 0, xb_same = 0;
    /* x's blocked copy (dxb: of the call's rows; dxb1: of one row), y's (dyb) and y packed (dyb2) */
    uint16_t *dxb = NULL, *dxb1 = NULL, *dyb = NULL, *dyb2 = NULL;
    const size_t xbb = (size_t)tdm_mm_xb_elems(k) * 2, ybb = (size_t)tdm_mm_xb_elems(n) * 2;
    if (tdm_cuda_malloc((void **)&dxb, xbb + 16) || tdm_cuda_malloc((void **)&dxb1, xbb + 16) ||
        tdm_cuda_malloc((void **)&dyb, ybb + 16) || tdm_cuda_malloc((void **)&dyb2, ybb + 16)) {
        ok(0, "%s: device memory: %s", label, tdm_err());
        return;
    }
    for (int m = 1; m <= R; m++) {
        const uint16_t *xb = NULL;   /* what the first SwiGLU calls read beside x */
        if (from_xb) {
            if (!xbb || tdm_mm_pack_xb(dx, k, m, k, dxb, st) != 0) {
                fails++;
                printf("# %s m=%d: x's blocked copy: %s\n", label, m, xbb ? tdm_err() : "k has no full slab");
                continue;
            }
            xb = dxb;
        }
        if (!tdm_matmul_swiglu_ok(&g, &u, dx, k, xb, m, tl)) continue;
        ran++;
        if (tdm_dev_fill_bytes(dglu, yb, 99 + m, 0xff, 0, st) != 0 ||
            tdm_matmul(&g, dx, k, m, dg, n, TDM_MM_BF16, tl, st) || tdm_matmul(&u, dx, k, m, du, n, TDM_MM_BF16, tl, st) ||
            tdm_silu_mul(dg, du, n, m, dref, NULL, st) || tdm_matmul_swiglu(&g, &u, dx, k, xb, m, dglu, n, NULL, tl, st) ||
            tdm_stream_sync(st) || tdm_cuda_d2h(ref, dref, (size_t)m * n * 2) || tdm_cuda_d2h(glu, dglu, (size_t)m * n * 2)) {
            fails++;
            printf("# %s m=%d: %s\n", label, m, tdm_err());
            continue;
        }
        same += memcmp(ref, glu, (size_t)m * n * 2) == 0;
        int rows_ok = 1;   /* each row against its own one-row call (from the copy of that row alone) */
        for (int r = 0; r < m && rows_ok; r++) {
            const uint16_t *xr = dx + r * k, *xb1 = from_xb ? dxb1 : NULL;
            rows_ok = (!xb1 || tdm_mm_pack_xb(xr, k, 1, k, dxb1, st) == 0) && tdm_matmul_swiglu_ok(&g, &u, xr, k, xb1, 1, tl) &&
                      tdm_matmul_swiglu(&g, &u, xr, k, xb1, 1, dglu, n, NULL, tl, st) == 0 && tdm_stream_sync(st) == 0 &&
                      tdm_cuda_d2h(one, dglu, (size_t)n * 2) == 0 && memcmp(one, glu + (size_t)r * n, (size_t)n * 2) == 0;
        }
        twins += rows_ok;
        if (m <= TDM_MM_XB_ROWS && xbb) {   /* from x's blocked copy, writing y's */
            xb_ran++;
            int64_t d1 = -1, d2 = -1;
            if (tdm_mm_pack_xb(dx, k, m, k, dxb, st) == 0 && tdm_dev_fill_bytes(dyb, ybb, 0, 0, 0, st) == 0 &&
                tdm_dev_fill_bytes(dyb2, ybb, 0, 0, 0, st) == 0 && tdm_dev_fill_bytes(dglu, yb, 7 + m, 0xff, 0, st) == 0 &&
                tdm_matmul_swiglu(&g, &u, dx, k, dxb, m, dglu, n, ybb ? dyb : NULL, tl, st) == 0 &&
                tdm_dev_count_diff(dglu, dref, (size_t)m * n * 2, &d1, st) == 0 &&
                (!ybb || (tdm_mm_pack_xb(dglu, n, m, n, dyb2, st) == 0 && tdm_dev_count_diff(dyb, dyb2, ybb, &d2, st) == 0)))
                xb_same += d1 == 0 && (!ybb || d2 == 0);
            else
                printf("# %s m=%d (blocked copies): %s\n", label, m, tdm_err());
        }
    }
    ok(xb_same == xb_ran && (xb_ran > 0 || !want), "%s: from x's blocked copy, writing y's: y = gate, up, tdm_silu_mul bit for "
       "bit and the copy = y packed, at %d of %d row counts run", label, xb_same, xb_ran);
    tdm_cuda_free(dxb); tdm_cuda_free(dxb1); tdm_cuda_free(dyb); tdm_cuda_free(dyb2);
    ok(fails == 0 && same == ran, "%s: one SwiGLU product = gate, up, tdm_silu_mul bit for bit at %d of %d row counts run",
       label, same, ran);
    ok(twins == ran, "%s: every row = its one-row SwiGLU call at %d of %d row counts", label, twins, ran);
    ok(ran >= (want ? want : 1), "%s: ran as one product at %d of 1..%d rows (at least %d expected)", label, ran, R,
       want ? want : 1);
    /* refused where it cannot run: shapes that differ */
    struct tdm_dweight half = tdm_dweight_rows(&u, 0, n / 2);
    ok(!tdm_matmul_swiglu_ok(&g, &half, dx, k, NULL, 1, tl) && tdm_matmul_swiglu(&g, &half, dx, k, NULL, 1, dglu, n, NULL, tl, st) != 0,
       "%s: gate and up of different shapes refused: %s", label, tdm_err());
    tdm_dweight_free(&g);
    tdm_dweight_free(&u);
    tdm_cuda_free(dx); tdm_cuda_free(dg); tdm_cuda_free(du); tdm_cuda_free(dref); tdm_cuda_free(dglu);
    free(hx); free(xf); free(ref); free(glu); free(one);
}

/* Whether this build holds weights of format fmt tile-major where they fit (mm_layout.h:
 * TDM_MM_NVFP4_TILES, TDM_MM_FP8_TILES). */
static int build_holds_tiles(enum tdm_wfmt fmt)
{
    return tdm_dweight_order_for(fmt, TDM_MM_TILE_ROWS, TDM_MM_SLAB_K) == TDM_MM_ORDER_TILES;
}

/* Gate and up weights of format fmt that cannot be held tile-major (n not a multiple of 16, or k not
 * whole slabs): in a build that holds the format tile-major (build_holds_tiles) they take the checked
 * path, which has no SwiGLU form, so at every row count the one-product form is refused under the
 * tables tl, from x's blocked copy where from_xb (tdm_matmul_swiglu_ok 0, tdm_matmul_swiglu an error,
 * not a failed launch) and the MLP's form is another. */
static void swiglu_refused(const char *label, enum tdm_wfmt fmt, int64_t n, int64_t k, const struct tdm_tiles *tl,
                           int from_xb)
{
    struct tdm_dweight g, u;
    if (make_gate_up(label, fmt, n, k, &g, &u) != 0) return;
    uint16_t *hx, *dx, *dy = NULL, *dxb = NULL;
    float *xf;
    const size_t xbb = (size_t)tdm_mm_xb_elems(k) * 2;
    int refused = 0, rc = make_dx(32, k, &hx, &xf, &dx) || tdm_cuda_malloc((void **)&dy, (size_t)32 * n * 2) ||
                          (from_xb && tdm_cuda_malloc((void **)&dxb, xbb + 16));
    for (int m = 1; m <= 32 && !rc; m++) {
        const uint16_t *xb = from_xb && xbb && m <= TDM_MM_XB_ROWS ? dxb : NULL;
        if (xb && tdm_mm_pack_xb(dx, k, m, k, dxb, st) != 0) break;
        refused += !tdm_matmul_swiglu_ok(&g, &u, dx, k, xb, m, tl) &&
                   tdm_matmul_swiglu(&g, &u, dx, k, xb, m, dy, n, NULL, tl, st) != 0 && strstr(tdm_err(), "cannot run as one") &&
                   tdm_matmul_swiglu_form(TDM_MLP_FUSE_AUTO, &g, &u, dx, k, xb, m, tl) != TDM_SWIGLU_ONE;
    }
    ok(!rc && refused == 32, "%s: the one-product form refused at %d of 32 row counts (%s)", label, refused, rc ? tdm_err() : "-");
    tdm_dweight_free(&g);
    tdm_dweight_free(&u);
    tdm_cuda_free(dx);
    tdm_cuda_free(dy);
    tdm_cuda_free(dxb);
    free(hx);
    free(xf);
}

/* Programmatic launches: PAIRS pairs of (add_rmsnorm of residual rows h_p into the one buffer xn,
 * then the product of xn into y_p) on one stream with no sync between, with TANDEM_PDL on (eager
 * and from a graph) and off; every y_p bit for bit the same. The residuals differ pair to pair, so a
 * product that read xn before its norm had finished would show. */
static void run_pdl_chain(const char *label, enum tdm_wfmt fmt, int64_t n, int64_t k, int m)
{
    enum { PAIRS = 6 };
    struct hweight h;
    make_weight(&h, fmt, n, k, TDM_DT_F32);
    struct tdm_dweight d;
    if (tdm_dweight_upload(&h.q, &d) != 0) {
        ok(0, "%s: upload: %s", label, tdm_err());
        return;
    }
    uint16_t *hx = NULL, *dh = NULL, *dxn = NULL;
    float *xf = NULL, *w = malloc(sizeof *w * k), *dw = NULL;
    void *dy = NULL;
    const size_t ybytes = (size_t)m * n * 2;
    int rc = make_dx(PAIRS * m, k, &hx, &xf, &dh);   /* the PAIRS residuals */
    for (int64_t i = 0; i < k; i++) w[i] = 0.25f * frand();
    rc = rc || tdm_cuda_malloc((void **)&dxn, sizeof *hx * m * k) || tdm_cuda_malloc((void **)&dw, sizeof *w * k) ||
         tdm_cuda_malloc(&dy, 3 * PAIRS * ybytes) || tdm_cuda_h2d(dw, w, sizeof *w * k);
    /* run 0: plain launches; 1: programmatic, eager; 2: programmatic, a graph replayed twice (the
     * norm without y only reads h, so a replay sees the same inputs) */
    for (int run = 0; run < 3 && !rc; run++) {
        tdm_cuda_set_pdl(run > 0);
        char *y = (char *)dy + (size_t)run * PAIRS * ybytes;
        tdm_graph g = NULL;
        rc = tdm_dev_fill_bytes(y, PAIRS * ybytes, 0, 0, 0xff, st) || (run == 2 && tdm_graph_begin(st));
        for (int p = 0; p < PAIRS && !rc; p++)
            rc = tdm_add_rmsnorm(dh + (size_t)p * m * k, NULL, 0, dw, (int)k, m, 1e-6f, dxn, NULL, st) ||
                 tdm_matmul(&d, dxn, k, m, y + p * ybytes, n, TDM_MM_BF16, tiles, st);
        if (run == 2) rc = rc || tdm_graph_end(st, &g) || tdm_graph_launch(g, st) || tdm_graph_launch(g, st);
        rc = rc || tdm_stream_sync(st);
        tdm_graph_destroy(g);
    }
    tdm_cuda_set_pdl(1);
    int64_t diff1 = -1, diff2 = -1;
    rc = rc || tdm_dev_count_diff(dy, (char *)dy + PAIRS * ybytes, PAIRS * ybytes, &diff1, st) ||
         tdm_dev_count_diff(dy, (char *)dy + 2 * PAIRS * ybytes, PAIRS * ybytes, &diff2, st);
    /* and the pairs differ from one another (the test could not see a stale input otherwise) */
    int64_t diff01 = 0;
    rc = rc || tdm_dev_count_diff(dy, (char *)dy + ybytes, ybytes, &diff01, st);
    ok(!rc && diff1 == 0 && diff2 == 0 && diff01 > 0,
       "%s, %d rows: %d norm -> product pairs through one buffer, programmatic launches (eager: %lld bytes differ; "
       "graph: %lld) equal plain launches bit for bit (pairs 0 and 1 differ in %lld bytes)%s%s",
       label, m, PAIRS, (long long)diff1, (long long)diff2, (long long)diff01, rc ? ": " : "", rc ? tdm_err() : "");
    tdm_cuda_free(dh);
    tdm_cuda_free(dxn);
    tdm_cuda_free(dw);
    tdm_cuda_free(dy);
    tdm_dweight_free(&d);
    free(hx);
    free(xf);
    free(w);
    free(h.w);
    free(h.scale);
}

/* The NVFP4 codes' device order (matmul.h: tdm_nvfp4_packed): sm_90's code reads the packed order
 * and the other targets the checkpoint's; an upload leaves every word of the device copy in it. */
static void test_nvfp4_order(const struct tdm_device_info *info)
{
    const int packed = tdm_nvfp4_packed(), want = info->sm_major == 9;
    ok(packed == want, "the device's code reads NVFP4 words in the %s order (sm_%d%d): %d", want ? "packed" : "checkpoint's",
       info->sm_major, info->sm_minor, packed);
    struct hweight h;
    struct tdm_dweight d;
    make_weight(&h, TDM_W_NVFP4, 64, 1040, TDM_DT_F32);
    const size_t words = 64 * 1040 / 8;
    uint32_t *back = malloc(words * 4);
    int bad = -1;
    if (back && tdm_dweight_upload(&h.q, &d) == 0) {
        if (tdm_cuda_d2h(back, d.w, words * 4) == 0) {
            bad = 0;
            const uint32_t *hw = h.w;
            for (size_t i = 0; i < words; i++) bad += back[i] != (packed ? tdm_nvfp4_pack(hw[i]) : hw[i]);
        }
        tdm_dweight_free(&d);
    }
    ok(bad == 0, "an uploaded NVFP4 weight's %zu words are the host's in that order (%d differ; -1: %s)", words, bad,
       bad < 0 ? tdm_err() : "-");
    free(back);
    free(h.w);
    free(h.scale);
}

/* The two orders of an NVFP4 or FP8 weight (mm_layout.h: TDM_MM_NVFP4_TILES, TDM_MM_FP8_TILES): uploaded as
 * the build holds it (tdm_dweight_upload: tile-major where the shape fits, in such builds) and in rows
 * (tdm_dweight_upload_rows; there the checked path), the same bits at 1, 5, 16, 20 and 32 rows, with
 * and without x's blocked copy (the skinny forms), and at 33 and 100 (the wide GEMM); outputs poisoned
 * with different bytes, so an output one call leaves unwritten differs. */
static void run_orders(const char *label, enum tdm_wfmt fmt, enum tdm_dtype sdt, int64_t rows, int64_t k, int64_t row0,
                       int64_t n)
{
    struct hweight h;
    make_weight(&h, fmt, rows, k, sdt);
    const struct tdm_qweight hv = tdm_qweight_rows(&h.q, row0, n);
    const int want = tdm_dweight_order_for(fmt, row0 + n, k);   /* the upload's stored rows */
    struct tdm_dweight dt, dr;
    const int XR = 100;
    uint16_t *hx = NULL, *dx = NULL, *dxb = NULL;
    float *xf = NULL;
    void *dy1 = NULL, *dy2 = NULL;
    const size_t ybytes = (size_t)XR * n * 4, xbb = (size_t)tdm_mm_xb_elems(k) * 2;
    int rc = tdm_dweight_upload(&hv, &dt) || tdm_dweight_upload_rows(&hv, &dr) || make_dx(XR, k, &hx, &xf, &dx) ||
             tdm_cuda_malloc(&dy1, ybytes) || tdm_cuda_malloc(&dy2, ybytes) || tdm_cuda_malloc((void **)&dxb, xbb + 16);
    ok(!rc && dt.order == want && dr.order == TDM_MM_ORDER_ROWS, "%s: held %s by the upload (order %d), in rows by "
       "tdm_dweight_upload_rows (%d)%s%s", label, want == TDM_MM_ORDER_TILES ? "tile-major" : "in rows", rc ? -1 : dt.order,
       rc ? -1 : dr.order, rc ? ": " : "", rc ? tdm_err() : "");
    static const int ms[] = {1, 5, 16, 20, 32, 33, 100};
    int bad = 0, runs = 0;
    for (size_t i = 0; i < sizeof ms / sizeof *ms && !rc; i++)
        for (int from_xb = 0; from_xb <= (ms[i] <= TDM_MM_MAX_ROWS && xbb) && !rc; from_xb++) {
            const int m = ms[i];
            const uint16_t *xb = from_xb ? dxb : NULL;
            int64_t diff = 0;
            rc = (xb && tdm_mm_pack_xb(dx, k, m, k, dxb, st)) || tdm_dev_fill_bytes(dy1, (size_t)m * n * 4, 0, 0, 0xff, st) ||
                 tdm_dev_fill_bytes(dy2, (size_t)m * n * 4, 0, 0, 0xfe, st) ||
                 tdm_matmul_xb(&dt, dx, k, xb, m, dy1, n, TDM_MM_F32, tiles, st) ||
                 tdm_matmul_xb(&dr, dx, k, xb, m, dy2, n, TDM_MM_F32, tiles, st) ||
                 tdm_dev_count_diff(dy1, dy2, (size_t)m * n * 4, &diff, st);
            runs++;
            if (diff) bad++;
        }
    ok(!rc && bad == 0, "%s: the upload's order and rows give the same bits at 1, 5, 16, 20, 32 rows (with and without "
       "x's blocked copy), 33 and 100 (%d of %d runs differ)%s%s", label, bad, runs, rc ? ": " : "", rc ? tdm_err() : "");
    if (!rc) tdm_dweight_free(&dt), tdm_dweight_free(&dr);
    tdm_cuda_free(dx);
    tdm_cuda_free(dxb);
    tdm_cuda_free(dy1);
    tdm_cuda_free(dy2);
    free(hx);
    free(xf);
    free(h.w);
    free(h.scale);
}

/* The gated up product (tdm_matmul_gated: up's product with the SiLU x up in its epilogue) against
 * tdm_matmul of gate and of up, then tdm_silu_mul, bit for bit, y and its blocked copy, at every row
 * count 1..32, in place (y the gate's output, as the engine runs it) and, at one row count, into a
 * separate y; from x's blocked copy where from_xb (FP8 and NVFP4 read it per lane, as in the
 * engine); 33 rows refused. Each row of the reference is row-invariant (the twins above), so the gated
 * product is too. */
static void run_gated(const char *label, enum tdm_wfmt fmt, int64_t n, int64_t k, const struct tdm_tiles *tl, int from_xb)
{
    struct tdm_dweight g, u;
    if (make_gate_up(label, fmt, n, k, &g, &u) != 0) return;
    const int R = TDM_MM_MAX_ROWS;
    uint16_t *hx, *dx;
    float *xf;
    uint16_t *dg, *du, *dref, *dy, *dxb = NULL, *dyb = NULL, *dyb2 = NULL;
    const size_t yb = (size_t)(R + 1) * n * 2, xbb = (size_t)tdm_mm_xb_elems(k) * 2,
                 ybb = (size_t)tdm_mm_xb_elems(n) * 2;
    if (make_dx(R + 1, k, &hx, &xf, &dx) != 0 || tdm_cuda_malloc((void **)&dg, yb) || tdm_cuda_malloc((void **)&du, yb) ||
        tdm_cuda_malloc((void **)&dref, yb) || tdm_cuda_malloc((void **)&dy, yb) ||
        tdm_cuda_malloc((void **)&dxb, xbb + 16) || tdm_cuda_malloc((void **)&dyb, ybb + 16) ||
        tdm_cuda_malloc((void **)&dyb2, ybb + 16)) {
        ok(0, "%s: device memory: %s", label, tdm_err());
        return;
    }
    int same = 0, copies = 0, fails = 0;
    for (int m = 1; m <= R; m++) {
        const uint16_t *xb = from_xb && xbb ? dxb : NULL;
        const size_t by = (size_t)m * n * 2;
        int64_t d1 = -1, d2 = -1, d3 = -1;
        /* the reference: gate, up, tdm_silu_mul, and the reference's blocked copy packed from it */
        if ((xb && tdm_mm_pack_xb(dx, k, m, k, dxb, st) != 0) || tdm_matmul_xb(&g, dx, k, xb, m, dg, n, TDM_MM_BF16, tl, st) ||
            tdm_matmul_xb(&u, dx, k, xb, m, du, n, TDM_MM_BF16, tl, st) || tdm_silu_mul(dg, du, n, m, dref, NULL, st) ||
            (ybb && (tdm_dev_fill_bytes(dyb2, ybb, 0, 0, 0, st) || tdm_mm_pack_xb(dref, n, m, n, dyb2, st))) ||
            /* gated, in place over the gate's output, writing y's copy */
            tdm_copy_async(dy, dg, by, st) || (ybb && tdm_dev_fill_bytes(dyb, ybb, 0, 0, 0, st)) ||
            tdm_matmul_gated(&u, dx, k, xb, m, dy, n, dy, n, ybb ? dyb : NULL, tl, st) ||
            tdm_dev_count_diff(dy, dref, by, &d1, st) || (ybb && tdm_dev_count_diff(dyb, dyb2, ybb, &d2, st))) {
            fails++;
            printf("# %s m=%d: %s\n", label, m, tdm_err());
            continue;
        }
        same += d1 == 0;
        copies += !ybb || d2 == 0;
        if (m == R / 2 + 3) {   /* into its own y, the gate's output left as it was */
            if (tdm_dev_fill_bytes(dy, yb, 5, 0xff, 0, st) || tdm_matmul_gated(&u, dx, k, xb, m, dg, n, dy, n, NULL, tl, st) ||
                tdm_dev_count_diff(dy, dref, by, &d3, st) || tdm_silu_mul(dg, du, n, m, du, NULL, st) ||
                tdm_dev_count_diff(du, dref, by, &d1, st)) {
                fails++;
                printf("# %s m=%d (separate y): %s\n", label, m, tdm_err());
            }
            ok(d3 == 0 && d1 == 0, "%s: at %d rows into a separate y: the same bits (%lld differing bytes), the gate's output "
               "left as it was", label, m, (long long)d3);
        }
    }
    ok(fails == 0 && same == R, "%s: up with the SiLU x up = gate, up, tdm_silu_mul bit for bit at %d of %d row counts%s",
       label, same, R, from_xb ? " (x's blocked copy)" : "");
    ok(fails == 0 && copies == R, "%s: y's blocked copy = y packed at %d of %d row counts", label, copies, R);
    ok(tdm_matmul_gated(&u, dx, k, NULL, R + 1, dg, n, dy, n, NULL, tl, st) != 0, "%s: %d rows refused: %s", label, R + 1,
       tdm_err());
    tdm_dweight_free(&g);
    tdm_dweight_free(&u);
    tdm_cuda_free(dx); tdm_cuda_free(dg); tdm_cuda_free(du); tdm_cuda_free(dref); tdm_cuda_free(dy);
    tdm_cuda_free(dxb); tdm_cuda_free(dyb); tdm_cuda_free(dyb2);
    free(hx); free(xf);
}

/* FP8 SwiGLU on edge shapes: an FP8 table of nt 2 settings written for them (t/tiletest.h), each
 * then run as one product at 1-16 rows from the blocked copy; in a build that holds FP8 tile-major,
 * the shapes that cannot be (rows not a multiple of 16, k not whole slabs) refused instead. */
static void fp8_swiglu_edges(const char *arch)
{
    static const int64_t shapes[][2] = {{200, 528}, {512, 256}, {344, 1024}, {208, 1024}};
    static const char *labels[] = {"swiglu fp8 200x528 (a partial last CTA and slab)", "swiglu fp8 512x256 (the tiny fixtures' MLP)",
                                   "swiglu fp8 344x1024 (a partial last CTA)",
                                   "swiglu fp8 208x1024 (a partial last CTA, rows a multiple of 16)"};
    enum { NS = sizeof shapes / sizeof shapes[0] };
    char dir[64];
    struct tdm_tiles *tl = NULL;
    ok(fp8_nt2_tables(arch, shapes, NS, dir, &tl) == 0, "an FP8 table of nt 2 settings for the SwiGLU edge shapes: %s",
       tl ? "loads" : tdm_err());
    for (int i = 0; tl && i < NS; i++) {
        const int64_t n = shapes[i][0], k = shapes[i][1];
        if (build_holds_tiles(TDM_W_FP8) && tdm_dweight_order_for(TDM_W_FP8, n, k) == TDM_MM_ORDER_ROWS) {
            char label[128];
            snprintf(label, sizeof label, "%s held in rows (a tile-major build)", labels[i]);
            swiglu_refused(label, TDM_W_FP8, n, k, tl, 1);
        } else {
            run_swiglu(labels[i], TDM_W_FP8, n, k, tl, 1, 16);
        }
    }
    tdm_tiles_free(tl);
    fp8_nt2_tables_remove(arch, dir);
}

int main(void)
{
    if (tdm_cuda_device_count() < 1) skip_all("no CUDA device visible");
    struct tdm_device_info info;
    char arch[32];
    if (tdm_cuda_device_info(0, &info) != 0 || tdm_stream_create(&st) != 0) {
        printf("Bail out! %s\n", tdm_err());
        return 1;
    }
    tdm_tiles_arch(info.sm_major, info.sm_minor, arch, sizeof arch);
    ok(tdm_tiles_load(NULL, arch, &tiles) == 0, "tile tables for %s load: %s", arch, tiles ? "ok" : tdm_err());
    printf("# %s, %s\n", info.name, arch);
    test_nvfp4_order(&info);
    /* FP8 is tile-major in builds with TDM_MM_FP8_TILES (else rows both ways); its block scales stay as stored */
    static const struct {
        const char *label;
        enum tdm_wfmt fmt;
        enum tdm_dtype sdt;
        int64_t rows, k, row0, n;
    } orders[] = {
        {"orders nvfp4 17408x5120", TDM_W_NVFP4, TDM_DT_F32, 17408, 5120, 0, 17408},
        {"orders nvfp4 96x5120", TDM_W_NVFP4, TDM_DT_F32, 96, 5120, 0, 96},
        {"orders nvfp4 view rows 64..191 of 256x512", TDM_W_NVFP4, TDM_DT_F32, 256, 512, 64, 128},
        {"orders nvfp4 200x1056 (rows in both: k not whole slabs)", TDM_W_NVFP4, TDM_DT_F32, 200, 1056, 0, 200},
        {"orders fp8 17408x5120", TDM_W_FP8, TDM_DT_F32, 17408, 5120, 0, 17408},
        {"orders fp8 view rows 64..191 of 256x512 (bf16 block scales)", TDM_W_FP8, TDM_DT_BF16, 256, 512, 64, 128},
        {"orders fp8 200x1056 (rows in both: k not whole slabs)", TDM_W_FP8, TDM_DT_F32, 200, 1056, 0, 200},
    };
    for (size_t i = 0; i < sizeof orders / sizeof orders[0]; i++)
        run_orders(orders[i].label, orders[i].fmt, orders[i].sdt, orders[i].rows, orders[i].k, orders[i].row0, orders[i].n);

    const enum tdm_wfmt fmts[3] = {TDM_W_NVFP4, TDM_W_FP8, TDM_W_BF16};
    for (int mi = 0; tdm_model_names[mi]; mi++) {
        const struct tdm_model_shapes *ms = tdm_model_shapes(tdm_model_names[mi]);
        int64_t nk[64][2];
        int cnt = tdm_model_distinct_shapes(ms, nk, 64);
        for (int i = 0; i < cnt; i++)
            for (int f = 0; f < 3; f++) {
                if (fmts[f] == TDM_W_BF16 && mi > 0) continue; /* BF16: the 27B's shapes and the edges */
                char label[128];
                snprintf(label, sizeof label, "%s %s %lldx%lld", ms->model, tdm_wfmt_name(fmts[f]), (long long)nk[i][0],
                         (long long)nk[i][1]);
                run_case(label, fmts[f], f == 1 && (i & 1) ? TDM_DT_BF16 : TDM_DT_F32, nk[i][0], nk[i][1], 0, nk[i][0]);
            }
    }
    /* the CUDA engine's one product of the 27B's in_proj_b and in_proj_a ([b; a], 2 x 48 rows):
     * BF16 as the checkpoints store them, NVFP4 where both share a scale_2 */
    run_case("qwen3.8-27b in_proj_b + in_proj_a bf16 96x5120", TDM_W_BF16, TDM_DT_F32, 96, 5120, 0, 96);
    run_case("qwen3.8-27b in_proj_b + in_proj_a nvfp4 96x5120", TDM_W_NVFP4, TDM_DT_F32, 96, 5120, 0, 96);
    /* edges: n not a multiple of the tile, k a multiple of 16 but not 64 (NVFP4), partial slabs and
     * FP8 blocks, views into a fused matrix (FP8 blocks straddling the view's start) */
    run_case("edge nvfp4 100x1040 (k%64 != 0)", TDM_W_NVFP4, TDM_DT_F32, 100, 1040, 0, 100);
    run_case("edge nvfp4 130x1056 (partial slab)", TDM_W_NVFP4, TDM_DT_F32, 130, 1056, 0, 130);
    run_case("edge nvfp4 view rows 64..191 of 256x512", TDM_W_NVFP4, TDM_DT_F32, 256, 512, 64, 128);
    run_case("edge fp8 300x200 (partial blocks)", TDM_W_FP8, TDM_DT_BF16, 300, 200, 0, 300);
    run_case("edge fp8 view rows 100..269 of 400x520", TDM_W_FP8, TDM_DT_F32, 400, 520, 100, 170);
    run_case("edge fp8 view [gate; up] up half 170..339 of 340x1024", TDM_W_FP8, TDM_DT_F32, 340, 1024, 170, 170);
    run_case("edge bf16 40x200", TDM_W_BF16, TDM_DT_F32, 40, 200, 0, 40);
    run_case("edge bf16 100x1000", TDM_W_BF16, TDM_DT_F32, 100, 1000, 0, 100);
    /* the tiny fixtures' projection shapes (qwen35-tiny, qwen3next-tiny) */
    static const int64_t tiny[][2] = {{768, 256}, {128, 256}, {256, 384}, {640, 256}, {384, 256}, {6, 256}, {12, 256},
                                      {512, 256}, {256, 512}, {256, 256}, {8, 256}, {256, 128}};
    for (size_t i = 0; i < sizeof tiny / sizeof tiny[0]; i++)
        for (int f = 0; f < 3; f++) {
            char label[96];
            snprintf(label, sizeof label, "tiny %s %lldx%lld", tdm_wfmt_name(fmts[f]), (long long)tiny[i][0], (long long)tiny[i][1]);
            run_case(label, fmts[f], TDM_DT_F32, tiny[i][0], tiny[i][1], 0, tiny[i][0]);
        }
    ok(fp8_nt2_cases >= 10, "FP8 nt 2 ran on %d shapes (the models' and the edge shapes where the setting is valid)",
       fp8_nt2_cases);
    /* SwiGLU in one product: the 27B's MLP (the shipped tables: nt 2 at 1-16 and 17-32 rows), a
     * shape whose last CTA is partial, and BF16 where a setting takes nt 2 */
    run_swiglu("swiglu nvfp4 17408x5120", TDM_W_NVFP4, 17408, 5120, tiles, 0, 32);
    run_swiglu("swiglu nvfp4 208x512 (a partial last CTA, rows a multiple of 16)", TDM_W_NVFP4, 208, 512, tiles, 0, 0);
    if (build_holds_tiles(TDM_W_NVFP4))
        swiglu_refused("swiglu nvfp4 200x512 held in rows (a tile-major build)", TDM_W_NVFP4, 200, 512, tiles, 0);
    else
        run_swiglu("swiglu nvfp4 200x512 (a partial last CTA)", TDM_W_NVFP4, 200, 512, tiles, 0, 0);
    run_swiglu("swiglu nvfp4 512x256 (the tiny fixtures' MLP)", TDM_W_NVFP4, 512, 256, tiles, 0, 0);
    /* FP8: the 27B's MLP with the shipped table where it sets nt 2 (sm_90's: at 1-16 rows; sm_121's
     * nt 1 has no SwiGLU form), and edge shapes with an FP8 table of nt 2 settings written here (a
     * partial last CTA and a partial last slab; the tiny fixtures' MLP) */
    if (tdm_tiles_get(tiles, TDM_MMK_FP8, 17408, 5120).nt == 2)
        run_swiglu("swiglu fp8 17408x5120", TDM_W_FP8, 17408, 5120, tiles, 1, 16);
    fp8_swiglu_edges(arch);
    /* the gated up product: the 27B's MLP in NVFP4 (the engine's form under TANDEM_MLP_FUSE=off, and at
     * 9-24 rows for NVFP4 held in rows), FP8 and BF16 on smaller shapes, a partial last CTA and slab */
    run_gated("gated nvfp4 17408x5120", TDM_W_NVFP4, 17408, 5120, tiles, 1);
    run_gated("gated nvfp4 200x1056 (a partial last CTA and slab)", TDM_W_NVFP4, 200, 1056, tiles, 0);
    run_gated("gated fp8 1024x5120", TDM_W_FP8, 1024, 5120, tiles, 1);
    run_gated("gated fp8 344x1000 (partial blocks)", TDM_W_FP8, 344, 1000, tiles, 0);
    run_gated("gated bf16 512x256", TDM_W_BF16, 512, 256, tiles, 0);
    /* programmatic launches: the 27B's largest NVFP4 shape and a small FP8 and BF16 one */
    run_pdl_chain("pdl nvfp4 17408x5120", TDM_W_NVFP4, 17408, 5120, 1);
    run_pdl_chain("pdl nvfp4 17408x5120", TDM_W_NVFP4, 17408, 5120, 8);
    run_pdl_chain("pdl fp8 1024x5120", TDM_W_FP8, 1024, 5120, 3);
    run_pdl_chain("pdl bf16 96x5120", TDM_W_BF16, 96, 5120, 16);
    tdm_tiles_free(tiles);
    tdm_stream_destroy(st);
    return done_testing();
}
