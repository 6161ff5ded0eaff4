// head.cu — the greedy head: argmax over FP32 logits per row, ties to the lower id (layers.h).
#include "layers.h"
#include "layers_dev.cuh"
#include "cuda_check.h"

using namespace tdm_ly;

namespace {

constexpr int AM_THREADS = 256;
constexpr int64_t AM_SLICE = 8192;  // logits a block scans

// Block (slice s, row r): the best (value, id) of the slice; NaN never wins.
__global__ void __launch_bounds__(AM_THREADS)
argmax_slice_kernel(const float *logits, int64_t ld, int64_t V, int nslice, float *sv, int *si)
{
    __shared__ float red[AM_THREADS / 32];
    __shared__ int redi[AM_THREADS / 32];
    const int s = blockIdx.x, r = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const float *x = logits + (size_t)r * ld;
    const int64_t lo = (int64_t)s * AM_SLICE, hi = min(lo + AM_SLICE, V);
    float bv = 0.0f;
    int bi = -1;
    for (int64_t i = lo + tid; i < hi; i += AM_THREADS) {
        const float v = x[i];
        if (v == v && beats(v, (int)i, bv, bi)) { bv = v; bi = (int)i; }
    }
    warp_argmax(bv, bi);
    if (lane == 0) { red[warp] = bv; redi[warp] = bi; }
    __syncthreads();
    if (tid == 0) {
        for (int i = 1; i < AM_THREADS / 32; i++)
            if (beats(red[i], redi[i], bv, bi)) { bv = red[i]; bi = redi[i]; }
        sv[(size_t)r * nslice + s] = bv;
        si[(size_t)r * nslice + s] = bi;
    }
}

// One warp a row over its slices' winners.
__global__ void argmax_final_kernel(const float *sv, const int *si, int nslice, int32_t *ids)
{
    const int r = blockIdx.x, lane = threadIdx.x;
    float bv = 0.0f;
    int bi = -1;
    for (int s = lane; s < nslice; s += 32) {
        const float v = sv[(size_t)r * nslice + s];
        const int i = si[(size_t)r * nslice + s];
        if (beats(v, i, bv, bi)) { bv = v; bi = i; }
    }
    warp_argmax(bv, bi);
    if (lane == 0) ids[r] = bi < 0 ? 0 : bi;
}

}  // namespace

extern "C" size_t tdm_argmax_scratch_bytes(int M, int64_t V)
{
    const int64_t nslice = (V + AM_SLICE - 1) / AM_SLICE;
    return (size_t)M * (size_t)nslice * (sizeof(float) + sizeof(int));
}

extern "C" int tdm_argmax_rows(const float *logits, int64_t ld, int M, int64_t V, void *scratch, int32_t *ids,
                               void *stream)
{
    if (M < 0 || V <= 0 || V > 0x7fffffff || ld < V)
        return tdm_errf("tdm_argmax_rows: bad shape M %d, V %lld, ld %lld", M, (long long)V, (long long)ld);
    if (M == 0) return 0;
    const int nslice = (int)((V + AM_SLICE - 1) / AM_SLICE);
    float *sv = (float *)scratch;
    int *si = (int *)(sv + (size_t)M * nslice);
    cudaStream_t st = (cudaStream_t)stream;
    argmax_slice_kernel<<<dim3(nslice, M), AM_THREADS, 0, st>>>(logits, ld, V, nslice, sv, si);
    TDM_LAUNCH_CHECK();
    argmax_final_kernel<<<M, 32, 0, st>>>(sv, si, nslice, ids);
    TDM_LAUNCH_CHECK();
    return 0;
}

extern "C" int64_t tdm_argmax_rows_bytes(int M, int64_t V)
{
    return (int64_t)M * V * 4 + (int64_t)M * 4;  // logits in, ids out (the slice winners are small)
}
