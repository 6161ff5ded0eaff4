/* The row concatenation of two stored weights (linear.h: tdm_qweight_cat_exact, tdm_qweight_cat),
 * which the CUDA engine uploads as one weight for qwen3_5's in_proj_b and in_proj_a:
 *   exact cases: BF16 and F32 (any rows), NVFP4 with one scale_2, FP8 when the first part is whole
 *     128-row blocks and the second starts on a block: every row of the result dequantizes to the
 *     parts' rows bit for bit (a's, then b's), views into larger matrices included (row0 > 0), and
 *     the result reads as many bytes as the two parts;
 *   refused: another format or k, NVFP4 with two scale_2, FP8 48-row parts (the 27B's in_proj_b
 *     and in_proj_a stored FP8) and FP8 with two scale types: tdm_qweight_cat_exact 0, and
 *     tdm_qweight_cat -1 with a message. */
#include "err.h"
#include "formats.h"
#include "linear.h"
#include "tap.h"
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x2545f4914f6cdd1dull;
static float frand(void) /* uniform in [-1, 1) */
{
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float)((rng >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

/* A stored matrix of `rows` rows in fmt, from random floats; the view is all of it. */
struct stored {
    struct tdm_qweight q;
    void *w, *scale;
};
static void make(struct stored *s, enum tdm_wfmt fmt, int64_t rows, int64_t k, enum tdm_dtype sdt, float scale2)
{
    memset(s, 0, sizeof *s);
    float *f = malloc((size_t)(rows * k) * sizeof *f);
    if (!f) abort();
    for (int64_t i = 0; i < rows * k; i++) f[i] = frand() * (1 + (i % 5));
    s->q.fmt = fmt;
    s->q.n = rows;
    s->q.k = k;
    s->q.scale_dt = sdt;
    const int64_t B = TDM_FP8_BLOCK, nb = (k + B - 1) / B, rb = (rows + B - 1) / B;
    switch (fmt) {
    case TDM_W_BF16: {
        uint16_t *w = malloc((size_t)(rows * k) * 2);
        for (int64_t i = 0; i < rows * k; i++) w[i] = tdm_f32_to_bf16(f[i]);
        s->w = w;
        break;
    }
    case TDM_W_F32:
        s->w = f;
        f = NULL;
        break;
    case TDM_W_FP8:
        s->w = malloc((size_t)(rows * k));
        s->scale = malloc((size_t)(rb * nb) * (sdt == TDM_DT_BF16 ? 2 : 4));
        tdm_fp8_quantize(f, rows, k, 0, s->w, s->scale, sdt);
        break;
    case TDM_W_NVFP4:
        s->w = malloc((size_t)(rows * k / 2));
        s->scale = malloc((size_t)(rows * k / TDM_NVFP4_GROUP));
        tdm_nvfp4_quantize(f, rows, k, scale2, s->w, s->scale, &s->q.scale2);
        break;
    default: abort();
    }
    free(f);
    s->q.w = s->w;
    s->q.scale = s->scale;
}
static void unmake(struct stored *s) { free(s->w); free(s->scale); }

/* a's rows then b's, read back row by row against the parts, bit for bit; the byte count. */
static void check_cat(const char *label, const struct tdm_qweight *a, const struct tdm_qweight *b)
{
    struct tdm_qweight c;
    void *buf = NULL;
    const int exact = tdm_qweight_cat_exact(a, b);
    const int rc = exact ? tdm_qweight_cat(a, b, &c, &buf) : -1;
    ok(exact && rc == 0, "%s: concatenates exactly%s%s", label, rc ? ": " : "", rc ? tdm_err() : "");
    if (rc) return;
    const int64_t k = a->k;
    float *got = malloc((size_t)k * sizeof *got), *want = malloc((size_t)k * sizeof *want);
    long bad = 0;
    for (int64_t r = 0; r < c.n; r++) {
        tdm_qweight_row(&c, r, got);
        if (r < a->n) tdm_qweight_row(a, r, want);
        else tdm_qweight_row(b, r - a->n, want);
        bad += memcmp(got, want, (size_t)k * sizeof *got) != 0;
    }
    ok(bad == 0 && c.n == a->n + b->n && c.row0 == 0 && c.k == k && c.fmt == a->fmt,
       "%s: %lld rows [%lld + %lld] x %lld, %ld rows differ from the parts' (bit for bit)", label, (long long)c.n,
       (long long)a->n, (long long)b->n, (long long)k, bad);
    ok(tdm_qweight_bytes(&c) == tdm_qweight_bytes(a) + tdm_qweight_bytes(b),
       "%s: reads %lld bytes, the parts %lld + %lld", label, (long long)tdm_qweight_bytes(&c),
       (long long)tdm_qweight_bytes(a), (long long)tdm_qweight_bytes(b));
    free(got);
    free(want);
    free(buf);
}

static void check_refused(const char *label, const struct tdm_qweight *a, const struct tdm_qweight *b, const char *why)
{
    struct tdm_qweight c;
    void *buf = (void *)1;
    const int exact = tdm_qweight_cat_exact(a, b);
    const int rc = tdm_qweight_cat(a, b, &c, &buf);
    ok(!exact && rc != 0 && buf == NULL && strstr(tdm_err(), "do not concatenate"), "%s: refused (%s): \"%s\"", label, why,
       rc ? tdm_err() : "accepted");
}

int main(void)
{
    struct stored b, a, big, x;
    /* BF16: the 27B's in_proj_b and in_proj_a (48 x 5120), and the tiny fixture's (6 x 256) */
    make(&b, TDM_W_BF16, 48, 5120, TDM_DT_F32, 0);
    make(&a, TDM_W_BF16, 48, 5120, TDM_DT_F32, 0);
    check_cat("bf16 48x5120 + 48x5120", &b.q, &a.q);
    unmake(&b); unmake(&a);
    make(&b, TDM_W_BF16, 6, 256, TDM_DT_F32, 0);
    make(&a, TDM_W_BF16, 6, 256, TDM_DT_F32, 0);
    check_cat("bf16 6x256 + 6x256", &b.q, &a.q);
    /* views into a larger stored matrix */
    make(&big, TDM_W_BF16, 40, 256, TDM_DT_F32, 0);
    struct tdm_qweight v1 = tdm_qweight_rows(&big.q, 3, 7), v2 = tdm_qweight_rows(&big.q, 20, 11);
    check_cat("bf16 views rows 3..9 and 20..30 of 40x256", &v1, &v2);
    check_cat("bf16 a view then a whole tensor", &v2, &b.q);
    /* refusals: another k, another format */
    make(&x, TDM_W_BF16, 6, 272, TDM_DT_F32, 0);
    check_refused("bf16 6x256 + 6x272", &b.q, &x.q, "k differs");
    unmake(&x);
    make(&x, TDM_W_F32, 6, 256, TDM_DT_F32, 0);
    check_refused("bf16 6x256 + f32 6x256", &b.q, &x.q, "formats differ");
    check_cat("f32 6x256 + f32 6x256", &x.q, &x.q);
    unmake(&x); unmake(&b); unmake(&a); unmake(&big);

    /* NVFP4: one scale_2 concatenates (group scales are per row); two do not */
    make(&b, TDM_W_NVFP4, 48, 512, TDM_DT_F32, 0.0125f);
    make(&a, TDM_W_NVFP4, 48, 512, TDM_DT_F32, 0.0125f);
    check_cat("nvfp4 48x512 + 48x512, one scale_2", &b.q, &a.q);
    make(&big, TDM_W_NVFP4, 64, 512, TDM_DT_F32, 0.0125f);
    v1 = tdm_qweight_rows(&big.q, 5, 30);
    check_cat("nvfp4 a view rows 5..34 of 64x512 + 48x512", &v1, &a.q);
    unmake(&a);
    make(&a, TDM_W_NVFP4, 48, 512, TDM_DT_F32, 0.0250f);
    check_refused("nvfp4 48x512 + 48x512, two scale_2", &b.q, &a.q, "scale_2 differs");
    unmake(&b); unmake(&a); unmake(&big);

    /* FP8: whole 128-row blocks concatenate; 48-row parts and mixed scale types do not */
    for (int bf = 0; bf < 2; bf++) {
        const enum tdm_dtype sdt = bf ? TDM_DT_BF16 : TDM_DT_F32;
        char lab[96];
        make(&b, TDM_W_FP8, 128, 520, sdt, 0);
        make(&a, TDM_W_FP8, 100, 520, sdt, 0);
        snprintf(lab, sizeof lab, "fp8 (%s scales) 128x520 + 100x520 (a partial last block)", bf ? "BF16" : "F32");
        check_cat(lab, &b.q, &a.q);
        make(&big, TDM_W_FP8, 400, 520, sdt, 0);
        v1 = tdm_qweight_rows(&big.q, 128, 256);
        v2 = tdm_qweight_rows(&big.q, 384, 16);
        snprintf(lab, sizeof lab, "fp8 (%s scales) views rows 128..383 and 384..399 of 400x520", bf ? "BF16" : "F32");
        check_cat(lab, &v1, &v2);
        v2 = tdm_qweight_rows(&big.q, 100, 170);
        snprintf(lab, sizeof lab, "fp8 (%s scales) 128x520 + a view from row 100", bf ? "BF16" : "F32");
        check_refused(lab, &b.q, &v2, "the second part starts inside a block");
        unmake(&b); unmake(&a); unmake(&big);
    }
    make(&b, TDM_W_FP8, 48, 5120, TDM_DT_F32, 0);
    make(&a, TDM_W_FP8, 48, 5120, TDM_DT_F32, 0);
    check_refused("fp8 48x5120 + 48x5120 (the 27B's in_proj_b and in_proj_a stored FP8)", &b.q, &a.q,
                  "a 128-row scale block would hold rows of both");
    unmake(&a);
    make(&x, TDM_W_FP8, 128, 512, TDM_DT_F32, 0);
    make(&a, TDM_W_FP8, 128, 512, TDM_DT_BF16, 0);
    check_refused("fp8 128x512 F32 scales + 128x512 BF16 scales", &x.q, &a.q, "scale types differ");
    unmake(&x); unmake(&a); unmake(&b);
    return done_testing();
}
