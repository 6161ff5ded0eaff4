// wide_tile.cuh — the main loop of the tensor-core GEMMs for many rows, one CTA tile at a time:
// the dense wide GEMM (wide_gemm.cu) and the grouped MoE experts of a prefill chunk (moe.cu).
//
// A CTA of 8 warps, WM x (8 / WM) warps of 32 x 32: BM = 32 WM rows x BN = 256 / WM columns, 64 k
// a step, mma.m16n8k16 BF16 -> FP32 with ldmatrix fragments. The weight tile is decoded exactly to
// BF16 once into shared memory for all BM rows with the skinny kernels' decoders (mm_layout.h):
// NVFP4 as e2m1 * scale * 2^-7 (the caller applies scale_2 * 2^7 to the sum), FP8 as the code value
// with the 128x128 block scale applied to each block's partial sum. The caller says where the
// operands are (an Op, below): rows of activations may be gathered, weight rows may come from
// several matrices; it writes the accumulators out itself (tile_row, tile_col).
#pragma once
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include "mm_layout.h"
#include "mm_skinny.cuh"

namespace tdm_wide {

constexpr int BK = 64, LDS_K = BK + 8;   // row stride 144 bytes: ldmatrix conflict-free
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

// The CTA tile of format FMT with WM warps in M.
template <int FMT, int WM>
struct Tile {
    static constexpr int WN = 8 / WM, BM = 32 * WM, BN = 32 * WN;
    // a weight chunk: NVFP4 16 bytes = 32 k + two group scales; FP8 16 bytes = 16 k; BF16 16 bytes = 8 k
    static constexpr int KPC = FMT == TDM_MMF_NVFP4 ? 32 : FMT == TDM_MMF_FP8 ? 16 : 8;
    static constexpr int BPK_NUM = FMT == TDM_MMF_BF16 ? 2 : 1, BPK_DEN = FMT == TDM_MMF_NVFP4 ? 2 : 1;   // bytes per k
    static constexpr int PER_ROW = BK / KPC;                                   // chunks of a weight row a step
    static constexpr int WCH = (BN * PER_ROW + THREADS - 1) / THREADS;         // weight chunks a thread
    static constexpr int ACH = BM * 8 / THREADS;                               // activation chunks (8 k) a thread
};

// Local coordinates of accumulator acc[i][j][2h + e] of the warp (wm, wn), lane 4g + t.
__device__ __forceinline__ int tile_row(int wm, int i, int h, int g) { return 32 * wm + 16 * i + g + 8 * h; }
__device__ __forceinline__ int tile_col(int wn, int j, int e, int t) { return 32 * wn + 8 * j + 2 * t + e; }

// The main loop: acc = the warp's 32 x 32 of (activation rows) x (weight rows)^T over k. Op gives:
//   int k, rows;     inputs; rows of the tile that hold data (16-row slices at or past it run no mma)
//   bool vec, x_vec; weight rows / activation rows start 16-byte aligned
//   const uint16_t *arow(int r)      row r (0..BM-1) of the activations, nullptr: zeros
//   const uint8_t *brow(int j)       the stored bytes of weight row j (0..BN-1), always a real row
//   const uint8_t *bytes_at(const uint8_t *row, int64_t off)   byte off of that row (off as the row
//                                    order counts it: the row's slabs may lie apart, mm_layout.h)
//   const uint8_t *bgroups(int j)    NVFP4: its group scales [k / 16]
//   uint32_t group_at(const uint8_t *groups, int64_t g)        NVFP4: group scale g of that row (the same)
//   float bscale(int j, int kb)      FP8: its block scale for k block kb (128 k)
// Every thread of the CTA must call it.
template <int FMT, int WM, class Op>
__device__ __forceinline__ void mainloop(const Op &op, float (&acc)[2][4][4])
{
    using T = Tile<FMT, WM>;
    __shared__ __align__(16) __nv_bfloat16 As[T::BM][LDS_K];
    __shared__ __align__(16) __nv_bfloat16 Bs[T::BN][LDS_K];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, t = lane & 3;
    const int wm = warp % WM, wn = warp / WM;
    const int ktiles = (op.k + BK - 1) / BK;
    const int64_t rowbytes = (int64_t)op.k * T::BPK_NUM / T::BPK_DEN;

    float blk[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[i][j][c] = blk[i][j][c] = 0.0f;

    // the rows this thread loads, fixed for the whole loop
    const uint16_t *ap[T::ACH];
    const uint8_t *bp[T::WCH], *gp[T::WCH];
#pragma unroll
    for (int i = 0; i < T::ACH; i++) ap[i] = op.arow((tid + i * THREADS) >> 3);
#pragma unroll
    for (int i = 0; i < T::WCH; i++) {
        const int id = tid + i * THREADS, r = id / T::PER_ROW;
        bp[i] = r < T::BN ? op.brow(r) : nullptr;
        gp[i] = r < T::BN && FMT == TDM_MMF_NVFP4 ? op.bgroups(r) : nullptr;
    }

    uint4 xa[T::ACH], wb[T::WCH];
    uint32_t wsc[T::WCH];
    auto gload = [&](int kt) {
        const int64_t kbase = (int64_t)kt * BK;
#pragma unroll
        for (int i = 0; i < T::ACH; i++) {   // activations: BM rows x 8 chunks of 8 k
            const int c = (tid + i * THREADS) & 7;
            const int64_t kk = kbase + 8 * c;
            xa[i] = make_uint4(0, 0, 0, 0);
            if (ap[i]) {
                const uint16_t *p = ap[i] + kk;
                if (op.x_vec && kk + 8 <= op.k) {
                    xa[i] = *reinterpret_cast<const uint4 *>(p);
                } else {
                    uint32_t v[4] = {0, 0, 0, 0};
                    for (int e = 0; e < 8; e++)
                        if (kk + e < op.k) v[e >> 1] |= (uint32_t)p[e] << (16 * (e & 1));
                    xa[i] = make_uint4(v[0], v[1], v[2], v[3]);
                }
            }
        }
#pragma unroll
        for (int i = 0; i < T::WCH; i++) {   // weights: BN rows x PER_ROW chunks
            if (!bp[i]) continue;
            const int c = (tid + i * THREADS) % T::PER_ROW;
            const int64_t off = (kbase + (int64_t)c * T::KPC) * T::BPK_NUM / T::BPK_DEN;
            wb[i] = load16(op.bytes_at(bp[i], off), rowbytes - off, op.vec);
            if constexpr (FMT == TDM_MMF_NVFP4) {
                const int64_t srow = op.k / 16, so = (kbase + (int64_t)c * 32) / 16;
                wsc[i] = (so < srow ? op.group_at(gp[i], so) : 0u) | (so + 1 < srow ? op.group_at(gp[i], so + 1) << 8 : 0u);
            }
        }
    };
    auto sstore = [&]() {
#pragma unroll
        for (int i = 0; i < T::ACH; i++) {
            const int id = tid + i * THREADS, r = id >> 3, c = id & 7;
            *reinterpret_cast<uint4 *>(&As[r][8 * c]) = xa[i];
        }
#pragma unroll
        for (int i = 0; i < T::WCH; i++) {
            if (!bp[i]) continue;
            const int id = tid + i * THREADS, r = id / T::PER_ROW, c = id % T::PER_ROW;
            uint32_t q[4] = {wb[i].x, wb[i].y, wb[i].z, wb[i].w};
            uint32_t *dst = reinterpret_cast<uint32_t *>(&Bs[r][c * T::KPC]);
            if constexpr (FMT == TDM_MMF_NVFP4) {
                uint32_t sa, sb;
                tdm_mm::nvfp4_scales(wsc[i], sa, sb);
#pragma unroll
                for (int w = 0; w < 4; w++) {   // word w = k 8w..8w+7; pairs (j, j+4) -> natural order
                    uint32_t h[4];
                    tdm_mm::nvfp4_bregs(q[w], w < 2 ? sa : sb, h);
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
            for (int h = 0; h < 2; h++) s[h] = op.bscale(tile_col(wn, j, h, t), kb);
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
            for (int i = 0; i < 2; i++) {
                if (32 * wm + 16 * i >= op.rows) continue;   // a 16-row slice without data (warp-uniform)
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    float(&c)[4] = FMT == TDM_MMF_FP8 ? blk[i][j] : acc[i][j];
                    tdm_mm::mma_bf16(c, af[i][0], af[i][1], af[i][2], af[i][3], bfr[j >> 1][(j & 1) * 2],
                                     bfr[j >> 1][(j & 1) * 2 + 1]);
                }
            }
        }
        if constexpr (FMT == TDM_MMF_FP8)
            if ((kt & 1) || kt + 1 == ktiles) block_scale(kt >> 1);
    }
}

}  // namespace tdm_wide
