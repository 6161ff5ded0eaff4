/* linear.h — a projection weight as stored in the checkpoint, in any of the four formats, and the
 * CPU reference product y = x W^T that every matrix kernel's check() answers to. */
#ifndef TDM_LINEAR_H
#define TDM_LINEAR_H
#include <stdint.h>
#include "dtype.h"
#ifdef __cplusplus
extern "C" {
#endif

enum tdm_wfmt {
    TDM_W_BF16,   /* w: BF16 [rows, k] */
    TDM_W_F32,    /* w: F32 [rows, k] */
    TDM_W_FP8,    /* w: e4m3 [rows, k]; scale: F32 or BF16 [ceil(rows/128), ceil(k/128)] */
    TDM_W_NVFP4,  /* w: U8 [rows, k/2], even k in the low nibble; scale: e4m3 [rows, k/16]; scale2 */
    TDM_W_COUNT
};
const char *tdm_wfmt_name(enum tdm_wfmt f);

/* A weight view: n output rows starting at stored row row0 of the matrix at w (so that a fused
 * [gate; up] tensor yields two views whose FP8 scale blocks still line up with the stored rows). */
struct tdm_qweight {
    enum tdm_wfmt fmt;
    int64_t n, k;          /* this view: n outputs, k inputs */
    int64_t row0;          /* first stored row of the view */
    const void *w;         /* the stored matrix (row 0) */
    const void *scale;     /* FP8 block scales / NVFP4 group scales of the stored matrix */
    enum tdm_dtype scale_dt;
    float scale2;          /* NVFP4 global scale */
};

/* Bytes a kernel must read to stream the view once (weights and scales). */
int64_t tdm_qweight_bytes(const struct tdm_qweight *w);
/* Dequantized row r of the view (k floats). */
void tdm_qweight_row(const struct tdm_qweight *w, int64_t r, float *out);
/* A view of rows [r0, r0+n) of w. */
struct tdm_qweight tdm_qweight_rows(const struct tdm_qweight *w, int64_t r0, int64_t n);
/* The FP32 dot product every reference sum uses (fixed order). */
float tdm_dot(const float *a, const float *b, int64_t n);
/* y[m][n] = sum_k x[m][k] * W[n][k] in FP32 (x holds BF16-valued floats by convention). */
void tdm_linear_ref(const struct tdm_qweight *w, const float *x, int64_t m, float *y);
#ifdef __cplusplus
}
#endif
#endif
