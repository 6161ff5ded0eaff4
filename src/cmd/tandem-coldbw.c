/* tandem-coldbw — memory bandwidth with a working set far larger than the L2: a streaming read
 * and a copy over rotating buffers, and the effective bandwidth of a matrix kernel (the bytes it
 * must read over its time) at one shape and row count. Medians of repeats; a table on stdout. */
#include "device.h"
#include "err.h"
#include "jsonfile.h"
#include "matmul.h"
#include "mm_layout.h"
#include "settings.h"
#include "shapes.h"
#include "tiles.h"
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *prog = "tandem-coldbw";

static void usage(FILE *f)
{
    fprintf(f,
            "usage: %s [options]\n"
            "Memory bandwidth over a working set at least 8x the GPU's L2 (rotating buffers):\n"
            "streaming read and copy, a launch's floor (a kernel that only waits for the one before\n"
            "it, 64 in a CUDA graph, programmatic unless TANDEM_PDL=off), and optionally a matrix\n"
            "kernel's bytes read over its time.\n"
            "  --mib N        size of each of the 4 rotating buffers in MiB (default: 8x L2, at least 512)\n"
            "  --reps N       timed repeats; the median is reported (default 20)\n"
            "  --kernel F     also time the matrix kernel for weights in format F: nvfp4, fp8 or bf16\n"
            "                 (also on one weight copy, from L2 where it fits: 'one copy');\n"
            "                 nvfp4 also times its weight reads alone (the kernel's access pattern with\n"
            "                 1, 2, 4 and 8 slabs in flight a warp, no arithmetic: 'rows'), and the\n"
            "                 same reads with the weights stored tile by tile ('tiles') or slab by slab\n"
            "                 ('slabs') at 1 and 4, when N is a multiple of 16 and K of 128\n"
            "  --shape N,K    the weight shape for --kernel (N outputs, K inputs)\n"
            "  --rows M       activation rows for --kernel (default 1; above 32 runs the wide GEMM)\n"
            "  --json FILE    also write the results as JSON\n"
            "  -h, --help     this text\n"
            "Tile tables come from $TANDEM_TILES (default \"tiles\"). Exit 0, 1 when a CUDA call fails,\n"
            "2 on bad usage or when no CUDA device is visible.\n",
            prog);
}


struct mm_ctx {
    struct tdm_wset *ws;
    const uint16_t *x;
    const uint16_t *xb;   /* x's blocked copy (NVFP4 at 1-32 rows), or NULL */
    void *y;
    int64_t m;
    const struct tdm_tiles *tiles;
};

static int mm_call(void *p, int i, void *stream)
{
    struct mm_ctx *c = p;
    const struct tdm_dweight *w = &c->ws->w[i % c->ws->copies];
    return tdm_matmul_xb(w, c->x, w->k, c->xb, c->m, c->y, w->n, TDM_MM_BF16, c->tiles, stream);
}

/* The NVFP4 weights of a working set read the skinny kernel's way, nothing else done. */
struct rows_ctx {
    struct tdm_wset *ws;
    int chains, depth;
    enum tdm_rows_layout layout;
    uint64_t *sink;
};

static int rows_call(void *p, int i, void *stream)
{
    struct rows_ctx *c = p;
    const struct tdm_dweight *w = &c->ws->w[i % c->ws->copies];
    return tdm_dev_read_rows(w->w, w->n, w->k / 2, c->chains, c->depth, c->layout, c->sink, stream);
}

/* The launch floor: a kernel that only waits for the one before it (sink: 16 bytes of device memory). */
struct floor_ctx { uint64_t *sink; int blocks; };
static int floor_call(void *p, int i, void *stream)
{
    (void)i;
    struct floor_ctx *c = p;
    return tdm_dev_launch_floor(c->sink, c->blocks, stream);
}

/* One line of the table: what was timed, the bytes it moved, the median time, the rate. */
static void table_line(const char *name, double bytes, double ms)
{
    printf("%-34s %14.0f %12.5f %10.1f\n", name, bytes, ms, bytes / ms / 1e6);
}

struct buf_ctx {
    void *buf[4];
    size_t bytes;
    uint64_t *sink;
    int copy;
};

static int buf_call(void *p, int i, void *stream)
{
    struct buf_ctx *c = p;
    if (c->copy) return tdm_dev_copy(c->buf[(i + 1) % 4], c->buf[i % 4], c->bytes, stream);
    return tdm_dev_read(c->buf[i % 4], c->bytes, c->sink, stream);
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"mib", required_argument, 0, 'b'}, {"reps", required_argument, 0, 'r'},
        {"kernel", required_argument, 0, 'k'}, {"shape", required_argument, 0, 's'},
        {"rows", required_argument, 0, 'm'}, {"json", required_argument, 0, 'j'},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0},
    };
    long mib = 0, reps = 20, rows = 1;
    const char *kernel = NULL, *shape = NULL, *json_path = NULL;
    int c;
    while ((c = tdm_getopt(prog, argc, argv, "h", opts)) != -1) {
        switch (c) {
        case 'b': mib = tdm_opt_long(prog, "--mib", optarg, 64, 1 << 20); break;
        case 'r': reps = tdm_opt_long(prog, "--reps", optarg, 1, 100000); break;
        case 'k': kernel = optarg; break;
        case 's': shape = optarg; break;
        case 'm': rows = tdm_opt_long(prog, "--rows", optarg, 1, 1 << 20); break;
        case 'j': json_path = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return TDM_EXIT_USAGE;
        }
    }
    if (optind < argc) tdm_die_usage(prog, "unexpected argument", argv[optind]);
    enum tdm_wfmt fmt = TDM_W_NVFP4;
    int64_t n = 0, k = 0;
    if (kernel) {
        if (strcmp(kernel, "nvfp4") == 0) fmt = TDM_W_NVFP4;
        else if (strcmp(kernel, "fp8") == 0) fmt = TDM_W_FP8;
        else if (strcmp(kernel, "bf16") == 0) fmt = TDM_W_BF16;
        else tdm_die_usage(prog, "--kernel: expected nvfp4, fp8 or bf16, not", kernel);
        if (!shape) tdm_die_usage(prog, "--kernel needs --shape N,K", NULL);
        if (tdm_parse_shape(shape, &n, &k) != 0) tdm_die_usage(prog, "--shape: expected N,K with positive integers, not", shape);
        if (fmt == TDM_W_NVFP4 && k % 16) tdm_die_usage(prog, "--shape: NVFP4 needs K a multiple of 16", shape);
    } else if (shape) {
        tdm_die_usage(prog, "--shape needs --kernel", NULL);
    }
    if (tdm_settings_check() != 0) tdm_die_input(prog);
    if (tdm_cuda_device_count() < 1) tdm_die_usage(prog, "no CUDA device visible", NULL);

    struct tdm_device_info info;
    if (tdm_cuda_device_info(0, &info) != 0) tdm_die_check(prog);
    const size_t l2 = info.l2_bytes ? info.l2_bytes : (60u << 20);
    size_t each = mib ? (size_t)mib << 20 : 8 * l2;
    if (!mib && each < (512u << 20)) each = 512u << 20;
    each &= ~(size_t)255;
    fprintf(stderr, "# %s: %s, %d SMs, L2 %zu MiB; 4 buffers of %zu MiB (%.1fx L2 each)\n", prog, info.name,
            info.sm_count, l2 >> 20, each >> 20, (double)each / l2);

    tdm_stream st;
    if (tdm_stream_create(&st) != 0) tdm_die_check(prog);
    struct buf_ctx bc = {.bytes = each};
    for (int i = 0; i < 4; i++) {
        if (tdm_cuda_malloc(&bc.buf[i], each) != 0) tdm_die_check(prog);
        if (tdm_dev_fill_bytes(bc.buf[i], each, 11 + i, 0xff, 0, st) != 0) tdm_die_check(prog);
    }
    if (tdm_cuda_malloc((void **)&bc.sink, 64) != 0 || tdm_stream_sync(st) != 0) tdm_die_check(prog);
    double read_ms, copy_ms;
    bc.copy = 0;
    if (tdm_time_calls(buf_call, &bc, 4, (int)reps, 0, st, &read_ms) != 0) tdm_die_check(prog);
    bc.copy = 1;
    if (tdm_time_calls(buf_call, &bc, 4, (int)reps, 0, st, &copy_ms) != 0) tdm_die_check(prog);
    const double read_gbps = each / read_ms / 1e6, copy_gbps = 2.0 * each / copy_ms / 1e6;
    printf("%-34s %14s %12s %10s\n", "test", "bytes", "median_ms", "GB/s");
    table_line("read", (double)each, read_ms);
    table_line("copy (read + write)", 2.0 * each, copy_ms);
    for (int i = 0; i < 4; i++) tdm_cuda_free(bc.buf[i]);
    /* what a kernel in a chain of dependent launches costs when it does nothing: one block a SM,
     * 64 launches in a CUDA graph (programmatic where TANDEM_PDL is on) */
    struct floor_ctx fc = {.sink = bc.sink, .blocks = info.sm_count};
    double floor_ms;
    if (tdm_time_calls(floor_call, &fc, 64, (int)reps, 1, st, &floor_ms) != 0) tdm_die_check(prog);
    table_line(tdm_cuda_pdl() ? "launch floor (graph, programmatic)" : "launch floor (graph, plain)", 0.0, floor_ms);

    json_t *rec = json_object();
    json_object_set_new(rec, "device", json_string(info.name));
    json_object_set_new(rec, "sms", json_integer(info.sm_count));
    json_object_set_new(rec, "l2_bytes", json_integer((json_int_t)l2));
    json_object_set_new(rec, "buffer_bytes", json_integer((json_int_t)each));
    json_object_set_new(rec, "reps", json_integer(reps));
    json_object_set_new(rec, "read", json_pack("{s:I, s:f, s:f}", "bytes", (json_int_t)each, "ms", read_ms, "gbps", read_gbps));
    json_object_set_new(rec, "copy", json_pack("{s:I, s:f, s:f}", "bytes", (json_int_t)(2 * each), "ms", copy_ms, "gbps", copy_gbps));
    json_object_set_new(rec, "launch_floor", json_pack("{s:b, s:f}", "programmatic", tdm_cuda_pdl(), "ms", floor_ms));

    if (kernel) {
        char arch[32];
        struct tdm_tiles *tiles;
        tdm_tiles_arch(info.sm_major, info.sm_minor, arch, sizeof arch);
        if (tdm_tiles_load(NULL, arch, &tiles) != 0) tdm_die_input(prog);
        struct tdm_wset ws;
        if (tdm_wset_alloc(&ws, fmt, n, k, TDM_DT_F32, 8 * l2, 2, 7) != 0) tdm_die_check(prog);
        struct mm_ctx mc = {.ws = &ws, .m = rows, .tiles = tiles};
        if (tdm_cuda_malloc((void **)&mc.x, (size_t)(rows * k * 2)) != 0 || tdm_cuda_malloc(&mc.y, (size_t)(rows * n * 2)) != 0)
            tdm_die_check(prog);
        if (tdm_dev_fill_bf16((uint16_t *)mc.x, (size_t)(rows * k), 5, 1.0f, st) != 0) tdm_die_check(prog);
        /* NVFP4 at 1-32 rows reads x's blocked copy, as the engine's kernels write it beside x */
        if (fmt == TDM_W_NVFP4 && tdm_mm_xb_serves(rows, k) &&
            (tdm_cuda_malloc((void **)&mc.xb, (size_t)tdm_mm_xb_elems(k) * 2) != 0 ||
             tdm_mm_pack_xb(mc.x, k, rows, k, (uint16_t *)mc.xb, st) != 0 || tdm_stream_sync(st) != 0))
            tdm_die_check(prog);
        const double bytes = (double)tdm_matmul_bytes(&ws.w[0], rows);
        double eager_ms, graph_ms;
        if (tdm_time_calls(mm_call, &mc, ws.copies, (int)reps, 0, st, &eager_ms) != 0) tdm_die_check(prog);
        if (tdm_time_calls(mm_call, &mc, ws.copies, (int)reps, 1, st, &graph_ms) != 0) tdm_die_check(prog);
        char name[96];
        snprintf(name, sizeof name, "%s %" PRId64 "x%" PRId64 " m=%ld eager", kernel, n, k, rows);
        table_line(name, bytes, eager_ms);
        snprintf(name, sizeof name, "%s %" PRId64 "x%" PRId64 " m=%ld graph", kernel, n, k, rows);
        table_line(name, bytes, graph_ms);
        /* the same calls on one weight copy: from L2 when the weights fit in it (what a product
         * whose weights were brought in ahead could reach; not a result for the read figure) */
        struct tdm_wset one = ws;
        one.copies = 1;
        struct mm_ctx mc1 = mc;
        mc1.ws = &one;
        double one_copy_ms;
        if (tdm_time_calls(mm_call, &mc1, ws.copies, (int)reps, 1, st, &one_copy_ms) != 0) tdm_die_check(prog);
        snprintf(name, sizeof name, "%s %" PRId64 "x%" PRId64 " m=%ld one copy", kernel, n, k, rows);
        table_line(name, bytes, one_copy_ms);
        fprintf(stderr, "# %s: %d weight copies (%zu MiB) rotated per pass\n", prog, ws.copies, ws.bytes >> 20);
        /* NVFP4: the same weights read the kernel's way with nothing else done (tdm_dev_read_rows), at
         * 1-8 slabs in flight a warp: what the access pattern allows apart from the arithmetic; the
         * random weights read as if stored in another order measure that order (the same bytes) */
        json_t *pattern = json_array();
        const int chains = tdm_mm_kchains(n, k);
        if (fmt == TDM_W_NVFP4 && n % 16 == 0 && k % 128 == 0) {
            const double wb = (double)n * (double)k / 2;   /* the codes alone: no scales, no activations */
            /* then the same reads with the weights in another order (enum tdm_rows_layout), at depth 1
             * (the one-row kernels' pf) and 4 */
            static const struct { enum tdm_rows_layout layout; const char *what, *json; } lay[] = {
                {TDM_ROWS_STORED, "rows", "stored"},
                {TDM_ROWS_TILES, "tiles", "tiles"},
                {TDM_ROWS_SLABS, "slabs", "slabs"},
            };
            for (size_t l = 0; l < sizeof lay / sizeof *lay; l++)
                for (int depth = 1; depth <= 8; depth *= 2) {
                    if (l > 0 && depth != 1 && depth != 4) continue;
                    struct rows_ctx rc = {.ws = &ws, .chains = chains, .depth = depth, .layout = lay[l].layout, .sink = bc.sink};
                    double ms;
                    if (tdm_time_calls(rows_call, &rc, ws.copies, (int)reps, 1, st, &ms) != 0) tdm_die_check(prog);
                    snprintf(name, sizeof name, "nvfp4 %s read alone, depth %d", lay[l].what, depth);
                    table_line(name, wb, ms);
                    json_array_append_new(pattern, json_pack("{s:s, s:i, s:i, s:f, s:f}", "layout", lay[l].json, "depth", depth,
                                                             "chains", chains, "ms", ms, "gbps", wb / ms / 1e6));
                }
        }
        json_object_set_new(rec, "kernel",
                            json_pack("{s:s, s:I, s:I, s:i, s:f, s:i, s:f, s:f, s:f, s:f}", "format", kernel, "n", (json_int_t)n,
                                      "k", (json_int_t)k, "rows", (int)rows, "bytes", bytes, "copies", ws.copies, "eager_ms",
                                      eager_ms, "eager_gbps", bytes / eager_ms / 1e6, "graph_ms", graph_ms, "graph_gbps",
                                      bytes / graph_ms / 1e6));
        json_object_set_new(json_object_get(rec, "kernel"), "one_copy_ms", json_real(one_copy_ms));
        json_object_set_new(rec, "rows_read_alone", pattern);
        tdm_cuda_free((void *)mc.x);
        tdm_cuda_free((void *)mc.xb);
        tdm_cuda_free(mc.y);
        tdm_wset_free(&ws);
        tdm_tiles_free(tiles);
    }
    if (json_path && tdm_json_write_atomic(json_path, rec, JSON_INDENT(2)) != 0) {
        fprintf(stderr, "%s: %s\n", prog, tdm_err());
        return TDM_EXIT_USAGE;
    }
    json_decref(rec);
    tdm_cuda_free(bc.sink);
    tdm_stream_destroy(st);
    return 0;
}
