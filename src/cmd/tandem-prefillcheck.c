/* tandem-prefillcheck — the chunked prefill path against the one-token decode path, and both
 * against a reference forward (the CPU reference over the whole prompt, or --ref FILE with F32
 * logits [T][V]): next-token agreement, relative error, top-1 margins, disagreements where both
 * sides are sure (margin > 5), and the greedy continuations from each path's state. Reported as
 * agreement and margins. The gate: the prefill path at least as close to the reference as the
 * decode path (within one point, or one row on a prompt of fewer than 100 rows, where one row is
 * more than a point) and no sure disagreement between prefill and reference. */
#include "backend.h"
#include "cli.h"
#include "compare.h"
#include "device.h"
#include "engine.h"
#include "err.h"
#include "jsonfile.h"
#include "model.h"
#include "ref.h"
#include "safetensors.h"
#include "settings.h"
#include "tokens.h"
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *prog = "tandem-prefillcheck";
#define SURE_MARGIN 5.0f

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tandem-prefillcheck -m DIR -p FILE [--ref FILE] [--backend cpu|cuda] [--chunk N] [-n N]\n"
            "                           [--json FILE]\n"
            "The chunked prefill path against the one-token decode path, and both against a reference\n"
            "forward: next-token (argmax) agreement over the prompt rows, relative error of the logits,\n"
            "top-1 margins, sure disagreements (rows whose argmaxes differ while both margins are > 5),\n"
            "and the greedy continuations from each path's state. Reported as agreement and margins.\n"
            "\n"
            "  prefill    the prompt in chunks of --chunk tokens, one forward call per chunk\n"
            "  decode     the prompt one token at a time from a fresh state\n"
            "  reference  the CPU reference forward over the whole prompt, or --ref FILE\n"
            "On --backend cpu both paths run the CPU reference; on cuda both run the CUDA engine (reset\n"
            "between the paths).\n"
            "\n"
            "  -m, --model DIR       checkpoint directory\n"
            "  -p, --prompt FILE     prompt token file (decimal ids, '#' comments)\n"
            "      --ref FILE        reference logits: safetensors with F32 'logits' [prompt tokens, vocab]\n"
            "      --backend B       cpu or cuda (default TANDEM_BACKEND; auto: cuda when a device is visible\n"
            "                        and the CUDA engine supports the model, else cpu; stderr says which)\n"
            "      --chunk N         prompt tokens per prefill call (default TANDEM_PREFILL_CHUNK)\n"
            "  -n, --new-tokens N    greedy continuation length from each path's state (default 16)\n"
            "      --json FILE       write everything as JSON (atomically)\n"
            "  -h, --help            this text\n"
            "\n"
            "The gate: prefill's agreement with the reference >= decode's agreement with the reference\n"
            "minus one percentage point (one row, 100/T points, on a prompt of T < 100 rows), and no sure\n"
            "disagreement between prefill and the reference.\n"
            "Exit status: 0 the gate holds, 1 it fails (or a CUDA call failed), 2 bad usage or bad input\n"
            "(one line on stderr naming the file or option and the fault).\n");
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) { fprintf(stderr, "%s: out of memory\n", prog); exit(1); }
    return p;
}

/* One backend for both paths: the CPU reference (a fresh state per path) or the CUDA engine
 * (reset between paths). */
struct fwd { const struct tdm_model *m; int ctx; struct tdm_ref *r; struct tdm_engine *e; };
static void fwd_fresh(struct fwd *f)
{
    if (f->e) {
        if (tdm_engine_reset(f->e) != 0) tdm_die_check(prog);
        return;
    }
    tdm_ref_free(f->r);
    f->r = tdm_ref_new(f->m, f->ctx);
    if (!f->r) { fprintf(stderr, "%s: out of memory\n", prog); exit(1); }
}
static void forward(struct fwd *f, const int32_t *ids, int T, int from, float *logits)
{
    int rc = f->e ? tdm_engine_forward(f->e, ids, T, from, logits) : tdm_ref_forward(f->r, ids, T, from, logits, NULL, NULL);
    if (rc == 0) return;
    if (f->e) tdm_die_check(prog); /* a CUDA failure: exit 1 */
    tdm_die_input(prog);           /* the CPU reference fails on bad input only */
}

/* The chunked path: on the engine, tdm_engine_prefill (the wide GEMM and the flash prefill
 * attention past 32 rows). */
static void prefill(struct fwd *f, const int32_t *ids, int T, int from, float *logits)
{
    int rc = f->e ? tdm_engine_prefill(f->e, ids, T, from, logits) : tdm_ref_forward(f->r, ids, T, from, logits, NULL, NULL);
    if (rc == 0) return;
    if (f->e) tdm_die_check(prog);
    tdm_die_input(prog);
}

/* Per path: the prompt rows' logits, their argmax and margin; the greedy continuation. */
struct path {
    const char *name;
    float *logits; /* [T][V] */
    int *top;
    float *margin;
    double mean_margin, min_margin, ms;
    int32_t *greedy;     /* [n] */
    float *greedy_margin; /* [n]: margin of the logits each greedy token was chosen from */
};

static void path_stats(struct path *p, int T, int V)
{
    p->top = xmalloc((size_t)T * sizeof(int));
    p->margin = xmalloc((size_t)T * sizeof(float));
    double sum = 0, mn = INFINITY;
    for (int t = 0; t < T; t++) {
        p->top[t] = tdm_argmax(p->logits + (size_t)t * V, V);
        p->margin[t] = tdm_margin(p->logits + (size_t)t * V, V);
        sum += p->margin[t];
        if (p->margin[t] < mn) mn = p->margin[t];
    }
    p->mean_margin = sum / T;
    p->min_margin = mn;
}

/* Greedy from the state after the prompt: last = the last prompt row's logits. */
static void greedy(struct fwd *f, struct path *p, const float *last, int n, int V)
{
    p->greedy = xmalloc((size_t)n * sizeof(int32_t));
    p->greedy_margin = xmalloc((size_t)n * sizeof(float));
    float *cur = xmalloc((size_t)V * sizeof(float));
    memcpy(cur, last, (size_t)V * sizeof(float));
    for (int i = 0; i < n; i++) {
        p->greedy[i] = tdm_argmax(cur, V);
        p->greedy_margin[i] = tdm_margin(cur, V);
        if (i + 1 < n) forward(f, &p->greedy[i], 1, 0, cur);
    }
    free(cur);
}

struct cmp {
    const struct path *a, *b;
    int rows, agree, sure, first_differ;
    double agree_pct, rel_err;
    json_t *sure_rows;
};

static struct cmp compare(const struct path *a, const struct path *b, int T, int V)
{
    struct cmp c = {.a = a, .b = b, .rows = T, .first_differ = -1, .sure_rows = json_array()};
    for (int t = 0; t < T; t++) {
        if (a->top[t] == b->top[t]) { c.agree++; continue; }
        if (c.first_differ < 0) c.first_differ = t;
        if (a->margin[t] > SURE_MARGIN && b->margin[t] > SURE_MARGIN) {
            c.sure++;
            json_array_append_new(c.sure_rows, json_pack("{s:i, s:i, s:i, s:f, s:f}", "row", t, a->name, a->top[t], b->name,
                                                         b->top[t], "margin_a", (double)a->margin[t], "margin_b",
                                                         (double)b->margin[t]));
        }
    }
    c.agree_pct = 100.0 * c.agree / T;
    c.rel_err = tdm_rel_err(a->logits, b->logits, (int64_t)T * V);
    return c;
}

static json_t *jnum(double x) { return isfinite(x) ? json_real(x) : json_null(); }

static void print_cmp(const struct cmp *c)
{
    printf("%s vs %s: next-token agreement %d/%d (%.2f%%), rel err %.3e, sure disagreements %d; "
           "margin mean %.3f / %.3f, min %.3f / %.3f\n",
           c->a->name, c->b->name, c->agree, c->rows, c->agree_pct, c->rel_err, c->sure, c->a->mean_margin,
           c->b->mean_margin, c->a->min_margin, c->b->min_margin);
}

static json_t *cmp_json(struct cmp *c)
{
    json_t *o = json_pack("{s:s, s:s, s:i, s:i, s:o, s:o, s:i, s:o, s:i}", "a", c->a->name, "b", c->b->name, "rows", c->rows,
                          "agree", c->agree, "agree_pct", jnum(c->agree_pct), "rel_err", jnum(c->rel_err),
                          "sure_disagreements", c->sure, "sure_rows", c->sure_rows, "first_disagreement", c->first_differ);
    c->sure_rows = NULL;
    return o;
}

static json_t *path_json(const struct path *p, int T, int n_greedy)
{
    json_t *top = json_array(), *mar = json_array();
    for (int t = 0; t < T; t++) {
        json_array_append_new(top, json_integer(p->top[t]));
        json_array_append_new(mar, jnum(p->margin[t]));
    }
    json_t *o = json_pack("{s:o, s:o, s:o, s:o}", "mean_margin", jnum(p->mean_margin), "min_margin", jnum(p->min_margin),
                          "argmax", top, "margins", mar);
    if (p->ms >= 0) json_object_set_new(o, "ms", json_real(p->ms));
    if (p->greedy) {
        json_t *g = json_array(), *gm = json_array();
        for (int i = 0; i < n_greedy; i++) {
            json_array_append_new(g, json_integer(p->greedy[i]));
            json_array_append_new(gm, jnum(p->greedy_margin[i]));
        }
        json_object_set_new(o, "greedy", g);
        json_object_set_new(o, "greedy_margins", gm);
    }
    return o;
}

/* --ref FILE: F32 'logits' of shape [T][V]; any other shape is bad input naming the file. */
static float *read_ref(const char *path, int T, int V)
{
    struct tdm_stfile *sf = tdm_st_open(path);
    if (!sf) tdm_die_input(prog);
    const struct tdm_tensor *lt = tdm_st_find(sf, "logits");
    if (!lt) {
        fprintf(stderr, "%s: %s: no tensor 'logits'\n", prog, path);
        exit(TDM_EXIT_USAGE);
    }
    if (lt->dtype != TDM_DT_F32) {
        fprintf(stderr, "%s: %s: 'logits' is not F32\n", prog, path);
        exit(TDM_EXIT_USAGE);
    }
    if (lt->ndim != 2 || lt->shape[0] != T || lt->shape[1] != V) {
        char shape[128] = "";
        for (int i = 0; i < lt->ndim && strlen(shape) < 100; i++)
            snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%s%lld", i ? "," : "", (long long)lt->shape[i]);
        fprintf(stderr, "%s: %s: 'logits' has shape [%s], expected [%d,%d] (prompt tokens, vocab)\n", prog, path, shape, T,
                V);
        exit(TDM_EXIT_USAGE);
    }
    float *x = xmalloc((size_t)T * V * sizeof(float));
    memcpy(x, lt->data, (size_t)T * V * sizeof(float));
    tdm_st_close(sf);
    return x;
}

int main(int argc, char **argv)
{
    const char *model_dir = NULL, *prompt_path = NULL, *ref_path = NULL, *json_path = NULL, *backend_opt = NULL;
    long chunk_opt = -1, n_new = 16;
    static const struct option opts[] = {{"model", 1, 0, 'm'},   {"prompt", 1, 0, 'p'}, {"ref", 1, 0, 'r'},
                                         {"backend", 1, 0, 'b'}, {"chunk", 1, 0, 'c'},  {"new-tokens", 1, 0, 'n'},
                                         {"json", 1, 0, 'j'},    {"help", 0, 0, 'h'},   {0, 0, 0, 0}};
    int o;
    while ((o = tdm_getopt(prog, argc, argv, "m:p:n:h", opts)) != -1) {
        switch (o) {
        case 'm': model_dir = optarg; break;
        case 'p': prompt_path = optarg; break;
        case 'r': ref_path = optarg; break;
        case 'b': backend_opt = optarg; break;
        case 'c': chunk_opt = tdm_opt_long(prog, "--chunk", optarg, 1, 1 << 24); break;
        case 'n': n_new = tdm_opt_long(prog, "-n", optarg, 0, 1 << 20); break;
        case 'j': json_path = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return TDM_EXIT_USAGE;
        }
    }
    if (optind < argc) tdm_die_usage(prog, "unexpected argument", argv[optind]);
    if (!model_dir) tdm_die_usage(prog, "-m DIR is required (see --help)", NULL);
    if (!prompt_path) tdm_die_usage(prog, "-p FILE is required (see --help)", NULL);
    if (tdm_settings_check() != 0) tdm_die_input(prog);
    long chunk = chunk_opt;
    if (chunk < 0 && (tdm_setting_int("TANDEM_PREFILL_CHUNK", &chunk) != 0 || chunk < 1))
        tdm_die_usage(prog, "TANDEM_PREFILL_CHUNK must be a positive integer", NULL);
    long fault;
    if (tdm_setting_int("TANDEM_PREFILL_FAULT", &fault) != 0 || fault < 0)
        tdm_die_usage(prog, "TANDEM_PREFILL_FAULT must be a non-negative integer", NULL);
    struct tdm_model *m = tdm_model_load(model_dir);
    if (!m) tdm_die_input(prog);
    const int V = m->cfg.vocab;
    int32_t *prompt = NULL;
    int T = 0;
    if (tdm_tokens_read(prompt_path, V, 0, &prompt, &T) != 0) tdm_die_input(prog);
    enum tdm_backend backend;
    const char *why;
    if (tdm_backend_pick(backend_opt, m, &backend, &why) != 0) tdm_die_input(prog);
    float *ref_logits = ref_path ? read_ref(ref_path, T, V) : NULL;
    fprintf(stderr, "# backend %s (%s); %d prompt tokens, chunk %ld, reference %s\n", tdm_backend_name(backend), why, T,
            chunk, ref_path ? ref_path : "the CPU reference forward");

    int ctx = T + (int)n_new;
    struct fwd f = {.m = m, .ctx = ctx};
    if (backend == TDM_BACKEND_CUDA && !(f.e = tdm_engine_new(m, ctx))) tdm_die_input(prog);
    struct path A = {.name = "prefill", .ms = -1}, B = {.name = "decode", .ms = -1}, R = {.name = "reference", .ms = -1};
    A.logits = xmalloc((size_t)T * V * sizeof(float));
    B.logits = xmalloc((size_t)T * V * sizeof(float));

    /* reference */
    if (ref_logits) {
        R.logits = ref_logits;
    } else {
        R.logits = xmalloc((size_t)T * V * sizeof(float));
        struct tdm_ref *r = tdm_ref_new(m, T);
        if (!r) { fprintf(stderr, "%s: out of memory\n", prog); return 1; }
        double t0 = tdm_now_ms();
        if (tdm_ref_forward(r, prompt, T, 0, R.logits, NULL, NULL) != 0) tdm_die_input(prog);
        R.ms = tdm_now_ms() - t0;
        tdm_ref_free(r);
    }

    /* path A: chunks, then greedy on its state */
    fwd_fresh(&f);
    double t0 = tdm_now_ms();
    for (int at = 0; at < T; at += (int)chunk) {
        int n = T - at < chunk ? T - at : (int)chunk;
        prefill(&f, prompt + at, n, 0, A.logits + (size_t)at * V);
    }
    A.ms = tdm_now_ms() - t0;
    if (fault > 0) {
        fprintf(stderr, "# TANDEM_PREFILL_FAULT=%ld: the prefill path's logits are negated in its first %ld rows (testing)\n",
                fault, fault < T ? fault : T);
        for (size_t i = 0; i < (size_t)(fault < T ? fault : T) * V; i++) A.logits[i] = -A.logits[i];
    }
    greedy(&f, &A, A.logits + (size_t)(T - 1) * V, (int)n_new, V);

    /* path B: one token at a time, then greedy on its state */
    fwd_fresh(&f);
    t0 = tdm_now_ms();
    for (int t = 0; t < T; t++) forward(&f, prompt + t, 1, 0, B.logits + (size_t)t * V);
    B.ms = tdm_now_ms() - t0;
    greedy(&f, &B, B.logits + (size_t)(T - 1) * V, (int)n_new, V);

    path_stats(&A, T, V);
    path_stats(&B, T, V);
    path_stats(&R, T, V);
    struct cmp ar = compare(&A, &R, T, V), br = compare(&B, &R, T, V), ab = compare(&A, &B, T, V);
    print_cmp(&ar);
    print_cmp(&br);
    print_cmp(&ab);

    int g_first = -1;
    for (int i = 0; i < n_new && g_first < 0; i++)
        if (A.greedy[i] != B.greedy[i]) g_first = i;
    if (g_first < 0)
        printf("greedy continuation, %ld tokens: prefill and decode equal\n", n_new);
    else
        printf("greedy continuation, %ld tokens: first differ at step %d: prefill %d (margin %.3f) vs decode %d "
               "(margin %.3f)\n",
               n_new, g_first, A.greedy[g_first], A.greedy_margin[g_first], B.greedy[g_first], B.greedy_margin[g_first]);

    /* one point, or one row where a row is more than a point (the gate cannot resolve less) */
    const double slack = T < 100 ? 100.0 / T : 1.0;
    int gate_agree = ar.agree_pct >= br.agree_pct - slack - 1e-9;
    int gate_sure = ar.sure == 0;
    int pass = gate_agree && gate_sure;
    printf("gate: %s (prefill vs reference %.2f%% %s decode vs reference %.2f%% - %.2f point%s; %d sure disagreements "
           "prefill vs reference)\n",
           pass ? "holds" : "fails", ar.agree_pct, gate_agree ? ">=" : "<", br.agree_pct, slack, slack == 1.0 ? "" : "s",
           ar.sure);
    fflush(stdout);

    int rc = pass ? TDM_EXIT_OK : TDM_EXIT_CHECK;
    if (json_path) {
        json_t *gr = json_pack("{s:i, s:b, s:i}", "tokens", (int)n_new, "equal", g_first < 0, "first_differ", g_first);
        if (g_first >= 0) {
            json_object_set_new(gr, "prefill_token", json_integer(A.greedy[g_first]));
            json_object_set_new(gr, "decode_token", json_integer(B.greedy[g_first]));
            json_object_set_new(gr, "prefill_margin", jnum(A.greedy_margin[g_first]));
            json_object_set_new(gr, "decode_margin", jnum(B.greedy_margin[g_first]));
        }
        json_t *cmps = json_array();
        json_array_append_new(cmps, cmp_json(&ar));
        json_array_append_new(cmps, cmp_json(&br));
        json_array_append_new(cmps, cmp_json(&ab));
        json_t *gate = json_pack("{s:b, s:b, s:f, s:b, s:s}", "pass", pass, "agreement_within_one_point", gate_agree,
                                 "slack_points", slack, "no_sure_disagreement", gate_sure, "rule",
                                 "prefill-reference agreement >= decode-reference agreement - 1 point (one row, 100/T "
                                 "points, when T < 100), and no row where prefill and reference argmaxes differ with both "
                                 "margins > 5");
        json_t *rec = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:i, s:i, s:I, s:i, s:f, s:{s:o, s:o, s:o}, s:o, s:o, s:o}",
                                "tool", prog, "model", model_dir, "prompt", prompt_path, "reference",
                                ref_path ? ref_path : "cpu-reference", "backend", tdm_backend_name(backend),
                                "backend_why", why, "prompt_tokens", T, "vocab", V, "chunk", (json_int_t)chunk,
                                "new_tokens", (int)n_new, "sure_margin", (double)SURE_MARGIN, "paths", "prefill",
                                path_json(&A, T, (int)n_new), "decode", path_json(&B, T, (int)n_new), "reference",
                                path_json(&R, T, 0), "comparisons", cmps, "greedy", gr, "gate", gate);
        if (!rec) {
            fprintf(stderr, "%s: %s: could not build the JSON record\n", prog, json_path);
            rc = TDM_EXIT_USAGE;
        } else if (tdm_json_write_atomic(json_path, rec, JSON_INDENT(2) | JSON_PRESERVE_ORDER) != 0) {
            fprintf(stderr, "%s: %s\n", prog, tdm_err());
            rc = TDM_EXIT_USAGE;
        }
        json_decref(rec);
    }
    json_decref(ar.sure_rows);
    json_decref(br.sure_rows);
    json_decref(ab.sure_rows);
    struct path *ps[3] = {&A, &B, &R};
    for (int i = 0; i < 3; i++) {
        free(ps[i]->logits);
        free(ps[i]->top);
        free(ps[i]->margin);
        free(ps[i]->greedy);
        free(ps[i]->greedy_margin);
    }
    free(prompt);
    tdm_ref_free(f.r);
    tdm_engine_free(f.e);
    tdm_model_free(m);
    return rc;
}
