#include "formats.h"
#include <math.h>

float tdm_f16_to_f32(uint16_t h)
{
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    float v;
    if (e == 0) v = ldexpf((float)m, -24);
    else if (e == 31) v = m ? NAN : INFINITY;
    else v = ldexpf((float)(m | 1024), e - 25);
    return s ? -v : v;
}

float tdm_e4m3_to_f32(uint8_t code)
{
    /* Built from bits (this sits in the reference's inner loops): normal codes move the exponent
     * from bias 7 to bias 127; subnormals are m * 2^-9, exact. */
    uint32_t s = (uint32_t)(code >> 7) << 31, e = (code >> 3) & 15, m = code & 7, u;
    if (e == 15 && m == 7) return NAN;
    float v;
    if (e == 0) {
        v = (float)m * 0x1p-9f;
        return s ? -v : v;
    }
    u = s | (e + 120) << 23 | m << 20;
    memcpy(&v, &u, 4);
    return v;
}

/* Nearest of the magnitudes mag(0..n-1) (ascending in the code), ties to the even code. */
static int nearest_code(float a, float (*mag)(uint8_t), int n)
{
    int lo = 0, hi = n - 1;
    if (a >= mag((uint8_t)hi)) return hi;
    while (hi - lo > 1) { /* mag((uint8_t)lo) <= a < mag((uint8_t)hi) */
        int mid = (lo + hi) / 2;
        if (mag((uint8_t)mid) <= a) lo = mid; else hi = mid;
    }
    float dlo = a - mag((uint8_t)lo), dhi = mag((uint8_t)hi) - a;
    if (dlo < dhi) return lo;
    if (dhi < dlo) return hi;
    return (lo & 1) ? hi : lo;
}

static const float e2m1_mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
static float e2m1_at(uint8_t i) { return e2m1_mag[i]; }

uint8_t tdm_f32_to_e4m3(float f)
{
    if (isnan(f)) return 0x7f;
    const uint8_t sign = signbit(f) ? 0x80 : 0;
    const float a = fabsf(f);
    if (a >= 448.0f) return sign | 126;   /* the largest finite code */
    /* lo: the largest code whose magnitude is <= a, read off a's bits (the requantizers call this for
     * every weight: a search over the codes took ~7 calls a value); then the nearer of lo and lo + 1,
     * ties to the even code: nearest_code's rule over the same magnitudes */
    int lo;
    if (a < 0x1p-6f) {
        lo = (int)(a * 0x1p9f);   /* subnormal codes: m * 2^-9, m = 0..7 */
    } else {
        uint32_t u;
        memcpy(&u, &a, 4);
        lo = (int)(((u >> 23) - 120) << 3 | ((u >> 20) & 7));   /* exponent from bias 127 to 7, 3 mantissa bits */
    }
    const float dlo = a - tdm_e4m3_to_f32((uint8_t)lo), dhi = tdm_e4m3_to_f32((uint8_t)(lo + 1)) - a;
    const int code = dlo < dhi ? lo : dhi < dlo ? lo + 1 : (lo & 1) ? lo + 1 : lo;
    return sign | (uint8_t)code;
}

float tdm_e2m1_to_f32(uint8_t nibble)
{
    float v = e2m1_mag[nibble & 7];
    return (nibble & 8) ? -v : v;
}

uint8_t tdm_f32_to_e2m1(float f)
{
    if (isnan(f)) return 0;
    uint8_t sign = signbit(f) ? 8 : 0;
    return sign | (uint8_t)nearest_code(fabsf(f), e2m1_at, 8);
}

float tdm_scale_at(const void *scales, enum tdm_dtype dt, int64_t i)
{
    if (dt == TDM_DT_BF16) {
        uint16_t h;
        memcpy(&h, (const char *)scales + 2 * i, 2);
        return tdm_bf16_to_f32(h);
    }
    float f;
    memcpy(&f, (const char *)scales + 4 * i, 4);
    return f;
}

static void scale_store(void *scales, enum tdm_dtype dt, int64_t i, float v)
{
    if (dt == TDM_DT_BF16) {
        uint16_t h = tdm_f32_to_bf16(v);
        memcpy((char *)scales + 2 * i, &h, 2);
    } else {
        memcpy((char *)scales + 4 * i, &v, 4);
    }
}

float tdm_round_up_bits(float x, int bits)
{
    if (bits <= 0 || x == 0.0f || !isfinite(x)) return x;
    int e;
    float m = frexpf(fabsf(x), &e);              /* x = m * 2^e, m in [0.5, 1) */
    float q = ceilf(ldexpf(m, bits)), r = ldexpf(q, e - bits);
    return x < 0 ? -r : r;
}

void tdm_fp8_quantize(const float *w, int64_t n, int64_t k, int scale_bits,
                      uint8_t *codes, void *scales, enum tdm_dtype scale_dt)
{
    const int64_t B = TDM_FP8_BLOCK, nb = (k + B - 1) / B;
    for (int64_t bi = 0; bi * B < n; bi++)
        for (int64_t bj = 0; bj < nb; bj++) {
            int64_t r1 = bi * B + B < n ? bi * B + B : n, c1 = bj * B + B < k ? bj * B + B : k;
            float amax = 0.0f;
            for (int64_t r = bi * B; r < r1; r++)
                for (int64_t c = bj * B; c < c1; c++) amax = fmaxf(amax, fabsf(w[r * k + c]));
            float s = amax > 0.0f ? amax / TDM_E4M3_MAX : 1.0f;
            s = tdm_round_up_bits(s, scale_bits);
            scale_store(scales, scale_dt, bi * nb + bj, s);
            s = tdm_scale_at(scales, scale_dt, bi * nb + bj); /* the scale as stored */
            for (int64_t r = bi * B; r < r1; r++)
                for (int64_t c = bj * B; c < c1; c++) codes[r * k + c] = tdm_f32_to_e4m3(w[r * k + c] / s);
        }
}

float tdm_nvfp4_scale2(float amax) { return amax > 0.0f ? amax / (TDM_E4M3_MAX * TDM_E2M1_MAX) : 1.0f; }

void tdm_nvfp4_quantize(const float *w, int64_t n, int64_t k, float scale2,
                        uint8_t *packed, uint8_t *scales, float *scale2_out)
{
    const int64_t G = TDM_NVFP4_GROUP;
    if (scale2 <= 0.0f) {
        float amax = 0.0f;
        for (int64_t i = 0; i < n * k; i++) amax = fmaxf(amax, fabsf(w[i]));
        scale2 = tdm_nvfp4_scale2(amax);
    }
    *scale2_out = scale2;
    for (int64_t r = 0; r < n; r++)
        for (int64_t g = 0; g < k / G; g++) {
            const float *x = w + r * k + g * G;
            float amax = 0.0f;
            for (int j = 0; j < G; j++) amax = fmaxf(amax, fabsf(x[j]));
            uint8_t sc = tdm_f32_to_e4m3(amax / TDM_E2M1_MAX / scale2);
            scales[r * (k / G) + g] = sc;
            float s = tdm_e4m3_to_f32(sc) * scale2;
            for (int j = 0; j < G; j += 2) {
                uint8_t lo = s > 0.0f ? tdm_f32_to_e2m1(x[j] / s) : 0;
                uint8_t hi = s > 0.0f ? tdm_f32_to_e2m1(x[j + 1] / s) : 0;
                packed[r * (k / 2) + (g * G + j) / 2] = (uint8_t)(lo | (hi << 4));
            }
        }
}
