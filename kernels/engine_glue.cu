// engine_glue.cu — the CUDA engine's glue (engine_glue.h): embedding gather, SiLU * up, stream copies,
// a tree commit's row gather.
#include "engine_glue.h"
#include "layers_dev.cuh"
#include "cuda_check.h"

using namespace tdm_ly;

namespace {

constexpr int GLUE_THREADS = 256;

// Block (r, c): row ids[r] of the table into h[r], EMBED_UNIT values a thread. vec (the table's rows, h's
// rows 16-byte aligned, H a multiple of EMBED_UNIT): one 16-byte load (BF16) or two (F32) and one 16-byte
// store a thread, so that a row is one round trip to memory (the element-wise copy it replaces
// took ~9 us for a 5120-wide row, each load waiting for the store before it).
constexpr int EMBED_UNIT = 8;
__device__ __forceinline__ uint32_t bf16_pair(float lo, float hi) { return f2bf(lo) | (uint32_t)f2bf(hi) << 16; }
__global__ void __launch_bounds__(GLUE_THREADS)
embed_rows_kernel(const void *__restrict__ table, int table_f32, int64_t V, int H, const int32_t *__restrict__ ids,
                  uint16_t *__restrict__ h, int vec)
{
    const int r = blockIdx.x;
    const int64_t id = ids[r];
    uint16_t *hr = h + (size_t)r * H;
    const int i0 = (blockIdx.y * GLUE_THREADS + threadIdx.x) * EMBED_UNIT;
    if (i0 >= H) return;
    const int i1 = min(i0 + EMBED_UNIT, H);
    if (id < 0 || id >= V) {
        for (int i = i0; i < i1; i++) hr[i] = 0x7fc0;  // BF16 NaN
        return;
    }
    if (vec && table_f32) {
        const float4 *t = reinterpret_cast<const float4 *>((const float *)table + (size_t)id * H + i0);
        const float4 a = __ldg(t), b = __ldg(t + 1);
        *reinterpret_cast<uint4 *>(hr + i0) = make_uint4(bf16_pair(a.x, a.y), bf16_pair(a.z, a.w), bf16_pair(b.x, b.y),
                                                         bf16_pair(b.z, b.w));
    } else if (vec) {
        *reinterpret_cast<uint4 *>(hr + i0) =
            __ldg(reinterpret_cast<const uint4 *>((const uint16_t *)table + (size_t)id * H + i0));
    } else if (table_f32) {
        const float *t = (const float *)table + (size_t)id * H;
        for (int i = i0; i < i1; i++) hr[i] = f2bf(t[i]);
    } else {
        const uint16_t *t = (const uint16_t *)table + (size_t)id * H;
        for (int i = i0; i < i1; i++) hr[i] = t[i];
    }
}

// One thread an element: ref.c's bf(bf(siluf(g)) * u).
__global__ void __launch_bounds__(GLUE_THREADS)
silu_mul_kernel(const uint16_t *g, const uint16_t *u, int64_t n, int64_t I, uint16_t *out, uint16_t *outb)
{
    const int64_t i = (int64_t)blockIdx.x * GLUE_THREADS + threadIdx.x;
    if (i >= n) return;
    const uint16_t v = swiglu_ref(bf2f(g[i]), bf2f(u[i]));   // BF16 inputs: its roundings of them change nothing
    out[i] = v;
    xb_put(outb, (int)(i / I), i % I, I, v);
}

// Thread c: column c of rows t = 0..n-1 in order, each from row path[t] >= t (not yet written).
__global__ void __launch_bounds__(GLUE_THREADS)
rows_compact_kernel(uint16_t *rows, int64_t ld, int W, int base, const int32_t *d_base, const int32_t *path, int n)
{
    const int c = blockIdx.x * GLUE_THREADS + threadIdx.x;
    if (c >= W) return;
    uint16_t *r0 = rows + (size_t)(d_base ? *d_base : base) * ld + c;
    for (int t = 0; t < n; t++) {
        const int src = path[t];
        if (src != t) r0[(size_t)t * ld] = r0[(size_t)src * ld];
    }
}

}  // namespace

extern "C" int tdm_embed_rows(const void *table, int table_f32, int64_t V, int H, const int32_t *ids, int M,
                              uint16_t *h, void *stream)
{
    if (M < 0 || H <= 0 || V <= 0 || !table || !ids || !h)
        return tdm_errf("tdm_embed_rows: bad arguments (M %d, H %d, V %lld)", M, H, (long long)V);
    if (M == 0) return 0;
    const int vec = H % EMBED_UNIT == 0 && (uintptr_t)table % 16 == 0 && (uintptr_t)h % 16 == 0;
    const unsigned parts = (unsigned)((H + GLUE_THREADS * EMBED_UNIT - 1) / (GLUE_THREADS * EMBED_UNIT));
    embed_rows_kernel<<<dim3((unsigned)M, parts), GLUE_THREADS, 0, (cudaStream_t)stream>>>(table, table_f32, V, H, ids,
                                                                                           h, vec);
    TDM_LAUNCH_CHECK();
    return 0;
}

extern "C" int tdm_silu_mul(const uint16_t *g, const uint16_t *u, int64_t I, int M, uint16_t *out, uint16_t *outb,
                            void *stream)
{
    if (M < 0 || I <= 0 || !g || !u || !out)
        return tdm_errf("tdm_silu_mul: bad arguments (M %d, I %lld)", M, (long long)I);
    if (xb_refused("tdm_silu_mul", outb, M)) return -1;
    const int64_t n = (int64_t)M * I;
    if (n == 0) return 0;
    const int64_t blocks = (n + GLUE_THREADS - 1) / GLUE_THREADS;
    if (blocks > 0x7fffffff) return tdm_errf("tdm_silu_mul: %lld values are too many", (long long)n);
    silu_mul_kernel<<<(unsigned)blocks, GLUE_THREADS, 0, (cudaStream_t)stream>>>(g, u, n, I, out, outb);
    TDM_LAUNCH_CHECK();
    return 0;
}

extern "C" int tdm_copy_async(void *dst, const void *src, size_t bytes, void *stream)
{
    if (bytes == 0) return 0;
    TDM_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, (cudaStream_t)stream));
    return 0;
}

extern "C" int tdm_copy2d_async(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows,
                                void *stream)
{
    if (width == 0 || rows == 0) return 0;
    if (dpitch < width || spitch < width)
        return tdm_errf("tdm_copy2d_async: pitches %zu, %zu below the width %zu", dpitch, spitch, width);
    TDM_CUDA_TRY(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDefault, (cudaStream_t)stream));
    return 0;
}

extern "C" int tdm_rows_compact(uint16_t *rows, int64_t ld, int W, int base, const int32_t *d_base, const int32_t *path,
                                int n, void *stream)
{
    if (n < 0 || W <= 0 || ld < W || base < 0 || !rows || !path)
        return tdm_errf("tdm_rows_compact: bad arguments (n %d, W %d, ld %lld, base %d)", n, W, (long long)ld, base);
    if (n == 0) return 0;
    rows_compact_kernel<<<(W + GLUE_THREADS - 1) / GLUE_THREADS, GLUE_THREADS, 0, (cudaStream_t)stream>>>(rows, ld, W, base,
                                                                                                          d_base, path, n);
    TDM_LAUNCH_CHECK();
    return 0;
}
