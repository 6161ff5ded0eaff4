/* tandem-run — load a model, read a prompt token file, prefill, decode N tokens greedily, write the
 * new token ids to stdout one per line; statistics on stderr ("# " lines). */
#include "backend.h"
#include "err.h"
#include "fileio.h"
#include "model.h"
#include "ref.h"
#include "safetensors.h"
#include "settings.h"
#include "tokens.h"
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *prog = "tandem-run";

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tandem-run -m DIR [-p FILE] [-n N] [options]\n"
            "Prefill a prompt and decode N tokens greedily; the new token ids go to stdout, one per line.\n"
            "\n"
            "  -m, --model DIR          checkpoint directory (config.json + model.safetensors or shards)\n"
            "  -p, --prompt FILE        prompt token file (decimal ids, '#' comments); default: stdin\n"
            "  -n, --new-tokens N       tokens to generate (default 16, or the length of --force)\n"
            "      --ctx N              context capacity in tokens (default: prompt + N)\n"
            "      --backend cpu|cuda   compute backend (default TANDEM_BACKEND, auto). The CUDA engine is\n"
            "                           not built yet: auto runs the CPU reference\n"
            "      --dump-logits FILE   write F32 'logits' [rows, vocab] as safetensors: one row per position\n"
            "                           whose logits were computed (with -n 0: every prompt position)\n"
            "      --force FILE         feed these ids through the decode path instead of the argmax\n"
            "                           (teacher forcing); stdout still shows the argmax at each step\n"
            "      --json FILE          write a JSON record of the run\n"
            "      --settings           print every TANDEM_* switch with its value and origin, then exit\n"
            "  -h, --help               this text\n"
            "\n"
            "Exit status: 0 done, 2 bad usage or bad input (one line on stderr naming the file and fault).\n");
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static long parse_count(const char *opt, const char *v, long max)
{
    char *end;
    long x = strtol(v, &end, 10);
    if (!*v || *end || x < 0 || x > max) {
        fprintf(stderr, "%s: %s %s: expected an integer from 0 to %ld\n", prog, opt, v, max);
        exit(TDM_EXIT_USAGE);
    }
    return x;
}

/* FNV-1a over the bits of the logits: a regression shows up as a changed hash. */
static unsigned long long logits_hash(const float *x, int n)
{
    unsigned long long h = 1469598103934665603ull;
    const unsigned char *b = (const unsigned char *)x;
    for (size_t i = 0; i < (size_t)n * sizeof(float); i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

struct rows { float *v; int n, cap, width; };
static void rows_add(struct rows *r, const float *x)
{
    if (r->n == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 64;
        r->v = realloc(r->v, (size_t)r->cap * (size_t)r->width * sizeof(float));
        if (!r->v) { fprintf(stderr, "%s: out of memory\n", prog); exit(1); }
    }
    memcpy(r->v + (size_t)r->n * r->width, x, (size_t)r->width * sizeof(float));
    r->n++;
}

struct fmt_bytes { int64_t b[TDM_W_COUNT]; };
static void count_fmt(void *ctx, const char *what, const struct tdm_qweight *w)
{
    (void)what;
    ((struct fmt_bytes *)ctx)->b[w->fmt] += tdm_qweight_bytes(w);
}

int main(int argc, char **argv)
{
    const char *model_dir = NULL, *prompt_path = NULL, *dump_path = NULL, *force_path = NULL, *json_path = NULL;
    const char *backend_opt = NULL;
    long n_new = -1, ctx_opt = -1;
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'}, {"prompt", required_argument, 0, 'p'},
        {"new-tokens", required_argument, 0, 'n'}, {"ctx", required_argument, 0, 'c'},
        {"backend", required_argument, 0, 'b'}, {"dump-logits", required_argument, 0, 'd'},
        {"force", required_argument, 0, 'f'}, {"json", required_argument, 0, 'j'},
        {"settings", no_argument, 0, 's'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int o;
    while ((o = getopt_long(argc, argv, "m:p:n:h", opts, NULL)) != -1) {
        switch (o) {
        case 'm': model_dir = optarg; break;
        case 'p': prompt_path = optarg; break;
        case 'n': n_new = parse_count("-n", optarg, 1 << 24); break;
        case 'c': ctx_opt = parse_count("--ctx", optarg, 1 << 24); break;
        case 'b': backend_opt = optarg; break;
        case 'd': dump_path = optarg; break;
        case 'f': force_path = optarg; break;
        case 'j': json_path = optarg; break;
        case 's':
            if (tdm_settings_check() != 0) tdm_die_input(prog);
            tdm_settings_print(stdout);
            return 0;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return TDM_EXIT_USAGE;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "%s: unexpected argument '%s'\n", prog, argv[optind]);
        return TDM_EXIT_USAGE;
    }
    if (!model_dir) {
        fprintf(stderr, "%s: -m DIR is required (see --help)\n", prog);
        return TDM_EXIT_USAGE;
    }
    if (tdm_settings_check() != 0) tdm_die_input(prog);
    long chunk;
    if (tdm_setting_int("TANDEM_PREFILL_CHUNK", &chunk) != 0 || chunk < 1) {
        fprintf(stderr, "%s: TANDEM_PREFILL_CHUNK must be a positive integer\n", prog);
        return TDM_EXIT_USAGE;
    }
    enum tdm_backend backend;
    const char *why;
    if (tdm_backend_pick(backend_opt, &backend, &why) != 0) tdm_die_input(prog);

    double t0 = now_ms();
    struct tdm_model *m = tdm_model_load(model_dir);
    if (!m) tdm_die_input(prog);
    const struct tdm_config *c = &m->cfg;
    int32_t *prompt = NULL, *force = NULL;
    int n_prompt = 0, n_force = 0;
    if (tdm_tokens_read(prompt_path, c->vocab, 0, &prompt, &n_prompt) != 0) tdm_die_input(prog);
    if (force_path && tdm_tokens_read(force_path, c->vocab, 0, &force, &n_force) != 0) tdm_die_input(prog);
    if (n_new < 0) n_new = force ? n_force : 16;
    long need = n_prompt + (n_new > 0 ? n_new - 1 : 0);
    long ctx = ctx_opt >= 0 ? ctx_opt : need;
    if (ctx < need) {
        fprintf(stderr, "%s: context overflow: %d prompt tokens + %ld new need %ld positions, --ctx is %ld\n", prog,
                n_prompt, n_new, need, ctx);
        free(prompt);
        free(force);
        tdm_model_free(m);
        return TDM_EXIT_USAGE;
    }
    if (c->max_positions > 0 && need > c->max_positions)
        fprintf(stderr, "# warning: %ld positions exceed max_position_embeddings %d\n", need, c->max_positions);

    struct fmt_bytes fb = {{0}};
    tdm_model_each_projection(m, count_fmt, &fb);
    int n_attn = 0;
    for (int i = 0; i < c->n_layers; i++) n_attn += c->mixer[i] == TDM_MIXER_ATTN;
    fprintf(stderr, "# model %s: %s, %d layers (%d GDN + %d attention), hidden %d, vocab %d%s\n", model_dir,
            tdm_arch_name(c->arch), c->n_layers, c->n_layers - n_attn, n_attn, c->hidden, c->vocab,
            m->has_mtp ? ", MTP layer" : "");
    fprintf(stderr, "# projection weights:");
    for (int f = 0; f < TDM_W_COUNT; f++)
        if (fb.b[f]) fprintf(stderr, " %s %.1f MB", tdm_wfmt_name((enum tdm_wfmt)f), fb.b[f] / 1e6);
    fprintf(stderr, "\n# backend %s (%s); loaded in %.1f ms\n", tdm_backend_name(backend), why, now_ms() - t0);

    struct tdm_ref *r = tdm_ref_new(m, (int)(ctx > 0 ? ctx : 1));
    const int V = c->vocab;
    struct rows dump = {.width = V};
    float *logits = malloc((size_t)(n_prompt > 1 ? n_prompt : 1) * V * sizeof(float));
    int32_t *out = malloc((size_t)(n_new > 0 ? n_new : 1) * sizeof(int32_t));
    if (!logits || !out) { fprintf(stderr, "%s: out of memory\n", prog); return 1; }
    int all_rows = n_new == 0 && dump_path;

    /* prefill, chunk by chunk */
    double tp = now_ms();
    for (int at = 0; at < n_prompt; at += (int)chunk) {
        int T = n_prompt - at < chunk ? n_prompt - at : (int)chunk;
        int last = at + T == n_prompt;
        int from = all_rows ? 0 : last ? T - 1 : T;
        if (tdm_ref_forward(r, prompt + at, T, from, logits, NULL, NULL) != 0) tdm_die_input(prog);
        if (all_rows)
            for (int t = 0; t < T; t++) rows_add(&dump, logits + (size_t)t * V);
    }
    double prefill_ms = now_ms() - tp;
    fprintf(stderr, "# prefill %d tokens: %.1f ms (%.0f tokens/s)\n", n_prompt, prefill_ms,
            prefill_ms > 0 ? n_prompt / (prefill_ms / 1e3) : 0.0);

    /* decode */
    double td = now_ms();
    for (long i = 0; i < n_new; i++) {
        if (dump_path) rows_add(&dump, logits);
        int tok = tdm_argmax(logits, V);
        out[i] = tok;
        printf("%d\n", tok);
        fflush(stdout);
        if (i + 1 == n_new) break;
        int32_t feed = force && i < n_force ? force[i] : tok;
        if (tdm_ref_forward(r, &feed, 1, 0, logits, NULL, NULL) != 0) tdm_die_input(prog);
    }
    double decode_ms = now_ms() - td;
    if (n_new > 0)
        fprintf(stderr, "# decode %ld tokens: %.1f ms, %.2f ms/token, %.1f tokens/s\n", n_new, decode_ms,
                decode_ms / n_new, n_new / (decode_ms / 1e3));
    unsigned long long hash = logits_hash(logits, V);
    fprintf(stderr, "# last logits hash %016llx\n", hash);

    int rc = 0;
    if (dump_path) {
        struct tdm_st_desc d = {.name = "logits", .dtype = TDM_DT_F32, .ndim = 2, .shape = {dump.n, V}, .data = dump.v};
        if (tdm_st_write(dump_path, &d, 1) != 0) { fprintf(stderr, "%s: %s\n", prog, tdm_err()); rc = 1; }
    }
    if (json_path) {
        json_t *toks = json_array();
        for (long i = 0; i < n_new; i++) json_array_append_new(toks, json_integer(out[i]));
        json_t *rec = json_pack("{s:s, s:s, s:s, s:i, s:I, s:o, s:f, s:f, s:f, s:f, s:s}", "model", model_dir, "arch",
                                tdm_arch_name(c->arch), "backend", tdm_backend_name(backend), "prompt_tokens", n_prompt,
                                "new_tokens", (json_int_t)n_new, "tokens", toks, "prefill_ms", prefill_ms, "decode_ms",
                                decode_ms, "ms_per_token", n_new ? decode_ms / n_new : 0.0, "tokens_per_s",
                                n_new && decode_ms > 0 ? n_new / (decode_ms / 1e3) : 0.0, "logits_hash", "");
        char hs[32];
        snprintf(hs, sizeof hs, "%016llx", hash);
        json_object_set_new(rec, "logits_hash", json_string(hs));
        char *s = json_dumps(rec, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        json_decref(rec);
        if (!s || tdm_write_file_atomic(json_path, s, strlen(s)) != 0) { fprintf(stderr, "%s: %s\n", prog, tdm_err()); rc = 1; }
        free(s);
    }
    free(dump.v); free(logits); free(out); free(prompt); free(force);
    tdm_ref_free(r);
    tdm_model_free(m);
    return rc;
}
