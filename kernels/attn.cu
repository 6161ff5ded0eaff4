// attn.cu — decode attention for 1..32 new queries of one sequence against the BF16 KV cache
// (layers.h): flash-decoding over fixed chunks of TDM_ATTN_CHUNK positions, then an ordered
// combine that also applies the output gate.
#include "layers.h"
#include "layers_dev.cuh"
#include "mm_skinny.cuh"
#include "cuda_check.h"
#include "pdl.cuh"

using namespace tdm_ly;
using tdm_mm::mma_bf16;

namespace {

constexpr int CH = TDM_ATTN_CHUNK;
constexpr int ATT_WARPS = 8;

// Block (query head h, z, chunk c) = blockIdx (x, y, z), rows in groups of RG (group g = rows [g RG,
// g RG + RG), in block z = g mod gridDim.y: the groups run side by side, not one after another in one
// block, so a 16-row verify takes about as long as 4 rows). The chunk is the grid's slowest index, so
// the blocks of the last chunk, which the rows see only in part (and of chunks past every row, which
// return at once), are dispatched last: where the grid is more than the SMs hold at once (a 27B
// layer's 16-row verify at ~550 positions: 288 blocks, 264 resident at two a SM), the light blocks
// make the tail. Measured on the H200 against the chunk as the fastest index (bench/NOTES.md): a
// 16-layer 27B's attention 44.7 -> 42.8 us a step, 195.0 -> 185.1 a 16-row round, 334.9 -> 314.8 a
// 32-row round. Warp w takes the SUB positions
// [c CH + w SUB, c CH + w SUB + SUB) of the chunk (its sub-chunk) for every row of the group, so at
// one row all eight warps stream the chunk's K and V (a warp a row left seven idle and its loads
// in series: ~110 us a 27B layer at 4096 positions). A row at position p sees the sub-chunk's
// positions up to p; sub-chunks past p are skipped, and chunks that start after p too (the
// combine never reads them). Per row, in this order:
//   s_j = (q . k_j) * scale: the dot product on the tensor cores (mma_scores: the same k steps for
//     every row and form), kept in shared memory;
//   per sub-chunk w: m_w = max_j s_j (exact in any order); l_w = sum_j exp(s_j - m_w), one
//     position a lane, then butterflies; o_w[d] = sum_j bf16(exp(s_j - m_w)) v_j[d] on the tensor cores
//     (mma_pv: the same k steps for every row and form);
//   the chunk: m = max_w m_w; l = sum_w exp(m_w - m) l_w and o[d] = sum_w exp(m_w - m) o_w[d], over
//     the sub-chunks the row sees, w ascending.
// Nothing depends on M, on the group a row falls in or on which thread serves it. A chain's rows
// see nested prefixes of the same cache rows, so a warp loads each K and V row once for the
// group's rows and runs their sums side by side.
//
// TREE (parent not NULL; layers.h, Trees): row r is a node at depth d, position p = p0 + d, and
// the positions it sees are a virtual sequence: p' < p0 is cache row p', p0 + i is the cache row
// p0 + path[i] of its ancestor at depth i (path[d] = r). The rows' paths differ, so a warp walks
// them one at a time, each with the chain's operations over its sequence: the chunks, the scores'
// order and every sum are those of the path as a chain.
constexpr int SUB = CH / ATT_WARPS;  // positions a warp: one a lane in the softmax
static_assert(SUB == 32, "a sub-chunk is one position a lane");
// Rows a group, a block each (the partials of 4 rows of 256 dims fill 32 KB). One row a block
// (walking no rows in series) was measured and lost at 8 and 32 rows on the H200 (bench/NOTES.md,
// the A/B of one row a block), so 4 it is.
constexpr int RG = 4;
// The steps of a row's walk over a sub-chunk, shared by the per-row and the chain forms (so a row's
// operations and their order are the same in both). ps: the row's scores in the warp's sub-chunk
// (sc[row] + warp SUB); wn: the positions the row sees there.
// The scores of the warp's sub-chunk (SUB = 32 positions) on the tensor cores (mma.m16n8k16, BF16 in,
// FP32 sums): A row g < nr is q row qrow[g] (rows nr..15 zero), B column j (four n8-tiles) the cache row
// krow(j) (the caller clamps j to rows the row sees: every load is a real row); score = sum * scale,
// stored in ps[g][j] for j < wn[g]. The k slots of step 2u + v take dims 32u + 8t + 4v .. + 3 of lane
// t = lane % 4 (any slot order serves if A and B agree): each lane's q and K loads are 16 contiguous
// bytes, and a (row, position) score is the same sum of the same products in the same k steps whatever
// rows share the tile or which form (chain, per row, tree) runs it: the twins' bits. (Before, lane-serial
// FMAs over the lane's dims and butterflies: ~26 instructions a score; ~20 M warp instructions of a
// 27B layer's 16-row verify at ~550 positions, bench/NOTES.md.)
template <int D, int N, class KRow>
__device__ __forceinline__ void mma_scores(const uint16_t *const (&qrow)[N], int nr, KRow krow, float scale, int lane,
                                           float *const (&ps)[N], const int (&wn)[N])
{
    static_assert(SUB == 32, "a sub-chunk is four n8-tiles");
    static_assert(N <= 8, "A rows 0..7 hold the rows");
    constexpr int U = D / 32;   // 32-dim groups, two k steps each
    const int g = lane >> 2, t = lane & 3;
    // this lane's row g, picked by selects (an index by lane would put the arrays in local memory)
    const uint16_t *qg = qrow[0];
    float *pg = ps[0];
    int wg = 0;
#pragma unroll
    for (int i = 0; i < N; i++)
        if (g == i) qg = qrow[i], pg = ps[i], wg = wn[i];
    const bool live = g < nr;
    uint4 qa[U];   // A row g: dims 32u + 8t .. + 7
#pragma unroll
    for (int u = 0; u < U; u++)
        qa[u] = live ? __ldg(reinterpret_cast<const uint4 *>(qg + 32 * u + 8 * t)) : make_uint4(0, 0, 0, 0);
    float acc[SUB / 8][4];
#pragma unroll
    for (int nt = 0; nt < SUB / 8; nt++)
#pragma unroll
        for (int c = 0; c < 4; c++) acc[nt][c] = 0.0f;
    const uint16_t *kr[SUB / 8];   // B column g of each n8-tile
#pragma unroll
    for (int nt = 0; nt < SUB / 8; nt++) kr[nt] = krow(8 * nt + g) + 8 * t;
#pragma unroll
    for (int u = 0; u < U; u++) {
        uint4 kb[SUB / 8];
#pragma unroll
        for (int nt = 0; nt < SUB / 8; nt++) kb[nt] = __ldg(reinterpret_cast<const uint4 *>(kr[nt] + 32 * u));
#pragma unroll
        for (int nt = 0; nt < SUB / 8; nt++) {   // A rows 8..15 are zero: registers 1 and 3
            mma_bf16(acc[nt], qa[u].x, 0u, qa[u].y, 0u, kb[nt].x, kb[nt].y);
            mma_bf16(acc[nt], qa[u].z, 0u, qa[u].w, 0u, kb[nt].z, kb[nt].w);
        }
    }
    if (live)   // C: row g, columns 8 nt + 2t, + 1
#pragma unroll
        for (int nt = 0; nt < SUB / 8; nt++)
#pragma unroll
            for (int e = 0; e < 2; e++)
                if (8 * nt + 2 * t + e < wg) pg[8 * nt + 2 * t + e] = __fmul_rn(acc[nt][e], scale);
}
// movmatrix: lane (g, t) gives row g, columns 2t, 2t + 1 of an 8 x 8 BF16 matrix and gets those of its
// transpose.
__device__ __forceinline__ uint32_t transpose8x8(uint32_t x)
{
    uint32_t y;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
    return y;
}
// o_w = sum_j p_j v_j over the warp's sub-chunk on the tensor cores (mma.m16n8k16, BF16 in, FP32
// sums), for the rows n < nr (p_j = ps[n ps_stride + j], already BF16 values, for j < wn[n]; 0 past it):
// A = V^T (16 dims x 16 positions), B = P (16 positions x rows as n8 columns; columns nr..7 zero).
// Lane (g, t) loads 16 bytes of position 8b + g (b = 0..3; vrow: the cache row, clamped by the caller
// to one the rows see), dims 32bb + 8t .. + 7; movmatrix of its register r gives the A fragment of the dims
// 32bb + 8(g >> 1) + 2r + (g & 1) (an order of the 16 dims of an m-tile: A and C agree). Positions
// past wmax are not loaded (zeros). A row's sum is over the same positions in the same k steps
// whatever rows share the tile or which form runs it, except that a position the row does not see
// adds p = 0 times whichever V row the tile holds there (the chain form's later rows, the per-row
// form's clamped row, zeros): a zero product of either sign, which changes a sum only when the sum
// is itself an exact zero; "+ 0.0f" then makes it +0 in every form. (A V that is not finite there
// would make 0 x V a NaN: a cache row that a later row of the chain wrote, which the model's own
// rounding never makes.) Written to wo[n wo_stride + d] for the rows n < nr. (Before, lane-serial
// FMAs over the lane's 8 dims a position and row: ~1000 instructions a sub-chunk of 4 rows. Measured
// on the H200, 16-layer 27B, attention us a graph: 131.6 -> 94.4 a 16-row verify, 229.5 -> 171.5 at
// 32 rows, 40.6 -> 43.4 a one-row step; bench/NOTES.md.)
// TDM_ATTN_PVB (1, 2, 4 or 8): the 32-dim groups of V whose loads a lane issues together (4 16-byte
// loads a group) before their mmas; the groups of a sub-chunk take D / 32 / PVB round trips. 2 on
// sm_90 (a one-row step's attention 51.2 us a 16-layer graph at 1, 43.4 at 2); 1 on sm_121a, whose
// ptxas (128 registers at most, att_min_blocks) used a stack frame or spilled at 2. The batch changes
// no sum.
#ifndef TDM_ATTN_PVB
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1200
#define TDM_ATTN_PVB 1
#else
#define TDM_ATTN_PVB 2
#endif
#endif
template <int D, int N, class VRow>
__device__ __forceinline__ void mma_pv(const float *ps, int ps_stride, int nr, const int (&wn)[N], int wmax, VRow vrow,
                                       int lane, float *wo, int wo_stride)
{
    static_assert(SUB == 32, "a sub-chunk is two k steps of 16 positions");
    static_assert(N <= 8, "B columns 0..7 hold the rows");
    const int g = lane >> 2, t = lane & 3;
    const float *pg = ps + g * ps_stride;
    int wg = 0;   // row g's positions (0: no row)
#pragma unroll
    for (int i = 0; i < N; i++)
        if (g == i) wg = i < nr ? wn[i] : 0;
    auto pbits = [&](int j) { return j < wg ? __float_as_uint(pg[j]) : 0u; };   // p_j's BF16 bits << 16
    uint32_t pb[2][2];   // B: positions 16ks + 2t, + 1 (and + 8) of row g
#pragma unroll
    for (int ks = 0; ks < 2; ks++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int j = 16 * ks + 8 * h + 2 * t;
            pb[ks][h] = (pbits(j) >> 16) | (pbits(j + 1) & 0xffff0000u);
        }
    const uint16_t *vr[4];   // position 8b + g's dims 8t .. + 7 of each 32-dim group
#pragma unroll
    for (int b = 0; b < 4; b++) vr[b] = 8 * b < wmax ? vrow(8 * b + g) + 8 * t : nullptr;
    // the output rows 2t, 2t + 1 of this lane's C registers
    float *const o0 = wo + 2 * t * wo_stride, *const o1 = o0 + wo_stride;
    const bool w0 = 2 * t < nr, w1 = 2 * t + 1 < nr;
    auto load_v = [&](uint4(&v)[4], int bb) {
#pragma unroll
        for (int b = 0; b < 4; b++)
            v[b] = vr[b] ? __ldg(reinterpret_cast<const uint4 *>(vr[b] + 32 * bb)) : make_uint4(0, 0, 0, 0);
    };
    constexpr int PVB = TDM_ATTN_PVB < D / 32 ? TDM_ATTN_PVB : D / 32;
    static_assert((D / 32) % PVB == 0, "a batch is 1, 2, 4 or 8 groups");
#pragma unroll 1
    for (int b0 = 0; b0 < D / 32; b0 += PVB) {
        uint4 vb[PVB][4];
#pragma unroll
        for (int q = 0; q < PVB; q++) load_v(vb[q], b0 + q);
#pragma unroll
        for (int q = 0; q < PVB; q++) {
            const int bb = b0 + q;
            const uint4 (&v)[4] = vb[q];
            uint32_t a[4][4];   // [position block][r]: dims of S_r, positions 8b + 2t, + 1
#pragma unroll
            for (int b = 0; b < 4; b++) {
                a[b][0] = transpose8x8(v[b].x);
                a[b][1] = transpose8x8(v[b].y);
                a[b][2] = transpose8x8(v[b].z);
                a[b][3] = transpose8x8(v[b].w);
            }
            float acc[2][4];   // m-tile mt: dims S_2mt (C rows g) and S_2mt+1 (rows g + 8)
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int c = 0; c < 4; c++) acc[mt][c] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < 2; ks++) {
                if (16 * ks >= wmax) break;
#pragma unroll
                for (int mt = 0; mt < 2; mt++)
                    mma_bf16(acc[mt], a[2 * ks][2 * mt], a[2 * ks][2 * mt + 1], a[2 * ks + 1][2 * mt],
                             a[2 * ks + 1][2 * mt + 1], pb[ks][0], pb[ks][1]);
            }
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                const int d = 32 * bb + 8 * (g >> 1) + 4 * mt + (g & 1);   // C row g; row g + 8 is d + 2
                if (w0) o0[d] = __fadd_rn(acc[mt][0], 0.0f), o0[d + 2] = __fadd_rn(acc[mt][2], 0.0f);
                if (w1) o1[d] = __fadd_rn(acc[mt][1], 0.0f), o1[d + 2] = __fadd_rn(acc[mt][3], 0.0f);
            }
        }
    }
}

// The blocks a SM that ptxas is told to fit (0: none). Without a minimum ptxas chose 80 registers for
// the 128-dim tree form on sm_90 and 64 for the 64-dim form on sm_121a, and spilled; with 2 (128
// registers at most) nothing spills. The other sm_90 forms are left to ptxas: 2 made the 256-dim
// chain form spill. t/kernel-resources.t checks every form.
template <int DPL, bool TREE>
__host__ __device__ constexpr int att_min_blocks()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1200
    return 2;
#else
    return DPL == 4 && TREE ? 2 : 0;
#endif
}
template <int DPL, bool TREE>
__global__ void __launch_bounds__(ATT_WARPS * 32, att_min_blocks<DPL, TREE>())
attn_partial_kernel(const uint16_t *q, const uint16_t *kc, const uint16_t *vc, const int32_t *parent, int M, int Hq,
                    int Hkv, int pos0, const int32_t *d_pos0, int NC, float *part_o, float *part_ml)
{
    constexpr int D = DPL * 32;
    const int c = blockIdx.z, h = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kvh = h / (Hq / Hkv);
    const int p0 = d_pos0 ? *d_pos0 : pos0;
    const int start = c * CH, ws = start + warp * SUB;  // the chunk's and the warp's first position
    const float scale = __fdiv_rn(1.0f, __fsqrt_rn((float)D));
    __shared__ float sc[RG][CH];                    // per row: the scores, then bf16(exp(s - m_w))
    __shared__ float wml[RG][ATT_WARPS][2];         // per row and sub-chunk: m_w, l_w
    __shared__ float wo[RG][ATT_WARPS][D];          // per row and sub-chunk: o_w
    __shared__ int32_t path[TREE ? RG : 1][TREE ? TDM_TREE_MAX : 1];  // per row: its path
    for (int r0 = blockIdx.y * RG; r0 < M; r0 += gridDim.y * RG) {  // the block's groups of rows
        const int nr = min(RG, M - r0);
        int pr[RG];  // the group's positions (-1: no row)
#pragma unroll
        for (int i = 0; i < RG; i++) pr[i] = i < nr ? p0 + (TREE ? tree_depth(parent, r0 + i) : r0 + i) : -1;
        if constexpr (TREE) {
            __syncthreads();  // the previous group's reads of path are done
            if (threadIdx.x < nr)
                for (int x = r0 + threadIdx.x, i = pr[threadIdx.x] - p0; i >= 0; i--, x = parent[x])
                    path[threadIdx.x][i] = x;
            __syncthreads();
        }
        bool seen = false;  // block-uniform: a row of the group sees the chunk
#pragma unroll
        for (int i = 0; i < RG; i++) seen |= pr[i] >= start;
        if (!seen) continue;
        // the cache row of the warp's position jl (clamped to the row's last: every load is a row it sees)
        auto cache_row = [&](int i, int jl, int wn) {
            int row = ws + min(jl, wn - 1);
            if constexpr (TREE) row = row < p0 ? row : p0 + path[i][row - p0];
            return row;
        };
        // head kvh of the K or V cache row of position j of row i's walk (wn: the positions it sees in
        // the warp's sub-chunk)
        auto row_ptr = [&](const uint16_t *cache, int i, int j, int wn) {
            return cache + ((size_t)cache_row(i, j, wn) * Hkv + kvh) * D;
        };
        // a row at a time: a tree (a node's path is its own cache rows)
        if constexpr (TREE) {
#pragma unroll
            for (int i = 0; i < RG; i++) {
                const int wn = max(0, min(SUB, pr[i] + 1 - ws));  // warp-uniform: positions row i sees here
                float m = -INFINITY, l = 0.0f;
                if (wn > 0) {
                    float *ps = sc[i] + warp * SUB;
                    const uint16_t *const qrow[1] = {q + ((size_t)(r0 + i) * Hq + h) * D};
                    float *const prow[1] = {ps};
                    const int wrow[1] = {wn};
                    mma_scores<D>(qrow, 1, [&](int j) { return row_ptr(kc, i, j, wn); }, scale, lane, prow, wrow);
                    __syncwarp();
                    const float s = lane < wn ? ps[lane] : -INFINITY;
                    m = warp_max(s);
                    const float e = lane < wn ? expf(__fsub_rn(s, m)) : 0.0f;
                    if (lane < wn) ps[lane] = bfr(e);   // the V sum's weight, rounded once a position
                    l = warp_sum(e);
                    __syncwarp();
                    mma_pv<D>(ps, 0, 1, wrow, wn, [&](int j) { return row_ptr(vc, i, j, wn); }, lane, wo[i][warp], 0);
                }
                if (lane == 0) {
                    wml[i][warp][0] = m;
                    wml[i][warp][1] = l;
                }
            }
        } else {
            // a chain of 1..RG rows: row i sees the positions up to p0 + r0 + i, so the group's rows
            // see nested prefixes of the warp's sub-chunk, and the warp loads each K and V row once
            // for all of them and runs their sums side by side. Each row's operations and their order
            // are the per-row form's, so a row's bits do not depend on the form its group takes.
            int wn[RG], wmax = 0;  // warp-uniform: positions row i sees here
#pragma unroll
            for (int i = 0; i < RG; i++) wn[i] = max(0, min(SUB, pr[i] + 1 - ws)), wmax = max(wmax, wn[i]);
            float m[RG], l[RG];
#pragma unroll
            for (int i = 0; i < RG; i++) m[i] = -INFINITY, l[i] = 0.0f;
            if (wmax > 0) {
                const uint16_t *qrow[RG];
                float *pss[RG];
#pragma unroll
                for (int i = 0; i < RG; i++) {
                    qrow[i] = q + ((size_t)(r0 + min(i, nr - 1)) * Hq + h) * D;
                    pss[i] = sc[i] + warp * SUB;
                }
                const uint16_t *const(&qrows)[RG] = qrow;
                float *const(&prows)[RG] = pss;
                mma_scores<D>(qrows, nr, [&](int j) { return row_ptr(kc, 0, j, wmax); }, scale, lane, prows, wn);
                __syncwarp();
#pragma unroll
                for (int i = 0; i < RG; i++) {
                    if (wn[i] == 0) continue;
                    float *ps = sc[i] + warp * SUB;
                    const float s = lane < wn[i] ? ps[lane] : -INFINITY;
                    m[i] = warp_max(s);
                    const float e = lane < wn[i] ? expf(__fsub_rn(s, m[i])) : 0.0f;
                    if (lane < wn[i]) ps[lane] = bfr(e);
                    l[i] = warp_sum(e);
                }
                __syncwarp();
                mma_pv<D>(sc[0] + warp * SUB, CH, nr, wn, wmax, [&](int j) { return row_ptr(vc, 0, j, wmax); }, lane,
                          wo[0][warp], ATT_WARPS * D);
            }
#pragma unroll
            for (int i = 0; i < RG; i++)
                if (lane == 0) {
                    wml[i][warp][0] = m[i];
                    wml[i][warp][1] = l[i];
                }
        }
        __syncthreads();
        // the chunk's partial of each row that sees it: the sub-chunks it sees, w ascending
        for (int t = threadIdx.x; t < nr * D; t += ATT_WARPS * 32) {
            const int i = t / D, d = t % D;
            int p = -1;
#pragma unroll
            for (int k = 0; k < RG; k++) p = k == i ? pr[k] : p;
            if (p < start) continue;
            const int nw = min(ATT_WARPS, (p - start) / SUB + 1);
            float m = -INFINITY;
            for (int w = 0; w < nw; w++) m = fmaxf(m, wml[i][w][0]);
            float l = 0.0f, acc = 0.0f;
            for (int w = 0; w < nw; w++) {
                const float f = expf(__fsub_rn(wml[i][w][0], m));
                l = __fadd_rn(l, __fmul_rn(f, wml[i][w][1]));
                acc = __fadd_rn(acc, __fmul_rn(f, wo[i][w][d]));
            }
            const size_t idx = ((size_t)(r0 + i) * Hq + h) * NC + c;
            part_o[idx * D + d] = acc;
            if (d == 0) {
                part_ml[idx * 2] = m;
                part_ml[idx * 2 + 1] = l;
            }
        }
        __syncthreads();  // sc, wml and wo are rewritten by the next group
    }
}

// Block (query head h, row r), thread d: the row's chunks 0..p / CH added in ascending order, each
// scaled by exp(m_c - max_c m_c); then / l, ->bf16, * bf16(sigmoid(gate)) ->bf16 (tdm_ref_attn_head).
// With parent (a tree), row r's position is p0 + its depth.
__global__ void attn_combine_kernel(const float *part_o, const float *part_ml, const uint16_t *qg, int64_t ldqg, int Hq,
                                    int D, const int32_t *parent, int pos0, const int32_t *d_pos0, int NC, uint16_t *out,
                                    uint16_t *outb)
{
    tdm_pdl::release();   // o_proj may start its weight loads (pdl.cuh)
    const int h = blockIdx.x, r = blockIdx.y;
    const int p = (d_pos0 ? *d_pos0 : pos0) + (parent ? tree_depth(parent, r) : r), last = p / CH;
    const size_t base = ((size_t)r * Hq + h) * NC;
    float m = -INFINITY;
    for (int c = 0; c <= last; c++) m = fmaxf(m, part_ml[(base + c) * 2]);
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float l = 0.0f, acc = 0.0f;
        for (int c = 0; c <= last; c++) {
            const float f = expf(__fsub_rn(part_ml[(base + c) * 2], m));
            l = __fadd_rn(l, __fmul_rn(f, part_ml[(base + c) * 2 + 1]));
            acc = __fadd_rn(acc, __fmul_rn(f, part_o[(base + c) * D + d]));
        }
        const float g = bf2f(qg[(size_t)r * ldqg + (size_t)h * 2 * D + D + d]);
        const uint16_t v = attn_gated(__fdiv_rn(acc, l), g);
        out[((size_t)r * Hq + h) * D + d] = v;
        xb_put(outb, r, (int64_t)h * D + d, (int64_t)Hq * D, v);
    }
}

}  // namespace

extern "C" size_t tdm_attn_scratch_bytes(int M, int Hq, int D, int ctx)
{
    const size_t NC = ((size_t)ctx + CH - 1) / CH;
    return (size_t)M * Hq * NC * ((size_t)D + 2) * sizeof(float);
}

template <bool TREE>
static void attn_partial_go(dim3 grid, cudaStream_t st, int D, const uint16_t *q, const uint16_t *kcache,
                            const uint16_t *vcache, const int32_t *parent, int M, int Hq, int Hkv, int pos0,
                            const int32_t *d_pos0, int NC, float *part_o, float *part_ml)
{
    if (D == 256)
        attn_partial_kernel<8, TREE><<<grid, ATT_WARPS * 32, 0, st>>>(q, kcache, vcache, parent, M, Hq, Hkv, pos0, d_pos0,
                                                                       NC, part_o, part_ml);
    else if (D == 128)
        attn_partial_kernel<4, TREE><<<grid, ATT_WARPS * 32, 0, st>>>(q, kcache, vcache, parent, M, Hq, Hkv, pos0, d_pos0,
                                                                       NC, part_o, part_ml);
    else
        attn_partial_kernel<2, TREE><<<grid, ATT_WARPS * 32, 0, st>>>(q, kcache, vcache, parent, M, Hq, Hkv, pos0, d_pos0,
                                                                       NC, part_o, part_ml);
}

// parent NULL: a chain (row r at pos0 + r); else a tree (layers.h, Trees).
static int attn_launch(const char *who, const uint16_t *q, const uint16_t *qg, int64_t ldqg, const uint16_t *kcache,
                       const uint16_t *vcache, const int32_t *parent, int M, int Hq, int Hkv, int D, int pos0,
                       const int32_t *d_pos0, int ctx, float *scratch, uint16_t *out, uint16_t *outb, void *stream)
{
    if (xb_refused(who, outb, M)) return -1;
    if (M < 0 || Hkv <= 0 || Hq <= 0 || Hq % Hkv || (D != 64 && D != 128 && D != 256) || ldqg < (int64_t)Hq * 2 * D ||
        (parent && M > TDM_TREE_MAX))
        return tdm_errf("%s: bad shape M %d, Hq %d, Hkv %d, D %d (64, 128 or 256), ldqg %lld%s", who, M, Hq, Hkv, D,
                        (long long)ldqg, parent ? " (a tree: M at most 32)" : "");
    if (pos0 < 0 || (int64_t)pos0 + M > ctx)
        return tdm_errf("%s: positions %d..%d exceed the cache of %d", who, pos0, pos0 + M - 1, ctx);
    if (M == 0) return 0;
    const int NC = (ctx + CH - 1) / CH;
    // the chunks any row can see (a node's depth is at most its row); with d_pos0 the device value
    // is at most pos0 (layers.h)
    const int chunks = (pos0 + M - 1) / CH + 1;
    float *part_o = scratch, *part_ml = scratch + (size_t)M * Hq * NC * D;
    cudaStream_t st = (cudaStream_t)stream;
    dim3 grid(Hq, (M + RG - 1) / RG, chunks);  // a block for each head, group of rows and chunk (the chunk slowest)
    if (parent) attn_partial_go<true>(grid, st, D, q, kcache, vcache, parent, M, Hq, Hkv, pos0, d_pos0, NC, part_o, part_ml);
    else attn_partial_go<false>(grid, st, D, q, kcache, vcache, NULL, M, Hq, Hkv, pos0, d_pos0, NC, part_o, part_ml);
    TDM_LAUNCH_CHECK();
    attn_combine_kernel<<<dim3(Hq, M), D, 0, st>>>(part_o, part_ml, qg, ldqg, Hq, D, parent, pos0, d_pos0, NC, out, outb);
    TDM_LAUNCH_CHECK();
    return 0;
}

extern "C" int tdm_attn_decode(const uint16_t *q, const uint16_t *qg, int64_t ldqg, const uint16_t *kcache,
                               const uint16_t *vcache, int M, int Hq, int Hkv, int D, int pos0, const int32_t *d_pos0,
                               int ctx, float *scratch, uint16_t *out, uint16_t *outb, void *stream)
{
    return attn_launch("tdm_attn_decode", q, qg, ldqg, kcache, vcache, NULL, M, Hq, Hkv, D, pos0, d_pos0, ctx, scratch,
                       out, outb, stream);
}

extern "C" int tdm_attn_tree(const uint16_t *q, const uint16_t *qg, int64_t ldqg, const uint16_t *kcache,
                             const uint16_t *vcache, const int32_t *parent, int M, int Hq, int Hkv, int D, int pos0,
                             const int32_t *d_pos0, int ctx, float *scratch, uint16_t *out, uint16_t *outb,
                             void *stream)
{
    if (!parent) return tdm_errf("tdm_attn_tree: parent is NULL");
    return attn_launch("tdm_attn_tree", q, qg, ldqg, kcache, vcache, parent, M, Hq, Hkv, D, pos0, d_pos0, ctx, scratch,
                       out, outb, stream);
}

extern "C" int64_t tdm_attn_decode_bytes(int M, int Hq, int Hkv, int D, int pos0)
{
    // the cache rows any query sees (K and V once), q, the gates, the output, and the partials
    // written and read back (one per row, head and chunk the row sees)
    int64_t chunks = 0;
    for (int r = 0; r < M; r++) chunks += (pos0 + r) / CH + 1;
    return (int64_t)(pos0 + M) * Hkv * D * 4 + (int64_t)M * Hq * D * 6 + chunks * Hq * ((int64_t)D + 2) * 8;
}
