// mm_skinny.cuh — the skinny matrix kernel, y = x W^T for 1..32 activation rows, one template for
// the three weight formats (instantiated by nvfp4_skinny.cu, fp8_skinny.cu, bf16_skinny.cu).
//
// Design (mm_layout.h has the fragment mapping; bench/NOTES.md the numbers):
// - Weights are the mma B operand, activations the A operand (mma.m16n8k16, BF16 x BF16 -> FP32).
//   A warp owns NT n8-tiles (8*NT weight rows) and one chain of K. In a slab of 128 k each lane
//   loads its 32-k chunk of its weight row with 16-byte loads and decodes it in registers straight
//   into B operand registers: no trip through shared memory. 1-16 rows cost one mma per weight
//   tile and step, 17-32 rows two, over the same decoded B registers. At most 8 rows (and at 9-32
//   from the blocked copy) the per-lane NVFP4 form feeds a pair of tiles' decoded registers as one
//   A operand instead, with the activation row as B (SWAP: one mma a pair and step; the same
//   products and sums).
// - Activations (fast path: full slabs, aligned data): NVFP4 at 1-16 rows has each lane load the
//   16-byte units of its own A registers straight from global memory (L1-cached) and permute them
//   in registers (TDM_MM_DIRECT), or, where the kernel that wrote x also wrote its blocked copy
//   (mm_layout.h: xb), loads them from there side by side and already permuted (XB; from the copy
//   also at 17-32 rows). Otherwise the CTA stages them CH slabs at a time into shared memory with
//   cp.async (double-buffered), then permutes each chunk once into the mma A quads of every
//   (step, 16-row tile, lane), so the K loop reads one 16-byte quad per mma. The
//   weights stream PF slabs ahead in a register ring. The partial last slab and unaligned data take
//   the checked path (per-lane global loads with checks): the same operands, so the same bits. (v1
//   staged with a barrier per slab; v2 read per lane from global memory at 164 registers; v3-v6
//   staged at every row count; bench/NOTES.md has the measurements.)
// - K is cut into kchains chains (a function of (N, K) only): warp group wk of cluster rank r runs
//   chain r*wk_count + wk. Chains are summed as a balanced binary tree (in shared memory inside a
//   CTA, over distributed shared memory across the cluster), then scaled and stored by rank 0.
// Row invariance by construction: a row's A values, the B registers, the mma sequence and the
// tree are the same whatever m is; rows 16-31 run the same instructions on their own accumulators;
// at most 8 rows run an instantiation whose rows 8-15 repeat rows 0-7 or are zeros (an mma output
// row depends only on its own A row, and t/gpu/matmul.t's twins compare every m against one-row
// calls); no atomics.
#pragma once
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cooperative_groups.h>
#include <stdint.h>
#include <type_traits>
#include "layers_dev.cuh"
#include "mm_layout.h"
#include "pdl.cuh"

namespace tdm_mm {

struct SkinnyArgs {
    const uint8_t *w;        // the stored matrix, row 0
    const uint8_t *scale;    // its scales (FP8 blocks / NVFP4 groups)
    int scale_bf16;          // FP8 block scales stored as BF16 (else F32)
    float out_scale;         // applied to the FP32 sum: NVFP4 scale_2 * 2^7, else 1
    int n, k;                // the view: n outputs (columns of y), k inputs
    int64_t row0;            // first stored row of the view
    const uint16_t *x;       // BF16 activations [m][ldx]
    int64_t ldx;
    const uint16_t *xb;      // NULL, or x's blocked copy (mm_layout.h: xb; m <= 32), read by the XB form
    int m;                   // rows, 1..32
    void *y;                 // BF16 or F32 output [m][ldy]
    int64_t ldy;
    int y_f32;
    int slabs;               // ceil(k / 128)
    int chain_len;           // slabs per chain, ceil(slabs / kchains)
    int wk;                  // chains per CTA
    int x_vec;               // x rows start 16-byte aligned
    // SwiGLU (nt 2 only; FP8's per lane from the copy at 1-16 rows; tdm_matmul_swiglu): w and scale
    // above are the gate's, these the up projection's, of the same view shape; each warp takes 8
    // outputs, its tile 0 from the gate and tile 1 from the up weight, and y[r][o] =
    // bf16(bf16(silu(bf16(gate))) * bf16(up)). NULL: a plain product.
    const uint8_t *w_up, *scale_up;
    int64_t row0_up;
    float out_scale_up;
    uint16_t *yb;            // SwiGLU or gated: NULL, or where y's blocked copy goes as well (m <= 32)
    // The gated up product (a plain product, BF16 out; tdm_matmul_gated): the gate's BF16 output
    // [m][ld_gate], read after the wait, and y[r][o] = bf16(bf16(silu(gate[r][o])) * bf16(sum)), the
    // SwiGLU's and tdm_silu_mul's roundings. gate may be y itself (each element is read, then written,
    // by one thread). NULL: a plain product.
    const uint16_t *gate_y;
    int64_t ld_gate;
    // The weights' order in memory (mm_layout.h: TDM_MM_ORDER_ROWS, or TDM_MM_ORDER_TILES for the
    // formats the build holds so, TDM_MM_TILES_FMT), their codes and NVFP4's group scales alike: the
    // weight's own (tdm_dweight.order). The fast path reads those formats tile-major alone (its
    // addressing and run_skinny's choice of path, matmul.cu: fast_path_reads, both follow
    // TDM_MM_TILES_FMT); the checked path reads either order.
    int order;
};

// ---- small device pieces ------------------------------------------------------------------------

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b)
{
    uint32_t d;
    asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// TDM_MM_GATE_LOADS: the gated up product's epilogue reads this many of a thread's gate values before
// it stores any (default 4); 1 reads each just before its store. A build-time knob for A/B runs.
#ifndef TDM_MM_GATE_LOADS
#define TDM_MM_GATE_LOADS 4
#endif
static_assert(TDM_MM_GATE_LOADS >= 1, "at least one gate value a round");

// Weights are read once per product: stream them past L1 and let L2 evict them first.
// TDM_MM_L2PF (bytes: 0 = none, 64, 128 or 256; default 128): the L2 prefetch size of those loads. A
// weight row is contiguous and its four lanes read 64 bytes of it per slab, so an L2::128B load
// also brings the next slab of the row into L2. Measured on the H200 (bench/NOTES.md, v5): 128
// takes a 27B token from 10.34 to 9.98 ms at one row and 25.9 to 24.2 ms at 32; 256 less; an
// explicit prefetch.global.L2 some slabs past the register ring made it slower.
#ifndef TDM_MM_L2PF
#define TDM_MM_L2PF 128
#endif
#define TDM_MM_STR2(x) #x
#define TDM_MM_STR(x) TDM_MM_STR2(x)
// 16 bytes of weights past L1, asking L2 for the L2B bytes around them (0: none; 64, 128 or 256).
#define TDM_MM_LDG_CS_L2(B, v, p)                                                                 \
    asm("ld.global.cs.L2::" #B "B.v4.u32 {%0, %1, %2, %3}, [%4];"                                 \
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p))
template <int L2B = TDM_MM_L2PF>
__device__ __forceinline__ uint4 ldg_stream(const uint8_t *p)
{
    static_assert(L2B == 0 || L2B == 64 || L2B == 128 || L2B == 256, "an L2 prefetch of 0, 64, 128 or 256 bytes");
    uint4 v;
    if constexpr (L2B == 64) TDM_MM_LDG_CS_L2(64, v, p);
    else if constexpr (L2B == 128) TDM_MM_LDG_CS_L2(128, v, p);
    else if constexpr (L2B == 256) TDM_MM_LDG_CS_L2(256, v, p);
    else v = __ldcs(reinterpret_cast<const uint4 *>(p));
    return v;
}
// TDM_MM_L2PF_FP8 (0, 64, 128 or 256; default 256): the same for the FP8 weights' loads in the skinny
// kernel, whose lanes read a row's whole 128 bytes of a slab (NVFP4: 64), so that only 256 reaches
// into the next slab. Measured on the H200 (bench/NOTES.md, FP8 per lane from the blocked copy): a
// 27B token's FP8 products at 1 / 8 / 16 / 32 rows 10.8 / 11.1 / 13.6 / 19.7 ms at 128, 10.1 / 10.1 /
// 13.0 / 19.1 at 256. A build-time knob for A/B runs.
#ifndef TDM_MM_L2PF_FP8
#define TDM_MM_L2PF_FP8 256
#endif
// TDM_MM_TILE_PF (slabs; default 0, none): in the fast path over tile-major weights (mm_layout.h), each
// weight load of slab i also asks L2 for slab i + TDM_MM_TILE_PF of the same tile (prefetch.global.L2,
// one lane a 128-byte line, and one lane for NVFP4's 128 bytes of group scales of the tile's slab). Held in
// rows, a lane's L2::128B load brought its row's next slab into L2 (TDM_MM_L2PF above); tile-major, a
// tile's slab is one 1 KB (NVFP4) or 2 KB (FP8) run that the warp reads whole, so the hint reaches no
// further than the slab itself and every slab is a DRAM miss met one ring depth before its use. A
// build-time knob for A/B runs: the loads and the sums are unchanged, so are the bits.
#ifndef TDM_MM_TILE_PF
#define TDM_MM_TILE_PF 0
#endif
static_assert(TDM_MM_TILE_PF >= 0 && TDM_MM_TILE_PF <= 16, "a prefetch distance of 0..16 slabs");
__device__ __forceinline__ void prefetch_line_l2(const void *p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }
// 16 bytes of a weight row of format FMT (ldg_stream at the format's L2 prefetch)
template <int FMT>
__device__ __forceinline__ uint4 ldg_weights(const uint8_t *p)
{
    return ldg_stream<FMT == TDM_MMF_FP8 ? TDM_MM_L2PF_FP8 : TDM_MM_L2PF>(p);
}
__device__ __forceinline__ uint32_t ldg_stream_u16(const uint8_t *p)
{
#if TDM_MM_L2PF
    unsigned short v;
    asm("ld.global.cs.L2::" TDM_MM_STR(TDM_MM_L2PF) "B.u16 %0, [%1];" : "=h"(v) : "l"(p));
    return v;
#else
    return __ldcs(reinterpret_cast<const unsigned short *>(p));
#endif
}

// 16 bytes global -> shared without a trip through registers (completes at cp_async_wait).
__device__ __forceinline__ void cp_async16(void *dst, const void *src)
{
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
}
// 16 zero bytes into shared memory through the same queue (src-size 0: nothing is read).
__device__ __forceinline__ void cp_async16_zero(void *dst, const void *src)
{
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, 0;" ::"r"(d), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

// The mbarriers and bulk copies of XS (mm_layout.h: TDM_MM_XS), shared-memory addresses as 32 bits.
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
// Waits until the phase of parity `parity` of the barrier has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity)
{
    // (the retry loop inside the asm; its label is local to the block, so every inlined copy has its own)
    asm volatile("{\n .reg .pred p;\n XS_WAIT:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 " @!p bra XS_WAIT;\n}" ::"r"(bar), "r"(parity) : "memory");
}
// Arrives on bar, which is to expect bytes more from copies.
__device__ __forceinline__ void mbar_arrive_expect(uint32_t bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
// bytes (a multiple of 16, both addresses 16-byte aligned) global -> shared, counted on bar.
__device__ __forceinline__ void bulk_copy_g2s(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}

// Bytes [0, valid) of a chunk, zero past it, with byte loads (tails and unaligned rows).
template <int NW>
__device__ __forceinline__ void load_bytes(uint32_t (&w)[NW], const uint8_t *p, int valid)
{
#pragma unroll
    for (int i = 0; i < NW; i++) {
        uint32_t v = 0;
        for (int b = 0; b < 4; b++)
            if (4 * i + b < valid) v |= (uint32_t)p[4 * i + b] << (8 * b);
        w[i] = v;
    }
}

// ---- one lane's chunk of one weight row in one slab -----------------------------------------------

template <int FMT> struct Chunk;
template <> struct Chunk<TDM_MMF_NVFP4> { uint32_t w[4]; uint32_t sc; };   // sc: the two e4m3 group scales
template <> struct Chunk<TDM_MMF_FP8> { uint32_t w[8]; float sc[2]; };    // sc: block scales of C columns 2t, 2t+1
template <> struct Chunk<TDM_MMF_BF16> { uint32_t w[16]; };

template <int FMT> struct FmtInfo;
template <> struct FmtInfo<TDM_MMF_NVFP4> { static constexpr int NUM = 1, DEN = 2; };  // bytes per k
template <> struct FmtInfo<TDM_MMF_FP8> { static constexpr int NUM = 1, DEN = 1; };
template <> struct FmtInfo<TDM_MMF_BF16> { static constexpr int NUM = 2, DEN = 1; };

// Loads lane chunk t of slab `slab` of view row `vrow` (clamped into the view by the caller) of the
// stored matrix wm with its scales sm and first view row row0 (the gate's or, SwiGLU, the up
// weight's). cols: the view rows of this lane's C columns (FP8 block scales follow the output
// columns).
template <int FMT, bool VEC>
__device__ __forceinline__ void load_chunk(Chunk<FMT> &c, const SkinnyArgs &a, const uint8_t *wm, const uint8_t *sm,
                                           int64_t row0, int vrow, int col0, int col1, int slab, int t)
{
    constexpr int CB = FmtInfo<FMT>::NUM * TDM_MM_CHUNK_K / FmtInfo<FMT>::DEN;   // chunk bytes
    constexpr int NW = CB / 4;
    const int64_t rowbytes = (int64_t)a.k * FmtInfo<FMT>::NUM / FmtInfo<FMT>::DEN;
    const int64_t off = (int64_t)slab * 4 * CB + t * CB;
    // weights held tile-major (a.order; mm_layout.h) reach the checked path only in the checked
    // instantiation (their k is whole slabs: the vector one runs them on the fast path alone), so the
    // vector instantiation keeps the row-only code (the order's branch there cost registers); in a
    // format the build holds in rows alone, tiled is a constant false
    const bool tiled = !VEC && TDM_MM_TILES_FMT(FMT) && a.order == TDM_MM_ORDER_TILES;
    const uint8_t *p = wm + (tiled ? tdm_mm_chunk_at(TDM_MM_ORDER_TILES, rowbytes, CB, row0 + vrow, slab, t)
                                   : (row0 + vrow) * rowbytes + off);
    const bool full = off + CB <= rowbytes;
    if (VEC && full) {
#pragma unroll
        for (int i = 0; i < NW / 4; i++) {
            uint4 v = ldg_weights<FMT>(p + 16 * i);
            c.w[4 * i] = v.x; c.w[4 * i + 1] = v.y; c.w[4 * i + 2] = v.z; c.w[4 * i + 3] = v.w;
        }
    } else {
        int64_t valid = rowbytes - off;
        load_bytes<NW>(c.w, p, valid < 0 ? 0 : valid > CB ? CB : (int)valid);
    }
    if constexpr (FMT == TDM_MMF_NVFP4) {
        const int64_t srow = a.k / 16, soff = (int64_t)slab * 8 + 2 * t;   // two groups of 16 k
        const uint8_t *s = sm + (tiled ? tdm_mm_scales_at(TDM_MM_ORDER_TILES, a.k, row0 + vrow, slab, t) : (row0 + vrow) * srow + soff);
        if (VEC && soff + 2 <= srow) {
            c.sc = ldg_stream_u16(s);
        } else {
            uint32_t v = 0;
            if (soff < srow) v |= s[0];
            if (soff + 1 < srow) v |= (uint32_t)s[1] << 8;
            c.sc = v;
        }
    } else if constexpr (FMT == TDM_MMF_FP8) {
        const int64_t kb = a.slabs;   // scale blocks along k
        const int64_t i0 = ((row0 + col0) >> 7) * kb + slab, i1 = ((row0 + col1) >> 7) * kb + slab;
        if (a.scale_bf16) {
            const uint16_t *s = reinterpret_cast<const uint16_t *>(sm);
            c.sc[0] = __uint_as_float((uint32_t)s[i0] << 16);
            c.sc[1] = __uint_as_float((uint32_t)s[i1] << 16);
        } else {
            const float *s = reinterpret_cast<const float *>(sm);
            c.sc[0] = s[i0];
            c.sc[1] = s[i1];
        }
    }
}

// TDM_NVFP4_CVT: whether this device code has cvt.rn.f16x2.e2m1x2 (sm_100, sm_120, sm_121a), which
// converts the codes in one instruction with the scales in F16; else (sm_90) the codes are placed
// as bits and the scales are BF16 (nvfp4_scales, nvfp4_bregs).
#if defined(__CUDA_ARCH_FEAT_SM121_ALL) || defined(__CUDA_ARCH_FEAT_SM120_ALL) || defined(__CUDA_ARCH_FEAT_SM100_ALL)
#define TDM_NVFP4_CVT 1
#else
#define TDM_NVFP4_CVT 0
#endif

// NVFP4 group scales of a chunk -> the operand multipliers of its two groups (words 0-1, 2-3).
// sm_90: BF16x2 of scale * 2^119 (multiplies the placed e2m1 = e2m1 * 2^-126). sm_121a: F16x2 of
// the scale itself (multiplies the e2m1 from cvt.rn.f16x2.e2m1x2).
__device__ __forceinline__ void nvfp4_scales(uint32_t sc, uint32_t &sa, uint32_t &sb)
{
    __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)sc, __NV_E4M3);
#if TDM_NVFP4_CVT
    sa = (uint32_t)hr.x | ((uint32_t)hr.x << 16);
    sb = (uint32_t)hr.y | ((uint32_t)hr.y << 16);
#else
    __half2 h = *reinterpret_cast<__half2 *>(&hr);
    float2 f = __half22float2(h);
    const float x = f.x * 0x1p119f, y = f.y * 0x1p119f;
    // each scale packed into both halves by its own pack (one instruction; a pack of the two and two
    // PRMTs were three)
    __nv_bfloat162 ba = __floats2bfloat162_rn(x, x), bb = __floats2bfloat162_rn(y, y);
    sa = *reinterpret_cast<uint32_t *>(&ba);
    sb = *reinterpret_cast<uint32_t *>(&bb);
#endif
}

// TDM_NVFP4_PACKED (1, the default, or 0): on sm_90 the device copy of an NVFP4 weight holds each
// 32-bit word of codes in mm_layout.h's packed order (tdm_nvfp4_pack, applied at upload: matmul.h,
// tdm_nvfp4_packed), which nvfp4_bregs places in 9 integer operations a word instead of 13; the same
// operands, so the same bits. The targets with an e2m1 conversion instruction (sm_100, sm_120,
// sm_121a) read the checkpoint's order. TDM_NVFP4_DEV_PACKED: whether this device code reads the
// packed order (device code only: the host asks a kernel, tdm_nvfp4_packed). Measured on the H200
// (bench/NOTES.md, the NVFP4 codes in a packed word order; with the blocked copy's loads at immediate
// offsets): a 27B token's products 5.78 -> 5.16 ms at one row, 7.81 -> 7.06 at 16; the 64-layer decode
// 7.48 -> 7.18-7.21 ms a token. A build-time knob for A/B runs.
#ifndef TDM_NVFP4_PACKED
#define TDM_NVFP4_PACKED 1
#endif
#define TDM_NVFP4_DEV_PACKED (TDM_NVFP4_PACKED && !TDM_NVFP4_CVT)
// NVFP4 B registers: pair j (nibbles j, j+4 of the checkpoint's word) of word q into b[j], times the
// group multiplier s; q in the packed order where TDM_NVFP4_DEV_PACKED.
__device__ __forceinline__ void nvfp4_bregs(uint32_t q, uint32_t s, uint32_t (&b)[4])
{
#if TDM_NVFP4_CVT
#pragma unroll
    for (int j = 0; j < 4; j++) {
        // One byte holding nibbles j (low) and j+4 (high) -> F16x2 of the e2m1 values -> times the
        // scale in F16 (exact: at most 6 significant bits, at most 2688) -> BF16 with the same 2^-7 as
        // sm_90, so both targets feed the tensor cores the same operands.
        uint32_t byte = ((q >> (4 * j)) & 0xfu) | ((q >> (4 * j + 12)) & 0xf0u), h;
        asm("{\n .reg .b8 b0, b1, b2, b3;\n mov.b32 {b0, b1, b2, b3}, %1;\n cvt.rn.f16x2.e2m1x2 %0, b0;\n}"
            : "=r"(h) : "r"(byte));
        __half2 w = __hmul2(*reinterpret_cast<__half2 *>(&h), *reinterpret_cast<__half2 *>(&s));
        float2 f = __half22float2(w);
        __nv_bfloat162 bb = __floats2bfloat162_rn(f.x * 0x1p-7f, f.y * 0x1p-7f);
        b[j] = *reinterpret_cast<uint32_t *>(&bb);
    }
#else
    uint32_t placed[4];
#if TDM_NVFP4_DEV_PACKED
    tdm_nvfp4_place_packed4(q, placed);
#else
#pragma unroll
    for (int j = 0; j < 4; j++) placed[j] = tdm_nvfp4_place(q, j);
#endif
#pragma unroll
    for (int j = 0; j < 4; j++) b[j] = bf16x2_mul(placed[j], s);
#endif
}

// The B registers of steps 2u (b[0], b[1]) and 2u+1 (b[2], b[3]) from a lane's chunk.
template <int FMT>
__device__ __forceinline__ void bregs(const Chunk<FMT> &c, int u, uint32_t sa, uint32_t sb, uint32_t (&b)[4])
{
    if constexpr (FMT == TDM_MMF_NVFP4) {
        nvfp4_bregs(c.w[u], u < 2 ? sa : sb, b);
    } else if constexpr (FMT == TDM_MMF_FP8) {
        // unit u's two words in NVFP4's k order (mm_layout.h: tdm_mm_bk, tdm_fp8_pair)
        const uint32_t p0 = tdm_fp8_pair(c.w[2 * u], c.w[2 * u + 1], 0), p1 = tdm_fp8_pair(c.w[2 * u], c.w[2 * u + 1], 1);
        b[0] = bf16x2_mul(tdm_fp8_place(p0, 0), TDM_FP8_UNPLACE);
        b[1] = bf16x2_mul(tdm_fp8_place(p0, 1), TDM_FP8_UNPLACE);
        b[2] = bf16x2_mul(tdm_fp8_place(p1, 0), TDM_FP8_UNPLACE);
        b[3] = bf16x2_mul(tdm_fp8_place(p1, 1), TDM_FP8_UNPLACE);
    } else {
#pragma unroll
        for (int j = 0; j < 4; j++) b[j] = c.w[4 * u + j];
    }
}

// ---- the kernel ---------------------------------------------------------------------------------

// TDM_MM_SWAP (1, the default, or 0): the per-lane NVFP4 form at most 8 rows puts the weights in
// the mma's A operand (see SWAP in the kernel). A build-time knob for A/B runs.
#ifndef TDM_MM_SWAP
#define TDM_MM_SWAP 1
#endif
// TDM_MM_SWAP16: the same at 9-16 rows, two mmas a pair of tiles and step (activation rows 0-7
// and 8-15 as two B operands): 0 never, 1 always, 2 (the default) where the activations come from
// the blocked copy (XB). A build-time knob for A/B runs. Measured on the H200 (bench/NOTES.md): the
// same bits (the twins pass); from x, a 27B token's products 1.4 % faster at 12 and 16 rows, and nt
// 2 at pf 1 spilled 4 bytes at its 96-register cap; from the blocked copy (as a probe), 9.66 ->
// 8.47 ms at 16 rows.
// TDM_MM_FLAT (1, the default, or 0): the per-lane form's K loop at most 8 rows and pf 1 in whole
// groups of the ring's depth, its loads unpredicated (see the loop). Measured on the H200
// (bench/NOTES.md, the K loop without predicates): a 27B token's products at 1 / 2 / 8 rows 6.17 /
// 6.17 / 6.31 -> 5.84 / 5.84 / 5.97 ms; the same loop at 9-16 rows (spilling 4-20 bytes at the
// 96-register caps) was slower again after the packed NVFP4 order (16 rows 6.49-6.51 -> 6.65-6.66).
// A build-time knob for A/B runs.
#ifndef TDM_MM_FLAT
#define TDM_MM_FLAT 1
#endif
#ifndef TDM_MM_SWAP16
#define TDM_MM_SWAP16 2
#endif

constexpr int MAX_THREADS = 256;
// At least two CTAs of MAX_THREADS resident per SM: the compiler keeps a thread at <= 128
// registers, so that a SM holds >= 16 warps and their loads in flight (v2 ran 164 registers and
// 8 warps a SM, latency-bound: ncu issued 0.34 instructions a cycle per scheduler).
constexpr int MIN_BLOCKS = 2;

// Registers a thread, by instantiation. A SM's four schedulers hold 16,384 registers each, in
// warps: at <= 96 registers a scheduler holds 5 warps, at 97-128 only 4, so a CTA of 6 warps fits
// 3 a SM at <= 96 and 2 above. The 27B's projections at 1-8 rows run 364 CTAs of 6 warps: at 98
// registers they took 1.38 waves over the 132 SMs and the token 11.8 ms, at 94 one wave and 9.2
// (bench/NOTES.md, the register cliff). Held to 96 where that costs no spill (ptxas -v, sm_90):
// NVFP4 nt 2 at pf 1 and 1-16 rows or pf 3 and at most 8 rows, FP8 nt 1 at pf 1 and 1-16 rows
// (84-102 unbounded); the 17-32-row per-lane forms to TDM_MM_XB32_REGS (96, with a few spilled
// bytes: see there); the rest to the MIN_BLOCKS bound.
// The per-lane activation forms (DA) spill at 96 on sm_121a (GB10, never run here; the cliff was
// measured on the H200 only), so there they get the MIN_BLOCKS bound; FP8's per-lane forms (from the
// blocked copy) on sm_90 TDM_MM_FP8_XB_REGS.
// TDM_MM_XB32_REGS: the register cap of the 17-32-row per-lane forms (NVFP4 from the blocked copy,
// MTA 2) on sm_90; 0 the MIN_BLOCKS bound (128). At 128 a scheduler holds 4 warps, and the 27B's
// large shapes at 17-32 rows ran 363 CTAs of 6 warps on 264 slots (1.37 waves; ncu on 17408x5120 at
// 32 rows: 2.6 warps a scheduler active, 0.31 instructions a cycle). At 96 (the default) 5 warps, 3
// such CTAs a SM, one wave; ptxas spilled 40 + 44 bytes in the plain form and 12 + 24 in the SwiGLU
// form when measured, 12 + 16 and 20 + 32 with nvcc 13.0 (t/kernel-resources.t names the exception).
// Measured on the H200 (bench/NOTES.md, the 17-32-row forms at 96 registers), with the wide table
// re-swept for it: a 27B token's products at 17 / 24 / 32 rows 13.7 / 14.1 / 14.6 -> 12.7 / 13.1 /
// 13.5 ms. A build-time knob for A/B runs.
#ifndef TDM_MM_XB32_REGS
#define TDM_MM_XB32_REGS 96
#endif
// TDM_MM_FP8_XB_REGS: the register cap of FP8's per-lane forms (from the blocked copy) on sm_90 (96, the
// default), or 0: the MIN_BLOCKS bound (they take 113-126 registers there, 4 warps a scheduler). At 96
// ptxas spills a few bytes in some (t/kernel-resources.t names the exception). Measured on the H200
// (bench/NOTES.md, FP8 per lane from the blocked copy): a 27B token's FP8 products at 1 / 8 / 16 / 32
// rows 9.83 / 10.20 / 12.99 / 18.5 ms at the bound, 9.68 / 9.62 / 12.36 / 16.8 at 96. A build-time knob
// for A/B runs.
#ifndef TDM_MM_FP8_XB_REGS
#define TDM_MM_FP8_XB_REGS 96
#endif
template <int FMT, int NT, int MTA, int PF, bool DA>
constexpr int skinny_regs()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ != 900
    if (DA) return 65536 / (MAX_THREADS * MIN_BLOCKS);
#endif
    if (TDM_MM_XB32_REGS && DA && MTA >= 2 && FMT == TDM_MMF_NVFP4) return TDM_MM_XB32_REGS;
    if (TDM_MM_FP8_XB_REGS && DA && FMT == TDM_MMF_FP8) return TDM_MM_FP8_XB_REGS;
    const bool nvfp4 = FMT == TDM_MMF_NVFP4 && NT == 2 && (PF == 1 ? MTA <= 1 : MTA == 0);
    const bool fp8 = FMT == TDM_MMF_FP8 && NT == 1 && PF == 1 && MTA <= 1 && !DA;
    return nvfp4 || fp8 ? 96 : 65536 / (MAX_THREADS * MIN_BLOCKS);
}

// MTA: 16-row activation tiles as served: 0 = at most 8 rows (rows 8-15 of the tile repeat
// rows 0-7: no loads, no permutes), 1 = 1-16 rows, 2 = 17-32 rows, 3 = 17-24 rows (mm_layout.h:
// TDM_MM_HI24_AT; the 17-32-row per-lane form from the blocked copy without rows 24-31's loads, and
// for NVFP4 without their mmas). Rows 0-7 run the same instructions in the 0 and 1 instantiations, rows 0-23 the same in
// the 2 and 3 ones, so a row's bits do not depend on which one ran.
// GLU: the SwiGLU form (a.w_up set, NT 2), an instantiation of its own so that a plain product's
// code carries none of its pointers (with them in every instantiation, 9-16 rows went from 96 to
// 104 registers; bench/NOTES.md, the 9-16-row slowdown).
// DA: the activations loaded per lane (TDM_MM_DIRECT, TANDEM_MM_DIRECT; see the kernel's start).
// XB (with DA): the fast slabs' activations from the blocked copy a.xb instead of x (see XB below).
template <int FMT, int NT, int MTA, int PF, bool VEC, bool GLU, bool DA, bool XB, bool XS_>
__global__ void __maxnreg__((skinny_regs<FMT, NT, MTA, PF, DA>())) skinny_kernel(const SkinnyArgs a)
{
    static_assert(!XB || DA, "the blocked copy is read by the per-lane form only");
    static_assert(!GLU || NT == 2, "the SwiGLU form takes a warp's two tiles from the two weights");
    constexpr bool HI24 = MTA == 3;   // 17-24 rows: the 17-32-row form (MTT 2) without rows 24-31
    constexpr int MTT = HI24 ? 2 : MTA;
    static_assert(!HI24 || (TDM_MM_HI24_AT(FMT) && XB && (!XS_ || TDM_MM_HI24_XS(FMT))),
                  "17-24 rows: per lane from the blocked copy (staged where TDM_MM_HI24_XS; mm_layout.h)");
    static_assert(!DA || (XB ? TDM_MM_DIRECT_XB(FMT, NT, MTT) : TDM_MM_DIRECT(FMT, NT, MTT)),
                  "per-lane activations are built for NVFP4 at 1-16 rows (nt 4: 1-8), and from the blocked copy at nt 2 "
                  "also at 17-32; for FP8 from the blocked copy at nt 1");
    constexpr int MT = MTA == 0 ? 1 : MTT;
    constexpr bool LO8 = MTA == 0;
    // SWAP (TDM_MM_SWAP; the per-lane NVFP4 form at most 8 rows, tiles in pairs): each mma takes the
    // decoded weights of two n8-tiles as its A operand (16 weight rows: A registers 0 and 2 are
    // tile np's B registers of the step, 1 and 3 tile np + 1's) and this lane's activation row g as
    // B (B registers 0 and 1 are the A registers 0 and 2 of row g: the unit as permuted). One mma a
    // step for two tiles instead of two, and no zero rows 8-15 to build. Each product and its
    // kappa are those of the plain form, so the sums are too (t/gpu/matmul.t's twins compare every m
    // against one-row calls, and 17-32 rows from x run the plain form). At 9-16 rows from the blocked copy
    // (TDM_MM_SWAP16) the same, with rows 8-15 a second mma into the pair's second accumulators; at
    // 17-32 (from the copy only) rows 16-23 and 24-31 two more, into the pair's accumulators of the
    // second 16-row tile.
    constexpr bool SWAP = TDM_MM_SWAP && DA && NT % 2 == 0 &&
                          (LO8 || (MTA == 1 && (TDM_MM_SWAP16 == 1 || (TDM_MM_SWAP16 == 2 && XB))) || MTT == 2);
    static_assert(!HI24 || SWAP || FMT == TDM_MMF_FP8,
                  "17-24 rows: NVFP4's SWAP form (mmas of a group of 8 activation rows each), FP8's with rows 24-31 zeros");
    // 8-row activation groups h of 16-row tile mt a warp computes: 1 at most 8 rows, none of rows 24-31 at 17-24
    auto groups = [](int mt) { return LO8 || (HI24 && mt == 1) ? 1 : 2; };
    // DA (NVFP4 at 1-16 rows where TANDEM_MM_DIRECT selects it): each lane loads its own A units
    // of the fast slabs from global memory (16 bytes of one activation row, through L1: the CTA's
    // warps read the same rows) and permutes them in registers, as the checked path does: no
    // shared-memory staging, no CTA barrier in the K loop. The same operands, so the same bits.
    // Measured on the H200 (bench/NOTES.md, direct A loads): a 27B token's NVFP4 projections in one
    // graph 9.08 / 10.37 / 12.33 / 15.50 ms at 1 / 4 / 8 / 16 rows staged, 8.95 / 9.38 / 10.26 / 14.03
    // direct (8.65 / 9.12 / 9.74 at 1 / 4 / 8 with pf 3); at 24-32 rows and in FP8 at 16 the staging
    // wins. Inside the engine it first lost at one row (3.34 against 3.22 ms on a 16-layer 27B):
    // at most 8 rows it forced pf 3 and copied rows 0-7 into rows 8-15. With the table's pf and
    // zeros there it wins at 1-16 rows (kernels/matmul.h, TDM_MM_DIRECT_AUTO_ROWS).
    // FP8 (nt 1) runs the per-lane form from the blocked copy only, at 1-32 rows: it reads the copy's
    // units in NVFP4's k order (mm_layout.h: tdm_mm_bk), the staged and checked forms the same order.
    // XB (DA with a.xb): the fast slabs' units come from x's blocked copy (mm_layout.h: xb), written
    // by the kernel that wrote x: the 8 rows of a load are 512 contiguous bytes instead of 16 lines
    // half used, and the units are permuted already. The same values, so the same bits.
    // XS (XS_; mm_layout.h: TDM_MM_XS, tdm_mm_xs_runs): x's slabs come into shared memory by bulk
    // copies, a ring of S = TDM_MM_XS_STAGES slabs a chain, each stage an mbarrier "full" (the copy's
    // bytes landed) and "empty" (every warp of the chain has read it). Lane 0 of the chain's first
    // warp copies slab i + S - 1 before it computes slab i (once the chain's warps are done with slab
    // i - 1, whose stage it takes); each warp waits for slab i's stage, reads its units from there (512
    // consecutive bytes a warp and unit: no bank conflicts), orders those reads before the copy
    // engine's next write there (fence.proxy.async: without it 15-33 rows of 17-32-row products came
    // out wrong on 17408x5120 in two runs of t/gpu/matmul.t, none in the run with it) and releases
    // the stage. A stage holds the slab's four units of XS_ROWS rows (the copy's layout with fewer
    // rows). Layout:
    // the barriers (tdm_mm_xs_bar_bytes), then the rings, chain w's stage s at (w * S + s) * XS_STAGE;
    // after the K loop the tree from the rings' start. Why: ncu on the NVFP4 form at 32 rows (H200,
    // bench/NOTES.md) had 64 % of the warps' samples wait on the units' global loads at their mmas.
    static_assert(!XS_ || (XB && TDM_MM_XS_AT(FMT, MTT)), "XS is built for the per-lane forms from the blocked copy (mm_layout.h)");
    constexpr bool XS = XS_;
    constexpr int XS_ROWS = TDM_MM_XS_ROWS(MTA), XS_STAGE = TDM_MM_XS_STAGE_BYTES(MTA);   // 17-24 rows: 24
    extern __shared__ __align__(128) uint8_t smem[];
    constexpr int ROWS = 16 * MT;
    constexpr int D = PF + 1;                       // weight ring depth
    constexpr int CB = FmtInfo<FMT>::NUM * TDM_MM_CHUNK_K / FmtInfo<FMT>::DEN;   // lane chunk bytes
    constexpr int SB = 4 * CB;                      // bytes of one weight row per slab
    const int tid = threadIdx.x, nthr = blockDim.x;
    const int lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int wn_count = (nthr >> 5) / a.wk;
    const int wn = warp % wn_count, wk = warp / wn_count;
    // SwiGLU (a.w_up, NT 2): a warp's two tiles are the gate's and the up weight's rows of the same
    // 8 outputs, so the CTA has half as many outputs as partial-sum columns.
    const int cols = 8 * NT * wn_count;             // partial-sum columns of the CTA
    const int outs = GLU ? cols / 2 : cols;         // its outputs
    const int col0 = blockIdx.x * outs;             // first view row (output column) of the CTA
    const int wcol = col0 + wn * (GLU ? 8 : 8 * NT);   // of this warp
    const int rank = blockIdx.y;                    // CTA rank in the cluster = block of chains
    const int s_begin = (rank * a.wk + wk) * a.chain_len;
    const int s_end = min(s_begin + a.chain_len, a.slabs);
    const int L = max(0, s_end - s_begin);          // slabs of this chain
    // The fast slabs: every k present and (VEC) every row and activation aligned: no checks in
    // the loop. The rest (at most the last slab of K) take the checked path. Both paths load the
    // same operands, so which path a slab takes changes no bits.
    const int Lf = VEC ? max(0, min(s_end, a.k / TDM_MM_SLAB_K) - s_begin) : 0;

    // This lane's B rows (clamped into the view: columns past n compute garbage nobody stores)
    // and, for FP8, its C columns.
    int brow[NT], ccol0[NT], ccol1[NT];
    const uint8_t *wm[NT], *sm[NT];   // each tile's stored matrix and scales (SwiGLU: tile 1 the up weight's)
    int64_t r0[NT];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        const int base = GLU ? wcol : wcol + 8 * nt;
        const bool up = GLU && nt == 1;
        brow[nt] = min(base + g, a.n - 1);
        // FP8's block scales follow the C columns: in SWAP the lane's C values of tile nt are its own
        // weight row brow's (C rows g and g + 8 are tiles np and np + 1; see the scale's use)
        ccol0[nt] = SWAP ? brow[nt] : min(base + 2 * t, a.n - 1);
        ccol1[nt] = SWAP ? brow[nt] : min(base + 2 * t + 1, a.n - 1);
        wm[nt] = up ? a.w_up : a.w;
        sm[nt] = up ? a.scale_up : a.scale;
        r0[nt] = up ? a.row0_up : a.row0;
    }

    // ---- the checked path (partial slabs, unaligned data) ----
    // One 16-byte activation unit: 8 k of row `row` from k0, zero past k and for rows >= m.
    auto load_unit = [&](int row, int64_t k0) -> uint4 {
        if (row >= a.m) return make_uint4(0, 0, 0, 0);
        const uint16_t *p = a.x + row * a.ldx + k0;
        if (a.x_vec && k0 + 8 <= a.k) return __ldg(reinterpret_cast<const uint4 *>(p));
        uint32_t v[4] = {0, 0, 0, 0};
        for (int e = 0; e < 8; e++)
            if (k0 + e < a.k) v[e >> 1] |= (uint32_t)p[e] << (16 * (e & 1));
        return make_uint4(v[0], v[1], v[2], v[3]);
    };
    // DA: the element offsets from a.x of this lane's activation rows g and g + 8 (rows past m
    // read row m - 1: their results are never summed or stored) at its lane chunk of the chain's first
    // slab; unit u of slab i of the chain is 16 bytes at + i * 128 + 8 * u elements. (32-bit offsets
    // from the parameter's pointer: two registers fewer than pointers, which sm_121a's forms needed.)
    uint32_t xo[2];
#pragma unroll
    for (int h = 0; h < 2; h++)
        xo[h] = (uint32_t)(min(8 * h + g, a.m - 1) * a.ldx + (int64_t)s_begin * TDM_MM_SLAB_K + TDM_MM_CHUNK_K * t);
    // XB: this lane's rows 16 mt + 8 h + g (clamped as above; at 17-32 rows see unit() below) at its
    // lane chunk of the chain's first slab in the blocked copy; unit u of slab i of the chain is 16
    // bytes at + i * XB_SLAB + u * XB_UNIT.
    constexpr uint32_t XB_UNIT = TDM_MM_XB_ROWS * TDM_MM_CHUNK_K, XB_SLAB = TDM_MM_UNITS * XB_UNIT;
    uint32_t xbo[2 * MT];
#pragma unroll
    for (int q = 0; q < 2 * MT; q++)
        xbo[q] = (uint32_t)s_begin * XB_SLAB + (uint32_t)min(8 * q + g, a.m - 1) * TDM_MM_CHUNK_K + 8 * t;
    (void)xbo;
    auto permute = [&](uint4 v) -> uint4 {
        uint32_t in[4] = {v.x, v.y, v.z, v.w}, out[4];
        tdm_mm_permute_unit(FMT, in, out);
        return make_uint4(out[0], out[1], out[2], out[3]);
    };
    auto load_checked = [&](Chunk<FMT>(&dst)[NT], int i) {
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
            load_chunk<FMT, VEC>(dst[nt], a, wm[nt], sm[nt], r0[nt], brow[nt], ccol0[nt], ccol1[nt], s_begin + i, t);
    };

    // ---- the fast path: per-lane weight pointers, slab i of the chain at + i * (slab stride) ----
    const int64_t rowbytes = (int64_t)a.k * FmtInfo<FMT>::NUM / FmtInfo<FMT>::DEN;
    const uint8_t *wp[NT];
    const uint8_t *sp[NT];      // NVFP4: this lane's two group scales of slab 0 of the chain
    int64_t fs0[NT], fs1[NT];   // FP8: scale index of slab 0 of the chain for C columns 2t, 2t+1
    // The weights' order (mm_layout.h, tdm_mm_chunk_at): row by row, or tile-major where the build holds
    // the format so (TDM_MM_TILES_FMT; run_skinny sends such weights held in rows to the checked path);
    // one slab to the next, the codes and NVFP4's scales, a constant step.
    constexpr bool tiled = TDM_MM_TILES_FMT(FMT);
    constexpr int order = tiled ? TDM_MM_ORDER_TILES : TDM_MM_ORDER_ROWS;
    constexpr int64_t wstep = tiled ? TDM_MM_TILE_ROWS * 4 * CB : SB;
    constexpr int sstep = tiled ? TDM_MM_TILE_ROWS * 8 : 8;   // an int, as the row order always had it (an int64 moved ptxas's registers)
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        wp[nt] = wm[nt] + tdm_mm_chunk_at(order, rowbytes, CB, r0[nt] + brow[nt], s_begin, t);
        sp[nt] = sm[nt] + tdm_mm_scales_at(order, a.k, r0[nt] + brow[nt], s_begin, t);
        fs0[nt] = ((r0[nt] + ccol0[nt]) >> 7) * (int64_t)a.slabs + s_begin;
        fs1[nt] = ((r0[nt] + ccol1[nt]) >> 7) * (int64_t)a.slabs + s_begin;
    }
    (void)sp; (void)fs0; (void)fs1; (void)sstep;
    // TDM_MM_TILE_PF: the lanes whose chunk starts a 128-byte line of the tile's slab prefetch it
    [[maybe_unused]] const bool pf_line = ((4 * g + t) * CB) % 128 == 0, pf_scales = lane == 0;
    auto load_fast = [&](Chunk<FMT>(&dst)[NT], int i) {
        if constexpr (tiled && TDM_MM_TILE_PF > 0) {
            const int ip = i + TDM_MM_TILE_PF;
            if (ip < Lf) {
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    if (pf_line) prefetch_line_l2(wp[nt] + (int64_t)ip * wstep);
                    if constexpr (FMT == TDM_MMF_NVFP4)
                        if (pf_scales) prefetch_line_l2(sp[nt] + sstep * ip);
                }
            }
        }
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const uint8_t *p = wp[nt] + (int64_t)i * wstep;
#pragma unroll
            for (int q = 0; q < CB / 16; q++) {
                uint4 v = ldg_weights<FMT>(p + 16 * q);
                dst[nt].w[4 * q] = v.x; dst[nt].w[4 * q + 1] = v.y; dst[nt].w[4 * q + 2] = v.z; dst[nt].w[4 * q + 3] = v.w;
            }
            if constexpr (FMT == TDM_MMF_NVFP4) {
                dst[nt].sc = ldg_stream_u16(sp[nt] + sstep * i);
            } else if constexpr (FMT == TDM_MMF_FP8) {
                if (a.scale_bf16) {
                    const uint16_t *s = reinterpret_cast<const uint16_t *>(sm[nt]);
                    dst[nt].sc[0] = __uint_as_float((uint32_t)__ldg(s + fs0[nt] + i) << 16);
                    dst[nt].sc[1] = __uint_as_float((uint32_t)__ldg(s + fs1[nt] + i) << 16);
                } else {
                    const float *s = reinterpret_cast<const float *>(sm[nt]);
                    dst[nt].sc[0] = __ldg(s + fs0[nt] + i);
                    dst[nt].sc[1] = __ldg(s + fs1[nt] + i);
                }
            }
        }
    };

    // ---- the activations of the fast path, staged by the CTA CH slabs at a time in two steps:
    // (1) cp.async copies the raw rows into a double buffer: buffer b, chain w, slab s of the
    //     chunk, unit u, row r (< m; rows past m are not written), lane chunk t holds the 16
    //     bytes of x row r at k = slab * 128 + 32 t + 8 u;
    // (2) after the chunk lands, the CTA permutes it once into mma A quads: chain w, slab s, step
    //     q, 16-row tile mt, lane holds the lane's four A registers of that step, so the K loop
    //     reads one 16-byte quad per mma (512 consecutive bytes a warp: no bank conflicts) and
    //     spends no instruction on the permutation. Rows 8-15 of a tile at most 8 rows deep repeat
    //     rows 0-7 (their results are never stored).
    constexpr int CH = TDM_MM_STAGE_SLABS;
    // Row room in the buffers: 8, 16 or 32 by instantiation, so that every index below divides
    // by a compile-time power of two (v3 divided by m rounded to 8 at run time: ~40 % of the
    // kernel's instructions went to the staging loops' divisions).
    constexpr int ROWS8 = MTA == 0 ? 8 : 16 * MT;
    constexpr int PER_SLAB = 16 * ROWS8;            // raw uint4 per (chain, slab): unit u, row, lane chunk tt
    constexpr int PER_CHAIN = CH * PER_SLAB;        // raw uint4 per (chain, chunk)
    const int am = a.m;
    const int per_buf = a.wk * PER_CHAIN;           // raw uint4 per buffer
    constexpr int QSLAB = TDM_MM_STEPS * MT * 32;  // quads per (chain, slab)
    uint4 *abuf = reinterpret_cast<uint4 *>(smem);
    uint4 *aquad = abuf + 2 * per_buf;
    const int nch = VEC && !DA ? (a.chain_len + CH - 1) / CH : 0;   // chunks: CTA-uniform
    auto fast_slabs = [&](int w) {                  // fast slabs of the CTA's chain w
        const int b = (rank * a.wk + w) * a.chain_len;
        return max(0, min(min(b + a.chain_len, a.slabs), a.k / TDM_MM_SLAB_K) - b);
    };
    // Only live rows are staged and permuted: rows >= m of an A tile hold whatever the buffers held
    // before (an mma output row depends only on its own A row, and rows >= m are never summed or
    // stored), so one row stages one row's bytes, not 8. Live rows are counted up to a power of two
    // (rp2 >= m, at most ROWS8; gp2 >= min(m, 8) lanes' groups) so that the indices below are
    // shifts and masks: at most one row past m is copied from x (none is read past m: the copy is
    // skipped there). v4 staged ROWS8 rows, zero-filled past m: at one row 8x the cp.async and
    // permute work; dropping it took 16 % of the kernel's instructions (bench/NOTES.md, v6 staging).
    int rp2 = 1;
    while (rp2 < am && rp2 < ROWS8) rp2 <<= 1;
    const int gp2 = rp2 < 8 ? rp2 : 8;              // lane groups g of a tile with a live row
    const int lg_rows = __ffs(rp2) + 1;             // log2(4 * rp2): raw uint4 of one (slab, unit)
    const int lg_lanes = __ffs(gp2) + 1;            // log2(4 * gp2): quads of one (slab, unit, tile)
    auto stage = [&](int c) {
        if (c < nch) {
            for (int w = 0; w < a.wk; w++) {
                uint4 *dst = abuf + (c & 1) * per_buf + w * PER_CHAIN;
                const int nfast = fast_slabs(w) - c * CH;   // slabs of this chunk on the fast path
                const uint16_t *xc = a.x + ((int64_t)(rank * a.wk + w) * a.chain_len + c * CH) * TDM_MM_SLAB_K;
                const unsigned live = (unsigned)(CH * TDM_MM_UNITS) << lg_rows;
                for (unsigned e = tid; e < live; e += nthr) {   // (slab, unit) outer, (row, lane chunk) inner
                    const unsigned rt = e & ((1u << lg_rows) - 1), su = e >> lg_rows;
                    const int sl = su / TDM_MM_UNITS, u = su % TDM_MM_UNITS, row = rt >> 2, tt = rt & 3;
                    if (sl < nfast && row < am)
                        cp_async16(dst + sl * PER_SLAB + u * 4 * ROWS8 + rt,
                                   xc + row * a.ldx + sl * TDM_MM_SLAB_K + 32 * tt + 8 * u);
                }
            }
        }
        cp_async_commit();   // an empty group past the end keeps the wait counts uniform
    };
    auto quads = [&](int c) {   // raw buffer c & 1 -> the quads of chunk c (lanes of live rows)
        const uint4 *raw = abuf + (c & 1) * per_buf;
        const unsigned live = (unsigned)(a.wk * CH * TDM_MM_UNITS * MT) << lg_lanes;
        for (unsigned e = tid; e < live; e += nthr) {
            const unsigned lane_q = e & ((1u << lg_lanes) - 1), r = e >> lg_lanes, mt = r % MT, r2 = r / MT,
                           u = r2 % TDM_MM_UNITS, r3 = r2 / TDM_MM_UNITS, sl = r3 % CH, w = r3 / CH;
            const unsigned gq = lane_q >> 2, tq = lane_q & 3, row0 = 16 * mt + gq, row1 = row0 + 8;
            const uint4 *src = raw + (w * CH + sl) * PER_SLAB + u * 4 * ROWS8 + tq;
            const uint4 p0 = permute(src[4 * row0]);
            const uint4 p1 = LO8 ? p0 : permute(src[4 * row1]);
            uint4 *dst = aquad + ((w * CH + sl) * TDM_MM_STEPS + 2 * u) * MT * 32 + mt * 32 + lane_q;
            dst[0] = make_uint4(p0.x, p1.x, p0.y, p1.y);
            dst[MT * 32] = make_uint4(p0.z, p1.z, p0.w, p1.w);
        }
    };

    float acc[NT][MT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[nt][mt][c] = 0.0f;

    // One slab: the A units (staged: from the shared-memory chunk ab; checked: load_unit), the B
    // registers decoded from the chunks, the mmas in one fixed order.
    // (The quads' shared-memory address as a 32-bit offset, read by ld.shared: no
    // generic-to-shared conversion per load.)
    const uint32_t aquad_s = (uint32_t)__cvta_generic_to_shared(aquad) + 16 * lane;
    auto compute = [&](const Chunk<FMT>(&ch)[NT], int i, uint32_t ab, auto staged) {
        constexpr int MODE = (int)decltype(staged)::value;   // 1 staged, 0 checked, 2 direct, 3 direct from XS's ring
        const int slab = s_begin + i;
        const int64_t kbase = (int64_t)slab * TDM_MM_SLAB_K + TDM_MM_CHUNK_K * t;
        uint32_t sa[NT], sb[NT];
        if constexpr (FMT == TDM_MMF_NVFP4) {
#pragma unroll
            for (int nt = 0; nt < NT; nt++) nvfp4_scales(ch[nt].sc, sa[nt], sb[nt]);
        } else {
#pragma unroll
            for (int nt = 0; nt < NT; nt++) sa[nt] = sb[nt] = 0;
        }
        float blk[NT][MT][4];   // FP8: this scale block's partial sums
        (void)blk;
        if constexpr (FMT == TDM_MMF_FP8) {
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int c = 0; c < 4; c++) blk[nt][mt][c] = 0.0f;
        }
#pragma unroll
        for (int u = 0; u < TDM_MM_UNITS; u++) {
            // per lane (not staged): unit u of activation row 16 mt + 8 h + g, permuted
            auto unit = [&](int mt, int h) -> uint4 {
                if constexpr (MODE == 3) {   // XS: the copy's slab in shared memory at ab (+ this lane's 16 bytes)
                    uint4 v;
                    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                                 : "r"(ab + 2 * ((16 * mt + 8 * h) * TDM_MM_CHUNK_K + u * XS_ROWS * TDM_MM_CHUNK_K)));
                    return v;
                }
                else if constexpr (MODE == 2 && XB) {   // the blocked copy: permuted already
                    // At 17-32 rows the four row offsets are xbo[0] plus constants, unclamped: rows past m
                    // read what the copy holds there (room for 32 rows), and their results are never
                    // summed or stored. Three registers fewer (with clamps the plain form spilled at 128).
                    // The slab's base is one 64-bit address a (row, slab); the unit's and the 16-row tile's
                    // offsets are constants the loads carry as immediates (as 32-bit index sums each load
                    // cost an add and a wide multiply-add).
                    const uint16_t *base = a.xb + (xbo[MT == 2 ? 0 : 2 * mt + h] + (uint32_t)i * XB_SLAB);
                    const int off = (MT == 2 ? (16 * mt + 8 * h) * TDM_MM_CHUNK_K : 0) + u * XB_UNIT;
                    return __ldg(reinterpret_cast<const uint4 *>(base + off));
                }
                else if constexpr (MODE == 2)   // DA (MT 1): unchecked, at the lane's offsets
                    return permute(__ldg(reinterpret_cast<const uint4 *>(
                        a.x + (xo[h] + (uint32_t)i * TDM_MM_SLAB_K + 8 * u))));
                else
                    return permute(load_unit(16 * mt + 8 * h + g, kbase + 8 * u));
            };
            if constexpr (SWAP) {   // the weights as A, this lane's activation row g as B (see SWAP)
#pragma unroll
                for (int np = 0; np < NT; np += 2) {
                    uint32_t b0[4], b1[4];
                    bregs<FMT>(ch[np], u, sa[np], sb[np], b0);
                    bregs<FMT>(ch[np + 1], u, sa[np + 1], sb[np + 1], b1);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++)
#pragma unroll
                        for (int h = 0; h < groups(mt); h++) {   // activation rows 16 mt + 8 h + g
                            const uint4 p = unit(mt, h);   // into accumulators [np + h][mt]
                            float(&c)[4] = FMT == TDM_MMF_FP8 ? blk[np + h][mt] : acc[np + h][mt];
                            mma_bf16(c, b0[0], b1[0], b0[1], b1[1], p.x, p.y);
                            mma_bf16(c, b0[2], b1[2], b0[3], b1[3], p.z, p.w);
                        }
                }
            } else {
                uint4 aq[MT][2];   // the A quads of steps 2u and 2u + 1
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    if constexpr (MODE == 1) {   // staged
#pragma unroll
                        for (int q = 0; q < 2; q++)
                            asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                                         : "=r"(aq[mt][q].x), "=r"(aq[mt][q].y), "=r"(aq[mt][q].z), "=r"(aq[mt][q].w)
                                         : "r"(ab + 16 * (((2 * u + q) * MT + mt) * 32)));
                    } else {   // per lane: the units of rows 16 mt + g (h 0) and + 8 (h 1)
                        // At most 8 rows (LO8) rows 8-15 of the tile are never summed or stored, and
                        // here they hold zeros: copies of rows 0-7 cost register moves into every
                        // quad, and inside the engine the one-row verify 3.33 ms against 3.22 with
                        // zeros (H200, bench/NOTES.md: the direct form's load depth).
                        // At 17-24 rows (HI24) rows 24-31 the same: zeros, never loaded.
                        const uint4 p0 = unit(mt, 0), p1 = LO8 || (HI24 && mt == 1) ? make_uint4(0, 0, 0, 0) : unit(mt, 1);
                        aq[mt][0] = make_uint4(p0.x, p1.x, p0.y, p1.y);
                        aq[mt][1] = make_uint4(p0.z, p1.z, p0.w, p1.w);
                    }
                }
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    uint32_t b[4];
                    bregs<FMT>(ch[nt], u, sa[nt], sb[nt], b);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        float(&c)[4] = FMT == TDM_MMF_FP8 ? blk[nt][mt] : acc[nt][mt];
                        mma_bf16(c, aq[mt][0].x, aq[mt][0].y, aq[mt][0].z, aq[mt][0].w, b[0], b[1]);
                        mma_bf16(c, aq[mt][1].x, aq[mt][1].y, aq[mt][1].z, aq[mt][1].w, b[2], b[3]);
                    }
                }
            }
        }
        if constexpr (FMT == TDM_MMF_FP8) {   // the block scale onto the block's partial sum
            // SWAP: accumulators np + h hold activation rows 8 h + 2t, + 1 (c & 1) of the weight rows g
            // of tiles np (c 0-1) and np + 1 (c 2-3), each scale its row's (ccol above); at most 8
            // rows np + 1's stay unused. Else: C columns 2t, 2t + 1 (c & 1) of tile nt.
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                if (SWAP && LO8 && nt % 2) continue;
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int c = 0; c < 4; c++) {
                        const float s = SWAP ? ch[nt - nt % 2 + (c >> 1)].sc[0] : ch[nt].sc[c & 1];
                        acc[nt][mt][c] = fmaf(blk[nt][mt][c], s, acc[nt][mt][c]);
                    }
            }
        }
    };

    static_assert(CH % D == 0, "the weight ring depth must divide the staged chunk");
    Chunk<FMT> ring[D][NT];
    // XS: chain w's barriers at 16 S w (full[s] at + 8 s, empty[s] at + 8 (S + s)), its ring after all
    // the barriers (stage s at + (S w + s) XS_STAGE)
    constexpr int S = TDM_MM_XS_STAGES;
    const uint32_t smem_s = (uint32_t)__cvta_generic_to_shared(smem);
    auto xs_chain_bars = [&](int w) { return smem_s + 16u * S * (uint32_t)w; };   // chain w's barriers
    auto full_bar = [](uint32_t bars, uint32_t st) { return bars + 8u * st; };
    auto empty_bar = [](uint32_t bars, uint32_t st) { return bars + 8u * (S + st); };
    // This warp's chain's barriers and ring (XS only), here before the first loads: computed in the K
    // loop's XS branch instead, the FP8 17-32-row form's code changed (2 more registers on sm_121a).
    [[maybe_unused]] const uint32_t xs_bars = XS ? xs_chain_bars(wk) : 0u;
    [[maybe_unused]] const uint32_t xs_ring =
        XS ? smem_s + (uint32_t)tdm_mm_xs_bar_bytes(a.wk) + (uint32_t)(S * XS_STAGE * wk) : 0u;
    if constexpr (XS) {
        if (tid == 0) {
            for (int w = 0; w < a.wk; w++)
                for (uint32_t st = 0; st < S; st++) {
                    mbar_init(full_bar(xs_chain_bars(w), st), 1);                   // the copying lane's arrival + the bytes
                    mbar_init(empty_bar(xs_chain_bars(w), st), (uint32_t)wn_count);  // each warp of the chain
                }
            asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        }
        __syncthreads();
    }
    // Before the wait (pdl.cuh; weights are no kernel's output): the first PF slabs of weights into
    // the ring, so that a kernel started early has them on the way while the kernel before it
    // finishes. (Asking L2 for the next 8 slabs of each row there as well made a 27B token 9-13 %
    // slower, with or without programmatic launches: bench/NOTES.md.)
#pragma unroll
    for (int p = 0; p < PF; p++)
        if (p < Lf) load_fast(ring[p], p);
    tdm_pdl::wait();   // the kernels before this one have finished: the activations are there
    if constexpr (DA) {
        if constexpr (XS) {
            // The loop in whole rounds of the ring, every stage index a constant.
            static_assert(S % D == 0, "the weight ring's depth divides the stages");
            const bool copier = wn == 0 && lane == 0;
            const uint16_t *src = a.xb + (size_t)s_begin * XB_SLAB;
            const uint32_t lane_off = 2u * (uint32_t)(g * TDM_MM_CHUNK_K + 8 * t);
            auto copy = [&](int j, uint32_t st) {   // slab j of the chain into stage st
                const uint32_t full = full_bar(xs_bars, st), dst = xs_ring + st * XS_STAGE;
                mbar_arrive_expect(full, XS_STAGE);
                if constexpr (XS_ROWS == TDM_MM_XB_ROWS)   // the copy's slab in one piece
                    bulk_copy_g2s(dst, src + (size_t)j * XB_SLAB, XS_STAGE, full);
                else
#pragma unroll
                    for (int u = 0; u < TDM_MM_UNITS; u++)   // unit u's first XS_ROWS rows
                        bulk_copy_g2s(dst + (uint32_t)(u * XS_STAGE / TDM_MM_UNITS), src + (size_t)j * XB_SLAB + u * XB_UNIT,
                                      XS_STAGE / TDM_MM_UNITS, full);
            };
            if (copier)
                for (int j = 0; j < S - 1 && j < Lf; j++) copy(j, (uint32_t)j);
            uint32_t ph = 0;   // parity of the round
            for (int i0 = 0; i0 < Lf; i0 += S, ph ^= 1u) {
#pragma unroll
                for (int j = 0; j < S; j++) {
                    const int i = i0 + j;
                    if (i < Lf) {
                        if (i + PF < Lf) load_fast(ring[(j + PF) % D], i + PF);
                        if (copier && i + S - 1 < Lf) {   // into slab i - 1's stage, once every warp read it
                            const uint32_t st = (uint32_t)((j + S - 1) % S);
                            if (i >= 1) mbar_wait(empty_bar(xs_bars, st), j == 0 ? ph ^ 1u : ph);
                            copy(i + S - 1, st);
                        }
                        mbar_wait(full_bar(xs_bars, (uint32_t)j), ph);
                        compute(ring[j % D], i, xs_ring + (uint32_t)(j * XS_STAGE) + lane_off, std::integral_constant<int, 3>());
                        // every lane's reads of the stage ordered before the copy engine's next write there
                        // (another proxy), then the warp's release
                        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
                        __syncwarp();
                        if (lane == 0) mbar_arrive(empty_bar(xs_bars, (uint32_t)j));
                    }
                }
            }
        } else {
            // TDM_MM_FLAT (at most 8 rows, pf 1): first the whole groups of D slabs with no per-slab
            // test and every load unpredicated (past the chain's fast slabs it reloads the last one,
            // whose registers are never used), then the rest as before. ncu on pf 3 (bench/NOTES.md)
            // had the warps wait at the loop's top branch for the ring's predicated loads. The same
            // operands and order, so the same bits. At 9-16 rows and at pf 3 the two loops spilled.
            int i0 = 0;
            if constexpr (TDM_MM_FLAT && LO8 && PF == 1) {
                for (; i0 + D <= Lf; i0 += D) {
#pragma unroll
                    for (int j = 0; j < D; j++) {
                        load_fast(ring[(j + PF) % D], min(i0 + j + PF, Lf - 1));
                        compute(ring[j], i0 + j, 0u, std::integral_constant<int, 2>());
                    }
                }
            }
            for (; i0 < Lf; i0 += D) {
#pragma unroll
                for (int j = 0; j < D; j++) {
                    const int i = i0 + j;
                    if (i < Lf) {
                        if (i + PF < Lf) load_fast(ring[(j + PF) % D], i + PF);
                        compute(ring[j], i, 0u, std::integral_constant<int, 2>());
                    }
                }
            }
        }
    } else if (nch > 0) {
        stage(0);
        for (int c = 0; c < nch; c++) {
            cp_async_wait<0>();
            __syncthreads();                         // raw chunk c landed; every warp is done with chunk c - 1
            stage(c + 1);                            // into the other raw buffer, while chunk c computes
            quads(c);
            __syncthreads();                         // the quads of chunk c are ready
            const uint32_t ab = aquad_s + 16 * (wk * CH * QSLAB);
#pragma unroll
            for (int sl = 0; sl < CH; sl++) {
                const int i = c * CH + sl;
                if (i < Lf) {
                    if (i + PF < Lf) load_fast(ring[(sl + PF) % D], i + PF);
                    compute(ring[sl % D], i, ab + 16 * sl * QSLAB, std::true_type());
                }
            }
        }
        cp_async_wait<0>();
    }
    // The checked slabs (the last, partial slab of K; everything when the data are unaligned).
    for (int i = Lf; i < L; i++) {
        load_checked(ring[0], i);
        compute(ring[0], i, 0u, std::false_type());
    }
    // The kernel after this one may start (pdl.cuh) once every CTA is past its K loop. Released at
    // the start instead, a whole 27B token's products took 10.26 ms against 9.26 without programmatic
    // launches (H200, bench/NOTES.md): the next kernels' CTAs then came up one after another and sat
    // waiting beside the streaming ones. Here: 9.09.
    tdm_pdl::release();
    __syncthreads();                                 // the staging buffers become the tree's

    // ---- the sum of the chains, then the output ----
    const int rstride = cols + 8;                // floats; 8 mod 32 keeps the fragment stores conflict-free
    float *red = reinterpret_cast<float *>(smem + (XS ? tdm_mm_xs_bar_bytes(a.wk) : 0));
    {
        float *mine = red + (size_t)wk * ROWS * rstride;
        if constexpr (SWAP) {   // C rows: the weight rows g of tiles np and np + 1; columns: activation rows 2t, 2t + 1
#pragma unroll
            for (int np = 0; np < NT; np += 2)
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int h = 0; h < groups(mt); h++) {   // activation rows 16 mt + 8 h + 2t, + 1
                        const int c = wn * 8 * NT + 8 * np + g, r = 16 * mt + 8 * h + 2 * t;
                        mine[r * rstride + c] = acc[np + h][mt][0];
                        mine[(r + 1) * rstride + c] = acc[np + h][mt][1];
                        mine[r * rstride + c + 8] = acc[np + h][mt][2];
                        mine[(r + 1) * rstride + c + 8] = acc[np + h][mt][3];
                    }
        } else
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                const int c = wn * 8 * NT + 8 * nt + 2 * t, r = 16 * mt + g;
                *reinterpret_cast<float2 *>(mine + r * rstride + c) = make_float2(acc[nt][mt][0], acc[nt][mt][1]);
                if (!(HI24 && mt == 1))   // (not rows 24-31 at 17-24 rows)
                    *reinterpret_cast<float2 *>(mine + (r + 8) * rstride + c) = make_float2(acc[nt][mt][2], acc[nt][mt][3]);
            }
    }
    __syncthreads();
    const int nel = a.m * cols;
    for (int step = 1; step < a.wk; step <<= 1) {   // tree levels inside the CTA
        for (int e = tid; e < nel; e += nthr) {
            const int r = e / cols, c = e - r * cols;
            for (int grp = 0; grp < a.wk; grp += 2 * step)
                red[((size_t)grp * ROWS + r) * rstride + c] += red[((size_t)(grp + step) * ROWS + r) * rstride + c];
        }
        __syncthreads();
    }
    const int cs = gridDim.y;
    if (cs > 1) {   // tree levels across the cluster, over distributed shared memory
        cooperative_groups::cluster_group cl = cooperative_groups::this_cluster();
        for (int step = 1; step < cs; step <<= 1) {
            cl.sync();
            if (rank % (2 * step) == 0 && rank + step < cs) {
                const float *other = cl.map_shared_rank(red, rank + step);
                for (int e = tid; e < nel; e += nthr) {
                    const int r = e / cols, c = e - r * cols;
                    red[r * rstride + c] += other[r * rstride + c];
                }
            }
        }
        cl.sync();   // no CTA leaves while another still reads its shared memory
    }
    if (rank != 0) return;
    if constexpr (GLU) {   // output o of warp w: the gate's sum at column 16 w + o % 8, the up's 8 further
        for (int e = tid; e < a.m * outs; e += nthr) {
            const int r = e / outs, h = e - r * outs, n = col0 + h;
            if (n >= a.n) continue;
            const int cg = 16 * (h >> 3) + (h & 7);
            // tdm_silu_mul's roundings on the two products' BF16 outputs (swiglu_ref)
            const uint16_t v = tdm_ly::swiglu_ref(red[r * rstride + cg] * a.out_scale, red[r * rstride + cg + 8] * a.out_scale_up);
            reinterpret_cast<uint16_t *>(a.y)[r * a.ldy + n] = v;
            tdm_ly::xb_put(a.yb, r, n, a.n, v);
        }
    } else if (a.gate_y) {   // the gated up product: the gate's BF16 output is exact as a float
        // TDM_MM_GATE_LOADS of a thread's gate values asked for together: y may be the gate's output, so
        // the compiler keeps every load after the stores before it (one L2 round trip each at 1)
        constexpr int GATE_LOADS = TDM_MM_GATE_LOADS;
        for (int e0 = tid; e0 < nel; e0 += GATE_LOADS * nthr) {
            uint16_t g[GATE_LOADS];
#pragma unroll
            for (int j = 0; j < GATE_LOADS; j++) {
                const int e = e0 + j * nthr, r = e / cols, n = col0 + e - r * cols;
                g[j] = e < nel && n < a.n ? a.gate_y[r * a.ld_gate + n] : 0;
            }
#pragma unroll
            for (int j = 0; j < GATE_LOADS; j++) {
                const int e = e0 + j * nthr, r = e / cols, c = e - r * cols, n = col0 + c;
                if (e >= nel || n >= a.n) continue;
                const uint16_t o = tdm_ly::swiglu_ref(tdm_ly::bf2f(g[j]), red[r * rstride + c] * a.out_scale);
                reinterpret_cast<uint16_t *>(a.y)[r * a.ldy + n] = o;
                tdm_ly::xb_put(a.yb, r, n, a.n, o);
            }
        }
    } else {
        for (int e = tid; e < nel; e += nthr) {
            const int r = e / cols, c = e - r * cols, n = col0 + c;
            if (n >= a.n) continue;
            const float v = red[r * rstride + c] * a.out_scale;
            if (a.y_f32)
                reinterpret_cast<float *>(a.y)[r * a.ldy + n] = v;
            else
                reinterpret_cast<__nv_bfloat16 *>(a.y)[r * a.ldy + n] = __float2bfloat16_rn(v);
        }
    }
}

// TDM_MM_CARVEOUT: -1 (the default) leaves the shared-memory carveout to the driver; 0-100 asks for
// that percentage of the SM's L1/shared memory as shared memory for every skinny instantiation
// (cudaFuncAttributePreferredSharedMemoryCarveout), so that kernels with different shared-memory
// needs (XS's 64 KB against ~14 KB) ask for the same split. A build-time knob for A/B runs. Measured on an
// H100 (bench/NOTES.md, the merged build on the GPU): 100 makes a 27B token's products 32-51 % slower at
// every row count (a reading: too little L1 left for the weights' loads), with or without NVFP4's XS.
#ifndef TDM_MM_CARVEOUT
#define TDM_MM_CARVEOUT -1
#endif

// Launches one instantiation with the setting's grid, block, cluster and shared memory.
template <int FMT, int NT, int MT, int PF, bool VEC, bool GLU, bool DA = false, bool XB = false, bool XS = false>
cudaError_t launch(const SkinnyArgs &a, int wn, int cs, size_t smem, cudaStream_t st)
{
    auto kern = skinny_kernel<FMT, NT, MT, PF, VEC, GLU, DA, XB, XS>;
    static_assert(TDM_MM_CARVEOUT >= -1 && TDM_MM_CARVEOUT <= 100, "TDM_MM_CARVEOUT: -1, or a percentage");
    if constexpr (TDM_MM_CARVEOUT >= 0) {   // once per instantiation
        static bool carved = false;
        if (!carved) {
            const cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributePreferredSharedMemoryCarveout, TDM_MM_CARVEOUT);
            if (e != cudaSuccess) return e;
            carved = true;
        }
    }
    // Raise the dynamic shared memory limit once per instantiation, to what the largest setting may
    // need, so that no later call (perhaps inside a graph capture) has to.
    static size_t allowed = 48 * 1024;
    if (smem > allowed) {
        const size_t want = smem > 200 * 1024 ? smem : 200 * 1024;
        cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)want);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
            if (e != cudaSuccess) return e;
            allowed = smem;
        } else {
            allowed = want;
        }
    }
    const int cols = 8 * NT * wn, outs = GLU ? cols / 2 : cols;   // SwiGLU: half as many outputs
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)((a.n + outs - 1) / outs), (unsigned)cs, 1);
    cfg.blockDim = dim3((unsigned)(32 * wn * a.wk), 1, 1);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cudaLaunchAttribute attr[2];
    unsigned nattr = 0;
    if (cs > 1) {
        attr[nattr].id = cudaLaunchAttributeClusterDimension;
        attr[nattr].val.clusterDim.x = 1;
        attr[nattr].val.clusterDim.y = (unsigned)cs;
        attr[nattr].val.clusterDim.z = 1;
        nattr++;
    }
    cfg.attrs = attr;
    cfg.numAttrs = tdm_pdl::add_attr(attr, nattr);   // the kernel waits before its activations
    return cudaLaunchKernelEx(&cfg, kern, a);
}

// The plain or SwiGLU form (a.w_up) of one vector instantiation; the SwiGLU form exists for nt 2
// (FP8's nt 2 forms are launched by dispatch below, not here).
// direct: the per-lane activation form (DA) where it is built (TDM_MM_DIRECT), else the staged one;
// the per-lane form reads the blocked copy where the caller gave one (XB), and stages x's slabs (XS)
// where it is built to and xs: the caller's tdm_mm_xs_runs, which sized smem.
template <int FMT, int NT, int MT, int PF, bool DA, bool XB, bool XS = false>
cudaError_t launch_glu(const SkinnyArgs &a, int wn, int cs, size_t smem, cudaStream_t st)
{
    if (a.w_up == nullptr) return launch<FMT, NT, MT, PF, true, false, DA, XB, XS>(a, wn, cs, smem, st);
    if constexpr (NT == 2) return launch<FMT, NT, MT, PF, true, true, DA, XB, XS>(a, wn, cs, smem, st);
    return cudaErrorInvalidValue;
}
template <int FMT, int NT, int MT, int PF>
cudaError_t launch_form(const SkinnyArgs &a, int wn, int cs, size_t smem, bool direct, bool xs, cudaStream_t st)
{
    if constexpr (MT == 3) {   // 17-24 rows (TDM_MM_HI24_AT): the per-lane form from the copy only (staged: TDM_MM_HI24_XS)
        if constexpr (TDM_MM_HI24_AT(FMT) && TDM_MM_DIRECT_XB(FMT, NT, 2) && TDM_MM_DIRECT_XB_PF(FMT, 2, PF) == PF)
            if (direct && a.xb) {
                if constexpr (TDM_MM_HI24_XS(FMT) && TDM_MM_XS_AT(FMT, 2))
                    if (xs) return launch_glu<FMT, NT, 3, PF, true, true, true>(a, wn, cs, smem, st);
                if (!xs) return launch_glu<FMT, NT, 3, PF, true, true>(a, wn, cs, smem, st);
            }
        return cudaErrorInvalidValue;
    } else {
        if constexpr (TDM_MM_DIRECT_XB(FMT, NT, MT) && TDM_MM_DIRECT_XB_PF(FMT, MT, PF) == PF)
            if (direct && a.xb) {
                if constexpr (TDM_MM_XS_AT(FMT, MT))   // x's slabs staged where the chain's warps share them (mm_layout.h)
                    if (xs) return launch_glu<FMT, NT, MT, PF, true, true, true>(a, wn, cs, smem, st);
                return launch_glu<FMT, NT, MT, PF, true, true>(a, wn, cs, smem, st);
            }
        if constexpr (TDM_MM_DIRECT(FMT, NT, MT))
            if (direct && !a.xb) return launch_glu<FMT, NT, MT, PF, true, false>(a, wn, cs, smem, st);
        return launch_glu<FMT, NT, MT, PF, false, false>(a, wn, cs, smem, st);
    }
}

// Picks the instantiation for (nt, mt, pf, vec, direct) from TDM_MM_VARIANTS (mt 0: at most 8 rows,
// built beside every mt 1 entry; mt 3: 17-24 rows, beside the mt 2 entries where TDM_MM_HI24_AT);
// unaligned data take nt 1, pf 1 (the setting only distributes work, so this changes no bits), the
// staged form and never the SwiGLU form.
template <int FMT>
cudaError_t dispatch(const SkinnyArgs &a, int nt, int wn, int cs, int pf, int mt, bool vec, bool direct, bool xs,
                     size_t smem, cudaStream_t st)
{
    if (!vec) {
        if (a.w_up != nullptr) return cudaErrorInvalidValue;
        return mt <= 1 ? launch<FMT, 1, 1, 1, false, false>(a, wn, cs, smem, st)
                       : launch<FMT, 1, 2, 1, false, false>(a, wn, cs, smem, st);
    }
    // FP8 nt 2 (TDM_MM_FORM_NT; the caller ran every other case as nt 1): per lane from the copy at
    // 1-16 rows, plain or SwiGLU (its only SwiGLU form: matmul.cu, swiglu_setting); no staged form.
    if constexpr (FMT == TDM_MMF_FP8)
        if (nt == 2) {
            if (!direct || !a.xb || pf != 1 || mt > 1) return cudaErrorInvalidValue;
            if (a.w_up != nullptr)
                return mt == 0 ? launch<FMT, 2, 0, 1, true, true, true, true>(a, wn, cs, smem, st)
                               : launch<FMT, 2, 1, 1, true, true, true, true>(a, wn, cs, smem, st);
            return mt == 0 ? launch<FMT, 2, 0, 1, true, false, true, true>(a, wn, cs, smem, st)
                           : launch<FMT, 2, 1, 1, true, false, true, true>(a, wn, cs, smem, st);
        }
#define TDM_MM_LAUNCH_IF(F, NT_, MT_, PF_)                                                     \
    if constexpr (F == FMT) {                                                                   \
        if (nt == NT_ && mt == MT_ && pf == PF_) return launch_form<FMT, NT_, MT_, PF_>(a, wn, cs, smem, direct, xs, st); \
        if constexpr (MT_ == 1)                                                                 \
            if (nt == NT_ && mt == 0 && pf == PF_) return launch_form<FMT, NT_, 0, PF_>(a, wn, cs, smem, direct, xs, st); \
        if constexpr (MT_ == 2 && TDM_MM_HI24_AT(F))                                            \
            if (nt == NT_ && mt == 3 && pf == PF_) return launch_form<FMT, NT_, 3, PF_>(a, wn, cs, smem, direct, xs, st); \
    }
    TDM_MM_VARIANTS(TDM_MM_LAUNCH_IF)
#undef TDM_MM_LAUNCH_IF
    return cudaErrorInvalidValue;
}

}  // namespace tdm_mm

// The per-format entry points (nvfp4_skinny.cu, fp8_skinny.cu, bf16_skinny.cu).
cudaError_t tdm_mm_skinny_nvfp4(const tdm_mm::SkinnyArgs &a, int nt, int wn, int cs, int pf, int mt, bool vec, bool direct,
                                bool xs, size_t smem, cudaStream_t st);
cudaError_t tdm_mm_skinny_fp8(const tdm_mm::SkinnyArgs &a, int nt, int wn, int cs, int pf, int mt, bool vec, bool direct,
                              bool xs, size_t smem, cudaStream_t st);
cudaError_t tdm_mm_skinny_bf16(const tdm_mm::SkinnyArgs &a, int nt, int wn, int cs, int pf, int mt, bool vec, size_t smem, cudaStream_t st);
