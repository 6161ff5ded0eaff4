/* The skinny matrix kernels' index mapping, emulated on the CPU with the kernels' own functions
 * (kernels/mm_layout.h): which lane loads which bytes of a weight row, the decoders, the K
 * permutation shared by the B registers and the staged activations, the mma.m16n8k16 fragment
 * layouts (PTX ISA), the chains of K and their sum, and which CTA writes which output. Each
 * emulated product must equal tdm_linear_ref within FP32 rounding (relative 2e-5 of the row's
 * sum of |x w|): a wrong mapping misses by O(1). */
#include "formats.h"
#include "linear.h"
#include "mm_layout.h"
#include "tap.h"
#include "tiles.h"
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x243f6a8885a308d3ull;
static uint64_t next(void)
{
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return rng;
}
static float frand(void) { return (float)((next() >> 40) & 0xffffff) / 8388608.0f - 1.0f; }

/* ---- host stand-ins for the two device instructions the decoders use ---- */
static float bf16f(uint32_t h) { return tdm_bf16_to_f32((uint16_t)h); }
/* mul.rn.bf16x2 (subnormal inputs kept, round to nearest even) */
static uint32_t bmul(uint32_t a, uint32_t b)
{
    uint32_t lo = tdm_f32_to_bf16(bf16f(a & 0xffff) * bf16f(b & 0xffff));
    uint32_t hi = tdm_f32_to_bf16(bf16f(a >> 16) * bf16f(b >> 16));
    return lo | (hi << 16);
}
/* NVFP4 group multiplier as the sm_90 kernel makes it: BF16 of scale * 2^119, in both halves */
static uint32_t nvfp4_mult(uint8_t code)
{
    uint32_t b = tdm_f32_to_bf16(ldexpf(tdm_e4m3_to_f32(code), TDM_NVFP4_SCALE_EXP));
    return b | (b << 16);
}

/* ---- decoders, exhaustively ---- */
static void test_decoders(void)
{
    int bad = 0;
    for (int sc = 0; sc < 256; sc++) {
        if ((sc & 0x7f) == 0x7f) continue; /* NaN scales */
        uint32_t mult = nvfp4_mult((uint8_t)sc);
        for (int pos = 0; pos < 8; pos++)
            for (int nib = 0; nib < 16; nib++) {
                uint32_t q = (uint32_t)nib << (4 * pos) | (uint32_t)(next() & 0xffffffffu & ~(0xfu << (4 * pos)));
                int j = pos & 3, half = pos >> 2;
                uint32_t b = bmul(tdm_nvfp4_place(q, j), mult);
                float got = bf16f(half ? b >> 16 : b & 0xffff);
                float want = ldexpf(tdm_e2m1_to_f32((uint8_t)nib) * tdm_e4m3_to_f32((uint8_t)sc), -TDM_NVFP4_OUT_EXP);
                if (got != want || signbit(got) != signbit(want)) bad++;
            }
    }
    ok(bad == 0, "NVFP4 placement x scale = e2m1 * e4m3 * 2^-7 exactly, every nibble, position and scale (%d bad)", bad);

    /* the packed word order (sm_90's device copy): every single bit, then random words */
    bad = 0;
    int inv_bad = 0;
    for (int it = 0; it < 32 + 200000; it++) {
        const uint32_t q = it < 32 ? 1u << it : (uint32_t)next();
        const uint32_t p = tdm_nvfp4_pack(q);
        if (tdm_nvfp4_unpack(p) != q) inv_bad++;
        for (int j = 0; j < 4; j++)
            if (tdm_nvfp4_place_packed(p, j) != tdm_nvfp4_place(q, j)) bad++;
    }
    ok(bad == 0, "NVFP4 packed order: placing pair j of pack(q) gives pair j of q, every bit and 200000 random words (%d bad)",
       bad);
    ok(inv_bad == 0, "NVFP4 packed order: unpack(pack(q)) = q (%d bad)", inv_bad);

    bad = 0;
    for (int code = 0; code < 256; code++) {
        if ((code & 0x7f) == 0x7f) continue;
        for (int pos = 0; pos < 4; pos++) {
            uint32_t q = (uint32_t)code << (8 * pos) | (uint32_t)(next() & ~(0xffull << (8 * pos)));
            int r = pos & 1, half = pos >> 1;
            uint32_t b = bmul(tdm_fp8_place(q, r), TDM_FP8_UNPLACE);
            float got = bf16f(half ? b >> 16 : b & 0xffff), want = tdm_e4m3_to_f32((uint8_t)code);
            if (got != want || signbit(got) != signbit(want)) bad++;
        }
    }
    ok(bad == 0, "FP8 placement x 2^120 = the e4m3 value exactly, every code and byte position (%d bad)", bad);

    const int fmts[3] = {TDM_MMF_NVFP4, TDM_MMF_FP8, TDM_MMF_BF16};
    for (int f = 0; f < 3; f++) {
        int seen[32] = {0}, perm_ok = 1;
        for (int s = 0; s < TDM_MM_STEPS / 2 * 2; s++)
            for (int r = 0; r < 2; r++)
                for (int h = 0; h < 2; h++) {
                    int k = tdm_mm_bk(fmts[f], s, r, h);
                    if (k < 0 || k >= 32) perm_ok = 0; else seen[k]++;
                    /* step s takes k from unit s/2: the A unit and the B chunk agree */
                    if (k / 8 != s / 2) perm_ok = 0;
                }
        for (int k = 0; k < 32; k++) if (seen[k] != 1) perm_ok = 0;
        ok(perm_ok, "fmt %d: the 8 steps x 2 registers x 2 halves take each k of a lane chunk once", fmts[f]);
        uint32_t in[4], out[4];
        for (int i = 0; i < 4; i++) in[i] = (uint32_t)(2 * i) | (uint32_t)(2 * i + 1) << 16;
        tdm_mm_permute_unit(fmts[f], in, out);
        int unit_ok = 1;
        for (int q = 0; q < 8; q++)
            if (((out[q >> 1] >> (16 * (q & 1))) & 0xffff) != (uint32_t)tdm_mm_unit_k(fmts[f], q)) unit_ok = 0;
        ok(unit_ok, "fmt %d: the staged unit holds activation k = unit_k(slot) in every slot", fmts[f]);
    }
    /* conflict-free A reads: a quarter-warp (lanes 8i..8i+7: rows g = 2i, 2i+1, t = 0..3) hits 8
     * distinct 16-byte bank groups for every unit */
    int conflict = 0;
    for (int u = 0; u < 4; u++)
        for (int qw = 0; qw < 4; qw++) {
            int used[8] = {0};
            for (int l = 8 * qw; l < 8 * qw + 8; l++) used[tdm_mm_apos(l >> 2, l & 3, u) % 8]++;
            for (int b = 0; b < 8; b++) if (used[b] != 1) conflict = 1;
        }
    ok(!conflict, "activation fragment loads are free of shared-memory bank conflicts");

    /* the blocked copy (xb): unit_slot inverts unit_k, and the index is a bijection onto the copy */
    int slot_ok = 1;
    for (int f = 0; f < 3; f++)
        for (int q = 0; q < 8; q++)
            if (tdm_mm_unit_slot(fmts[f], tdm_mm_unit_k(fmts[f], q)) != q) slot_ok = 0;
    ok(slot_ok, "unit_slot is the inverse of unit_k (every format)");
    const int64_t K = 3 * TDM_MM_SLAB_K + 64, n = tdm_mm_xb_elems(K);
    int *hit = calloc((size_t)n, sizeof *hit), bij = n == TDM_MM_XB_ROWS * 3 * TDM_MM_SLAB_K;
    for (int r = 0; r < TDM_MM_XB_ROWS; r++)
        for (int64_t k = 0; k < K / TDM_MM_SLAB_K * TDM_MM_SLAB_K; k++) {
            const int64_t i = tdm_mm_xb_index(r, k);
            if (i < 0 || i >= n) bij = 0; else hit[i]++;
        }
    for (int64_t i = 0; i < n; i++) if (hit[i] != 1) bij = 0;
    free(hit);
    ok(bij, "the blocked copy's index takes each element of its %lld once (16 rows, the full slabs of k = %lld)",
       (long long)n, (long long)K);

    /* the core-matrix copy (xw): for 8, 16 and 32 rows a bijection onto ntok x the full slabs, and each
     * core matrix's row holds, at kappa 8 kb + q of step s, the k that tdm_mm_bk gives lane chunk q / 2 */
    for (int ntok = 8; ntok <= 32; ntok *= 2) {
        const int64_t full = K / TDM_MM_SLAB_K * TDM_MM_SLAB_K, nx = ntok * full;
        int *xhit = calloc((size_t)nx, sizeof *xhit), xbij = 1, xmap = 1;
        for (int r = 0; r < ntok; r++)
            for (int64_t k = 0; k < full; k++) {
                const int64_t i = tdm_mm_xw_index(ntok, r, k);
                if (i < 0 || i >= nx) xbij = 0; else xhit[i]++;
            }
        for (int64_t i = 0; i < nx; i++) if (xhit[i] != 1) xbij = 0;
        free(xhit);
        for (int64_t S = 0; S < K / TDM_MM_SLAB_K; S++)
            for (int st = 0; st < TDM_MM_STEPS; st++)
                for (int r = 0; r < ntok; r++)
                    for (int kb = 0; kb < 2; kb++)
                        for (int q = 0; q < 8; q++) {
                            const int64_t k = S * TDM_MM_SLAB_K + TDM_MM_CHUNK_K * (q >> 1) + tdm_mm_bk(TDM_MMF_NVFP4, st, kb, q & 1);
                            const int64_t want = ((((S * TDM_MM_STEPS + st) * (ntok / 8) + r / 8) * 2 + kb) * 8 + r % 8) * 8 + q;
                            if (tdm_mm_xw_index(ntok, r, k) != want) xmap = 0;
                        }
        ok(xbij && xmap, "the core-matrix copy of %d rows: each element once, kappa 8 kb + q of step s at lane chunk q / 2's k", ntok);
    }
}

/* ---- the whole kernel, lane by lane ---- */
struct weight {
    struct tdm_qweight q;
    uint8_t *w, *scale;
};

static void make_weight(struct weight *W, int fmt, int64_t rows, int64_t k, enum tdm_dtype sdt)
{
    float *f = malloc(sizeof *f * rows * k);
    for (int64_t i = 0; i < rows * k; i++) f[i] = frand() * (1.0f + (float)(i % 5));
    memset(W, 0, sizeof *W);
    W->q.fmt = fmt;
    W->q.n = rows;
    W->q.k = k;
    W->q.scale_dt = sdt;
    if (fmt == TDM_W_NVFP4) {
        W->w = malloc(rows * k / 2);
        W->scale = malloc(rows * k / 16);
        tdm_nvfp4_quantize(f, rows, k, 0.0f, W->w, W->scale, &W->q.scale2);
    } else if (fmt == TDM_W_FP8) {
        int64_t nb = ((rows + 127) / 128) * ((k + 127) / 128);
        W->w = malloc(rows * k);
        W->scale = malloc(nb * 4);
        tdm_fp8_quantize(f, rows, k, 0, W->w, W->scale, sdt);
    } else {
        W->w = malloc(rows * k * 2);
        uint16_t *b = (uint16_t *)W->w;
        for (int64_t i = 0; i < rows * k; i++) b[i] = tdm_f32_to_bf16(f[i]);
    }
    W->q.w = W->w;
    W->q.scale = W->scale;
    free(f);
}

static int bytes_per_k_num(int fmt) { return fmt == TDM_W_BF16 ? 2 : 1; }
static int bytes_per_k_den(int fmt) { return fmt == TDM_W_NVFP4 ? 2 : 1; }

/* Lane chunk t of slab `slab` of stored row `srow`, as the kernel loads it (zero past the row), from
 * the stored matrix w (q->n rows) and its scales in order `order` (mm_layout.h: tdm_mm_chunk_at). */
static void load_chunk(const struct tdm_qweight *q, const uint8_t *w, const uint8_t *scale, int order,
                       int64_t srow, int slab, int t, uint32_t *words, uint32_t *sc_nv)
{
    const int fmt = q->fmt, cb = tdm_mm_chunk_bytes(fmt);
    const int64_t rowbytes = q->k * bytes_per_k_num(fmt) / bytes_per_k_den(fmt);
    const int64_t off = (int64_t)slab * 4 * cb + (int64_t)t * cb;   /* in the row */
    const uint8_t *p = w + tdm_mm_chunk_at(order, rowbytes, cb, srow, slab, t);
    for (int i = 0; i < cb / 4; i++) {
        uint32_t v = 0;
        for (int b = 0; b < 4; b++)
            if (off + 4 * i + b < rowbytes) v |= (uint32_t)p[4 * i + b] << (8 * b);
        words[i] = v;
    }
    if (fmt == TDM_W_NVFP4) {
        const int64_t sr = q->k / 16, so = (int64_t)slab * 8 + 2 * t;
        const uint8_t *s = scale + tdm_mm_scales_at(order, q->k, srow, slab, t);
        *sc_nv = (so < sr ? s[0] : 0u) | (so + 1 < sr ? (uint32_t)s[1] << 8 : 0u);
    }
}

/* B registers of steps 2u, 2u+1 (as bregs() in mm_skinny.cuh, sm_90 path) */
static void bregs(int fmt, const uint32_t *w, uint32_t sc_nv, int u, uint32_t b[4])
{
    if (fmt == TDM_W_NVFP4) {
        uint32_t mult = nvfp4_mult((uint8_t)(u < 2 ? sc_nv & 0xff : sc_nv >> 8));
        for (int j = 0; j < 4; j++) b[j] = bmul(tdm_nvfp4_place(w[u], j), mult);
    } else if (fmt == TDM_W_FP8) {
        const uint32_t p0 = tdm_fp8_pair(w[2 * u], w[2 * u + 1], 0), p1 = tdm_fp8_pair(w[2 * u], w[2 * u + 1], 1);
        b[0] = bmul(tdm_fp8_place(p0, 0), TDM_FP8_UNPLACE);
        b[1] = bmul(tdm_fp8_place(p0, 1), TDM_FP8_UNPLACE);
        b[2] = bmul(tdm_fp8_place(p1, 0), TDM_FP8_UNPLACE);
        b[3] = bmul(tdm_fp8_place(p1, 1), TDM_FP8_UNPLACE);
    } else {
        for (int j = 0; j < 4; j++) b[j] = w[4 * u + j];
    }
}

/* mma.m16n8k16: assemble A (16x16) and B (16x8) from 32 lanes' registers by the PTX layouts, add
 * A*B into C (16x8, double). */
static void mma(double C[16][8], uint32_t areg[32][4], uint32_t breg[32][2])
{
    double A[16][16], B[16][8];
    for (int lane = 0; lane < 32; lane++) {
        int g = lane >> 2, t = lane & 3;
        for (int h = 0; h < 2; h++) {
            A[g][2 * t + h] = bf16f(areg[lane][0] >> (16 * h) & 0xffff);
            A[g + 8][2 * t + h] = bf16f(areg[lane][1] >> (16 * h) & 0xffff);
            A[g][2 * t + 8 + h] = bf16f(areg[lane][2] >> (16 * h) & 0xffff);
            A[g + 8][2 * t + 8 + h] = bf16f(areg[lane][3] >> (16 * h) & 0xffff);
            B[2 * t + h][g] = bf16f(breg[lane][0] >> (16 * h) & 0xffff);
            B[2 * t + 8 + h][g] = bf16f(breg[lane][1] >> (16 * h) & 0xffff);
        }
    }
    for (int r = 0; r < 16; r++)
        for (int n = 0; n < 8; n++) {
            double s = 0;
            for (int kk = 0; kk < 16; kk++) s += A[r][kk] * B[kk][n];
            C[r][n] += s;
        }
}

struct emul_case {
    int fmt;
    int64_t rows, k, row0, n;  /* stored rows; the view [row0, row0+n) */
    enum tdm_dtype sdt;
    int chains;                /* kchains (the emulation may use any) */
    struct tdm_tile_geom tile; /* nt, wn, wk, cs, pf (the chains above) */
    int order;                 /* the weights' order (mm_layout.h: TDM_MM_ORDER_*; tile-major as the
                                  upload holds NVFP4 with TDM_MM_NVFP4_TILES, from a copy) */
};

/* The copy of a stored matrix (k a multiple of 128) in `order`, chunk by chunk from where the stored
 * order has it to where tdm_mm_chunk_at / tdm_mm_scales_at put it, as tdm_dev_reorder copies it. */
static void order_copy(const struct weight *W, int order, uint8_t **codes, uint8_t **scales)
{
    const int fmt = W->q.fmt, cb = tdm_mm_chunk_bytes(fmt);
    const int64_t n = W->q.n, k = W->q.k, rowbytes = k * bytes_per_k_num(fmt) / bytes_per_k_den(fmt);
    *codes = malloc((size_t)(n * rowbytes));
    *scales = fmt == TDM_W_NVFP4 ? malloc((size_t)(n * k / 16)) : NULL;
    for (int64_t r = 0; r < n; r++)
        for (int64_t sl = 0; sl < k / TDM_MM_SLAB_K; sl++)
            for (int t = 0; t < 4; t++) {
                memcpy(*codes + tdm_mm_chunk_at(order, rowbytes, cb, r, sl, t),
                       W->w + tdm_mm_chunk_at(TDM_MM_ORDER_ROWS, rowbytes, cb, r, sl, t), (size_t)cb);
                if (*scales)
                    memcpy(*scales + tdm_mm_scales_at(order, k, r, sl, t),
                           W->scale + tdm_mm_scales_at(TDM_MM_ORDER_ROWS, k, r, sl, t), 2);
            }
}

/* Whether the kernel feeds the weights as the mma's A operand (mm_skinny.cuh: SWAP, the per-lane
 * NVFP4 form at most 8 rows, and at 9-32 rows from the blocked copy with nt 2, tiles in pairs): A =
 * two n8-tiles' B registers, B = the activation row's unit (each further 8 rows another mma: rows
 * 16 mt + 8 h into the pair's accumulators [np + h][mt]), C transposed. The emulation of that form
 * reads the full slabs' units from a blocked copy (mm_layout.h: xb) built element by element with
 * tdm_mm_xb_index, at the kernel's addresses. */
static int swap_form(const struct emul_case *c, int m)
{
    return c->fmt == TDM_W_NVFP4 && c->tile.nt % 2 == 0 && (m <= 8 || c->tile.nt == 2);
}

/* Runs the kernel's work split for m rows (swap: the A-operand form, where swap_form allows it);
 * returns the worst error relative to the row's sum of |x w| and counts outputs written (each must
 * be written exactly once). */
static double emulate(const struct emul_case *c, const struct weight *W, const float *x, int m, int swap, int *written_ok)
{
    const int fmt = c->fmt, N = (int)c->n, K = (int)c->k, NT = c->tile.nt, WN = c->tile.wn, WK = c->tile.wk;
    const int CS = c->chains / WK, MT = m <= 16 ? 1 : 2, ROWS = 16 * MT, cols = 8 * NT * WN;
    const int slabs = (K + TDM_MM_SLAB_K - 1) / TDM_MM_SLAB_K, L = (slabs + c->chains - 1) / c->chains;
    struct tdm_qweight view = tdm_qweight_rows(&W->q, c->row0, c->n);
    const float out_scale = fmt == TDM_W_NVFP4 ? view.scale2 * (float)(1 << TDM_NVFP4_OUT_EXP) : 1.0f;
    uint8_t *wcodes = W->w, *wscales = W->scale;
    if (c->order != TDM_MM_ORDER_ROWS) order_copy(W, c->order, &wcodes, &wscales);
    double *y = calloc((size_t)m * N, sizeof *y);
    int *writes = calloc((size_t)m * N, sizeof *writes);
    uint32_t *units = malloc(sizeof *units * 4 * ROWS * TDM_MM_AROW);   /* one staged slab */
    /* swap: the blocked copy of x, element by element (what the kernels that write x write) */
    const int64_t kf = (int64_t)K / TDM_MM_SLAB_K * TDM_MM_SLAB_K;
    uint16_t *xb = calloc((size_t)tdm_mm_xb_elems(K) + 1, sizeof *xb);
    if (swap)
        for (int r = 0; r < m; r++)
            for (int64_t kk = 0; kk < kf; kk++) xb[tdm_mm_xb_index(r, kk)] = tdm_f32_to_bf16(x[r * K + kk]);
    const int nblocks = (N + cols - 1) / cols;
    for (int bx = 0; bx < nblocks; bx++) {
        double *part = calloc((size_t)c->chains * ROWS * cols, sizeof *part); /* red[chain][row][col] */
        for (int rank = 0; rank < CS; rank++)
            for (int wk = 0; wk < WK; wk++)
                for (int wn = 0; wn < WN; wn++) {
                    const int chain = rank * WK + wk, wcol = bx * cols + wn * 8 * NT;
                    double acc[4][2][16][8];   /* swap: acc[np + h][mt] holds the pair np, np + 1 for rows 16 mt + 8 h.. (C transposed) */
                    memset(acc, 0, sizeof acc);
                    for (int i = 0; i < L; i++) {
                        const int slab = chain * L + i;
                        if (slab >= slabs) break;
                        /* stage the slab: row r, chunk cc (8 k) -> unit (cc>>2, cc&3), permuted */
                        memset(units, 0, sizeof *units * 4 * ROWS * TDM_MM_AROW);
                        for (int r = 0; r < m; r++)
                            for (int cc = 0; cc < 16; cc++) {
                                uint32_t in[4] = {0, 0, 0, 0}, out[4];
                                for (int e = 0; e < 8; e++) {
                                    int64_t kk = (int64_t)slab * 128 + 8 * cc + e;
                                    uint32_t b = kk < K ? tdm_f32_to_bf16(x[r * K + kk]) : 0;
                                    in[e >> 1] |= b << (16 * (e & 1));
                                }
                                tdm_mm_permute_unit(fmt, in, out);
                                memcpy(&units[4 * tdm_mm_apos(r, cc >> 2, cc & 3)], out, 16);
                            }
                        /* each tile's lane chunks of the slab: lane (g, t) loads chunk t of weight row g */
                        static uint32_t words[4][32][16], scnv[4][32];
                        for (int nt = 0; nt < NT; nt++)
                            for (int lane = 0; lane < 32; lane++) {
                                int g = lane >> 2, t = lane & 3;
                                int brow = wcol + 8 * nt + g < N ? wcol + 8 * nt + g : N - 1;
                                load_chunk(&W->q, wcodes, wscales, c->order, c->row0 + brow, slab, t, words[nt][lane],
                                           &scnv[nt][lane]);
                            }
                        if (swap) {   /* one mma a pair of tiles and step: A the two tiles' B registers, B row g's unit */
                            for (int np = 0; np < NT; np += 2)
                                for (int u = 0; u < 4; u++) {
                                    uint32_t b0[32][4], b1[32][4];
                                    for (int lane = 0; lane < 32; lane++) {
                                        bregs(fmt, words[np][lane], scnv[np][lane], u, b0[lane]);
                                        bregs(fmt, words[np + 1][lane], scnv[np + 1][lane], u, b1[lane]);
                                    }
                                    for (int mt = 0; mt < MT; mt++)
                                    for (int h = 0; h < (m <= 8 ? 1 : 2); h++)   /* activation rows 16 mt + 8 h + g */
                                    for (int st = 0; st < 2; st++) {
                                        uint32_t areg[32][4], breg[32][2];
                                        for (int lane = 0; lane < 32; lane++) {
                                            int g = lane >> 2, t = lane & 3, row = 16 * mt + 8 * h + g;
                                            if (row >= m) row = m - 1;
                                            uint32_t xu[4];   /* the full slabs from the blocked copy, as the kernel reads it */
                                            const uint32_t *u0 = &units[4 * tdm_mm_apos(row, t, u)];
                                            if (slab < kf / TDM_MM_SLAB_K) {
                                                memcpy(xu, xb + (((int64_t)slab * 4 + u) * TDM_MM_XB_ROWS + row) * 32 + 8 * t, 16);
                                                u0 = xu;
                                            }
                                            areg[lane][0] = b0[lane][2 * st];     /* weight row g of tile np, kappa lo */
                                            areg[lane][1] = b1[lane][2 * st];     /* of tile np + 1 */
                                            areg[lane][2] = b0[lane][2 * st + 1]; /* kappa hi */
                                            areg[lane][3] = b1[lane][2 * st + 1];
                                            breg[lane][0] = u0[2 * st];           /* activation row 8h + g, kappa lo */
                                            breg[lane][1] = u0[2 * st + 1];       /* kappa hi */
                                        }
                                        mma(acc[np + h][mt], areg, breg);
                                    }
                                }
                            continue;
                        }
                        for (int nt = 0; nt < NT; nt++) {
                            double blk[2][16][8];
                            memset(blk, 0, sizeof blk);
                            for (int u = 0; u < 4; u++) {
                                uint32_t b[32][4];
                                for (int lane = 0; lane < 32; lane++) bregs(fmt, words[nt][lane], scnv[nt][lane], u, b[lane]);
                                for (int mt = 0; mt < MT; mt++)
                                    for (int st = 0; st < 2; st++) {
                                        uint32_t areg[32][4], breg[32][2];
                                        for (int lane = 0; lane < 32; lane++) {
                                            int g = lane >> 2, t = lane & 3;
                                            const uint32_t *u0 = &units[4 * tdm_mm_apos(16 * mt + g, t, u)];
                                            const uint32_t *u1 = &units[4 * tdm_mm_apos(16 * mt + 8 + g, t, u)];
                                            areg[lane][0] = u0[2 * st];     /* row g, kappa lo  */
                                            areg[lane][1] = u1[2 * st];     /* row g+8          */
                                            areg[lane][2] = u0[2 * st + 1]; /* row g, kappa hi  */
                                            areg[lane][3] = u1[2 * st + 1];
                                            breg[lane][0] = b[lane][2 * st];
                                            breg[lane][1] = b[lane][2 * st + 1];
                                        }
                                        mma(fmt == TDM_W_FP8 ? blk[mt] : acc[nt][mt], areg, breg);
                                    }
                            }
                            if (fmt == TDM_W_FP8) /* the block scale onto the block's partial sums, per C column */
                                for (int mt = 0; mt < MT; mt++)
                                    for (int r = 0; r < 16; r++)
                                        for (int n = 0; n < 8; n++) {
                                            int col = wcol + 8 * nt + n < N ? wcol + 8 * nt + n : N - 1;
                                            int64_t si = ((c->row0 + col) >> 7) * slabs + slab;
                                            acc[nt][mt][r][n] += blk[mt][r][n] * tdm_scale_at(W->scale, c->sdt, si);
                                        }
                        }
                    }
                    /* the epilogue's fragment stores: lane (g,t) holds C[g][2t..], C[g+8][2t..]; swap: the
                     * weight row g of tiles np and np + 1 for activation rows 16 mt + 8 h + 2t, + 1 */
                    if (swap)
                        for (int np = 0; np < NT; np += 2)
                            for (int mt = 0; mt < MT; mt++)
                            for (int h = 0; h < (m <= 8 ? 1 : 2); h++)
                                for (int lane = 0; lane < 32; lane++) {
                                    int g = lane >> 2, t = lane & 3, col = wn * 8 * NT + 8 * np + g, r = 16 * mt + 8 * h + 2 * t;
                                    for (int e = 0; e < 2; e++) {
                                        part[((size_t)chain * ROWS + r + e) * cols + col] = acc[np + h][mt][g][2 * t + e];
                                        part[((size_t)chain * ROWS + r + e) * cols + col + 8] = acc[np + h][mt][g + 8][2 * t + e];
                                    }
                                }
                    else
                    for (int nt = 0; nt < NT; nt++)
                        for (int mt = 0; mt < MT; mt++)
                            for (int lane = 0; lane < 32; lane++) {
                                int g = lane >> 2, t = lane & 3, col = wn * 8 * NT + 8 * nt + 2 * t;
                                for (int e = 0; e < 2; e++) {
                                    part[((size_t)chain * ROWS + 16 * mt + g) * cols + col + e] = acc[nt][mt][g][2 * t + e];
                                    part[((size_t)chain * ROWS + 16 * mt + g + 8) * cols + col + e] = acc[nt][mt][g + 8][2 * t + e];
                                }
                            }
                }
        /* tree over chains (order is immaterial in double; every chain must be added once) */
        for (int step = 1; step < c->chains; step <<= 1)
            for (int ch = 0; ch + step < c->chains; ch += 2 * step)
                for (int e = 0; e < ROWS * cols; e++) part[(size_t)ch * ROWS * cols + e] += part[(size_t)(ch + step) * ROWS * cols + e];
        for (int r = 0; r < m; r++)
            for (int cc = 0; cc < cols; cc++) {
                int n = bx * cols + cc;
                if (n >= N) continue;
                y[r * N + n] = (float)part[r * cols + cc] * out_scale;
                writes[r * N + n]++;
            }
        free(part);
    }
    /* against the reference */
    float *ref = malloc(sizeof *ref * m * N), *row = malloc(sizeof *row * K);
    double *mag = calloc((size_t)m * N, sizeof *mag);
    tdm_linear_ref(&view, x, m, ref);
    for (int n = 0; n < N; n++) {
        tdm_qweight_row(&view, n, row);
        for (int r = 0; r < m; r++)
            for (int kk = 0; kk < K; kk++) mag[r * N + n] += fabs((double)x[r * K + kk] * row[kk]);
    }
    double worst = 0;
    *written_ok = 1;
    for (int i = 0; i < m * N; i++) {
        double e = fabs(y[i] - ref[i]) / (mag[i] + 1e-30);
        if (!(e <= worst)) worst = e; /* NaN counts as worst */
        if (writes[i] != 1) *written_ok = 0;
    }
    free(ref);
    free(row);
    free(mag);
    free(y);
    free(writes);
    free(units);
    free(xb);
    if (c->order != TDM_MM_ORDER_ROWS) free(wcodes), free(wscales);
    return worst;
}

/* The wide GEMM's reads of a tile-major matrix (kernels/wide_gemm.cu: a row's first byte and, NVFP4,
 * scale by tdm_mm_chunk_at / tdm_mm_scales_at, then tdm_mm_tile_byte_step / tdm_mm_tile_group_step):
 * every byte and group scale of every row where the tile-major copy put it; NVFP4 and FP8 (its slab
 * twice NVFP4's bytes). */
static void test_tile_steps(enum tdm_wfmt fmt)
{
    struct weight W;
    const int64_t rows = 48, k = 640;
    const int cb = tdm_mm_chunk_bytes((int)fmt);
    make_weight(&W, fmt, rows, k, TDM_DT_F32);
    const int64_t rowbytes = tdm_wfmt_code_bytes(fmt, 1, k);
    uint8_t *codes, *scales;
    order_copy(&W, TDM_MM_ORDER_TILES, &codes, &scales);
    int64_t bad_bytes = 0, bad_groups = 0;
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *row = codes + tdm_mm_chunk_at(TDM_MM_ORDER_TILES, rowbytes, cb, r, 0, 0);
        for (int64_t off = 0; off < rowbytes; off++)
            bad_bytes += row[tdm_mm_tile_byte_step(off, 4 * cb)] != W.w[r * rowbytes + off];
        if (fmt != TDM_W_NVFP4) continue;
        const uint8_t *groups = scales + tdm_mm_scales_at(TDM_MM_ORDER_TILES, k, r, 0, 0);
        for (int64_t g = 0; g < k / 16; g++) bad_groups += groups[tdm_mm_tile_group_step(g)] != W.scale[r * (k / 16) + g];
    }
    ok(bad_bytes == 0, "tile-major %s: the wide GEMM's byte steps find every code byte of 48 rows x 640 k (%lld differ)",
       tdm_wfmt_name(fmt), (long long)bad_bytes);
    if (fmt == TDM_W_NVFP4)
        ok(bad_groups == 0, "tile-major NVFP4: its group steps find every group scale (%lld differ)", (long long)bad_groups);
    free(codes);
    free(scales);
    free(W.w);
    free(W.scale);
}

int main(void)
{
    test_decoders();
    test_tile_steps(TDM_W_NVFP4);
    test_tile_steps(TDM_W_FP8);

    const struct emul_case cases[] = {
        /* fmt, stored rows, k, row0, n, scale dtype, chains, tile {nt, wn, wk, cs, pf}, order */
        {TDM_W_NVFP4, 48, 256, 0, 48, TDM_DT_F32, 1, {4, 4, 1, 1, 1}, 0},
        {TDM_W_NVFP4, 140, 1040, 9, 100, TDM_DT_F32, 4, {2, 2, 2, 2, 1}, 0},   /* k % 64 != 0, partial slab, view */
        {TDM_W_NVFP4, 64, 2048, 0, 64, TDM_DT_F32, 8, {1, 4, 1, 8, 1}, 0},
        {TDM_W_NVFP4, 200, 384, 0, 200, TDM_DT_F32, 2, {4, 1, 2, 1, 2}, 0},
        {TDM_W_FP8, 300, 200, 0, 300, TDM_DT_F32, 1, {2, 4, 1, 1, 1}, 0},      /* partial blocks both ways */
        {TDM_W_FP8, 400, 520, 100, 170, TDM_DT_BF16, 2, {1, 8, 2, 1, 1}, 0},   /* view across a block edge */
        {TDM_W_FP8, 256, 1024, 0, 256, TDM_DT_F32, 4, {2, 2, 1, 4, 2}, 0},
        {TDM_W_BF16, 40, 200, 0, 40, TDM_DT_F32, 1, {1, 8, 1, 1, 1}, 0},
        {TDM_W_BF16, 96, 640, 0, 96, TDM_DT_F32, 4, {2, 2, 4, 1, 1}, 0},
        {TDM_W_NVFP4, 100, 1536, 0, 100, TDM_DT_F32, 6, {2, 3, 2, 3, 1}, 0},  /* chains not a power of two, 3 warps */
        {TDM_W_FP8, 130, 640, 0, 130, TDM_DT_F32, 3, {1, 5, 1, 3, 1}, 0},
        /* tile-major copies (TDM_MM_NVFP4_TILES, TDM_MM_FP8_TILES): views from a row inside a tile, across
         * tiles */
        {TDM_W_NVFP4, 128, 1024, 24, 80, TDM_DT_F32, 4, {2, 2, 2, 2, 1}, TDM_MM_ORDER_TILES},
        {TDM_W_FP8, 304, 512, 100, 150, TDM_DT_BF16, 2, {1, 8, 2, 1, 1}, TDM_MM_ORDER_TILES},
    };
    const int ms[] = {1, 3, 12, 16, 17, 32};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const struct emul_case *c = &cases[i];
        struct weight W;
        make_weight(&W, c->fmt, c->rows, c->k, c->sdt);
        float *x = malloc(sizeof *x * 32 * c->k);
        for (int64_t e = 0; e < 32 * c->k; e++) x[e] = tdm_bf16r(frand() * 2.0f);
        for (size_t j = 0; j < sizeof ms / sizeof ms[0]; j++)
            for (int swap = 0; swap <= swap_form(c, ms[j]); swap++) {
                int written;
                double err = emulate(c, &W, x, ms[j], swap, &written);
                ok(err < 2e-5 && written, "%s n=%lld k=%lld row0=%lld chains=%d nt=%d wn=%d wk=%d m=%d%s%s: relative error "
                   "%.2e, every output written once", tdm_wfmt_name(c->fmt), (long long)c->n, (long long)c->k,
                   (long long)c->row0, c->chains, c->tile.nt, c->tile.wn, c->tile.wk, ms[j], swap ? " (weights as A)" : "",
                   c->order == TDM_MM_ORDER_TILES ? " (tile-major)" : "", err);
            }
        free(x);
        free(W.w);
        free(W.scale);
    }

    return done_testing();
}
