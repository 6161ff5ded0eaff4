// gemm_cublas.cu — cuBLAS BF16 and cuBLASLt FP8 products with the same shapes and rows as the
// project's kernels: the baselines tandem-benchmm measures in the same run.
#include "matmul.h"
#include "cuda_check.h"
#include "device.h"
#include <cublasLt.h>
#include <cublas_v2.h>
#include <stdlib.h>

struct tdm_cublas {
    cublasHandle_t blas;
    cublasLtHandle_t lt;
    cudaStream_t st;
    void *ws;
    size_t ws_bytes;
    float *one;   // device ONES floats of 1.0f: cuBLASLt's FP8 scales (the values do not change the time)
    // the cached cuBLASLt FP8 plan for the last (n, k, m), block-scaled or per-tensor
    int64_t pn, pk, pm;
    int plan_ok, block;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
};

#define ONES (1 << 18)   // scales for up to 2^18 blocks: every benchmarked shape at 32 rows

#define BLAS_TRY(call)                                                                      \
    do {                                                                                    \
        cublasStatus_t s_ = (call);                                                         \
        if (s_ != CUBLAS_STATUS_SUCCESS) return tdm_errf("cuBLAS: %s: status %d", #call, (int)s_); \
    } while (0)

static void drop_plan(struct tdm_cublas *h)
{
    if (!h->plan_ok) return;
    cublasLtMatmulDescDestroy(h->desc);
    cublasLtMatrixLayoutDestroy(h->la);
    cublasLtMatrixLayoutDestroy(h->lb);
    cublasLtMatrixLayoutDestroy(h->lc);
    h->plan_ok = 0;
}

extern "C" int tdm_cublas_create(struct tdm_cublas **out, void *stream)
{
    struct tdm_cublas *h = (struct tdm_cublas *)calloc(1, sizeof *h);
    if (!h) return tdm_errf("cuBLAS: out of memory");
    *out = h;
    h->st = (cudaStream_t)stream;
    h->ws_bytes = 64u << 20;
    h->pn = h->pk = h->pm = -1;
    TDM_CUDA_TRY(cudaMalloc(&h->ws, h->ws_bytes));
    TDM_CUDA_TRY(cudaMalloc(&h->one, ONES * sizeof(float)));
    float *ones = (float *)malloc(ONES * sizeof(float));
    if (!ones) return tdm_errf("cuBLAS: out of memory");
    for (int i = 0; i < ONES; i++) ones[i] = 1.0f;
    const int rc = tdm_cuda_h2d(h->one, ones, ONES * sizeof(float));   // waits for the copy (device.cu)
    free(ones);
    if (rc != 0) return -1;
    BLAS_TRY(cublasCreate(&h->blas));
    BLAS_TRY(cublasSetStream(h->blas, h->st));
    BLAS_TRY(cublasSetWorkspace(h->blas, h->ws, h->ws_bytes));
    BLAS_TRY(cublasLtCreate(&h->lt));
    return 0;
}

extern "C" void tdm_cublas_destroy(struct tdm_cublas *h)
{
    if (!h) return;
    drop_plan(h);
    if (h->blas) cublasDestroy(h->blas);
    if (h->lt) cublasLtDestroy(h->lt);
    cudaFree(h->ws);
    cudaFree(h->one);
    free(h);
}

// Row-major y[m][n] = x[m][k] W[n][k]^T is column-major Y(n x m) = W^T(op T of a k x n matrix) X.
extern "C" int tdm_cublas_bf16(struct tdm_cublas *h, const uint16_t *w, int64_t n, int64_t k, const uint16_t *x, int64_t m,
                               uint16_t *y)
{
    const float alpha = 1.0f, beta = 0.0f;
    BLAS_TRY(cublasGemmEx(h->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, (int)m, (int)k, &alpha, w, CUDA_R_16BF, (int)k, x,
                          CUDA_R_16BF, (int)k, &beta, y, CUDA_R_16BF, (int)n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return 0;
}

// One plan: block-scaled (the checkpoint's 128x128 weight blocks, 1x128 activation blocks along k,
// F32 scales) or per-tensor. Returns 0, 1 when cuBLASLt has no algorithm, -1 on error.
static int lt_plan(struct tdm_cublas *h, int64_t n, int64_t k, int64_t m, int block)
{
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    if ((n + 127) / 128 * ((k + 127) / 128) > ONES || (k + 127) / 128 * m > ONES) return 1;
    BLAS_TRY(cublasLtMatmulDescCreate(&h->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    BLAS_TRY(cublasLtMatrixLayoutCreate(&h->la, CUDA_R_8F_E4M3, (uint64_t)k, (uint64_t)n, k));
    BLAS_TRY(cublasLtMatrixLayoutCreate(&h->lb, CUDA_R_8F_E4M3, (uint64_t)k, (uint64_t)m, k));
    BLAS_TRY(cublasLtMatrixLayoutCreate(&h->lc, CUDA_R_16BF, (uint64_t)n, (uint64_t)m, n));
    h->plan_ok = 1;
    BLAS_TRY(cublasLtMatmulDescSetAttribute(h->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    BLAS_TRY(cublasLtMatmulDescSetAttribute(h->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (block) {
        const int32_t ma = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, mb = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
        BLAS_TRY(cublasLtMatmulDescSetAttribute(h->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma, sizeof ma));
        BLAS_TRY(cublasLtMatmulDescSetAttribute(h->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb, sizeof mb));
    }
    BLAS_TRY(cublasLtMatmulDescSetAttribute(h->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &h->one, sizeof h->one));
    BLAS_TRY(cublasLtMatmulDescSetAttribute(h->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &h->one, sizeof h->one));
    cublasLtMatmulPreference_t pref;
    BLAS_TRY(cublasLtMatmulPreferenceCreate(&pref));
    BLAS_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &h->ws_bytes,
                                                  sizeof h->ws_bytes));
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(h->lt, h->desc, h->la, h->lb, h->lc, h->lc, pref, 1, &res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (s != CUBLAS_STATUS_SUCCESS || found < 1) {
        drop_plan(h);
        return 1;
    }
    h->algo = res.algo;
    h->block = block;
    return 0;
}

extern "C" int tdm_cublaslt_fp8(struct tdm_cublas *h, const uint8_t *w, int64_t n, int64_t k, const uint8_t *x, int64_t m,
                                uint16_t *y)
{
    if (h->pn != n || h->pk != k || h->pm != m) {
        drop_plan(h);
        h->pn = n;
        h->pk = k;
        h->pm = m;
        int rc = lt_plan(h, n, k, m, 1);
        if (rc == 1) rc = lt_plan(h, n, k, m, 0);
        if (rc < 0) return -1;
    }
    if (!h->plan_ok) return 1;
    const float alpha = 1.0f, beta = 0.0f;
    BLAS_TRY(cublasLtMatmul(h->lt, h->desc, &alpha, w, h->la, x, h->lb, &beta, y, h->lc, y, h->lc, &h->algo, h->ws,
                            h->ws_bytes, h->st));
    return 0;
}

extern "C" int tdm_cublaslt_fp8_block(const struct tdm_cublas *h) { return h->plan_ok && h->block; }
