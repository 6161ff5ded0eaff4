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

template <int DPL>
__device__ __forceinline__ void load_bf16(const uint16_t *p, float (&x)[DPL])
{
    if constexpr (DPL == 8) {
        const uint4 u = *reinterpret_cast<const uint4 *>(p);
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            x[2 * i] = __uint_as_float(w[i] << 16);
            x[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
        }
    } else if constexpr (DPL == 4) {
        const uint2 u = *reinterpret_cast<const uint2 *>(p);
        x[0] = __uint_as_float(u.x << 16);
        x[1] = __uint_as_float(u.x & 0xffff0000u);
        x[2] = __uint_as_float(u.y << 16);
        x[3] = __uint_as_float(u.y & 0xffff0000u);
    } else {
        static_assert(DPL == 2, "D must be 64, 128 or 256");
        const uint32_t u = *reinterpret_cast<const uint32_t *>(p);
        x[0] = __uint_as_float(u << 16);
        x[1] = __uint_as_float(u & 0xffff0000u);
    }
}

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
//     position a lane, then butterflies; o_w[d] = sum_j bf16(exp(s_j - m_w)) v_j[d], serial over j
//     (lane l holds dims [l DPL, l DPL + DPL));
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
constexpr int JB = 8;                // positions a warp loads before it uses them (a tree's row)
// A chain's group: positions a warp loads before it uses them for the group's rows (at 256 dims
// 8 took 147 registers on sm_90, one block a SM; 4 takes 123, two; sm_121a's ptxas stops at 128
// registers and spilled at 4, so 2 there: the batch changes no sum)
#ifndef TDM_ATTN_JC256
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1200
#define TDM_ATTN_JC256 2
#else
#define TDM_ATTN_JC256 4
#endif
#endif
template <int DPL>
__host__ __device__ constexpr int jb_chain() { return DPL == 8 ? TDM_ATTN_JC256 : 8; }

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
// o += weight_j v_j over NB positions from j0 that the row sees, serial over j.
template <int NB, int DPL>
__device__ __forceinline__ void batch_v(const float *ps, int j0, int wn, const float (&vr)[NB][DPL], float (&o)[DPL])
{
#pragma unroll
    for (int b = 0; b < NB; b++) {
        if (j0 + b < wn) {
            const float pb = ps[j0 + b];
#pragma unroll
            for (int e2 = 0; e2 < DPL; e2++) o[e2] = __fmaf_rn(pb, vr[b][e2], o[e2]);
        }
    }
}

template <int DPL, bool TREE>
__global__ void __launch_bounds__(ATT_WARPS * 32)
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
        // the lane's dims of a batch of cache rows (x's length) from position j0 of row i's walk,
        // loaded before any is used
        auto load_rows = [&](const uint16_t *cache, int i, int j0, int wn, auto &x) {
            constexpr int NB = sizeof(x) / sizeof(x[0]);
#pragma unroll
            for (int b = 0; b < NB; b++)
                load_bf16<DPL>(cache + ((size_t)cache_row(i, j0 + b, wn) * Hkv + kvh) * D + lane * DPL, x[b]);
        };
        // a row at a time: a tree (a node's path is its own cache rows), and a group of one row (at
        // 256 dims the chain form's batches are half as long: twice the round trips, and a one-row
        // step measured 1 % slower with them)
        if (TREE || nr == 1) {
#pragma unroll
            for (int i = 0; i < RG; i++) {
                const int wn = max(0, min(SUB, pr[i] + 1 - ws));  // warp-uniform: positions row i sees here
                float m = -INFINITY, l = 0.0f;
                float o[DPL];
#pragma unroll
                for (int e = 0; e < DPL; e++) o[e] = 0.0f;
                if (wn > 0) {
                    float *ps = sc[i] + warp * SUB;
                    const uint16_t *const qrow[1] = {q + ((size_t)(r0 + i) * Hq + h) * D};
                    float *const prow[1] = {ps};
                    const int wrow[1] = {wn};
                    mma_scores<D>(qrow, 1, [&](int j) { return kc + ((size_t)cache_row(i, j, wn) * Hkv + kvh) * D; }, scale,
                                  lane, prow, wrow);
                    __syncwarp();
                    const float s = lane < wn ? ps[lane] : -INFINITY;
                    m = warp_max(s);
                    const float e = lane < wn ? expf(__fsub_rn(s, m)) : 0.0f;
                    if (lane < wn) ps[lane] = bfr(e);   // the V sum's weight, rounded once a position
                    l = warp_sum(e);
                    __syncwarp();
                    for (int j0 = 0; j0 < wn; j0 += JB) {
                        float vr[JB][DPL];
                        load_rows(vc, i, j0, wn, vr);
                        batch_v<JB, DPL>(ps, j0, wn, vr, o);
                    }
                }
                if (lane == 0) {
                    wml[i][warp][0] = m;
                    wml[i][warp][1] = l;
                }
#pragma unroll
                for (int e = 0; e < DPL; e++) wo[i][warp][lane * DPL + e] = o[e];
            }
        } else {
            // a chain of 2..RG rows: row i sees the positions up to p0 + r0 + i, so the group's rows
            // see nested prefixes of the warp's sub-chunk, and the warp loads each K and V row once
            // for all of them and runs their sums side by side. Each row's operations and their order
            // are the per-row form's, so a row's bits do not depend on the form its group takes.
            constexpr int JC = jb_chain<DPL>();
            int wn[RG], wmax = 0;  // warp-uniform: positions row i sees here
#pragma unroll
            for (int i = 0; i < RG; i++) wn[i] = max(0, min(SUB, pr[i] + 1 - ws)), wmax = max(wmax, wn[i]);
            float o[RG][DPL];
#pragma unroll
            for (int i = 0; i < RG; i++)
#pragma unroll
                for (int e = 0; e < DPL; e++) o[i][e] = 0.0f;
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
                mma_scores<D>(qrows, nr, [&](int j) { return kc + ((size_t)cache_row(0, j, wmax) * Hkv + kvh) * D; }, scale,
                              lane, prows, wn);
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
                for (int j0 = 0; j0 < wmax; j0 += JC) {
                    float vr[JC][DPL];
                    load_rows(vc, 0, j0, wmax, vr);
#pragma unroll
                    for (int i = 0; i < RG; i++) batch_v<JC, DPL>(sc[i] + warp * SUB, j0, wn[i], vr, o[i]);
                }
            }
#pragma unroll
            for (int i = 0; i < RG; i++) {
                if (lane == 0) {
                    wml[i][warp][0] = m[i];
                    wml[i][warp][1] = l[i];
                }
#pragma unroll
                for (int e = 0; e < DPL; e++) wo[i][warp][lane * DPL + e] = o[i][e];
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
