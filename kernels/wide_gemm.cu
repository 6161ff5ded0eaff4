// wide_gemm.cu — the wide path, y = x W^T for more than 32 rows (prefill chunks): a tensor-core
// GEMM that decodes each weight tile once into shared memory for 64 rows at a time.
//
// CTA tile 64 rows x 128 columns x 64 k, 8 warps of 32x32, mma.m16n8k16 BF16 -> FP32 with
// ldmatrix fragments. Weights are decoded exactly to BF16 with the skinny kernels' decoders
// (mm_layout.h): NVFP4 as e2m1 * scale * 2^-7 (scale_2 * 2^7 applied to the sum), FP8 as the code
// value with the 128x128 block scale applied to each block's partial sum. The CTAs that share a
// weight tile are adjacent on the grid (rows fastest), so a tile streams from memory about once.
// No twin contract: checked by agreement with the CPU reference (t/unit/matmul_gpu.c).
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>
#include "mm_layout.h"
#include "mm_skinny.cuh"

namespace {

constexpr int BM = 64, BN = 128, BK = 64, LDS_K = BK + 8;   // row stride 144 bytes: ldmatrix conflict-free
constexpr int THREADS = 256;

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const __nv_bfloat16 *p)
{
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

// Bytes [0, valid) of a 16-byte chunk, zero past it.
__device__ __forceinline__ uint4 load16(const uint8_t *p, int64_t valid, bool vec)
{
    if (vec && valid >= 16) return *reinterpret_cast<const uint4 *>(p);
    uint32_t w[4] = {0, 0, 0, 0};
    for (int b = 0; b < 16; b++)
        if (b < valid) w[b >> 2] |= (uint32_t)p[b] << (8 * (b & 3));
    return make_uint4(w[0], w[1], w[2], w[3]);
}

template <int FMT>
struct WideTile {
    // per thread: NVFP4 one 16-byte chunk (32 k) + its two group scales; FP8 two 16-byte chunks
    // (2 x 16 k); BF16 four 16-byte chunks (4 x 8 k)
    static constexpr int CHUNKS = FMT == TDM_MMF_NVFP4 ? 1 : FMT == TDM_MMF_FP8 ? 2 : 4;
    static constexpr int KPC = FMT == TDM_MMF_NVFP4 ? 32 : FMT == TDM_MMF_FP8 ? 16 : 8;   // k per chunk
    static constexpr int BPK_NUM = FMT == TDM_MMF_BF16 ? 2 : 1, BPK_DEN = FMT == TDM_MMF_NVFP4 ? 2 : 1;
};

template <int FMT>
__global__ void __launch_bounds__(THREADS) wide_kernel(const tdm_mm::SkinnyArgs a, int vec)
{
    __shared__ __align__(16) __nv_bfloat16 As[BM][LDS_K];
    __shared__ __align__(16) __nv_bfloat16 Bs[BN][LDS_K];
    using WT = WideTile<FMT>;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int wm = warp & 1, wn = warp >> 1;   // warp tile rows 32*wm, columns 32*wn
    const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
    const int ktiles = (a.k + BK - 1) / BK;
    const int64_t rowbytes = (int64_t)a.k * WT::BPK_NUM / WT::BPK_DEN;

    float acc[2][4][4], blk[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[i][j][c] = blk[i][j][c] = 0.0f;

    uint4 xa[2], wb[WT::CHUNKS];
    uint32_t wsc = 0;
    auto gload = [&](int kt) {
        const int64_t kbase = (int64_t)kt * BK;
#pragma unroll
        for (int i = 0; i < 2; i++) {   // activations: 64 rows x 8 chunks of 8 k
            const int id = tid + i * THREADS, r = id >> 3, c = id & 7;
            const int64_t kk = kbase + 8 * c;
            xa[i] = make_uint4(0, 0, 0, 0);
            if (m0 + r < a.m) {
                const uint16_t *p = a.x + (int64_t)(m0 + r) * a.ldx + kk;
                if (a.x_vec && kk + 8 <= a.k) {
                    xa[i] = *reinterpret_cast<const uint4 *>(p);
                } else {
                    uint32_t v[4] = {0, 0, 0, 0};
                    for (int e = 0; e < 8; e++)
                        if (kk + e < a.k) v[e >> 1] |= (uint32_t)p[e] << (16 * (e & 1));
                    xa[i] = make_uint4(v[0], v[1], v[2], v[3]);
                }
            }
        }
#pragma unroll
        for (int i = 0; i < WT::CHUNKS; i++) {   // weights: 128 rows x (64 / KPC) chunks
            const int id = tid + i * THREADS, per_row = BK / WT::KPC, r = id / per_row, c = id % per_row;
            const int vrow = min(n0 + r, a.n - 1);
            const int64_t off = (kbase + (int64_t)c * WT::KPC) * WT::BPK_NUM / WT::BPK_DEN;
            wb[i] = load16(a.w + (a.row0 + vrow) * rowbytes + off, rowbytes - off, vec);
            if constexpr (FMT == TDM_MMF_NVFP4) {
                const int64_t srow = a.k / 16, so = (kbase + (int64_t)c * 32) / 16;
                const uint8_t *s = a.scale + (a.row0 + vrow) * srow + so;
                wsc = (so < srow ? s[0] : 0u) | (so + 1 < srow ? (uint32_t)s[1] << 8 : 0u);
            }
        }
    };
    auto sstore = [&]() {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int id = tid + i * THREADS, r = id >> 3, c = id & 7;
            *reinterpret_cast<uint4 *>(&As[r][8 * c]) = xa[i];
        }
#pragma unroll
        for (int i = 0; i < WT::CHUNKS; i++) {
            const int id = tid + i * THREADS, per_row = BK / WT::KPC, r = id / per_row, c = id % per_row;
            uint32_t q[4] = {wb[i].x, wb[i].y, wb[i].z, wb[i].w};
            uint32_t *dst = reinterpret_cast<uint32_t *>(&Bs[r][c * WT::KPC]);
            if constexpr (FMT == TDM_MMF_NVFP4) {
                uint32_t sa, sb;
                tdm_mm::nvfp4_scales(wsc, sa, sb);
#pragma unroll
                for (int w = 0; w < 4; w++) {   // word w = k 8w..8w+7; pairs (j, j+4) -> natural order
                    uint32_t h[4];
#pragma unroll
                    for (int j = 0; j < 4; j++) h[j] = tdm_mm::nvfp4_breg(q[w], j, w < 2 ? sa : sb);
                    dst[4 * w + 0] = __byte_perm(h[0], h[1], 0x5410);
                    dst[4 * w + 1] = __byte_perm(h[2], h[3], 0x5410);
                    dst[4 * w + 2] = __byte_perm(h[0], h[1], 0x7632);
                    dst[4 * w + 3] = __byte_perm(h[2], h[3], 0x7632);
                }
            } else if constexpr (FMT == TDM_MMF_FP8) {
#pragma unroll
                for (int w = 0; w < 4; w++) {   // word w = k 4w..4w+3
                    const uint32_t e0 = tdm_mm::bf16x2_mul(tdm_fp8_place(q[w], 0), TDM_FP8_UNPLACE);
                    const uint32_t e1 = tdm_mm::bf16x2_mul(tdm_fp8_place(q[w], 1), TDM_FP8_UNPLACE);
                    dst[2 * w] = __byte_perm(e0, e1, 0x5410);
                    dst[2 * w + 1] = __byte_perm(e0, e1, 0x7632);
                }
            } else {
                *reinterpret_cast<uint4 *>(dst) = wb[i];
            }
        }
    };
    auto block_scale = [&](int kb) {   // FP8: add this block's partial sums, scaled
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float s[2];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int vrow = min(n0 + 32 * wn + 8 * j + 2 * t + h, a.n - 1);
                const int64_t idx = ((a.row0 + vrow) >> 7) * a.slabs + kb;
                s[h] = a.scale_bf16 ? __uint_as_float((uint32_t)reinterpret_cast<const uint16_t *>(a.scale)[idx] << 16)
                                    : reinterpret_cast<const float *>(a.scale)[idx];
            }
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    acc[i][j][c] = fmaf(blk[i][j][c], s[c & 1], acc[i][j][c]);
                    blk[i][j][c] = 0.0f;
                }
        }
    };

    gload(0);
    for (int kt = 0; kt < ktiles; kt++) {
        __syncthreads();   // the previous tile's fragments are read
        sstore();
        __syncthreads();
        if (kt + 1 < ktiles) gload(kt + 1);
#pragma unroll
        for (int ks = 0; ks < BK / 16; ks++) {
            uint32_t af[2][4], bfr[2][4];
#pragma unroll
            for (int i = 0; i < 2; i++)
                ldmatrix_x4(af[i], &As[32 * wm + 16 * i + (lane & 7) + ((lane >> 3) & 1) * 8][16 * ks + (lane >> 4) * 8]);
#pragma unroll
            for (int p = 0; p < 2; p++)
                ldmatrix_x4(bfr[p], &Bs[32 * wn + 16 * p + (lane & 7) + (lane >> 4) * 8][16 * ks + ((lane >> 3) & 1) * 8]);
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    float(&c)[4] = FMT == TDM_MMF_FP8 ? blk[i][j] : acc[i][j];
                    tdm_mm::mma_bf16(c, af[i][0], af[i][1], af[i][2], af[i][3], bfr[j >> 1][(j & 1) * 2],
                                     bfr[j >> 1][(j & 1) * 2 + 1]);
                }
        }
        if constexpr (FMT == TDM_MMF_FP8)
            if ((kt & 1) || kt + 1 == ktiles) block_scale(kt >> 1);
    }

#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int r = m0 + 32 * wm + 16 * i + g + 8 * h, n = n0 + 32 * wn + 8 * j + 2 * t;
                if (r >= a.m) continue;
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    if (n + e >= a.n) continue;
                    const float v = acc[i][j][2 * h + e] * a.out_scale;
                    if (a.y_f32)
                        reinterpret_cast<float *>(a.y)[(int64_t)r * a.ldy + n + e] = v;
                    else
                        reinterpret_cast<__nv_bfloat16 *>(a.y)[(int64_t)r * a.ldy + n + e] = __float2bfloat16_rn(v);
                }
            }
}

}  // namespace

cudaError_t tdm_mm_wide_launch(const tdm_mm::SkinnyArgs &a, int fmt, bool vec, cudaStream_t st)
{
    const dim3 grid((unsigned)((a.m + BM - 1) / BM), (unsigned)((a.n + BN - 1) / BN));
    const int v = vec ? 1 : 0;
    switch (fmt) {
    case TDM_MMF_NVFP4: wide_kernel<TDM_MMF_NVFP4><<<grid, THREADS, 0, st>>>(a, v); break;
    case TDM_MMF_FP8: wide_kernel<TDM_MMF_FP8><<<grid, THREADS, 0, st>>>(a, v); break;
    default: wide_kernel<TDM_MMF_BF16><<<grid, THREADS, 0, st>>>(a, v); break;
    }
    return cudaGetLastError();
}
