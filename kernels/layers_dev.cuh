// layers_dev.cuh — device helpers shared by the layer kernels (norm.cu, gdn.cu, attn.cu,
// attn_prefill.cu, moe_route.cu, head.cu): BF16 conversion, the reference's scalar functions, and
// the reference's dot-product order. The arithmetic that must match the CPU reference is written
// with explicit round-to-nearest intrinsics (__fmul_rn, __fadd_rn, ...), which nvcc never contracts
// into FMAs, so that one operation of the C reference is one operation here.
#ifndef TDM_LAYERS_DEV_CUH
#define TDM_LAYERS_DEV_CUH
#include <cuda_bf16.h>
#include <stdint.h>
#include "layers.h"
#include "err.h"
#include "mm_layout.h"

namespace tdm_ly {

constexpr unsigned FULL = 0xffffffffu;

__device__ __forceinline__ float bf2f(uint16_t u) { return __uint_as_float((uint32_t)u << 16); }
__device__ __forceinline__ uint16_t f2bf(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }
__device__ __forceinline__ float bfr(float f) { return bf2f(f2bf(f)); }  // the "->bf16" of models.md

// ref.c's sigmoidf, siluf, softplusf
__device__ __forceinline__ float sigmoid_ref(float x) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x))); }
__device__ __forceinline__ float silu_ref(float x) { return __fdiv_rn(x, __fadd_rn(1.0f, expf(-x))); }
__device__ __forceinline__ float softplus_ref(float x) { return x > 20.0f ? x : log1pf(expf(x)); }
// The gated attention output of one element (ref: the last line of attn_core; models.md, step 5):
// bf16(bf16(attn) * bf16(sigmoid(gate))), attn the FP32 attention output already divided by the sum.
__device__ __forceinline__ uint16_t attn_gated(float attn, float gate)
{
    return f2bf(__fmul_rn(bfr(attn), bfr(sigmoid_ref(gate))));
}
// The SwiGLU of one element (ref.c: bf(bf(siluf(g)) * u) over the BF16 outputs g, u of the gate and
// up products; models.md): gate and up as the FP32 sums, rounded to BF16 here first.
__device__ __forceinline__ uint16_t swiglu_ref(float gate, float up)
{
    return f2bf(__fmul_rn(bfr(silu_ref(bfr(gate))), bfr(up)));
}
// 1 / sqrtf(x), both correctly rounded as in C
__device__ __forceinline__ float rsqrt_ref(float x) { return __fdiv_rn(1.0f, __fsqrt_rn(x)); }

// tdm_dot(a, b, n) (src/common/linear.c) in its exact order: eight interleaved serial partial sums,
// the tail into the first, added as ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7)). Called by
// all 32 lanes of a warp (lanes 0..7 do the sums); every lane gets the result. a and b may be
// shared or global memory.
__device__ __forceinline__ float warp_dot_ref(const float *a, const float *b, int n)
{
    const int lane = threadIdx.x & 31;
    float p = 0.0f;
    if (lane < 8) {
        int c = 0;
        for (; c + 8 <= n; c += 8) p = __fadd_rn(p, __fmul_rn(a[c + lane], b[c + lane]));
        if (lane == 0)
            for (; c < n; c++) p = __fadd_rn(p, __fmul_rn(a[c], b[c]));
    }
    // xor butterflies: lane 0 ends with exactly the reference's tree (addition is commutative)
    p = __fadd_rn(p, __shfl_xor_sync(FULL, p, 1));
    p = __fadd_rn(p, __shfl_xor_sync(FULL, p, 2));
    p = __fadd_rn(p, __shfl_xor_sync(FULL, p, 4));
    return __shfl_sync(FULL, p, 0);
}

// Asks L2 for the 128-byte lines of [p, p + bytes), a line a thread (thread t of nthr). A layer's
// small parameters (norm weights) come from DRAM on every step, since the step's ~16 GB of weights
// pass through the 60 MB L2 in between; asked for at a kernel's start, they are on their way while
// the kernel loads and reduces its inputs, instead of one DRAM trip a batch of loads at the end.
// A hint: no value changes.
__device__ __forceinline__ void prefetch_l2(const void *p, size_t bytes, int t, int nthr)
{
    const uintptr_t first = (uintptr_t)p & ~(uintptr_t)127, end = (uintptr_t)p + bytes;
    for (uintptr_t a = first + (uintptr_t)t * 128; a < end; a += (uintptr_t)nthr * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
}

// Sum over a warp, the same bits in every lane (each butterfly step adds the same two values in
// both partner lanes).
__device__ __forceinline__ float warp_sum(float v)
{
    for (int s = 16; s > 0; s >>= 1) v = __fadd_rn(v, __shfl_xor_sync(FULL, v, s));
    return v;
}
__device__ __forceinline__ float warp_max(float v)
{
    for (int s = 16; s > 0; s >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL, v, s));
    return v;
}

// The depth of node r of a verify tree (layers.h, the tree launchers): parent[] in device or shared
// memory with parent[x] in -1..x-1 (-1: a root, depth 0). At most TDM_TREE_MAX steps, so that a bad
// array cannot hang a kernel.
__device__ __forceinline__ int tree_depth(const int32_t *parent, int r)
{
    int d = 0;
    for (int x = parent[r]; x >= 0 && d < TDM_TREE_MAX; x = parent[x]) d++;
    return d;
}

// Argmax pairs: (v2, i2) beats (v1, i1) when it is larger, or equal with a lower index; i < 0 is
// "none". Associative and commutative, so any reduction order gives the same pair.
__device__ __forceinline__ bool beats(float v2, int i2, float v1, int i1)
{
    return i2 >= 0 && (i1 < 0 || v2 > v1 || (v2 == v1 && i2 < i1));
}
__device__ __forceinline__ void warp_argmax(float &v, int &i)
{
    for (int s = 16; s > 0; s >>= 1) {
        const float ov = __shfl_xor_sync(FULL, v, s);
        const int oi = __shfl_xor_sync(FULL, i, s);
        if (beats(ov, oi, v, i)) { v = ov; i = oi; }
    }
}

// Element (row, k) of a product's K inputs into their blocked copy xb as well (mm_layout.h: xb),
// where the caller asked for one (xb not NULL) and k lies in a full slab of K.
__device__ __forceinline__ void xb_put(uint16_t *xb, int row, int64_t k, int64_t K, uint16_t v)
{
    if (xb && k < K / TDM_MM_SLAB_K * TDM_MM_SLAB_K) xb[tdm_mm_xb_index(row, k)] = v;
}
// Eight consecutive elements (row, k0 .. k0 + 7; k0 a multiple of 8), as four words low half first,
// into the blocked copy xb as one permuted 16-byte unit, where xb is not NULL and k0 lies in a full
// slab of K (32-bit offsets: K below 2^26).
__device__ __forceinline__ void xb_put_unit(uint16_t *xb, int row, uint32_t k0, uint32_t K, const uint32_t (&w)[4])
{
    if (!xb || k0 >= K / TDM_MM_SLAB_K * TDM_MM_SLAB_K) return;
    uint32_t p[4];
    tdm_mm_permute_unit(TDM_MMF_NVFP4, w, p);
    const uint32_t at = (((k0 / TDM_MM_SLAB_K) * TDM_MM_UNITS + (k0 / 8) % TDM_MM_UNITS) * TDM_MM_XB_ROWS + row) * 32 +
                        8 * ((k0 / TDM_MM_CHUNK_K) % 4);
    *reinterpret_cast<uint4 *>(xb + at) = make_uint4(p[0], p[1], p[2], p[3]);
}
// The GDN gated norm (tdm_ref_gated_norm, the sum in tdm_dot's order) of row r, value head hd, by
// one warp: xs [Dv] (this warp's) holds the head's o as floats on entry (BF16 values: the first
// ->bf16 is done) and is scratch after; zrow, yrow the head's z and y; yb the blocked copy or NULL.
// The outputs j0 .. j0 + jn - 1 (j0, jn multiples of 8 where Dv is; all: 0, Dv).
// pre: jn is 32, so the lane's one output is j0 + lane, and the caller has loaded its factors:
// zs_pre = silu_ref(bf2f(zrow[j0 + lane])), w_pre = w[j0 + lane] (the same values, so the same bits).
// gated_norm_kernel and the recurrence's fused tail (gdn.cu) both run this: the same bits.
__device__ __forceinline__ void gated_norm_head(float *xs, const uint16_t *zrow, const float *w, int Dv, float eps,
                                                uint16_t *yrow, uint16_t *yb, int r, int hd, int Hv, int lane, int j0,
                                                int jn, bool pre = false, float zs_pre = 0.0f, float w_pre = 0.0f)
{
    __syncwarp();
    const float rr = rsqrt_ref(__fadd_rn(__fdiv_rn(warp_dot_ref(xs, xs, Dv), (float)Dv), eps));
    const bool units = Dv % 8 == 0;   // the blocked copy in 16-byte units from xs (else element by element)
    for (int j = j0 + lane; j < j0 + jn; j += 32) {
        const float zs = pre ? zs_pre : silu_ref(bf2f(zrow[j])), wj = pre ? w_pre : w[j];
        const uint16_t v = f2bf(__fmul_rn(bfr(__fmul_rn(bfr(__fmul_rn(xs[j], rr)), wj)), zs));
        yrow[j] = v;
        if (!yb) continue;
        if (units) xs[j] = __uint_as_float(v);   // xs[j] is read by this lane only, just above
        else xb_put(yb, r, (int64_t)hd * Dv + j, (int64_t)Hv * Dv, v);
    }
    if (yb && units) {
        __syncwarp();
        for (int q = j0 / 8 + lane; q < (j0 + jn) / 8; q += 32) {
            uint32_t u[4];
            for (int i = 0; i < 4; i++)
                u[i] = __float_as_uint(xs[8 * q + 2 * i]) | __float_as_uint(xs[8 * q + 2 * i + 1]) << 16;
            xb_put_unit(yb, r, (uint32_t)(hd * Dv + 8 * q), (uint32_t)(Hv * Dv), u);
        }
    }
    __syncwarp();   // xs is free for the warp's next head
}
// The host's check of a blocked copy that a kernel writes or a product reads: NULL, or M <=
// TDM_MM_XB_ROWS rows at a 16-byte aligned address (0), else -1 with tdm_err().
inline int xb_refused(const char *who, const void *xb, int M)
{
    if (xb && (M > TDM_MM_XB_ROWS || (uintptr_t)xb % 16))
        return tdm_errf("%s: a blocked copy serves 1..%d rows from a 16-byte aligned address (%d rows)", who,
                        TDM_MM_XB_ROWS, M);
    return 0;
}

}  // namespace tdm_ly
#endif
