/* tandem-run — load a model, read a prompt token file, prefill, decode N tokens greedily, write the
 * new token ids to stdout one per line; statistics on stderr ("# " lines). */
#include "backend.h"
#include "cli.h"
#include "engine.h"
#include "err.h"
#include "jsonfile.h"
#include "model.h"
#include "ref.h"
#include "safetensors.h"
#include "settings.h"
#include "spec.h"
#include "tokens.h"
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
            "      --backend cpu|cuda|auto  compute backend (default TANDEM_BACKEND, auto: cuda when a device\n"
            "                           is visible and the engine serves the model and the job, else the CPU\n"
            "                           reference; the '# backend' line says which and why). cuda: the CUDA\n"
            "                           engine on device 0 for qwen3_5, qwen3_next and qwen3_5_moe\n"
            "                           checkpoints (BF16, FP8, NVFP4): the prompt in chunks of\n"
            "                           TANDEM_PREFILL_CHUNK tokens through the wide GEMM and the flash\n"
            "                           prefill attention (32 for MoE), greedy decode from a CUDA graph\n"
            "                           with the ids chosen on the device (a step's logits cross to the host\n"
            "                           only with --dump-logits, and on the last step for the hash line),\n"
            "                           --force, --dump-logits, and --spec mtp, ngram or draft with chain\n"
            "                           or tree rounds (an MTP tree drafts each node on the engine); exit 2\n"
            "                           without a device or for shapes its kernels do not take\n"
            "      --dump-logits FILE   write F32 'logits' [rows, vocab] as safetensors: one row per position\n"
            "                           whose logits were computed (with -n 0: every prompt position)\n"
            "      --force FILE         feed these ids through the decode path instead of the argmax\n"
            "                           (teacher forcing); stdout still shows the argmax at each step\n"
            "      --spec KIND          speculative decoding with a drafter: mtp (the model's MTP layer),\n"
            "                           ngram (prompt lookup, no model), draft (--draft-model), or off\n"
            "                           (default: plain one-token greedy decode). The tokens are the greedy\n"
            "                           tokens (chain verify is bit-identical to one-token decode on either\n"
            "                           backend, tree verify on cuda too; on the CPU a tree is the factored\n"
            "                           form and may flip a near tie). cuda: the MTP layer runs on the\n"
            "                           engine, the draft model on a second engine\n"
            "      --draft N            chain: draft tokens per round, 1..31 (default %d)\n"
            "      --tree SPEC          tree verify instead of a chain: branching per depth from the drafter's\n"
            "                           top-k, e.g. 3,2,1 (cut at 32 nodes with the root; depth-first)\n"
            "      --draft-model DIR    the draft model for --spec draft (same vocabulary)\n"
            "      --ngram N            longest suffix the n-gram drafter matches (default %d)\n"
            "      --json FILE          write a JSON record of the run (with --spec: the round statistics)\n"
            "      --settings           print every TANDEM_* switch with its value and origin, then exit\n"
            "  -h, --help               this text\n"
            "\n"
            "With --spec, statistics go to stderr: accepted drafts per round, acceptance per draft depth,\n"
            "rounds and round time by shape, and the GDN state bytes moved per round (the commit deferred\n"
            "or not: TANDEM_SPEC_DEFER on the CPU, TANDEM_GDN_DEFER on cuda);\n"
            "--dump-logits then writes the row each new token was chosen from.\n"
            "\n"
            "Exit status: 0 done, 1 a CUDA call failed during the forward or a round (or a device greedy id\n"
            "differed from the host argmax of the same logits), 2 bad usage or bad input\n"
            "(one line on stderr naming the file and fault; also: no device, an unsupported layout or --spec\n"
            "combination, out of device memory, a --json FILE that cannot be written).\n",
            TDM_SPEC_DEFAULT_DRAFT, TDM_SPEC_DEFAULT_NGRAM);
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

/* The plain decode loop's forward: the CPU reference or the CUDA engine (same contract), with the
 * greedy ids of rows from..T-1 in gid: on the engine chosen on the device, the logits copied only
 * when keep (engine.h: tdm_engine_forward_ids); on the CPU tdm_argmax of the reference's logits. */
struct fwd { struct tdm_ref *r; struct tdm_engine *e; int V; };
static int forward(struct fwd *f, const int32_t *ids, int T, int from, int keep, float *logits, int32_t *gid)
{
    if (f->e) return tdm_engine_forward_ids(f->e, ids, T, from, keep ? logits : NULL, gid);
    if (tdm_ref_forward(f->r, ids, T, from, logits, NULL, NULL) != 0) return -1;
    for (int t = from; t < T; t++) gid[t - from] = tdm_argmax(logits + (size_t)(t - from) * f->V, f->V);
    return 0;
}
/* The prompt: on the engine in prefill chunks (tdm_engine_prefill: the wide GEMM and the flash
 * prefill attention past 32 rows). */
static int prefill(struct fwd *f, const int32_t *ids, int T, int from, float *logits)
{
    return f->e ? tdm_engine_prefill(f->e, ids, T, from, logits) : tdm_ref_forward(f->r, ids, T, from, logits, NULL, NULL);
}
/* The ids and the context were checked before: a CPU failure is bad input (exit 2), a CUDA failure
 * a failed call (exit 1). */
__attribute__((noreturn)) static void forward_failed(const struct fwd *f)
{
    if (f->e) tdm_die_check(prog);
    tdm_die_input(prog);
}

struct fmt_bytes { int64_t b[TDM_W_COUNT]; };
static void count_fmt(void *ctx, const char *what, const struct tdm_qweight *w)
{
    (void)what;
    ((struct fmt_bytes *)ctx)->b[w->fmt] += tdm_qweight_bytes(w);
}

/* The head's format and the bytes it reads a token (TANDEM_HEAD_FORMAT), for --json. */
static json_t *head_json(const struct tdm_model *m)
{
    const int64_t now = tdm_qweight_bytes(&m->head);
    return json_pack("{s:s, s:I, s:I}", "format", m->head_bytes_stored ? tdm_wfmt_name(m->head.fmt) : "stored", "bytes",
                     (json_int_t)now, "bytes_stored", (json_int_t)(m->head_bytes_stored ? m->head_bytes_stored : now));
}

/* --spec: speculative rounds on so->backend (spec.h); tokens to stdout, statistics to stderr. */
/* Writes the run's JSON record to path and frees it; returns rc, or, when rc is 0 and the file cannot be
 * written, TDM_EXIT_USAGE (bad input; a failed check stays 1) after one line naming the file. */
static int write_record(const char *path, json_t *rec, int rc)
{
    if (tdm_json_write_atomic(path, rec, JSON_INDENT(2) | JSON_PRESERVE_ORDER) != 0) {
        fprintf(stderr, "%s: %s\n", prog, tdm_err());
        if (rc == 0) rc = TDM_EXIT_USAGE;
    }
    json_decref(rec);
    return rc;
}

static int run_spec(const struct tdm_model *m, struct tdm_spec_opts *so, const char *draft_dir, const int32_t *prompt,
                    int n_prompt, int n_new, const char *dump_path, const char *json_path, const char *model_dir)
{
    const int V = m->cfg.vocab;
    struct tdm_model *dm = NULL;
    if (draft_dir) {
        if (!(dm = tdm_model_load(draft_dir))) tdm_die_input(prog);
        so->draft_model = dm;
    }
    int32_t *out = malloc((size_t)(n_new > 0 ? n_new : 1) * sizeof(int32_t));
    float *rows = dump_path ? malloc((size_t)(n_new > 0 ? n_new : 1) * V * sizeof(float)) : NULL;
    if (!out || (dump_path && !rows)) { fprintf(stderr, "%s: out of memory\n", prog); exit(1); }
    struct tdm_spec_stats st;
    const int grc = tdm_spec_generate(m, so, prompt, n_prompt, n_new, out, rows, &st);
    if (grc == -2) tdm_die_check(prog); /* a CUDA call failed */
    if (grc != 0) tdm_die_input(prog);
    for (int i = 0; i < n_new; i++) printf("%d\n", out[i]);
    fflush(stdout);
    char shape[128];
    tdm_spec_shape_name(so, shape, sizeof shape);
    fprintf(stderr, "# prefill %d tokens: %.1f ms\n", n_prompt, st.prefill_ms);
    const struct tdm_mtp *mt = &m->mtp;
    char how[96];
    if (so->kind == TDM_SPEC_MTP)
        fprintf(stderr, "# drafter: the MTP layer, %s: a draft token's projections and head read %.1f MB (%.1f MB as stored)\n",
                tdm_model_draft_how(m, how, sizeof how), mt->draft_bytes_now / 1e6,
                mt->draft_bytes / 1e6);
    fprintf(stderr, "# speculative %s, %s: %d tokens in %.1f ms, %.2f ms/token\n", tdm_spec_name(so->kind), shape, n_new,
            st.decode_ms, n_new ? st.decode_ms / n_new : 0.0);
    tdm_spec_stats_print(stderr, &st);
    int rc = 0;
    if (dump_path) {
        struct tdm_st_desc d = {.name = "logits", .dtype = TDM_DT_F32, .ndim = 2, .shape = {n_new, V}, .data = rows};
        if (tdm_st_write(dump_path, &d, 1) != 0) { fprintf(stderr, "%s: %s\n", prog, tdm_err()); rc = 1; }
    }
    if (json_path) {
        json_t *toks = json_array();
        for (int i = 0; i < n_new; i++) json_array_append_new(toks, json_integer(out[i]));
        json_t *rec = json_pack("{s:s, s:s, s:s, s:i, s:i, s:o, s:f, s:f, s:f, s:s, s:s, s:o}", "model", model_dir, "arch",
                                tdm_arch_name(m->cfg.arch), "backend", tdm_backend_name(so->backend), "prompt_tokens",
                                n_prompt, "new_tokens", n_new, "tokens", toks, "prefill_ms", st.prefill_ms, "decode_ms",
                                st.decode_ms, "ms_per_token", n_new ? st.decode_ms / n_new : 0.0, "spec",
                                tdm_spec_name(so->kind), "shape", shape, "speculative", tdm_spec_stats_json(&st));
        if (draft_dir) json_object_set_new(rec, "draft_model", json_string(draft_dir));
        if (so->kind == TDM_SPEC_MTP)
            json_object_set_new(rec, "drafter", json_pack("{s:s, s:I, s:I}", "format",
                                                          mt->requant >= 0 ? tdm_wfmt_name((enum tdm_wfmt)mt->requant) : "stored",
                                                          "bytes_per_draft", (json_int_t)mt->draft_bytes_now,
                                                          "bytes_per_draft_stored", (json_int_t)mt->draft_bytes));
        json_object_set_new(rec, "head", head_json(m));
        rc = write_record(json_path, rec, rc);
    }
    free(out);
    free(rows);
    tdm_model_free(dm);
    return rc;
}

int main(int argc, char **argv)
{
    const char *model_dir = NULL, *prompt_path = NULL, *dump_path = NULL, *force_path = NULL, *json_path = NULL;
    const char *backend_opt = NULL, *spec_opt = NULL, *tree_opt = NULL, *draft_dir = NULL;
    long n_new = -1, ctx_opt = -1, draft_n = -1, ngram_n = -1;
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'}, {"prompt", required_argument, 0, 'p'},
        {"new-tokens", required_argument, 0, 'n'}, {"ctx", required_argument, 0, 'c'},
        {"backend", required_argument, 0, 'b'}, {"dump-logits", required_argument, 0, 'd'},
        {"force", required_argument, 0, 'f'}, {"json", required_argument, 0, 'j'},
        {"settings", no_argument, 0, 's'}, {"help", no_argument, 0, 'h'}, {"spec", required_argument, 0, 'S'},
        {"draft", required_argument, 0, 'D'}, {"tree", required_argument, 0, 'T'},
        {"draft-model", required_argument, 0, 'M'}, {"ngram", required_argument, 0, 'G'}, {0, 0, 0, 0}};
    int o;
    while ((o = tdm_getopt(prog, argc, argv, "m:p:n:h", opts)) != -1) {
        switch (o) {
        case 'm': model_dir = optarg; break;
        case 'p': prompt_path = optarg; break;
        case 'n': n_new = tdm_opt_long(prog, "-n", optarg, 0, 1 << 24); break;
        case 'c': ctx_opt = tdm_opt_long(prog, "--ctx", optarg, 0, 1 << 24); break;
        case 'b': backend_opt = optarg; break;
        case 'd': dump_path = optarg; break;
        case 'f': force_path = optarg; break;
        case 'j': json_path = optarg; break;
        case 'S': spec_opt = optarg; break;
        case 'D': draft_n = tdm_opt_long(prog, "--draft", optarg, 0, TDM_SPEC_MAX_NODES - 1); break;
        case 'T': tree_opt = optarg; break;
        case 'M': draft_dir = optarg; break;
        case 'G': ngram_n = tdm_opt_long(prog, "--ngram", optarg, 0, 64); break;
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
    struct tdm_spec_opts so;
    if (tdm_spec_opts_init(&so) != 0) tdm_die_input(prog);
    if (spec_opt && tdm_spec_parse(spec_opt, &so.kind) != 0) tdm_die_input(prog);
    if (tree_opt && tdm_spec_parse_tree(tree_opt, &so) != 0) tdm_die_input(prog);
    if (draft_n >= 0) {
        if (draft_n < 1) tdm_die_usage(prog, "--draft: expected 1 to 31 draft tokens", NULL);
        so.draft = (int)draft_n;
    }
    if (ngram_n >= 0) {
        if (ngram_n < 1) tdm_die_usage(prog, "--ngram: expected 1 to 64", NULL);
        so.ngram_max = (int)ngram_n;
    }
    if (so.kind == TDM_SPEC_OFF && (tree_opt || draft_n >= 0 || draft_dir || ngram_n >= 0))
        tdm_die_usage(prog, "--draft, --tree, --draft-model and --ngram need --spec", NULL);
    if (so.kind == TDM_SPEC_DRAFT && !draft_dir) tdm_die_usage(prog, "--spec draft needs --draft-model DIR", NULL);
    if (so.kind != TDM_SPEC_DRAFT && draft_dir) tdm_die_usage(prog, "--draft-model is for --spec draft", NULL);
    if (so.kind != TDM_SPEC_OFF && force_path) tdm_die_usage(prog, "--force and --spec do not go together", NULL);
    enum tdm_backend backend;
    const char *why;
    /* a backend that cannot run is refused before the model is read; auto is settled after */
    if (tdm_backend_pick(backend_opt, NULL, &backend, &why) != 0) tdm_die_input(prog);
    double t0 = tdm_now_ms();
    struct tdm_model *m = tdm_model_load(model_dir);
    if (!m) tdm_die_input(prog);
    if (tdm_backend_pick(backend_opt, m, &backend, &why) != 0) tdm_die_input(prog);
    so.backend = backend;
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
    if (m->head_bytes_stored)
        fprintf(stderr, "\n# head: requantized to %s (TANDEM_HEAD_FORMAT): %.1f MB a token (%.1f MB as stored)",
                tdm_wfmt_title(m->head.fmt), tdm_qweight_bytes(&m->head) / 1e6, m->head_bytes_stored / 1e6);
    fprintf(stderr, "\n# backend %s (%s); loaded in %.1f ms\n", tdm_backend_name(backend), why, tdm_now_ms() - t0);

    if (so.kind != TDM_SPEC_OFF) {
        int rc = run_spec(m, &so, draft_dir, prompt, n_prompt, (int)n_new, dump_path, json_path, model_dir);
        free(prompt);
        tdm_model_free(m);
        return rc;
    }

    struct fwd f = {NULL, NULL, c->vocab};
    if (backend == TDM_BACKEND_CUDA) {
        if (!(f.e = tdm_engine_new(m, (int)(ctx > 0 ? ctx : 1)))) tdm_die_input(prog);
    } else {
        f.r = tdm_ref_new(m, (int)(ctx > 0 ? ctx : 1));
    }
    const int V = c->vocab;
    struct rows dump = {.width = V};
    float *logits = malloc((size_t)(n_prompt > 1 ? n_prompt : 1) * V * sizeof(float));
    int32_t *out = malloc((size_t)(n_new > 0 ? n_new : 1) * sizeof(int32_t));
    if (!logits || !out) { fprintf(stderr, "%s: out of memory\n", prog); return 1; }
    int all_rows = n_new == 0 && dump_path;

    /* prefill, chunk by chunk */
    double tp = tdm_now_ms();
    for (int at = 0; at < n_prompt; at += (int)chunk) {
        int T = n_prompt - at < chunk ? n_prompt - at : (int)chunk;
        int last = at + T == n_prompt;
        int from = all_rows ? 0 : last ? T - 1 : T;
        if (prefill(&f, prompt + at, T, from, logits) != 0) forward_failed(&f);
        if (all_rows)
            for (int t = 0; t < T; t++) rows_add(&dump, logits + (size_t)t * V);
    }
    double prefill_ms = tdm_now_ms() - tp;
    fprintf(stderr, "# prefill %d tokens: %.1f ms (%.0f tokens/s)\n", n_prompt, prefill_ms,
            prefill_ms > 0 ? n_prompt / (prefill_ms / 1e3) : 0.0);

    /* decode: the first token from the prompt's last logits row; then each step's greedy id, chosen
     * on the device on the cuda backend, with its logits copied to the host only with --dump-logits
     * and on the last step (the hash below). Where the logits come, the token is their host argmax
     * as before, and on the engine the device's id must agree with it (counted, exit 1 if not). */
    double td = tdm_now_ms();
    int tok = n_new > 0 ? tdm_argmax(logits, V) : 0;
    long id_checked = 0, id_differ = 0;
    for (long i = 0; i < n_new; i++) {
        if (dump_path) rows_add(&dump, logits);
        out[i] = tok;
        printf("%d\n", tok);
        fflush(stdout);
        if (i + 1 == n_new) break;
        int32_t feed = force && i < n_force ? force[i] : tok, gid;
        const int keep = dump_path || i + 2 == n_new;
        if (forward(&f, &feed, 1, 0, keep, logits, &gid) != 0) forward_failed(&f);
        tok = gid;
        if (keep) {
            tok = tdm_argmax(logits, V);
            if (f.e && gid != tok && !id_differ++)
                fprintf(stderr, "%s: step %ld: the device's greedy id %d differs from the host argmax %d of the same logits\n",
                        prog, i + 1, gid, tok);
            id_checked += f.e != NULL;
        }
    }
    double decode_ms = tdm_now_ms() - td;
    /* the bytes a decode step must move, at the middle of the decoded span */
    const struct tdm_step_bytes sb = tdm_model_step_bytes(m, n_prompt + n_new / 2);
    if (n_new > 0) {
        fprintf(stderr, "# decode %ld tokens: %.1f ms, %.2f ms/token, %.1f tokens/s\n", n_new, decode_ms,
                decode_ms / n_new, n_new / (decode_ms / 1e3));
        fprintf(stderr, "# a decode step moves %.1f MB (weights %.1f, GDN state read+write %.1f, KV read %.1f): "
                "%.3g GB/s at this rate\n", sb.total / 1e6, sb.weights / 1e6, sb.gdn_state / 1e6, sb.kv / 1e6,
                n_new > 1 ? sb.total / (decode_ms / n_new) / 1e6 : 0.0);
    }
    unsigned long long hash = logits_hash(logits, V);
    fprintf(stderr, "# last logits hash %016llx\n", hash);
    if (f.e && n_new > 1)
        fprintf(stderr, "# greedy ids chosen on the device: logits copied on %ld of %ld steps (%s); the device's id "
                "equals their host argmax on %ld of %ld\n", id_checked, n_new - 1,
                dump_path ? "--dump-logits" : "the last, for the hash", id_checked - id_differ, id_checked);

    int rc = id_differ ? 1 : 0;
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
        json_object_set_new(rec, "step_bytes", json_pack("{s:I, s:I, s:I, s:I}", "weights", (json_int_t)sb.weights,
                                                          "gdn_state", (json_int_t)sb.gdn_state, "kv", (json_int_t)sb.kv,
                                                          "total", (json_int_t)sb.total));
        json_object_set_new(rec, "head", head_json(m));
        rc = write_record(json_path, rec, rc);
    }
    free(dump.v); free(logits); free(out); free(prompt); free(force);
    tdm_ref_free(f.r);
    tdm_engine_free(f.e);
    tdm_model_free(m);
    return rc;
}
