// wide_gemm.cu — the wide path, y = x W^T for more than 32 rows (prefill chunks): a tensor-core
// GEMM that decodes each weight tile once into shared memory for 64 rows at a time.
//
// CTA tile 64 rows x 128 columns x 64 k, 8 warps of 32x32 (wide_tile.cuh's main loop, WM = 2):
// weights decoded exactly to BF16 with the skinny kernels' decoders (mm_layout.h), NVFP4's
// scale_2 * 2^7 applied to the sum here. The CTAs that share a weight tile are adjacent on the grid
// (rows fastest), so a tile streams from memory about once.
// No twin contract: checked by agreement with the CPU reference (t/unit/matmul_gpu.c).
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include "mm_layout.h"
#include "mm_skinny.cuh"
#include "wide_tile.cuh"

namespace {

constexpr int WM = 2;

// The operands of CTA (m0, n0) of y = x W^T: rows m0.. of x, rows n0.. of the view (clamped into it).
template <int FMT>
struct DenseOp {
    const tdm_mm::SkinnyArgs &a;
    int m0, n0, k, rows;
    bool vec, x_vec;
    int64_t rowbytes;
    __device__ const uint16_t *arow(int r) const { return m0 + r < a.m ? a.x + (int64_t)(m0 + r) * a.ldx : nullptr; }
    __device__ int64_t vrow(int j) const { return a.row0 + min(n0 + j, a.n - 1); }
    // weights held tile-major (mm_layout.h: TDM_MM_TILES_FMT; a.order): a row's slab (NVFP4: its 64
    // code bytes, 8 group scales; FP8: its 128 code bytes) every 16 rows' worth
    __device__ bool tiles() const { return TDM_MM_TILES_FMT(FMT) && a.order == TDM_MM_ORDER_TILES; }
    __device__ const uint8_t *brow(int j) const
    {
        if (tiles()) return a.w + tdm_mm_chunk_at(TDM_MM_ORDER_TILES, rowbytes, tdm_mm_chunk_bytes(FMT), vrow(j), 0, 0);
        return a.w + vrow(j) * rowbytes;
    }
    __device__ const uint8_t *bytes_at(const uint8_t *row, int64_t off) const
    {
        return tiles() ? row + tdm_mm_tile_byte_step(off, 4 * tdm_mm_chunk_bytes(FMT)) : row + off;
    }
    __device__ const uint8_t *bgroups(int j) const
    {
        if (tiles()) return a.scale + tdm_mm_scales_at(TDM_MM_ORDER_TILES, a.k, vrow(j), 0, 0);
        return a.scale + vrow(j) * (a.k / 16);
    }
    __device__ uint32_t group_at(const uint8_t *groups, int64_t g) const
    {
        return tiles() ? groups[tdm_mm_tile_group_step(g)] : groups[g];
    }
    __device__ float bscale(int j, int kb) const
    {
        const int64_t idx = (vrow(j) >> 7) * a.slabs + kb;
        return a.scale_bf16 ? __uint_as_float((uint32_t)reinterpret_cast<const uint16_t *>(a.scale)[idx] << 16)
                            : reinterpret_cast<const float *>(a.scale)[idx];
    }
};

template <int FMT>
__global__ void __launch_bounds__(tdm_wide::THREADS) wide_kernel(const tdm_mm::SkinnyArgs a, int vec)
{
    using T = tdm_wide::Tile<FMT, WM>;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int wm = warp % WM, wn = warp / WM;
    const int m0 = blockIdx.x * T::BM, n0 = blockIdx.y * T::BN;
    const DenseOp<FMT> op{a, m0, n0, a.k, a.m - m0, vec != 0, a.x_vec != 0, (int64_t)a.k * T::BPK_NUM / T::BPK_DEN};
    float acc[2][4][4];
    tdm_wide::mainloop<FMT, WM>(op, acc);
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int r = m0 + tdm_wide::tile_row(wm, i, h, g);
                if (r >= a.m) continue;
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int n = n0 + tdm_wide::tile_col(wn, j, e, t);
                    if (n >= a.n) continue;
                    const float v = acc[i][j][2 * h + e] * a.out_scale;
                    if (a.y_f32)
                        reinterpret_cast<float *>(a.y)[(int64_t)r * a.ldy + n] = v;
                    else
                        reinterpret_cast<__nv_bfloat16 *>(a.y)[(int64_t)r * a.ldy + n] = __float2bfloat16_rn(v);
                }
            }
}

}  // namespace

cudaError_t tdm_mm_wide_launch(const tdm_mm::SkinnyArgs &a, int fmt, bool vec, cudaStream_t st)
{
    using T = tdm_wide::Tile<TDM_MMF_BF16, WM>;   // BM, BN are the same for every format
    const dim3 grid((unsigned)((a.m + T::BM - 1) / T::BM), (unsigned)((a.n + T::BN - 1) / T::BN));
    const int v = vec ? 1 : 0;
    switch (fmt) {
    case TDM_MMF_NVFP4: wide_kernel<TDM_MMF_NVFP4><<<grid, tdm_wide::THREADS, 0, st>>>(a, v); break;
    case TDM_MMF_FP8: wide_kernel<TDM_MMF_FP8><<<grid, tdm_wide::THREADS, 0, st>>>(a, v); break;
    default: wide_kernel<TDM_MMF_BF16><<<grid, tdm_wide::THREADS, 0, st>>>(a, v); break;
    }
    return cudaGetLastError();
}
