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

// One block a row, tdm_ref_route's steps: m = max (exact); p_e = exp(l_e - m); s = sum p_e (thread-
// serial over a stride of 256, butterflies, the 8 warps in order: not the CPU's serial order);
// p_e /= s; k rounds of "the largest p not taken, ties to the lower id" (an argmax whose result
// does not depend on the reduction order); then the reference's serial renormalisation.
__global__ void __launch_bounds__(ROUTE_THREADS)
route_kernel(const uint16_t *logits, int64_t ld, int E, int k, int norm_topk, int32_t *sel, uint16_t *w)
{
    extern __shared__ float ps[];                     // [E]
    unsigned char *taken = (unsigned char *)(ps + E); // [E]
    __shared__ float red[ROUTE_THREADS / 32];
    __shared__ int redi[ROUTE_THREADS / 32];
    __shared__ float wsel[ROUTE_MAX_K];
    __shared__ int isel[ROUTE_MAX_K];
    const int r = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const uint16_t *lr = logits + (size_t)r * ld;
    float m = -INFINITY;
    for (int e = tid; e < E; e += ROUTE_THREADS) {
        ps[e] = bf2f(lr[e]);
        taken[e] = 0;
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
    for (int j = 0; j < k; j++) {
        float bv = 0.0f;
        int bi = -1;
        for (int e = tid; e < E; e += ROUTE_THREADS)
            if (!taken[e] && beats(ps[e], e, bv, bi)) { bv = ps[e]; bi = e; }
        warp_argmax(bv, bi);
        if (lane == 0) { red[warp] = bv; redi[warp] = bi; }
        __syncthreads();
        if (tid == 0) {
            for (int i = 1; i < ROUTE_THREADS / 32; i++)
                if (beats(red[i], redi[i], bv, bi)) { bv = red[i]; bi = redi[i]; }
            isel[j] = bi;
            wsel[j] = bv;
            taken[bi] = 1;
        }
        __syncthreads();
    }
    if (tid == 0) {
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
    const size_t smem = (size_t)E * (sizeof(float) + 1);
    route_kernel<<<M, ROUTE_THREADS, smem, (cudaStream_t)stream>>>(logits, ld, E, k, norm_topk, sel, w);
    TDM_LAUNCH_CHECK();
    return 0;
}

extern "C" int64_t tdm_moe_route_bytes(int M, int E, int k)
{
    return (int64_t)M * E * 2 + (int64_t)M * k * 6;  // logits in; ids and weights out
}
