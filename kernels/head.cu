// head.cu — the greedy head: argmax over FP32 logits per row, ties to the lower id (layers.h).
#include "layers.h"
#include "layers_dev.cuh"
#include "cuda_check.h"

using namespace tdm_ly;

namespace {

constexpr int AM_THREADS = 256;
constexpr int AM_UNIT = 4;                               // logits a thread loads (one 16-byte load: vec)
constexpr int64_t AM_SLICE = AM_THREADS * AM_UNIT;       // logits a block scans
// A slice of 1024 is one load a thread: the head's 248320 logits a row are 243 blocks, one round
// trip to L2 (slices of 8192 were 31 blocks of 32 loads a thread in turn: ~9.6 us a row on an
// H100, at the end of every step and draft).

// The block's best (value, id) into thread 0's bv, bi (the other threads' are partial).
__device__ __forceinline__ void block_argmax(float &bv, int &bi)
{
    __shared__ float red[AM_THREADS / 32];
    __shared__ int redi[AM_THREADS / 32];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    warp_argmax(bv, bi);
    if (lane == 0) { red[warp] = bv; redi[warp] = bi; }
    __syncthreads();
    if (tid == 0)
        for (int i = 1; i < AM_THREADS / 32; i++)
            if (beats(red[i], redi[i], bv, bi)) { bv = red[i]; bi = redi[i]; }
}

// Block (slice s, row r): the best (value, id) of the slice; NaN never wins. vec: the rows 16-byte
// aligned (logits and ld), so a thread's four logits are one load.
__global__ void __launch_bounds__(AM_THREADS)
argmax_slice_kernel(const float *__restrict__ logits, int64_t ld, int64_t V, int nslice, float *sv, int *si, int vec)
{
    const int s = blockIdx.x, r = blockIdx.y, tid = threadIdx.x;
    const float *x = logits + (size_t)r * ld;
    const int64_t i0 = (int64_t)s * AM_SLICE + (int64_t)tid * AM_UNIT;
    float bv = 0.0f;
    int bi = -1;
    float v[AM_UNIT];
    if (vec && i0 + AM_UNIT <= V) {
        const float4 q = __ldg(reinterpret_cast<const float4 *>(x + i0));
        v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
    } else {
        for (int u = 0; u < AM_UNIT; u++) v[u] = i0 + u < V ? x[i0 + u] : NAN;
    }
    for (int u = 0; u < AM_UNIT; u++)
        if (v[u] == v[u] && beats(v[u], (int)(i0 + u), bv, bi)) { bv = v[u]; bi = (int)(i0 + u); }
    block_argmax(bv, bi);
    if (tid == 0) {
        sv[(size_t)r * nslice + s] = bv;
        si[(size_t)r * nslice + s] = bi;
    }
}

// One block a row over its slices' winners, one load a thread (243 slices a row for the 27B's
// head; one warp took 3.4 us over them, eight loads in turn).
__global__ void __launch_bounds__(AM_THREADS) argmax_final_kernel(const float *sv, const int *si, int nslice, int32_t *ids)
{
    const int r = blockIdx.x, tid = threadIdx.x;
    float bv = 0.0f;
    int bi = -1;
    for (int s = tid; s < nslice; s += AM_THREADS) {
        const float v = sv[(size_t)r * nslice + s];
        const int i = si[(size_t)r * nslice + s];
        if (beats(v, i, bv, bi)) { bv = v; bi = i; }
    }
    block_argmax(bv, bi);
    if (tid == 0) ids[r] = bi < 0 ? 0 : bi;
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
    const int vec = (uintptr_t)logits % 16 == 0 && ld % AM_UNIT == 0;
    argmax_slice_kernel<<<dim3(nslice, M), AM_THREADS, 0, st>>>(logits, ld, V, nslice, sv, si, vec);
    TDM_LAUNCH_CHECK();
    argmax_final_kernel<<<M, AM_THREADS, 0, st>>>(sv, si, nslice, ids);
    TDM_LAUNCH_CHECK();
    return 0;
}

extern "C" int64_t tdm_argmax_rows_bytes(int M, int64_t V)
{
    return (int64_t)M * V * 4 + (int64_t)M * 4;  // logits in, ids out (the slice winners are small)
}
