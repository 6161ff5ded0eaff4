// norm.cu — the RMS norms of the layers: residual add + zero-centred RMSNorm, the GDN gated norm,
// and attention's q/k head norms fused with partial rotary and the KV-cache append (layers.h).
#include "layers.h"
#include "layers_dev.cuh"
#include "cuda_check.h"
#include "pdl.cuh"

using namespace tdm_ly;

namespace {

// The start of a norm kernel launched programmatically (pdl.cuh): release the kernels after it, ask
// L2 for its weights w[0..n) (thread t of nthr; prefetch_l2: no kernel writes them), then wait for
// the kernels before it, whose outputs are its inputs.
__device__ __forceinline__ void weights_then_wait(const float *w, int n, int t, int nthr)
{
    tdm_pdl::release();
    prefetch_l2(w, (size_t)n * sizeof(float), t, nthr);
    tdm_pdl::wait();
}

constexpr int NORM_THREADS = 256;

// The end of an RMS norm over a row of H held by a block of NORM_THREADS: each thread's partial sum
// of squares ss, summed by butterflies, then the warps' sums in warp order (red: NORM_THREADS / 32
// floats of shared memory); returns 1 / sqrtf(sum / H + eps), as tdm_ref_rmsnorm.
__device__ __forceinline__ float row_rstd(float ss, float *red, int tid, int H, float eps)
{
    ss = warp_sum(ss);
    if ((tid & 31) == 0) red[tid >> 5] = ss;
    __syncthreads();
    float tot = red[0];
    for (int i = 1; i < NORM_THREADS / 32; i++) tot = __fadd_rn(tot, red[i]);
    return rsqrt_ref(__fadd_rn(__fdiv_rn(tot, (float)H), eps));
}
constexpr int NORM_MAX_H = 11264;  // the row in shared memory as FP32: 44 KB (of the 48 KB without opt-in)

// One block a row. h = bf16(h + y) (when y), then out = bf16((h * r) * (1 + w)) with
// r = 1 / sqrtf(sum(h^2) / H + eps), as tdm_ref_rmsnorm; the sum is thread-serial over a stride of
// 256, then butterflies, then the 8 warps' sums in warp order. Three passes, so that each pass's
// loads are independent of one another and go out together: v1 summed inside the loading loop, and
// with h stored in the same loop every element waited for its own trip to memory (19 us a row on the
// 27B's 5120 in ncu, 13 % of a decode step). The arithmetic and its order are unchanged.
__global__ void __launch_bounds__(NORM_THREADS)
add_rmsnorm_kernel(uint16_t *__restrict__ h, const uint16_t *__restrict__ y, int64_t ldy, const float *__restrict__ w,
                   int H, float eps, uint16_t *__restrict__ out, int64_t ldo, uint16_t *__restrict__ outb)
{
    extern __shared__ float xs[];
    __shared__ float red[NORM_THREADS / 32];
    const int r = blockIdx.x, tid = threadIdx.x;
    uint16_t *hr = h + (size_t)r * H;
    const uint16_t *yr = y ? y + (size_t)r * ldy : nullptr;
    weights_then_wait(w, H, tid, NORM_THREADS);   // w: the third pass; h and y: the kernels before
    if (yr) {
#pragma unroll 4
        for (int i = tid; i < H; i += NORM_THREADS) {
            const float x = bfr(__fadd_rn(bf2f(hr[i]), bf2f(yr[i])));
            hr[i] = f2bf(x);
            xs[i] = x;
        }
    } else {
#pragma unroll 4
        for (int i = tid; i < H; i += NORM_THREADS) xs[i] = bf2f(hr[i]);
    }
    float ss = 0.0f;   // each thread reads back only what it wrote: no barrier needed before the sum
    for (int i = tid; i < H; i += NORM_THREADS) ss = __fadd_rn(ss, __fmul_rn(xs[i], xs[i]));
    const float rr = row_rstd(ss, red, tid, H, eps);
    uint16_t *o = out + (size_t)r * ldo;
#pragma unroll 4
    for (int i = tid; i < H; i += NORM_THREADS) {
        const uint16_t v = f2bf(__fmul_rn(__fmul_rn(xs[i], rr), __fadd_rn(1.0f, w[i])));
        o[i] = v;
        xb_put(outb, r, i, H, v);
    }
}

// TDM_NORM_VEC (0 or 1; default 1): add_rmsnorm with 16-byte loads, each thread holding its units of
// 8 elements in registers, the weight loaded before the programmatic wait, where H % 8 == 0 and the
// rows are 16-byte aligned (else the kernel above). The kernel above makes ~10 L2 trips in a row
// after its wait (three passes of 2-byte loads); this one makes about one. Measured on the H200
// (bench/NOTES.md, add_rmsnorm in one L2 trip): a 16-layer 27B's graphed step 3.046 -> 2.888 ms,
// its decode 3.10 -> 2.95 ms a token. The sum runs in another fixed order, so the bits differ from
// the kernel above; both are checked against the reference with the same bounds. 0 builds the
// kernel above only, for A/B runs (scripts/variant-build).
#ifndef TDM_NORM_VEC
#define TDM_NORM_VEC 1
#endif
constexpr int NORM_VEC_UNITS = 6;   // units of 8 elements a thread: H up to 8 * 256 * 6 = 12288

// h = bf16(h + y) (when y), out = bf16((h * r) * (1 + w)) as add_rmsnorm_kernel, over units of 8
// elements: unit q = tid + 256 j of the row. The sum of squares: thread-serial over the thread's
// units in order (element order inside a unit), then the butterflies and the 8 warps' sums in warp
// order. Needs H % 8 == 0 and 16-byte aligned rows (the host checks).
__global__ void __launch_bounds__(NORM_THREADS)
add_rmsnorm_vec_kernel(uint16_t *__restrict__ h, const uint16_t *__restrict__ y, int64_t ldy, const float *__restrict__ w,
                       int H, float eps, uint16_t *__restrict__ out, int64_t ldo, uint16_t *__restrict__ outb)
{
    __shared__ float red[NORM_THREADS / 32];
    const int r = blockIdx.x, tid = threadIdx.x, units = H / 8;
    tdm_pdl::release();
    float4 wv[NORM_VEC_UNITS][2];   // before the wait: no kernel writes the weights
#pragma unroll
    for (int j = 0; j < NORM_VEC_UNITS; j++) {
        const int q = tid + j * NORM_THREADS;
        if (q < units) {
            wv[j][0] = __ldg(reinterpret_cast<const float4 *>(w + 8 * q));
            wv[j][1] = __ldg(reinterpret_cast<const float4 *>(w + 8 * q + 4));
        }
    }
    tdm_pdl::wait();
    uint16_t *hr = h + (size_t)r * H;
    const uint16_t *yr = y ? y + (size_t)r * ldy : nullptr;
    uint4 hv[NORM_VEC_UNITS], yv[NORM_VEC_UNITS];
#pragma unroll
    for (int j = 0; j < NORM_VEC_UNITS; j++) {   // every load of the row out at once
        const int q = tid + j * NORM_THREADS;
        if (q < units) {
            hv[j] = *reinterpret_cast<const uint4 *>(hr + 8 * q);
            if (yr) yv[j] = *reinterpret_cast<const uint4 *>(yr + 8 * q);
        }
    }
    float x[NORM_VEC_UNITS][8], ss = 0.0f;
#pragma unroll
    for (int j = 0; j < NORM_VEC_UNITS; j++) {
        const int q = tid + j * NORM_THREADS;
        if (q < units) {
            const uint32_t hw[4] = {hv[j].x, hv[j].y, hv[j].z, hv[j].w};
            const uint32_t yw[4] = {yr ? yv[j].x : 0u, yr ? yv[j].y : 0u, yr ? yv[j].z : 0u, yr ? yv[j].w : 0u};
            uint32_t hn[4];
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const uint16_t hb = (uint16_t)(hw[e >> 1] >> (16 * (e & 1)));
                float v = bf2f(hb);
                if (yr) v = bfr(__fadd_rn(v, bf2f((uint16_t)(yw[e >> 1] >> (16 * (e & 1))))));
                x[j][e] = v;
                ss = __fadd_rn(ss, __fmul_rn(v, v));
                const uint32_t b = f2bf(v);
                hn[e >> 1] = (e & 1) ? (hn[e >> 1] | (b << 16)) : b;
            }
            if (yr) *reinterpret_cast<uint4 *>(hr + 8 * q) = make_uint4(hn[0], hn[1], hn[2], hn[3]);
        }
    }
    const float rr = row_rstd(ss, red, tid, H, eps);
    uint16_t *o = out + (size_t)r * ldo;
#pragma unroll
    for (int j = 0; j < NORM_VEC_UNITS; j++) {
        const int q = tid + j * NORM_THREADS;
        if (q < units) {
            const float wf[8] = {wv[j][0].x, wv[j][0].y, wv[j][0].z, wv[j][0].w, wv[j][1].x, wv[j][1].y, wv[j][1].z, wv[j][1].w};
            uint32_t ov[4];
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const uint32_t b = f2bf(__fmul_rn(__fmul_rn(x[j][e], rr), __fadd_rn(1.0f, wf[e])));
                ov[e >> 1] = (e & 1) ? (ov[e >> 1] | (b << 16)) : b;
            }
            *reinterpret_cast<uint4 *>(o + 8 * q) = make_uint4(ov[0], ov[1], ov[2], ov[3]);
            xb_put_unit(outb, r, 8 * q, H, ov);
        }
    }
}

constexpr int GN_WARPS = 4;
constexpr int GN_MAX_D = 1024;

// One warp per (row, value head): tdm_ref_gated_norm with the sum in tdm_dot's order.
__global__ void __launch_bounds__(GN_WARPS * 32)
gated_norm_kernel(const uint16_t *o, const uint16_t *z, int64_t ldz, const float *w, int M, int Hv, int Dv, float eps,
                  uint16_t *y, uint16_t *yb)
{
    __shared__ float buf[GN_WARPS][GN_MAX_D];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int task = blockIdx.x * GN_WARPS + warp;
    weights_then_wait(w, Dv, lane, 32);   // w: the last loop; o and z: the kernels before
    if (task >= M * Hv) return;  // warp-uniform
    const int r = task / Hv, hd = task % Hv;
    const uint16_t *orow = o + ((size_t)r * Hv + hd) * Dv;
    const uint16_t *zrow = z + (size_t)r * ldz + (size_t)hd * Dv;
    float *xs = buf[warp];
    for (int j = lane; j < Dv; j += 32) xs[j] = bf2f(orow[j]);  // o is BF16 already: the first ->bf16
    gated_norm_head(xs, zrow, w, Dv, eps, y + (size_t)r * Hv * Dv + (size_t)hd * Dv, yb, r, hd, Hv, lane, 0, Dv);
}

// One warp per (row, head); heads 0..Hq-1 are the queries, Hq..Hq+Hkv-1 the keys (and values).
// Row r goes to cache row pos0 + r, rotated at that position, or with parent (a tree) at pos0 +
// its depth.
__global__ void __launch_bounds__(32)
qk_norm_rope_kernel(const uint16_t *qg, int64_t ldqg, const uint16_t *k, const uint16_t *v, int64_t ldkv,
                    const float *q_norm, const float *k_norm, const int32_t *parent, int Hq, int Hkv, int D, int R,
                    float theta, float eps, int pos0, const int32_t *d_pos0, int ctx, uint16_t *q_out,
                    uint16_t *kcache, uint16_t *vcache)
{
    __shared__ float xs[GN_MAX_D];
    const int hd = blockIdx.x, r = blockIdx.y, lane = threadIdx.x;
    const bool isq = hd < Hq;
    const float *w = isq ? q_norm : k_norm;
    weights_then_wait(w, D, lane, 32);   // w: after the sum of squares; q, k, v, the position: the kernels before
    const int base = d_pos0 ? *d_pos0 : pos0, row = base + r;
    const int pos = parent ? base + tree_depth(parent, r) : row;
    const int g = hd - Hq;
    if (!isq && (row < 0 || row >= ctx)) return;  // the host checks this when pos0 is given on the host
    const uint16_t *src = isq ? qg + (size_t)r * ldqg + (size_t)hd * 2 * D : k + (size_t)r * ldkv + (size_t)g * D;
    for (int i = lane; i < D; i += 32) xs[i] = bf2f(src[i]);
    __syncwarp();
    const float rr = rsqrt_ref(__fadd_rn(__fdiv_rn(warp_dot_ref(xs, xs, D), (float)D), eps));
    __syncwarp();
    for (int i = lane; i < D; i += 32) xs[i] = bfr(__fmul_rn(__fmul_rn(xs[i], rr), __fadd_rn(1.0f, w[i])));
    __syncwarp();
    // tdm_ref_rope_bf16: one lane per pair (i, i + R/2)
    const int half = R / 2;
    for (int i = lane; i < half; i += 32) {
        const float inv = __fdiv_rn(1.0f, powf(theta, __fdiv_rn((float)(2 * i), (float)R)));
        const float ang = __fmul_rn((float)pos, inv);
        const float cs = bfr(cosf(ang)), sn = bfr(sinf(ang));
        const float a = xs[i], b = xs[i + half];
        xs[i] = bfr(__fadd_rn(bfr(__fmul_rn(a, cs)), bfr(__fmul_rn(-b, sn))));
        xs[i + half] = bfr(__fadd_rn(bfr(__fmul_rn(b, cs)), bfr(__fmul_rn(a, sn))));
    }
    __syncwarp();
    if (isq) {
        uint16_t *dst = q_out + ((size_t)r * Hq + hd) * D;
        for (int i = lane; i < D; i += 32) dst[i] = f2bf(xs[i]);
    } else {
        const size_t at = ((size_t)row * Hkv + g) * D;
        const uint16_t *vs = v + (size_t)r * ldkv + (size_t)g * D;
        for (int i = lane; i < D; i += 32) {
            kcache[at + i] = f2bf(xs[i]);
            vcache[at + i] = vs[i];
        }
    }
}

}  // namespace

// tdm_add_rmsnorm_to and tdm_add_rmsnorm, whose messages name who
static int add_rmsnorm(const char *who, uint16_t *h, const uint16_t *y, int64_t ldy, const float *w, int H, int M,
                       float eps, uint16_t *out, int64_t ldo, uint16_t *outb, void *stream)
{
    if (out == h || (y && out == y)) return tdm_errf("%s: out must not be h or y", who);
    if (xb_refused(who, outb, M)) return -1;
    if (M < 0 || H <= 0 || H > NORM_MAX_H || (y && ldy < H) || ldo < H)
        return tdm_errf("%s: bad shape M %d, H %d (at most %d), ldy %lld, ldo %lld", who, M, H, NORM_MAX_H,
                        (long long)ldy, (long long)ldo);
    if (M == 0) return 0;
    const bool vec = TDM_NORM_VEC && H % 8 == 0 && H <= 8 * NORM_THREADS * NORM_VEC_UNITS && (uintptr_t)h % 16 == 0 &&
                     (uintptr_t)out % 16 == 0 && ldo % 8 == 0 && (uintptr_t)w % 16 == 0 &&
                     (!y || ((uintptr_t)y % 16 == 0 && ldy % 8 == 0));
    if (vec)
        TDM_CUDA_TRY(tdm_pdl::launch(add_rmsnorm_vec_kernel, dim3(M), dim3(NORM_THREADS), 0, (cudaStream_t)stream, h, y,
                                     ldy, w, H, eps, out, ldo, outb));
    else
        TDM_CUDA_TRY(tdm_pdl::launch(add_rmsnorm_kernel, dim3(M), dim3(NORM_THREADS), (size_t)H * sizeof(float),
                                     (cudaStream_t)stream, h, y, ldy, w, H, eps, out, ldo, outb));
    return 0;
}

extern "C" int tdm_add_rmsnorm_to(uint16_t *h, const uint16_t *y, int64_t ldy, const float *w, int H, int M, float eps,
                                  uint16_t *out, int64_t ldo, uint16_t *outb, void *stream)
{
    return add_rmsnorm("tdm_add_rmsnorm_to", h, y, ldy, w, H, M, eps, out, ldo, outb, stream);
}

extern "C" int tdm_add_rmsnorm(uint16_t *h, const uint16_t *y, int64_t ldy, const float *w, int H, int M, float eps,
                               uint16_t *out, uint16_t *outb, void *stream)
{
    return add_rmsnorm("tdm_add_rmsnorm", h, y, ldy, w, H, M, eps, out, H, outb, stream);
}

extern "C" int64_t tdm_add_rmsnorm_bytes(int H, int M, int add)
{
    // reads h (and y), the weight; writes out (and h)
    return (int64_t)M * H * 2 * (add ? 4 : 2) + (int64_t)H * 4;
}

extern "C" int tdm_gdn_gated_norm(const uint16_t *o, const uint16_t *z, int64_t ldz, const float *w, int M, int Hv,
                                  int Dv, float eps, uint16_t *y, uint16_t *yb, void *stream)
{
    if (xb_refused("tdm_gdn_gated_norm", yb, M)) return -1;
    if (M < 0 || Hv <= 0 || Dv <= 0 || Dv > GN_MAX_D || ldz < (int64_t)Hv * Dv)
        return tdm_errf("tdm_gdn_gated_norm: bad shape M %d, Hv %d, Dv %d (at most %d), ldz %lld", M, Hv, Dv, GN_MAX_D,
                        (long long)ldz);
    if (M == 0) return 0;
    const int tasks = M * Hv;
    TDM_CUDA_TRY(tdm_pdl::launch(gated_norm_kernel, dim3((tasks + GN_WARPS - 1) / GN_WARPS), dim3(GN_WARPS * 32), 0,
                                 (cudaStream_t)stream, o, z, ldz, w, M, Hv, Dv, eps, y, yb));
    return 0;
}

extern "C" int64_t tdm_gdn_gated_norm_bytes(int M, int Hv, int Dv)
{
    return (int64_t)M * Hv * Dv * 2 * 3 + (int64_t)Dv * 4;  // o, z in; y out
}

static int qk_launch(const char *who, const uint16_t *qg, int64_t ldqg, const uint16_t *k, const uint16_t *v,
                     int64_t ldkv, const float *q_norm, const float *k_norm, const int32_t *parent, int M, int Hq, int Hkv,
                     int D, int R, double theta, float eps, int pos0, const int32_t *d_pos0, int ctx, uint16_t *q_out,
                     uint16_t *kcache, uint16_t *vcache, void *stream)
{
    if (M < 0 || Hq <= 0 || Hkv <= 0 || D <= 0 || D > GN_MAX_D || R < 0 || R > D || (R & 1) ||
        ldqg < (int64_t)Hq * 2 * D || ldkv < (int64_t)Hkv * D || (parent && M > TDM_TREE_MAX))
        return tdm_errf("%s: bad shape M %d, Hq %d, Hkv %d, D %d, R %d, ldqg %lld, ldkv %lld%s", who, M, Hq, Hkv, D, R,
                        (long long)ldqg, (long long)ldkv, parent ? " (a tree: M at most 32)" : "");
    if (pos0 < 0 || (int64_t)pos0 + M > ctx)
        return tdm_errf("%s: positions %d..%d exceed the cache of %d", who, pos0, pos0 + M - 1, ctx);
    if (M == 0) return 0;
    dim3 grid(Hq + Hkv, M);
    TDM_CUDA_TRY(tdm_pdl::launch(qk_norm_rope_kernel, grid, dim3(32), 0, (cudaStream_t)stream, qg, ldqg, k, v, ldkv,
                                 q_norm, k_norm, parent, Hq, Hkv, D, R, (float)theta, eps, pos0, d_pos0, ctx, q_out,
                                 kcache, vcache));
    return 0;
}

extern "C" int tdm_qk_norm_rope(const uint16_t *qg, int64_t ldqg, const uint16_t *k, const uint16_t *v, int64_t ldkv,
                                const float *q_norm, const float *k_norm, int M, int Hq, int Hkv, int D, int R,
                                double theta, float eps, int pos0, const int32_t *d_pos0, int ctx, uint16_t *q_out,
                                uint16_t *kcache, uint16_t *vcache, void *stream)
{
    return qk_launch("tdm_qk_norm_rope", qg, ldqg, k, v, ldkv, q_norm, k_norm, NULL, M, Hq, Hkv, D, R, theta, eps, pos0,
                     d_pos0, ctx, q_out, kcache, vcache, stream);
}

extern "C" int tdm_qk_norm_rope_tree(const uint16_t *qg, int64_t ldqg, const uint16_t *k, const uint16_t *v,
                                     int64_t ldkv, const float *q_norm, const float *k_norm, const int32_t *parent, int M,
                                     int Hq, int Hkv, int D, int R, double theta, float eps, int pos0,
                                     const int32_t *d_pos0, int ctx, uint16_t *q_out, uint16_t *kcache,
                                     uint16_t *vcache, void *stream)
{
    if (!parent) return tdm_errf("tdm_qk_norm_rope_tree: parent is NULL");
    return qk_launch("tdm_qk_norm_rope_tree", qg, ldqg, k, v, ldkv, q_norm, k_norm, parent, M, Hq, Hkv, D, R, theta, eps,
                     pos0, d_pos0, ctx, q_out, kcache, vcache, stream);
}

extern "C" int64_t tdm_qk_norm_rope_bytes(int M, int Hq, int Hkv, int D)
{
    // q (the query halves), k, v in; q_out, the two cache rows out; the norm weights
    return (int64_t)M * D * 2 * (2 * Hq + 4 * Hkv) + (int64_t)D * 8;
}
