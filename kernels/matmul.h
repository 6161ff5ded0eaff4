/* matmul.h — the projection products y = x W^T on the GPU, for weights in BF16, block FP8 and
 * NVFP4 as the checkpoints store them, activations BF16 [m, k] row-major, output BF16 or FP32
 * [m, n] row-major.
 *
 * 1..32 rows run the skinny kernels (kernels/mm_skinny.cuh: nvfp4_skinny.cu, fp8_skinny.cu,
 * bf16_skinny.cu): row-invariant by construction, each its own verify twin — row r of an m-row
 * call is the same bits as a one-row call on x's row r, for every m in 1..32. More rows run the
 * wide tensor-core GEMM (wide_gemm.cu), which decodes each weight tile once for 64 rows and has no
 * twin contract. Every launcher takes an explicit stream (a cudaStream_t, NULL = legacy default),
 * checks the launch, and returns 0 or -1 with tdm_err() set. */
#ifndef TDM_MATMUL_H
#define TDM_MATMUL_H
#include <stddef.h>
#include <stdint.h>
#include "linear.h"
#include "tiles.h"
#ifdef __cplusplus
extern "C" {
#endif

/* A projection weight on the device: struct tdm_qweight's fields with device pointers. A view of
 * rows [row0, row0 + n) of the stored matrix, so that a fused [gate; up] tensor gives two views
 * into one stored matrix whose FP8 scale blocks still line up with the stored rows. */
struct tdm_dweight {
    enum tdm_wfmt fmt;
    int64_t n, k;          /* this view: n outputs, k inputs */
    int64_t row0;          /* first stored row of the view */
    const void *w;         /* device: the stored matrix (row 0) */
    const void *scale;     /* device: FP8 block scales / NVFP4 group scales of the stored matrix */
    enum tdm_dtype scale_dt;
    float scale2;          /* NVFP4 global scale */
    void *owned;           /* the allocation tdm_dweight_upload made (NULL for views) */
    int order;             /* the stored matrix's order (mm_layout.h): TDM_MM_ORDER_ROWS, or TILES for the
                              formats the build holds so (TDM_MM_TILES_FMT: NVFP4 by default) */
};

/* Copies rows [0, h->row0 + h->n) of the stored matrix and their scales to the device; d keeps
 * h's row0 and n. Formats: BF16, FP8 (F32 or BF16 scales), NVFP4 (k a multiple of 16; its codes in
 * the order tdm_nvfp4_packed names). */
int tdm_dweight_upload(const struct tdm_qweight *h, struct tdm_dweight *d);
/* The same in the stored row order (TDM_MM_ORDER_ROWS) whatever the build holds the format in: for the
 * tests that compare the orders (a weight held in rows whose format the build holds tile-major takes
 * the checked path). */
int tdm_dweight_upload_rows(const struct tdm_qweight *h, struct tdm_dweight *d);
/* The order (mm_layout.h: TDM_MM_ORDER_*) tdm_dweight_upload holds a weight of format fmt in, of
 * `rows` stored rows and k inputs: TILES where the build holds the format so (TDM_MM_TILES_FMT) and the
 * shape fits (tdm_mm_tiles_fit), else ROWS. */
int tdm_dweight_order_for(enum tdm_wfmt fmt, int64_t rows, int64_t k);
/* One device weight of a's rows followed by b's ([a.n + b.n, k], row0 0), so that one product
 * gives both outputs side by side (qwen3_5's in_proj_b and in_proj_a): the host matrix of
 * tdm_qweight_cat (only where tdm_qweight_cat_exact: else -1 with tdm_err()), uploaded as
 * tdm_dweight_upload uploads a weight. */
int tdm_dweight_upload_cat(const struct tdm_qweight *a, const struct tdm_qweight *b, struct tdm_dweight *d);
void tdm_dweight_free(struct tdm_dweight *d);
/* Whether this device's kernels read the NVFP4 codes of a weight in mm_layout.h's packed word order
 * (1: sm_90, where tdm_nvfp4_pack saves a third of the decode's integer operations) or as the
 * checkpoint stores them (0: the targets with an e2m1 conversion instruction); -1 on a CUDA error
 * (tdm_err). Asked of the device's code once a process. */
int tdm_nvfp4_packed(void);
/* NVFP4 codes already on the device (bytes a multiple of 4, 4-byte aligned) put into that order in
 * place; nothing where the order is the checkpoint's. Every upload of NVFP4 codes calls it
 * (tdm_dweight_upload, tdm_moe_experts_upload); synchronous. 0, or -1 with tdm_err(). */
int tdm_nvfp4_to_device_order(void *w, int64_t bytes);
/* A view of rows [r0, r0 + n) of w (shares w's memory; never free a view). */
struct tdm_dweight tdm_dweight_rows(const struct tdm_dweight *w, int64_t r0, int64_t n);
/* Bytes of the stored matrix and scales that the view covers (what a product must read). */
int64_t tdm_dweight_bytes(const struct tdm_dweight *w);

enum tdm_mm_out { TDM_MM_BF16 = 0, TDM_MM_F32 = 1 };

/* y[m][n] (row stride ldy) = sum_k x[m][k] (row stride ldx) * W[n][k]. Picks the kernel by format
 * and m (skinny for m <= 32, wide above) and the setting from tiles (NULL: defaults) for (n, k). */
int tdm_matmul(const struct tdm_dweight *w, const uint16_t *x, int64_t ldx, int64_t m, void *y,
               int64_t ldy, enum tdm_mm_out out, const struct tdm_tiles *tiles, void *stream);

/* tdm_matmul with x's blocked copy xb beside it (NULL: none): the copy that the kernel which wrote x
 * wrote as well, in mm_layout.h's xb layout (tdm_mm_xb_elems(k) elements, 16-byte aligned), for
 * m <= TDM_MM_XB_ROWS. The NVFP4 products that load their activations per lane (tdm_mm_direct_rows;
 * at 17-32 rows, where the setting has nt 2, only from a copy) read their full slabs from it: the
 * same values, so the same bits, with 4x fewer L1 lines a load and no permute. The other forms
 * read x. */
int tdm_matmul_xb(const struct tdm_dweight *w, const uint16_t *x, int64_t ldx, const uint16_t *xb, int64_t m, void *y,
                  int64_t ldy, enum tdm_mm_out out, const struct tdm_tiles *tiles, void *stream);
/* Writes x's blocked copy (m <= TDM_MM_XB_ROWS rows of k; the full slabs of K) into xb: for callers
 * whose x comes from no kernel that writes the copy (tests, benchmarks). */
int tdm_mm_pack_xb(const uint16_t *x, int64_t ldx, int64_t m, int64_t k, uint16_t *xb, void *stream);

/* The skinny kernel (m in 1..32) with an explicit setting (which must pass tdm_tile_check for the
 * kernel that serves m rows): the sweep's and the tests' entry point. */
int tdm_matmul_skinny(const struct tdm_dweight *w, const uint16_t *x, int64_t ldx, int64_t m,
                      void *y, int64_t ldy, enum tdm_mm_out out, const struct tdm_tile *tile,
                      void *stream);
/* The same with x's blocked copy (tdm_matmul_xb). */
int tdm_matmul_skinny_xb(const struct tdm_dweight *w, const uint16_t *x, int64_t ldx, const uint16_t *xb, int64_t m,
                         void *y, int64_t ldy, enum tdm_mm_out out, const struct tdm_tile *tile, void *stream);

/* tdm_matmul_skinny_xb with a setting whose kchains may differ from the shape's (tdm_tile_check_plan):
 * another sum order, row-invariant in itself. For tandem-sweep --plan, which times chain counts to
 * choose tdm_mm_kchains (with x's blocked copy where the engine has one, so that it times the forms
 * the engine runs); nothing that serves a model calls it. */
int tdm_matmul_skinny_plan(const struct tdm_dweight *w, const uint16_t *x, int64_t ldx, const uint16_t *xb, int64_t m,
                           void *y, int64_t ldy, enum tdm_mm_out out, const struct tdm_tile *tile, void *stream);

/* SwiGLU in one product: y[m][n] = bf16(bf16(silu(g)) * u) with g and u the BF16 outputs that
 * tdm_matmul would give for gate and up (the same bits: each warp takes both weights' rows of the
 * same 8 outputs, with the setting and chains of the gate's shape; then tdm_silu_mul's roundings),
 * in one launch instead of three. tdm_matmul_swiglu_ok says whether a call can run so (1): gate
 * and up of one shape and format, 1..32 rows, the shape's setting with nt 2 (FP8: at 1-16 rows with
 * x's blocked copy xb, read per lane: its only nt 2 form), weight and activation rows aligned; else
 * tdm_matmul_swiglu refuses (-1 with tdm_err()) and the caller runs the two products and
 * tdm_silu_mul. xb: x's blocked copy or NULL (tdm_matmul_xb), the same in both calls; yb: NULL, or
 * where y's blocked copy goes as well (m <= TDM_MM_XB_ROWS), for the product that reads y. */
int tdm_matmul_swiglu_ok(const struct tdm_dweight *gate, const struct tdm_dweight *up, const uint16_t *x, int64_t ldx,
                         const uint16_t *xb, int64_t m, const struct tdm_tiles *tiles);
/* Whether the one launch is the faster at m rows of gate's format and order, where it can run (the
 * engine's TANDEM_MLP_FUSE=auto): at every row count but 9-24 of NVFP4 held in rows (9-16 with
 * TDM_MLP_GATED_UP=0; a build with TDM_MM_NVFP4_TILES=0). Held tile-major (the default), the one launch
 * ran a 16-layer 27B's 12-, 16- and 24-row verifies 1.5 / 1.2 / 1.6 % faster than the gated form (the
 * median of five paired passes on an H100, one pair of five the other way; 1 and 32 rows, where both
 * run one launch, +0.1 and -0.4 %), and alone 41.05 against 42.80 us at 16 rows (bench/NOTES.md, the
 * twenty-sixth session). Held in rows, at 9-16 it ran the 12- and 16-row verifies ~0.1 ms slower than
 * the three launches, and the pair alone 51.6 us against two products' 2 x 20.5 at 16 rows. Under ncu
 * (bench/NOTES.md, the 9-16-row SwiGLU pair) its warps are latency-bound at the plain product's issue
 * rate and it executes 2.33x the instructions for 2x the bytes (the SwiGLU epilogue), so in rows it
 * cannot beat the two launches there. At
 * 17-24 rows (the 17-24-row form) the gate's product and up's with the SiLU x up (tdm_matmul_gated)
 * ran the 16-layer 27B's verifies 1.2-1.8 % faster; at 25-32 they tie, and the one launch stays (H100,
 * bench/NOTES.md, the gated up product). FP8's (1-16 rows) pays at every row count: the 27B's pair
 * 64.0-64.8 / 72.0 us at 1 / 16 rows against 2 x 32.6-33.6 / 2 x 39.9, and the SiLU x up's launch
 * (H100, bench/NOTES.md, FP8 SwiGLU; not measured against the gated up product). A speed fact only:
 * the bits are the same. */
int tdm_matmul_swiglu_pays(const struct tdm_dweight *gate, int64_t m);
int tdm_matmul_swiglu(const struct tdm_dweight *gate, const struct tdm_dweight *up, const uint16_t *x, int64_t ldx,
                      const uint16_t *xb, int64_t m, uint16_t *y, int64_t ldy, uint16_t *yb,
                      const struct tdm_tiles *tiles, void *stream);

/* TDM_MLP_GATED_UP: where the engine's SwiGLU does not run as one product (tdm_engine_dense_mlp) and
 * m <= 32, up's product applies the SiLU x up in its epilogue (tdm_matmul_gated: 1, the default)
 * instead of a tdm_silu_mul launch after it (0; then NVFP4's one launch pays from 17 rows again:
 * tdm_matmul_swiglu_pays). A build-time knob for A/B runs; the same bits either way. */
#ifndef TDM_MLP_GATED_UP
#define TDM_MLP_GATED_UP 1
#endif
/* Whether up's product with the SiLU x up in its epilogue (tdm_matmul_gated) is the faster at m rows
 * of up's format than up's product and a tdm_silu_mul launch, where the SwiGLU is not one launch (the
 * engine's choice, with TDM_MLP_GATED_UP): at 1-32 rows but FP8's 17-24. There, on a 16-layer FP8
 * 27B, four alternated passes ran the 17-, 20- and 24-row verifies 0.6-0.7 % slower with it (11 of 12
 * pairs slower by -0.2 to +1.6 %) and the 32-row one 1.3 % faster (H100, bench/NOTES.md, FP8's gated
 * up product). A speed fact only: the bits are the same. */
int tdm_matmul_gated_pays(const struct tdm_dweight *up, int64_t m);
/* TANDEM_MLP_FUSE: whether a dense MLP runs gate, up and SiLU x up as one SwiGLU product
 * (tdm_matmul_swiglu) where the setting allows: never, always, or where tdm_matmul_swiglu_pays. */
enum tdm_mlp_fuse { TDM_MLP_FUSE_OFF, TDM_MLP_FUSE_ON, TDM_MLP_FUSE_AUTO };
/* A SwiGLU's three forms, the same bits: one launch (tdm_matmul_swiglu); the gate's product, then up's
 * with the SiLU x up (tdm_matmul_gated); the two products and tdm_silu_mul. */
enum tdm_swiglu_form { TDM_SWIGLU_ONE, TDM_SWIGLU_GATED, TDM_SWIGLU_THREE };
/* The form the engine's dense MLP runs (tdm_engine_dense_mlp) at m rows under fuse: one launch where
 * fuse is not off, tdm_matmul_swiglu_ok allows it and fuse is on or tdm_matmul_swiglu_pays; else the
 * gated up product where TDM_MLP_GATED_UP and tdm_matmul_gated_pays; else three launches. */
enum tdm_swiglu_form tdm_matmul_swiglu_form(enum tdm_mlp_fuse fuse, const struct tdm_dweight *gate,
                                            const struct tdm_dweight *up, const uint16_t *x, int64_t ldx,
                                            const uint16_t *xb, int64_t m, const struct tdm_tiles *tiles);
/* Runs a SwiGLU pair in the given form: g[m][I] = bf16(bf16(silu(x gate^T)) * (x up^T)), I = gate->n,
 * row stride I; the same bits in every form. u: room for up's output (m x I, stride I), written by the
 * three launches only. gb: NULL, or g's blocked copy for the next product (tdm_matmul_xb). xb: x's
 * blocked copy or NULL. The form must suit m and the pair (tdm_matmul_swiglu_form). */
int tdm_matmul_swiglu_run(enum tdm_swiglu_form form, const struct tdm_dweight *gate, const struct tdm_dweight *up,
                          const uint16_t *x, int64_t ldx, const uint16_t *xb, int64_t m, uint16_t *g, uint16_t *u,
                          uint16_t *gb, const struct tdm_tiles *tiles, void *stream);
/* The forms tdm_matmul_swiglu_form picks for this pair at 1..TDM_MM_MAX_ROWS rows, in words for the
 * engine's line: each form with its row ranges, in the order they first appear, and the three launches
 * past 32 rows (the wide product), e.g. "one launch at 1-8 and 25-32 rows; gate, then up with the SiLU x
 * up at 9-24 rows; three launches past 32 rows". xb: x's blocked copy, read at up to TDM_MM_XB_ROWS
 * rows, or NULL. Returns buf (n bytes, truncated to fit). */
const char *tdm_matmul_swiglu_forms(enum tdm_mlp_fuse fuse, const struct tdm_dweight *gate, const struct tdm_dweight *up,
                                    const uint16_t *x, int64_t ldx, const uint16_t *xb, const struct tdm_tiles *tiles,
                                    char *buf, size_t n);
/* The up projection of a SwiGLU with the SiLU x up in its epilogue: y[m][n] = bf16(bf16(silu(g)) * u)
 * with g the gate's BF16 output (gate, row stride ldg: tdm_matmul's for the gate weight, written
 * before this call on its stream) and u the BF16 output tdm_matmul would give for up: the same bits
 * as tdm_matmul of up, then tdm_silu_mul, in one launch instead of two. gate may be y (each element is
 * read, then written, by one thread). The skinny kernels only (1..32 rows; -1 with tdm_err() past
 * them: the caller runs the wide product and tdm_silu_mul). xb: x's blocked copy or NULL; yb: NULL, or
 * where y's blocked copy goes as well (m <= TDM_MM_XB_ROWS). */
int tdm_matmul_gated(const struct tdm_dweight *up, const uint16_t *x, int64_t ldx, const uint16_t *xb, int64_t m,
                     const uint16_t *gate, int64_t ldg, uint16_t *y, int64_t ldy, uint16_t *yb,
                     const struct tdm_tiles *tiles, void *stream);

/* The wide GEMM for any m >= 1 (tdm_matmul sends m > 32 here). */
int tdm_matmul_wide(const struct tdm_dweight *w, const uint16_t *x, int64_t ldx, int64_t m, void *y,
                    int64_t ldy, enum tdm_mm_out out, void *stream);

/* Bytes one product of m rows must read: the view's weights and scales plus m rows of x. */
int64_t tdm_matmul_bytes(const struct tdm_dweight *w, int64_t m);

/* ---- device helpers for tests, sweeps and benchmarks (kernels/coldbw.cu) ---------------------- */

/* Fills bytes with a deterministic pseudo-random stream (seed). mask/or shape each byte
 * (b & mask) | set, so that callers can keep e4m3 codes away from NaN (mask 0x77 keeps exponents
 * <= 14). */
int tdm_dev_fill_bytes(void *p, size_t bytes, uint64_t seed, uint8_t mask, uint8_t set, void *stream);
/* Fills n BF16 values uniform in [-amp, amp). */
int tdm_dev_fill_bf16(uint16_t *p, size_t n, uint64_t seed, float amp, void *stream);
/* Which NVFP4 products of 1-16 rows (from x's blocked copy: NVFP4 and FP8 products of 1-32 rows)
 * load their activations per lane instead of staging them in shared memory (kernels/mm_skinny.cuh:
 * DA; the operands are the same, so the bits): TANDEM_MM_DIRECT, read at the first call unless
 * tdm_mm_set_direct() said otherwise (tests compare the forms in one process; -1 reads the setting
 * again). Auto, the default: from TDM_MM_DIRECT_AUTO_ROWS rows, which is every row count since the
 * form keeps the table's load depth and zeros in rows 8-15. Measured inside
 * the engine's rounds on the H200 (a 16-layer 27B, tandem-benchround, bench/NOTES.md, the direct
 * form's load depth): per lane against staged, a one-row verify 3.221 against 3.233 ms, 2 rows 2 %
 * faster, 3-4 rows 5 %, 8 rows 10 %, 16 rows 1 %. */
enum { TDM_MM_DIRECT_OFF, TDM_MM_DIRECT_AUTO, TDM_MM_DIRECT_ON };
#define TDM_MM_DIRECT_AUTO_ROWS 1
int tdm_mm_direct_mode(void);
void tdm_mm_set_direct(int mode);
/* Whether a product of m rows runs with the activations loaded per lane (where the kernel has the form). */
int tdm_mm_direct_rows(int64_t m);
/* Fills n F32 values uniform in [lo, hi). */
int tdm_dev_fill_f32(float *p, size_t n, uint64_t seed, float lo, float hi, void *stream);
/* Counts positions where a and b differ (bytes); *diff is a host int64. Synchronous. */
int tdm_dev_count_diff(const void *a, const void *b, size_t bytes, int64_t *diff, void *stream);

/* Streaming read of `bytes` from p (16-byte loads over the whole GPU); the result goes to *sink
 * (device) so that the reads cannot be removed. */
int tdm_dev_read(const void *p, size_t bytes, uint64_t *sink, void *stream);
/* Where the bytes a warp reads in one slab (16 rows x 64 bytes: 1 KB) lie, for tdm_dev_read_rows:
 * in the rows as stored (row-major, each row's slab a 64-byte piece: the skinny kernels' layout);
 * one 16-row tile's slabs one after another (TILES: each warp reads one run of memory); or slab by
 * slab, every tile's 1 KB of slab s side by side before slab s + 1 (SLABS: the warps, which move
 * through K together, read one run of memory between them, as a streaming read does). The same
 * bytes, warps and depth in each: what the order of the weights in memory alone is worth. */
enum tdm_rows_layout { TDM_ROWS_STORED, TDM_ROWS_TILES, TDM_ROWS_SLABS };
/* The NVFP4 skinny kernel's weight reads alone (no decode, no mma): n rows of rowbytes, each warp 16
 * rows and one of `chains` parts of K cut as the kernel cuts them, lane (g, t) 16 bytes of rows g
 * and g + 8 a 64-byte slab (TDM_ROWS_STORED; the other layouts: the lane's 32 bytes of the warp's
 * 1 KB), depth (1, 2, 4 or 8) slabs in flight. n a multiple of 16, rowbytes of 64. */
int tdm_dev_read_rows(const void *w, int64_t n, int64_t rowbytes, int chains, int depth, enum tdm_rows_layout layout,
                      uint64_t *sink, void *stream);
/* The copy of w's stored matrix (rows 0 .. row0 + n) in order `order` (mm_layout.h:
 * TDM_MM_ORDER_TILES, the stored rows a multiple of 16): codes (the stored matrix's bytes) and, NVFP4,
 * scales (its group scales' bytes) in that order; FP8's block scales stay as stored. NVFP4 or FP8, k
 * a multiple of TDM_MM_SLAB_K. Asynchronous. */
int tdm_dev_reorder(const struct tdm_dweight *w, int order, void *codes, void *scales, void *stream);
/* A kernel of `blocks` blocks of 128 threads that only waits for the kernel before it and bumps
 * sink[1] (a programmatic launch where TANDEM_PDL is on): a launch's floor in a chain of dependent
 * kernels. */
int tdm_dev_launch_floor(uint64_t *sink, int blocks, void *stream);
/* Copy of `bytes` from src to dst with 16-byte loads and stores. */
int tdm_dev_copy(void *dst, const void *src, size_t bytes, void *stream);

/* ---- cold working sets and timing (kernels/coldbw.cu), for the sweep, coldbw and benchmark ---- */

/* `copies` distinct device copies of one weight shape with pseudo-random contents (valid codes: no
 * NaN scales), at least min_bytes in all, so that timing them in turn streams from memory. */
struct tdm_wset {
    int copies;
    struct tdm_dweight *w;   /* copies views, each a whole weight */
    void *mem;
    size_t bytes;            /* of all copies */
};
int tdm_wset_alloc(struct tdm_wset *s, enum tdm_wfmt fmt, int64_t n, int64_t k, enum tdm_dtype scale_dt,
                   size_t min_bytes, int min_copies, uint64_t seed);
void tdm_wset_free(struct tdm_wset *s);

/* Launches call i (0 <= i < calls) on the stream; returns 0 or -1 with tdm_err(). */
typedef int (*tdm_launch_fn)(void *ctx, int i, void *stream);
/* Times `calls` launches back to back, `reps` times after one warm-up pass (the first timing of a
 * process and the first after tdm_wset_alloc or tdm_wset_free: passes until they took 100 ms,
 * kernels/coldbw.cu, TDM_TIME_WARMUP_MS), either captured in one CUDA graph (graph != 0) or eagerly;
 * *ms_per_call is the median over the repeats of the pass time divided by calls. */
int tdm_time_calls(tdm_launch_fn fn, void *ctx, int calls, int reps, int graph, void *stream, double *ms_per_call);
/* The GPU's L2 size in bytes (0 if unknown). */
size_t tdm_dev_l2_bytes(void);

/* ---- the library baselines the benchmark compares against (kernels/gemm_cublas.cu) ------------ */
struct tdm_cublas;
/* A cuBLAS and a cuBLASLt handle bound to stream, with their own workspace (so that calls can be
 * captured in CUDA graphs). */
int tdm_cublas_create(struct tdm_cublas **h, void *stream);
void tdm_cublas_destroy(struct tdm_cublas *h);
/* y[m][n] = x[m][k] W[n][k]^T, BF16 in and out, FP32 accumulation (cublasGemmEx). */
int tdm_cublas_bf16(struct tdm_cublas *h, const uint16_t *w, int64_t n, int64_t k, const uint16_t *x, int64_t m, uint16_t *y);
/* The same with e4m3 weights and e4m3 activations, BF16 out (cuBLASLt): block-scaled where
 * cuBLASLt has an algorithm for it, else per-tensor scales. Returns 1 (and does nothing) when
 * cuBLASLt has no algorithm for the shape at all. */
int tdm_cublaslt_fp8(struct tdm_cublas *h, const uint8_t *w, int64_t n, int64_t k, const uint8_t *x, int64_t m, uint16_t *y);
/* Whether the last tdm_cublaslt_fp8 plan is block-scaled (128x128 weight blocks, 1x128 activation
 * blocks, F32 scales, as the checkpoints store FP8); 0: per-tensor, cuBLASLt had no block-scaled
 * algorithm for the shape. */
int tdm_cublaslt_fp8_block(const struct tdm_cublas *h);
#ifdef __cplusplus
}
#endif
#endif
