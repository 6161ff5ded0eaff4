/* Number formats: known values, round-to-nearest-even, saturation, and quantize/dequantize
 * round trips for block FP8 and NVFP4. */
#include "formats.h"
#include "linear.h"
#include "tap.h"
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void) /* uniform in [-1, 1) */
{
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float)((rng >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

/* A requantizer `to` of src on 1, 3 and 64 threads against the stored bits in want (its format,
 * scale type and scale_2, codes of wbytes and scales of sbytes) and a size of `bytes`: one check a
 * thread count, named by what. */
static void requant_threads(int (*to)(const struct tdm_qweight *, struct tdm_qweight *, void **, int),
                            const struct tdm_qweight *src, const struct tdm_qweight *want, size_t wbytes, size_t sbytes,
                            int64_t bytes, const char *what)
{
    const int threads[] = {1, 3, 64};
    for (int t = 0; t < 3; t++) {
        struct tdm_qweight q;
        void *buf = NULL;
        const int rc = to(src, &q, &buf, threads[t]);
        ok(rc == 0 && q.fmt == want->fmt && q.n == src->n && q.k == src->k && q.row0 == 0 && q.scale_dt == want->scale_dt &&
               q.scale2 == want->scale2 && !memcmp(q.w, want->w, wbytes) && !memcmp(q.scale, want->scale, sbytes) &&
               tdm_qweight_bytes(&q) == bytes,
           "requantized to %s on %d thread(s): %s", tdm_wfmt_title(want->fmt), threads[t], what);
        free(buf);
    }
}

int main(void)
{
    /* BF16 */
    ok(tdm_f32_to_bf16(1.0f) == 0x3f80, "bf16(1.0) = 0x3f80");
    ok(tdm_bf16r(1.0f + 1.0f / 256) == 1.0f, "bf16: 1+2^-8 ties to even (1.0)");
    ok(tdm_bf16r(1.0f + 3.0f / 256) == 1.0f + 4.0f / 256, "bf16: 1+3*2^-8 ties to even (1+2^-6)");
    ok(isnan(tdm_bf16r(NAN)), "bf16: NaN stays NaN");
    /* e4m3 known values */
    ok(tdm_e4m3_to_f32(0x7e) == 448.0f, "e4m3 0x7e = 448");
    ok(tdm_e4m3_to_f32(0x01) == ldexpf(1, -9), "e4m3 0x01 = 2^-9 (smallest subnormal)");
    ok(tdm_e4m3_to_f32(0x38) == 1.0f, "e4m3 0x38 = 1");
    ok(tdm_e4m3_to_f32(0xb8) == -1.0f, "e4m3 0xb8 = -1");
    ok(isnan(tdm_e4m3_to_f32(0x7f)), "e4m3 0x7f is NaN");
    ok(tdm_f32_to_e4m3(1000.0f) == 0x7e, "e4m3 saturates 1000 to 448");
    ok(tdm_f32_to_e4m3(1.0625f) == 0x38, "e4m3: 1+1/16 ties to even (1.0)");
    ok(tdm_f32_to_e4m3(1.1875f) == 0x3a, "e4m3: 1+3/16 ties to even (1.25)");
    int all = 1;
    for (int c = 0; c < 256; c++)
        if ((c & 0x7f) != 0x7f && tdm_f32_to_e4m3(tdm_e4m3_to_f32((uint8_t)c)) != c && c != 0x80) all = 0;
    ok(all, "e4m3: every finite code round-trips");
    /* tdm_f32_to_e4m3 reads the code off the float's bits: against the nearest of the 126 finite
     * magnitudes by a plain scan (ties to the even code, saturation at 448) for every BF16 value and
     * 2^20 other floats (every 2^32 pattern agreed with the search it replaced, once, outside CI) */
    {
        int bad = 0;
        for (uint32_t i = 0; i < (1u << 16) + (1u << 20); i++) {
            uint32_t u = i << 16;
            if (i >= (1u << 16)) {
                rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                u = (uint32_t)(rng >> 32);
            }
            float f;
            memcpy(&f, &u, 4);
            if (isnan(f)) continue;
            const float a = fabsf(f);
            int best = 0;
            for (int c = 1; c < 127; c++) {
                const float dc = fabsf(tdm_e4m3_to_f32((uint8_t)c) - a), db = fabsf(tdm_e4m3_to_f32((uint8_t)best) - a);
                if (dc < db || (dc == db && !(c & 1))) best = c;
            }
            if (a >= 448.0f) best = 126;
            if (tdm_f32_to_e4m3(f) != ((signbit(f) ? 0x80 : 0) | best)) bad++;
        }
        ok(bad == 0, "e4m3: the nearest code (ties to even, saturating) for every BF16 value and 2^20 other floats (%d differ)", bad);
    }
    /* e2m1 */
    const float e2m1[8] = {0, .5f, 1, 1.5f, 2, 3, 4, 6};
    all = 1;
    for (int c = 0; c < 16; c++)
        if (tdm_e2m1_to_f32((uint8_t)c) != (c & 8 ? -e2m1[c & 7] : e2m1[c & 7])) all = 0;
    ok(all, "e2m1: the value table");
    ok(tdm_f32_to_e2m1(2.5f) == 4, "e2m1: 2.5 ties to even (2)");
    ok(tdm_f32_to_e2m1(5.0f) == 6, "e2m1: 5 ties to even (4)");
    ok(tdm_f32_to_e2m1(0.75f) == 2, "e2m1: 0.75 ties to even (1)");
    ok(tdm_f32_to_e2m1(-7.0f) == 15, "e2m1: -7 saturates to -6");
    ok(tdm_f32_to_e2m1(0.26f) == 1, "e2m1: 0.26 rounds to 0.5");

    /* Block FP8 round trip: error within half an e4m3 step of each block's scale. */
    enum { N = 300, K = 200 };
    static float w[N * K], row[K];
    for (int i = 0; i < N * K; i++) w[i] = frand() * (1 + (i % 7));
    static uint8_t codes[N * K];
    static float scales[3 * 2];
    for (int pow2 = 0; pow2 < 2; pow2++) {
        tdm_fp8_quantize(w, N, K, pow2 ? 1 : 0, codes, scales, TDM_DT_F32);
        struct tdm_qweight q = {.fmt = TDM_W_FP8, .n = N, .k = K, .w = codes, .scale = scales, .scale_dt = TDM_DT_F32};
        double worst = 0;
        for (int r = 0; r < N; r++) {
            tdm_qweight_row(&q, r, row);
            for (int c = 0; c < K; c++) {
                double e = fabs(row[c] - w[r * K + c]) / fmax(fabs(w[r * K + c]), 1e-3);
                if (fabs(w[r * K + c]) > 0.05 && e > worst) worst = e;
            }
        }
        ok(worst <= 1.0 / 16 + 1e-6, "fp8 round trip (pow2=%d): worst relative error %.4f <= 1/16", pow2, worst);
        int p2 = 1;
        for (int i = 0; i < 6 && pow2; i++) p2 &= frexpf(scales[i], &(int){0}) == 0.5f;
        if (pow2) ok(p2, "fp8: power-of-two scales are powers of two");
    }
    static uint16_t bscales[6];
    tdm_fp8_quantize(w, N, K, 0, codes, bscales, TDM_DT_BF16);
    struct tdm_qweight qb = {.fmt = TDM_W_FP8, .n = N, .k = K, .w = codes, .scale = bscales, .scale_dt = TDM_DT_BF16};
    tdm_qweight_row(&qb, 257, row);
    ok(fabsf(row[190] - w[257 * K + 190]) <= fabsf(w[257 * K + 190]) / 8 + 0.02f, "fp8 with BF16 scales, partial edge block");

    ok(tdm_round_up_bits(0.3f, 1) == 0.5f && tdm_round_up_bits(0.3f, 2) == 0.375f && tdm_round_up_bits(-5.0f, 2) == -6.0f &&
       tdm_round_up_bits(0.75f, 2) == 0.75f && tdm_round_up_bits(1.0f, 4) == 1.0f, "round up to significant bits");
    /* 4-bit block scales make every dequantized FP8 weight exact in BF16 */
    tdm_fp8_quantize(w, N, K, 4, codes, scales, TDM_DT_F32);
    {
        struct tdm_qweight q = {.fmt = TDM_W_FP8, .n = N, .k = K, .w = codes, .scale = scales, .scale_dt = TDM_DT_F32};
        int exact = 1;
        for (int r = 0; r < N; r += 7) {
            tdm_qweight_row(&q, r, row);
            for (int c = 0; c < K; c++) exact &= tdm_bf16r(row[c]) == row[c];
        }
        ok(exact, "fp8 with 4-bit scales: dequantized weights are exact in BF16");
    }

    /* NVFP4 round trip and a known value. */
    static uint8_t packed[N * K / 2], gsc[N * K / 16];
    float s2;
    enum { K4 = 192 };
    tdm_nvfp4_quantize(w, N, K4, 0.0f, packed, gsc, &s2);
    struct tdm_qweight q4 = {.fmt = TDM_W_NVFP4, .n = N, .k = K4, .w = packed, .scale = gsc, .scale2 = s2};
    double num = 0, den = 0;
    for (int r = 0; r < N; r++) {
        tdm_qweight_row(&q4, r, row);
        for (int c = 0; c < K4; c++) {
            num += (row[c] - w[r * K4 + c]) * (double)(row[c] - w[r * K4 + c]);
            den += (double)w[r * K4 + c] * w[r * K4 + c];
        }
    }
    ok(sqrt(num / den) < 0.12, "nvfp4 round trip: relative error %.4f < 0.12", sqrt(num / den));
    float one[16] = {6, -3, 1.5f, 0, 0.5f, 2, 4, 1, 6, 6, 6, 6, 6, 6, 6, -6};
    uint8_t p1[8], s1[1];
    tdm_nvfp4_quantize(one, 1, 16, 1.0f, p1, s1, &s2);
    ok(s1[0] == 0x38 && p1[0] == (7 | (0xd << 4)) && p1[1] == (3 | (0 << 4)), "nvfp4: exact values, scale 1, nibble order");
    struct tdm_qweight q1 = {.fmt = TDM_W_NVFP4, .n = 1, .k = 16, .w = p1, .scale = s1, .scale2 = 0.75f};
    tdm_qweight_row(&q1, 0, row);
    ok(row[1] == -2.25f && row[15] == -4.5f, "nvfp4: scale2 applies (non-power-of-two 0.75)");

    /* Requantization to NVFP4 (tdm_qweight_to_nvfp4, the drafter's TANDEM_DRAFT_FORMAT=nvfp4): the
     * bytes tdm_nvfp4_quantize gives for the dequantized view as one matrix, whatever the thread
     * count; from a BF16 view that starts past row 0; k not a multiple of 16 is an error. */
    {
        enum { RN = 37, RK = 96, R0 = 5 };
        static uint16_t wb[(RN + R0) * RK];
        static float wf[RN * RK];
        static uint8_t pk[RN * RK / 2], sc[RN * RK / 16];
        for (int i = 0; i < (RN + R0) * RK; i++) wb[i] = tdm_f32_to_bf16(frand() * 3.0f);
        struct tdm_qweight src = {.fmt = TDM_W_BF16, .n = RN, .k = RK, .row0 = R0, .w = wb};
        for (int r = 0; r < RN; r++) tdm_qweight_row(&src, r, wf + r * RK);
        float want_s2;
        tdm_nvfp4_quantize(wf, RN, RK, 0.0f, pk, sc, &want_s2);
        const struct tdm_qweight want = {.fmt = TDM_W_NVFP4, .w = pk, .scale = sc, .scale_dt = TDM_DT_F8_E4M3, .scale2 = want_s2};
        requant_threads(tdm_qweight_to_nvfp4, &src, &want, sizeof pk, sizeof sc, RN * RK / 2 + RN * RK / 16,
                        "tdm_nvfp4_quantize's bytes and scale_2 for the view's rows");
        struct tdm_qweight bad = src, q;
        void *buf = (void *)1;
        bad.k = 40;
        ok(tdm_qweight_to_nvfp4(&bad, &q, &buf, 2) == -1 && buf == NULL, "requantizing to NVFP4 with k = 40 is an error");
    }
    /* Requantization to block FP8 (tdm_qweight_to_fp8, TANDEM_DRAFT_FORMAT=fp8): the bytes
     * tdm_fp8_quantize gives for the dequantized view as one matrix (F32 scales, not rounded), whatever
     * the thread count, from a BF16 view that starts past row 0, with partial blocks in both
     * dimensions; its rows within e4m3's rounding of the view's. */
    {
        enum { FN = 300, FK = 200, F0 = 3, FNB = (FN + 127) / 128, FKB = (FK + 127) / 128 };
        static uint16_t wb[(FN + F0) * FK];
        static float wf[FN * FK], fsc[FNB * FKB], got[FK];
        static uint8_t codes[FN * FK];
        for (int i = 0; i < (FN + F0) * FK; i++) wb[i] = tdm_f32_to_bf16(frand() * 3.0f);
        struct tdm_qweight src = {.fmt = TDM_W_BF16, .n = FN, .k = FK, .row0 = F0, .w = wb};
        for (int r = 0; r < FN; r++) tdm_qweight_row(&src, r, wf + r * FK);
        tdm_fp8_quantize(wf, FN, FK, 0, codes, fsc, TDM_DT_F32);
        const struct tdm_qweight want = {.fmt = TDM_W_FP8, .w = codes, .scale = fsc, .scale_dt = TDM_DT_F32};
        requant_threads(tdm_qweight_to_fp8, &src, &want, sizeof codes, sizeof fsc, FN * FK + FNB * FKB * 4,
                        "tdm_fp8_quantize's codes and F32 block scales for the view's rows");
        struct tdm_qweight q;
        void *buf = NULL;
        const int rc = tdm_qweight_to_fp8(&src, &q, &buf, 1);
        double num = 0, den = 0;
        for (int r = 0; rc == 0 && r < FN; r++) {
            tdm_qweight_row(&q, r, got);
            for (int c = 0; c < FK; c++) {
                num += (double)(got[c] - wf[r * FK + c]) * (got[c] - wf[r * FK + c]);
                den += (double)wf[r * FK + c] * wf[r * FK + c];
            }
        }
        ok(rc == 0 && sqrt(num / den) < 0.04, "FP8 requantization: relative error %.4f < 0.04", sqrt(num / den));
        free(buf);
    }
    return done_testing();
}
