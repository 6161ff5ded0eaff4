/* kerneltrace — where a CUDA graph's time goes: the kernels' own time against the graph's span.
 * A preloaded library (make kerneltrace; scripts/gpu-run gaps): LD_PRELOAD=build/kerneltrace.so
 * COMMAND records every kernel through CUPTI's activity API (start and end on the GPU, the graph
 * it ran in, the correlation id of the API call that launched it: one per graph launch) and, when
 * COMMAND exits, writes one line per graph, in the order of their first launch, to
 * $KERNELTRACE_OUT (default: standard error):
 *   graph  the graph's id
 *   launches  how many times it was launched;  kernels  kernels a launch
 *   span_us   median over launches of (last kernel's end - first kernel's start)
 *   busy_us   median over launches of the time in which at least one kernel ran (the union of the
 *             kernels' intervals: on one stream their summed durations; kernels on two streams
 *             (TANDEM_CONCURRENT) may overlap, and overlapped time counts once)
 *   gaps      1 - busy / span, of the median launch: the share of the graph's span in which no
 *             kernel ran (launch gaps between dependent nodes, and each kernel's ramp and tail
 *             count as kernel time)
 *   first     the first kernel's name (to tell the graphs apart)
 * Then, for each graph of at least $KERNELTRACE_MIN_KERNELS kernels a launch (default 100; 10 shows
 * the MTP drafter's graphs too) launched at least 3 times, its kernels by time a launch (demangled
 * names), the largest 16, each with the span it adds to a launch (span_us: by end time, from the
 * latest end before its own to its own; the additions sum to the span, so overlapped kernels show
 * what they lengthen a launch by, not their durations). With $KERNELTRACE_BY_GRID=1 each kernel counts
 * apart per grid (its name then ends " <<<x,y,z>>>", and the largest 48 are listed): a product's shapes
 * run one instantiation on grids of their own, so a token's products show shape by shape.
 * (Not TANDEM_*: the tools refuse unknown switches of that prefix.) Kernels outside graphs are summed
 * on one line (graph 0: their summed durations). Not part of the library or the tools:
 * a measuring aid for bench/NOTES.md. */
#define _GNU_SOURCE
#include <cupti.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct krec { uint64_t start, end; uint32_t graph, corr, gorder, kid; char name[48]; };
/* Distinct kernels by CUPTI's name pointer (one per kernel for the session) and, with
 * KERNELTRACE_BY_GRID, grid; their names demangled. */
struct kname { const char *key; uint32_t grid[3]; char *name; };
static int by_grid = -1;   /* KERNELTRACE_BY_GRID, read at the first record */
static struct kname *knames;
static size_t nknames, capknames;
char *__cxa_demangle(const char *mangled, char *buf, size_t *n, int *status);   /* libstdc++ */
static struct krec *recs;
static size_t nrec, caprec;

#define CUPTI_OK(x)                                                                            \
    do {                                                                                       \
        CUptiResult r_ = (x);                                                                  \
        if (r_ != CUPTI_SUCCESS) {                                                             \
            const char *s_ = NULL;                                                             \
            cuptiGetResultString(r_, &s_);                                                     \
            fprintf(stderr, "kerneltrace: %s: %s\n", #x, s_ ? s_ : "?");                       \
            return;                                                                            \
        }                                                                                      \
    } while (0)

static void trace_report(void);

/* The report runs from atexit, registered at CUPTI's first buffer request: that comes after the CUDA
 * runtime set up its own exit handler, so ours runs first, while the context still exists and its
 * records can be flushed. (The first version reported from a destructor and, on the H200, found
 * no records at all, most likely because it ran after the teardown; this one reports, on an H100 and
 * the H200.) */
static void CUPTIAPI buf_requested(uint8_t **buf, size_t *size, size_t *max_records)
{
    static int registered;
    if (!registered) registered = atexit(trace_report) == 0;
    *size = 8 << 20;
    *buf = aligned_alloc(8, *size);
    *max_records = 0;
}

/* The index of kernel `key` (on grid x, y, z where by_grid) in knames, added on first sight with its
 * demangled name (templates and arguments cut: every anonymous namespace dropped, then up to the
 * first '('; then the grid where by_grid). */
static uint32_t kernel_id(const char *key, uint32_t x, uint32_t y, uint32_t z)
{
    if (!by_grid) x = y = z = 0;
    for (size_t i = 0; i < nknames; i++)
        if (knames[i].key == key && knames[i].grid[0] == x && knames[i].grid[1] == y && knames[i].grid[2] == z)
            return (uint32_t)i;
    if (nknames == capknames) {
        capknames = capknames ? 2 * capknames : 256;
        struct kname *n = realloc(knames, capknames * sizeof *knames);
        if (!n) { fprintf(stderr, "kerneltrace: out of memory\n"); exit(1); }
        knames = n;
    }
    int status = -1;
    char *d = key ? __cxa_demangle(key, NULL, NULL, &status) : NULL;
    char *name = strdup(status == 0 && d ? d : key ? key : "?");
    free(d);
    if (!name) { fprintf(stderr, "kerneltrace: out of memory\n"); exit(1); }
    const char *anon = "(anonymous namespace)::";   /* dropped first: its '(' is not the arguments' */
    for (char *a; (a = strstr(name, anon)); )
        memmove(a, a + strlen(anon), strlen(a + strlen(anon)) + 1);
    char *paren = strchr(name, '(');
    if (paren) *paren = 0;
    if (by_grid) {
        char *g = malloc(strlen(name) + 48);
        if (!g) { fprintf(stderr, "kerneltrace: out of memory\n"); exit(1); }
        sprintf(g, "%s <<<%u,%u,%u>>>", name, x, y, z);
        free(name);
        name = g;
    }
    knames[nknames] = (struct kname){key, {x, y, z}, name};
    return (uint32_t)nknames++;
}

static void CUPTIAPI buf_completed(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size, size_t valid)
{
    (void)ctx; (void)stream; (void)size;
    CUpti_Activity *a = NULL;
    while (cuptiActivityGetNextRecord(buf, valid, &a) == CUPTI_SUCCESS) {
        if (a->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && a->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)a;
        if (nrec == caprec) {
            caprec = caprec ? 2 * caprec : 1 << 16;
            struct krec *n = realloc(recs, caprec * sizeof *recs);
            if (!n) { fprintf(stderr, "kerneltrace: out of memory\n"); exit(1); }
            recs = n;
        }
        struct krec *r = &recs[nrec++];
        r->start = k->start;
        r->end = k->end;
        r->graph = k->graphId;
        r->corr = k->correlationId;
        snprintf(r->name, sizeof r->name, "%s", k->name ? k->name : "?");
        if (by_grid < 0) by_grid = getenv("KERNELTRACE_BY_GRID") && atoi(getenv("KERNELTRACE_BY_GRID")) > 0;
        r->kid = kernel_id(k->name, (uint32_t)k->gridX, (uint32_t)k->gridY, (uint32_t)k->gridZ);
    }
    free(buf);
}

__attribute__((constructor)) static void trace_start(void)
{
    CUPTI_OK(cuptiActivityRegisterCallbacks(buf_requested, buf_completed));
    CUPTI_OK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
}

/* One graph launch: its span (first kernel's start to last kernel's end) and its kernels' summed time. */
struct launch { uint64_t span, busy; };
static int cmp_span(const void *a, const void *b)
{
    const uint64_t x = ((const struct launch *)a)->span, y = ((const struct launch *)b)->span;
    return x < y ? -1 : x > y;
}
/* Records ordered by (their graph's first appearance, correlation id, start). */
static int cmp_rec(const void *a, const void *b)
{
    const struct krec *x = a, *y = b;
    if (x->gorder != y->gorder) return x->gorder < y->gorder ? -1 : 1;
    if (x->corr != y->corr) return x->corr < y->corr ? -1 : 1;
    return x->start < y->start ? -1 : x->start > y->start;
}

/* One kernel's time in one graph: summed durations, the span it added (below), launches. */
struct ktime { uint64_t ns, span, calls; uint32_t kid; };
/* Records (pointers) by end time. */
static int cmp_end(const void *a, const void *b)
{
    const struct krec *x = *(const struct krec *const *)a, *y = *(const struct krec *const *)b;
    return x->end < y->end ? -1 : x->end > y->end;
}
/* The span each kernel of one graph launch (recs[a..b)) adds, into kt: taken by end time, a kernel adds
 * the time from the latest end before its own (the launch's first start, for the first) to its end, so
 * that the additions sum to the launch's span. Kernels that overlap others (programmatic launches, two
 * streams) add only what they lengthen the launch by; a kernel's wait for the one before it, which its
 * duration includes, is in the one before's addition. */
static void add_span(struct ktime *kt, const struct krec *const *by_end, size_t n, uint64_t first_start)
{
    uint64_t upto = first_start;
    for (size_t q = 0; q < n; q++) {
        if (by_end[q]->end > upto) kt[by_end[q]->kid].span += by_end[q]->end - upto, upto = by_end[q]->end;
    }
}
static int cmp_ktime(const void *a, const void *b)   /* largest time first */
{
    const uint64_t x = ((const struct ktime *)a)->ns, y = ((const struct ktime *)b)->ns;
    return x > y ? -1 : x < y;
}

static void trace_report(void)
{
    cuptiActivityFlushAll(1);
    const char *path = getenv("KERNELTRACE_OUT");
    FILE *f = path && *path ? fopen(path, "w") : stderr;
    if (!f) { perror(path); return; }
    /* graphs in the order of their first kernel (records arrive in launch order per buffer) */
    uint32_t seen[4096];
    size_t nseen = 0;
    for (size_t i = 0; i < nrec; i++) {
        size_t g = 0;
        while (g < nseen && seen[g] != recs[i].graph) g++;
        if (g == nseen && nseen < sizeof seen / sizeof *seen) seen[nseen++] = recs[i].graph;
        recs[i].gorder = (uint32_t)g;
    }
    qsort(recs, nrec, sizeof *recs, cmp_rec);
    fprintf(f, "%-6s %8s %7s %10s %10s %6s  %s\n", "graph", "launches", "kernels", "span_us", "busy_us", "gaps", "first");
    /* the launches of each graph (graph 0: one group, every kernel outside graphs) */
    struct launch *ls = malloc((nrec ? nrec : 1) * sizeof *ls);
    for (size_t i = 0; i < nrec;) {
        size_t j = i, nl = 0, nk = 0;
        while (j < nrec && recs[j].graph == recs[i].graph) {
            size_t e = j;
            uint64_t s = recs[j].start, t = recs[j].end, b = 0, covered = recs[j].start; /* busy up to covered */
            while (e < nrec && recs[e].graph == recs[i].graph && (recs[i].graph == 0 || recs[e].corr == recs[j].corr)) {
                if (recs[e].start < s) s = recs[e].start;
                if (recs[e].end > t) t = recs[e].end;
                /* a launch's kernels in order of start: the part of this kernel past what earlier
                 * ones covered (graph 0, ordered by launch, not start: the summed durations) */
                const uint64_t from = recs[i].graph == 0 || recs[e].start > covered ? recs[e].start : covered;
                if (recs[e].end > from) b += recs[e].end - from;
                if (recs[e].end > covered) covered = recs[e].end;
                e++;
            }
            nk = e - j;
            ls[nl++] = (struct launch){t - s, b};
            j = e;
        }
        if (recs[i].graph == 0) {
            fprintf(f, "%-6s %8s %7zu %10s %10.1f %6s  %s (kernels outside graphs)\n", "0", "-", nk, "-", ls[0].busy / 1e3,
                    "-", recs[i].name);
        } else {
            /* the median launch by span, and its own busy time */
            qsort(ls, nl, sizeof *ls, cmp_span);
            const struct launch m = ls[nl / 2];
            fprintf(f, "%-6u %8zu %7zu %10.1f %10.1f %5.1f%%  %s\n", recs[i].graph, nl, nk, m.span / 1e3, m.busy / 1e3,
                    m.span ? 100.0 * (1.0 - (double)m.busy / (double)m.span) : 0.0, recs[i].name);
        }
        i = j;
    }
    free(ls);
    /* Where each large graph's kernel time goes (graphs of at least min_kernels a launch, launched at
     * least 3 times: the decode steps and the verify rounds): per kernel, its launches a graph
     * launch, its time a graph launch (summed durations over every launch / graph launches) and its
     * share of the graph's summed kernel time; the largest 16. */
    const char *mk = getenv("KERNELTRACE_MIN_KERNELS");
    const size_t min_kernels = mk && atoi(mk) > 0 ? (size_t)atoi(mk) : 100;
    struct ktime *kt = calloc(nknames ? nknames : 1, sizeof *kt);
    const struct krec **by_end = malloc((nrec ? nrec : 1) * sizeof *by_end);
    for (size_t i = 0; kt && by_end && i < nrec;) {
        size_t j = i, nl = 0, l0 = i;   /* l0: the first record of the current launch */
        uint64_t total = 0, spans = 0, first_start = recs[i].start;
        for (size_t q = 0; q < nknames; q++) kt[q] = (struct ktime){0, 0, 0, (uint32_t)q};
        for (;; j++) {
            const int same_graph = j < nrec && recs[j].graph == recs[i].graph;
            if (j > l0 && (!same_graph || recs[j].corr != recs[j - 1].corr)) {   /* launch [l0, j) complete */
                if (recs[i].graph != 0) {
                    for (size_t q = l0; q < j; q++) by_end[q - l0] = &recs[q];
                    qsort(by_end, j - l0, sizeof *by_end, cmp_end);
                    add_span(kt, by_end, j - l0, first_start);
                    spans += by_end[j - l0 - 1]->end - first_start;
                }
                l0 = j;
                if (same_graph) first_start = recs[j].start;
            }
            if (!same_graph) break;
            if (j == l0) nl++;
            if (recs[j].start < first_start) first_start = recs[j].start;
            kt[recs[j].kid].ns += recs[j].end - recs[j].start;
            kt[recs[j].kid].calls++;
            total += recs[j].end - recs[j].start;
        }
        if (recs[i].graph != 0 && nl >= 3 && (j - i) / nl >= min_kernels) {
            qsort(kt, nknames, sizeof *kt, cmp_ktime);
            fprintf(f, "\n# graph %u: %zu launches of %zu kernels, %.1f us of kernel time and %.1f us of span a launch (mean);"
                       " by kernel:\n", recs[i].graph, nl, (j - i) / nl, total / 1e3 / (double)nl, spans / 1e3 / (double)nl);
            fprintf(f, "%8s %10s %6s %10s %6s  %s\n", "calls", "us", "share", "span_us", "sshare", "kernel");
            for (size_t q = 0; q < nknames && q < (by_grid > 0 ? 48 : 16) && kt[q].calls; q++)
                fprintf(f, "%8.1f %10.1f %5.1f%% %10.1f %5.1f%%  %s\n", (double)kt[q].calls / (double)nl,
                        kt[q].ns / 1e3 / (double)nl, total ? 100.0 * (double)kt[q].ns / (double)total : 0.0,
                        kt[q].span / 1e3 / (double)nl, spans ? 100.0 * (double)kt[q].span / (double)spans : 0.0,
                        knames[kt[q].kid].name);
        }
        i = j;
    }
    free(kt);
    free(by_end);
    if (f != stderr) fclose(f);
}
