#include "linear.h"
#include "err.h"
#include "formats.h"
#include "parallel.h"
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Each format's name (settings, JSON) and its title in messages, in enum order. */
static const struct { const char *name, *title; } wfmt_names[TDM_W_COUNT] = {
    {"bf16", "BF16"}, {"f32", "F32"}, {"fp8", "FP8"}, {"nvfp4", "NVFP4"},
};

const char *tdm_wfmt_name(enum tdm_wfmt f) { return f < TDM_W_COUNT ? wfmt_names[f].name : "?"; }
const char *tdm_wfmt_title(enum tdm_wfmt f) { return f < TDM_W_COUNT ? wfmt_names[f].title : "?"; }

int64_t tdm_wfmt_code_bytes(enum tdm_wfmt fmt, int64_t n, int64_t k)
{
    switch (fmt) {
    case TDM_W_BF16: return n * k * 2;
    case TDM_W_F32: return n * k * 4;
    case TDM_W_FP8: return n * k;
    case TDM_W_NVFP4: return n * (k / 2);
    default: return -1;
    }
}

int64_t tdm_wfmt_scale_bytes(enum tdm_wfmt fmt, enum tdm_dtype sdt, int64_t n, int64_t k)
{
    const int64_t B = TDM_FP8_BLOCK;
    switch (fmt) {
    case TDM_W_FP8: return ((n + B - 1) / B) * ((k + B - 1) / B) * (int64_t)tdm_dtype_size(sdt);
    case TDM_W_NVFP4: return n * (k / TDM_NVFP4_GROUP);
    default: return 0;
    }
}

int64_t tdm_qweight_scale_bytes(const struct tdm_qweight *w) { return tdm_wfmt_scale_bytes(w->fmt, w->scale_dt, w->n, w->k); }

int64_t tdm_qweight_bytes(const struct tdm_qweight *w)
{
    const int64_t codes = tdm_wfmt_code_bytes(w->fmt, w->n, w->k);
    return codes < 0 ? 0 : codes + tdm_qweight_scale_bytes(w);
}

void tdm_qweight_row(const struct tdm_qweight *w, int64_t r, float *out)
{
    const int64_t k = w->k, row = w->row0 + r;
    switch (w->fmt) {
    case TDM_W_BF16: {
        const uint16_t *p = (const uint16_t *)w->w + row * k;
        for (int64_t c = 0; c < k; c++) out[c] = tdm_bf16_to_f32(p[c]);
        break;
    }
    case TDM_W_F32: {
        const float *p = (const float *)w->w + row * k;
        for (int64_t c = 0; c < k; c++) out[c] = p[c];
        break;
    }
    case TDM_W_FP8: {
        const uint8_t *p = (const uint8_t *)w->w + row * k;
        const int64_t nb = (k + TDM_FP8_BLOCK - 1) / TDM_FP8_BLOCK, sb = row / TDM_FP8_BLOCK * nb;
        for (int64_t c0 = 0; c0 < k; c0 += TDM_FP8_BLOCK) {
            const float sc = tdm_scale_at(w->scale, w->scale_dt, sb + c0 / TDM_FP8_BLOCK);
            for (int64_t c = c0; c < k && c < c0 + TDM_FP8_BLOCK; c++) out[c] = tdm_e4m3_to_f32(p[c]) * sc;
        }
        break;
    }
    case TDM_W_NVFP4: {
        const uint8_t *p = (const uint8_t *)w->w + row * (k / 2);
        const uint8_t *s = (const uint8_t *)w->scale + row * (k / TDM_NVFP4_GROUP);
        for (int64_t g = 0; g < k / TDM_NVFP4_GROUP; g++) {
            /* e2m1 x e4m3 is exact in FP32; scale2 applies to that product (as the kernels do).
             * One table of the 16 codes' values per group. */
            float sc = tdm_e4m3_to_f32(s[g]), val[16];
            for (int i = 0; i < 16; i++) val[i] = tdm_e2m1_to_f32((uint8_t)i) * sc * w->scale2;
            for (int64_t c = g * TDM_NVFP4_GROUP; c < (g + 1) * TDM_NVFP4_GROUP; c += 2) {
                out[c] = val[p[c / 2] & 15];
                out[c + 1] = val[p[c / 2] >> 4];
            }
        }
        break;
    }
    default: break;
    }
}

struct tdm_qweight tdm_qweight_rows(const struct tdm_qweight *w, int64_t r0, int64_t n)
{
    struct tdm_qweight v = *w;
    v.row0 = w->row0 + r0;
    v.n = n;
    return v;
}

int tdm_qweight_cat_exact(const struct tdm_qweight *a, const struct tdm_qweight *b)
{
    const int64_t B = TDM_FP8_BLOCK;
    if (a->fmt != b->fmt || a->k != b->k || a->k < 1 || a->n < 1 || b->n < 1 || a->row0 < 0 || b->row0 < 0) return 0;
    switch (a->fmt) {
    case TDM_W_BF16:
    case TDM_W_F32: return 1;
    case TDM_W_NVFP4: return a->k % TDM_NVFP4_GROUP == 0 && a->scale2 == b->scale2;
    case TDM_W_FP8:
        return a->scale_dt == b->scale_dt && a->row0 % B == 0 && a->n % B == 0 && b->row0 % B == 0;
    default: return 0;
    }
}

int tdm_qweight_cat(const struct tdm_qweight *a, const struct tdm_qweight *b, struct tdm_qweight *out, void **buf)
{
    *buf = NULL;
    if (!tdm_qweight_cat_exact(a, b))
        return tdm_errf("%s %" PRId64 "x%" PRId64 " and %s %" PRId64 "x%" PRId64 ": rows that do not concatenate "
                        "exactly (format, k, NVFP4 scale_2 or FP8 128-row blocks)",
                        tdm_wfmt_name(a->fmt), a->n, a->k, tdm_wfmt_name(b->fmt), b->n, b->k);
    const int64_t k = a->k, n = a->n + b->n, rb = tdm_wfmt_code_bytes(a->fmt, 1, k);
    /* scale rows: NVFP4 one per weight row (k/16 e4m3); FP8 one per 128 rows (ceil(k/128) of scale_dt) */
    int64_t sa = 0, sb = 0, s_row = 0, s_a0 = 0, s_b0 = 0;
    if (a->fmt == TDM_W_NVFP4) {
        s_row = k / TDM_NVFP4_GROUP;
        sa = a->n, sb = b->n, s_a0 = a->row0, s_b0 = b->row0;
    } else if (a->fmt == TDM_W_FP8) {
        const int64_t B = TDM_FP8_BLOCK;
        s_row = (k + B - 1) / B * (int64_t)tdm_dtype_size(a->scale_dt);
        sa = a->n / B, sb = (b->n + B - 1) / B, s_a0 = a->row0 / B, s_b0 = b->row0 / B;
    }
    const int64_t wbytes = n * rb, soff = (wbytes + 15) / 16 * 16, sbytes = (sa + sb) * s_row;
    char *p = malloc((size_t)(soff + sbytes > 0 ? soff + sbytes : 1));
    if (!p) return tdm_errf("%" PRId64 "x%" PRId64 " %s weight: out of host memory", n, k, tdm_wfmt_name(a->fmt));
    memcpy(p, (const char *)a->w + a->row0 * rb, (size_t)(a->n * rb));
    memcpy(p + a->n * rb, (const char *)b->w + b->row0 * rb, (size_t)(b->n * rb));
    if (sbytes) {
        memcpy(p + soff, (const char *)a->scale + s_a0 * s_row, (size_t)(sa * s_row));
        memcpy(p + soff + sa * s_row, (const char *)b->scale + s_b0 * s_row, (size_t)(sb * s_row));
    }
    *out = *a;
    out->n = n;
    out->row0 = 0;
    out->w = p;
    out->scale = sbytes ? p + soff : NULL;
    *buf = p;
    return 0;
}

float tdm_dot(const float *a, const float *b, int64_t n)
{
    /* Eight interleaved partial sums, added in a fixed order: deterministic and vectorisable. */
    float p[8] = {0};
    int64_t c = 0;
    for (; c + 8 <= n; c += 8)
        for (int j = 0; j < 8; j++) p[j] += a[c + j] * b[c + j];
    for (; c < n; c++) p[0] += a[c] * b[c];
    return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
}

void tdm_linear_ref(const struct tdm_qweight *w, const float *x, int64_t m, float *y)
{
    float *row = malloc((size_t)w->k * sizeof *row);
    if (!row) abort();
    for (int64_t r = 0; r < w->n; r++) {
        tdm_qweight_row(w, r, row);
        for (int64_t i = 0; i < m; i++) {
            const float *xi = x + i * w->k;
            y[i * w->n + r] = tdm_dot(xi, row, w->k);
        }
    }
    free(row);
}

/* ---- requantization (tdm_qweight_to_nvfp4, tdm_qweight_to_fp8) ---- */

struct requant_job {
    const struct tdm_qweight *w;
    struct tdm_qweight *out;
    pthread_mutex_t mu;  /* oom */
    int oom;
};

/* A range's buffer of `rows` dequantized rows (k floats each); NULL, with oom set, out of memory. */
static float *requant_buf(struct requant_job *j, int64_t rows)
{
    float *buf = malloc((size_t)rows * (size_t)j->w->k * sizeof(float));
    if (!buf) {
        pthread_mutex_lock(&j->mu);
        j->oom = 1;
        pthread_mutex_unlock(&j->mu);
    }
    return buf;
}

/* Row r of the stored weight as floats (tdm_parallel_amax's row source). */
static void qweight_row(void *w, int64_t r, float *out) { tdm_qweight_row(w, r, out); }

static void nvfp4_rows(void *ctx, int64_t r0, int64_t r1)
{
    struct requant_job *j = ctx;
    const int64_t k = j->w->k, G = TDM_NVFP4_GROUP;
    float *row = requant_buf(j, 1), s2;
    if (!row) return;
    for (int64_t r = r0; r < r1; r++) {
        tdm_qweight_row(j->w, r, row);
        tdm_nvfp4_quantize(row, 1, k, j->out->scale2, (uint8_t *)j->out->w + r * (k / 2),
                           (uint8_t *)j->out->scale + r * (k / G), &s2);
    }
    free(row);
}

/* The requantized matrix's host storage (out's bytes by tdm_qweight_bytes) and the job over it run
 * by fn on `threads` threads over `units` (rows or row blocks); 0 with *buf, or -1 with tdm_err(). */
static int requant_run(const struct tdm_qweight *w, struct tdm_qweight *out, void **buf, int threads, int64_t units,
                       void (*fn)(void *, int64_t, int64_t))
{
    /* the codes, then the scales from a 16-byte boundary (FP8's are floats) */
    const int64_t scales = tdm_qweight_scale_bytes(out), codes = tdm_qweight_bytes(out) - scales;
    const int64_t soff = (codes + 15) / 16 * 16;
    uint8_t *mem = malloc((size_t)(soff + scales));
    if (!mem) return tdm_errf("out of memory requantizing a %" PRId64 " x %" PRId64 " weight", w->n, w->k);
    out->w = mem;
    out->scale = mem + soff;
    struct requant_job j = {.w = w, .out = out};
    pthread_mutex_init(&j.mu, NULL);
    if (out->fmt == TDM_W_NVFP4) {
        float amax = 0.0f;
        j.oom = tdm_parallel_amax(threads, w->n, w->k, qweight_row, (void *)w, &amax) != 0;
        out->scale2 = tdm_nvfp4_scale2(amax);   /* tdm_nvfp4_quantize's, over the whole view */
    }
    if (!j.oom) tdm_parallel_rows(threads, units, 1, fn, &j);
    pthread_mutex_destroy(&j.mu);
    if (j.oom) {
        free(mem);
        return tdm_errf("out of memory requantizing a %" PRId64 " x %" PRId64 " weight", w->n, w->k);
    }
    *buf = mem;
    return 0;
}

int tdm_qweight_to_nvfp4(const struct tdm_qweight *w, struct tdm_qweight *out, void **buf, int threads)
{
    const int64_t G = TDM_NVFP4_GROUP;
    *buf = NULL;
    if (w->k % G) return tdm_errf("NVFP4 needs the input size %" PRId64 " to be a multiple of %d", w->k, (int)G);
    *out = (struct tdm_qweight){.fmt = TDM_W_NVFP4, .n = w->n, .k = w->k, .scale_dt = TDM_DT_F8_E4M3};
    return requant_run(w, out, buf, threads, w->n, nvfp4_rows);
}

/* Row blocks [b0, b1) of 128 rows: dequantized, then tdm_fp8_quantize's codes and scales for them. */
static void fp8_blocks(void *ctx, int64_t b0, int64_t b1)
{
    struct requant_job *j = ctx;
    const int64_t n = j->w->n, k = j->w->k, B = TDM_FP8_BLOCK, nb = (k + B - 1) / B;
    float *rows = requant_buf(j, B);
    if (!rows) return;
    for (int64_t b = b0; b < b1; b++) {
        const int64_t r0 = b * B, nr = n - r0 < B ? n - r0 : B;
        for (int64_t r = 0; r < nr; r++) tdm_qweight_row(j->w, r0 + r, rows + r * k);
        tdm_fp8_quantize(rows, nr, k, 0, (uint8_t *)j->out->w + r0 * k, (float *)j->out->scale + b * nb, TDM_DT_F32);
    }
    free(rows);
}

int tdm_qweight_to_fp8(const struct tdm_qweight *w, struct tdm_qweight *out, void **buf, int threads)
{
    const int64_t B = TDM_FP8_BLOCK;
    *buf = NULL;
    *out = (struct tdm_qweight){.fmt = TDM_W_FP8, .n = w->n, .k = w->k, .scale_dt = TDM_DT_F32};
    return requant_run(w, out, buf, threads, (w->n + B - 1) / B, fp8_blocks);
}
