// moe.cu — the routed experts of a mixture-of-experts MLP (moe.h): the packed device layout of a
// layer's experts, the pair order, gate+up with SiLU, down, and the per-row combination with the
// shared expert.
#include "moe.h"
#include "cuda_check.h"
#include "pdl.cuh"
#include "device.h"
#include "err.h"
#include "formats.h"
#include "layers.h"
#include "layers_dev.cuh"
#include "mm_skinny.cuh"
#include "wide_tile.cuh"
#include <string.h>

using namespace tdm_ly;

namespace {

constexpr int MOE_THREADS = 256;
constexpr int ORDER_THREADS = 1024;

// ---- one stored weight row, decoded element by element as tdm_qweight_row does ----------------

struct RowRef {
    const uint8_t *w;    // the row's codes
    const uint8_t *sc;   // FP8: the row's 128-row block of scales; NVFP4: the row's group scales
    float scale2;        // NVFP4 global scale
    int fmt;             // enum tdm_wfmt
    int scale_bf16;      // FP8 scales stored BF16 (else F32)
};

// Row `row` of a stored matrix of k inputs (linear.h's layouts). Host and device: the combine's
// shared gate is resolved on the host, the experts' rows on the device.
__host__ __device__ inline RowRef row_ref(int fmt, int scale_bf16, const void *w, const void *scale, float scale2,
                                          int64_t k, int64_t row)
{
    RowRef r;
    r.fmt = fmt;
    r.scale_bf16 = scale_bf16;
    r.scale2 = scale2;
    r.sc = nullptr;
    const uint8_t *wb = (const uint8_t *)w, *sb = (const uint8_t *)scale;
    if (fmt == TDM_W_FP8) {
        const int64_t nbk = (k + TDM_FP8_BLOCK - 1) / TDM_FP8_BLOCK;
        r.w = wb + row * k;
        r.sc = sb + (row / TDM_FP8_BLOCK) * nbk * (scale_bf16 ? 2 : 4);
    } else if (fmt == TDM_W_NVFP4) {
        r.w = wb + row * (k / 2);
        r.sc = sb + row * (k / TDM_NVFP4_GROUP);
    } else {
        r.w = wb + row * k * 2;
    }
    return r;
}

// tdm_e4m3_to_f32, from the bits
__device__ __forceinline__ float e4m3_ref(uint32_t code)
{
    const uint32_t s = (code >> 7) << 31, e = (code >> 3) & 15, m = code & 7;
    if (e == 15 && m == 7) return __uint_as_float(0x7fc00000u);
    if (e == 0) {
        const float v = __fmul_rn((float)m, 0x1p-9f);
        return s ? -v : v;
    }
    return __uint_as_float(s | (e + 120) << 23 | m << 20);
}

// tdm_e2m1_to_f32
__device__ __forceinline__ float e2m1_ref(uint32_t nib)
{
    const uint32_t mag = nib & 7;
    const float v = mag < 4 ? 0.5f * (float)mag : mag == 4 ? 2.0f : mag == 5 ? 3.0f : mag == 6 ? 4.0f : 6.0f;
    return (nib & 8) ? -v : v;
}

// Element c of the row, with tdm_qweight_row's operations: FP8 code * scale; NVFP4
// (e2m1 * e4m3 scale) * scale2.
__device__ __forceinline__ float w_at(const RowRef &r, int c)
{
    if (r.fmt == TDM_W_FP8) {
        const int blk = c / TDM_FP8_BLOCK;
        const float s = r.scale_bf16 ? bf2f(((const uint16_t *)r.sc)[blk]) : ((const float *)r.sc)[blk];
        return __fmul_rn(e4m3_ref(r.w[c]), s);
    }
    if (r.fmt == TDM_W_NVFP4) {   // element c is nibble c % 8 of its word, in the checkpoint's order
        uint32_t word = reinterpret_cast<const uint32_t *>(r.w)[c >> 3];
#if TDM_NVFP4_DEV_PACKED
        word = tdm_nvfp4_unpack(word);
#endif
        const uint32_t nib = word >> (4 * (c & 7)) & 15;
        return __fmul_rn(__fmul_rn(e2m1_ref(nib), e4m3_ref(r.sc[c / TDM_NVFP4_GROUP])), r.scale2);
    }
    return bf2f(((const uint16_t *)r.w)[c]);
}

// tdm_dot(x, row, k) in its exact order from the k products prod[c] = x[c] * w[c] (each rounded as
// tdm_dot rounds it), by the 8 lanes of a group (p = lane % 8): lane p sums the products at c + p for
// c = 0, 8, 16, ...; the tail goes into partial 0; the xor butterflies over 1, 2, 4 add them as
// ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7)). All 32 lanes of the warp must call it together;
// every lane of the group gets the sum.
__device__ __forceinline__ float group_dot(const float *prod, int k, int p)
{
    float acc = 0.0f;
    int c = 0;
#pragma unroll 8
    for (; c + 8 <= k; c += 8) acc = __fadd_rn(acc, prod[c + p]);
    if (p == 0)
        for (; c < k; c++) acc = __fadd_rn(acc, prod[c]);
    acc = __fadd_rn(acc, __shfl_xor_sync(FULL, acc, 1));
    acc = __fadd_rn(acc, __shfl_xor_sync(FULL, acc, 2));
    acc = __fadd_rn(acc, __shfl_xor_sync(FULL, acc, 4));
    return acc;
}

// ---- kernels ------------------------------------------------------------------------------------

// order = the pairs sorted by (sel, pair index): a pair's rank is the number of pairs before it;
// each entry packs the pair's index (low 16 bits) and its expert (high 16; 0xffff for one outside
// 0..65534), so an expert kernel's block reads its pair and expert in one load (order_pair,
// order_expert). Gate+up may be launched programmatically after it (TDM_MOE_GU_PDL): release at once.
__global__ void __launch_bounds__(ORDER_THREADS) order_kernel(const int32_t *sel, int n, int32_t *order)
{
    extern __shared__ int32_t ss[];   // [n]
    tdm_pdl::release();
    for (int i = threadIdx.x; i < n; i += ORDER_THREADS) ss[i] = sel[i];
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += ORDER_THREADS) {
        const int32_t e = ss[i];
        int rank = 0;
        for (int j = 0; j < n; j++) rank += ss[j] < e || (ss[j] == e && j < i);
        order[rank] = (int32_t)((uint32_t)i | ((uint32_t)e < 0xffffu ? (uint32_t)e : 0xffffu) << 16);
    }
}
// The pair and the expert of an order entry (order_kernel); the expert is >= E where invalid.
static_assert(TDM_MOE_MAX_PAIRS <= 0x10000 && TDM_ROUTE_MAX_E < 0xffff, "an order entry: a pair and an expert in 16 bits each");
__device__ __forceinline__ int order_pair(int32_t v) { return (int)((uint32_t)v & 0xffffu); }
__device__ __forceinline__ int order_expert(int32_t v) { return (int)((uint32_t)v >> 16); }

// ---- the routed experts' matrices: 16-byte chunks decoded in registers --------------------------
//
// A stored weight row is cut into chunks of 16 bytes (32 k NVFP4, 16 k FP8, 8 k BF16). A row is
// owned by a group of G lanes (lanes_log2: the fewest, a power of two up to 32, that take at most
// BATCH chunks each: 16 for the 80B's NVFP4 gate and up, 4 for its down); chunk c belongs to lane
// c mod G, so a warp reads contiguous bytes of its rows. A lane loads BATCH chunks of its row (gate
// and up together) with 16-byte loads, decodes them in registers with the dense kernels' helpers
// (mm_layout.h, mm_skinny.cuh) and FMAs them in FP32 against the pair's input row, staged once per
// block in shared memory as FP32 with 4 floats of padding after every 32 (the lanes of a
// quarter-warp read distinct banks for every format).

constexpr int FAST_THREADS = 256;
// Threads of a gate+up block (knob TDM_MOE_GU_THREADS: 128, 256 or 512). A launch shape only: an
// output's lanes and their order are the same for each, and so are the bits.
#ifndef TDM_MOE_GU_THREADS
#define TDM_MOE_GU_THREADS 256
#endif
constexpr int GU_THREADS = TDM_MOE_GU_THREADS;
static_assert(GU_THREADS == 128 || GU_THREADS == 256 || GU_THREADS == 512, "TDM_MOE_GU_THREADS: 128, 256 or 512");
constexpr int BATCH = 4;   // chunks of each matrix a lane has in flight
// Blocks a SM at least: gate+up <= 80 registers a thread (3 blocks of 256), down <= 64 (4): what
// ptxas compiles without spilling for every format.
constexpr int GATE_UP_MIN_BLOCKS = GU_THREADS == 512 ? 1 : 3 * 256 / GU_THREADS, DOWN_MIN_BLOCKS = 4;

template <int F> struct ChunkK;   // k per 16-byte chunk
template <> struct ChunkK<TDM_W_NVFP4> { static constexpr int K = 32; };
template <> struct ChunkK<TDM_W_FP8> { static constexpr int K = 16; };
template <> struct ChunkK<TDM_W_BF16> { static constexpr int K = 8; };

__host__ __device__ __forceinline__ int xpad(int k) { return k + 4 * (k >> 5); }
// Floats of the staged input row of k values (zeros up to a multiple of 32).
__host__ __device__ __forceinline__ int xs_floats(int k) { return (k + 31) / 32 * 36; }

struct WChunk {
    uint4 w;        // 16 bytes of the row
    uint32_t sc;    // NVFP4: the two e4m3 group scales (low byte first); FP8: the block scale's F32 bits
};
// Word q of a chunk's 16 bytes (q known at compile time in the unrolled loops: no select is left).
__device__ __forceinline__ uint32_t word(const uint4 &v, int q) { return q == 0 ? v.x : q == 1 ? v.y : q == 2 ? v.z : v.w; }

__device__ __forceinline__ float bf_lo(uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf_hi(uint32_t v) { return __uint_as_float(v & 0xffff0000u); }

// One matrix row of a pair, as the loads need it.
struct RowPtr {
    const uint8_t *w;   // the row's bytes
    const uint8_t *s;   // NVFP4: the row's group scales; FP8: its 128-row block's scales
    int rowbytes;       // bytes of the stored row
};

__device__ __forceinline__ RowPtr row_ptr(const tdm_moe_mat &m, int e, int row)
{
    RowPtr p;
    const uint8_t *w = (const uint8_t *)m.w + (int64_t)e * m.w_stride;
    const uint8_t *s = m.scale ? (const uint8_t *)m.scale + (int64_t)e * m.scale_stride : nullptr;
    if (m.fmt == TDM_W_NVFP4) {
        p.rowbytes = m.k / 2;
        p.s = s + (int64_t)row * (m.k / TDM_NVFP4_GROUP);
    } else if (m.fmt == TDM_W_FP8) {
        p.rowbytes = m.k;
        p.s = s + (int64_t)(row / TDM_FP8_BLOCK) * ((m.k + TDM_FP8_BLOCK - 1) / TDM_FP8_BLOCK) *
                      (m.scale_dt == TDM_DT_BF16 ? 2 : 4);
    } else {
        p.rowbytes = m.k * 2;
        p.s = nullptr;
    }
    p.w = w + (int64_t)row * p.rowbytes;
    return p;
}

// Chunk ch of a row. VEC: the row is 16-byte aligned and every chunk full (rowbytes % 16 == 0;
// for NVFP4 the scales of a chunk then sit at an even offset); else byte loads, zeros past the row.
template <int F, bool VEC>
__device__ __forceinline__ void load_wchunk(WChunk &c, const RowPtr &p, int ch, int scale_bf16, int k)
{
    const uint8_t *q = p.w + 16 * ch;
    if (VEC) {
        c.w = tdm_mm::ldg_stream(q);
    } else {
        uint32_t v[4];
        tdm_mm::load_bytes<4>(v, q, min(16, p.rowbytes - 16 * ch));
        c.w = make_uint4(v[0], v[1], v[2], v[3]);
    }
    if constexpr (F == TDM_W_NVFP4) {
        if (VEC) {
            c.sc = tdm_mm::ldg_stream_u16(p.s + 2 * ch);
        } else {
            const int ng = k / TDM_NVFP4_GROUP;
            c.sc = (2 * ch < ng ? (uint32_t)p.s[2 * ch] : 0u) | (2 * ch + 1 < ng ? (uint32_t)p.s[2 * ch + 1] << 8 : 0u);
        }
    } else if constexpr (F == TDM_W_FP8) {
        const int b = ch >> 3;   // 8 chunks of 16 k to a 128-k block
        c.sc = scale_bf16 ? (uint32_t)__ldg((const unsigned short *)p.s + b) << 16
                          : __float_as_uint(__ldg((const float *)p.s + b));
    } else {
        c.sc = 0;
    }
}

// acc + the chunk's products with xc[0 .. ChunkK<F>::K), in ascending k, by FMA. NVFP4 weights
// are e2m1 * e4m3 group scale * 2^-7 (exact in BF16; the caller multiplies the row's sum by
// scale_2 * 2^7); FP8: the chunk's code products summed from 0, then acc = fma(that, block scale, acc).
template <int F>
__device__ __forceinline__ float chunk_dot(const WChunk &c, const float *xc, float acc)
{
    const uint32_t w[4] = {c.w.x, c.w.y, c.w.z, c.w.w};
    if constexpr (F == TDM_W_NVFP4) {
        uint32_t sa, sb;
        tdm_mm::nvfp4_scales(c.sc, sa, sb);
#pragma unroll
        for (int q = 0; q < 4; q++) {   // word q: k 8q .. 8q+7, nibble i = k 8q+i
            uint32_t b[4];
            tdm_mm::nvfp4_bregs(w[q], q < 2 ? sa : sb, b);   // b[j]: k 8q+j | 8q+j+4
            const float4 xa = *reinterpret_cast<const float4 *>(xc + 8 * q);
            const float4 xb = *reinterpret_cast<const float4 *>(xc + 8 * q + 4);
            acc = fmaf(xa.x, bf_lo(b[0]), acc);
            acc = fmaf(xa.y, bf_lo(b[1]), acc);
            acc = fmaf(xa.z, bf_lo(b[2]), acc);
            acc = fmaf(xa.w, bf_lo(b[3]), acc);
            acc = fmaf(xb.x, bf_hi(b[0]), acc);
            acc = fmaf(xb.y, bf_hi(b[1]), acc);
            acc = fmaf(xb.z, bf_hi(b[2]), acc);
            acc = fmaf(xb.w, bf_hi(b[3]), acc);
        }
        return acc;
    } else if constexpr (F == TDM_W_FP8) {
        float part = 0.0f;
#pragma unroll
        for (int q = 0; q < 4; q++) {   // word q: k 4q .. 4q+3
            const uint32_t b0 = tdm_mm::bf16x2_mul(tdm_fp8_place(w[q], 0), TDM_FP8_UNPLACE);   // k 4q | 4q+2
            const uint32_t b1 = tdm_mm::bf16x2_mul(tdm_fp8_place(w[q], 1), TDM_FP8_UNPLACE);   // k 4q+1 | 4q+3
            const float4 xv = *reinterpret_cast<const float4 *>(xc + 4 * q);
            part = fmaf(xv.x, bf_lo(b0), part);
            part = fmaf(xv.y, bf_lo(b1), part);
            part = fmaf(xv.z, bf_hi(b0), part);
            part = fmaf(xv.w, bf_hi(b1), part);
        }
        return fmaf(part, __uint_as_float(c.sc), acc);
    } else {
#pragma unroll
        for (int q = 0; q < 2; q++) {   // words 2q, 2q+1: k 4q .. 4q+3
            const float4 xv = *reinterpret_cast<const float4 *>(xc + 4 * q);
            acc = fmaf(xv.x, bf_lo(w[2 * q]), acc);
            acc = fmaf(xv.y, bf_hi(w[2 * q]), acc);
            acc = fmaf(xv.z, bf_lo(w[2 * q + 1]), acc);
            acc = fmaf(xv.w, bf_hi(w[2 * q + 1]), acc);
        }
        return acc;
    }
}

// The group's G partial sums (G = 1 << lg), added in an xor butterfly over G/2, ..., 2, 1.
__device__ __forceinline__ float group_sum(float v, int lg)
{
    for (int o = (1 << lg) >> 1; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(FULL, v, o));
    return v;
}

// Stages k values of a BF16 row as FP32 at xpad(i), zeros up to a multiple of 32.
template <int THREADS>
__device__ __forceinline__ void stage_row(float *xs, const uint16_t *xr, int k)
{
    const int kp = (k + 31) & ~31;
    for (int i = threadIdx.x; i < kp; i += THREADS) xs[xpad(i)] = i < k ? bf2f(xr[i]) : 0.0f;
}

// Grid (blocks of GU_THREADS / G rows, the pairs in order); group q of the block (lanes of
// threadIdx.x >> lg) computes output blockIdx.x * (GU_THREADS / G) + q. nch: chunks of a row. A pair
// whose expert is outside 0..E-1 gets NaN. The first batch of weights is loaded before the input
// row is staged.
template <int F, bool VEC>
__global__ void __launch_bounds__(GU_THREADS, GATE_UP_MIN_BLOCKS)
gate_up_kernel(tdm_moe_mat g, tdm_moe_mat u, int E, const uint16_t *x, int64_t ldx, int k, const int32_t *order,
               uint16_t *act, int nch, int lg)
{
    extern __shared__ __align__(16) float xs[];
    tdm_pdl::wait();      // order (TDM_MOE_GU_PDL); then down, which reads order before its wait, may start
    tdm_pdl::release();   // down may start its weight loads (TDM_MOE_DOWN_PDL)
    const int32_t ov = order[blockIdx.y];
    const int pair = order_pair(ov), r = pair / k, e = order_expert(ov);
    const int H = g.k, I = g.n, G = 1 << lg;
    const int gl = threadIdx.x & (G - 1);
    const int n = blockIdx.x * (GU_THREADS >> lg) + (threadIdx.x >> lg);
    uint16_t *out = act + (size_t)pair * I;
    if (e < 0 || e >= E) {   // the same for the whole block
        if (gl == 0 && n < I) out[n] = 0x7fc0;
        return;
    }
    const int row = n < I ? n : I - 1;   // every lane takes part in the group's shuffles
    const RowPtr pg = row_ptr(g, e, row), pu = row_ptr(u, e, row);
    const int gbf = g.scale_dt == TDM_DT_BF16, ubf = u.scale_dt == TDM_DT_BF16;
    const int S = (nch + G - 1) >> lg;   // chunk steps of a lane
    WChunk cg[BATCH], cu[BATCH];
    auto load = [&](int s0) {
#pragma unroll
        for (int b = 0; b < BATCH; b++) {
            const int ch = ((s0 + b) << lg) + gl;
            if (ch < nch) {
                load_wchunk<F, VEC>(cg[b], pg, ch, gbf, H);
                load_wchunk<F, VEC>(cu[b], pu, ch, ubf, H);
            }
        }
    };
    load(0);
    stage_row<GU_THREADS>(xs, x + (size_t)r * ldx, H);
    __syncthreads();
    float ag = 0.0f, au = 0.0f;
    for (int s0 = 0; s0 < S; s0 += BATCH) {
        if (s0) load(s0);
#pragma unroll
        for (int b = 0; b < BATCH; b++) {
            const int ch = ((s0 + b) << lg) + gl;
            if (ch < nch) {
                const float *xc = xs + xpad(ch * ChunkK<F>::K);
                ag = chunk_dot<F>(cg[b], xc, ag);
                au = chunk_dot<F>(cu[b], xc, au);
            }
        }
    }
    ag = group_sum(ag, lg);
    au = group_sum(au, lg);
    if constexpr (F == TDM_W_NVFP4) {
        ag = __fmul_rn(ag, __fmul_rn(g.scale2[e], 0x1p7f));
        au = __fmul_rn(au, __fmul_rn(u.scale2[e], 0x1p7f));
    }
    if (gl == 0 && n < I) out[n] = swiglu_ref(ag, au);
}

// The experts on the tensor cores (NVFP4 rows of whole chunk quads: K a multiple of 128;
// TDM_MOE_MMA). The FMA forms above issue ~31 instructions a word of 8 weights (the decode, 8
// extractions, 8 FMAs, the input's loads) and are held by them at 32 rows (ncu of gate+up: 0.82
// issued a scheduler cycle, DRAM 53 %). Here the decoded BF16 pairs feed mma.m16n8k16 as the A
// operand and the pair's input row is the B operand in every column (7 columns wasted: the tensor
// cores are idle otherwise). GU (gate+up): rows 0-7 of a tile are gate rows n .. n+7 and rows 8-15
// the up rows of the same outputs, so a lane holds both dots of its output; down: the tile's 16 rows
// are 16 outputs. A lane (group g, thread t of the fragment) takes chunk 4 s + t of its rows at step
// s, so logical k 2t, 2t+1 | 2t+8, 2t+9 of an mma are the chunk's pairs (k 8q+j | 8q+j+4) j = 0, 1
// (or 2, 3) of word q (nvfp4_bregs' order), and the input is staged in the same pairs. K is split
// over the block's ks warps (mma_ks: from K alone), the warps' partial sums added in warp order by
// the block's first threads: a row's sums never depend on M (the twins check it). Each mma's 16-term
// sum runs in the tensor cores' order, not the FMA chain's; layers_gpu's bound against the reference
// (MOE_DOT_REL of sum |x w|) is the same. TDM_MOE_MMA: 1 gate+up, 2 down, 3 both (the default), 0
// neither (the FMA forms), for A/B runs.
#ifndef TDM_MOE_MMA
#define TDM_MOE_MMA 3
#endif
// FP8 experts (k a multiple of 128) in the same form (knob TDM_MOE_MMA_FP8, 1 or 0): a 128-k scale
// block is one batch of MMA_BS steps; its sum from 0, then acc = fma(sum, the block's scale, acc).
#ifndef TDM_MOE_MMA_FP8
#define TDM_MOE_MMA_FP8 1
#endif
// 16-row tiles a warp (knob TDM_MOE_MMA_TILES: 1, or 2 for twice the outputs a block; a launch shape
// only: each output's sums are the same). 1 measured faster on the 4-layer 80B (H100): 72 registers
// where 2 took 104, so ~28 warps a SM instead of 16; the step 0.361-0.367 -> 0.355 ms, 16-row rounds
// 0.925-0.934 -> 0.893, 32-row 1.517-1.520 -> 1.454-1.483 (bench/results/h100-moe-mma-v2.txt).
#ifndef TDM_MOE_MMA_TILES
#define TDM_MOE_MMA_TILES 1
#endif
constexpr int MMA_TILES = TDM_MOE_MMA_TILES;
static_assert(MMA_TILES == 1 || MMA_TILES == 2, "TDM_MOE_MMA_TILES: 1 or 2");
constexpr int MMA_KS_MAX = 8;                  // warps a block at most (the K split)
// The fewest steps a warp takes where the K split can give it more, for gate+up and for down (knobs
// TDM_MOE_MMA_GU_MIN_STEPS, TDM_MOE_MMA_DOWN_MIN_STEPS: 1, 2, 4 or 8; they change the K split, so the
// bits). Measured on the 4-layer 80B (H100, bench/results/h100-moe-mma-v2.txt): gate+up at 2 slower
// everywhere (at 104 registers 2 blocks of 8 warps a SM, so a one-row call's 320 blocks took two
// waves); down at 2 faster at one row by the tracer (4.4 -> 3.0 us a call) but 1-4 % slower rounds
// at 16-32 rows, at 1 slower; so 4 for both.
#ifndef TDM_MOE_MMA_GU_MIN_STEPS
#define TDM_MOE_MMA_GU_MIN_STEPS 4
#endif
#ifndef TDM_MOE_MMA_DOWN_MIN_STEPS
#define TDM_MOE_MMA_DOWN_MIN_STEPS 4
#endif
// Steps a lane has in flight (knob TDM_MOE_MMA_BS: 2 or 4; 2 x MMA_TILES x BS chunks; the same sums:
// a warp's steps are added in order whatever the batch). 4 (96 registers) measured no faster at one
// row and 1-3 % slower at 16-32 (h100-moe-mma-v2.txt); it needs TDM_MOE_MMA_FP8=0.
#ifndef TDM_MOE_MMA_BS
#define TDM_MOE_MMA_BS 2
#endif
constexpr int MMA_BS = TDM_MOE_MMA_BS;
static_assert(MMA_BS == 2 || MMA_BS == 4, "TDM_MOE_MMA_BS: 2 or 4");
static_assert(!TDM_MOE_MMA_FP8 || MMA_BS == 2, "TDM_MOE_MMA_FP8: a batch of 2 steps is one 128-k scale block");
// outputs a block: gate+up 8 a tile, down 16
__host__ __device__ constexpr int mma_outs(bool gu) { return (gu ? 8 : 16) * MMA_TILES; }

// GU: act = swiglu of m0 (gate) and m1 (up) on x's row of the pair, ldx its stride; else y = m0
// (down) on the pair's act row (x = act, ldx = I). Grid (blocks of mma_outs(GU) outputs, the pairs
// in order); 32 ks threads.
template <int F, bool GU>
__global__ void __launch_bounds__(32 * MMA_KS_MAX, 2)
experts_mma_kernel(tdm_moe_mat m0, tdm_moe_mat m1, int E, const uint16_t *x, int64_t ldx, int k, const int32_t *order,
                   uint16_t *out_all, int nch, int ks)
{
    static_assert(F == TDM_W_NVFP4 || F == TDM_W_FP8, "experts_mma_kernel: NVFP4 or FP8");
    constexpr bool FP8 = F == TDM_W_FP8;
    constexpr int OUT = mma_outs(GU), CK = ChunkK<F>::K, XQ = FP8 ? 2 : 4;   // XQ: uint4 of pairs a chunk
    extern __shared__ __align__(16) uint4 xq[];   // the input's pairs: [ks][steps][XQ][4 t]
    __shared__ float part[MMA_KS_MAX][OUT][GU ? 2 : 1];
    if (GU) {
        tdm_pdl::wait();      // order (TDM_MOE_GU_PDL); then down, which reads order before its wait, may start
        tdm_pdl::release();   // down may start its weight loads (TDM_MOE_DOWN_PDL)
    }
    const int32_t ov = order[blockIdx.y];
    const int pair = order_pair(ov), e = order_expert(ov);
    const int K = m0.k, N = m0.n;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gq = lane >> 2, t = lane & 3;
    const int n0 = blockIdx.x * OUT;
    uint16_t *out = out_all + (size_t)pair * N;
    if (e < 0 || e >= E) {   // the same for the whole block
        if (!GU) tdm_pdl::wait();
        if (threadIdx.x < OUT && n0 + (int)threadIdx.x < N) out[n0 + threadIdx.x] = 0x7fc0;
        return;
    }
    const int cpw = nch / ks, S = cpw >> 2, c0 = warp * cpw;   // a warp's chunks, steps, first chunk
    const int sbf0 = m0.scale_dt == TDM_DT_BF16, sbf1 = m1.scale_dt == TDM_DT_BF16;
    RowPtr p0[MMA_TILES], p1[MMA_TILES];   // rows gq and gq + 8 of each tile
#pragma unroll
    for (int tt = 0; tt < MMA_TILES; tt++) {
        const int r0 = GU ? n0 + 8 * tt + gq : n0 + 16 * tt + gq, r1 = GU ? r0 : r0 + 8;
        p0[tt] = row_ptr(m0, e, min(r0, N - 1));
        p1[tt] = row_ptr(m1, e, min(r1, N - 1));
    }
    WChunk c[MMA_BS][MMA_TILES][2];
    auto load = [&](int s0) {
#pragma unroll
        for (int b = 0; b < MMA_BS; b++)
            if (s0 + b < S) {
                const int ch = c0 + 4 * (s0 + b) + t;
#pragma unroll
                for (int tt = 0; tt < MMA_TILES; tt++) {
                    load_wchunk<F, true>(c[b][tt][0], p0[tt], ch, sbf0, K);
                    load_wchunk<F, true>(c[b][tt][1], p1[tt], ch, sbf1, K);
                }
            }
    };
    load(0);
    if (!GU) tdm_pdl::wait();   // act is gate+up's output (launched programmatically: tdm_moe_down)
    // the warp's slice of the input as BF16 pairs in the weights' register order, at [step][XQ][t]:
    // the lanes of a quarter-warp (t = 0..3) read 64 contiguous bytes. NVFP4: uint4 q of a chunk holds
    // word q's pairs (k 8q+j | 8q+j+4), j = 0..3; FP8: uint4 h holds words 2h and 2h+1, each as its
    // pairs (k 4q | 4q+2), (4q+1 | 4q+3) (tdm_fp8_place's order).
    uint4 *xw = xq + (size_t)warp * cpw * XQ;
    const uint16_t *xr = x + (size_t)(GU ? pair / k : pair) * ldx + (size_t)c0 * CK;
    for (int i = lane; i < cpw * XQ; i += 32) {   // chunk cc = i / XQ of the slice, part h = i % XQ: 8 k
        const uint4 v = *reinterpret_cast<const uint4 *>(xr + 8 * i);
        const int cc = i / XQ, h = i % XQ;
        xw[((cc >> 2) * XQ + h) * 4 + (cc & 3)] =
            FP8 ? make_uint4(__byte_perm(v.x, v.y, 0x5410), __byte_perm(v.x, v.y, 0x7632), __byte_perm(v.z, v.w, 0x5410),
                             __byte_perm(v.z, v.w, 0x7632))
                : make_uint4(__byte_perm(v.x, v.z, 0x5410), __byte_perm(v.x, v.z, 0x7632), __byte_perm(v.y, v.w, 0x5410),
                             __byte_perm(v.y, v.w, 0x7632));
    }
    __syncwarp();
    float acc[MMA_TILES][4];
#pragma unroll
    for (int tt = 0; tt < MMA_TILES; tt++) acc[tt][0] = acc[tt][1] = acc[tt][2] = acc[tt][3] = 0.0f;
    for (int s0 = 0; s0 < S; s0 += MMA_BS) {
        if (s0) load(s0);
        // FP8: a batch is one 128-k scale block (MMA_BS steps of 4 chunks of 16 k; s0 even): its sums
        // from 0 in blk, then acc = fma(blk, the row's block scale, acc), as the FMA form does a chunk
        float blk[MMA_TILES][4];
#pragma unroll
        for (int tt = 0; tt < MMA_TILES; tt++) blk[tt][0] = blk[tt][1] = blk[tt][2] = blk[tt][3] = 0.0f;
#pragma unroll
        for (int b = 0; b < MMA_BS; b++) {
            if (s0 + b >= S) break;
            if constexpr (FP8) {
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const uint4 xp = xw[((s0 + b) * 2 + h) * 4 + t];
#pragma unroll
                    for (int tt = 0; tt < MMA_TILES; tt++) {
#pragma unroll
                        for (int j = 0; j < 2; j++) {   // word q = 2h + j
                            const int q = 2 * h + j;
                            const uint32_t w0 = word(c[b][tt][0].w, q), w1 = word(c[b][tt][1].w, q);
                            const uint32_t a0 = tdm_mm::bf16x2_mul(tdm_fp8_place(w0, 0), TDM_FP8_UNPLACE),
                                           a2 = tdm_mm::bf16x2_mul(tdm_fp8_place(w0, 1), TDM_FP8_UNPLACE),
                                           a1 = tdm_mm::bf16x2_mul(tdm_fp8_place(w1, 0), TDM_FP8_UNPLACE),
                                           a3 = tdm_mm::bf16x2_mul(tdm_fp8_place(w1, 1), TDM_FP8_UNPLACE);
                            tdm_mm::mma_bf16(blk[tt], a0, a1, a2, a3, j ? xp.z : xp.x, j ? xp.w : xp.y);
                        }
                    }
                }
            } else {
                uint32_t sc[MMA_TILES][2][2];   // [tile][row][words 0-1 | 2-3]
#pragma unroll
                for (int tt = 0; tt < MMA_TILES; tt++)
#pragma unroll
                    for (int h = 0; h < 2; h++) tdm_mm::nvfp4_scales(c[b][tt][h].sc, sc[tt][h][0], sc[tt][h][1]);
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    const uint4 xp = xw[((s0 + b) * 4 + q) * 4 + t];
#pragma unroll
                    for (int tt = 0; tt < MMA_TILES; tt++) {
                        uint32_t a[4], bb[4];
                        tdm_mm::nvfp4_bregs(word(c[b][tt][0].w, q), sc[tt][0][q >> 1], a);
                        tdm_mm::nvfp4_bregs(word(c[b][tt][1].w, q), sc[tt][1][q >> 1], bb);
                        tdm_mm::mma_bf16(acc[tt], a[0], bb[0], a[1], bb[1], xp.x, xp.y);
                        tdm_mm::mma_bf16(acc[tt], a[2], bb[2], a[3], bb[3], xp.z, xp.w);
                    }
                }
            }
        }
        if constexpr (FP8) {
#pragma unroll
            for (int tt = 0; tt < MMA_TILES; tt++) {
                acc[tt][0] = fmaf(blk[tt][0], __uint_as_float(c[0][tt][0].sc), acc[tt][0]);
                acc[tt][2] = fmaf(blk[tt][2], __uint_as_float(c[0][tt][1].sc), acc[tt][2]);
            }
        }
    }
    // c0 (row gq) and c2 (row gq + 8) of column 2t; every column holds the same sums
    if (t == 0) {
#pragma unroll
        for (int tt = 0; tt < MMA_TILES; tt++) {
            if constexpr (GU) {
                part[warp][8 * tt + gq][0] = acc[tt][0];
                part[warp][8 * tt + gq][1] = acc[tt][2];
            } else {
                part[warp][16 * tt + gq][0] = acc[tt][0];
                part[warp][16 * tt + gq + 8][0] = acc[tt][2];
            }
        }
    }
    __syncthreads();
    if (threadIdx.x < OUT) {
        const int o = threadIdx.x, n = n0 + o;
        float v0 = part[0][o][0];
        for (int w = 1; w < ks; w++) v0 = __fadd_rn(v0, part[w][o][0]);
        if constexpr (!FP8) v0 = __fmul_rn(v0, __fmul_rn(m0.scale2[e], 0x1p7f));
        if constexpr (GU) {
            float v1 = part[0][o][1];
            for (int w = 1; w < ks; w++) v1 = __fadd_rn(v1, part[w][o][1]);
            if constexpr (!FP8) v1 = __fmul_rn(v1, __fmul_rn(m1.scale2[e], 0x1p7f));
            if (n < N) out[n] = swiglu_ref(v0, v1);
        } else if (n < N) {
            out[n] = f2bf(v0);
        }
    }
}

// Rows a group of down computes (RPG): its lanes load the first chunks of all RPG rows before any is
// used, BATCH / RPG chunks of each, so a row short enough for one batch leaves no load slot idle (the
// 80B's NVFP4 down_proj, 512 inputs: one chunk a lane, RPG 4, 16 KB a block where RPG 1 read 4 KB).
// A row's sum is the same with any RPG: its lane takes its chunks in ascending order whatever the
// batch. The forms of RPG > 1 hold up to 128 registers (2 blocks a SM at least): at down's 64 ptxas
// spilled them. (gate+up's 2-row form spilled at 128 too: it keeps one row a group.) Only calls of
// more than one row take them (tdm_moe_down): measured on the 4-layer 80B (H100), down_proj 7.9 ->
// 8.9 us a call at one row (fewer, slower blocks), 86.5 -> 75.0 at 16 rows.
#ifndef TDM_MOE_DOWN_RPG_MAX
#define TDM_MOE_DOWN_RPG_MAX 4
#endif
constexpr int down_rows_per_group(int steps)
{
    return steps * 4 <= BATCH && TDM_MOE_DOWN_RPG_MAX >= 4 ? 4 : steps * 2 <= BATCH && TDM_MOE_DOWN_RPG_MAX >= 2 ? 2 : 1;
}

// down_kernel as gate_up_kernel, RPG rows a group: group q computes outputs blockIdx.x * RPG Q + q +
// j Q, j < RPG (Q = 256 / G groups a block). Launched programmatically after gate+up where
// TDM_MOE_DOWN_PDL (pdl.cuh): its first weights load while gate+up finishes, and it waits before it
// reads act or writes y. It reads sel and order before the wait: the kernels that make them finished
// before gate+up (a plain launch) began (tdm_moe_down's contract in moe.h).
template <int F, bool VEC, int RPG>
__global__ void __launch_bounds__(FAST_THREADS, RPG == 1 ? DOWN_MIN_BLOCKS : 2)
down_kernel(tdm_moe_mat d, int E, const uint16_t *act, const int32_t *order, uint16_t *y, int nch, int lg)
{
    extern __shared__ __align__(16) float as[];
    constexpr int B = BATCH / RPG;
    const int32_t ov = order[blockIdx.y];
    const int pair = order_pair(ov), e = order_expert(ov);
    const int I = d.k, H = d.n, G = 1 << lg, Q = FAST_THREADS >> lg;
    const int gl = threadIdx.x & (G - 1);
    const int n0 = blockIdx.x * Q * RPG + (threadIdx.x >> lg);
    uint16_t *out = y + (size_t)pair * H;
    if (e < 0 || e >= E) {
        tdm_pdl::wait();
#pragma unroll
        for (int j = 0; j < RPG; j++)
            if (gl == 0 && n0 + j * Q < H) out[n0 + j * Q] = 0x7fc0;
        return;
    }
    const int dbf = d.scale_dt == TDM_DT_BF16;
    const int S = (nch + G - 1) >> lg;
    WChunk cd[RPG][B];
    auto load = [&](int s0) {
#pragma unroll
        for (int j = 0; j < RPG; j++) {
            const RowPtr pd = row_ptr(d, e, min(n0 + j * Q, H - 1));
#pragma unroll
            for (int b = 0; b < B; b++) {
                const int ch = ((s0 + b) << lg) + gl;
                if (ch < nch) load_wchunk<F, VEC>(cd[j][b], pd, ch, dbf, I);
            }
        }
    };
    load(0);
    tdm_pdl::wait();
    stage_row<FAST_THREADS>(as, act + (size_t)pair * I, I);
    __syncthreads();
    float acc[RPG];
#pragma unroll
    for (int j = 0; j < RPG; j++) acc[j] = 0.0f;
    for (int s0 = 0; s0 < S; s0 += B) {
        if (s0) load(s0);
#pragma unroll
        for (int j = 0; j < RPG; j++)
#pragma unroll
            for (int b = 0; b < B; b++) {
                const int ch = ((s0 + b) << lg) + gl;
                if (ch < nch) acc[j] = chunk_dot<F>(cd[j][b], as + xpad(ch * ChunkK<F>::K), acc[j]);
            }
    }
#pragma unroll
    for (int j = 0; j < RPG; j++) {
        float v = group_sum(acc[j], lg);
        if constexpr (F == TDM_W_NVFP4) v = __fmul_rn(v, __fmul_rn(d.scale2[e], 0x1p7f));
        if (gl == 0 && n0 + j * Q < H) out[n0 + j * Q] = f2bf(v);
    }
}

constexpr int MAX_TOPK = TDM_ROUTE_MAX_K;   // the router's most chosen experts

// Outputs a combine block: one a thread.
constexpr int COMBINE_COLS = MOE_THREADS;

// Row r's shared-expert scale, tdm_ref_moe_combine's bf16(sigmoid(bf16(x_r . w))): a block a row stages
// the products x[i] * w[i] in shared memory and warp 0 adds them in tdm_dot's order (group_dot).
__global__ void __launch_bounds__(MOE_THREADS)
shared_gate_kernel(RowRef sg, const uint16_t *x, int64_t ldx, int H, float *gate)
{
    extern __shared__ float prod[];   // [H]
    const int r = blockIdx.x, tid = threadIdx.x;
    const uint16_t *xr = x + (size_t)r * ldx;
    for (int i = tid; i < H; i += MOE_THREADS) prod[i] = __fmul_rn(bf2f(xr[i]), w_at(sg, i));
    __syncthreads();
    if (tid < 32) {
        const float g = group_dot(prod, H, tid & 7);   // the four groups compute the same sum
        if (tid == 0) gate[r] = bfr(sigmoid_ref(bfr(g)));
    }
}

// Block (row r, slice c): tdm_ref_moe_combine of row r's outputs [c COMBINE_COLS, (c + 1) COMBINE_COLS),
// the shared expert scaled by gate[r] (shared_gate_kernel, launched on the shared expert's stream: off
// this kernel's path). The first k threads order the row's slots by ascending (expert id, slot); then
// each thread its value. (One block a row, its threads walking the row, took ~54 us a call at one row
// of H 2048 on an H100: one SM, 80 dependent loads a thread; the gate's dot in this kernel ~2 us more.)
__global__ void __launch_bounds__(MOE_THREADS)
combine_kernel(const uint16_t *y, const uint16_t *w, const int32_t *sel, int k, int H, const float *gate,
               const uint16_t *sh, int64_t ldsh, uint16_t *out, int64_t ldout)
{
    __shared__ int asc[MAX_TOPK], ss[MAX_TOPK];
    __shared__ float wt[MAX_TOPK], ws[MAX_TOPK];
    const int r = blockIdx.x, tid = threadIdx.x;
    if (tid < k) {
        ss[tid] = sel[(size_t)r * k + tid];
        ws[tid] = bf2f(w[(size_t)r * k + tid]);
    }
    __syncthreads();
    if (tid < k) {
        // tdm_ref_moe_combine's order, ascending (expert id, slot): slot t's place is the number of
        // slots before it in that order
        int n = 0;
        for (int i = 0; i < k; i++) n += ss[i] < ss[tid] || (ss[i] == ss[tid] && i < tid);
        asc[n] = tid;
        wt[n] = ws[tid];
    }
    __syncthreads();
    const int i = blockIdx.y * COMBINE_COLS + tid;
    if (i >= H) return;
    const uint16_t *yr = y + (size_t)r * k * H + i;
    float o = 0.0f;
    for (int n0 = 0; n0 < k; n0 += 8) {   // a batch's loads issued before its sums
        float yv[8];
#pragma unroll
        for (int j = 0; j < 8; j++) yv[j] = n0 + j < k ? bf2f(yr[(size_t)asc[n0 + j] * H]) : 0.0f;
#pragma unroll
        for (int j = 0; j < 8; j++)
            if (n0 + j < k) o = bfr(__fadd_rn(o, bfr(__fmul_rn(yv[j], wt[n0 + j]))));
    }
    o = __fadd_rn(o, bfr(__fmul_rn(gate[r], bf2f(sh[(size_t)r * ldsh + i]))));
    out[(size_t)r * ldout + i] = f2bf(o);
}

// ---- the grouped form (moe.h): the pairs sorted by expert, then tensor-core GEMMs per expert tile ----

constexpr int GROUP_RB = 64;          // rows a block of the counting and the scatter
constexpr int PLAN_THREADS = 1024;

// An expert id's bucket: itself, or E for an id outside 0..E-1 (its tiles write NaN).
__device__ __forceinline__ int bucket_of(int32_t e, int E) { return e >= 0 && e < E ? e : E; }
__device__ __forceinline__ int pad_rows(int n) { return (n + TDM_MOE_GROUP_PAD - 1) / TDM_MOE_GROUP_PAD * TDM_MOE_GROUP_PAD; }

// Where tdm_moe_group keeps things in its buffer (group_view).
struct GroupView {
    int32_t *ntiles;   // [1] tiles made
    int32_t *slots;    // [S] the pair of each slot, -1 for padding
    int4 *tiles;       // [NT] {bucket, first slot, slots (16..128, a multiple of 16), 0}
    int32_t *cnt;      // [NB][E + 1] a row block's pairs per bucket, then the pairs of that bucket in earlier blocks
    int32_t *base;     // [E + 1] a bucket's first slot
    int64_t S, NT;
    int NB;
    int64_t bytes;     // the whole buffer
};
// A block of GROUP_RB rows' buckets, in pair order, into shared memory; returns how many.
__device__ __forceinline__ int stage_buckets(int32_t *sb, const int32_t *sel, int M, int k, int E)
{
    const int r0 = blockIdx.x * GROUP_RB, n = min(GROUP_RB, M - r0) * k;
    for (int i = threadIdx.x; i < n; i += blockDim.x) sb[i] = bucket_of(sel[(int64_t)r0 * k + i], E);
    __syncthreads();
    return n;
}

// cnt[b][e] = block b's pairs of bucket e.
__global__ void group_count_kernel(const int32_t *sel, int M, int k, int E, GroupView v)
{
    extern __shared__ int32_t sb[];
    const int n = stage_buckets(sb, sel, M, k, E);
    for (int e = threadIdx.x; e <= E; e += blockDim.x) {
        int c = 0;
        for (int i = 0; i < n; i++) c += sb[i] == e;
        v.cnt[(int64_t)blockIdx.x * (E + 1) + e] = c;
    }
}

// One block: each thread takes a run of buckets; cnt becomes the pairs of the bucket in earlier
// blocks; the buckets' padded sizes and tile counts are scanned over the threads (Hillis-Steele, in
// shared memory); each thread then writes its buckets' bases, padding slots (-1) and tiles.
__global__ void __launch_bounds__(PLAN_THREADS) group_plan_kernel(int E, GroupView v)
{
    __shared__ int64_t sp[PLAN_THREADS], stl[PLAN_THREADS];
    const int nb = E + 1, per = (nb + PLAN_THREADS - 1) / PLAN_THREADS, tid = threadIdx.x;
    const int b0 = min(nb, tid * per), b1 = min(nb, b0 + per);
    int64_t pad = 0, ntl = 0;
    for (int b = b0; b < b1; b++) {
        int tot = 0;
        for (int blk = 0; blk < v.NB; blk++) {
            int32_t *c = &v.cnt[(int64_t)blk * nb + b];
            const int n = *c;
            *c = tot;
            tot += n;
        }
        v.base[b] = tot;   // the bucket's size until the second walk
        pad += pad_rows(tot);
        ntl += (tot + TDM_MOE_TILE_ROWS - 1) / TDM_MOE_TILE_ROWS;
    }
    sp[tid] = pad;
    stl[tid] = ntl;
    __syncthreads();
    for (int o = 1; o < PLAN_THREADS; o <<= 1) {   // inclusive scan
        const int64_t a = tid >= o ? sp[tid - o] : 0, b = tid >= o ? stl[tid - o] : 0;
        __syncthreads();
        sp[tid] += a;
        stl[tid] += b;
        __syncthreads();
    }
    int64_t slot = sp[tid] - pad, tl = stl[tid] - ntl;
    if (tid == PLAN_THREADS - 1) *v.ntiles = (int32_t)stl[tid];
    for (int b = b0; b < b1; b++) {
        const int tot = v.base[b], padded = pad_rows(tot);
        v.base[b] = (int32_t)slot;
        for (int s = tot; s < padded; s++) v.slots[slot + s] = -1;
        for (int t0 = 0; t0 < tot; t0 += TDM_MOE_TILE_ROWS)
            v.tiles[tl++] = make_int4(b, (int)(slot + t0), min(TDM_MOE_TILE_ROWS, padded - t0), 0);
        slot += padded;
    }
}

// slots[base[e] + cnt[b][e] + (the block's earlier pairs of bucket e)] = the pair.
__global__ void group_scatter_kernel(const int32_t *sel, int M, int k, int E, GroupView v)
{
    extern __shared__ int32_t sb[];
    const int n = stage_buckets(sb, sel, M, k, E);
    const int64_t p0 = (int64_t)blockIdx.x * GROUP_RB * k;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int e = sb[i];
        int rank = 0;
        for (int j = 0; j < i; j++) rank += sb[j] == e;
        v.slots[v.base[e] + v.cnt[(int64_t)blockIdx.x * (E + 1) + e] + rank] = (int32_t)(p0 + i);
    }
}

// The grouped GEMMs: 4 x 2 warps, a tile of up to 128 slots x 64 weight rows (wide_tile.cuh).
constexpr int GWM = 4;
constexpr int GBM = 32 * GWM, GBN = 256 / GWM;
static_assert(GBM == TDM_MOE_TILE_ROWS, "a CTA takes one tile");
// Gate+up: weight-tile row j of warp column j / 32 is gate's (n8-tiles 0, 1) or up's (2, 3) row
// for output 16 (j / 32) + j % 16: a lane's accumulators hold gate and up of the same outputs.
__host__ __device__ __forceinline__ bool gu_is_up(int j) { return (j & 31) >= 16; }
__host__ __device__ __forceinline__ int gu_out(int j) { return 16 * (j >> 5) + (j & 15); }
constexpr int GU_OUTS = GBN / 2;   // outputs of a gate+up CTA

// The operands of one CTA (wide_tile.cuh's Op): activation row r = a + (pairs[r] / div) * lda (x rows
// by row for gate+up, act rows by pair for down); weight row j = m0's row c0 + j, or for gate+up
// (GU) gate's or up's row c0 + gu_out(j); clamped into the matrix.
template <bool GU>
struct ExpertOp {
    const int32_t *pairs;
    const uint16_t *a;
    int64_t lda;
    int div;
    const tdm_moe_mat *m0, *m1;
    int e, c0;
    int k, rows;
    bool vec, x_vec;
    __device__ const tdm_moe_mat &mat(int j) const { return GU && gu_is_up(j) ? *m1 : *m0; }
    __device__ RowPtr wrow(int j) const
    {
        const tdm_moe_mat &m = mat(j);
        return row_ptr(m, e, min(c0 + (GU ? gu_out(j) : j), m.n - 1));
    }
    __device__ const uint16_t *arow(int r) const { return pairs[r] >= 0 ? a + (int64_t)(pairs[r] / div) * lda : nullptr; }
    __device__ const uint8_t *brow(int j) const { return wrow(j).w; }
    __device__ const uint8_t *bytes_at(const uint8_t *row, int64_t off) const { return row + off; }   // experts: rows
    __device__ uint32_t group_at(const uint8_t *groups, int64_t g) const { return groups[g]; }
    __device__ const uint8_t *bgroups(int j) const { return wrow(j).s; }
    __device__ float bscale(int j, int kb) const
    {
        const uint8_t *s = wrow(j).s;
        return mat(j).scale_dt == TDM_DT_BF16 ? bf2f(((const uint16_t *)s)[kb]) : ((const float *)s)[kb];
    }
};

// Grid (the most tiles, blocks of outputs); CTA (tile, block): GU, act[p][c0 .. c0 + 32) from gate and
// up; else y[p][c0 .. c0 + 64) from down, for the pairs p of the tile's slots.
template <int F, bool GU>
__global__ void __launch_bounds__(tdm_wide::THREADS)
grouped_kernel(tdm_moe_mat m0, tdm_moe_mat m1, int E, const uint16_t *a, int64_t lda, int div, GroupView v,
               uint16_t *out, bool vec, bool x_vec)
{
    __shared__ int32_t pairs[GBM];
    if ((int)blockIdx.x >= *v.ntiles) return;   // the same for the whole CTA
    const int4 tl = v.tiles[blockIdx.x];
    const int e = tl.x, rows = tl.z;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int wm = warp % GWM, wn = warp / GWM;
    const int N = m0.n, c0 = blockIdx.y * (GU ? GU_OUTS : GBN), cols = min(GU ? GU_OUTS : GBN, N - c0);
    for (int r = tid; r < GBM; r += tdm_wide::THREADS) pairs[r] = r < rows ? v.slots[tl.y + r] : -1;
    __syncthreads();
    if (e >= E) {   // ids outside 0..E-1: NaN, as the per-pair kernels
        for (int i = tid; i < rows * cols; i += tdm_wide::THREADS)
            if (pairs[i / cols] >= 0) out[(int64_t)pairs[i / cols] * N + c0 + i % cols] = 0x7fc0;
        return;
    }
    const ExpertOp<GU> op{pairs, a, lda, div, &m0, &m1, e, c0, m0.k, rows, vec, x_vec};
    float acc[2][4][4];
    tdm_wide::mainloop<F, GWM>(op, acc);
    const float s0 = F == TDM_W_NVFP4 ? __fmul_rn(m0.scale2[e], 0x1p7f) : 1.0f;
    const float s1 = F == TDM_W_NVFP4 && GU ? __fmul_rn(m1.scale2[e], 0x1p7f) : 1.0f;
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = tdm_wide::tile_row(wm, i, h, g);
            if (r >= rows || pairs[r] < 0) continue;
            uint16_t *o = out + (int64_t)pairs[r] * N + c0;
#pragma unroll
            for (int j = 0; j < (GU ? 2 : 4); j++)
#pragma unroll
                for (int q = 0; q < 2; q++) {
                    const int c = tdm_wide::tile_col(wn, j, q, t), n = GU ? gu_out(c) : c;
                    if (n >= cols) continue;
                    float y = acc[i][j][2 * h + q];
                    if (F == TDM_W_NVFP4) y = __fmul_rn(y, s0);
                    if constexpr (GU) {   // gate at c, up at c + 16 (n8-tile j + 2)
                        float u = acc[i][j + 2][2 * h + q];
                        if (F == TDM_W_NVFP4) u = __fmul_rn(u, s1);
                        o[n] = swiglu_ref(y, u);
                    } else {
                        o[n] = f2bf(y);
                    }
                }
        }
}

// ---- the packed layout ----------------------------------------------------------------------------

int64_t round_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

const struct tdm_qweight *kind_of(const struct tdm_mlp *ex, int kind)
{
    return kind == TDM_MOE_GATE ? &ex->gate : kind == TDM_MOE_UP ? &ex->up : &ex->down;
}
const char *const kind_name[TDM_MOE_KINDS] = {"gate_proj", "up_proj", "down_proj"};

// Fills d's shapes, formats and strides (no pointers) from expert 0; the total bytes of the layout.
size_t plan(const struct tdm_mlp *experts, int E, struct tdm_moe_experts *d)
{
    memset(d, 0, sizeof *d);
    d->E = E;
    d->H = (int)experts[0].gate.k;
    d->I = (int)experts[0].gate.n;
    size_t at = 0;
    for (int kind = 0; kind < TDM_MOE_KINDS; kind++) {
        const struct tdm_qweight *q = kind_of(&experts[0], kind);
        struct tdm_moe_mat *m = &d->m[kind];
        m->fmt = q->fmt;
        m->scale_dt = q->scale_dt;
        m->n = (int)q->n;
        m->k = (int)q->k;
        m->w_stride = round_up(tdm_wfmt_code_bytes(q->fmt, q->n, q->k), 16);
        m->scale_stride = round_up(tdm_wfmt_scale_bytes(q->fmt, q->scale_dt, q->n, q->k), 16);
        at += (size_t)round_up(m->w_stride * E, 256) + (size_t)round_up(m->scale_stride * E, 256);
        if (q->fmt == TDM_W_NVFP4) at += (size_t)round_up((int64_t)E * 4, 256);
    }
    return at;
}

}  // namespace

extern "C" int tdm_moe_experts_check(const struct tdm_mlp *experts, int E)
{
    if (E < 1 || !experts) return tdm_errf("experts: %d experts", E);
    const int64_t H = experts[0].gate.k, I = experts[0].gate.n;
    if (H < 1 || H > TDM_MOE_MAX_K || I < 1 || I > TDM_MOE_MAX_K)
        return tdm_errf("experts: hidden_size %lld and moe_intermediate_size %lld must be 1..%d for the CUDA expert kernels",
                        (long long)H, (long long)I, TDM_MOE_MAX_K);
    for (int e = 0; e < E; e++)
        for (int kind = 0; kind < TDM_MOE_KINDS; kind++) {
            const struct tdm_qweight *q = kind_of(&experts[e], kind), *q0 = kind_of(&experts[0], kind);
            const int64_t n = kind == TDM_MOE_DOWN ? H : I, k = kind == TDM_MOE_DOWN ? I : H;
            if (q->fmt != TDM_W_BF16 && q->fmt != TDM_W_FP8 && q->fmt != TDM_W_NVFP4)
                return tdm_errf("experts.%d.%s stored %s: the CUDA expert kernels take BF16, FP8 and NVFP4", e,
                                kind_name[kind], tdm_wfmt_name(q->fmt));
            if (q->fmt != q0->fmt || (q->fmt == TDM_W_FP8 && q->scale_dt != q0->scale_dt))
                return tdm_errf("experts.%d.%s stored %s (%s scales), expert 0's %s (%s): the CUDA engine packs one format "
                                "per matrix kind", e, kind_name[kind], tdm_wfmt_name(q->fmt), tdm_dtype_name(q->scale_dt),
                                tdm_wfmt_name(q0->fmt), tdm_dtype_name(q0->scale_dt));
            if (q->n != n || q->k != k)
                return tdm_errf("experts.%d.%s is %lldx%lld, expected %lldx%lld", e, kind_name[kind], (long long)q->n,
                                (long long)q->k, (long long)n, (long long)k);
            if (q->fmt == TDM_W_FP8 && q->row0 % TDM_FP8_BLOCK)
                return tdm_errf("experts.%d.%s: an FP8 view starting at row %lld (not on a 128-row scale block)", e,
                                kind_name[kind], (long long)q->row0);
            if (kind == TDM_MOE_UP && (q->fmt != experts[0].gate.fmt ||
                                       (q->fmt == TDM_W_FP8 && q->scale_dt != experts[0].gate.scale_dt)))
                return tdm_errf("experts.%d.up_proj stored %s (%s scales), gate_proj %s (%s): the CUDA expert kernels read "
                                "gate and up in one format", e, tdm_wfmt_name(q->fmt), tdm_dtype_name(q->scale_dt),
                                tdm_wfmt_name(experts[0].gate.fmt), tdm_dtype_name(experts[0].gate.scale_dt));
            if (q->fmt == TDM_W_NVFP4 && k % TDM_NVFP4_GROUP)
                return tdm_errf("experts.%d.%s: NVFP4 needs k a multiple of 16 (k = %lld)", e, kind_name[kind], (long long)k);
        }
    return 0;
}

extern "C" size_t tdm_moe_experts_bytes(const struct tdm_mlp *experts, int E)
{
    struct tdm_moe_experts d;
    return plan(experts, E, &d);
}

extern "C" int tdm_moe_experts_upload(const struct tdm_mlp *experts, int E, struct tdm_moe_experts *d)
{
    if (tdm_moe_experts_check(experts, E) != 0) return -1;
    const size_t total = plan(experts, E, d);
    void *mem;
    if (tdm_cuda_malloc(&mem, total) != 0) return -1;
    d->owned = mem;
    d->bytes = total;
    float *s2 = (float *)malloc((size_t)E * sizeof(float));
    if (!s2) {
        tdm_moe_experts_free(d);
        return tdm_errf("experts: out of host memory");
    }
    uint8_t *at = (uint8_t *)mem;
    int rc = 0;
    for (int kind = 0; kind < TDM_MOE_KINDS && !rc; kind++) {
        struct tdm_moe_mat *m = &d->m[kind];
        uint8_t *w = at, *scale = NULL;
        float *scale2 = NULL;
        at += round_up(m->w_stride * E, 256);
        if (m->scale_stride) {
            scale = at;
            at += round_up(m->scale_stride * E, 256);
        }
        if (m->fmt == TDM_W_NVFP4) {
            scale2 = (float *)at;
            at += round_up((int64_t)E * 4, 256);
        }
        m->w = w;
        m->scale = scale;
        m->scale2 = scale2;
        const int64_t wrow = tdm_wfmt_code_bytes(m->fmt, 1, m->k);
        for (int e = 0; e < E && !rc; e++) {
            const struct tdm_qweight *q = kind_of(&experts[e], kind);
            rc = tdm_cuda_h2d(w + e * m->w_stride, (const uint8_t *)q->w + q->row0 * wrow, (size_t)(wrow * m->n));
            if (!rc && m->fmt == TDM_W_FP8) {
                const int64_t brow = tdm_wfmt_scale_bytes(m->fmt, m->scale_dt, TDM_FP8_BLOCK, m->k);  // one block row
                rc = tdm_cuda_h2d(scale + e * m->scale_stride, (const uint8_t *)q->scale + q->row0 / TDM_FP8_BLOCK * brow,
                                  (size_t)tdm_wfmt_scale_bytes(m->fmt, m->scale_dt, m->n, m->k));
            } else if (!rc && m->fmt == TDM_W_NVFP4) {
                const int64_t srow = m->k / TDM_NVFP4_GROUP;
                rc = tdm_cuda_h2d(scale + e * m->scale_stride, (const uint8_t *)q->scale + q->row0 * srow,
                                  (size_t)(srow * m->n));
                s2[e] = q->scale2;
            }
        }
        if (!rc && scale2) rc = tdm_cuda_h2d(scale2, s2, (size_t)E * sizeof(float));
        /* the kind's codes into the device's word order in one pass (w_stride is a multiple of 16, so every
         * expert starts on a word; the padding between experts is never read) */
        if (!rc && m->fmt == TDM_W_NVFP4) rc = tdm_nvfp4_to_device_order(w, m->w_stride * E);
    }
    free(s2);
    if (rc) {
        tdm_moe_experts_free(d);
        return tdm_err_prefix("experts: upload");
    }
    return 0;
}

extern "C" void tdm_moe_experts_free(struct tdm_moe_experts *d)
{
    if (d && d->owned) tdm_cuda_free(d->owned);
    if (d) memset(d, 0, sizeof *d);
}

// ---- scratch ----------------------------------------------------------------------------------------

extern "C" size_t tdm_moe_scratch_bytes(int M, int k, int H, int I)
{
    const int64_t P = (int64_t)M * k;
    return (size_t)(round_up(P * 4, 256) + round_up(P * I * 2, 256) + round_up(P * H * 2, 256));
}
extern "C" int32_t *tdm_moe_scratch_order(void *scratch) { return (int32_t *)scratch; }
extern "C" uint16_t *tdm_moe_scratch_act(void *scratch, int M, int k)
{
    return (uint16_t *)((char *)scratch + round_up((int64_t)M * k * 4, 256));
}
extern "C" uint16_t *tdm_moe_scratch_out(void *scratch, int M, int k, int I)
{
    const int64_t P = (int64_t)M * k;
    return (uint16_t *)((char *)scratch + round_up(P * 4, 256) + round_up(P * I * 2, 256));
}

// ---- launchers ----------------------------------------------------------------------------------------

extern "C" int tdm_moe_order(const int32_t *sel, int M, int k, int32_t *order, void *stream)
{
    const int64_t n = (int64_t)M * k;
    if (M < 0 || k < 1 || n > TDM_MOE_MAX_PAIRS || !sel || !order)
        return tdm_errf("tdm_moe_order: bad arguments M %d, k %d (at most %d pairs)", M, k, TDM_MOE_MAX_PAIRS);
    if (n == 0) return 0;
    order_kernel<<<1, ORDER_THREADS, (size_t)n * 4, (cudaStream_t)stream>>>(sel, (int)n, order);
    TDM_LAUNCH_CHECK();
    return 0;
}

static int check_pairs(const struct tdm_moe_experts *ex, int M, int k, const char *who)
{
    if (!ex || !ex->owned || M < 0 || k < 1 || (int64_t)M * k > TDM_MOE_MAX_PAIRS || ex->H > TDM_MOE_MAX_K ||
        ex->I > TDM_MOE_MAX_K)
        return tdm_errf("%s: bad arguments M %d, k %d (at most %d pairs), experts %s", who, M, k, TDM_MOE_MAX_PAIRS,
                        ex && ex->owned ? "uploaded" : "missing");
    return 0;
}

// Lanes a row: the fewest (a power of two, at most 32) whose lanes take at most BATCH chunks each,
// so that a lane's one batch holds its whole share of a short row (the 80B's NVFP4 gate and up, 2048
// inputs in 64 chunks: 16 lanes of 4 chunks, 16 rows and 32 KB a block; its down, 512 inputs in 16
// chunks: 4 lanes of 4, 64 rows and 16 KB a block). With TDM_MOE_LANES_FILL 0: the lanes a row are
// min(chunks, 32) (a lane one or two chunks of those rows: 16 KB and 4 KB a block).
#ifndef TDM_MOE_LANES_FILL
#define TDM_MOE_LANES_FILL 1
#endif
static int lanes_log2(int nch)
{
    int lg = 0;
    if (TDM_MOE_LANES_FILL)
        while ((BATCH << lg) < nch && lg < 5) lg++;
    else
        while ((1 << lg) < nch && lg < 5) lg++;
    return lg;
}

// A matrix's chunks a row (nch), lanes a row (1 << lg, lanes_log2), whole 16-byte chunks (vec), rows
// a group (rpg: 1 but for down of more than one row, down_rows_per_group) and outputs a block (rows).
// Shapes only: the same for every M, so the summation order is too.
struct ChunkPlan { int nch, lg, rpg, rows; bool vec; };
static ChunkPlan chunk_plan(const struct tdm_moe_mat *m, bool many_rows_down, int threads)
{
    const int64_t rowbytes = tdm_wfmt_code_bytes(m->fmt, 1, m->k);
    ChunkPlan p;
    p.nch = (int)((rowbytes + 15) / 16);
    p.lg = lanes_log2(p.nch);
    p.rpg = many_rows_down ? down_rows_per_group((p.nch + (1 << p.lg) - 1) >> p.lg) : 1;
    p.rows = (threads >> p.lg) * p.rpg;
    p.vec = rowbytes % 16 == 0;
    return p;
}

// Gate+up's launch: programmatic (pdl.cuh) after the order kernel where TDM_MOE_GU_PDL (its blocks
// come up while order runs and wait for it before they read order), else plain.
#ifndef TDM_MOE_GU_PDL
#define TDM_MOE_GU_PDL 1
#endif
template <int F>
static cudaError_t launch_gate_up(const struct tdm_moe_experts *ex, const ChunkPlan &cp, dim3 grid, size_t smem,
                                  const uint16_t *x, int64_t ldx, int k, const int32_t *order, uint16_t *act,
                                  cudaStream_t st)
{
    const tdm_moe_mat &g = ex->m[TDM_MOE_GATE], &u = ex->m[TDM_MOE_UP];
    return cp.vec ? tdm_pdl::launch_if(TDM_MOE_GU_PDL, gate_up_kernel<F, true>, grid, dim3(GU_THREADS), smem, st, g, u,
                                       ex->E, x, ldx, k, order, act, cp.nch, cp.lg)
                  : tdm_pdl::launch_if(TDM_MOE_GU_PDL, gate_up_kernel<F, false>, grid, dim3(GU_THREADS), smem, st, g, u,
                                       ex->E, x, ldx, k, order, act, cp.nch, cp.lg);
}

// Down's launch: programmatic (pdl.cuh) where TDM_MOE_DOWN_PDL, else plain.
#ifndef TDM_MOE_DOWN_PDL
#define TDM_MOE_DOWN_PDL 1
#endif
template <int F, bool VEC, int RPG>
static cudaError_t launch_down_rpg(const tdm_moe_mat &d, int E, const ChunkPlan &cp, dim3 grid, size_t smem,
                                   const uint16_t *act, const int32_t *order, uint16_t *y, cudaStream_t st)
{
    return tdm_pdl::launch_if(TDM_MOE_DOWN_PDL, down_kernel<F, VEC, RPG>, grid, dim3(FAST_THREADS), smem, st, d, E, act,
                              order, y, cp.nch, cp.lg);
}

template <int F, bool VEC>
static cudaError_t launch_down_v(const struct tdm_moe_experts *ex, const ChunkPlan &cp, dim3 grid, size_t smem,
                                 const uint16_t *act, const int32_t *order, uint16_t *y, cudaStream_t st)
{
    const tdm_moe_mat &d = ex->m[TDM_MOE_DOWN];
    if (cp.rpg == 4) return launch_down_rpg<F, VEC, 4>(d, ex->E, cp, grid, smem, act, order, y, st);
    if (cp.rpg == 2) return launch_down_rpg<F, VEC, 2>(d, ex->E, cp, grid, smem, act, order, y, st);
    return launch_down_rpg<F, VEC, 1>(d, ex->E, cp, grid, smem, act, order, y, st);
}

template <int F>
static cudaError_t launch_down(const struct tdm_moe_experts *ex, const ChunkPlan &cp, dim3 grid, size_t smem,
                               const uint16_t *act, const int32_t *order, uint16_t *y, cudaStream_t st)
{
    return cp.vec ? launch_down_v<F, true>(ex, cp, grid, smem, act, order, y, st)
                  : launch_down_v<F, false>(ex, cp, grid, smem, act, order, y, st);
}

// Whether every row of a BF16 matrix a (row stride lda) loads as 16-byte vectors.
static bool bf16_rows_vec(const void *a, int64_t lda) { return (uintptr_t)a % 16 == 0 && lda % 8 == 0; }

// experts_mma_kernel's warps a block (its K split) for matrix m read against rows of x (stride ldx),
// 0 where the FMA forms run: the knob's bit (1 gate+up, 2 down) off, not NVFP4 (nor FP8 where
// TDM_MOE_MMA_FP8), K not a multiple of 128 (whole chunk quads), or x's rows not 16-byte aligned
// (the same answer for every row of a buffer, so for every M). A warp keeps >=
// TDM_MOE_MMA_{GU,DOWN}_MIN_STEPS steps where it can.
static int mma_ks(const struct tdm_moe_mat *m, const void *x, int64_t ldx, int bit)
{
    const int nvfp4 = m->fmt == TDM_W_NVFP4, fp8 = m->fmt == TDM_W_FP8;
    if (!(TDM_MOE_MMA & bit) || !(nvfp4 || (fp8 && TDM_MOE_MMA_FP8)) || m->k % 128 || !bf16_rows_vec(x, ldx))
        return 0;
    const int steps = m->k / (nvfp4 ? ChunkK<TDM_W_NVFP4>::K : ChunkK<TDM_W_FP8>::K) / 4;
    const int unit = fp8 ? MMA_BS : 1;   // FP8: a warp's slice is whole 128-k scale blocks (MMA_BS steps)
    const int min_steps = bit == 1 ? TDM_MOE_MMA_GU_MIN_STEPS : TDM_MOE_MMA_DOWN_MIN_STEPS;
    for (int ks = MMA_KS_MAX; ks > 1; ks >>= 1)
        if (steps % (ks * unit) == 0 && steps / ks >= min_steps) return ks;
    return 1;
}

// experts_mma_kernel<F, GU> for M rows of k pairs; down launched programmatically (TDM_MOE_DOWN_PDL).
template <int F, bool GU>
static cudaError_t launch_mma_f(const tdm_moe_mat &m0, const tdm_moe_mat &m1, int E, int ks, const uint16_t *x, int64_t ldx,
                                int M, int k, const int32_t *order, uint16_t *out, cudaStream_t st)
{
    const int nch = m0.k / ChunkK<F>::K;
    const dim3 grid((m0.n + mma_outs(GU) - 1) / mma_outs(GU), M * k), block(32 * ks);
    const size_t smem = (size_t)nch * (F == TDM_W_FP8 ? 2 : 4) * sizeof(uint4);
    return tdm_pdl::launch_if(GU ? TDM_MOE_GU_PDL : TDM_MOE_DOWN_PDL, experts_mma_kernel<F, GU>, grid, block, smem, st, m0,
                              m1, E, x, ldx, k, order, out, nch, ks);
}

template <bool GU>
static cudaError_t launch_mma(const tdm_moe_mat &m0, const tdm_moe_mat &m1, int E, int ks, const uint16_t *x, int64_t ldx,
                              int M, int k, const int32_t *order, uint16_t *out, cudaStream_t st)
{
    return m0.fmt == TDM_W_FP8 ? launch_mma_f<TDM_W_FP8, GU>(m0, m1, E, ks, x, ldx, M, k, order, out, st)
                               : launch_mma_f<TDM_W_NVFP4, GU>(m0, m1, E, ks, x, ldx, M, k, order, out, st);
}

extern "C" int tdm_moe_gate_up(const struct tdm_moe_experts *ex, const uint16_t *x, int64_t ldx, int M, int k,
                               const int32_t *order, uint16_t *act, void *stream)
{
    if (check_pairs(ex, M, k, "tdm_moe_gate_up") != 0) return -1;
    if (!x || !order || !act || ldx < ex->H) return tdm_errf("tdm_moe_gate_up: bad arguments (ldx %lld)", (long long)ldx);
    const struct tdm_moe_mat *g = &ex->m[TDM_MOE_GATE], *u = &ex->m[TDM_MOE_UP];
    if (g->fmt != u->fmt || (g->fmt == TDM_W_FP8 && g->scale_dt != u->scale_dt))
        return tdm_errf("tdm_moe_gate_up: gate and up stored in different formats");
    if (M == 0) return 0;
    cudaStream_t st = (cudaStream_t)stream;
    if (const int ks = mma_ks(g, x, ldx, 1)) {
        TDM_CUDA_TRY(launch_mma<true>(*g, *u, ex->E, ks, x, ldx, M, k, order, act, st));
        return 0;
    }
    const ChunkPlan cp = chunk_plan(g, false, GU_THREADS);
    dim3 grid((ex->I + cp.rows - 1) / cp.rows, M * k);
    const size_t smem = (size_t)xs_floats(ex->H) * 4;
    TDM_CUDA_TRY(g->fmt == TDM_W_NVFP4 ? launch_gate_up<TDM_W_NVFP4>(ex, cp, grid, smem, x, ldx, k, order, act, st)
                 : g->fmt == TDM_W_FP8 ? launch_gate_up<TDM_W_FP8>(ex, cp, grid, smem, x, ldx, k, order, act, st)
                                       : launch_gate_up<TDM_W_BF16>(ex, cp, grid, smem, x, ldx, k, order, act, st));
    return 0;
}

extern "C" int tdm_moe_down(const struct tdm_moe_experts *ex, const uint16_t *act, int M, int k, const int32_t *order,
                            uint16_t *y, void *stream)
{
    if (check_pairs(ex, M, k, "tdm_moe_down") != 0) return -1;
    if (!act || !order || !y) return tdm_errf("tdm_moe_down: NULL argument");
    if (M == 0) return 0;
    const struct tdm_moe_mat *d = &ex->m[TDM_MOE_DOWN];
    cudaStream_t st = (cudaStream_t)stream;
    if (const int ks = mma_ks(d, act, ex->I, 2)) {
        TDM_CUDA_TRY(launch_mma<false>(*d, *d, ex->E, ks, act, ex->I, M, k, order, y, st));
        return 0;
    }
    const ChunkPlan cp = chunk_plan(d, M > 1, FAST_THREADS);
    dim3 grid((ex->H + cp.rows - 1) / cp.rows, M * k);
    const size_t smem = (size_t)xs_floats(ex->I) * 4;
    TDM_CUDA_TRY(d->fmt == TDM_W_NVFP4 ? launch_down<TDM_W_NVFP4>(ex, cp, grid, smem, act, order, y, st)
                 : d->fmt == TDM_W_FP8 ? launch_down<TDM_W_FP8>(ex, cp, grid, smem, act, order, y, st)
                                       : launch_down<TDM_W_BF16>(ex, cp, grid, smem, act, order, y, st));
    return 0;
}

extern "C" int tdm_moe_shared_gate(const struct tdm_dweight *shared_gate, const uint16_t *x, int64_t ldx, int M, int H,
                                   float *gate, void *stream)
{
    const struct tdm_dweight *g = shared_gate;
    if (M < 0 || H < 1 || H > TDM_MOE_MAX_K || ldx < H || !x || !gate || !g || !g->w)
        return tdm_errf("tdm_moe_shared_gate: bad arguments M %d, H %d (at most %d), ldx %lld", M, H, TDM_MOE_MAX_K,
                        (long long)ldx);
    if (g->k != H || g->n != 1 || (g->fmt != TDM_W_BF16 && g->fmt != TDM_W_FP8 && g->fmt != TDM_W_NVFP4) ||
        (g->fmt != TDM_W_BF16 && !g->scale))
        return tdm_errf("tdm_moe_shared_gate: the shared gate must be a [1, %d] BF16, FP8 or NVFP4 weight (got [%lld, %lld] %s)",
                        H, (long long)g->n, (long long)g->k, tdm_wfmt_name(g->fmt));
    if (M == 0) return 0;
    const RowRef sg = row_ref(g->fmt, g->scale_dt == TDM_DT_BF16, g->w, g->scale, g->scale2, g->k, g->row0);
    shared_gate_kernel<<<M, MOE_THREADS, (size_t)H * 4, (cudaStream_t)stream>>>(sg, x, ldx, H, gate);
    TDM_LAUNCH_CHECK();
    return 0;
}

extern "C" int tdm_moe_combine(const uint16_t *y, const uint16_t *w, const int32_t *sel, int M, int k, int H,
                               const float *gate, const uint16_t *sh, int64_t ldsh, uint16_t *out, int64_t ldout,
                               void *stream)
{
    if (M < 0 || k < 1 || k > MAX_TOPK || H < 1 || ldsh < H || ldout < H || !y || !w || !sel || !gate || !sh || !out)
        return tdm_errf("tdm_moe_combine: bad arguments M %d, k %d (at most %d), H %d", M, k, MAX_TOPK, H);
    if (M == 0) return 0;
    const dim3 grid(M, (H + COMBINE_COLS - 1) / COMBINE_COLS);
    combine_kernel<<<grid, MOE_THREADS, 0, (cudaStream_t)stream>>>(y, w, sel, k, H, gate, sh, ldsh, out, ldout);
    TDM_LAUNCH_CHECK();
    return 0;
}

extern "C" int64_t tdm_moe_gate_up_bytes(const struct tdm_moe_experts *ex, int M, int k)
{
    const int64_t P = (int64_t)M * k;
    const struct tdm_moe_mat *g = &ex->m[TDM_MOE_GATE], *u = &ex->m[TDM_MOE_UP];
    return P * (g->w_stride + g->scale_stride + u->w_stride + u->scale_stride) + (int64_t)M * ex->H * 2 + P * ex->I * 2;
}

extern "C" int64_t tdm_moe_down_bytes(const struct tdm_moe_experts *ex, int M, int k)
{
    const int64_t P = (int64_t)M * k;
    const struct tdm_moe_mat *d = &ex->m[TDM_MOE_DOWN];
    return P * (d->w_stride + d->scale_stride) + P * ex->I * 2 + P * ex->H * 2;
}

// ---- the grouped form ---------------------------------------------------------------------------

// Where tdm_moe_group keeps things in its buffer g (NULL: the offsets alone).
static GroupView group_view(void *g, int M, int k, int E)
{
    GroupView v;
    const int64_t P = (int64_t)M * k, nb = E + 1, used = nb < P ? nb : P;
    v.S = P + (TDM_MOE_GROUP_PAD - 1) * used;
    v.NT = (P + TDM_MOE_TILE_ROWS - 1) / TDM_MOE_TILE_ROWS + used;   // ceil(n / 128) per bucket of n pairs
    v.NB = (M + GROUP_RB - 1) / GROUP_RB;
    uintptr_t at = (uintptr_t)g;
    v.ntiles = (int32_t *)at;
    at += 256;
    v.slots = (int32_t *)at;
    at += round_up(v.S * 4, 256);
    v.tiles = (int4 *)at;
    at += round_up(v.NT * 16, 256);
    v.cnt = (int32_t *)at;
    at += round_up((int64_t)v.NB * nb * 4, 256);
    v.base = (int32_t *)at;
    at += round_up(nb * 4, 256);
    v.bytes = (int64_t)(at - (uintptr_t)g);
    return v;
}


extern "C" size_t tdm_moe_group_bytes(int M, int k, int E)
{
    return M < 1 || k < 1 || E < 1 ? 0 : (size_t)group_view(nullptr, M, k, E).bytes;
}

static int check_group(int M, int k, int E, const void *group, const char *who)
{
    if (M < 0 || k < 1 || k > MAX_TOPK || E < 1 || E > TDM_ROUTE_MAX_E || (int64_t)M * k > INT32_MAX / 2 || !group)
        return tdm_errf("%s: bad arguments M %d, k %d (at most %d), E %d (at most %d)", who, M, k, MAX_TOPK, E,
                        TDM_ROUTE_MAX_E);
    return 0;
}

extern "C" int tdm_moe_group(const int32_t *sel, int M, int k, int E, void *group, void *stream)
{
    if (check_group(M, k, E, group, "tdm_moe_group") != 0) return -1;
    if (!sel) return tdm_errf("tdm_moe_group: NULL sel");
    if (M == 0) return 0;
    const GroupView v = group_view(group, M, k, E);
    const size_t smem = (size_t)GROUP_RB * k * 4;
    cudaStream_t st = (cudaStream_t)stream;
    group_count_kernel<<<v.NB, MOE_THREADS, smem, st>>>(sel, M, k, E, v);
    TDM_LAUNCH_CHECK();
    group_plan_kernel<<<1, PLAN_THREADS, 0, st>>>(E, v);
    TDM_LAUNCH_CHECK();
    group_scatter_kernel<<<v.NB, MOE_THREADS, smem, st>>>(sel, M, k, E, v);
    TDM_LAUNCH_CHECK();
    return 0;
}

template <bool GU>
static void launch_grouped(const struct tdm_moe_experts *ex, const tdm_moe_mat &m0, const tdm_moe_mat &m1,
                           const uint16_t *a, int64_t lda, int div, const GroupView &v, uint16_t *out, cudaStream_t st)
{
    const dim3 grid((unsigned)v.NT, (unsigned)((m0.n + (GU ? GU_OUTS : GBN) - 1) / (GU ? GU_OUTS : GBN)));
    const bool vec = chunk_plan(&m0, false, FAST_THREADS).vec, x_vec = bf16_rows_vec(a, lda);
    const int T = tdm_wide::THREADS;
    if (m0.fmt == TDM_W_NVFP4)
        grouped_kernel<TDM_W_NVFP4, GU><<<grid, T, 0, st>>>(m0, m1, ex->E, a, lda, div, v, out, vec, x_vec);
    else if (m0.fmt == TDM_W_FP8)
        grouped_kernel<TDM_W_FP8, GU><<<grid, T, 0, st>>>(m0, m1, ex->E, a, lda, div, v, out, vec, x_vec);
    else
        grouped_kernel<TDM_W_BF16, GU><<<grid, T, 0, st>>>(m0, m1, ex->E, a, lda, div, v, out, vec, x_vec);
}

extern "C" int tdm_moe_gate_up_grouped(const struct tdm_moe_experts *ex, const uint16_t *x, int64_t ldx, int M, int k,
                                       const void *group, uint16_t *act, void *stream)
{
    if (!ex || !ex->owned || check_group(M, k, ex->E, group, "tdm_moe_gate_up_grouped") != 0 || !x || !act ||
        ldx < ex->H)
        return tdm_errf("tdm_moe_gate_up_grouped: bad arguments (experts %s, ldx %lld)",
                        ex && ex->owned ? "uploaded" : "missing", (long long)ldx);
    const struct tdm_moe_mat *g = &ex->m[TDM_MOE_GATE], *u = &ex->m[TDM_MOE_UP];
    if (g->fmt != u->fmt || (g->fmt == TDM_W_FP8 && g->scale_dt != u->scale_dt))
        return tdm_errf("tdm_moe_gate_up_grouped: gate and up stored in different formats");
    if (M == 0) return 0;
    launch_grouped<true>(ex, *g, *u, x, ldx, k, group_view((void *)group, M, k, ex->E), act, (cudaStream_t)stream);
    TDM_LAUNCH_CHECK();
    return 0;
}

extern "C" int tdm_moe_down_grouped(const struct tdm_moe_experts *ex, const uint16_t *act, int M, int k,
                                    const void *group, uint16_t *y, void *stream)
{
    if (!ex || !ex->owned || check_group(M, k, ex->E, group, "tdm_moe_down_grouped") != 0 || !act || !y)
        return tdm_errf("tdm_moe_down_grouped: bad arguments (experts %s)", ex && ex->owned ? "uploaded" : "missing");
    if (M == 0) return 0;
    const struct tdm_moe_mat *d = &ex->m[TDM_MOE_DOWN];
    launch_grouped<false>(ex, *d, *d, act, ex->I, 1, group_view((void *)group, M, k, ex->E), y, (cudaStream_t)stream);
    TDM_LAUNCH_CHECK();
    return 0;
}
