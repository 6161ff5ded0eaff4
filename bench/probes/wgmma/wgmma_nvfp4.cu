// wgmma_nvfp4.cu — a probe (not part of the build): the NVFP4 skinny product at 16 or 32 rows on the
// warpgroup tensor-core instruction (wgmma.mma_async, sm_90a), weights decoded in registers straight
// into the A operand (64 weight rows a warpgroup, the per-lane decode of kernels/mm_skinny.cuh) and
// the activations read by the tensor cores from shared memory (B, 32 rows), staged slab by slab with
// bulk copies from an activation copy laid out as wgmma's core matrices (xw: mm_layout.h). The B descriptor:
// no swizzle, LBO = the core matrices' distance along K, SBO = along the rows (measured: the other way
// round gives wrong sums).
//
// Why (bench/NOTES.md): at 17-32 rows the mma.sync forms issue two to four mmas and load the
// activations into registers for every pair of weight tiles and step; a 27B token's products take
// 1.65x the one-row time. wgmma takes the activation registers and their loads away and issues one
// instruction a warp for 16 weight rows x 32 activation rows x k16.
//
// The sum order is the skinny kernel's: chain c of tdm_mm_kchains(n, k) chains covers slabs
// [c chain_len, (c + 1) chain_len), one FP32 accumulator a chain in step order, the chains summed as a
// pairwise tree, times scale_2 * 2^7. Where one wgmma step gives the bits of one mma.sync step, the
// outputs equal tdm_matmul_xb's bit for bit (the probe counts them).
#include <cuda_runtime.h>
#include <stdint.h>
#include "cuda_check.h"
#include "err.h"
#include "matmul.h"
#include "mm_skinny.cuh"

namespace {

constexpr int XW_ROWS = 32;   // rows of the partial sums' room
constexpr int RS = 4;         // stages of the slab ring
// Bytes of one k16 step and one slab of a staged copy of NTOK rows (NTOK / 8 row blocks of 256 bytes).
template <int NTOK> __host__ __device__ constexpr int step_bytes() { return NTOK * 32; }
template <int NTOK> __host__ __device__ constexpr int slab_bytes() { return 8 * step_bytes<NTOK>(); }

// xw (mm_layout.h: tdm_mm_xw_index) of ntok rows from x [m][k]: rows >= m zero.
__global__ void pack_xw(const uint16_t *x, int m, int k, int ntok, uint16_t *xw)
{
    const int64_t full = (int64_t)(k / 128) * 128, total = ntok * full;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        const int row = (int)(e / full);
        const int64_t kk = e % full;
        xw[tdm_mm_xw_index(ntok, row, kk)] = row < m ? x[(int64_t)row * k + kk] : 0;
    }
}

__device__ __forceinline__ uint64_t desc_of(uint32_t saddr, uint32_t lbo, uint32_t sbo)
{
    return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32);
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory"); }
template <int NA>
__device__ __forceinline__ void pin(float (&d)[NA])
{
#pragma unroll
    for (int i = 0; i < NA; i++) asm volatile("" : "+f"(d[i])::"memory");
}

// D[64 x NTOK] += A[64 x 16] (registers) * B[16 x NTOK] (shared memory, K-major), FP32 accumulators.
template <int NTOK> struct Wgmma;
template <> struct Wgmma<32> {
    static __device__ __forceinline__ void run(float (&d)[16], const uint32_t *a, uint64_t desc)
    {
        asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %21, 0;\n"
                     " wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
                     "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
                     "{%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                       "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
    }
};
template <> struct Wgmma<8> {
    static __device__ __forceinline__ void run(float (&d)[4], const uint32_t *a, uint64_t desc)
    {
        asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %9, 0;\n"
                     " wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 "
                     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1, 0;\n}"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
    }
};
template <> struct Wgmma<16> {
    static __device__ __forceinline__ void run(float (&d)[8], const uint32_t *a, uint64_t desc)
    {
        asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %13, 0;\n"
                     " wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
                     "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
    }
};

struct Args {
    const uint8_t *w, *scale;  // packed NVFP4 codes [n][k/2], e4m3 group scales [n][k/16]
    int n, k, slabs, chains, chain_len;
    const uint16_t *xw;
    float *part;               // [gridDim.y][32][n]: the CTA's sum (over its chains) where more than one CTA a row block
    float *y;                  // [ntok][n], FP32, where one CTA covers every chain of its rows
    float out_scale;           // scale_2 * 2^7
    tdm_mm::SkinnyArgs sk;     // for the skinny kernel's chunk loader: k (the row length) alone is read
};

// One lane's two rows (g, g + 8) of one slab: the skinny kernel's lane chunks (16 bytes of codes and
// two group scales each). LD 1: loaded by its load_chunk (the checked loader, a branch on the row's end);
// LD 0: the same two loads straight (ldg_stream, ldg_stream_u16), the probe's first form.
struct Pair {
    tdm_mm::Chunk<TDM_MMF_NVFP4> c0, c1;
};
template <int LD>
__device__ __forceinline__ void load_pair(Pair &p, const Args &a, int r0, int r1, int slab, int t)
{
    if constexpr (LD == 1) {
        tdm_mm::load_chunk<TDM_MMF_NVFP4, true>(p.c0, a.sk, a.w, a.scale, 0, r0, 0, 0, slab, t);
        tdm_mm::load_chunk<TDM_MMF_NVFP4, true>(p.c1, a.sk, a.w, a.scale, 0, r1, 0, 0, slab, t);
    } else {
        const int64_t rb = a.k / 2, sb = a.k / 16;
        const int64_t off = (int64_t)slab * 64 + 16 * t, soff = (int64_t)slab * 8 + 2 * t;
        const uint4 v0 = tdm_mm::ldg_stream(a.w + r0 * rb + off), v1 = tdm_mm::ldg_stream(a.w + r1 * rb + off);
        p.c0.w[0] = v0.x; p.c0.w[1] = v0.y; p.c0.w[2] = v0.z; p.c0.w[3] = v0.w;
        p.c1.w[0] = v1.x; p.c1.w[1] = v1.y; p.c1.w[2] = v1.z; p.c1.w[3] = v1.w;
        p.c0.sc = tdm_mm::ldg_stream_u16(a.scale + r0 * sb + soff);
        p.c1.sc = tdm_mm::ldg_stream_u16(a.scale + r1 * sb + soff);
    }
}

// The A registers of steps 4 h .. 4 h + 3 (words 2 h, 2 h + 1): a[4 j + i] is register i of step 4 h + j.
__device__ __forceinline__ void decode_half(const Pair &p, int h, uint32_t (&a)[16])
{
    uint32_t sa0, sb0, sa1, sb1;
    tdm_mm::nvfp4_scales(p.c0.sc, sa0, sb0);
    tdm_mm::nvfp4_scales(p.c1.sc, sa1, sb1);
#pragma unroll
    for (int uu = 0; uu < 2; uu++) {
        uint32_t b0[4], b1[4];   // steps 2u (b[0], b[1]) and 2u + 1 (b[2], b[3]) of rows g and g + 8
        tdm_mm::bregs<TDM_MMF_NVFP4>(p.c0, 2 * h + uu, sa0, sb0, b0);
        tdm_mm::bregs<TDM_MMF_NVFP4>(p.c1, 2 * h + uu, sa1, sb1, b1);
#pragma unroll
        for (int pp = 0; pp < 2; pp++) {
            uint32_t *r = &a[4 * (2 * uu + pp)];
            r[0] = b0[2 * pp];       // row g, kappa 2t..
            r[1] = b1[2 * pp];       // row g + 8, kappa 2t..
            r[2] = b0[2 * pp + 1];   // row g, kappa 2t + 8..
            r[3] = b1[2 * pp + 1];   // row g + 8, kappa 2t + 8..
        }
    }
}

// PF: slabs of weights in flight beyond the one being decoded (a register ring). LAG: the producer
// thread refills the stage of slab i - LAG at slab i (1: the slab just read, so the producer's warpgroup
// waits for the slowest warp sharing the ring every slab; 2: a slab of slack, two slabs staged ahead).
// WK 0: the CTA's WG warpgroups take 64 rows each of one chain (blockIdx.y) and share one ring. WK 1:
// they take the same 64 rows, warpgroup j chain WG blockIdx.y + j, each with its own ring, and the
// CTA sums its chains as the pairwise tree's first levels in shared memory; with one CTA a row block
// it writes y, else its sum goes to part for the tree's upper levels (chain_tree over gridDim.y).
template <int NTOK, int WG, int PF, int LAG, int WK, int LD>
__global__ void __launch_bounds__(128 * WG) wgmma_nvfp4(const Args a)
{
    constexpr int ND = NTOK / 2, SB = slab_bytes<NTOK>(), STB = step_bytes<NTOK>();
    constexpr int RINGS = WK ? WG : 1;
    extern __shared__ __align__(1024) uint8_t smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int wgi = warp >> 2, ltid = tid & 127, ring_i = WK ? wgi : 0;
    const int ring_warps = WK ? 4 : 4 * WG;                       // warps reading a ring
    const bool producer = WK ? ltid == 0 : tid == 0;
    const int c = WK ? blockIdx.y * WG + wgi : blockIdx.y;
    const int s0 = c * a.chain_len, s1 = min(a.slabs, s0 + a.chain_len), ns = s1 - s0;
    const int rbase = WK ? blockIdx.x * 64 + 16 * (warp & 3) : blockIdx.x * 64 * WG + 16 * warp;
    const int r0 = min(rbase + g, a.n - 1), r1 = min(rbase + g + 8, a.n - 1);

    Pair cur, rp[PF];   // rp[p]: slab i + 1 + p once iteration i has issued its load
    if (ns > 0) load_pair<LD>(cur, a, r0, r1, s0, t);
#pragma unroll
    for (int p = 0; p + 1 < PF; p++)
        if (1 + p < ns) load_pair<LD>(rp[p], a, r0, r1, s0 + 1 + p, t);
    const uint32_t ring_s = (uint32_t)__cvta_generic_to_shared(smem) + ring_i * RS * SB;
    const uint32_t full_s = (uint32_t)__cvta_generic_to_shared(smem) + RINGS * RS * SB + ring_i * 16 * RS, empty_s = full_s + 8 * RS;
    if (producer) {
        for (int i = 0; i < RS; i++) {
            tdm_mm::mbar_init(full_s + 8 * i, 1);
            tdm_mm::mbar_init(empty_s + 8 * i, ring_warps);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    auto stage_in = [&](int ps, int slab) {
        tdm_mm::mbar_arrive_expect(full_s + 8 * ps, SB);
        tdm_mm::bulk_copy_g2s(ring_s + ps * SB, a.xw + (size_t)slab * (SB / 2), SB, full_s + 8 * ps);
    };
    if (producer)
        for (int i = 0; i < RS && i < ns; i++) stage_in(i, s0 + i);
    float d[ND];
#pragma unroll
    for (int i = 0; i < ND; i++) d[i] = 0.0f;
    pin(d);
    const uint32_t lbo = 128, sbo = 256;
    uint32_t A0[16], A1[16];
    for (int i = 0; i < ns; i++) {
        if (i + PF < ns) load_pair<LD>(rp[PF - 1], a, r0, r1, s0 + i + PF, t);
        const int st = i % RS;
        tdm_mm::mbar_wait(full_s + 8 * st, (uint32_t)((i / RS) & 1));
#pragma unroll
        for (int h = 0; h < 2; h++) {
            uint32_t(&A)[16] = h ? A1 : A0;
            wg_wait<1>();   // the group before last is done: its registers are free
            decode_half(cur, h, A);
            wg_fence();
#pragma unroll
            for (int j = 0; j < 4; j++)
                Wgmma<NTOK>::run(d, &A[4 * j], desc_of(ring_s + st * SB + (4 * h + j) * STB, lbo, sbo));
            wg_commit();
        }
        // slab i - 1 was read (the wait before half 1)
        if (i > 0 && lane == 0) tdm_mm::mbar_arrive(empty_s + 8 * ((i - 1) % RS));
        // the producer: slab i - LAG's stage refilled with slab i - LAG + RS once every warp has read it
        if (producer && i >= LAG && i - LAG + RS < ns) {
            const int ps = (i - LAG) % RS;
            tdm_mm::mbar_wait(empty_s + 8 * ps, (uint32_t)(((i - LAG) / RS) & 1));
            stage_in(ps, s0 + i - LAG + RS);
        }
        cur = rp[0];
#pragma unroll
        for (int p = 0; p + 1 < PF; p++) rp[p] = rp[p + 1];
    }
    wg_wait<0>();
    pin(d);
    // d[4 j + e]: weight row g (e < 2) or g + 8, activation row 8 j + 2 t + (e & 1)
    if constexpr (WK) {
        // every wgmma of the CTA done and every staged slab landed (each was waited for): the rings are free
        __syncthreads();
        float *red = reinterpret_cast<float *>(smem);   // red[(j ND + i) 128 + ltid]: warpgroup j's d[i]
#pragma unroll
        for (int i = 0; i < ND; i++) red[(wgi * ND + i) * 128 + ltid] = d[i];
#pragma unroll
        for (int step = 1; step < WG; step <<= 1) {
            __syncthreads();
            if (wgi % (2 * step) == 0) {
#pragma unroll
                for (int i = 0; i < ND; i++) {
                    d[i] += red[((wgi + step) * ND + i) * 128 + ltid];
                    red[(wgi * ND + i) * 128 + ltid] = d[i];
                }
            }
        }
        if (wgi != 0) return;
        const bool whole = gridDim.y == 1;
        float *part = a.part + (size_t)blockIdx.y * XW_ROWS * a.n;
#pragma unroll
        for (int j = 0; j < NTOK / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int row = rbase + g + (e >> 1) * 8, tok = 8 * j + 2 * t + (e & 1);
                if (row >= a.n) continue;
                if (whole) a.y[(size_t)tok * a.n + row] = d[4 * j + e] * a.out_scale;
                else part[(size_t)tok * a.n + row] = d[4 * j + e];
            }
        return;
    }
    float *part = a.part + (size_t)c * XW_ROWS * a.n;
#pragma unroll
    for (int j = 0; j < NTOK / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int row = rbase + g + (e >> 1) * 8, tok = 8 * j + 2 * t + (e & 1);
            if (row < a.n) part[(size_t)tok * a.n + row] = d[4 * j + e];
        }
}

// y[r][n] = (pairwise tree over the chains of part) * out_scale, FP32.
__global__ void chain_tree(const float *part, int chains, int n, int rows, float out_scale, float *y)
{
    const int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= rows * n) return;
    float v[16];
    for (int c = 0; c < chains; c++) v[c] = part[(size_t)c * XW_ROWS * n + e];
    for (int step = 1; step < chains; step <<= 1)
        for (int grp = 0; grp + step < chains; grp += 2 * step) v[grp] += v[grp + step];
    y[e] = v[0] * out_scale;
}

template <int NTOK, int WG, int PF, int LAG, int WK, int LD>
cudaError_t launch(const Args &a, cudaStream_t st)
{
    const int rings = WK ? WG : 1;
    const size_t smem = rings * (RS * slab_bytes<NTOK>() + 16 * RS);
    auto kern = wgmma_nvfp4<NTOK, WG, PF, LAG, WK, LD>;
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    const int rows = WK ? 64 : 64 * WG;
    kern<<<dim3((a.n + rows - 1) / rows, WK ? a.chains / WG : a.chains), 128 * WG, smem, st>>>(a);
    return cudaGetLastError();
}
// The forms the probe runs, in its order (tdm_probe_form): (wg, pf, lag, wk, ld).
#define TDM_PROBE_FORMS(X)                                                                          \
    X(1, 2, 2, 0, 1) X(1, 2, 2, 0, 0) X(1, 2, 1, 0, 0) X(1, 3, 2, 0, 0) X(2, 2, 2, 1, 1) X(2, 2, 2, 1, 0) \
    X(2, 2, 1, 1, 0) X(2, 3, 2, 1, 0) X(4, 2, 2, 1, 0) X(4, 3, 2, 1, 0)
template <int NTOK>
cudaError_t launch_form(const Args &a, int wg, int pf, int lag, int wk, int ld, cudaStream_t st)
{
#define TDM_PROBE_LAUNCH(WG_, PF_, LAG_, WK_, LD_) \
    if (wg == WG_ && pf == PF_ && lag == LAG_ && wk == WK_ && ld == LD_) return launch<NTOK, WG_, PF_, LAG_, WK_, LD_>(a, st);
    TDM_PROBE_FORMS(TDM_PROBE_LAUNCH)
#undef TDM_PROBE_LAUNCH
    return cudaErrorNotSupported;
}

}  // namespace

// Form f of the probe's list into form[5] as (wg, pf, lag, wk, ld); -1 past the list's end.
extern "C" int tdm_probe_form(int f, int form[5])
{
#define TDM_PROBE_ROW(WG_, PF_, LAG_, WK_, LD_) {WG_, PF_, LAG_, WK_, LD_},
    static const int forms[][5] = {TDM_PROBE_FORMS(TDM_PROBE_ROW)};
#undef TDM_PROBE_ROW
    if (f < 0 || f >= (int)(sizeof forms / sizeof forms[0])) return -1;
    for (int i = 0; i < 5; i++) form[i] = forms[f][i];
    return 0;
}

// xw for ntok (8, 16 or 32) rows of x [m][k] (rows >= m zero).
extern "C" int tdm_probe_pack_xw(const uint16_t *x, int m, int k, int ntok, uint16_t *xw, void *stream)
{
    pack_xw<<<264, 256, 0, (cudaStream_t)stream>>>(x, m, k, ntok, xw);
    TDM_LAUNCH_CHECK();
    return 0;
}

// y[ntok][n] from the weight w and xw of ntok rows (tdm_probe_pack_xw); part: chains x 32 x n floats;
// the form (wg warpgroups, pf weight slabs in flight, lag the producer's lag, wk chains across the warpgroups,
// ld the loader) one of TDM_PROBE_FORMS; tree 0: the main kernel alone (where a second kernel sums the chains,
// that kernel is left out). Returns 3 for a form that is not built or does not fit the shape (wk: wg must
// divide the chains).
extern "C" int tdm_probe_wgmma(const struct tdm_dweight *w, const uint16_t *xw, int ntok, int wg, int pf, int lag, int wk, int ld,
                               int chains, int tree, float *part, float *y, void *stream)
{
    Args a;
    a.w = (const uint8_t *)w->w + (size_t)w->row0 * (w->k / 2);
    a.scale = (const uint8_t *)w->scale + (size_t)w->row0 * (w->k / 16);
    a.n = (int)w->n;
    a.k = (int)w->k;
    a.slabs = (int)(w->k / 128);
    a.chains = chains;
    a.chain_len = (a.slabs + chains - 1) / chains;
    a.xw = xw;
    a.part = part;
    a.y = y;
    a.out_scale = w->scale2 * 128.0f;
    a.sk = tdm_mm::SkinnyArgs{};
    a.sk.k = a.k;
    if (wk && chains % wg) return 3;
    cudaStream_t st = (cudaStream_t)stream;
    cudaError_t e = ntok == 32   ? launch_form<32>(a, wg, pf, lag, wk, ld, st)
                    : ntok == 16 ? launch_form<16>(a, wg, pf, lag, wk, ld, st)
                                 : launch_form<8>(a, wg, pf, lag, wk, ld, st);
    if (e == cudaErrorNotSupported) return 3;
    TDM_CUDA_TRY(e);
    const int parts = wk ? chains / wg : chains;   // partial sums the second kernel adds
    if (!tree || parts == 1) return 0;
    const int tot = ntok * a.n;
    chain_tree<<<(tot + 255) / 256, 256, 0, st>>>(part, parts, a.n, ntok, a.out_scale, y);
    TDM_LAUNCH_CHECK();
    return 0;
}
