// attn.cu — decode attention for 1..32 new queries of one sequence against the BF16 KV cache
// (layers.h): flash-decoding over fixed chunks of TDM_ATTN_CHUNK positions, then an ordered
// combine that also applies the output gate.
#include "layers.h"
#include "layers_dev.cuh"
#include "cuda_check.h"

using namespace tdm_ly;

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

// Block (chunk c, query head h); warp w takes the rows w, w + 8, ... A row at position p sees the
// chunk's positions [c CH, min(c CH + CH, p + 1)); chunks that start after p are skipped (the
// combine never reads them). Lane l holds dims [l DPL, l DPL + DPL). Per row, in this order:
//   s_j = (q . k_j) * scale: lane-serial FMAs over its dims, then xor butterflies (the same bits in
//     every lane), kept in shared memory;
//   m = max_j s_j (exact in any order); l = sum_j exp(s_j - m): lane l serial over j = l mod 32,
//     then butterflies;
//   o[d] = sum_j bf16(exp(s_j - m)) v_j[d], serial over j.
// Nothing depends on M or on which warp serves the row.
//
// TREE (parent not NULL; layers.h, Trees): row r is a node at depth d, position p = p0 + d, and
// the positions it sees are a virtual sequence: p' < p0 is cache row p', p0 + i is the cache row
// p0 + path[i] of its ancestor at depth i (path[d] = r). Everything else is the chain's code over
// that sequence, so the chunks, the scores' order and every sum are those of the path as a chain.
template <int DPL, bool TREE>
__global__ void __launch_bounds__(ATT_WARPS * 32)
attn_partial_kernel(const uint16_t *q, const uint16_t *kc, const uint16_t *vc, const int32_t *parent, int M, int Hq,
                    int Hkv, int pos0, const int32_t *d_pos0, int NC, float *part_o, float *part_ml)
{
    constexpr int D = DPL * 32;
    const int c = blockIdx.x, h = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kvh = h / (Hq / Hkv);
    const int p0 = d_pos0 ? *d_pos0 : pos0;
    const int start = c * CH;
    const float scale = __fdiv_rn(1.0f, __fsqrt_rn((float)D));
    __shared__ float sc[ATT_WARPS][CH];  // per warp: the row's scores, then exp(s - m)
    __shared__ int32_t path[TREE ? ATT_WARPS : 1][TREE ? TDM_TREE_MAX : 1];  // per warp: the row's path
    for (int r = warp; r < M; r += ATT_WARPS) {
        int p = p0 + r;
        if constexpr (TREE) {
            const int d = tree_depth(parent, r);
            p = p0 + d;
            __syncwarp();  // the previous row's reads of path are done
            if (lane == 0)
                for (int x = r, i = d; i >= 0; i--, x = parent[x]) path[warp][i] = x;
            __syncwarp();
        }
        if (start > p) continue;  // warp-uniform
        const int end = min(start + CH, p + 1);
        float qr[DPL];
        load_bf16<DPL>(q + ((size_t)r * Hq + h) * D + lane * DPL, qr);
        const int n = end - start;
        float *ps = sc[warp];
        // unrolled so that the butterflies of several positions overlap; each position's sum is the same
#pragma unroll 4
        for (int jl = 0; jl < n; jl++) {
            int row = start + jl;
            if constexpr (TREE) row = row < p0 ? row : p0 + path[warp][row - p0];
            float kr[DPL];
            load_bf16<DPL>(kc + ((size_t)row * Hkv + kvh) * D + lane * DPL, kr);
            float d = 0.0f;
#pragma unroll
            for (int i = 0; i < DPL; i++) d = __fmaf_rn(qr[i], kr[i], d);
            d = __fmul_rn(warp_sum(d), scale);
            if (lane == 0) ps[jl] = d;
        }
        __syncwarp();
        float m = -INFINITY;
        for (int jl = lane; jl < n; jl += 32) m = fmaxf(m, ps[jl]);
        m = warp_max(m);
        float l = 0.0f;
        for (int jl = lane; jl < n; jl += 32) {
            const float e = expf(__fsub_rn(ps[jl], m));
            ps[jl] = e;
            l = __fadd_rn(l, e);
        }
        l = warp_sum(l);
        __syncwarp();
        float o[DPL];
#pragma unroll
        for (int i = 0; i < DPL; i++) o[i] = 0.0f;
#pragma unroll 4
        for (int jl = 0; jl < n; jl++) {
            const float pb = bfr(ps[jl]);
            int row = start + jl;
            if constexpr (TREE) row = row < p0 ? row : p0 + path[warp][row - p0];
            float vr[DPL];
            load_bf16<DPL>(vc + ((size_t)row * Hkv + kvh) * D + lane * DPL, vr);
#pragma unroll
            for (int i = 0; i < DPL; i++) o[i] = __fmaf_rn(pb, vr[i], o[i]);
        }
        __syncwarp();  // ps is rewritten by the warp's next row
        const size_t idx = ((size_t)r * Hq + h) * NC + c;
        float *po = part_o + idx * D + lane * DPL;
#pragma unroll
        for (int i = 0; i < DPL; i++) po[i] = o[i];
        if (lane == 0) {
            part_ml[idx * 2] = m;
            part_ml[idx * 2 + 1] = l;
        }
    }
}

// Block (query head h, row r), thread d: the row's chunks 0..p / CH added in ascending order, each
// scaled by exp(m_c - max_c m_c); then / l, ->bf16, * bf16(sigmoid(gate)) ->bf16 (tdm_ref_attn_head).
// With parent (a tree), row r's position is p0 + its depth.
__global__ void attn_combine_kernel(const float *part_o, const float *part_ml, const uint16_t *qg, int64_t ldqg, int Hq,
                                    int D, const int32_t *parent, int pos0, const int32_t *d_pos0, int NC, uint16_t *out)
{
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
        out[((size_t)r * Hq + h) * D + d] = attn_gated(__fdiv_rn(acc, l), g);
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
                       const int32_t *d_pos0, int ctx, float *scratch, uint16_t *out, void *stream)
{
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
    dim3 grid(chunks, Hq);
    if (parent) attn_partial_go<true>(grid, st, D, q, kcache, vcache, parent, M, Hq, Hkv, pos0, d_pos0, NC, part_o, part_ml);
    else attn_partial_go<false>(grid, st, D, q, kcache, vcache, NULL, M, Hq, Hkv, pos0, d_pos0, NC, part_o, part_ml);
    TDM_LAUNCH_CHECK();
    attn_combine_kernel<<<dim3(Hq, M), D, 0, st>>>(part_o, part_ml, qg, ldqg, Hq, D, parent, pos0, d_pos0, NC, out);
    TDM_LAUNCH_CHECK();
    return 0;
}

extern "C" int tdm_attn_decode(const uint16_t *q, const uint16_t *qg, int64_t ldqg, const uint16_t *kcache,
                               const uint16_t *vcache, int M, int Hq, int Hkv, int D, int pos0, const int32_t *d_pos0,
                               int ctx, float *scratch, uint16_t *out, void *stream)
{
    return attn_launch("tdm_attn_decode", q, qg, ldqg, kcache, vcache, NULL, M, Hq, Hkv, D, pos0, d_pos0, ctx, scratch,
                       out, stream);
}

extern "C" int tdm_attn_tree(const uint16_t *q, const uint16_t *qg, int64_t ldqg, const uint16_t *kcache,
                             const uint16_t *vcache, const int32_t *parent, int M, int Hq, int Hkv, int D, int pos0,
                             const int32_t *d_pos0, int ctx, float *scratch, uint16_t *out, void *stream)
{
    if (!parent) return tdm_errf("tdm_attn_tree: parent is NULL");
    return attn_launch("tdm_attn_tree", q, qg, ldqg, kcache, vcache, parent, M, Hq, Hkv, D, pos0, d_pos0, ctx, scratch,
                       out, stream);
}

extern "C" int64_t tdm_attn_decode_bytes(int M, int Hq, int Hkv, int D, int pos0)
{
    // the cache rows any query sees (K and V once), q, the gates, the output, and the partials
    // written and read back (one per row, head and chunk the row sees)
    int64_t chunks = 0;
    for (int r = 0; r < M; r++) chunks += (pos0 + r) / CH + 1;
    return (int64_t)(pos0 + M) * Hkv * D * 4 + (int64_t)M * Hq * D * 6 + chunks * Hq * ((int64_t)D + 2) * 8;
}
