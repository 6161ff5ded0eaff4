/* tandem-benchmm — the matrix-product benchmark: for every projection shape of the served models,
 * at each row count, the project's NVFP4 and FP8 kernels (time, GB/s, fraction of the streaming
 * read bandwidth measured at the start of the same run) against cuBLAS BF16 and cuBLASLt FP8 on
 * the same shape and rows, eager and inside a CUDA graph; each SwiGLU pair (gate and up of one
 * shape) in the engine's three forms (one launch for both; the gate's product, then up's with the
 * SiLU x up in its epilogue; the two products and the SiLU x up kernel), NVFP4 and FP8, each line
 * naming the formats whose engine runs that form at that row count; then one line per row count
 * for a whole Qwen3.8-27B token: all 64 layers' projections back to back in one graph. Every timing
 * rotates over weight copies that together exceed 8x the L2 (cold), median of repeats. */
#include "cli.h"
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

static const char *prog = "tandem-benchmm";

static void usage(FILE *f)
{
    fprintf(f,
            "usage: %s [options]\n"
            "Times the matrix kernels on every projection shape of the served models against cuBLAS,\n"
            "each SwiGLU pair in the engine's three forms, NVFP4 and FP8 (<p>gate+up: both weights in\n"
            "one launch, n/a where the setting does not run as one product; <p>gate;up*silu: the gate's\n"
            "product, then up's with SiLU(gate) x up in its epilogue, 1-32 rows; <p>gate;up;silu: the two\n"
            "products and the SiLU x up kernel), each line marked with the formats whose engine runs it,\n"
            "and a whole Qwen3.8-27B token's projections in one CUDA graph. Table on stdout.\n"
            "  --model NAME     qwen3.8-27b or qwen3-next-80b (repeatable; default both)\n"
            "  --rows LIST      row counts, comma-separated (default 1,2,4,8,16,24,32)\n"
            "  --reps N         timed repeats, median taken (default 10)\n"
            "  --no-baseline    skip cuBLAS and cuBLASLt\n"
            "  --no-token       skip the whole-token lines\n"
            "  --no-xb          our kernels read the activations as written at every row count (by default\n"
            "                   NVFP4 and FP8 at 1-32 rows read their blocked copy, packed once before the timing,\n"
            "                   as the engine's kernels write it beside x: kernels/mm_layout.h)\n"
            "  --json FILE      every measurement as JSON\n"
            "  -h, --help       this text\n"
            "Exit 0; 1 when a CUDA call fails; 2 on bad usage or when no CUDA device is visible.\n",
            prog);
}


static struct tdm_tiles *tiles;
static struct tdm_cublas *blas;
static tdm_stream st;
static int reps = 10;
static size_t l2;

/* ---- one timed thing: a call over rotating weight copies ---- */
enum which { OURS, OURS_PAIR, CUBLAS_BF16, CUBLASLT_FP8 };
struct call {
    enum which what;
    struct tdm_wset *ws;   /* OURS_PAIR: the gate's copies */
    const uint16_t *x;     /* BF16 activations */
    const uint8_t *x8;     /* e4m3 activations for cuBLASLt */
    void *y;
    int64_t m;
    const uint16_t *xb;    /* x's blocked copy for our kernels (NULL: none) */
    struct tdm_wset *wu;   /* OURS_PAIR: the up projection's copies (as many as the gate's) */
    uint16_t *u;           /* OURS_PAIR in three launches: up's output (y holds the gate's, then the SiLU x up) */
    enum tdm_swiglu_form form;   /* OURS_PAIR: as tdm_engine_dense_mlp runs it */
};

static int use_xb = 1;    /* --no-xb clears */
/* x's blocked copy for m rows of k into xb (room for tdm_mm_xb_elems(k)), where our kernels read
 * one (1-32 rows, --no-xb not given); returns xb, or NULL for none. */
static const uint16_t *pack_xb(const uint16_t *x, int64_t m, int64_t k, uint16_t *xb)
{
    if (!use_xb || !tdm_mm_xb_serves(m, k)) return NULL;
    if (tdm_mm_pack_xb(x, k, m, k, xb, st) != 0 || tdm_stream_sync(st) != 0) tdm_die_check(prog);
    return xb;
}

static int do_call(void *p, int i, void *stream)
{
    struct call *c = p;
    const struct tdm_dweight *w = &c->ws->w[i % c->ws->copies];
    switch (c->what) {
    case OURS: return tdm_matmul_xb(w, c->x, w->k, c->xb, c->m, c->y, w->n, TDM_MM_BF16, tiles, stream);
    case OURS_PAIR:
        return tdm_matmul_swiglu_run(c->form, w, &c->wu->w[i % c->wu->copies], c->x, w->k, c->xb, c->m, c->y, c->u, NULL,
                                     tiles, stream);
    case CUBLAS_BF16: return tdm_cublas_bf16(blas, w->w, w->n, w->k, c->x, c->m, c->y);
    default: {
        int rc = tdm_cublaslt_fp8(blas, w->w, w->n, w->k, c->x8, c->m, c->y);
        return rc < 0 ? -1 : rc ? tdm_errf("cuBLASLt: no FP8 algorithm") : 0;
    }
    }
}

/* Median ms per call, eager or in a graph; -1 when the library has no algorithm. */
static double time_it(struct call *c, int graph)
{
    if (c->what == CUBLASLT_FP8) {
        const struct tdm_dweight *w = &c->ws->w[0];
        int rc = tdm_cublaslt_fp8(blas, w->w, w->n, w->k, c->x8, c->m, c->y);
        if (rc < 0) tdm_die_check(prog);
        if (rc == 1) return -1;
    }
    double ms;
    if (tdm_time_calls(do_call, c, c->ws->copies, reps, graph, st, &ms) != 0) tdm_die_check(prog);
    return ms;
}

static void wset(struct tdm_wset *s, enum tdm_wfmt fmt, int64_t n, int64_t k, uint64_t seed)
{
    if (tdm_wset_alloc(s, fmt, n, k, TDM_DT_F32, 8 * l2, 2, seed) != 0) tdm_die_check(prog);
    if (s->copies > 4096) fprintf(stderr, "# %s: %lldx%lld: %d copies\n", prog, (long long)n, (long long)k, s->copies);
}

static double cold_read_gbps(void)
{
    size_t each = 8 * l2 > (512u << 20) ? 8 * l2 : (512u << 20);
    void *buf[4];
    uint64_t *sink;
    for (int i = 0; i < 4; i++)
        if (tdm_cuda_malloc(&buf[i], each) != 0 || tdm_dev_fill_bytes(buf[i], each, 31 + i, 0xff, 0, st) != 0) tdm_die_check(prog);
    if (tdm_cuda_malloc((void **)&sink, 64) != 0 || tdm_stream_sync(st) != 0) tdm_die_check(prog);
    double best[4];
    for (int i = 0; i < 4; i++) {   /* median of 4 x reps reads, each of a different buffer in turn */
        double ms;
        tdm_event e0, e1;
        if (tdm_event_create(&e0) || tdm_event_create(&e1)) tdm_die_check(prog);
        double t[64];
        int nt = 0;
        for (int r = 0; r < reps && nt < 64; r++) {
            float f;
            if (tdm_event_record(e0, st) || tdm_dev_read(buf[(r + i) % 4], each, sink, st) || tdm_event_record(e1, st) ||
                tdm_event_ms(e0, e1, &f))
                tdm_die_check(prog);
            t[nt++] = f;
        }
        for (int a = 0; a < nt; a++)
            for (int b = a + 1; b < nt; b++)
                if (t[b] < t[a]) { double x = t[a]; t[a] = t[b]; t[b] = x; }
        ms = t[nt / 2];
        best[i] = each / ms / 1e6;
        tdm_event_destroy(e0);
        tdm_event_destroy(e1);
    }
    for (int i = 0; i < 4; i++) tdm_cuda_free(buf[i]);
    tdm_cuda_free(sink);
    double s[4] = {best[0], best[1], best[2], best[3]};
    for (int a = 0; a < 4; a++)
        for (int b = a + 1; b < 4; b++)
            if (s[b] < s[a]) { double x = s[a]; s[a] = s[b]; s[b] = x; }
    return (s[1] + s[2]) / 2;
}

/* ---- a whole 27B token in one graph ---- */
struct token {
    int count;
    struct tdm_wset *w;   /* one set (one copy) per projection instance, in forward order */
};

static void token_alloc(struct token *t, const struct tdm_model_shapes *ms, enum tdm_wfmt fmt)
{
    /* forward order: per layer, the mixer (GDN on layers i%4 != 3, attention on i%4 == 3), then the MLP */
    static const char *gdn[] = {"linear_attn.in_proj_qkv", "linear_attn.in_proj_z", "linear_attn.in_proj_b",
                                "linear_attn.in_proj_a", "linear_attn.out_proj"};
    static const char *att[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"};
    static const char *mlp[] = {"mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"};
    t->w = calloc(64 * 8, sizeof *t->w);
    t->count = 0;
    for (int layer = 0; layer < 64; layer++) {
        const char **mix = layer % 4 == 3 ? att : gdn;
        int nmix = layer % 4 == 3 ? 4 : 5;
        for (int part = 0; part < 2; part++) {
            const char **names = part ? mlp : mix;
            int cnt = part ? 3 : nmix;
            for (int j = 0; j < cnt; j++) {
                const struct tdm_proj_shape *p = NULL;
                for (int s = 0; s < ms->nshapes; s++)
                    if (strcmp(ms->shapes[s].name, names[j]) == 0) p = &ms->shapes[s];
                if (!p) tdm_die_usage(prog, "internal: projection missing from the shape table", names[j]);
                if (tdm_wset_alloc(&t->w[t->count], fmt, p->n, p->k, TDM_DT_F32, 0, 1, 7000 + t->count) != 0) tdm_die_check(prog);
                t->count++;
            }
        }
    }
}

static void token_free(struct token *t)
{
    for (int i = 0; i < t->count; i++) tdm_wset_free(&t->w[i]);
    free(t->w);
}

struct token_ctx {
    struct token *t;
    enum which what;
    const uint16_t *x;
    void *y;
    int64_t m;
    int nxb;                /* the blocked copies of x, one per distinct k of the token's products */
    int64_t xb_k[8];
    const uint16_t *xb[8];
};

static int token_call(void *p, int i, void *stream)
{
    struct token_ctx *c = p;
    (void)i;
    for (int j = 0; j < c->t->count; j++) {
        const uint16_t *xb = NULL;
        for (int i = 0; i < c->nxb; i++)
            if (c->xb_k[i] == c->t->w[j].w[0].k) xb = c->xb[i];
        struct call cc = {c->what, &c->t->w[j], c->x, NULL, c->y, c->m, xb, NULL, NULL, TDM_SWIGLU_ONE};
        if (do_call(&cc, 0, stream) != 0) return -1;
    }
    return 0;
}

/* The SwiGLU pairs of a model (a projection named <p>gate_proj beside <p>up_proj of the same shape),
 * in NVFP4 and FP8, in each of the engine's three forms at each row count (enum tdm_swiglu_form): one launch
 * for both weights ("<p>gate+up", tdm_matmul_swiglu; "n/a" where tdm_matmul_swiglu_ok says no: FP8 only
 * at 1-16 rows from x's blocked copy), the gate's product then up's with the SiLU x up in its epilogue
 * ("<p>gate;up*silu", tdm_matmul_gated, 1-32 rows), and the two products and tdm_silu_mul
 * ("<p>gate;up;silu"). GB/s counts what the pair must read (both weights and their scales, x once) in
 * every form, so the three lines compare by time. Each line ends naming the formats whose engine runs
 * that form at that row count (TANDEM_MLP_FUSE=auto: tdm_matmul_swiglu_form). */
static int nrows, rows[32];
static double read_gbps;
static const struct {
    const char *suffix;   /* after <p> */
    int eager;            /* also timed eager (the one launch, as the table's products are) */
} pair_forms[] = {
    [TDM_SWIGLU_ONE] = {"gate+up", 1},
    [TDM_SWIGLU_GATED] = {"gate;up*silu", 0},
    [TDM_SWIGLU_THREE] = {"gate;up;silu", 0},
};
struct swiglu_time {
    double graph_ms, eager_ms, gbps;   /* graph_ms < 0: the pair cannot run in this form */
};
static struct swiglu_time swiglu_time(enum tdm_swiglu_form form, struct tdm_wset *wg, struct tdm_wset *wu, const uint16_t *x,
                                      const uint16_t *xb, void *y, uint16_t *u, int64_t m, int eager)
{
    struct swiglu_time r = {-1, -1, 0};
    const struct tdm_dweight *g = &wg->w[0];
    if (form == TDM_SWIGLU_ONE && !tdm_matmul_swiglu_ok(g, &wu->w[0], x, g->k, xb, m, tiles)) return r;
    if (form == TDM_SWIGLU_GATED && m > TDM_MM_MAX_ROWS) return r;
    struct call c = {OURS_PAIR, wg, x, NULL, y, m, xb, wu, u, form};
    /* both weights and their scales, x once */
    const double b = (double)(tdm_matmul_bytes(g, m) + tdm_matmul_bytes(&wu->w[0], m) - m * g->k * 2);
    r.graph_ms = time_it(&c, 1);
    if (eager && pair_forms[form].eager) r.eager_ms = time_it(&c, 0);
    r.gbps = b / r.graph_ms / 1e6;
    return r;
}
static void swiglu_lines(const struct tdm_model_shapes *ms, const uint16_t *x, void *y, uint16_t *u, uint16_t *xbuf, json_t *arr)
{
    for (int s = 0; s < ms->nshapes; s++) {
        const struct tdm_proj_shape *g = &ms->shapes[s], *up = NULL;
        const size_t len = strlen(g->name), sfx = strlen("gate_proj");
        if (len < sfx || strcmp(g->name + len - sfx, "gate_proj") != 0) continue;
        char upname[64], shape[32];
        snprintf(upname, sizeof upname, "%.*sup_proj", (int)(len - sfx), g->name);
        for (int j = 0; j < ms->nshapes; j++)
            if (strcmp(ms->shapes[j].name, upname) == 0 && ms->shapes[j].n == g->n && ms->shapes[j].k == g->k) up = &ms->shapes[j];
        if (!up) continue;
        snprintf(shape, sizeof shape, "%" PRId64 ",%" PRId64, g->n, g->k);
        struct tdm_wset wg4, wu4, wg8, wu8;
        wset(&wg4, TDM_W_NVFP4, g->n, g->k, 400 + s);
        wset(&wu4, TDM_W_NVFP4, g->n, g->k, 500 + s);
        wset(&wg8, TDM_W_FP8, g->n, g->k, 600 + s);
        wset(&wu8, TDM_W_FP8, g->n, g->k, 700 + s);
        for (int ri = 0; ri < nrows; ri++) {
            const int64_t m = rows[ri];
            const uint16_t *xb = pack_xb(x, m, g->k, xbuf);
            const enum tdm_swiglu_form e4 = tdm_matmul_swiglu_form(TDM_MLP_FUSE_AUTO, &wg4.w[0], &wu4.w[0], x, g->k, xb, m, tiles),
                                       e8 = tdm_matmul_swiglu_form(TDM_MLP_FUSE_AUTO, &wg8.w[0], &wu8.w[0], x, g->k, xb, m, tiles);
            for (int f = TDM_SWIGLU_ONE; f <= TDM_SWIGLU_THREE; f++) {
                const enum tdm_swiglu_form form = (enum tdm_swiglu_form)f;
                const struct swiglu_time t4 = swiglu_time(form, &wg4, &wu4, x, xb, y, u, m, 1),
                                         t8 = swiglu_time(form, &wg8, &wu8, x, xb, y, u, m, 0);
                char pname[64];
                snprintf(pname, sizeof pname, "%.*s%s", (int)(len - sfx), g->name, pair_forms[f].suffix);
                printf("%-15s %-26s %11s %5" PRId64 " | ", ms->model, pname, shape, m);
                if (t4.graph_ms < 0)
                    printf("%8s %7s %5s %8s | ", "n/a", "", "", "");
                else if (t4.eager_ms < 0)
                    printf("%8.2f %7.0f %4.0f%% %8s | ", t4.graph_ms * 1e3, t4.gbps, 100 * t4.gbps / read_gbps, "-");
                else
                    printf("%8.2f %7.0f %4.0f%% %8.2f | ", t4.graph_ms * 1e3, t4.gbps, 100 * t4.gbps / read_gbps, t4.eager_ms * 1e3);
                if (t8.graph_ms < 0)
                    printf("%8s %7s %5s | ", "n/a", "", "");
                else
                    printf("%8.2f %7.0f %4.0f%% | ", t8.graph_ms * 1e3, t8.gbps, 100 * t8.gbps / read_gbps);
                printf("%8s %8s %8s | %6s", "-", "-", "-", "-");
                if (e4 == form || e8 == form)
                    printf("  (the engine's: %s%s%s)", e4 == form ? "nvfp4" : "", e4 == form && e8 == form ? " " : "",
                           e8 == form ? "fp8" : "");
                if (t4.graph_ms < 0 || t8.graph_ms < 0) printf("  (n/a: the setting does not run in this form)");
                printf("\n");
                fflush(stdout);
                json_t *o = json_pack("{s:s, s:s, s:I, s:I, s:I, s:b, s:s, s:b, s:b}", "model", ms->model, "projection", pname,
                                      "n", (json_int_t)g->n, "k", (json_int_t)g->k, "rows", (json_int_t)m, "swiglu", 1, "form",
                                      pair_forms[f].suffix, "engine_nvfp4", e4 == form, "engine_fp8", e8 == form);
                if (t4.graph_ms >= 0) {
                    json_object_set_new(o, "nvfp4_graph_us", json_real(t4.graph_ms * 1e3));
                    if (t4.eager_ms >= 0) json_object_set_new(o, "nvfp4_eager_us", json_real(t4.eager_ms * 1e3));
                    json_object_set_new(o, "nvfp4_gbps", json_real(t4.gbps));
                }
                if (t8.graph_ms >= 0) {
                    json_object_set_new(o, "fp8_graph_us", json_real(t8.graph_ms * 1e3));
                    json_object_set_new(o, "fp8_gbps", json_real(t8.gbps));
                }
                json_array_append_new(arr, o);
            }
        }
        tdm_wset_free(&wg4);
        tdm_wset_free(&wu4);
        tdm_wset_free(&wg8);
        tdm_wset_free(&wu8);
    }
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, 0, 'M'}, {"rows", required_argument, 0, 'r'}, {"reps", required_argument, 0, 'n'},
        {"no-baseline", no_argument, 0, 'B'}, {"no-token", no_argument, 0, 'T'}, {"no-xb", no_argument, 0, 'X'}, {"json", required_argument, 0, 'j'},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0},
    };
    const struct tdm_model_shapes *models[4];
    int nmodels = 0, baseline = 1, token = 1;
    const char *json_path = NULL;
    int c;
    while ((c = tdm_getopt(prog, argc, argv, "h", opts)) != -1) {
        switch (c) {
        case 'M':
            if (nmodels == 4) tdm_die_usage(prog, "too many --model", NULL);
            if (!(models[nmodels++] = tdm_model_shapes(optarg))) tdm_die_usage(prog, "--model: expected qwen3.8-27b or qwen3-next-80b, not", optarg);
            break;
        case 'r':
            nrows = tdm_parse_int_list(optarg, 1, 4096, rows, 32);
            if (nrows < 0) tdm_die_usage(prog, "--rows: expected comma-separated row counts in 1..4096, not", optarg);
            if (!nrows) tdm_die_usage(prog, "--rows: empty", NULL);
            break;
        case 'n': {
            char *end;
            long v = strtol(optarg, &end, 10);
            if (end == optarg || *end || v < 1 || v > 10000) tdm_die_usage(prog, "--reps: expected an integer in 1..10000, not", optarg);
            reps = (int)v;
            break;
        }
        case 'B': baseline = 0; break;
        case 'T': token = 0; break;
        case 'X': use_xb = 0; break;
        case 'j': json_path = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return TDM_EXIT_USAGE;
        }
    }
    if (optind < argc) tdm_die_usage(prog, "unexpected argument", argv[optind]);
    if (!nmodels) {
        models[nmodels++] = tdm_model_shapes("qwen3.8-27b");
        models[nmodels++] = tdm_model_shapes("qwen3-next-80b");
    }
    if (!nrows) {
        const int def[] = {1, 2, 4, 8, 16, 24, 32};
        nrows = 7;
        memcpy(rows, def, sizeof def);
    }
    if (tdm_settings_check() != 0) tdm_die_input(prog);
    if (tdm_cuda_device_count() < 1) tdm_die_usage(prog, "no CUDA device visible", NULL);

    struct tdm_device_info info;
    char arch[32];
    if (tdm_cuda_device_info(0, &info) != 0 || tdm_stream_create(&st) != 0) tdm_die_check(prog);
    tdm_tiles_arch(info.sm_major, info.sm_minor, arch, sizeof arch);
    if (tdm_tiles_load(NULL, arch, &tiles) != 0) tdm_die_input(prog);
    l2 = info.l2_bytes ? info.l2_bytes : (60u << 20);
    if (baseline && tdm_cublas_create(&blas, st) != 0) tdm_die_check(prog);
    int maxm = 0;
    for (int i = 0; i < nrows; i++) if (rows[i] > maxm) maxm = rows[i];

    read_gbps = cold_read_gbps();
    printf("# %s (%s, %d SMs, L2 %zu MiB); cold streaming read %.0f GB/s; tiles %s/%s; median of %d; weights rotate over >= 8x L2\n",
           info.name, arch, info.sm_count, l2 >> 20, read_gbps, tdm_setting("TANDEM_TILES"), arch, reps);
    json_t *swept_on = json_object();   /* the card each table was swept on (tables are keyed by arch alone) */
    printf("# tables swept on:");
    for (int kk = 0; kk < TDM_MMK_COUNT; kk++) {
        const char *dev = tdm_tiles_device(tiles, (enum tdm_mmk)kk);
        printf("%s %s %s", kk ? ";" : "", tdm_mmk_name((enum tdm_mmk)kk), dev ? dev : "(no table: defaults)");
        json_object_set_new(swept_on, tdm_mmk_name((enum tdm_mmk)kk), dev ? json_string(dev) : json_null());
    }
    printf("\n");
    printf("# columns: us = microseconds per product; GB/s = bytes it must read (weights, scales, activations) / time;\n"
           "# %%rd = fraction of the cold read figure; g = inside a CUDA graph, e = eager; x = cuBLAS BF16 (graph) / NVFP4 (graph)\n"
           "# lt-fp8 = cuBLASLt FP8 (e4m3 activations): b = block scales (128x128 weight, 1x128 activation), t = per-tensor\n"
           "#          scales where cuBLASLt has no block-scaled algorithm for the shape\n");
    printf("# nvfp4 and fp8 at 1-32 rows read %s\n", use_xb ? "x's blocked copy (packed once before the timing, as the engine's kernels "
                                                        "write it beside x)" : "x as written (--no-xb)");
    printf("%-15s %-26s %11s %5s | %8s %7s %5s %8s | %8s %7s %5s | %8s %8s %8s | %6s\n", "model", "projection", "N,K", "rows",
           "nvfp4 g", "GB/s", "%rd", "nvfp4 e", "fp8 g", "GB/s", "%rd", "bf16 g", "bf16 e", "lt-fp8 g", "x");
    json_t *rec = json_object(), *arr = json_array();
    json_object_set_new(rec, "device", json_string(info.name));
    json_object_set_new(rec, "tables_swept_on", swept_on);
    json_object_set_new(rec, "read_gbps", json_real(read_gbps));

    /* activations for every row count: BF16 and e4m3 */
    int64_t maxk = 0, maxn = 0;
    for (int mi = 0; mi < nmodels; mi++)
        for (int s = 0; s < models[mi]->nshapes; s++) {
            if (models[mi]->shapes[s].k > maxk) maxk = models[mi]->shapes[s].k;
            if (models[mi]->shapes[s].n > maxn) maxn = models[mi]->shapes[s].n;
        }
    uint16_t *x, *y, *u, *xbs[8];   /* u: a SwiGLU's up output in its three-launch form */
    uint8_t *x8;
    for (int i = 0; i < 8; i++)
        if (tdm_cuda_malloc((void **)&xbs[i], (size_t)tdm_mm_xb_elems(maxk) * 2 + 16) != 0) tdm_die_check(prog);
    if (tdm_cuda_malloc((void **)&x, (size_t)(maxm * maxk * 2)) || tdm_cuda_malloc((void **)&x8, (size_t)(maxm * maxk)) ||
        tdm_cuda_malloc((void **)&y, (size_t)(maxm * maxn * 2)) || tdm_cuda_malloc((void **)&u, (size_t)(maxm * maxn * 2)) || tdm_dev_fill_bf16(x, (size_t)(maxm * maxk), 17, 2.0f, st) ||
        tdm_dev_fill_bytes(x8, (size_t)(maxm * maxk), 19, 0xbf, 0, st) || tdm_stream_sync(st))
        tdm_die_check(prog);

    for (int mi = 0; mi < nmodels; mi++) {
        const struct tdm_model_shapes *ms = models[mi];
        int64_t nk[64][2];
        int cnt = tdm_model_distinct_shapes(ms, nk, 64);
        for (int si = 0; si < cnt; si++) {
            const int64_t n = nk[si][0], k = nk[si][1];
            const char *pname = "";
            for (int s = 0; s < ms->nshapes; s++)
                if (ms->shapes[s].n == n && ms->shapes[s].k == k) { pname = ms->shapes[s].name; break; }
            struct tdm_wset w4, w8, wb;
            wset(&w4, TDM_W_NVFP4, n, k, 100 + si);
            wset(&w8, TDM_W_FP8, n, k, 200 + si);
            if (baseline) wset(&wb, TDM_W_BF16, n, k, 300 + si);
            char shape[32];
            snprintf(shape, sizeof shape, "%" PRId64 ",%" PRId64, n, k);
            for (int ri = 0; ri < nrows; ri++) {
                const int64_t m = rows[ri];
                const uint16_t *xb = pack_xb(x, m, k, xbs[0]);   /* NVFP4 and FP8 read it */
                struct call c4 = {OURS, &w4, x, x8, y, m, xb, NULL, NULL, TDM_SWIGLU_ONE}, c8 = {OURS, &w8, x, x8, y, m, xb, NULL, NULL, TDM_SWIGLU_ONE};
                const double b4 = (double)tdm_matmul_bytes(&w4.w[0], m), b8 = (double)tdm_matmul_bytes(&w8.w[0], m);
                const double t4g = time_it(&c4, 1), t4e = time_it(&c4, 0), t8g = time_it(&c8, 1);
                double tbg = -1, tbe = -1, tlg = -1;
                int lt_block = 0;
                if (baseline) {
                    struct call cb = {CUBLAS_BF16, &wb, x, x8, y, m, NULL, NULL, NULL, TDM_SWIGLU_ONE}, cl = {CUBLASLT_FP8, &w8, x, x8, y, m, NULL, NULL, NULL, TDM_SWIGLU_ONE};
                    tbg = time_it(&cb, 1);
                    tbe = time_it(&cb, 0);
                    tlg = time_it(&cl, 1);
                    lt_block = tdm_cublaslt_fp8_block(blas);
                }
                const double g4 = b4 / t4g / 1e6, g8 = b8 / t8g / 1e6;
                printf("%-15s %-26s %11s %5" PRId64 " | %8.2f %7.0f %4.0f%% %8.2f | %8.2f %7.0f %4.0f%% | ", ms->model, pname, shape, m,
                       t4g * 1e3, g4, 100 * g4 / read_gbps, t4e * 1e3, t8g * 1e3, g8, 100 * g8 / read_gbps);
                if (baseline) {
                    printf("%8.2f %8.2f ", tbg * 1e3, tbe * 1e3);
                    if (tlg > 0) printf("%7.2f%c ", tlg * 1e3, lt_block ? 'b' : 't'); else printf("%8s ", "n/a");
                    printf("| %5.2fx\n", tbg / t4g);
                } else {
                    printf("%8s %8s %8s | %6s\n", "-", "-", "-", "-");
                }
                fflush(stdout);
                json_t *o = json_pack("{s:s, s:s, s:I, s:I, s:I, s:f, s:f, s:f, s:f, s:f}", "model", ms->model, "projection", pname,
                                      "n", (json_int_t)n, "k", (json_int_t)k, "rows", (json_int_t)m, "nvfp4_graph_us", t4g * 1e3,
                                      "nvfp4_eager_us", t4e * 1e3, "nvfp4_gbps", g4, "fp8_graph_us", t8g * 1e3, "fp8_gbps", g8);
                if (baseline) {
                    json_object_set_new(o, "cublas_bf16_graph_us", json_real(tbg * 1e3));
                    json_object_set_new(o, "cublas_bf16_eager_us", json_real(tbe * 1e3));
                    json_object_set_new(o, "cublaslt_fp8_graph_us", tlg > 0 ? json_real(tlg * 1e3) : json_null());
                    json_object_set_new(o, "cublaslt_fp8_scales", json_string(tlg > 0 ? (lt_block ? "block" : "tensor") : "none"));
                }
                json_array_append_new(arr, o);
            }
            tdm_wset_free(&w4);
            tdm_wset_free(&w8);
            if (baseline) tdm_wset_free(&wb);
        }
        swiglu_lines(ms, x, y, u, xbs[0], arr);
    }
    json_object_set_new(rec, "shapes", arr);

    if (token) {
        const struct tdm_model_shapes *ms = tdm_model_shapes("qwen3.8-27b");
        json_t *tok = json_array();
        const enum tdm_wfmt fmts[3] = {TDM_W_NVFP4, TDM_W_FP8, TDM_W_BF16};
        const char *names[3] = {"nvfp4 (ours)", "fp8 (ours)", "bf16 (cuBLAS)"};
        printf("\n# a whole Qwen3.8-27B token: the 64 layers' projections back to back in one CUDA graph\n");
        printf("%-14s %5s %12s %10s %8s %6s\n", "weights", "rows", "GB", "ms", "GB/s", "%rd");
        for (int f = 0; f < 3; f++) {
            if (f == 2 && !baseline) continue;
            struct token t;
            token_alloc(&t, ms, fmts[f]);
            for (int ri = 0; ri < nrows; ri++) {
                const int64_t m = rows[ri];
                double bytes = 0;
                for (int j = 0; j < t.count; j++) bytes += (double)tdm_matmul_bytes(&t.w[j].w[0], m);
                struct token_ctx tc = {&t, f == 2 ? CUBLAS_BF16 : OURS, x, y, m, 0, {0}, {0}};
                for (int j = 0; j < t.count && f < 2; j++) {   /* a blocked copy per distinct k */
                    const int64_t kj = t.w[j].w[0].k;
                    int seen = 0;
                    for (int i = 0; i < tc.nxb; i++) seen |= tc.xb_k[i] == kj;
                    if (seen || tc.nxb == 8) continue;
                    tc.xb_k[tc.nxb] = kj;
                    tc.xb[tc.nxb] = pack_xb(x, m, kj, xbs[tc.nxb]);
                    tc.nxb++;
                }
                double ms_tok;
                if (tdm_time_calls(token_call, &tc, 1, reps, 1, st, &ms_tok) != 0) tdm_die_check(prog);
                const double gbps = bytes / ms_tok / 1e6;
                printf("%-14s %5" PRId64 " %12.2f %10.3f %8.0f %5.0f%%\n", names[f], m, bytes / 1e9, ms_tok, gbps, 100 * gbps / read_gbps);
                fflush(stdout);
                json_array_append_new(tok, json_pack("{s:s, s:I, s:f, s:f, s:f}", "weights", names[f], "rows", (json_int_t)m, "bytes",
                                                     bytes, "ms", ms_tok, "gbps", gbps));
            }
            token_free(&t);
        }
        json_object_set_new(rec, "token_27b", tok);
    }
    if (json_path && tdm_json_write_atomic(json_path, rec, JSON_INDENT(1)) != 0) {
        fprintf(stderr, "%s: %s\n", prog, tdm_err());
        return TDM_EXIT_USAGE;
    }
    json_decref(rec);
    tdm_cublas_destroy(blas);
    tdm_tiles_free(tiles);
    return 0;
}
