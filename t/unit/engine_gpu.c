/* The CUDA engine (src/common/engine.h) on the GPU; skips without a device.
 *   glue kernels (kernels/engine_glue.h) against the lines of ref.c they replace, 32 rows:
 *     embedding gather: BF16 rows bit for bit, F32 rows rounded to BF16 bit for bit;
 *     SiLU(gate) * up: within one BF16 ulp (the GPU's expf may differ from the C library's by an
 *       FP32 ulp before the rounding), every element written;
 *     a tree commit's row gather (tdm_rows_compact): equal to the host loop bit for bit, the base
 *       on the host and in device memory, the other rows and columns untouched.
 *   qwen3_5's in_proj_b and in_proj_a as one product (the engine's upload, tdm_dweight_upload_cat)
 *   against the two products written side by side into rows of 2n (the engine's two-product path),
 *   for the 27B's shape (48 x 5120) and the tiny fixture's (6 x 256) in BF16, 48 x 5120 in NVFP4
 *   with one scale_2, and FP8 parts of whole 128-row blocks; 1, 2, 5, 16, 17 and 32 rows (the
 *   skinny kernels) and 33 and 100 (the wide GEMM):
 *     both against the CPU reference (tdm_dot over the parts' rows): |y - ref| <= 1e-4 sum_k |x w|
 *       + 2^-8 |ref| (matmul_gpu.c's bound for BF16 output), every output written;
 *     the skinny kernels bit for bit where tdm_mm_kchains gives the fused shape (2n, k) the parts'
 *       chain count (true for every shape here: the settings of a shape change no bits but through
 *       kchains, tiles.h); the wide GEMM's differing values reported, not failed;
 *     tdm_dweight_upload_cat refuses FP8 48-row parts (a 128-row scale block across both).
 *   the forward on the tiny fixtures (TANDEM_FIXTURES/qwen35-tiny: dense qwen3_5;
 *   TANDEM_FIXTURES/qwen3next-tiny: qwen3_next, grouped GDN projections and MoE in every layer),
 *   per stored format (bf16, fp8, nvfp4), the prompt in one call of T rows (chunks of 32), then
 *   the fixture's greedy ids fed one by one (teacher forcing, as tandem-run --force):
 *     prompt logits and step logits against the fixture's (transformers) logits: relative error
 *       <= 2e-2 (fixture_check's bound for the CPU reference);
 *     the same logits against the CPU reference (tdm_ref_forward): relative error <= 1e-2 (a
 *       stated bound, half the fixture's: the kernels' sums run in other orders than ref.c's, so
 *       BF16 roundings flip here and there; the measured value is printed), and top-1 equal
 *       wherever the CPU reference's margin >= 0.25;
 *     (MoE: a row whose own relative error exceeds the bound is excused where the CPU reference
 *       saw a routing near tie at that position — router margin < 0.0625, fixture_check's rule:
 *       the router logits come from another sum order, so the k-th expert may differ there —,
 *       reported, left out of the matrix's error and of top-1, at most one row in eight;)
 *     greedy: the engine's argmax at every step equals the fixture's greedy id up to the first
 *       step where the fixture's margin < 0.25 (a near tie; a difference there is reported with
 *       both margins, not failed);
 *     row invariance: the prompt in T one-row calls, and in calls of 5 rows, followed by the same
 *       steps, gives every logit bit for bit as the one T-row call;
 *     qwen3_5 (qwen35-tiny): an engine made with TANDEM_GDN_FUSE_BA=off (in_proj_b and in_proj_a as
 *       two products) gives the same prompt and step logits bit for bit where tdm_mm_kchains gives
 *       (2Hv, H) the chains of (Hv, H) (the tiny fixture's 12 x 256 and 6 x 256: one chain each),
 *       else within the CPU bound of the CPU reference;
 *     qwen3_5 in FP8: with an FP8 table of nt 2 for the MLP (t/tiletest.h), its gate, up and SiLU x
 *       up run as one product (tdm_matmul_swiglu_ok at 1 and 5 rows with the blocked copy), and
 *       engines with TANDEM_MLP_FUSE=on and =off give the one T-row call's logits bit for bit;
 *     greedy ids on the device (the _ids forms), graphed and eager (TANDEM_CUDA_GRAPH on, off): each
 *       row's id equals the host tdm_argmax of its logits — the prompt in one call with logits and
 *       ids, and ids only from row T/2; the steps alternating logits + ids and ids only (the step's
 *       graph captured on an ids-only step, replayed both ways); a 5-row call, ids only from row 2;
 *       the prefill path with logits + ids, ids only, ids only of the last row — and the logits
 *       that come with ids are the one-call feed's bits;
 *     MoE (qwen3next-tiny, a 40-token prompt): the prefill path in one chunk through the experts'
 *       grouped form (TANDEM_MOE_GROUPED=on, the default) and in 32-row chunks through the per-pair
 *       kernels (TANDEM_MOE_GROUPED=off), each + the forced steps within CPU_BOUND of the CPU
 *       reference (routing near ties excused as above);
 *     errors: context overflow refused with nothing consumed. */
#include "compare.h"
#include "device.h"
#include "engine.h"
#include "engine_glue.h"
#include "err.h"
#include "formats.h"
#include "matmul.h"
#include "mm_layout.h"
#include "model.h"
#include "ref.h"
#include "safetensors.h"
#include "settings.h"
#include "tap.h"
#include "tiles.h"
#include "tokens.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "gputest.h"
#include "tiletest.h"

#define FIX_BOUND 2e-2
#define CPU_BOUND 1e-2
#define CLEAR_MARGIN 0.25f

static void down(void *h, const void *d, size_t n)
{
    if (tdm_cuda_sync() != 0 || tdm_cuda_d2h(h, d, n) != 0) bail("copy from device");
}
static void poison(void *d, size_t n)
{
    if (tdm_cuda_sync() != 0 || tdm_cuda_memset(d, 0xff, n) != 0 || tdm_cuda_sync() != 0) bail("cudaMemset");
}

/* ---- glue kernels ---- */

/* H 520 and 5120 take the vector copy (one block and three blocks a row), 517 the element-wise one;
 * row 9's id is past the table (a BF16 NaN row). */
static void test_embed(void)
{
    const int V = 300, M = 32, Hs[] = {520, 517, 5120};
    for (size_t hi = 0; hi < sizeof Hs / sizeof *Hs; hi++) {
        const int H = Hs[hi];
        uint16_t *tb = hal((size_t)V * H * 2), *got = hal((size_t)M * H * 2);
        float *tf = hal((size_t)V * H * 4);
        int32_t ids[32];
        for (size_t i = 0; i < (size_t)V * H; i++) {
            tf[i] = frand() * 3.0f;
            tb[i] = tdm_f32_to_bf16(tf[i]);
        }
        for (int r = 0; r < M; r++) ids[r] = (int32_t)(next() % V);
        ids[5] = ids[0];
        ids[7] = V - 1;
        ids[9] = V;
        void *dt = dal((size_t)V * H * 4);
        int32_t *di = dal(sizeof ids);
        uint16_t *dh = dal((size_t)M * H * 2);
        up(di, ids, sizeof ids);
        for (int f32 = 0; f32 < 2; f32++) {
            up(dt, f32 ? (const void *)tf : (const void *)tb, (size_t)V * H * (f32 ? 4 : 2));
            poison(dh, (size_t)M * H * 2);
            if (tdm_embed_rows(dt, f32, V, H, di, M, dh, NULL) != 0) bail("tdm_embed_rows");
            down(got, dh, (size_t)M * H * 2);
            long bad = 0;
            for (int r = 0; r < M; r++)
                for (int i = 0; i < H; i++) {
                    const size_t s = (size_t)ids[r] * H + i;
                    const uint16_t want = ids[r] >= V ? 0x7fc0 : f32 ? tdm_f32_to_bf16(tf[s]) : tb[s];
                    bad += got[(size_t)r * H + i] != want;
                }
            ok(bad == 0, "embed gather, %s table [%d][%d], %d rows (one id past the table: NaN): %ld of %d values differ "
               "from the rows%s", f32 ? "F32" : "BF16", V, H, M, bad, M * H, f32 ? " rounded to BF16" : "");
        }
        tdm_cuda_free(dt); tdm_cuda_free(di); tdm_cuda_free(dh);
        free(tb); free(got); free(tf);
    }
}

static float siluf_ref(float x) { return x / (1.0f + expf(-x)); }

static void test_silu_mul(void)
{
    const int M = 32, I = 17408 / 16 + 3; /* an odd width: the tail of the last block */
    const size_t n = (size_t)M * I;
    uint16_t *g = hal(n * 2), *u = hal(n * 2), *got = hal(n * 2);
    for (size_t i = 0; i < n; i++) {
        g[i] = tdm_f32_to_bf16(frand() * 12.0f);
        u[i] = tdm_f32_to_bf16(frand() * 4.0f);
    }
    uint16_t *dg = dal(n * 2), *du = dal(n * 2), *dout = dal(n * 2);
    up(dg, g, n * 2);
    up(du, u, n * 2);
    for (int inplace = 0; inplace < 2; inplace++) {
        uint16_t *dst = inplace ? dg : dout;
        if (inplace) up(dg, g, n * 2);
        else poison(dout, n * 2);
        if (tdm_silu_mul(dg, du, I, M, dst, NULL, NULL) != 0) bail("tdm_silu_mul");
        down(got, dst, n * 2);
        long bad = 0, exact = 0;
        for (size_t i = 0; i < n; i++) {
            const float want = tdm_bf16r(tdm_bf16r(siluf_ref(tdm_bf16_to_f32(g[i]))) * tdm_bf16_to_f32(u[i]));
            const float gv = tdm_bf16_to_f32(got[i]);
            const float step = fmaxf(ldexpf(fabsf(want), -7), 1e-30f);
            exact += gv == want;
            bad += !(fabsf(gv - want) <= step);
        }
        ok(bad == 0, "silu(gate) * up, %d rows of %d%s: %ld outside one BF16 ulp, %.2f%% bit-identical to ref.c", M, I,
           inplace ? " (in place)" : "", bad, 100.0 * exact / (double)n);
    }
    tdm_cuda_free(dg); tdm_cuda_free(du); tdm_cuda_free(dout);
    free(g); free(u); free(got);
}

/* A tree commit's gather: rows base + t = rows base + path[t] for t = 0..n-1 in order, in place,
 * against the host loop (ref.c's copy of the path's rows), with the base on the host and in device
 * memory; the rows outside base..base+n-1 untouched. */
static void test_rows_compact(void)
{
    const int W = 1000, ld = 1030, rows = 40, base = 5, n = 6;
    const int32_t path[6] = {0, 2, 3, 7, 8, 30}; /* a root-to-node path: increasing from 0 */
    const size_t bytes = (size_t)rows * ld * 2;
    uint16_t *h = hal(bytes), *want = hal(bytes), *got = hal(bytes);
    for (size_t i = 0; i < (size_t)rows * ld; i++) h[i] = (uint16_t)next();
    memcpy(want, h, bytes);
    for (int t = 0; t < n; t++)
        memcpy(want + (size_t)(base + t) * ld, want + (size_t)(base + path[t]) * ld, (size_t)W * 2);
    uint16_t *d = dal(bytes);
    int32_t *dpath = dal(sizeof path), *dbase = dal(4);
    up(dpath, path, sizeof path);
    up(dbase, &base, 4);
    for (int dev = 0; dev < 2; dev++) {
        up(d, h, bytes);
        if (tdm_rows_compact(d, ld, W, dev ? 1000 : base, dev ? dbase : NULL, dpath, n, NULL) != 0) bail("tdm_rows_compact");
        down(got, d, bytes);
        ok(memcmp(got, want, bytes) == 0, "rows_compact: %d rows gathered along a path in place, base %s, bit for bit, the "
           "other rows and the columns past W untouched", n, dev ? "in device memory" : "on the host");
    }
    tdm_cuda_free(d); tdm_cuda_free(dpath); tdm_cuda_free(dbase);
    free(h); free(want); free(got);
}

/* ---- in_proj_b and in_proj_a as one product ---- */

static struct tdm_tiles *tiles;

struct hw {
    struct tdm_qweight q;
    void *w, *scale;
};

/* A stored weight [n, k] in fmt from random floats (NVFP4 with the given scale_2; FP8 F32 scales). */
static void make_hw(struct hw *h, enum tdm_wfmt fmt, int64_t n, int64_t k, float scale2)
{
    memset(h, 0, sizeof *h);
    float *f = hal((size_t)(n * k) * sizeof *f);
    for (int64_t i = 0; i < n * k; i++) f[i] = frand() * 0.05f * (1 + (i % 3));
    h->q.fmt = fmt;
    h->q.n = n;
    h->q.k = k;
    h->q.scale_dt = TDM_DT_F32;
    if (fmt == TDM_W_BF16) {
        uint16_t *w = hal((size_t)(n * k) * 2);
        for (int64_t i = 0; i < n * k; i++) w[i] = tdm_f32_to_bf16(f[i]);
        h->w = w;
    } else if (fmt == TDM_W_NVFP4) {
        h->w = hal((size_t)(n * k / 2));
        h->scale = hal((size_t)(n * k / TDM_NVFP4_GROUP));
        tdm_nvfp4_quantize(f, n, k, scale2, h->w, h->scale, &h->q.scale2);
    } else {
        const int64_t B = TDM_FP8_BLOCK;
        h->w = hal((size_t)(n * k));
        h->scale = hal((size_t)(((n + B - 1) / B) * ((k + B - 1) / B)) * 4);
        tdm_fp8_quantize(f, n, k, 0, h->w, h->scale, TDM_DT_F32);
    }
    h->q.w = h->w;
    h->q.scale = h->scale;
    free(f);
}

/* b [n, k] and a [n, k]: the product through the one weight [b; a] into y1 [m][2n], and the two
 * products into y2 at columns 0 and n (row stride 2n), for each row count, against each other and
 * against the CPU reference. */
static void test_cat_case(const char *label, enum tdm_wfmt fmt, int64_t n, int64_t k, float scale2, tdm_stream st)
{
    struct hw hb, ha;
    make_hw(&hb, fmt, n, k, scale2);
    make_hw(&ha, fmt, n, k, scale2);
    struct tdm_dweight db, da, dcat;
    if (tdm_dweight_upload(&hb.q, &db) != 0 || tdm_dweight_upload(&ha.q, &da) != 0) bail("upload");
    const int cat_rc = tdm_dweight_upload_cat(&hb.q, &ha.q, &dcat);
    ok(cat_rc == 0 && dcat.n == 2 * n && dcat.k == k && dcat.row0 == 0, "%s: [b; a] uploaded as one %lldx%lld weight%s%s",
       label, (long long)(2 * n), (long long)k, cat_rc ? ": " : "", cat_rc ? tdm_err() : "");
    if (cat_rc != 0) {
        tdm_dweight_free(&db); tdm_dweight_free(&da);
        free(hb.w); free(hb.scale); free(ha.w); free(ha.scale);
        return;
    }
    const int XR = 100, N2 = (int)(2 * n);
    uint16_t *hx = hal((size_t)XR * k * 2);
    float *xf = hal((size_t)XR * k * sizeof *xf);
    for (int64_t i = 0; i < XR * k; i++) {
        hx[i] = tdm_f32_to_bf16(frand() * 2.0f);
        xf[i] = tdm_bf16_to_f32(hx[i]);
    }
    /* the reference and sum |x w| of every (row, column), columns 0..n-1 from b, n..2n-1 from a */
    float *ref = hal((size_t)XR * N2 * sizeof *ref), *mag = hal((size_t)XR * N2 * sizeof *mag), *row = hal((size_t)k * sizeof *row);
    for (int c = 0; c < N2; c++) {
        tdm_qweight_row(c < n ? &hb.q : &ha.q, c < n ? c : c - n, row);
        for (int r = 0; r < XR; r++) {
            const float *xr = xf + (size_t)r * k;
            double s = 0;
            for (int64_t i = 0; i < k; i++) s += fabs((double)xr[i] * row[i]);
            ref[(size_t)r * N2 + c] = tdm_dot(xr, row, k);
            mag[(size_t)r * N2 + c] = (float)s;
        }
    }
    uint16_t *dx = dal((size_t)XR * k * 2), *dy1 = dal((size_t)XR * N2 * 2), *dy2 = dal((size_t)XR * N2 * 2);
    uint16_t *y1 = hal((size_t)XR * N2 * 2), *y2 = hal((size_t)XR * N2 * 2);
    up(dx, hx, (size_t)XR * k * 2);
    const int same_chains = tdm_mm_kchains(2 * n, k) == tdm_mm_kchains(n, k);
    static const int rows[] = {1, 2, 5, 16, 17, 32, 33, 100};
    for (size_t ri = 0; ri < sizeof rows / sizeof rows[0]; ri++) {
        const int m = rows[ri], wide = m > 32;
        const size_t yb = (size_t)m * N2 * 2;
        poison(dy1, yb);
        poison(dy2, yb);
        if (tdm_matmul(&dcat, dx, k, m, dy1, N2, TDM_MM_BF16, tiles, st) != 0 ||
            tdm_matmul(&db, dx, k, m, dy2, N2, TDM_MM_BF16, tiles, st) != 0 ||
            tdm_matmul(&da, dx, k, m, dy2 + n, N2, TDM_MM_BF16, tiles, st) != 0 || tdm_stream_sync(st) != 0)
            bail("matmul");
        down(y1, dy1, yb);
        down(y2, dy2, yb);
        long bad1 = 0, bad2 = 0, unwritten = 0, differ = 0;
        double worst = 0;
        for (int r = 0; r < m; r++)
            for (int c = 0; c < N2; c++) {
                const size_t i = (size_t)r * N2 + c;
                const double want = ref[i], tol = 1e-4 * mag[i] + ldexp(fabs(want), -8) + 1e-30;
                const double g1 = tdm_bf16_to_f32(y1[i]), g2 = tdm_bf16_to_f32(y2[i]);
                unwritten += isnan(g1) || isnan(g2);
                bad1 += !(fabs(g1 - want) <= tol);
                bad2 += !(fabs(g2 - want) <= tol);
                differ += y1[i] != y2[i];
                const double e = fabs(g1 - want) / (mag[i] + 1e-30);
                if (!(e <= worst)) worst = e;
            }
        ok(bad1 == 0 && bad2 == 0 && unwritten == 0, "%s, %d rows%s: one product and two products vs the CPU reference: %ld "
           "and %ld of %d outside the bound (worst %.2e of sum|xw|), %ld unwritten", label, m, wide ? " (wide GEMM)" : "",
           bad1, bad2, m * N2, worst, unwritten);
        if (!wide && same_chains)
            ok(differ == 0, "%s, %d rows: one product equals the two products bit for bit (kchains %d for %lldx%lld and "
               "%lldx%lld): %ld of %d values differ", label, m, tdm_mm_kchains(n, k), (long long)(2 * n), (long long)k,
               (long long)n, (long long)k, differ, m * N2);
        else
            printf("# %s, %d rows%s: one product vs two products: %ld of %d values differ (kchains %d vs %d; not required "
                   "equal)\n", label, m, wide ? " (wide GEMM)" : "", differ, m * N2, tdm_mm_kchains(2 * n, k),
                   tdm_mm_kchains(n, k));
    }
    tdm_cuda_free(dx); tdm_cuda_free(dy1); tdm_cuda_free(dy2);
    tdm_dweight_free(&db); tdm_dweight_free(&da); tdm_dweight_free(&dcat);
    free(hx); free(xf); free(ref); free(mag); free(row); free(y1); free(y2);
    free(hb.w); free(hb.scale); free(ha.w); free(ha.scale);
}

static void test_cat_products(void)
{
    tdm_stream st;
    if (tdm_stream_create(&st) != 0) bail("stream");
    test_cat_case("b + a bf16 48x5120 (27B)", TDM_W_BF16, 48, 5120, 0, st);
    test_cat_case("b + a bf16 6x256 (qwen35-tiny)", TDM_W_BF16, 6, 256, 0, st);
    test_cat_case("b + a nvfp4 48x5120, one scale_2", TDM_W_NVFP4, 48, 5120, 0.0125f, st);
    test_cat_case("b + a fp8 128x512 (whole blocks)", TDM_W_FP8, 128, 512, 0, st);
    /* FP8 48-row parts do not concatenate: refused, nothing uploaded */
    struct hw hb, ha;
    make_hw(&hb, TDM_W_FP8, 48, 512, 0);
    make_hw(&ha, TDM_W_FP8, 48, 512, 0);
    struct tdm_dweight d;
    const int rc = tdm_dweight_upload_cat(&hb.q, &ha.q, &d);
    ok(rc != 0 && d.owned == NULL && strstr(tdm_err(), "do not concatenate"),
       "b + a fp8 48x512: one weight refused (\"%s\"), nothing uploaded", rc ? tdm_err() : "accepted");
    if (rc == 0) tdm_dweight_free(&d);
    free(hb.w); free(hb.scale); free(ha.w); free(ha.scale);
    tdm_stream_destroy(st);
}

/* ---- the forward on the fixture ---- */

static const float *ref_tensor(const struct tdm_stfile *f, const char *name, int64_t *rows, int V)
{
    const struct tdm_tensor *t = tdm_st_find(f, name);
    if (!t || t->dtype != TDM_DT_F32 || t->ndim != 2 || t->shape[1] != V) {
        printf("Bail out! %s: tensor %s missing or not F32 [rows][%d]\n", f->path, name, V);
        exit(1);
    }
    *rows = t->shape[0];
    return t->data;
}

/* Prompt (mode 0: one call; 1: one-row calls; k > 1: calls of k rows), then the forced steps: all
 * rows' logits [T + S - 1][V] into out (prompt rows 0..T-1, then the rows after each fed id). */
static int run_engine(struct tdm_engine *e, const int32_t *prompt, int T, const int32_t *force, int S, int mode, float *out,
                      int V)
{
    if (tdm_engine_reset(e) != 0) return -1;
    const int step = mode == 0 ? T : mode;
    for (int at = 0; at < T; at += step) {
        const int n = T - at < step ? T - at : step;
        if (tdm_engine_forward(e, prompt + at, n, 0, out + (size_t)at * V) != 0) return -1;
    }
    for (int i = 0; i + 1 < S; i++)
        if (tdm_engine_forward(e, &force[i], 1, 0, out + (size_t)(T + i) * V) != 0) return -1;
    return 0;
}

/* Rows (not excused) whose reference margin >= CLEAR_MARGIN and whose top-1 differs. */
static int top1_differ(const float *got, const float *ref, int rows, int V, const int *skip, int *clear, int *first)
{
    int n = 0;
    *clear = 0;
    *first = -1;
    for (int i = 0; i < rows; i++) {
        if (skip[i] || tdm_margin(ref + (size_t)i * V, V) < CLEAR_MARGIN) continue;
        (*clear)++;
        if (tdm_argmax(got + (size_t)i * V, V) != tdm_argmax(ref + (size_t)i * V, V)) {
            if (*first < 0) *first = i;
            n++;
        }
    }
    return n;
}

/* Sets the environment variable name to value; returns what env_restore takes back (its previous
 * value, NULL when it was unset). */
static char *env_set(const char *name, const char *value)
{
    const char *was = getenv(name);
    char *prev = was ? strdup(was) : NULL;
    if (setenv(name, value, 1) != 0) bail("setenv");
    return prev;
}
static void env_restore(const char *name, char *prev)
{
    if (prev ? setenv(name, prev, 1) : unsetenv(name)) bail("setenv");
    free(prev);
}

/* The greedy ids the engine chooses on the device against the host tdm_argmax (see the top): want
 * [T + S - 1][V] the logits of run_engine's one-call feed (prompt rows, then the row after each
 * forced id). A fresh engine per TANDEM_CUDA_GRAPH setting (read at tdm_engine_new); the setting is
 * put back as it was. */
static void test_ids(const struct tdm_model *m, const char *lab, const int32_t *prompt, int T, const int32_t *force, int S,
                     const float *want)
{
    const int V = m->cfg.vocab, rows = T + S - 1;
    float *lg = hal((size_t)rows * V * 4);
    int32_t *gid = hal((size_t)rows * 4), *gid2 = hal((size_t)rows * 4);
#define ARGMAX(x, r) tdm_argmax((x) + (size_t)(r) * V, V)
    for (int graph = 1; graph >= 0; graph--) {
        char *saved = env_set("TANDEM_CUDA_GRAPH", graph ? "on" : "off");
        struct tdm_engine *e = tdm_engine_new(m, rows);
        if (!e) bail("engine");
        long checked = 0, differ = 0, bits = 0;
        /* the prompt in one call (chunks of 32), logits and ids */
        memset(gid, 0xff, (size_t)rows * 4);
        if (tdm_engine_forward_ids(e, prompt, T, 0, lg, gid) != 0) bail("tdm_engine_forward_ids, prompt");
        for (int r = 0; r < T; r++, checked++) differ += gid[r] != ARGMAX(lg, r);
        bits += memcmp(lg, want, (size_t)T * V * 4) != 0;
        /* the steps: even ones with logits and ids, odd ones ids only (the step graph is captured on
         * step 1, an ids-only one, and replayed both ways) */
        for (int i = 0; i + 1 < S; i++, checked++) {
            const int with = i % 2 == 0;
            float *row = lg + (size_t)(T + i) * V;
            int32_t g = -1;
            if (tdm_engine_forward_ids(e, &force[i], 1, 0, with ? row : NULL, &g) != 0) bail("tdm_engine_forward_ids, step");
            differ += g != ARGMAX(want, T + i);
            if (with) {
                differ += g != ARGMAX(row, 0);
                bits += memcmp(row, want + (size_t)(T + i) * V, (size_t)V * 4) != 0;
            }
        }
        /* ids only: prompt rows T/2..T-1 (the second chunk's offset), then a 5-row call from row 2 */
        if (tdm_engine_reset(e) != 0) bail("engine reset");
        const int from = T / 2;
        memset(gid, 0xff, (size_t)rows * 4);
        if (tdm_engine_forward_ids(e, prompt, T, from, NULL, gid) != 0) bail("tdm_engine_forward_ids, ids only");
        for (int r = from; r < T; r++, checked++) differ += gid[r - from] != ARGMAX(want, r);
        if (S >= 6) {
            if (tdm_engine_forward_ids(e, force, 5, 2, NULL, gid) != 0) bail("tdm_engine_forward_ids, 5 rows");
            for (int r = 2; r < 5; r++, checked++) differ += gid[r - 2] != ARGMAX(want, T + r);
        }
        /* the prefill path (its own logits, close to but not the bits of the forward's): logits and
         * ids, then ids only, then the last row's id only */
        int32_t last = -1;
        memset(gid, 0xff, (size_t)rows * 4);
        memset(gid2, 0xff, (size_t)rows * 4);
        if (tdm_engine_reset(e) != 0 || tdm_engine_prefill_ids(e, prompt, T, 0, lg, gid) != 0 || tdm_engine_reset(e) != 0 ||
            tdm_engine_prefill_ids(e, prompt, T, 0, NULL, gid2) != 0 || tdm_engine_reset(e) != 0 ||
            tdm_engine_prefill_ids(e, prompt, T, T - 1, NULL, &last) != 0)
            bail("tdm_engine_prefill_ids");
        for (int r = 0; r < T; r++, checked++) differ += gid[r] != ARGMAX(lg, r) || gid2[r] != gid[r];
        differ += last != gid[T - 1];
        ok(differ == 0 && bits == 0 && tdm_engine_pos(e) == T,
           "%s: greedy ids on the device, %s: %ld of %ld rows differ from the host argmax of the same logits (forward "
           "with and without logits, the step graph both ways, from rows T/2 and 2, the prefill path); %ld logits blocks "
           "fetched with ids differ from the one-call feed's bits", lab, graph ? "graphs on" : "eager (TANDEM_CUDA_GRAPH=off)",
           differ, checked + 1, bits);
        tdm_engine_free(e);
        env_restore("TANDEM_CUDA_GRAPH", saved);
    }
#undef ARGMAX
    free(lg); free(gid); free(gid2);
}

/* An engine of ctx rows made with the switch `name` set to value (the environment as it was after). */
static struct tdm_engine *engine_with(const struct tdm_model *m, int rows, const char *name, const char *value)
{
    char *prev = env_set(name, value);
    struct tdm_engine *e = tdm_engine_new(m, rows);
    env_restore(name, prev);
    if (!e) bail("engine with a switch set");
    return e;
}

/* The FP8 dense MLP's gate, up and SiLU x up as one product (tdm_matmul_swiglu, FP8's nt 2 form from
 * the blocked copy at 1-16 rows), which the shipped tables leave unused on the tiny shapes: with an FP8
 * table of nt 2 settings for the MLP's (I, H) (TANDEM_TILES, t/tiletest.h), the layer's pair runs as
 * one at 1 and 5 rows from the blocked copy (and not without it); engines with TANDEM_MLP_FUSE=on and
 * =off give the prompt (5-row calls) and step logits of the shipped tables' T-row call (lg), bit for
 * bit. */
static void test_fp8_mlp_fused(const struct tdm_model *m, const char *lab, const int32_t *prompt, int T, const int32_t *gref,
                               int S, const float *lg, float *tw, int rows)
{
    const int V = m->cfg.vocab, H = m->cfg.hidden;
    const int64_t shape[1][2] = {{m->cfg.intermediate, H}};
    struct tdm_device_info info;
    char arch[16], dir[64];
    struct tdm_tiles *tl = NULL;
    if (tdm_cuda_device_info(0, &info) != 0) bail("device");
    tdm_tiles_arch(info.sm_major, info.sm_minor, arch, sizeof arch);
    if (fp8_nt2_tables(arch, shape, 1, dir, &tl) != 0) bail("an FP8 table with nt 2");
    struct tdm_dweight g, u;
    if (tdm_dweight_upload(&m->layers[0].mlp.gate, &g) != 0 || tdm_dweight_upload(&m->layers[0].mlp.up, &u) != 0)
        bail("upload");
    uint16_t *xn = dal((size_t)5 * H * 2), *xnb = dal((size_t)tdm_mm_xb_elems(H) * 2 + 16);
    ok(tdm_matmul_swiglu_ok(&g, &u, xn, H, xnb, 1, tl) && tdm_matmul_swiglu_ok(&g, &u, xn, H, xnb, 5, tl) &&
       !tdm_matmul_swiglu_ok(&g, &u, xn, H, NULL, 1, tl), "%s: with an FP8 table of nt 2 for %lldx%d the MLP's gate and up "
       "run as one product at 1 and 5 rows from the blocked copy, not without it", lab, (long long)shape[0][0], H);
    tdm_cuda_free(xn);
    tdm_cuda_free(xnb);
    tdm_dweight_free(&g);
    tdm_dweight_free(&u);
    tdm_tiles_free(tl);
    char *prev = env_set("TANDEM_TILES", dir);
    static const char *fuse[2] = {"on", "off"};
    for (int f = 0; f < 2; f++) {
        struct tdm_engine *e = engine_with(m, rows, "TANDEM_MLP_FUSE", fuse[f]);
        memset(tw, 0xff, (size_t)rows * V * 4);
        if (run_engine(e, prompt, T, gref, S, 5, tw, V) != 0) bail("engine forward (an FP8 table with nt 2)");
        tdm_engine_free(e);
        long diff = 0;
        for (size_t i = 0; i < (size_t)rows * V; i++) diff += memcmp(&tw[i], &lg[i], 4) != 0;
        ok(diff == 0, "%s: an FP8 table with nt 2 for the MLP, TANDEM_MLP_FUSE=%s, prompt in 5-row calls + %d steps: %ld of %ld "
           "logits differ from the shipped tables' %d-row call (bit for bit)", lab, fuse[f], S - 1, diff, (long)rows * V, T);
    }
    env_restore("TANDEM_TILES", prev);
    fp8_nt2_tables_remove(arch, dir);
}

static void test_fixture(const char *fix, const char *model, const char *fmt)
{
    char dir[4096], path[4096];
    snprintf(dir, sizeof dir, "%s/%s/%s", fix, model, fmt);
    struct tdm_model *m = tdm_model_load(dir);
    if (!m) bail("model");
    const int V = m->cfg.vocab;
    snprintf(path, sizeof path, "%s/%s/ref-%s.safetensors", fix, model, fmt);
    struct tdm_stfile *rf = tdm_st_open(path);
    if (!rf) bail("fixture");
    int64_t T64, S64;
    const float *rl = ref_tensor(rf, "logits", &T64, V), *rs = ref_tensor(rf, "step_logits", &S64, V);
    const int T = (int)T64, S = (int)S64;
    int32_t *prompt, *gref;
    int np, ng;
    snprintf(path, sizeof path, "%s/%s/prompt.tok", fix, model);
    if (tdm_tokens_read(path, V, 0, &prompt, &np) || np != T) bail("prompt");
    snprintf(path, sizeof path, "%s/%s/greedy-%s.tok", fix, model, fmt);
    if (tdm_tokens_read(path, V, 0, &gref, &ng) || ng != S) bail("greedy ids");
    const int rows = T + S - 1;

    char lab[160];
    snprintf(lab, sizeof lab, "%s/%s", model, fmt);
    struct tdm_engine *e = tdm_engine_new(m, rows);
    ok(e != NULL, "%s: engine set up (ctx %d)%s%s", lab, rows, e ? "" : ": ", e ? "" : tdm_err());
    if (!e) { tdm_st_close(rf); tdm_model_free(m); return; }

    float *lg = hal((size_t)rows * V * 4), *cpu = hal((size_t)rows * V * 4), *tw = hal((size_t)rows * V * 4);
    if (run_engine(e, prompt, T, gref, S, 0, lg, V) != 0) bail("engine forward");

    /* the CPU reference on the same feed; its router margins at every position */
    struct tdm_ref *r = tdm_ref_new(m, rows);
    if (tdm_ref_forward(r, prompt, T, 0, cpu, NULL, NULL) != 0) bail("reference forward");
    for (int i = 0; i + 1 < S; i++)
        if (tdm_ref_forward(r, &gref[i], 1, 0, cpu + (size_t)(T + i) * V, NULL, NULL) != 0) bail("reference forward");
    float *gaps = hal((size_t)rows * sizeof *gaps);
    memcpy(gaps, tdm_ref_router_gaps(r, 0), (size_t)rows * sizeof *gaps);
    tdm_ref_free(r);
    int *skip = hal((size_t)rows * sizeof *skip), nskip, nclear, first_differ;

    /* the fixture: prompt rows, then step row i = the row after i forced ids (row 0: the last prompt row) */
    const float *steps = lg + (size_t)(T - 1) * V;
    char what[320];
    snprintf(what, sizeof what, "%s prompt vs the fixture", lab);
    double ep = rel_err_excused(what, lg, rl, T, V, gaps, FIX_BOUND, skip, &nskip);
    ok(ep <= FIX_BOUND && nskip * 8 <= T, "%s: prompt logits (%d rows) vs the fixture: relative error %.2e <= %.0e (%d rows "
       "excused at routing near ties)", lab, T, ep, FIX_BOUND, nskip);
    snprintf(what, sizeof what, "%s steps vs the fixture", lab);
    double es = rel_err_excused(what, steps, rs, S, V, gaps + T - 1, FIX_BOUND, skip, &nskip);
    ok(es <= FIX_BOUND && nskip * 8 <= S, "%s: step logits (%d rows, teacher forcing) vs the fixture: relative error %.2e <= "
       "%.0e (%d rows excused at routing near ties)", lab, S, es, FIX_BOUND, nskip);

    snprintf(what, sizeof what, "%s vs the CPU reference", lab);
    double ec = rel_err_excused(what, lg, cpu, rows, V, gaps, CPU_BOUND, skip, &nskip);
    double ecf = tdm_rel_err(cpu, rl, (int64_t)T * V);
    ok(ec <= CPU_BOUND && nskip * 8 <= rows, "%s: all %d rows vs the CPU reference: relative error %.2e <= %.0e (%d rows "
       "excused at routing near ties; CPU reference vs the fixture's prompt: %.2e)", lab, rows, ec, CPU_BOUND, nskip, ecf);
    int t1 = top1_differ(lg, cpu, rows, V, skip, &nclear, &first_differ);
    ok(t1 == 0, "%s: top-1 equal to the CPU reference on all %d of %d rows with margin >= %.2f, excused rows aside (first "
       "differing row %d)", lab, nclear, rows, CLEAR_MARGIN, first_differ);

    /* greedy: the engine's choice at each step against the fixture's ids */
    int32_t *own = hal((size_t)S * sizeof *own);
    float *margins = hal((size_t)S * sizeof *margins);
    for (int i = 0; i < S; i++) {
        own[i] = tdm_argmax(steps + (size_t)i * V, V);
        margins[i] = tdm_margin(rs + (size_t)i * V, V);
    }
    int checked, differ = tdm_greedy_compare(own, gref, margins, S, CLEAR_MARGIN, &checked);
    int first = -1;
    for (int i = 0; i < S && first < 0; i++)
        if (own[i] != gref[i]) first = i;
    ok(differ < 0, "%s: greedy ids equal to the fixture's for the %d steps before its first near tie (of %d steps)", lab,
       checked, S);
    if (first >= 0)
        printf("# %s: first differing greedy step %d: engine %d, fixture %d; fixture margin %.4f, engine margin %.4f\n", lab,
               first, own[first], gref[first], margins[first], tdm_margin(steps + (size_t)first * V, V));
    else
        printf("# %s: all %d greedy ids equal to the fixture's\n", lab, S);

    /* row invariance: one-row calls and 5-row calls against the one T-row call, bit for bit */
    const int modes[2] = {1, 5};
    for (int k = 0; k < 2; k++) {
        memset(tw, 0xff, (size_t)rows * V * 4);
        if (run_engine(e, prompt, T, gref, S, modes[k], tw, V) != 0) bail("engine forward");
        long diff = 0;
        for (size_t i = 0; i < (size_t)rows * V; i++) diff += memcmp(&tw[i], &lg[i], 4) != 0;
        ok(diff == 0, "%s: prompt in %s calls + %d steps: %ld of %ld logits differ from the %d-row call (bit for bit)", lab,
           modes[k] == 1 ? "one-row" : "5-row", S - 1, diff, (long)rows * V, T);
    }

    /* qwen3_5: in_proj_b and in_proj_a as two products (TANDEM_GDN_FUSE_BA=off) against one */
    if (m->cfg.arch != TDM_ARCH_QWEN3_NEXT) {
        const int H = m->cfg.hidden, Hv = m->cfg.gdn_v_heads;
        const int same = tdm_mm_kchains(2 * Hv, H) == tdm_mm_kchains(Hv, H);
        struct tdm_engine *e2 = engine_with(m, rows, "TANDEM_GDN_FUSE_BA", "off");
        memset(tw, 0xff, (size_t)rows * V * 4);
        if (run_engine(e2, prompt, T, gref, S, 0, tw, V) != 0) bail("engine forward (TANDEM_GDN_FUSE_BA=off)");
        tdm_engine_free(e2);
        long diff = 0;
        for (size_t i = 0; i < (size_t)rows * V; i++) diff += memcmp(&tw[i], &lg[i], 4) != 0;
        snprintf(what, sizeof what, "%s two b/a products vs the CPU reference", lab);
        double e2c = rel_err_excused(what, tw, cpu, rows, V, gaps, CPU_BOUND, skip, &nskip);
        if (same)
            ok(diff == 0, "%s: in_proj_b and in_proj_a as two products (TANDEM_GDN_FUSE_BA=off): %ld of %ld logits differ "
               "from one product's (bit for bit: kchains %d for %dx%d and %dx%d)", lab, diff, (long)rows * V,
               tdm_mm_kchains(Hv, H), 2 * Hv, H, Hv, H);
        else
            ok(e2c <= CPU_BOUND && nskip * 8 <= rows, "%s: in_proj_b and in_proj_a as two products (TANDEM_GDN_FUSE_BA=off) "
               "vs the CPU reference: relative error %.2e <= %.0e (%ld logits differ from one product's: kchains %d vs %d)",
               lab, e2c, CPU_BOUND, diff, tdm_mm_kchains(2 * Hv, H), tdm_mm_kchains(Hv, H));
    }
    if (m->cfg.arch != TDM_ARCH_QWEN3_NEXT && m->layers[0].mlp.gate.fmt == TDM_W_FP8)
        test_fp8_mlp_fused(m, lab, prompt, T, gref, S, lg, tw, rows);
    test_ids(m, lab, prompt, T, gref, S, lg);

    /* the prefill path: the prompt as one chunk through tdm_engine_prefill (the wide GEMM and the
     * flash prefill attention past 32 rows), then the forced steps: close to the CPU reference, not
     * the bits of the M-row kernels */
    if (tdm_engine_reset(e) != 0) bail("engine reset");
    memset(tw, 0xff, (size_t)rows * V * 4);
    if (tdm_engine_prefill(e, prompt, T, 0, tw) != 0) bail("engine prefill");
    for (int i = 0; i + 1 < S; i++)
        if (tdm_engine_forward(e, &gref[i], 1, 0, tw + (size_t)(T + i) * V) != 0) bail("engine forward");
    snprintf(what, sizeof what, "%s prefill path vs the CPU reference", lab);
    double epf = rel_err_excused(what, tw, cpu, rows, V, gaps, CPU_BOUND, skip, &nskip);
    ok(epf <= CPU_BOUND && nskip * 8 <= rows && tdm_engine_pos(e) == rows,
       "%s: prefill path (%d rows in chunks of %d) + %d steps vs the CPU reference: relative error %.2e <= %.0e (%d rows "
       "excused at routing near ties)", lab, T, tdm_engine_prefill_rows(e), S - 1, epf, CPU_BOUND, nskip);

    /* MoE: the prompt in one chunk (the experts' grouped form, TANDEM_MOE_GROUPED=on, the default)
     * as above; with TANDEM_MOE_GROUPED=off in 32-row chunks through the per-pair expert kernels: both
     * within the same bound of the CPU reference */
    int n_moe = 0;
    for (int i = 0; i < m->cfg.n_layers; i++) n_moe += m->layers[i].is_moe;
    if (n_moe) {
        ok(T > 32 && tdm_engine_prefill_rows(e) == rows, "%s: TANDEM_MOE_GROUPED=on: prefill chunks of %d rows (ctx %d), "
           "the %d-row prompt in one chunk through the grouped experts", lab, tdm_engine_prefill_rows(e), rows, T);
        struct tdm_engine *e3 = engine_with(m, rows, "TANDEM_MOE_GROUPED", "off");
        memset(tw, 0xff, (size_t)rows * V * 4);
        if (tdm_engine_prefill(e3, prompt, T, 0, tw) != 0) bail("engine prefill (TANDEM_MOE_GROUPED=off)");
        for (int i = 0; i + 1 < S; i++)
            if (tdm_engine_forward(e3, &gref[i], 1, 0, tw + (size_t)(T + i) * V) != 0) bail("engine forward");
        snprintf(what, sizeof what, "%s prefill path, TANDEM_MOE_GROUPED=off, vs the CPU reference", lab);
        const double eoff = rel_err_excused(what, tw, cpu, rows, V, gaps, CPU_BOUND, skip, &nskip);
        ok(eoff <= CPU_BOUND && nskip * 8 <= rows && tdm_engine_prefill_rows(e3) == 32,
           "%s: TANDEM_MOE_GROUPED=off: prefill path (%d rows in chunks of %d) + %d steps vs the CPU reference: relative "
           "error %.2e <= %.0e (%d rows excused at routing near ties; grouped: %.2e)", lab, T,
           tdm_engine_prefill_rows(e3), S - 1, eoff, CPU_BOUND, nskip, epf);
        tdm_engine_free(e3);
    }

    /* context overflow: refused, nothing consumed */
    const int pos = tdm_engine_pos(e);
    int rc = tdm_engine_forward(e, gref, 2, 0, tw);
    ok(rc != 0 && strstr(tdm_err(), "context full") && tdm_engine_pos(e) == pos,
       "%s: 2 tokens at position %d of ctx %d refused (\"%s\"), position unchanged", lab, pos, rows, rc ? tdm_err() : "accepted");

    tdm_engine_free(e);
    free(lg); free(cpu); free(tw); free(own); free(margins); free(prompt); free(gref); free(gaps); free(skip);
    tdm_st_close(rf);
    tdm_model_free(m);
}

int main(void)
{
    if (tdm_cuda_device_count() < 1) skip_all("no CUDA device visible");
    struct tdm_device_info info;
    if (tdm_cuda_device_info(0, &info) != 0) bail("device");
    printf("# %s, sm_%d%d\n", info.name, info.sm_major, info.sm_minor);
    test_embed();
    test_silu_mul();
    test_rows_compact();
    char arch[16];
    tdm_tiles_arch(info.sm_major, info.sm_minor, arch, sizeof arch);
    if (tdm_tiles_load(NULL, arch, &tiles) != 0) bail("tile tables");
    test_cat_products();
    tdm_tiles_free(tiles);
    const char *fix = tdm_setting("TANDEM_FIXTURES");
    char probe[4096];
    struct stat sb;
    const char *models[2] = {"qwen35-tiny", "qwen3next-tiny"}, *fmts[3] = {"bf16", "fp8", "nvfp4"};
    for (int j = 0; j < 2; j++) {
        snprintf(probe, sizeof probe, "%s/%s", fix, models[j]);
        if (stat(probe, &sb) != 0) {
            ok(1, "# SKIP fixture %s not found in %s (set TANDEM_FIXTURES)", models[j], fix);
            continue;
        }
        for (int i = 0; i < 3; i++) test_fixture(fix, models[j], fmts[i]);
    }
    return done_testing();
}
