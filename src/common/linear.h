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
/* Its name in messages: BF16, F32, FP8, NVFP4. */
const char *tdm_wfmt_title(enum tdm_wfmt f);

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

/* The stored sizes of an n x k matrix in format fmt, the one place they are spelled: its codes
 * (BF16 2 bytes a value, F32 4, FP8 1, NVFP4 k / 2 a row; -1 for a format without codes) and its
 * scales (FP8: one sdt value per 128 x 128 block; NVFP4: one e4m3 byte per 16 values of a row; 0
 * for the rest). */
int64_t tdm_wfmt_code_bytes(enum tdm_wfmt fmt, int64_t n, int64_t k);
int64_t tdm_wfmt_scale_bytes(enum tdm_wfmt fmt, enum tdm_dtype sdt, int64_t n, int64_t k);
/* Bytes a kernel must read to stream the view once (weights and scales). */
int64_t tdm_qweight_bytes(const struct tdm_qweight *w);
/* The part of those that are its scales (FP8 blocks, NVFP4 groups; 0 for BF16 and F32): the codes
 * come first, tdm_qweight_bytes - this many. */
int64_t tdm_qweight_scale_bytes(const struct tdm_qweight *w);
/* Dequantized row r of the view (k floats). */
void tdm_qweight_row(const struct tdm_qweight *w, int64_t r, float *out);
/* A view of rows [r0, r0+n) of w. */
struct tdm_qweight tdm_qweight_rows(const struct tdm_qweight *w, int64_t r0, int64_t n);
/* Whether a's rows followed by b's make one stored matrix with the same dequantized rows, so that
 * one product over it gives both: the same format and k, and scales that stay with their rows.
 * BF16 and F32: always. NVFP4: the group scales are per row; the global scale_2 multiplies every
 * sum, so both must have the same one (different ones would need the group scales requantized,
 * not exact). FP8: a 128x128 block scale is shared by 128 rows, so a's rows must be whole blocks
 * (row0 and n multiples of 128), b must start at a block boundary, and the scales one type (a
 * 48-row in_proj_b is not: its block would need two scales). */
int tdm_qweight_cat_exact(const struct tdm_qweight *a, const struct tdm_qweight *b);
/* That matrix [a.n + b.n, k], row0 0: a's stored rows, then b's, with their scales (NVFP4: the
 * common scale_2). Its storage is host memory in *buf (free() it after use; out points into it).
 * Returns 0, or -1 with tdm_err() saying why (not exact, out of memory). */
int tdm_qweight_cat(const struct tdm_qweight *a, const struct tdm_qweight *b, struct tdm_qweight *out, void **buf);
/* w requantized to NVFP4: its dequantized rows through tdm_nvfp4_quantize with the scale_2 of the
 * whole view (its largest magnitude / (448 * 6)), the bytes those would give over the view as one
 * matrix, rows quantized on `threads` threads (<= 1: one). out is [w.n, w.k], row0 0; its storage
 * is host memory in *buf (free() it after use). Needs k a multiple of 16. Returns 0, or -1 with
 * tdm_err() (k, out of memory). An approximation of w, not w: for a drafter, whose tokens the
 * verify checks. */
int tdm_qweight_to_nvfp4(const struct tdm_qweight *w, struct tdm_qweight *out, void **buf, int threads);
/* w requantized to block FP8: its dequantized rows through tdm_fp8_quantize, 128x128 blocks with F32
 * scales (not rounded), the bytes those would give over the view as one matrix, blocks of 128 rows on
 * `threads` threads. Storage, return and purpose as tdm_qweight_to_nvfp4's (any k). */
int tdm_qweight_to_fp8(const struct tdm_qweight *w, struct tdm_qweight *out, void **buf, int threads);
/* The FP32 dot product every reference sum uses (fixed order). */
float tdm_dot(const float *a, const float *b, int64_t n);
/* y[m][n] = sum_k x[m][k] * W[n][k] in FP32 (x holds BF16-valued floats by convention). */
void tdm_linear_ref(const struct tdm_qweight *w, const float *x, int64_t m, float *y);
#ifdef __cplusplus
}
#endif
#endif
