/* formats.h — the number formats of the checkpoints, in C: BF16, e4m3 (FP8), e2m1 (FP4),
 * block FP8 (128x128 scale blocks) and NVFP4 (ModelOpt: 16-element groups with an e4m3 scale and
 * one F32 global scale). Every rounding is to nearest, ties to even. */
#ifndef TDM_FORMATS_H
#define TDM_FORMATS_H
#include <stdint.h>
#include <string.h>
#include "dtype.h"
#ifdef __cplusplus
extern "C" {
#endif

#define TDM_FP8_BLOCK 128   /* block FP8: one scale per 128x128 block of the weight */
#define TDM_NVFP4_GROUP 16  /* NVFP4: one e4m3 scale per 16 consecutive k */
#define TDM_E4M3_MAX 448.0f
#define TDM_E2M1_MAX 6.0f

static inline float tdm_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t tdm_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Rounds an FP32 value to the nearest BF16 value (the "->bf16" of models.md). */
static inline float tdm_bf16r(float f) { return tdm_bf16_to_f32(tdm_f32_to_bf16(f)); }

float tdm_f16_to_f32(uint16_t h);
float tdm_e4m3_to_f32(uint8_t code);   /* OCP e4m3fn: bias 7, no infinities, 0x7f/0xff NaN */
uint8_t tdm_f32_to_e4m3(float f);      /* saturates to +-448; NaN -> 0x7f */
float tdm_e2m1_to_f32(uint8_t nibble); /* bit 3 sign, bits 0-2 index {0,.5,1,1.5,2,3,4,6} */
uint8_t tdm_f32_to_e2m1(float f);      /* saturates to +-6 */

/* Reads element i of a scale tensor stored as F32 or BF16. */
float tdm_scale_at(const void *scales, enum tdm_dtype dt, int64_t i);

/* x rounded up (away from zero) to `bits` significant bits; bits <= 0 returns x. With bits = 1 a
 * power of two. A scale of 4 bits times an e4m3 code (4 bits), or of 2 bits times e2m1 x e4m3
 * (6 bits), is exact in BF16 (8 bits). */
float tdm_round_up_bits(float x, int bits);

/* Block FP8: codes [n,k] e4m3, scales [ceil(n/128), ceil(k/128)] (value = code * scale).
 * scale_bits > 0 rounds each scale up to that many significant bits (1: powers of two, as some
 * releases store them). */
void tdm_fp8_quantize(const float *w, int64_t n, int64_t k, int scale_bits,
                      uint8_t *codes, void *scales, enum tdm_dtype scale_dt);

/* The NVFP4 global scale for a matrix whose largest magnitude is amax: amax / (448 * 6), 1 for 0. */
float tdm_nvfp4_scale2(float amax);
/* NVFP4: packed [n, k/2] (even k in the low nibble), scales [n, k/16] e4m3, global scale2
 * (value = e2m1 * scale * scale2). scale2 <= 0 picks tdm_nvfp4_scale2 of w. k % 16 == 0. */
void tdm_nvfp4_quantize(const float *w, int64_t n, int64_t k, float scale2,
                        uint8_t *packed, uint8_t *scales, float *scale2_out);
#ifdef __cplusplus
}
#endif
#endif
