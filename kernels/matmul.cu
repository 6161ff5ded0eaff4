// matmul.cu — the entry points of matmul.h: weight upload and views, the choice of kernel by
// format and row count, argument checks, and the byte count of a product.
#include "matmul.h"
#include "cuda_check.h"
#include "device.h"
#include "engine_glue.h"
#include "err.h"
#include "formats.h"
#include "settings.h"
#include "mm_skinny.cuh"
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// The wide GEMM's launcher (wide_gemm.cu).
cudaError_t tdm_mm_wide_launch(const tdm_mm::SkinnyArgs &a, int fmt, bool vec, cudaStream_t st);

static int check_format(enum tdm_wfmt fmt, enum tdm_dtype sdt, int64_t n, int64_t k, const char *who)
{
    if (n < 1 || k < 1) return tdm_errf("%s: shape %" PRId64 "x%" PRId64 ": empty", who, n, k);
    if (n > INT32_MAX || k > INT32_MAX) return tdm_errf("%s: shape %" PRId64 "x%" PRId64 ": too large", who, n, k);
    switch (fmt) {
    case TDM_W_BF16: return 0;
    case TDM_W_FP8:
        if (sdt != TDM_DT_F32 && sdt != TDM_DT_BF16)
            return tdm_errf("%s: FP8 block scales must be F32 or BF16, not %s", who, tdm_dtype_name(sdt));
        return 0;
    case TDM_W_NVFP4:
        if (k % TDM_NVFP4_GROUP) return tdm_errf("%s: NVFP4 needs k a multiple of 16 (k = %" PRId64 ")", who, k);
        return 0;
    default:
        return tdm_errf("%s: weight format %s has no GPU kernel (BF16, FP8 and NVFP4 do)", who, tdm_wfmt_name(fmt));
    }
}

// ---- NVFP4 words in the order this device's kernels read (mm_skinny.cuh: TDM_NVFP4_PACKED) ----

__global__ void nvfp4_order_kernel(int *packed) { *packed = TDM_NVFP4_DEV_PACKED; }

__global__ void nvfp4_pack_kernel(uint32_t *w, size_t words)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < words; i += (size_t)gridDim.x * blockDim.x)
        w[i] = tdm_nvfp4_pack(w[i]);
}

extern "C" int tdm_nvfp4_packed(void)
{
    static int known = -1;   // the answer of the device's code (one device a process)
    if (known >= 0) return known;
    int *d = NULL, h = 0;
    TDM_CUDA_TRY(cudaMalloc(&d, sizeof *d));
    nvfp4_order_kernel<<<1, 1>>>(d);
    const cudaError_t e = cudaGetLastError();
    const cudaError_t c = e == cudaSuccess ? cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost) : e;
    cudaFree(d);
    if (c != cudaSuccess) return tdm_errf("CUDA: the NVFP4 word order query: %s", cudaGetErrorString(c));
    known = h;
    return known;
}

extern "C" int tdm_nvfp4_to_device_order(void *w, int64_t bytes)
{
    const int packed = tdm_nvfp4_packed();
    if (packed <= 0 || bytes <= 0) return packed < 0 ? -1 : 0;
    if (bytes % 4 || (uintptr_t)w % 4) return tdm_errf("NVFP4 word order: %" PRId64 " bytes at %p: not whole words", bytes, w);
    const size_t words = (size_t)bytes / 4;
    const int blocks = (int)((words + 255) / 256 < 4096 ? (words + 255) / 256 : 4096);
    nvfp4_pack_kernel<<<blocks, 256>>>((uint32_t *)w, words);
    TDM_LAUNCH_CHECK();
    TDM_CUDA_TRY(cudaDeviceSynchronize());
    return 0;
}

extern "C" int tdm_dweight_order_for(enum tdm_wfmt fmt, int64_t rows, int64_t k)
{
    return TDM_MM_TILES_FMT((int)fmt) && tdm_mm_tiles_fit(rows, k) ? TDM_MM_ORDER_TILES : TDM_MM_ORDER_ROWS;
}

// A matrix uploaded in rows (tdm_dweight_upload_rows: its codes, then its scales, in d->owned) put into
// the tile order (mm_layout.h): written into a new allocation of the same layout (tdm_dev_reorder; FP8's
// block scales, which no order moves, copied as they are), which then replaces the rows; synchronous.
static int to_tiles(struct tdm_dweight *d)
{
    struct tdm_dweight whole = *d;
    whole.row0 = 0;
    whole.n = d->row0 + d->n;
    const int64_t soff = (const char *)d->scale - (const char *)d->w;
    const int64_t bytes = soff + tdm_wfmt_scale_bytes(d->fmt, d->scale_dt, whole.n, d->k);
    void *tiles;
    if (tdm_cuda_malloc(&tiles, (size_t)bytes) != 0) return -1;
    const int64_t sbytes = bytes - soff;
    int rc = tdm_dev_reorder(&whole, TDM_MM_ORDER_TILES, tiles, (char *)tiles + soff, nullptr);
    if (rc == 0 && d->fmt != TDM_W_NVFP4 && sbytes > 0) {
        const cudaError_t e = cudaMemcpy((char *)tiles + soff, d->scale, (size_t)sbytes, cudaMemcpyDeviceToDevice);
        if (e != cudaSuccess) rc = tdm_errf("CUDA: the block scales' copy to the tile order: %s", cudaGetErrorString(e));
    }
    if (rc != 0 || tdm_cuda_sync() != 0) {
        tdm_cuda_free(tiles);
        return -1;
    }
    tdm_cuda_free(d->owned);
    d->owned = tiles;
    d->w = tiles;
    d->scale = (const char *)tiles + soff;
    d->order = TDM_MM_ORDER_TILES;
    return 0;
}

extern "C" int tdm_dweight_upload_rows(const struct tdm_qweight *h, struct tdm_dweight *d)
{
    memset(d, 0, sizeof *d);
    if (check_format(h->fmt, h->scale_dt, h->n, h->k, "upload") != 0) return -1;
    const int64_t rows = h->row0 + h->n;
    const int64_t wb = tdm_wfmt_code_bytes(h->fmt, rows, h->k), sb = tdm_wfmt_scale_bytes(h->fmt, h->scale_dt, rows, h->k);
    const int64_t soff = (wb + 255) / 256 * 256;   // scales start 256-byte aligned
    void *p;
    if (tdm_cuda_malloc(&p, (size_t)(soff + sb)) != 0) return -1;
    if (tdm_cuda_h2d(p, h->w, (size_t)wb) != 0 || (sb && tdm_cuda_h2d((char *)p + soff, h->scale, (size_t)sb) != 0) ||
        (h->fmt == TDM_W_NVFP4 && tdm_nvfp4_to_device_order(p, wb) != 0)) {
        tdm_cuda_free(p);
        return -1;
    }
    d->fmt = h->fmt;
    d->n = h->n;
    d->k = h->k;
    d->row0 = h->row0;
    d->w = p;
    d->scale = sb ? (const char *)p + soff : NULL;
    d->scale_dt = h->scale_dt;
    d->scale2 = h->scale2;
    d->owned = p;
    d->order = TDM_MM_ORDER_ROWS;
    return 0;
}

extern "C" int tdm_dweight_upload(const struct tdm_qweight *h, struct tdm_dweight *d)
{
    if (tdm_dweight_upload_rows(h, d) != 0) return -1;
    if (tdm_dweight_order_for(d->fmt, d->row0 + d->n, d->k) == TDM_MM_ORDER_TILES && to_tiles(d) != 0) {
        tdm_dweight_free(d);
        return -1;
    }
    return 0;
}

extern "C" int tdm_dweight_upload_cat(const struct tdm_qweight *a, const struct tdm_qweight *b, struct tdm_dweight *d)
{
    memset(d, 0, sizeof *d);
    struct tdm_qweight cat;
    void *buf = NULL;
    if (tdm_qweight_cat(a, b, &cat, &buf) != 0) return -1;
    const int rc = tdm_dweight_upload(&cat, d);   // synchronous copies: the host matrix may go
    free(buf);
    return rc;
}

extern "C" void tdm_dweight_free(struct tdm_dweight *d)
{
    if (d && d->owned) tdm_cuda_free(d->owned);
    if (d) memset(d, 0, sizeof *d);
}

extern "C" struct tdm_dweight tdm_dweight_rows(const struct tdm_dweight *w, int64_t r0, int64_t n)
{
    struct tdm_dweight v = *w;
    v.row0 = w->row0 + r0;
    v.n = n;
    v.owned = NULL;
    return v;
}

extern "C" int64_t tdm_dweight_bytes(const struct tdm_dweight *w)
{
    struct tdm_qweight q = {w->fmt, w->n, w->k, w->row0, NULL, NULL, w->scale_dt, w->scale2};
    return tdm_qweight_bytes(&q);
}

extern "C" int64_t tdm_matmul_bytes(const struct tdm_dweight *w, int64_t m)
{
    return tdm_dweight_bytes(w) + m * w->k * 2;
}

// The factor a weight's FP32 sums are scaled by before they are stored: NVFP4's global scale times
// the exponent the decode leaves out (TDM_NVFP4_OUT_EXP); 1 for the other formats.
static float out_scale_of(const struct tdm_dweight *w)
{
    return w->fmt == TDM_W_NVFP4 ? w->scale2 * (float)(1 << TDM_NVFP4_OUT_EXP) : 1.0f;
}

// Fills the kernel arguments shared by the skinny and wide kernels; checks the call.
static int make_args(const struct tdm_dweight *w, const uint16_t *x, int64_t ldx, const uint16_t *xb, int64_t m, void *y,
                     int64_t ldy, enum tdm_mm_out out, tdm_mm::SkinnyArgs *a, const char *who)
{
    if (check_format(w->fmt, w->scale_dt, w->n, w->k, who) != 0) return -1;
    if (!w->w || (w->fmt != TDM_W_BF16 && !w->scale)) return tdm_errf("%s: weight not on the device", who);
    if (!x || !y) return tdm_errf("%s: NULL activations or output", who);
    if (m < 1 || m > INT32_MAX) return tdm_errf("%s: %" PRId64 " rows", who, m);
    if (ldx < w->k) return tdm_errf("%s: ldx %" PRId64 " < k %" PRId64, who, ldx, w->k);
    // the skinny kernel addresses a lane's activations by 32-bit element offsets (mm_skinny.cuh)
    if (m <= TDM_MM_MAX_ROWS && (m - 1) * ldx + w->k > (int64_t)UINT32_MAX)
        return tdm_errf("%s: %" PRId64 " rows of stride %" PRId64 ": past 2^32 elements", who, m, ldx);
    if (ldy < w->n) return tdm_errf("%s: ldy %" PRId64 " < n %" PRId64, who, ldy, w->n);
    if (out != TDM_MM_BF16 && out != TDM_MM_F32) return tdm_errf("%s: unknown output type", who);
    if (tdm_ly::xb_refused(who, xb, (int)m)) return -1;
    memset(a, 0, sizeof *a);
    a->w = (const uint8_t *)w->w;
    a->scale = (const uint8_t *)w->scale;
    a->scale_bf16 = w->scale_dt == TDM_DT_BF16;
    a->out_scale = out_scale_of(w);
    a->n = (int)w->n;
    a->k = (int)w->k;
    a->row0 = w->row0;
    a->x = x;
    a->ldx = ldx;
    a->xb = xb;
    a->m = (int)m;
    a->y = y;
    a->ldy = ldy;
    a->y_f32 = out == TDM_MM_F32;
    a->slabs = (int)((w->k + TDM_MM_SLAB_K - 1) / TDM_MM_SLAB_K);
    a->x_vec = ((uintptr_t)x % 16 == 0) && (ldx % 8 == 0);
    a->order = w->order;
    return 0;
}

// The direct form's load depth at most 8 rows (a built pf; 0, the default: the table's pf). A
// build-time knob for A/B runs (nvcc -DTDM_MM_DIRECT_PF=3), as TDM_MM_L2PF is. Measured inside the
// engine (16-layer 27B, bench/NOTES.md, the direct form's load depth): forcing pf 3 made the one-row
// verify 3.40 ms against 3.25 with the table's pf, and every row count 1-8 slower; in the lone
// benchmark pf 3 had won.
#ifndef TDM_MM_DIRECT_PF
#define TDM_MM_DIRECT_PF 0
#endif
static_assert(TDM_MM_DIRECT_PF == 0 || TDM_MM_DIRECT_PF == 1 || TDM_MM_DIRECT_PF == 3,
              "TDM_MM_DIRECT_PF: 0, or a load depth the NVFP4 kernel is built for at nt 1 and 2 (TDM_MM_VARIANTS)");

static int mm_direct = -1;   // TDM_MM_DIRECT_*, or -1: from the setting at the next call
extern "C" int tdm_mm_direct_mode(void)
{
    if (mm_direct < 0) {
        const char *v = tdm_setting("TANDEM_MM_DIRECT");
        mm_direct = strcmp(v, "on") == 0 ? TDM_MM_DIRECT_ON : strcmp(v, "off") == 0 ? TDM_MM_DIRECT_OFF : TDM_MM_DIRECT_AUTO;
    }
    return mm_direct;
}
extern "C" void tdm_mm_set_direct(int mode) { mm_direct = mode; }
extern "C" int tdm_mm_direct_rows(int64_t m)
{
    const int mode = tdm_mm_direct_mode();
    return mode == TDM_MM_DIRECT_ON || (mode == TDM_MM_DIRECT_AUTO && m >= TDM_MM_DIRECT_AUTO_ROWS);
}

// Whether every weight row (and NVFP4 scale row) of the view starts 16-byte (2-byte) aligned, so
// that the kernel may use vector loads.
static bool rows_aligned(const struct tdm_dweight *w)
{
    const int64_t rb = tdm_wfmt_code_bytes(w->fmt, 1, w->k);
    if ((uintptr_t)w->w % 16 || rb % 16) return false;
    if (w->fmt == TDM_W_NVFP4 && ((uintptr_t)w->scale % 2 || (w->k / TDM_NVFP4_GROUP) % 2)) return false;
    return true;
}

// Whether the skinny kernels' fast path (the vector instantiation) may read w: its rows aligned, and
// where the fast path reads w's format tile-major (mm_layout.h: TDM_MM_TILES_FMT) w held so; else
// the checked path reads it (either order: load_chunk), which has no SwiGLU form of its own.
static bool fast_path_reads(const struct tdm_dweight *w)
{
    return rows_aligned(w) && !(TDM_MM_TILES_FMT((int)w->fmt) && w->order != TDM_MM_ORDER_TILES);
}

// Whether a product of m rows reads x's blocked copy xb per lane (the form TDM_MM_FORM_NT and
// TDM_MM_DIRECT_XB name xb_lane): a copy given, the vector instantiation, the per-lane form at m rows.
static int xb_lane_of(const uint16_t *xb, bool vec, int64_t m) { return xb && vec && tdm_mm_direct_rows(m); }

// Launches the skinny kernel with the setting t (already checked) on arguments a of m rows.
static int run_skinny(tdm_mm::SkinnyArgs &a, const struct tdm_dweight *w, struct tdm_tile t, int64_t m, bool vec,
                      void *stream)
{
    t = tdm_tile_at(&t, m);   // the few-row geometry where the setting has one (tiles.h)
    if (!vec) t.nt = t.pf = 1;
    const int mt = tdm_mm_rows_mt(m);   // 0: rows 8-15 of the tile known zero
    // TANDEM_MM_DIRECT: NVFP4 at 1-16 rows (1-32 from x's blocked copy) and FP8 at 1-32 rows from the
    // copy with the activations loaded per lane (mm_skinny.cuh: DA; by default from
    // TDM_MM_DIRECT_AUTO_ROWS rows, matmul.h). TDM_MM_DIRECT_PF, if set, overrides the load depth at
    // most 8 rows. The load depth only orders the loads and the per-lane loads fetch the same
    // operands: the bits are the same.
    static_assert(TDM_W_FP8 == TDM_MMF_FP8 && TDM_W_NVFP4 == TDM_MMF_NVFP4 && TDM_W_BF16 == TDM_MMF_BF16,
                  "enum tdm_wfmt holds the TDM_MMF_* values (mm_layout.h)");
    const int f = (int)w->fmt;
    // The nt and warps the kernel runs the setting at (mm_layout.h: FP8's nt 2 as nt 1 over twice the
    // warps where it has no per-lane form from the copy): the same CTAs and columns, so the same bits.
    const int xb_lane = xb_lane_of(a.xb, vec, m);
    t.wn = tdm_mm_form_wn(f, t.nt, t.wn, mt, xb_lane);
    t.nt = TDM_MM_FORM_NT(f, t.nt, mt, xb_lane);
    const bool direct = tdm_mm_fmt_reads_xb(f) && vec &&
                        (a.xb ? TDM_MM_DIRECT_XB(f, t.nt, mt) : TDM_MM_DIRECT(f, t.nt, mt)) && tdm_mm_direct_rows(m);
    if (direct && mt == 0 && TDM_MM_DIRECT_PF) t.pf = TDM_MM_DIRECT_PF;
    if (direct && a.xb) t.pf = TDM_MM_DIRECT_XB_PF(f, mt, t.pf);
    // A setting only the per-lane forms run as set (wk 4 at 17-32 rows): staged, its chains split
    // over the cluster instead (tiles.h, tdm_tile_staged_fit; the table check saw that one fits).
    if (!direct && tdm_tile_staged_fit(&t, (int)m) != 0) return tdm_err_prefix("matmul: %s %" PRId64 "x%" PRId64 " m=%" PRId64,
                                                                             tdm_wfmt_name(w->fmt), w->n, w->k, m);
    a.wk = t.wk;
    a.chain_len = (a.slabs + t.kchains - 1) / t.kchains;
    size_t smem = tdm_tile_smem(&t, (int)m, direct);
    // x's slabs staged (mm_layout.h): decided here only, so that the launch picks the form smem is for
    const bool xs = direct && a.xb && tdm_mm_xs_runs(f, mt, t.wn, t.wk);
    const int kmt = tdm_mm_kernel_mt(f, mt, m, direct && a.xb, xs);   // the instantiation's mt (17-24 rows: 3)
    if (xs) smem = tdm_mm_xs_smem(t.wk, kmt, smem);
    cudaStream_t st = (cudaStream_t)stream;
    cudaError_t e;
    switch (w->fmt) {
    case TDM_W_NVFP4:
        e = tdm_mm_skinny_nvfp4(a, t.nt, t.wn, t.cs, t.pf, kmt, vec, direct, xs, smem, st);
        break;
    case TDM_W_FP8: e = tdm_mm_skinny_fp8(a, t.nt, t.wn, t.cs, t.pf, kmt, vec, direct, xs, smem, st); break;
    default: e = tdm_mm_skinny_bf16(a, t.nt, t.wn, t.cs, t.pf, mt, vec, smem, st); break;
    }
    if (e != cudaSuccess) {
        (void)cudaGetLastError();   // a refused launch leaves no sticky error; clear it for the next call
        char buf[96];
        return tdm_errf("matmul: %s %" PRId64 "x%" PRId64 " m=%" PRId64 " %s%s: launch failed: %s", tdm_wfmt_name(w->fmt),
                        w->n, w->k, m, tdm_tile_str(&t, buf, sizeof buf), a.w_up ? " (SwiGLU)" : "", cudaGetErrorString(e));
    }
    return 0;
}

// The skinny kernel's tile for w at m rows (1..32), from the table; who names the caller in the error.
static int skinny_tile(const struct tdm_dweight *w, int64_t m, const struct tdm_tiles *tiles, const char *who,
                       struct tdm_tile *t)
{
    const int kk = tdm_mmk_for(w->fmt, m);
    if (kk < 0) {
        if (m < 1) return tdm_errf("%s: %" PRId64 " rows", who, m);
        return tdm_errf("%s: weight format %s has no GPU kernel", who, tdm_wfmt_name(w->fmt));
    }
    *t = tdm_tiles_get(tiles, (enum tdm_mmk)kk, w->n, w->k);
    return 0;
}

// gate, ldg, yb: the gated up product's (tdm_matmul_gated; gate NULL: a plain product); who names the
// caller in errors.
static int skinny(const struct tdm_dweight *w, const uint16_t *x, int64_t ldx, const uint16_t *xb, int64_t m, void *y,
                  int64_t ldy, enum tdm_mm_out out, const struct tdm_tile *tile, void *stream, bool rule_chains,
                  const char *who = "matmul", const uint16_t *gate = nullptr, int64_t ldg = 0, uint16_t *yb = nullptr)
{
    tdm_mm::SkinnyArgs a;
    if (make_args(w, x, ldx, xb, m, y, ldy, out, &a, who) != 0) return -1;
    const bool vec = fast_path_reads(w) && a.x_vec;
    if (gate) {
        if (tdm_ly::xb_refused(who, yb, (int)m)) return -1;
        a.gate_y = gate;
        a.ld_gate = ldg;
        a.yb = yb;
    }
    const int kk = tdm_mmk_for(w->fmt, m);
    if (kk < 0) return tdm_errf("%s: the skinny kernels serve 1..32 rows, not %" PRId64, who, m);
    if ((rule_chains ? tdm_tile_check : tdm_tile_check_plan)((enum tdm_mmk)kk, w->n, w->k, tile) != 0)
        return tdm_err_prefix("%s: %s %" PRId64 ",%" PRId64, who, tdm_mmk_name((enum tdm_mmk)kk), w->n, w->k);
    // The vector instantiation needs aligned weight rows and activation rows; the other loads
    // byte-wise (launch settings and load widths change no bits).
    return run_skinny(a, w, *tile, m, vec, stream);
}

extern "C" int tdm_matmul_skinny(const struct tdm_dweight *w, const uint16_t *x, int64_t ldx, int64_t m, void *y,
                                 int64_t ldy, enum tdm_mm_out out, const struct tdm_tile *tile, void *stream)
{
    return skinny(w, x, ldx, NULL, m, y, ldy, out, tile, stream, true);
}
extern "C" int tdm_matmul_skinny_xb(const struct tdm_dweight *w, const uint16_t *x, int64_t ldx, const uint16_t *xb,
                                    int64_t m, void *y, int64_t ldy, enum tdm_mm_out out, const struct tdm_tile *tile,
                                    void *stream)
{
    return skinny(w, x, ldx, xb, m, y, ldy, out, tile, stream, true);
}

extern "C" int tdm_matmul_skinny_plan(const struct tdm_dweight *w, const uint16_t *x, int64_t ldx, const uint16_t *xb,
                                      int64_t m, void *y, int64_t ldy, enum tdm_mm_out out, const struct tdm_tile *tile,
                                      void *stream)
{
    return skinny(w, x, ldx, xb, m, y, ldy, out, tile, stream, false);
}

extern "C" int tdm_matmul_wide(const struct tdm_dweight *w, const uint16_t *x, int64_t ldx, int64_t m, void *y,
                               int64_t ldy, enum tdm_mm_out out, void *stream)
{
    tdm_mm::SkinnyArgs a;
    if (make_args(w, x, ldx, NULL, m, y, ldy, out, &a, "matmul (wide)") != 0) return -1;
    cudaError_t e = tdm_mm_wide_launch(a, w->fmt, rows_aligned(w), (cudaStream_t)stream);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return tdm_errf("matmul (wide): %s %" PRId64 "x%" PRId64 " m=%" PRId64 ": launch failed: %s",
                        tdm_wfmt_name(w->fmt), w->n, w->k, m, cudaGetErrorString(e));
    }
    return 0;
}

// The kernel kind (*kk) and setting (*t, the table's whole setting) of a SwiGLU product of m rows
// (tdm_matmul_swiglu) when it runs as one: the two weights of one shape and format, nt 2 in the
// geometry that serves m rows (a warp's two tiles are the two weights) and in the form that runs it
// (FP8's nt 2 runs as nt 2 only per lane from x's blocked copy xb, at 1-16 rows: TDM_MM_FORM_NT),
// aligned rows (the vector instantiation: the checked one runs nt 1).
static bool swiglu_setting(const struct tdm_dweight *gate, const struct tdm_dweight *up, const uint16_t *x, int64_t ldx,
                           const uint16_t *xb, int64_t m, const struct tdm_tiles *tiles, enum tdm_mmk *kk,
                           struct tdm_tile *t)
{
    if (!gate || !up || m < 1 || m > TDM_MM_MAX_ROWS || gate->fmt != up->fmt || gate->n != up->n || gate->k != up->k ||
        gate->scale_dt != up->scale_dt || !gate->w || !up->w)
        return false;
    const int k = tdm_mmk_for(gate->fmt, m);
    if (k < 0) return false;
    *kk = (enum tdm_mmk)k;
    *t = tdm_tiles_get(tiles, *kk, gate->n, gate->k);
    const bool vec = fast_path_reads(gate) && fast_path_reads(up) && (uintptr_t)x % 16 == 0 && ldx % 8 == 0;
    const int xb_lane = xb_lane_of((uintptr_t)xb % 16 == 0 ? xb : NULL, vec, m);   // a misaligned copy is refused
    return vec && tdm_tile_at(t, m).nt == 2 && TDM_MM_FORM_NT((int)gate->fmt, 2, tdm_mm_rows_mt(m), xb_lane) == 2;
}

extern "C" int tdm_matmul_swiglu_ok(const struct tdm_dweight *gate, const struct tdm_dweight *up, const uint16_t *x,
                                    int64_t ldx, const uint16_t *xb, int64_t m, const struct tdm_tiles *tiles)
{
    enum tdm_mmk kk;
    struct tdm_tile t;
    return swiglu_setting(gate, up, x, ldx, xb, m, tiles, &kk, &t);
}

extern "C" int tdm_matmul_swiglu_pays(const struct tdm_dweight *gate, int64_t m)
{
    // NVFP4 held in rows: the two launches win from the second mma row tile (9 rows) up to the
    // 17-24-row form's top while up carries the SiLU x up, else to the second tile's top (16 rows).
    // Held tile-major, the one launch wins at every row count.
    const bool two = TDM_MLP_GATED_UP ? m <= TDM_MM_HI24_ROWS : tdm_mm_rows_mt(m) <= 1;
    return !(gate && gate->fmt == TDM_W_NVFP4 && gate->order == TDM_MM_ORDER_ROWS && tdm_mm_rows_mt(m) >= 1 && two);
}

extern "C" int tdm_matmul_gated_pays(const struct tdm_dweight *up, int64_t m)
{
    // FP8's 17-24-row form: the third mma row tile, up to its top
    return up && m >= 1 && m <= TDM_MM_MAX_ROWS && !(up->fmt == TDM_W_FP8 && tdm_mm_rows_mt(m) == 2 && m <= TDM_MM_HI24_ROWS);
}

extern "C" enum tdm_swiglu_form tdm_matmul_swiglu_form(enum tdm_mlp_fuse fuse, const struct tdm_dweight *gate,
                                                       const struct tdm_dweight *up, const uint16_t *x, int64_t ldx,
                                                       const uint16_t *xb, int64_t m, const struct tdm_tiles *tiles)
{
    if (fuse != TDM_MLP_FUSE_OFF && tdm_matmul_swiglu_ok(gate, up, x, ldx, xb, m, tiles) &&
        (fuse == TDM_MLP_FUSE_ON || tdm_matmul_swiglu_pays(gate, m)))
        return TDM_SWIGLU_ONE;
    return TDM_MLP_GATED_UP && tdm_matmul_gated_pays(up, m) ? TDM_SWIGLU_GATED : TDM_SWIGLU_THREE;
}

extern "C" int tdm_matmul_swiglu_run(enum tdm_swiglu_form form, const struct tdm_dweight *gate,
                                     const struct tdm_dweight *up, const uint16_t *x, int64_t ldx, const uint16_t *xb,
                                     int64_t m, uint16_t *g, uint16_t *u, uint16_t *gb, const struct tdm_tiles *tiles,
                                     void *stream)
{
    if (!gate || !up) return tdm_errf("tdm_matmul_swiglu_run: no weight");
    const int64_t I = gate->n;
    switch (form) {
    case TDM_SWIGLU_ONE: return tdm_matmul_swiglu(gate, up, x, ldx, xb, m, g, I, gb, tiles, stream);
    case TDM_SWIGLU_GATED: break;
    case TDM_SWIGLU_THREE:
        if (!u) return tdm_errf("tdm_matmul_swiglu_run: three launches need room for up's output");
        break;
    default: return tdm_errf("tdm_matmul_swiglu_run: form %d unknown", (int)form);
    }
    if (tdm_matmul_xb(gate, x, ldx, xb, m, g, I, TDM_MM_BF16, tiles, stream) != 0) return -1;
    if (form == TDM_SWIGLU_GATED)   // up's product reads the gate's output and writes over it, element by element
        return tdm_matmul_gated(up, x, ldx, xb, m, g, I, g, I, gb, tiles, stream);
    return tdm_matmul_xb(up, x, ldx, xb, m, u, I, TDM_MM_BF16, tiles, stream) ||
                   tdm_silu_mul(g, u, I, (int)m, g, gb, stream)
               ? -1
               : 0;
}

// Appends to buf (n bytes) at *len, as far as it fits.
static void put(char *buf, size_t n, size_t *len, const char *fmt, ...)
{
    if (*len + 1 >= n) return;
    va_list ap;
    va_start(ap, fmt);
    const int w = vsnprintf(buf + *len, n - *len, fmt, ap);
    va_end(ap);
    if (w > 0) *len = *len + (size_t)w < n ? *len + (size_t)w : n - 1;
}

extern "C" const char *tdm_matmul_swiglu_forms(enum tdm_mlp_fuse fuse, const struct tdm_dweight *gate,
                                               const struct tdm_dweight *up, const uint16_t *x, int64_t ldx,
                                               const uint16_t *xb, const struct tdm_tiles *tiles, char *buf, size_t n)
{
    static const char *const words[] = {"one launch", "gate, then up with the SiLU x up", "three launches"};
    enum tdm_swiglu_form at[TDM_MM_MAX_ROWS + 2];   // at[m], m = 1..32; at[33]: past 32 rows, the wide product's
    for (int m = 1; m <= TDM_MM_MAX_ROWS; m++)
        at[m] = tdm_matmul_swiglu_form(fuse, gate, up, x, ldx, m <= TDM_MM_XB_ROWS ? xb : NULL, m, tiles);
    at[TDM_MM_MAX_ROWS + 1] = TDM_SWIGLU_THREE;
    size_t len = 0;
    if (n) buf[0] = 0;
    bool done[3] = {false, false, false};
    for (int first = 1; first <= TDM_MM_MAX_ROWS + 1; first++) {
        const enum tdm_swiglu_form f = at[first];
        if (done[f]) continue;
        done[f] = true;
        int ranges[TDM_MM_MAX_ROWS + 1][2], nr = 0;   // this form's runs of rows
        for (int m = first; m <= TDM_MM_MAX_ROWS + 1; m++)   // past 32 rows a run of its own
            if (at[m] == f) {
                if (nr && ranges[nr - 1][1] == m - 1 && m <= TDM_MM_MAX_ROWS) ranges[nr - 1][1] = m;
                else ranges[nr][0] = ranges[nr][1] = m, nr++;
            }
        put(buf, n, &len, "%s%s", len ? "; " : "", words[f]);
        for (int r = 0; r < nr; r++) {
            char rows[32];
            const bool past = ranges[r][0] > TDM_MM_MAX_ROWS;
            if (past)
                snprintf(rows, sizeof rows, "past %d", TDM_MM_MAX_ROWS);
            else if (ranges[r][0] == ranges[r][1])
                snprintf(rows, sizeof rows, "%d", ranges[r][0]);
            else
                snprintf(rows, sizeof rows, "%d-%d", ranges[r][0], ranges[r][1]);
            put(buf, n, &len, "%s%s%s", r == 0 ? (past ? " " : " at ") : r == nr - 1 ? " and " : ", ", rows,
                r == nr - 1 ? " rows" : "");
        }
    }
    return buf;
}

extern "C" int tdm_matmul_swiglu(const struct tdm_dweight *gate, const struct tdm_dweight *up, const uint16_t *x,
                                 int64_t ldx, const uint16_t *xb, int64_t m, uint16_t *y, int64_t ldy, uint16_t *yb,
                                 const struct tdm_tiles *tiles, void *stream)
{
    enum tdm_mmk kk;
    struct tdm_tile t;
    if (!swiglu_setting(gate, up, x, ldx, xb, m, tiles, &kk, &t))
        return tdm_errf("matmul (SwiGLU): %s %" PRId64 "x%" PRId64 " at %" PRId64 " rows cannot run as one product "
                        "(tdm_matmul_swiglu_ok)", gate ? tdm_wfmt_name(gate->fmt) : "?", gate ? gate->n : 0,
                        gate ? gate->k : 0, m);
    tdm_mm::SkinnyArgs a;
    if (make_args(gate, x, ldx, xb, m, y, ldy, TDM_MM_BF16, &a, "matmul (SwiGLU)") != 0) return -1;
    if (tdm_ly::xb_refused("matmul (SwiGLU)", yb, (int)m)) return -1;
    a.yb = yb;
    if (tdm_tile_check(kk, gate->n, gate->k, &t) != 0)
        return tdm_err_prefix("matmul (SwiGLU): %s %" PRId64 ",%" PRId64, tdm_mmk_name(kk), gate->n, gate->k);
    a.w_up = (const uint8_t *)up->w;
    a.scale_up = (const uint8_t *)up->scale;
    a.row0_up = up->row0;
    a.out_scale_up = out_scale_of(up);
    return run_skinny(a, gate, t, m, true, stream);
}

extern "C" int tdm_matmul_gated(const struct tdm_dweight *up, const uint16_t *x, int64_t ldx, const uint16_t *xb,
                                int64_t m, const uint16_t *gate, int64_t ldg, uint16_t *y, int64_t ldy, uint16_t *yb,
                                const struct tdm_tiles *tiles, void *stream)
{
    const char *who = "matmul (gated)";
    if (m < 1 || m > TDM_MM_MAX_ROWS) return tdm_errf("%s: the skinny kernels serve 1..%d rows, not %" PRId64, who, TDM_MM_MAX_ROWS, m);
    if (!up) return tdm_errf("%s: NULL weight", who);
    if (!gate || ldg < up->n) return tdm_errf("%s: gate %s, ld %" PRId64 " for %" PRId64 " outputs", who, gate ? "set" : "NULL", ldg, up->n);
    struct tdm_tile t;
    if (skinny_tile(up, m, tiles, who, &t) != 0) return -1;
    return skinny(up, x, ldx, xb, m, y, ldy, TDM_MM_BF16, &t, stream, true, who, gate, ldg, yb);
}

extern "C" int tdm_matmul(const struct tdm_dweight *w, const uint16_t *x, int64_t ldx, int64_t m, void *y, int64_t ldy,
                          enum tdm_mm_out out, const struct tdm_tiles *tiles, void *stream)
{
    return tdm_matmul_xb(w, x, ldx, NULL, m, y, ldy, out, tiles, stream);
}
extern "C" int tdm_matmul_xb(const struct tdm_dweight *w, const uint16_t *x, int64_t ldx, const uint16_t *xb, int64_t m,
                             void *y, int64_t ldy, enum tdm_mm_out out, const struct tdm_tiles *tiles, void *stream)
{
    if (m > TDM_MM_MAX_ROWS) {
        if (xb) return tdm_errf("matmul: a blocked activation copy serves 1..%d rows, not %" PRId64, TDM_MM_XB_ROWS, m);
        return tdm_matmul_wide(w, x, ldx, m, y, ldy, out, stream);
    }
    struct tdm_tile t;
    if (skinny_tile(w, m, tiles, "matmul", &t) != 0) return -1;
    return tdm_matmul_skinny_xb(w, x, ldx, xb, m, y, ldy, out, &t, stream);
}

// x's blocked copy (mm_layout.h: xb): one thread a 16-byte unit of the full slabs, permuted.
__global__ void pack_xb_kernel(const uint16_t *x, int64_t ldx, int m, int64_t kf, uint16_t *xb)
{
    const int64_t units = m * (kf / 8);
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < units; e += (int64_t)gridDim.x * blockDim.x) {
        const int r = (int)(e / (kf / 8));
        const int64_t k = 8 * (e % (kf / 8));
        uint32_t in[4], out[4];
        for (int i = 0; i < 4; i++) in[i] = (uint32_t)x[r * ldx + k + 2 * i] | (uint32_t)x[r * ldx + k + 2 * i + 1] << 16;
        tdm_mm_permute_unit(TDM_MMF_NVFP4, in, out);
        *reinterpret_cast<uint4 *>(xb + tdm_mm_xb_index(r, k)) = make_uint4(out[0], out[1], out[2], out[3]);
    }
}
extern "C" int tdm_mm_pack_xb(const uint16_t *x, int64_t ldx, int64_t m, int64_t k, uint16_t *xb, void *stream)
{
    if (!x || !xb || m < 1 || m > TDM_MM_XB_ROWS || k < 1 || ldx < k || (uintptr_t)xb % 16)
        return tdm_errf("tdm_mm_pack_xb: bad arguments (%" PRId64 " rows, k %" PRId64 ", ldx %" PRId64 ")", m, k, ldx);
    const int64_t kf = k / TDM_MM_SLAB_K * TDM_MM_SLAB_K;
    if (kf == 0) return 0;
    const int64_t units = m * (kf / 8);
    pack_xb_kernel<<<(unsigned)((units + 255) / 256), 256, 0, (cudaStream_t)stream>>>(x, ldx, (int)m, kf, xb);
    TDM_LAUNCH_CHECK();
    return 0;
}
