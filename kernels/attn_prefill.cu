// attn_prefill.cu — prefill attention: the M queries of a prompt chunk against the BF16 KV cache
// in one launch (layers.h, tdm_attn_prefill), FlashAttention-2 style on the tensor cores.
//
// Design:
// - Grid (query block of BM = 64 rows, query head), the blocks with the most keys first; 4 warps,
//   each owning 16 query rows of the block. A block reads its KV head's cache rows 0..(its last
//   query's position) in tiles of BN = 64 keys, in ascending order; the GQA group's heads read the
//   same tiles through L2.
// - Shared memory: the Q tile [64][D], one K tile and one V tile [64][D], BF16, rows padded by 16
//   bytes (ldmatrix reads 8 rows at one column without bank conflicts): 3 * 64 * (D + 8) * 2 bytes,
//   101,376 at D = 256 (two blocks an SM on the H200). Copies by cp.async, 16 bytes a thread, rows
//   past the chunk or past the last key zero-filled. The loads overlap the products as in
//   FlashAttention-2: V_j streams in while S = Q K_j^T runs, K_{j+1} while O += P V_j runs.
// - Per warp and tile: S [16][64] = Q K^T with mma.m16n8k16 (BF16 in, FP32 accumulate), the
//   fragments from ldmatrix (Q and K row-major, V transposed); scores scaled by log2(e)/sqrt(D)
//   so that the softmax runs on exp2f; the causal mask (key > pos0 + row) only on tiles that
//   cross a row's position. Online softmax in FP32: the running max m, the running sum l of the
//   FP32 probabilities exp2(s - m) (the reference's sum is FP32 too), the accumulator O [16][D]
//   FP32 in registers (D/2 floats a thread: 128 at D = 256) rescaled by exp2(m_old - m_new); P is
//   rounded to BF16 for the P V product (the reference rounds its probabilities to BF16 too, but
//   relative to the row's final max: here relative to the running max, so the result is close to
//   the reference, not its bits).
// - End: the quad's partial sums added, O / l (correctly rounded division) -> BF16 into the Q tile's
//   rows of the warp, then 16-byte coalesced gate loads and stores of bf16(that * bf16(sigmoid(gate)))
//   (the decode kernel's attn_gated, layers_dev.cuh).
// Registers (nvcc --resource-usage, sm_90): 233 a thread at D = 256, 169 at 128, 148 at 64, no
// spills; 128 threads a block.
// No row-invariance contract (prefill chunks are checked by agreement, seed-kernels.md); every sum
// has a fixed order for a given shape, so a launch is deterministic.
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <math.h>
#include "layers.h"
#include "layers_dev.cuh"
#include "mm_skinny.cuh"
#include "cuda_check.h"

using namespace tdm_ly;
using tdm_mm::cp_async16;
using tdm_mm::cp_async16_zero;
using tdm_mm::cp_async_commit;
using tdm_mm::cp_async_wait;
using tdm_mm::mma_bf16;

namespace {

constexpr int BM = 64;               // queries a block
constexpr int BN = 64;               // keys a tile
constexpr int WARPS = BM / 16;       // 16 query rows a warp
constexpr int THREADS = WARPS * 32;

// ---- PTX fragments ---------------------------------------------------------------------------

// Four 8x8 BF16 matrices from shared memory: lanes 8i..8i+7 give the row addresses of matrix i;
// register i gets row lane/4, columns 2 (lane%4), +1 of matrix i (trans: row 2 (lane%4), +1 of
// column lane/4, i.e. the B operand of a row-major [k][n] matrix).
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const uint16_t *p)
{
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const uint16_t *p)
{
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
// Two floats -> BF16x2 (round to nearest even), lo in the low half (the lower column of a fragment).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi)
{
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&v);
}
__device__ __forceinline__ float quad_max(float v)
{
    v = fmaxf(v, __shfl_xor_sync(FULL, v, 1));
    return fmaxf(v, __shfl_xor_sync(FULL, v, 2));
}
__device__ __forceinline__ float quad_sum(float v)
{
    v = __fadd_rn(v, __shfl_xor_sync(FULL, v, 1));
    return __fadd_rn(v, __shfl_xor_sync(FULL, v, 2));
}

// ---- the kernel ------------------------------------------------------------------------------

// Rows [0, 64) of a tile from global rows src + r * ld (16-byte chunks; rows r >= valid zero).
template <int D>
__device__ __forceinline__ void load_tile(uint16_t *dst, const uint16_t *src, int64_t ld, int valid)
{
    constexpr int LD = D + 8, CH = D / 8;
    for (int i = threadIdx.x; i < 64 * CH; i += THREADS) {
        const int r = i / CH, c = i % CH;
        if (r < valid) cp_async16(dst + r * LD + c * 8, src + r * ld + c * 8);
        else cp_async16_zero(dst + r * LD + c * 8, src);
    }
    cp_async_commit();
}

// Block (query block blockIdx.x counted from the end, query head blockIdx.y). Thread (warp w,
// lane = 4 g + t) holds, for the rows w*16 + g and w*16 + g + 8 of the block, the columns
// 8 n + 2 t, +1 of every 8-column tile n of S and of O (the mma accumulator layout).
template <int D>
__global__ void __launch_bounds__(THREADS, 2)
attn_prefill_kernel(const uint16_t *__restrict__ q, const uint16_t *__restrict__ qg, int64_t ldqg,
                    const uint16_t *__restrict__ kc, const uint16_t *__restrict__ vc, int M, int Hq, int Hkv, int pos0,
                    float scale_log2, uint16_t *__restrict__ out)
{
    constexpr int LD = D + 8, CH = D / 8, NT = BN / 8, DT = D / 8;
    extern __shared__ __align__(16) uint16_t smem[];
    uint16_t *sQ = smem, *sK = smem + BM * LD, *sV = smem + (BM + BN) * LD;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int h = blockIdx.y, kvh = h / (Hq / Hkv);
    const int m0 = (gridDim.x - 1 - blockIdx.x) * BM;       // the longest rows first
    const int rows = min(BM, M - m0);
    const int kv_end = pos0 + m0 + rows;                    // keys [0, kv_end) are seen by the block
    const int ntiles = (kv_end + BN - 1) / BN;
    const int64_t ldkv = (int64_t)Hkv * D;
    const uint16_t *kh = kc + (int64_t)kvh * D, *vh = vc + (int64_t)kvh * D;

    // Q rows (zero past the chunk), then K tile 0
    for (int i = threadIdx.x; i < BM * CH; i += THREADS) {
        const int r = i / CH, c = i % CH;
        if (r < rows) cp_async16(sQ + r * LD + c * 8, q + ((int64_t)(m0 + r) * Hq + h) * D + c * 8);
        else cp_async16_zero(sQ + r * LD + c * 8, q);
    }
    cp_async_commit();
    load_tile<D>(sK, kh, ldkv, min(BN, kv_end));

    const int wr = warp * 16;                               // the warp's first row in the block
    const int p_lo = pos0 + m0 + wr + g, p_hi = p_lo + 8;   // positions of the thread's two rows
    float o[DT][4];
#pragma unroll
    for (int n = 0; n < DT; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;

    for (int j = 0; j < ntiles; j++) {
        const int k0 = j * BN;
        cp_async_wait<0>();
        __syncthreads();  // K_j (and Q) landed for every thread; every warp is done with V_{j-1}
        load_tile<D>(sV, vh + k0 * ldkv, ldkv, min(BN, kv_end - k0));

        // S = Q K_j^T
        float s[NT][4];
#pragma unroll
        for (int n = 0; n < NT; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            uint32_t a[4];
            ldsm_x4(a, sQ + (wr + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + kk * 16 + (lane >> 4) * 8);
#pragma unroll
            for (int np = 0; np < NT / 2; np++) {
                uint32_t b[4];
                ldsm_x4(b, sK + (np * 16 + (lane & 7) + (lane >> 4) * 8) * LD + kk * 16 + ((lane >> 3) & 1) * 8);
                mma_bf16(s[2 * np], a[0], a[1], a[2], a[3], b[0], b[1]);
                mma_bf16(s[2 * np + 1], a[0], a[1], a[2], a[3], b[2], b[3]);
            }
        }

        // scale into the log2 domain; mask keys past a row's position (tiles that cross the warp's
        // first row; keys past the block's last are past every real row's position too)
        const bool mask = k0 + BN - 1 > pos0 + m0 + wr;
        float mx_lo = m_lo, mx_hi = m_hi;
#pragma unroll
        for (int n = 0; n < NT; n++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float v = s[n][e] * scale_log2;
                if (mask && k0 + n * 8 + 2 * t + (e & 1) > (e < 2 ? p_lo : p_hi)) v = -INFINITY;
                s[n][e] = v;
            }
            mx_lo = fmaxf(mx_lo, fmaxf(s[n][0], s[n][1]));
            mx_hi = fmaxf(mx_hi, fmaxf(s[n][2], s[n][3]));
        }
        // key 0 is in tile 0 and seen by every row, so the maxima are finite from tile 0 on
        mx_lo = quad_max(mx_lo);
        mx_hi = quad_max(mx_hi);
        const float al_lo = exp2f(m_lo - mx_lo), al_hi = exp2f(m_hi - mx_hi);  // 0 at tile 0
        m_lo = mx_lo;
        m_hi = mx_hi;
        l_lo *= al_lo;
        l_hi *= al_hi;
#pragma unroll
        for (int n = 0; n < DT; n++) {
            o[n][0] *= al_lo;
            o[n][1] *= al_lo;
            o[n][2] *= al_hi;
            o[n][3] *= al_hi;
        }
        // P = exp2(s - m): FP32 into the sums, BF16 into the A operand of P V (key tile kc of 16:
        // registers {row g, keys 0-7}, {row g+8, keys 0-7}, {row g, keys 8-15}, {row g+8, keys 8-15})
        uint32_t pa[BN / 16][4];
#pragma unroll
        for (int n = 0; n < NT; n++) {
            const float p0 = exp2f(s[n][0] - mx_lo), p1 = exp2f(s[n][1] - mx_lo);
            const float p2 = exp2f(s[n][2] - mx_hi), p3 = exp2f(s[n][3] - mx_hi);
            l_lo += p0 + p1;
            l_hi += p2 + p3;
            pa[n / 2][(n & 1) * 2] = pack_bf16(p0, p1);
            pa[n / 2][(n & 1) * 2 + 1] = pack_bf16(p2, p3);
        }

        cp_async_wait<0>();
        __syncthreads();  // V_j landed; every warp is done with K_j
        if (j + 1 < ntiles) load_tile<D>(sK, kh + (k0 + BN) * ldkv, ldkv, min(BN, kv_end - k0 - BN));

        // O += P V_j
#pragma unroll
        for (int kc2 = 0; kc2 < BN / 16; kc2++) {
#pragma unroll
            for (int dp = 0; dp < D / 16; dp++) {
                uint32_t b[4];
                ldsm_x4_trans(b, sV + (kc2 * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + dp * 16 + (lane >> 4) * 8);
                mma_bf16(o[2 * dp], pa[kc2][0], pa[kc2][1], pa[kc2][2], pa[kc2][3], b[0], b[1]);
                mma_bf16(o[2 * dp + 1], pa[kc2][0], pa[kc2][1], pa[kc2][2], pa[kc2][3], b[2], b[3]);
            }
        }
    }

    // O / l -> BF16 into the warp's own rows of the Q tile (only this warp read them; all copies
    // have landed), then the gate and 16-byte stores of the chunk's rows
    l_lo = quad_sum(l_lo);
    l_hi = quad_sum(l_hi);
    uint16_t *so = sQ + wr * LD;
#pragma unroll
    for (int n = 0; n < DT; n++) {
        const int col = n * 8 + 2 * t;
        so[g * LD + col] = f2bf(__fdiv_rn(o[n][0], l_lo));
        so[g * LD + col + 1] = f2bf(__fdiv_rn(o[n][1], l_lo));
        so[(g + 8) * LD + col] = f2bf(__fdiv_rn(o[n][2], l_hi));
        so[(g + 8) * LD + col + 1] = f2bf(__fdiv_rn(o[n][3], l_hi));
    }
    __syncwarp();
    for (int i = lane; i < 16 * CH; i += 32) {
        const int r = i / CH, c = i % CH, row = m0 + wr + r;
        if (row >= M) break;  // i only grows, and so does r
        const uint4 av = *reinterpret_cast<const uint4 *>(so + r * LD + c * 8);
        const uint4 gv = *reinterpret_cast<const uint4 *>(qg + row * ldqg + (int64_t)h * 2 * D + D + c * 8);
        const uint32_t a[4] = {av.x, av.y, av.z, av.w}, gt[4] = {gv.x, gv.y, gv.z, gv.w};
        uint32_t w[4];
#pragma unroll
        for (int e = 0; e < 4; e++)
            w[e] = (uint32_t)attn_gated(__uint_as_float(a[e] << 16), __uint_as_float(gt[e] << 16)) |
                   (uint32_t)attn_gated(__uint_as_float(a[e] & 0xffff0000u), __uint_as_float(gt[e] & 0xffff0000u)) << 16;
        *reinterpret_cast<uint4 *>(out + ((int64_t)row * Hq + h) * D + c * 8) = make_uint4(w[0], w[1], w[2], w[3]);
    }
}

// ---- the launcher ----------------------------------------------------------------------------

template <int D>
int launch(const uint16_t *q, const uint16_t *qg, int64_t ldqg, const uint16_t *kc, const uint16_t *vc, int M, int Hq,
           int Hkv, int pos0, uint16_t *out, cudaStream_t st)
{
    const size_t smem = (size_t)(BM + 2 * BN) * (D + 8) * sizeof(uint16_t);
    TDM_CUDA_TRY(cudaFuncSetAttribute(attn_prefill_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    // 1/sqrt(D) as the reference rounds it, times log2(e)
    const float scale_log2 = (1.0f / sqrtf((float)D)) * 1.44269504088896340736f;
    const dim3 grid((unsigned)((M + BM - 1) / BM), (unsigned)Hq);
    attn_prefill_kernel<D><<<grid, THREADS, smem, st>>>(q, qg, ldqg, kc, vc, M, Hq, Hkv, pos0, scale_log2, out);
    TDM_LAUNCH_CHECK();
    return 0;
}

}  // namespace

extern "C" int tdm_attn_prefill(const uint16_t *q, const uint16_t *qg, int64_t ldqg, const uint16_t *kcache,
                                const uint16_t *vcache, int M, int Hq, int Hkv, int D, int pos0, int ctx, uint16_t *out,
                                void *stream)
{
    if (M < 0 || Hkv <= 0 || Hq <= 0 || Hq % Hkv || Hq > 65535 || (D != 64 && D != 128 && D != 256) ||
        ldqg < (int64_t)Hq * 2 * D)
        return tdm_errf("tdm_attn_prefill: bad shape M %d, Hq %d, Hkv %d, D %d (64, 128 or 256), ldqg %lld", M, Hq, Hkv, D,
                        (long long)ldqg);
    if (pos0 < 0 || (int64_t)pos0 + M > ctx)
        return tdm_errf("tdm_attn_prefill: positions %d..%d exceed the cache of %d", pos0, pos0 + M - 1, ctx);
    if (((uintptr_t)q | (uintptr_t)qg | (uintptr_t)kcache | (uintptr_t)vcache | (uintptr_t)out) % 16 || ldqg % 8)
        return tdm_errf("tdm_attn_prefill: q, qg, the caches and out must be 16-byte aligned, ldqg a multiple of 8");
    if (M == 0) return 0;
    cudaStream_t st = (cudaStream_t)stream;
    if (D == 256) return launch<256>(q, qg, ldqg, kcache, vcache, M, Hq, Hkv, pos0, out, st);
    if (D == 128) return launch<128>(q, qg, ldqg, kcache, vcache, M, Hq, Hkv, pos0, out, st);
    return launch<64>(q, qg, ldqg, kcache, vcache, M, Hq, Hkv, pos0, out, st);
}

extern "C" int64_t tdm_attn_prefill_bytes(int M, int Hq, int Hkv, int D, int pos0)
{
    // the cache rows the chunk sees, K and V once (the GQA group's blocks share them through L2),
    // q, the gates and the output
    return (int64_t)(pos0 + M) * Hkv * D * 4 + (int64_t)M * Hq * D * 6;
}
