/* mm_layout.h — the one description of how the skinny matrix kernels (kernels/mm_skinny.cuh) lay a
 * weight row and the activations onto mma.m16n8k16 fragments: which lane loads which bytes of a
 * row, which k each half of each operand register holds, how the activations are permuted into
 * shared memory, how e2m1 / e4m3 bytes become BF16 operands, and how K is cut into chains.
 *
 * Plain C11 for the CPU emulation (t/unit/matmul_emul.c) and __host__ __device__ for the kernels:
 * the test runs the same functions the kernels run, so it covers the kernels' mapping.
 *
 * The vocabulary (PTX ISA, mma.m16n8k16 with .bf16 operands, FP32 accumulators):
 *   lane = 4 * g + t (g = groupID 0..7, t = threadID_in_group 0..3).
 *   A (activations, 16 rows x 16 kappa): register 0 = row g,   kappa 2t, 2t+1
 *                                         register 1 = row g+8, kappa 2t, 2t+1
 *                                         register 2 = row g,   kappa 2t+8, 2t+9
 *                                         register 3 = row g+8, kappa 2t+8, 2t+9
 *   B (weights, 16 kappa x 8 columns):    register 0 = column g, kappa 2t, 2t+1
 *                                         register 1 = column g, kappa 2t+8, 2t+9
 *   C (16 rows x 8 columns):              c0, c1 = row g, column 2t, 2t+1; c2, c3 = row g+8, same.
 *   The lower 16 bits of a register hold the lower kappa.
 * The sum over K may run in any fixed order, so each kernel maps kappa onto k so that a lane's own
 * contiguous bytes of a weight row feed its own B registers, and permutes the activations the same
 * way when it stages them into shared memory.
 *
 * The slab: K is walked in slabs of 128 k. In a slab, lane chunk t (0..3) of a weight row covers
 * k = 32t .. 32t+31 and is loaded by the 8 lanes with threadID_in_group t (one per column g).
 * A slab is 8 mma steps s = 0..7; step s takes from lane chunk t the four k given by
 * tdm_mm_bk(fmt, s, r, h) for B register r and half h. */
#ifndef TDM_MM_LAYOUT_H
#define TDM_MM_LAYOUT_H
#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#define TDM_HD __host__ __device__ __forceinline__
#else
#define TDM_HD static inline
#endif

/* The formats the skinny kernels read (values of enum tdm_wfmt in linear.h). */
#define TDM_MMF_BF16 0
#define TDM_MMF_FP8 2
#define TDM_MMF_NVFP4 3

/* Slabs of activations a CTA stages into shared memory at a time (double-buffered). */
#ifndef TDM_MM_STAGE_SLABS
#define TDM_MM_STAGE_SLABS 4
#endif

/* The settings each format's skinny kernel is built for, as (format, nt, mt, pf): nt n8-tiles a
 * warp, mt 16-row activation tiles (1: 1-16 rows, 2: 17-32), pf slabs of weights in flight (pf + 1
 * divides TDM_MM_STAGE_SLABS). The list holds what ptxas compiles without spilling at <= 128
 * registers a thread (mm_skinny.cuh asks for two CTAs of 256 threads a SM). One list: the kernels
 * instantiate it and the tile-table check (src/common/tiles.c) refuses any other setting.
 * NVFP4 nt 4 at 1-16 rows (pf 1; 120-128 registers, no spill) is built for tandem-sweep to time:
 * four accumulator chains a warp and half the activation loads a weight byte, against half the
 * warps (bench/NOTES.md, the ablation probes). Not yet run on a GPU; no committed table uses it. */
#define TDM_MM_VARIANTS(X)                                                                      \
    X(TDM_MMF_NVFP4, 2, 1, 1) X(TDM_MMF_NVFP4, 2, 1, 3) X(TDM_MMF_NVFP4, 1, 1, 1)               \
    X(TDM_MMF_NVFP4, 1, 1, 3) X(TDM_MMF_NVFP4, 2, 2, 1) X(TDM_MMF_NVFP4, 1, 2, 1)               \
    X(TDM_MMF_NVFP4, 1, 2, 3) X(TDM_MMF_NVFP4, 4, 1, 1)                                         \
    X(TDM_MMF_FP8, 1, 1, 1) X(TDM_MMF_FP8, 1, 2, 1) X(TDM_MMF_FP8, 1, 1, 3) X(TDM_MMF_FP8, 1, 2, 3) \
    X(TDM_MMF_BF16, 1, 1, 1) X(TDM_MMF_BF16, 1, 2, 1) X(TDM_MMF_BF16, 2, 1, 1) X(TDM_MMF_BF16, 2, 2, 1)

/* Where the skinny kernel is also built to load its activations per lane, straight from global
 * memory (no shared-memory staging, no CTA barrier in the K loop; run where TANDEM_MM_DIRECT selects it),
 * by format, nt and mt (0: at most 8 rows, 1: 9-16, 2: 17-32): NVFP4 at 1-16 rows, nt 4 at most 8
 * rows (its 9-16-row per-lane form spills on sm_121a: t/kernel-resources.t). Measured on the H200
 * (bench/NOTES.md, direct A loads): NVFP4 products faster at 1-16 rows and slower at 17-32; FP8 the
 * same at 1-8 rows and 1.4x slower at 16; inside the engine's rounds, NVFP4 faster at 1-16 rows
 * (kernels/matmul.h: TDM_MM_DIRECT_AUTO_ROWS). The forms fetch the same operands: the same bits. */
#define TDM_MM_DIRECT(fmt, nt, mt) ((fmt) == TDM_MMF_NVFP4 && (mt) <= ((nt) <= 2 ? 1 : 0))
/* The same from x's blocked copy (xb below): NVFP4 also at 17-32 rows with nt 2, the weights as the
 * A operand there too (mm_skinny.cuh: XB, SWAP); FP8 at nt 1 and 1-32 rows and at nt 2 and 1-16 rows,
 * the weights as A there (from the copy only: it shares NVFP4's unit order, tdm_mm_bk). */
#define TDM_MM_DIRECT_XB(fmt, nt, mt)                                                                 \
    (TDM_MM_DIRECT(fmt, nt, mt) || ((fmt) == TDM_MMF_NVFP4 && (mt) == 2 && (nt) == 2) ||                \
     ((fmt) == TDM_MMF_FP8 && ((nt) == 1 || ((nt) == 2 && (mt) <= 1))))
/* The nt a setting of nt tiles a warp runs at, at mt, per lane from the blocked copy (xb_lane) or not:
 * FP8's nt 2 is built per lane from the copy at 1-16 rows only (the weights as the mma's A operand,
 * SWAP; its staged form took 145-196 registers); everywhere else it runs as nt 1 over twice the
 * warps (wn), the same CTAs, chains and output columns, each column's operations the same: the same
 * bits (t/gpu/matmul.t's twins compare every m against one-row calls). */
#define TDM_MM_FORM_NT(fmt, nt, mt, xb_lane) \
    ((fmt) == TDM_MMF_FP8 && (nt) == 2 && !((xb_lane) && (mt) <= 1) ? 1 : (nt))
/* The warps a CTA runs a setting of nt tiles and wn warps at (TDM_MM_FORM_NT's arguments): the
 * setting's columns over the nt it runs at. */
TDM_HD int tdm_mm_form_wn(int fmt, int nt, int wn, int mt, int xb_lane)
{
    return wn * nt / TDM_MM_FORM_NT(fmt, nt, mt, xb_lane);
}
/* The load depth (pf) at which the per-lane forms from the blocked copy run a setting of depth pf at
 * mt: FP8's 17-32-row form is built at pf 1 only (at pf 3 it spills on sm_121a); the depth only
 * orders the loads, so the bits are the same. */
#define TDM_MM_DIRECT_XB_PF(fmt, mt, pf) ((fmt) == TDM_MMF_FP8 && (mt) == 2 ? 1 : (pf))
/* The mt of TDM_MM_DIRECT and TDM_MM_DIRECT_XB that serves m rows (0: at most 8, 1: 9-16, 2: 17-32). */
TDM_HD int tdm_mm_rows_mt(int64_t m) { return m <= 8 ? 0 : m <= 16 ? 1 : 2; }
/* TDM_MM_HI24 (1, the default, or 0): NVFP4 products of 17-24 rows per lane from the blocked copy
 * (unstaged) run an instantiation of their own (the kernel's mt 3: the 17-32-row form without rows
 * 24-31's activation loads and mmas; mm_skinny.cuh, HI24), chosen at launch like mt 0 at most 8 rows:
 * the same setting, tables and bits (each mma's output column is one activation row). Why: at 17-32
 * rows the form is held by the activation units' loads through L1 (ncu, bench/NOTES.md), and its time
 * was flat from 17 to 32 rows. Measured on an H100 (bench/NOTES.md, 17-24 rows of their own;
 * bench/results/h100-hi24-v1.txt), against 0 alternated twice: a 27B token's NVFP4 products at 17 / 20 / 24
 * rows 9.63-9.71 / 9.62-9.66 / 9.64-9.68 -> 8.54-8.55 / 8.55-8.56 / 8.62 ms; 16, 25 and 32 rows unchanged.
 * A build-time knob for A/B runs. */
#ifndef TDM_MM_HI24
#define TDM_MM_HI24 1
#endif
/* TDM_MM_HI24_FP8 (1 or 0): the same for FP8 (nt 1 per lane from the blocked copy, staged by XS or not):
 * rows 24-31 of the second 16-row A tile are zeros instead of loads (an mma's output row depends on
 * its own A row only), XS stages 24 rows a slab instead of 32, and the tree gets no stores of rows
 * 24-31; the mmas stay (the activations are the A operand, 16 rows deep). The same setting, tables and
 * bits. Why: a 27B token's FP8 products took 16.9 ms at 17-24 rows, flat from 17 to 32 as NVFP4's
 * did. Measured on an H100 (bench/NOTES.md, FP8 at 17-24 rows of its own), against 0 alternated twice:
 * a 27B token's FP8 products at 17 / 20 / 24 rows 16.72-16.77 / 16.72-16.74 / 16.74-16.77 -> 16.12-16.48 /
 * 16.49 / 16.53 ms, every shape 2-7 % faster at 24 rows; 16 and 25 rows unchanged. On sm_90 the per-lane
 * form spills nothing (the 17-32-row one 20 + 28 bytes). A build-time knob for A/B runs. */
#ifndef TDM_MM_HI24_FP8
#define TDM_MM_HI24_FP8 1
#endif
/* The most rows mt 3 serves (its second 16-row tile's last 8-row group left out). */
#define TDM_MM_HI24_ROWS 24
/* Whether the skinny kernel is built with an mt 3 (17-24 rows) for format fmt. */
#define TDM_MM_HI24_AT(fmt) \
    (((fmt) == TDM_MMF_NVFP4 && TDM_MM_HI24) || ((fmt) == TDM_MMF_FP8 && TDM_MM_HI24_FP8))
/* Whether fmt's mt 3 is also built staged (XS): FP8's; NVFP4's unstaged only (a staged NVFP4 launch at
 * 17-24 rows, where TDM_MM_XS builds one, runs mt 2). */
#define TDM_MM_HI24_XS(fmt) ((fmt) == TDM_MMF_FP8)
/* The kernel's mt for m rows of format fmt at table mt mt (tdm_mm_rows_mt), per lane from the copy
 * (xb_lane), staged by XS (xs) or not: 3 at 17-24 rows where TDM_MM_HI24_AT and TDM_MM_HI24_XS build
 * it, else mt. */
TDM_HD int tdm_mm_kernel_mt(int fmt, int mt, int64_t m, int xb_lane, int xs)
{
    return TDM_MM_HI24_AT(fmt) && mt == 2 && m <= TDM_MM_HI24_ROWS && xb_lane && (!xs || TDM_MM_HI24_XS(fmt)) ? 3 : mt;
}

/* Whether the kernels are built for (fmt, nt, mt, pf): a TDM_MM_VARIANTS entry, or FP8 nt 2 at pf 1
 * (per lane from the copy at 1-16 rows, else as nt 1: TDM_MM_FORM_NT). */
TDM_HD int tdm_mm_variant_built(int fmt, int nt, int mt, int pf)
{
    if (fmt == TDM_MMF_FP8 && nt == 2 && pf == 1) nt = 1;
#define TDM_MM_VARIANT_IS(F, NT, MT, PF) if (fmt == (F) && nt == (NT) && mt == (MT) && pf == (PF)) return 1;
    TDM_MM_VARIANTS(TDM_MM_VARIANT_IS)
#undef TDM_MM_VARIANT_IS
    return 0;
}

#define TDM_MM_SLAB_K 128     /* k per slab; also the FP8 scale block */
#define TDM_MM_CHUNK_K 32     /* k per lane chunk (four lane chunks make a slab) */
#define TDM_MM_STEPS 8        /* mma k16 steps per slab */
#define TDM_MM_UNITS 4        /* 16-byte activation units per lane chunk (two steps each) */
#define TDM_MM_AROW 20        /* activation row stride in shared memory, 16-byte units (16 used) */
#define TDM_MM_MAX_ROWS 32    /* the skinny kernels serve 1..32 rows */
#define TDM_MM_MAX_CHAINS 16  /* K is cut into 1..8 chains, or 10, 12, 14, 16 (tiles.c: plan) */

/* Bytes of one lane chunk of one weight row (32 k). */
TDM_HD int tdm_mm_chunk_bytes(int fmt)
{
    return fmt == TDM_MMF_NVFP4 ? 16 : fmt == TDM_MMF_FP8 ? 32 : 64;
}

/* The orders a weight's stored matrix can be held in for the skinny kernels' fast path and the wide
 * GEMM (tdm_dweight.order; tdm_dev_reorder makes the copy):
 *   ROWS   row by row, the checkpoint's order: rowbytes a row;
 *   TILES  tile-major: 16-row tiles (TDM_MM_TILE_ROWS), each tile's slabs one after another, the 16
 *          rows of a slab side by side: ((row / 16) * slabs + s) * 16 + row % 16, so that a warp's
 *          slab is one 1 KB run (NVFP4) and one slab to the next is a constant step (16 * 4 cb bytes;
 *          the stored rows a multiple of 16). NVFP4 (TDM_MM_NVFP4_TILES) and FP8 (TDM_MM_FP8_TILES). */
#define TDM_MM_ORDER_ROWS 0
#define TDM_MM_ORDER_TILES 2
#define TDM_MM_TILE_ROWS 16

/* TDM_MM_NVFP4_TILES (default 1): tile-major NVFP4 weights for the whole library: the upload
 * (kernels/matmul.cu) and the timing weight sets (tdm_wset_alloc) hold an NVFP4 matrix whose k is a
 * multiple of TDM_MM_SLAB_K and whose stored rows are a multiple of 16 in TDM_MM_ORDER_TILES
 * (tdm_dweight.order; tdm_dweight_order_for); the skinny kernels' fast path reads NVFP4 tiles with a
 * constant step (the other NVFP4 weights take the checked path, which reads either order and has no
 * SwiGLU form); the wide GEMM reads either order. The MoE experts keep rows (their own upload and
 * kernels). 0 holds every weight in rows (scripts/variant-build rows "-DTDM_MM_NVFP4_TILES=0" ..., for
 * the A/B). Measured against rows (bench/NOTES.md, the twenty-fourth session; H100, the SM clock at
 * 1980 MHz throughout both builds): a 27B token's NVFP4 products -1.1 to -1.9 / -4.3 to -5.4 / -5.8 to
 * -7.4 % at 1 / 16 / 32 rows, the 16-layer 27B's step -12 %, its 16- and 32-row rounds -15 and -14 %.
 * Traced by kernel (the twenty-fifth session), the step's gain is the MLP's products inside the engine
 * (the SwiGLU pair 47.1 -> 38.1 us a layer), which the lone timings barely show. Every t/gpu file passed
 * on this build on an H100 (sweep.t in the twenty-sixth session). */
#ifndef TDM_MM_NVFP4_TILES
#define TDM_MM_NVFP4_TILES 1
#endif
/* TDM_MM_FP8_TILES (default 1): the same tile-major order for block-FP8 weights, their codes (a slab
 * 128 bytes a row, so 2 KB a tile's slab; the block scales follow the output rows in blocks of 128,
 * which no tile crosses, so they stay as stored): upload, timing sets, the skinny kernels' fast and
 * checked paths and the wide GEMM, as for NVFP4; the FP8 weights that do not fit take the checked
 * path and have no SwiGLU form. 0 holds FP8 in rows (scripts/variant-build fp8r "-DTDM_MM_FP8_TILES=0"
 * ..., for the A/B). Measured against rows (bench/NOTES.md, the twenty-sixth session; H100): the
 * 16-layer FP8 27B's step 3.013-3.033 -> 2.817-2.823 ms (-6.6 %), its 16-row rounds 3.99-4.05 ->
 * 3.77-3.87, 32 rows within the noise; a 27B token's FP8 products alone -1 % at one row, -9 % at 16. */
#ifndef TDM_MM_FP8_TILES
#define TDM_MM_FP8_TILES 1
#endif
/* Whether this build holds weights of format fmt (TDM_MMF_*) tile-major where they fit (tdm_mm_tiles_fit). */
#define TDM_MM_TILES_FMT(fmt) ((TDM_MM_NVFP4_TILES && (fmt) == TDM_MMF_NVFP4) || (TDM_MM_FP8_TILES && (fmt) == TDM_MMF_FP8))
/* An NVFP4 row's slab: its group scales (one a TDM_NVFP4_GROUP of 16 k). */
#define TDM_MM_NVFP4_SLAB_GROUPS (TDM_MM_SLAB_K / 16)
/* In a tile-major matrix of slab_bytes a row's slab (4 tdm_mm_chunk_bytes: NVFP4 64, FP8 128), how far
 * byte `off` of a row (off as the row order counts it) lies from the row's first byte (tdm_mm_chunk_at of
 * slab 0, chunk 0), and in an NVFP4 one group scale g from the row's first (tdm_mm_scales_at of slab 0,
 * lane 0): what the wide GEMM reads a row by. */
TDM_HD int64_t tdm_mm_tile_byte_step(int64_t off, int64_t slab_bytes)
{
    return off / slab_bytes * (TDM_MM_TILE_ROWS * slab_bytes) + off % slab_bytes;
}
TDM_HD int64_t tdm_mm_tile_group_step(int64_t g)
{
    return g / TDM_MM_NVFP4_SLAB_GROUPS * (TDM_MM_TILE_ROWS * TDM_MM_NVFP4_SLAB_GROUPS) + g % TDM_MM_NVFP4_SLAB_GROUPS;
}
/* Whether a matrix of `rows` stored rows and k inputs can be held tile-major. */
TDM_HD int tdm_mm_tiles_fit(int64_t rows, int64_t k) { return k % TDM_MM_SLAB_K == 0 && rows % TDM_MM_TILE_ROWS == 0; }

/* Where lane chunk t (tdm_mm_chunk_bytes cb) of slab `slab` of stored row `row` lies, in bytes from
 * the stored matrix's start, in order `order` (rowbytes: the stored matrix's bytes a row).
 * tdm_mm_scales_at: the same for the NVFP4 group scales of lane t (2 bytes; 8 a slab, k / 16 a row).
 * One slab to the next: slab 1 of row 0, chunk 0. */
TDM_HD int64_t tdm_mm_chunk_at(int order, int64_t rowbytes, int cb, int64_t row, int64_t slab, int t)
{
    const int64_t slab_bytes = 4 * (int64_t)cb;
    if (order == TDM_MM_ORDER_TILES)
        return (((row / TDM_MM_TILE_ROWS) * (rowbytes / slab_bytes) + slab) * TDM_MM_TILE_ROWS + row % TDM_MM_TILE_ROWS) *
                   slab_bytes + t * cb;
    return row * rowbytes + slab * slab_bytes + t * cb;
}
TDM_HD int64_t tdm_mm_scales_at(int order, int64_t k, int64_t row, int64_t slab, int t)
{
    if (order == TDM_MM_ORDER_TILES)
        return (((row / TDM_MM_TILE_ROWS) * (k / TDM_MM_SLAB_K) + slab) * TDM_MM_TILE_ROWS + row % TDM_MM_TILE_ROWS) * 8 + 2 * t;
    return row * (k / 16) + slab * 8 + 2 * t;
}

/* The k (0..31, inside lane chunk t) that mma step s (0..7) takes for B register r (0: kappa
 * 2t, 2t+1; 1: kappa 2t+8, 2t+9) and half h (0 low, 1 high). The same k feeds A register r
 * (registers 0/1 for r = 0, 2/3 for r = 1) of the activation rows.
 *   NVFP4: the chunk is 16 bytes = 4 words; word w holds k = 8w .. 8w+7, nibble i = k 8w+i.
 *          The decoder pairs nibble j with nibble j+4 of a word (one multiply places both), so
 *          step s = 2w + p takes pairs (2p + r, 2p + r + 4) of word w.
 *   FP8:   the chunk is 32 bytes = 8 words; word w holds k = 4w .. 4w+3. The decoder takes the
 *          words of one unit (2u, 2u+1: k 8u .. 8u+7) in NVFP4's k order, so that the FP8 forms
 *          read the same activation units, the blocked copy (xb below) among them: one byte
 *          permute a pair of words (tdm_fp8_pair) puts bytes 0-1 of both words (k 8u+0, +1, +4,
 *          +5) in one word and bytes 2-3 in the other, then the placement pairs byte 0 with 2
 *          (B register 0) and 1 with 3 (register 1), as NVFP4 pairs nibbles j and j + 4.
 *          (Before, step s took word s alone, k 4s .. 4s+3: other sums inside an mma, so the
 *          FP8 products' bits changed with the order.)
 *   BF16:  the chunk is 64 bytes = 16 words; step s takes words 2s, 2s+1 as they are. */
/* Whether format fmt takes NVFP4's k order (below): NVFP4 and FP8. */
TDM_HD int tdm_mm_nvfp4_order(int fmt) { return fmt == TDM_MMF_NVFP4 || fmt == TDM_MMF_FP8; }
TDM_HD int tdm_mm_bk(int fmt, int s, int r, int h)
{
    if (tdm_mm_nvfp4_order(fmt)) return 8 * (s >> 1) + 2 * (s & 1) + r + 4 * h;
    return 4 * s + 2 * r + h;
}

/* Activation unit u (0..3) of lane chunk t holds the A registers of steps 2u and 2u+1 for one
 * row, as four 32-bit words: {A0(2u), A2(2u), A0(2u+1), A2(2u+1)} (A0 = kappa 2t.., A2 = kappa
 * 2t+8..). Its eight 16-bit slots q = 0..7 hold the activation at k = 32t + 8u + tdm_mm_unit_k(q):
 * the unit is one 16-byte load that yields four operand registers with no shuffling. */
TDM_HD int tdm_mm_unit_k(int fmt, int q)
{
    return tdm_mm_bk(fmt, q >> 2, (q >> 1) & 1, q & 1); /* step 2u + (q>>2), relative to 8u */
}

/* Permutes eight activations (four words as loaded, k ascending, low half first) into a unit. */
TDM_HD void tdm_mm_permute_unit(int fmt, const uint32_t in[4], uint32_t out[4])
{
#ifdef __CUDA_ARCH__
#pragma unroll
    for (int q = 0; q < 4; q++) {   // one byte permute a register (the indices fold at compile time)
        const int klo = tdm_mm_unit_k(fmt, 2 * q), khi = tdm_mm_unit_k(fmt, 2 * q + 1);
        const unsigned lo = 2 * (klo & 1), hi = 4 + 2 * (khi & 1);
        out[q] = __byte_perm(in[klo >> 1], in[khi >> 1], lo | (lo + 1) << 4 | hi << 8 | (hi + 1) << 12);
    }
#else
    for (int q = 0; q < 4; q++) {
        int klo = tdm_mm_unit_k(fmt, 2 * q), khi = tdm_mm_unit_k(fmt, 2 * q + 1);
        uint32_t lo = (in[klo >> 1] >> (16 * (klo & 1))) & 0xffffu;
        uint32_t hi = (in[khi >> 1] >> (16 * (khi & 1))) & 0xffffu;
        out[q] = lo | (hi << 16);
    }
#endif
}

/* The slot (0..7) of a unit that holds the activation at k offset e (0..7) from the unit's first
 * k: the inverse of tdm_mm_unit_k. NVFP4 in closed form (the kernels that write blocked copies
 * compute it per element): unit_k(q) = 2 (q >> 2) + ((q >> 1) & 1) + 4 (q & 1), so q's bits are
 * e's bits 1, 0, 2. */
TDM_HD int tdm_mm_unit_slot(int fmt, int e)
{
    if (tdm_mm_nvfp4_order(fmt)) return 4 * ((e >> 1) & 1) + 2 * (e & 1) + (e >> 2);
    for (int q = 0; q < 8; q++)
        if (tdm_mm_unit_k(fmt, q) == e) return q;
    return -1;
}

/* ---- the blocked activation copy (xb) ------------------------------------------------------------
 * The per-lane NVFP4 and FP8 forms (mm_skinny.cuh: DA; NVFP4 1-16 rows from x, 1-32 from the copy;
 * FP8 1-32 from the copy) read, for each unit
 * u of a slab, row g's 16 bytes at lane chunk t: from a row-major x, 8 rows x 4 chunks 64 bytes apart touch 16 lines of
 * 128 bytes a load and use half of each 32-byte sector, and each unit is permuted in registers (4
 * PRMT). The xb copy holds the same values with every unit already permuted (tdm_mm_permute_unit)
 * and the units a warp loads together side by side: unit u of lane chunk t of row r of slab S at
 * 16-byte position ((4 S + u) * TDM_MM_XB_ROWS + r) * 4 + t. A load of 8 rows is then 512
 * contiguous bytes and needs no permute. The kernels that write a product's input (the norms, the
 * attention output, SwiGLU) write this copy beside x when asked; it covers the full slabs of K
 * (k < 128 * (K / 128)); the last, partial slab is read from x. Room for TDM_MM_XB_ROWS rows
 * whatever the row count, so that the strides are constants. Measured on the H200 (bench/NOTES.md,
 * the blocked activation copies): a 27B token's NVFP4 products 8.00 -> 6.6 ms at 8 rows, 12.1 ->
 * 8.1 at 16. */
#define TDM_MM_XB_ROWS 32
/* XS: the per-lane forms from the blocked copy at mt >= TDM_MM_XS_MT (2, the default: 17-32 rows; 1:
 * 9-32; 0: 1-32: measured much slower for NVFP4 in an earlier form, a 27B token's products 6.92 -> 11.25 ms
 * at 16 rows and 6.12 -> 7.87 at one) take x's slabs into shared memory with bulk copies (cp.async.bulk, completion on an
 * mbarrier a stage), a ring of TDM_MM_XS_STAGES slabs a chain, the copy of a slab issued by one lane of
 * the chain's first warp a ring ahead of its use; every warp of the chain reads its units from there
 * (mm_skinny.cuh, XS). Otherwise each lane loads its units from global memory where the mma uses them.
 * The same values in the same mmas: the same bits.
 * TDM_MM_XS: 0 never, 1 (the default) FP8 only, 2 FP8 and NVFP4. Build-time knobs for A/B runs (the
 * launcher sizes the shared memory by them: tdm_mm_xs_smem). Measured on an H100 (bench/NOTES.md, x's
 * slabs by bulk copies), against 0 in the same call: a 27B token's FP8 products at 17 / 24 / 32 rows
 * 17.37-17.54 / 17.38-17.41 / 17.48-17.52 -> 16.96-17.00 / 16.93-16.96 / 17.06-17.08 ms (q_proj 50.3 ->
 * 36.0 us at 32 rows); NVFP4 shapes 3-9 % faster alone where it runs (the SwiGLU pair, q_proj, the 80B's
 * in_proj_qkvz) but the token in one graph 1-2 % slower (9.37-9.63 / 9.41-9.63 / 9.82-9.96 -> 9.50-9.54 /
 * 9.58-9.59 / 10.09-10.13), hence FP8 only. A kernel trace of that token's graph (bench/NOTES.md, the merged
 * build on the GPU) has the kernels' summed time unchanged and the graph's span 4 % longer: the XS kernels
 * lose the programmatic overlap with their neighbours; 2 stages and the largest carveout did not bring it back. */
#ifndef TDM_MM_XS
#define TDM_MM_XS 1
#endif
#ifndef TDM_MM_XS_MT
#define TDM_MM_XS_MT 2
#endif
/* Whether the per-lane form of format fmt from the blocked copy at mt stages x's slabs (XS). (A macro:
 * a constant expression in the kernel's template.) */
#define TDM_MM_XS_AT(fmt, mt) \
    ((TDM_MM_XS == 2 || (TDM_MM_XS == 1 && (fmt) == TDM_MMF_FP8)) && (mt) >= TDM_MM_XS_MT)
/* Whether a launch of wk chains of wn warps a CTA stages (XS at fmt, mt): only where a chain's warps
 * share the slabs (wn >= 2) and the CTA runs at most 2 chains (its rings 64 KB). With one warp a chain
 * the ring only hides latency, at the cost of the CTAs its shared memory keeps off the SM: the 27B's
 * NVFP4 wn 1 shapes (down_proj, out_proj, mtp.fc, in_proj_qkv; wk 4) at 32 rows took 31-56 % longer
 * with it on an H100. */
TDM_HD int tdm_mm_xs_runs(int fmt, int mt, int wn, int wk) { return TDM_MM_XS_AT(fmt, mt) && wn >= 2 && wk <= 2; }
/* Rows of a staged slab at mt (0: at most 8 rows, 1: 9-16, 2: 17-32, 3: 17-24) and its bytes: the copy's four
 * units of those rows (at 32 rows the copy's slab in one piece, else a piece a unit). */
#define TDM_MM_XS_ROWS(mt) ((mt) == 2 ? 32 : (mt) == 3 ? TDM_MM_HI24_ROWS : (mt) == 1 ? 16 : 8)
#define TDM_MM_XS_STAGE_BYTES(mt) (TDM_MM_UNITS * TDM_MM_XS_ROWS(mt) * TDM_MM_CHUNK_K * 2)
/* Stages (slabs) of a chain's ring. */
#define TDM_MM_XS_STAGES 4
/* Bytes of the rings' mbarriers (two a stage), rounded to 128: the rings follow them, and the
 * chains' partial sums (the tree) start there too once the K loop is done. */
TDM_HD int tdm_mm_xs_bar_bytes(int wk) { return (16 * wk * TDM_MM_XS_STAGES + 127) / 128 * 128; }
/* The dynamic shared memory of an XS launch of wk chains a CTA at mt whose tree needs tree bytes. */
TDM_HD size_t tdm_mm_xs_smem(int wk, int mt, size_t tree)
{
    const size_t ring = (size_t)wk * TDM_MM_XS_STAGES * TDM_MM_XS_STAGE_BYTES(mt);
    return (size_t)tdm_mm_xs_bar_bytes(wk) + (ring > tree ? ring : tree);
}
/* Whether the skinny kernels of format fmt read x's blocked copy where a caller gives one: the
 * formats in its unit order (tdm_mm_nvfp4_order). */
TDM_HD int tdm_mm_fmt_reads_xb(int fmt) { return tdm_mm_nvfp4_order(fmt); }
/* Elements of an xb copy for K inputs. */
TDM_HD int64_t tdm_mm_xb_elems(int64_t k) { return (int64_t)TDM_MM_XB_ROWS * (k / TDM_MM_SLAB_K) * TDM_MM_SLAB_K; }
/* Whether m rows of K inputs have an xb copy to read: 1..TDM_MM_XB_ROWS rows, and a full slab of K. */
TDM_HD int tdm_mm_xb_serves(int64_t m, int64_t k) { return m >= 1 && m <= TDM_MM_XB_ROWS && tdm_mm_xb_elems(k) > 0; }
/* The element of an xb copy that holds row `row` (< TDM_MM_XB_ROWS), k (< 128 * (K / 128)). */
TDM_HD int64_t tdm_mm_xb_index(int row, int64_t k)
{
    const int64_t unit = ((k / TDM_MM_SLAB_K) * TDM_MM_UNITS + (k / 8) % TDM_MM_UNITS) * TDM_MM_XB_ROWS + row;
    return (unit * 4 + (k / TDM_MM_CHUNK_K) % 4) * 8 + tdm_mm_unit_slot(TDM_MMF_NVFP4, (int)(k % 8));
}

/* ---- the core-matrix activation copy (xw) -------------------------------------------------------
 * A wgmma form (bench/probes/wgmma: the weights decoded into wgmma's A registers, 64 rows a warpgroup)
 * reads the activations as its B operand from shared memory, in wgmma's canonical K-major layout
 * without swizzle: core matrices of 8 activation rows x 8 kappa (16 bytes a row, 128 bytes a matrix),
 * 128 bytes apart along K and 256 along the rows. For ntok rows (8, 16 or 32: ntok / 8 row blocks nb)
 * the copy is, per slab S and step s (k16), the row blocks, each two halves kb (kappa 0-7, 8-15):
 * element ((((S * 8 + s) * (ntok / 8) + nb) * 2 + kb) * 8 + r) * 8 + q holds row 8 nb + r at the k that
 * lane chunk t = q / 2 feeds kappa 8 kb + q at step s (tdm_mm_bk, half q & 1), so that a slab is one
 * contiguous piece (ntok * 256 bytes) for one bulk copy. Covers the full slabs of K. */
/* The element of an xw copy of ntok rows that holds row `row` (< ntok), k (< 128 * (K / 128)). */
TDM_HD int64_t tdm_mm_xw_index(int ntok, int row, int64_t k)
{
    const int64_t S = k / TDM_MM_SLAB_K;
    const int t = (int)(k % TDM_MM_SLAB_K) / TDM_MM_CHUNK_K, e = (int)(k % TDM_MM_CHUNK_K);
    /* tdm_mm_bk (NVFP4 order) inverted: e = 8 (s >> 1) + 2 (s & 1) + kb + 4 h */
    const int s = 2 * (e >> 3) + ((e >> 1) & 1), kb = e & 1, h = (e >> 2) & 1;
    return ((((S * TDM_MM_STEPS + s) * (ntok / 8) + row / 8) * 2 + kb) * 8 + row % 8) * 8 + 2 * t + h;
}

/* Position (in 16-byte units) of activation row `row`, lane chunk t, unit u in one staged slab.
 * Units of one row are ordered (u, t) so that the 8 lanes of a quarter-warp (t = 0..3, two rows)
 * read 8 distinct 16-byte bank groups (row stride 20 units = 4 mod 8). */
TDM_HD int tdm_mm_apos(int row, int t, int u) { return row * TDM_MM_AROW + 4 * u + t; }

/* ---- decoders: bytes of a weight row -> BF16 operand registers -------------------------------- */

/* NVFP4 placement: pair j (0..3) of word q = nibbles j (low half) and j+4 (high half), each as the
 * BF16 whose bits 8..6 are the e2m1 magnitude bits and bit 15 its sign, i.e. e2m1 * 2^-126 (a BF16
 * subnormal for 0 and 0.5). One multiply copies the isolated nibble to bits 6..9 (magnitude) and
 * 12..15 (sign) of its half; a mask keeps the wanted bits. Pairs 2, 3 come from q >> 8. */
TDM_HD uint32_t tdm_nvfp4_place(uint32_t q, int j)
{
    uint32_t src = j < 2 ? q : q >> 8;
    uint32_t u = (j & 1) ? (src & 0x00F000F0u) : (src & 0x000F000Fu);
    uint32_t mul = (j & 1) ? 0x104u /* 2^2 + 2^8 */ : 0x1040u /* 2^6 + 2^12 */;
    return (u * mul) & 0x81C081C0u;
}

/* The packed order of an NVFP4 word (the device copy on sm_90: tdm_nvfp4_packed): the same 32 bits,
 * moved so that tdm_nvfp4_place_packed(tdm_nvfp4_pack(q), j) == tdm_nvfp4_place(q, j) for every j:
 * pair 0 is then p & mask, pair 2 the same of p rotated by 4, pairs 1 and 3 one multiply each of p
 * (of p rotated) whose two terms do not overlap: 9 integer operations for the four pairs instead of
 * 13 (no 4 rotations of the mask's bit set tile a word, and an exhaustive search of rotate, mask and
 * two-term multiply forms found none below 9). TDM_NVFP4_PACK_BIT[j][b]: where bit b of pair j's
 * two nibbles (b 0..3 nibble j, 4..7 nibble j + 4, each from its low bit) sits in the packed word. */
#define TDM_NVFP4_PACK_BIT                                                                                          \
    {{6, 7, 8, 15, 22, 23, 24, 31}, {0, 1, 5, 9, 16, 17, 21, 25}, {2, 3, 4, 11, 18, 19, 20, 27},                     \
     {28, 29, 30, 10, 12, 13, 14, 26}}
TDM_HD uint32_t tdm_nvfp4_pack(uint32_t q)
{
    const unsigned char at[4][8] = TDM_NVFP4_PACK_BIT;
    uint32_t p = 0;
    for (int j = 0; j < 4; j++)
        for (int b = 0; b < 8; b++) p |= (q >> (4 * (j + 4 * (b >> 2)) + (b & 3)) & 1u) << at[j][b];
    return p;
}
TDM_HD uint32_t tdm_nvfp4_unpack(uint32_t p)
{
    const unsigned char at[4][8] = TDM_NVFP4_PACK_BIT;
    uint32_t q = 0;
    for (int j = 0; j < 4; j++)
        for (int b = 0; b < 8; b++) q |= (p >> at[j][b] & 1u) << (4 * (j + 4 * (b >> 2)) + (b & 3));
    return q;
}
#define TDM_NVFP4_PLACE_MASK 0x81C081C0u
TDM_HD uint32_t tdm_nvfp4_rotl4(uint32_t x) { return x << 4 | x >> 28; }
/* The four pairs of packed word p, pair j into out[j]. */
TDM_HD void tdm_nvfp4_place_packed4(uint32_t p, uint32_t out[4])
{
#ifdef __CUDA_ARCH__
    /* one shf.l.wrap for pairs 2 and 3, out of the compiler's sight: from the shifts it makes pair 2's
     * a shift of its own (10 operations a word, seen in the SASS) */
    uint32_t r;
    asm("shf.l.wrap.b32 %0, %1, %1, 4;" : "=r"(r) : "r"(p));
#else
    const uint32_t r = tdm_nvfp4_rotl4(p);
#endif
    out[0] = p & TDM_NVFP4_PLACE_MASK;
    out[1] = ((p & 0x02230223u) * 72u /* 2^3 + 2^6 */) & TDM_NVFP4_PLACE_MASK;
    out[2] = r & TDM_NVFP4_PLACE_MASK;
    out[3] = ((r & 0x40074007u) * 66u /* 2^1 + 2^6 */) & TDM_NVFP4_PLACE_MASK;
}
/* Pair j alone (the tests; the kernels place a word's four pairs at once). */
TDM_HD uint32_t tdm_nvfp4_place_packed(uint32_t p, int j)
{
    uint32_t out[4];
    tdm_nvfp4_place_packed4(p, out);
    return out[j & 3];
}

/* The NVFP4 kernels multiply the placed e2m1 (x 2^-126) by the group scale x 2^119 in BF16, so a
 * weight operand is e2m1 * scale * 2^-7 (exact: at most 6 significant bits, in BF16's normal range)
 * and the FP32 sum is multiplied by scale_2 * 2^7 at the end. */
#define TDM_NVFP4_SCALE_EXP 119
#define TDM_NVFP4_OUT_EXP 7

/* FP8 placement: register r of word q = bytes (r, r+2), each as the BF16 whose bits 10..4 are the
 * e4m3 magnitude bits and bit 15 its sign, i.e. e4m3 * 2^-120; the kernels multiply by 2^120 in
 * BF16 (exact) to get the code's value. */
TDM_HD uint32_t tdm_fp8_place(uint32_t q, int r)
{
    if (r == 0) return ((q << 8) & 0x80008000u) | ((q << 4) & 0x07F007F0u);
    return (q & 0x80008000u) | ((q >> 4) & 0x07F007F0u);
}
#define TDM_FP8_UNPLACE 0x7B807B80u /* BF16x2 of 2^120 */
/* The pair word j (0, 1) of FP8 words w0, w1 (k 8u .. 8u+3 and 8u+4 .. 8u+7 of one unit): bytes
 * 2j, 2j+1 of w0, then bytes 2j, 2j+1 of w1, i.e. k 8u + 2j, + 2j+1, + 2j+4, + 2j+5; placed
 * (tdm_fp8_place) into the B registers of step 2u + j (tdm_mm_bk). One PRMT on the device. */
TDM_HD uint32_t tdm_fp8_pair(uint32_t w0, uint32_t w1, int j)
{
#ifdef __CUDA_ARCH__
    return __byte_perm(w0, w1, j ? 0x7632 : 0x5410);
#else
    return j ? (w0 >> 16) | (w1 & 0xffff0000u) : (w0 & 0xffffu) | (w1 << 16);
#endif
}

/* ---- the split of K -------------------------------------------------------------------------- */
/* K is cut into kchains chains of chain_len = ceil(slabs / kchains) slabs: chain c takes slabs
 * [c * chain_len, (c + 1) * chain_len) below `slabs` (the last chains may be short or empty).
 * Chains are summed as a balanced binary tree over chain index: level by level, chain i (i a
 * multiple of 2*step) adds chain i+step when there is one (kchains need not be a power of two). A CTA that holds an aligned block of chains adds the lower
 * levels; the cluster adds the rest: the same tree whatever the split over warps and CTAs. */
#endif
