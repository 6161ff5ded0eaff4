/* probe.c — the wgmma NVFP4 probe's driver (bench/probes/wgmma/README.md): for each shape N,K, the
 * skinny kernel (tdm_matmul_xb, FP32 out) and each wgmma form at 8, 16 and 32 rows on the same weights and
 * activations: outputs compared bit for bit (and the largest difference), then both timed over a
 * working set of weight copies >= 8x the L2 in a CUDA graph (medians). */
#include "device.h"
#include "err.h"
#include "matmul.h"
#include "mm_layout.h"
#include "shapes.h"
#include "tiles.h"
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int tdm_probe_form(int f, int form[5]);
int tdm_probe_pack_xw(const uint16_t *x, int m, int k, int ntok, uint16_t *xw, void *stream);
int tdm_probe_wgmma(const struct tdm_dweight *w, const uint16_t *xw, int ntok, int wg, int pf, int lag, int wk, int ld, int chains,
                    int tree, float *part, float *y, void *stream);

static const char *prog = "wgmma-probe";

struct ctx {
    struct tdm_wset *ws;
    const uint16_t *x, *xb, *xw;
    int m, wg, pf, lag, wk, ld, chains, tree;   /* wg 0: the skinny kernel; tree 0: the wgmma kernel alone */
    float *part, *y;
    const struct tdm_tiles *tiles;
};

static int call(void *p, int i, void *stream)
{
    struct ctx *c = p;
    const struct tdm_dweight *w = &c->ws->w[i % c->ws->copies];
    if (c->wg == 0) return tdm_matmul_xb(w, c->x, w->k, c->xb, c->m, c->y, w->n, TDM_MM_F32, c->tiles, stream);
    return tdm_probe_wgmma(w, c->xw, c->m, c->wg, c->pf, c->lag, c->wk, c->ld, c->chains, c->tree, c->part, c->y, stream);
}

/* Rows [0, m) of a and b: bit-equal count, largest |a - b| over the largest |a|. */
static void compare(const float *a, const float *b, int64_t count, int64_t *equal, double *rel)
{
    double md = 0, ma = 0;
    *equal = 0;
    for (int64_t i = 0; i < count; i++) {
        if (memcmp(&a[i], &b[i], 4) == 0) (*equal)++;
        const double d = fabs((double)a[i] - (double)b[i]);
        if (d > md || isnan(d)) md = isnan(d) ? INFINITY : d;
        if (fabs(a[i]) > ma) ma = fabs(a[i]);
    }
    *rel = ma > 0 ? md / ma : md;
}

int main(int argc, char **argv)
{
    int reps = 10, first = 1, ncu_m = 0, ncu_form = -1;
    if (argc > 2 && strcmp(argv[first], "--reps") == 0) { reps = atoi(argv[first + 1]); first += 2; }
    if (argc > first + 1 && strcmp(argv[first], "--ncu") == 0) {
        if (sscanf(argv[first + 1], "%d,%d", &ncu_m, &ncu_form) != 2 || ncu_form < 0) tdm_die_usage(prog, "--ncu M,FORM", argv[first + 1]);
        first += 2;
    }
    if (first >= argc) { fprintf(stderr, "usage: %s [--reps N] [--ncu M,FORM] N,K ...\n", prog); return 2; }
    if (tdm_cuda_device_count() < 1) tdm_die_usage(prog, "no CUDA device visible", NULL);
    struct tdm_device_info info;
    if (tdm_cuda_device_info(0, &info) != 0) tdm_die_check(prog);
    const size_t l2 = info.l2_bytes ? info.l2_bytes : (60u << 20);
    char arch[32];
    struct tdm_tiles *tiles;
    tdm_tiles_arch(info.sm_major, info.sm_minor, arch, sizeof arch);
    if (tdm_tiles_load(NULL, arch, &tiles) != 0) tdm_die_input(prog);
    tdm_stream st;
    if (tdm_stream_create(&st) != 0) tdm_die_check(prog);
    printf("# %s on %s; graph medians of %d; skinny = tdm_matmul_xb (tiles/%s), FP32 out; wgmma form: wg warpgroups a CTA,\n"
           "# pf weight slabs in flight, lag the producer's lag in slabs, wk 1: the chains across the CTA's warpgroups (tree's first levels in\n"
           "# the CTA), ld 1: the skinny kernel's checked loader, 0: straight loads; x = skinny us / wgmma us; wgmma: with a second kernel for the\n"
           "# chains' tree where one is needed; main: without it; bits: outputs equal to the skinny kernel's; '-': the form does not fit the shape\n",
           prog, info.name, reps, arch);
    printf("%-12s %4s %6s | %9s %7s | %4s %2s %2s %3s %2s %2s %9s %7s %6s | %9s %6s | %s\n", "shape", "rows", "chains", "skinny us", "GB/s",
           "form", "wg", "pf", "lag", "wk", "ld", "wgmma us", "GB/s", "x", "main us", "x", "bits equal, max rel diff");
    int status = 0;
    for (int a = first; a < argc; a++) {
        int64_t n, k;
        if (tdm_parse_shape(argv[a], &n, &k) != 0 || k % 128 || n % 16) tdm_die_usage(prog, "expected N,K (N % 16, K % 128 == 0)", argv[a]);
        struct tdm_wset ws;
        if (tdm_wset_alloc(&ws, TDM_W_NVFP4, n, k, TDM_DT_F32, ncu_m ? 0 : 8 * l2, ncu_m ? 1 : 2, 7) != 0) tdm_die_check(prog);
        const int chains = tdm_mm_kchains(n, k);
        struct ctx c = {.ws = &ws, .chains = chains, .tiles = tiles, .tree = 1};
        void *x, *xb, *xw, *part, *yr, *yw;
        if (tdm_cuda_malloc(&x, (size_t)(32 * k * 2)) || tdm_cuda_malloc(&xb, (size_t)tdm_mm_xb_elems(k) * 2) ||
            tdm_cuda_malloc(&xw, (size_t)(32 * k * 2)) || tdm_cuda_malloc(&part, (size_t)chains * 32 * n * 4) ||
            tdm_cuda_malloc(&yr, (size_t)(32 * n * 4)) || tdm_cuda_malloc(&yw, (size_t)(32 * n * 4)))
            tdm_die_check(prog);
        if (tdm_dev_fill_bf16(x, (size_t)(32 * k), 5, 1.0f, st) || tdm_mm_pack_xb(x, k, 32, k, xb, st) || tdm_stream_sync(st))
            tdm_die_check(prog);
        c.x = x; c.xb = xb; c.xw = xw; c.part = part;
        float *hr = malloc((size_t)(32 * n * 4)), *hw = malloc((size_t)(32 * n * 4));
        for (int m = 8; m <= 32; m *= 2) {
            if (ncu_m && m != ncu_m) continue;
            c.m = m;
            if (tdm_probe_pack_xw(x, m, (int)k, m, xw, st) || tdm_stream_sync(st)) tdm_die_check(prog);
            c.wg = 0; c.y = yr;
            if (call(&c, 0, st) || tdm_stream_sync(st) || tdm_cuda_d2h(hr, yr, (size_t)(m * n * 4))) tdm_die_check(prog);
            double ms_ref = NAN;
            if (!ncu_m && tdm_time_calls(call, &c, ws.copies, reps, 1, st, &ms_ref)) tdm_die_check(prog);
            const double bytes = (double)tdm_matmul_bytes(&ws.w[0], m);
            int form[5];   /* (wg, pf, lag, wk, ld): wgmma_nvfp4.cu's TDM_PROBE_FORMS */
            for (int f = 0; tdm_probe_form(f, form) == 0; f++) {
                if (ncu_m && f != ncu_form) continue;
                c.wg = form[0]; c.pf = form[1]; c.lag = form[2]; c.wk = form[3]; c.ld = form[4];
                c.y = yw; c.tree = 1;
                int rc = tdm_cuda_memset(yw, 0xff, (size_t)(32 * n * 4)) ? -1 : call(&c, 0, st);
                if (rc == 3) {
                    printf("%-12s %4d %6d | %9.2f %7.0f | %4d %2d %2d %3d %2d %2d %9s\n", argv[a], m, chains, ms_ref * 1e3,
                           bytes / ms_ref / 1e6, f, c.wg, c.pf, c.lag, c.wk, c.ld, "-");
                    continue;
                }
                if (rc || tdm_stream_sync(st) || tdm_cuda_d2h(hw, yw, (size_t)(m * n * 4))) tdm_die_check(prog);
                int64_t eq;
                double rel, ms = NAN, ms_main = NAN;
                compare(hr, hw, (int64_t)m * n, &eq, &rel);
                if (eq != (int64_t)m * n) status = 1;
                if (!ncu_m && tdm_time_calls(call, &c, ws.copies, reps, 1, st, &ms)) tdm_die_check(prog);
                c.tree = 0;
                if (!ncu_m && tdm_time_calls(call, &c, ws.copies, reps, 1, st, &ms_main)) tdm_die_check(prog);
                printf("%-12s %4d %6d | %9.2f %7.0f | %4d %2d %2d %3d %2d %2d %9.2f %7.0f %6.2f | %9.2f %6.2f | %" PRId64 "/%" PRId64 ", %.2e\n",
                       argv[a], m, chains, ms_ref * 1e3, bytes / ms_ref / 1e6, f, c.wg, c.pf, c.lag, c.wk, c.ld, ms * 1e3,
                       bytes / ms / 1e6, ms_ref / ms, ms_main * 1e3, ms_ref / ms_main, eq, (int64_t)m * n, rel);
                fflush(stdout);
            }
        }
        free(hr); free(hw);
        tdm_cuda_free(x); tdm_cuda_free(xb); tdm_cuda_free(xw); tdm_cuda_free(part); tdm_cuda_free(yr); tdm_cuda_free(yw);
        tdm_wset_free(&ws);
    }
    tdm_tiles_free(tiles);
    tdm_stream_destroy(st);
    return status;
}
