// moe_route.cu — the mixture-of-experts router for M rows (layers.h): softmax, top-k with ties to
// the lower expert id, renormalisation, BF16 weights.
#include "layers.h"
#include "layers_dev.cuh"
#include "cuda_check.h"

using namespace tdm_ly;

namespace {

constexpr int ROUTE_THREADS = 256;
constexpr int ROUTE_MAX_E = TDM_ROUTE_MAX_E;
constexpr int ROUTE_MAX_K = TDM_ROUTE_MAX_K;

// The selection's order key of a probability p (in [0, 1] or NaN): for p >= 0 the bits of p order as
// p does, so one 32-bit max picks the largest; a NaN (a row of NaN logits) ranks as 0.
__device__ __forceinline__ uint32_t route_key(float p)
{
    return p == p ? __float_as_uint(p) : 0u;
}

// Lane l's best candidate among experts l, l + 32, ... that rank below (lk, li), its last expert
// taken (li < 0: none yet): the largest key, ties to the lower id. The experts a lane gives up are a
// prefix of its own order, so "below the last one taken" is "not taken". bi = -1: none left.
__device__ __forceinline__ void route_lane_best(const float *ps, int E, int lane, uint32_t lk, int li, uint32_t &bk,
                                                int &bi)
{
    bk = 0u;
    bi = -1;
    for (int e = lane; e < E; e += 32) {
        const uint32_t key = route_key(ps[e]);
        const bool below = li < 0 || key < lk || (key == lk && e > li);
        if (below && (bi < 0 || key > bk)) { bk = key; bi = e; }
    }
}

// One block a row, tdm_ref_route's steps: m = max (exact); p_e = exp(l_e - m); s = sum p_e (thread-
// serial over a stride of 256, butterflies, the 8 warps in order: not the CPU's serial order);
// p_e /= s; then warp 0 alone takes k rounds of "the largest p not taken, ties to the lower id":
// each lane holds its best candidate, a round is one max of the keys and one min of the ids that
// carry it (redux, no block barrier), and only the lane that gave the winner looks again; then the
// reference's serial renormalisation. The selection is the block-argmax rounds' (the same pair: the
// order is total), so the ids and weights are bit for bit those rounds'.
__global__ void __launch_bounds__(ROUTE_THREADS)
route_kernel(const uint16_t *logits, int64_t ld, int E, int k, int norm_topk, int32_t *sel, uint16_t *w)
{
    extern __shared__ float ps[];                     // [E]
    __shared__ float red[ROUTE_THREADS / 32];
    __shared__ float wsel[ROUTE_MAX_K];
    __shared__ int isel[ROUTE_MAX_K];
    const int r = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const uint16_t *lr = logits + (size_t)r * ld;
    float m = -INFINITY;
    for (int e = tid; e < E; e += ROUTE_THREADS) {
        ps[e] = bf2f(lr[e]);
        m = fmaxf(m, ps[e]);
    }
    m = warp_max(m);
    if (lane == 0) red[warp] = m;
    __syncthreads();
    m = red[0];
    for (int i = 1; i < ROUTE_THREADS / 32; i++) m = fmaxf(m, red[i]);
    __syncthreads();
    float s = 0.0f;
    for (int e = tid; e < E; e += ROUTE_THREADS) {
        ps[e] = expf(__fsub_rn(ps[e], m));
        s = __fadd_rn(s, ps[e]);
    }
    s = warp_sum(s);
    if (lane == 0) red[warp] = s;
    __syncthreads();
    s = red[0];
    for (int i = 1; i < ROUTE_THREADS / 32; i++) s = __fadd_rn(s, red[i]);
    for (int e = tid; e < E; e += ROUTE_THREADS) ps[e] = __fdiv_rn(ps[e], s);
    __syncthreads();
    if (warp != 0) return;
    uint32_t bk;
    int bi;
    route_lane_best(ps, E, lane, 0u, -1, bk, bi);
    for (int j = 0; j < k; j++) {
        const uint32_t mk = __reduce_max_sync(FULL, bi >= 0 ? bk : 0u);
        const int wi = (int)__reduce_min_sync(FULL, bi >= 0 && bk == mk ? (unsigned)bi : 0xffffffffu);
        if (lane == 0) isel[j] = wi;
        if (wi == bi) route_lane_best(ps, E, lane, bk, bi, bk, bi);
    }
    if (lane == 0) {
        for (int j = 0; j < k; j++) wsel[j] = ps[isel[j]];
        if (norm_topk) {
            float t = 0.0f;
            for (int j = 0; j < k; j++) t = __fadd_rn(t, wsel[j]);
            for (int j = 0; j < k; j++) wsel[j] = __fdiv_rn(wsel[j], t);
        }
        for (int j = 0; j < k; j++) {
            sel[(size_t)r * k + j] = isel[j];
            w[(size_t)r * k + j] = f2bf(wsel[j]);
        }
    }
}

}  // namespace

extern "C" int tdm_moe_route(const uint16_t *logits, int64_t ld, int M, int E, int k, int norm_topk, int32_t *sel,
                             uint16_t *w, void *stream)
{
    if (M < 0 || E <= 0 || E > ROUTE_MAX_E || k <= 0 || k > E || k > ROUTE_MAX_K || ld < E)
        return tdm_errf("tdm_moe_route: bad shape M %d, E %d (at most %d), k %d (at most %d), ld %lld", M, E, ROUTE_MAX_E,
                        k, ROUTE_MAX_K, (long long)ld);
    if (M == 0) return 0;
    const size_t smem = (size_t)E * sizeof(float);
    route_kernel<<<M, ROUTE_THREADS, smem, (cudaStream_t)stream>>>(logits, ld, E, k, norm_topk, sel, w);
    TDM_LAUNCH_CHECK();
    return 0;
}

extern "C" int64_t tdm_moe_route_bytes(int M, int E, int k)
{
    return (int64_t)M * E * 2 + (int64_t)M * k * 6;  // logits in; ids and weights out
}
