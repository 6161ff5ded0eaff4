/* tandem-benchround — what a speculative round costs on the CUDA engine against a one-row decode
 * step: the graphed decode step; chain verify rounds of 1..32 rows and tree rounds (verify, commit,
 * the GDN state and weight bytes a round reads); rounds with the model's MTP drafter in front
 * (k = 1..4 chained drafts, verify of k + 1 rows, commit); and the tokens/s those round times give
 * at Qwen3.8-27B's published MTP acceptance lengths (random weights cannot show real acceptance).
 * Each is timed with the logits copied to the host and with only the greedy ids chosen on the device
 * (engine.h: the _ids forms; what tandem-run's decode and rounds copy now). Every figure is a host
 * clock around engine calls that synchronise before they return. */
#include "cli.h"
#include "engine.h"
#include "err.h"
#include "jsonfile.h"
#include "model.h"
#include "settings.h"
#include "spec.h"
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *prog = "tandem-benchround";

#define ROWS TDM_ENGINE_MAX_ROWS
#define MAXN TDM_SPEC_MAX_NODES
_Static_assert(MAXN <= ROWS, "a tree of the rounds' size must fit one verify");
/* Untimed rounds before each series: the first runs eager, the second captures every shape's graph
 * (engine.c's run_pass), so the timed rounds replay graphs. */
#define WARMUP 2
#define MAX_SERIES 64
#define DEFAULT_ROWS "1,2,4,8,16,24,32"
static const char *const default_trees[] = {"3,2,1", "2,2,2,2", "8,3"};
/* Qwen3.8-27B's published MTP acceptance: tokens per round with 1, 2, 3, 4 draft tokens. */
#define MAX_DRAFTS 4
static const double accept_len[MAX_DRAFTS] = {1.90, 2.68, 3.28, 3.79};
/* The targets on Qwen3.8-27B: a 16-row round <= 1.15 steps, a 32-row round <= 1.35 steps, and
 * more than 2.5x plain decode's tokens/s at the acceptance lengths above. */
static const struct { int rows; double max; } row_target[] = {{16, 1.15}, {32, 1.35}};
#define SPEEDUP_TARGET 2.5

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tandem-benchround -m DIR [--ctx N] [--prompt N] [--reps N] [--rows LIST] [--tree SPEC...]\n"
            "                         [--json FILE]\n"
            "Speculative round time on the CUDA engine (device 0) against a one-row decode step.\n"
            "\n"
            "  -m, --model DIR    checkpoint directory (the engine's layouts and formats, as tandem-run's)\n"
            "      --ctx N        context capacity in tokens (default 4096; graphed attention sizes its grid\n"
            "                     by it and skips the positions not reached)\n"
            "      --prompt N     synthetic prompt tokens, prefilled before every series (default 512)\n"
            "      --reps N       timed repeats per figure, after %d untimed warm-ups (default 20)\n"
            "      --rows LIST    chain verify row counts, comma-separated, each 1..%d (default %s)\n"
            "      --tree SPEC    a tree round's branching per depth as tandem-run --tree spells it (3,2,1),\n"
            "                     cut at %d nodes with the root, depth-first; repeat for several; 'none'\n"
            "                     for no trees (default:",
            WARMUP, ROWS, DEFAULT_ROWS, MAXN);
    for (size_t i = 0; i < sizeof default_trees / sizeof *default_trees; i++) fprintf(f, " %s", default_trees[i]);
    fprintf(f,
            ")\n"
            "      --json FILE    write every figure as JSON (atomically)\n"
            "  -h, --help         this text\n"
            "\n"
            "Each series starts from the same state: tdm_engine_reset, then the prompt (ids (i*7919+13) mod\n"
            "vocab) prefilled %d tokens a call, each call's rows fed to the MTP drafter when the series\n"
            "uses it. Then %d untimed rounds (the first eager, the second captures the shape's CUDA graphs)\n"
            "and --reps timed ones; medians (and minima) in ms of a host clock around the engine calls, which\n"
            "synchronise before they return. One line a series on stdout:\n"
            "  step   the graphed decode step: tdm_engine_forward of one token with its logits (the engine\n"
            "         replays the step's graph for a one-token forward with logits or greedy ids), so the\n"
            "         time includes the head and the copy of one logits row to the host; each rep then\n"
            "         runs a second step with only its greedy id copied (tdm_engine_forward_ids, as\n"
            "         tandem-run's plain decode runs now): round_ids. Run first, and again last (shape\n"
            "         'again': how far the device drifted over the run; deferred (TANDEM_GDN_DEFER), the\n"
            "         graphed step after the rounds also holds the pending rows' launches, one a GDN layer\n"
            "         over 0 rows after the reset, which no pass runs before an engine's first deferred\n"
            "         commit); a rep advances two positions.\n"
            "  chain  R rows a round: tdm_engine_verify of R rows with every row's logits copied to the\n"
            "         host (as the rounds of tandem-run --spec did before the ids came from the device),\n"
            "         then tdm_engine_commit of all R rows (every draft accepted: the largest commit).\n"
            "         verify1: the same verify with only the last row's logits copied; verify_ids: with\n"
            "         only the rows' greedy ids copied (tdm_engine_verify_ids, what the rounds of\n"
            "         tandem-run --spec copy now). Each variant runs in a round of its own, right after\n"
            "         the previous round's commit (a deferred commit, TANDEM_GDN_DEFER, leaves its rows\n"
            "         to the next verify, which applies them: every variant's time includes that), so a\n"
            "         rep is three rounds and a series spans (warm-ups + reps) x 3 x R positions after\n"
            "         the prompt. round = verify + commit, round1 = verify1 + commit, round_ids =\n"
            "         verify_ids + commit, each with its round's commit; x_step, x_step1: their medians\n"
            "         over the step's, x_step_ids: round_ids over the ids-only step's.\n"
            "  tree   the same with tdm_engine_verify_tree of the SPEC tree and tdm_engine_commit_path of\n"
            "         the path to its last node of the greatest depth (a gather unless the path is the\n"
            "         first children).\n"
            "  spec   k = 1..%d drafts: a chain round of k + 1 rows committed whole, then the MTP drafter\n"
            "         as tandem-run --spec mtp runs it after a commit (tdm_engine_mtp: the k + 1 committed\n"
            "         rows, then k drafts chained on the device), its drafts the next round's rows;\n"
            "         round = draft + verify + commit, round_ids = draft + verify_ids + commit (MB_read\n"
            "         leaves the drafter's reads out). Without an MTP layer the engine runs, no drafter\n"
            "         (draft_ms '-'; stderr and the JSON say why).\n"
            "rows: verify rows (tree nodes); commit: rows committed; experts: the routed experts a MoE\n"
            "layer's rows touch, expected under uniform routing / at most min(E, R top_k); MB_read: the\n"
            "projection weights read (MoE: those experts, expected), the K/V rows read, and the GDN state\n"
            "bytes the engine counts over a round's verify and commit (tdm_engine_round_bytes: a chain\n"
            "verify reads each state once, a tree verify more; replayed (TANDEM_GDN_DEFER=off), a commit\n"
            "reads and writes it; deferred, the verify after a commit writes it once and the commit\n"
            "moves none; the step reads and writes it); GB/s: MB_read over the median round. stderr and\n"
            "the JSON (\"gdn_commit\") say which commit the engine runs.\n"
            "\n"
            "A second table gives the tokens/s of the spec rounds at Qwen3.8-27B's published MTP acceptance\n"
            "lengths (",
            ROWS, WARMUP, MAX_DRAFTS);
    for (int k = 0; k < MAX_DRAFTS; k++) fprintf(f, "%s%.2f", k ? ", " : "", accept_len[k]);
    fprintf(f,
            " tokens a round for 1..%d drafts; random weights cannot\n"
            "show real acceptance): tokens a round / round time, and the speedup over plain decode (1 /\n"
            "step); the JSON adds the same from round_ids and the ids-only step. Host-side acceptance\n"
            "(walking the ids, or the argmax over copied rows) is not in the times. The\n"
            "targets for Qwen3.8-27B, met or not on stderr and in the JSON:\n",
            MAX_DRAFTS);
    for (size_t i = 0; i < sizeof row_target / sizeof *row_target; i++)
        fprintf(f, "  a %d-row chain round at most %.2fx the step\n", row_target[i].rows, row_target[i].max);
    fprintf(f,
            "  more than %.1fx plain decode's tokens/s at the best of those acceptance lengths\n"
            "\n"
            "Exit status: 0 done, 1 a CUDA call failed, 2 bad usage or bad input (one line naming the\n"
            "file and the fault; also: no CUDA device, a layout the engine does not serve, out of device\n"
            "memory, a context too small for the series).\n",
            SPEEDUP_TARGET);
}

static int32_t synth_id(long i, int V) { return (int32_t)((i * 7919 + 13) % V); }

/* median and minimum of n > 0 times (sorts v) */
struct fig { double med, min; };
static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static struct fig fig_of(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return (struct fig){n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]), v[0]};
}

enum kind { K_STEP, K_CHAIN, K_TREE, K_SPEC };
static const char *const kind_names[] = {"step", "chain", "tree", "spec"};

struct series {
    enum kind kind;
    char shape[96];
    int rows;                       /* verify rows (tree nodes); 1 for the step */
    int parent[MAXN];               /* a tree's; a chain's r - 1 */
    int path[MAXN], len;            /* the committed path */
    int drafts, drafter;            /* spec: k, and whether the MTP drafter runs */
    /* measured */
    struct fig draft, verify, verify1, commit, round, round1;
    struct fig ids, round_ids;      /* verify with greedy ids only, and its round; the step: an ids-only step */
    int pos_first, pos_last;        /* the timed rounds' root positions */
    double state_bytes;             /* GDN state bytes per round (verify + commit, the engine's count) */
    struct tdm_pass_bytes pass;     /* weights and K/V at the middle position */
};

struct bench {
    const struct tdm_model *m;
    struct tdm_engine *e;
    int V, n_prompt, reps;
    double prefill_ms;              /* the last restart's prompt */
    int32_t *prompt;                /* [n_prompt + 1]: the last is the token after the prompt */
    float *logits;                  /* [ROWS][V] */
    int32_t gid[ROWS];              /* greedy ids of the ids-only calls */
    double *t[8];                   /* [reps] per figure */
};

/* Engine calls after set-up fail only when a CUDA call did (the inputs were checked): exit 1. */
static void check(int rc)
{
    if (rc != 0) tdm_die_check(prog);
}

/* The state every series starts from: reset, the prompt ROWS tokens a call (each call's rows fed
 * to the drafter when it runs: tdm_engine_mtp takes at most ROWS real rows). */
static void restart(struct bench *b, int drafter)
{
    const double t0 = tdm_now_ms();
    check(tdm_engine_reset(b->e));
    for (int at = 0; at < b->n_prompt; at += ROWS) {
        const int T = b->n_prompt - at < ROWS ? b->n_prompt - at : ROWS;
        check(tdm_engine_prefill(b->e, b->prompt + at, T, T, NULL));
        if (drafter) check(tdm_engine_mtp(b->e, at, b->prompt + at + 1, T, 0, NULL, NULL));
    }
    b->prefill_ms = tdm_now_ms() - t0;
}

static double state_moved(const struct tdm_engine_round_bytes *a, const struct tdm_engine_round_bytes *z)
{
    return (double)(z->state_read - a->state_read) + (double)(z->state_written - a->state_written);
}

static void run_step(struct bench *b, struct series *s)
{
    restart(b, 0);
    const int n = WARMUP + b->reps;
    for (int rep = 0; rep < n; rep++) {
        const int pos = tdm_engine_pos(b->e);
        const int32_t tok = synth_id(pos, b->V);
        if (rep == WARMUP) s->pos_first = pos;
        s->pos_last = pos;
        const double t0 = tdm_now_ms();
        check(tdm_engine_forward(b->e, &tok, 1, 0, b->logits));
        const double t1 = tdm_now_ms();
        const int32_t tok2 = synth_id(pos + 1, b->V);
        check(tdm_engine_forward_ids(b->e, &tok2, 1, 0, NULL, b->gid));
        const double t2 = tdm_now_ms();
        if (rep >= WARMUP) {
            b->t[0][rep - WARMUP] = t1 - t0;
            b->t[6][rep - WARMUP] = t2 - t1;
        }
    }
    s->round = fig_of(b->t[0], b->reps);
    s->ids = s->round_ids = fig_of(b->t[6], b->reps);
    s->pass = tdm_model_pass_bytes(b->m, (s->pos_first + s->pos_last) / 2, 1);
    s->state_bytes = (double)tdm_model_step_bytes(b->m, 0).gdn_state; /* every state read and written */
}

/* A round series. Each rep is three rounds, one per verify variant — every row's logits, the last
 * row's, the greedy ids only — each with its own commit (the path) and, spec, then the drafter on
 * the committed rows, its drafts the next round's rows. Separate rounds because a deferred commit
 * (TANDEM_GDN_DEFER) leaves its rows to the next verify, which applies them inside its GDN
 * kernels: each variant's verify must be the one right after a commit for its time to include
 * that. The GDN state bytes are those of the first round (verify + commit). */
static void run_rounds(struct bench *b, struct series *s)
{
    struct tdm_engine *e = b->e;
    const int R = s->rows, tree = s->kind == K_TREE, n = WARMUP + b->reps;
    int32_t ids[MAXN], next[MAXN], drafts[MAXN];
    for (int r = 0; r < R; r++) ids[r] = synth_id(1000 + r, b->V);
    restart(b, s->drafter);
    double state = 0.0;
    for (int rep = 0; rep < n; rep++) {
        double tv[3], tc[3], td[3];
        for (int v = 0; v < 3; v++) {
            const int root = tdm_engine_pos(e);
            if (rep == WARMUP && v == 0) s->pos_first = root;
            s->pos_last = root;
            const struct tdm_engine_round_bytes b0 = *tdm_engine_round_bytes(e);
            const int from = v == 1 ? R - 1 : 0;
            float *lg = v == 2 ? NULL : b->logits;
            int32_t *gid = v == 2 ? b->gid : NULL;
            const double t0 = tdm_now_ms();
            check(tree ? tdm_engine_verify_tree_ids(e, ids, s->parent, R, from, lg, gid)
                       : tdm_engine_verify_ids(e, ids, R, from, lg, gid));
            const double t1 = tdm_now_ms();
            check(tdm_engine_commit_path(e, s->path, s->len));
            const double t2 = tdm_now_ms();
            if (v == 0 && rep >= WARMUP) state += state_moved(&b0, tdm_engine_round_bytes(e));
            /* the rows after the committed ones: the path's next tokens, then a bonus token */
            for (int j = 0; j < s->len; j++) next[j] = j + 1 < s->len ? ids[s->path[j + 1]] : synth_id(root + s->len, b->V);
            double t3 = t2;
            if (s->drafter) {
                check(tdm_engine_mtp(e, root, next, s->len, s->drafts, drafts, NULL));
                t3 = tdm_now_ms();
                ids[0] = next[s->len - 1];
                for (int j = 0; j < s->drafts; j++) ids[1 + j] = drafts[j];
            }
            tv[v] = t1 - t0;
            tc[v] = t2 - t1;
            td[v] = t3 - t2;
        }
        if (rep < WARMUP) continue;
        const int i = rep - WARMUP;
        b->t[0][i] = td[0];
        b->t[1][i] = tv[0];
        b->t[2][i] = tv[1];
        b->t[3][i] = tc[0];
        b->t[4][i] = td[0] + tv[0] + tc[0];
        b->t[5][i] = td[1] + tv[1] + tc[1];
        b->t[6][i] = tv[2];
        b->t[7][i] = td[2] + tv[2] + tc[2];
    }
    s->draft = fig_of(b->t[0], b->reps);
    s->verify = fig_of(b->t[1], b->reps);
    s->verify1 = fig_of(b->t[2], b->reps);
    s->commit = fig_of(b->t[3], b->reps);
    s->round = fig_of(b->t[4], b->reps);
    s->round1 = fig_of(b->t[5], b->reps);
    s->ids = fig_of(b->t[6], b->reps);
    s->round_ids = fig_of(b->t[7], b->reps);
    s->state_bytes = state / b->reps;
    s->pass = tdm_model_pass_bytes(b->m, (s->pos_first + s->pos_last) / 2, R);
}

/* Positions a series needs past the prompt: every round's commit, and the last round's verify
 * rows or drafter rows beyond its root. */
static long series_span(const struct series *s, int reps)
{
    /* a step rep: two steps; a round rep: three rounds (run_rounds) */
    const int adv = s->kind == K_STEP ? 2 : s->len, rounds = (WARMUP + reps) * (s->kind == K_STEP ? 1 : 3);
    int last = s->rows > adv ? s->rows : adv;
    if (s->drafter && s->len + s->drafts - 1 > last) last = s->len + s->drafts - 1;
    return (long)(rounds - 1) * adv + last;
}

static void chain_series(struct series *s, enum kind kind, int R)
{
    memset(s, 0, sizeof *s);
    s->kind = kind;
    s->rows = s->len = R;
    for (int r = 0; r < R; r++) {
        s->parent[r] = r - 1;
        s->path[r] = r;
    }
    snprintf(s->shape, sizeof s->shape, "%d", R);
}

/* The tree of spec; the committed path: the root to the last node of the greatest depth. Returns
 * -1 with tdm_err() for a bad spec. */
static int tree_series(struct series *s, const char *spec)
{
    struct tdm_spec_opts o;
    memset(&o, 0, sizeof o);
    if (tdm_spec_parse_tree(spec, &o) != 0) return -1;
    memset(s, 0, sizeof *s);
    s->kind = K_TREE;
    int depth[MAXN];
    s->rows = tdm_spec_tree_layout(&o, s->parent, depth);
    int deepest = 0;
    for (int t = 0; t < s->rows; t++)
        if (depth[t] >= depth[deepest]) deepest = t;
    s->len = depth[deepest] + 1;
    for (int x = deepest, j = s->len - 1; j >= 0; j--, x = s->parent[x]) s->path[j] = x;
    snprintf(s->shape, sizeof s->shape, "%s", spec);
    return 0;
}

/* ---- reports ---- */

static double total_bytes(const struct series *s) { return s->pass.weights_even + (double)s->pass.kv + s->state_bytes; }

static void print_row(const struct series *s, const struct series *step)
{
    char draft[16] = "-", ver[16] = "-", com[16] = "-", v1[16] = "-", r1[16] = "-", x1[16] = "-", ex[32] = "-", path[8];
    char vi[16] = "-";
    const double st = step->round.med;
    if (s->kind != K_STEP) {
        if (s->drafter) snprintf(draft, sizeof draft, "%.3f", s->draft.med);
        snprintf(ver, sizeof ver, "%.3f", s->verify.med);
        snprintf(com, sizeof com, "%.3f", s->commit.med);
        snprintf(v1, sizeof v1, "%.3f", s->verify1.med);
        snprintf(r1, sizeof r1, "%.3f", s->round1.med);
        snprintf(x1, sizeof x1, "%.3f", s->round1.med / st);
        snprintf(vi, sizeof vi, "%.3f", s->ids.med);
    }
    if (s->pass.experts_max > 0) snprintf(ex, sizeof ex, "%.1f/%.0f", s->pass.experts_even, s->pass.experts_max);
    snprintf(path, sizeof path, "%d", s->kind == K_STEP ? 1 : s->len);
    printf("%-5s %-8s %4d %6s %8s %9s %9s %9.3f %9.3f %7.3f %10s %9s %7s %11s %9.1f %7.0f %10s %9.3f %10.3f\n",
           kind_names[s->kind], s->shape, s->rows, path, draft, ver, com, s->round.med, s->round.min, s->round.med / st, v1,
           r1, x1, ex, total_bytes(s) / 1e6, total_bytes(s) / s->round.med / 1e6, vi, s->round_ids.med,
           s->round_ids.med / step->round_ids.med);
}

static json_t *fig_num(const struct fig *f, int have) { return have ? json_real(f->med) : json_null(); }

/* The bytes a step or round reads, and the rate they give over its median time. */
static void bytes_json(json_t *o, const struct series *s)
{
    const double tot = total_bytes(s);
    json_object_set_new(o, "bytes",
                        json_pack("{s:f, s:f, s:f, s:f, s:I, s:f, s:f, s:f}", "weights_even", s->pass.weights_even,
                                  "weights_max", s->pass.weights_max, "experts_even", s->pass.experts_even,
                                  "experts_max", s->pass.experts_max, "kv", (json_int_t)s->pass.kv, "gdn_state",
                                  s->state_bytes, "total_even", tot,
                                  "total_max", s->pass.weights_max + (double)s->pass.kv + s->state_bytes));
    json_object_set_new(o, "gb_per_s", json_real(tot / s->round.med / 1e6));
}

static json_t *step_json(const struct series *s, int vocab)
{
    json_t *o = json_pack("{s:f, s:f, s:f, s:i, s:i, s:b, s:I, s:f, s:f, s:f}", "ms", s->round.med, "ms_min", s->round.min,
                          "tokens_per_s", 1e3 / s->round.med, "pos_first", s->pos_first, "pos_last", s->pos_last,
                          "includes_logits_copy", 1, "logits_bytes", (json_int_t)vocab * 4, "ids_ms", s->ids.med,
                          "ids_ms_min", s->ids.min, "ids_tokens_per_s", 1e3 / s->ids.med);
    bytes_json(o, s);
    return o;
}

static json_t *series_json(const struct series *s, const struct series *step)
{
    const double st = step->round.med;
    json_t *o = json_pack("{s:s, s:s, s:i, s:i, s:i, s:b, s:i, s:i}", "kind", kind_names[s->kind], "shape", s->shape,
                          "rows", s->rows, "committed", s->len, "drafts", s->drafts, "drafter", s->drafter,
                          "pos_first", s->pos_first, "pos_last", s->pos_last);
    json_object_set_new(o, "draft_ms", fig_num(&s->draft, s->drafter));
    json_object_set_new(o, "draft_ms_min", s->drafter ? json_real(s->draft.min) : json_null());
    json_object_set_new(o, "verify_ms", json_real(s->verify.med));
    json_object_set_new(o, "verify_ms_min", json_real(s->verify.min));
    json_object_set_new(o, "verify_last_row_logits_ms", json_real(s->verify1.med));
    json_object_set_new(o, "commit_ms", json_real(s->commit.med));
    json_object_set_new(o, "commit_ms_min", json_real(s->commit.min));
    json_object_set_new(o, "round_ms", json_real(s->round.med));
    json_object_set_new(o, "round_ms_min", json_real(s->round.min));
    json_object_set_new(o, "x_step", json_real(s->round.med / st));
    json_object_set_new(o, "round_last_row_logits_ms", json_real(s->round1.med));
    json_object_set_new(o, "x_step_last_row_logits", json_real(s->round1.med / st));
    json_object_set_new(o, "verify_ids_ms", json_real(s->ids.med));
    json_object_set_new(o, "verify_ids_ms_min", json_real(s->ids.min));
    json_object_set_new(o, "round_ids_ms", json_real(s->round_ids.med));
    json_object_set_new(o, "x_step_ids", json_real(s->round_ids.med / step->round_ids.med));
    bytes_json(o, s);
    return o;
}

/* ---- options ---- */

static int parse_rows(const char *list, int *rows)
{
    const int n = tdm_parse_int_list(list, 1, ROWS, rows, ROWS);
    if (n < 1) {
        fprintf(stderr, "%s: --rows %s: expected row counts 1..%d separated by commas\n", prog, list, ROWS);
        exit(TDM_EXIT_USAGE);
    }
    return n;
}

int main(int argc, char **argv)
{
    const char *model_dir = NULL, *json_path = NULL, *rows_opt = DEFAULT_ROWS;
    const char *trees[MAX_SERIES];
    int ntrees = 0, no_trees = 0;
    long ctx = 4096, n_prompt = 512, reps = 20;
    static const struct option opts[] = {{"model", 1, 0, 'm'}, {"ctx", 1, 0, 'c'},  {"prompt", 1, 0, 'p'},
                                         {"reps", 1, 0, 'r'},  {"rows", 1, 0, 'R'}, {"tree", 1, 0, 'T'},
                                         {"json", 1, 0, 'j'},  {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    int o;
    while ((o = tdm_getopt(prog, argc, argv, "m:h", opts)) != -1) {
        switch (o) {
        case 'm': model_dir = optarg; break;
        case 'c': ctx = tdm_opt_long(prog, "--ctx", optarg, 1, 1 << 24); break;
        case 'p': n_prompt = tdm_opt_long(prog, "--prompt", optarg, 1, 1 << 24); break;
        case 'r': reps = tdm_opt_long(prog, "--reps", optarg, 1, 100000); break;
        case 'R': rows_opt = optarg; break;
        case 'T':
            if (strcmp(optarg, "none") == 0) no_trees = 1;
            else if (ntrees == 16) tdm_die_usage(prog, "--tree: at most 16 trees", optarg);
            else trees[ntrees++] = optarg;
            break;
        case 'j': json_path = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return TDM_EXIT_USAGE;
        }
    }
    if (optind < argc) tdm_die_usage(prog, "unexpected argument", argv[optind]);
    if (!model_dir) tdm_die_usage(prog, "-m DIR is required (see --help)", NULL);
    if (no_trees && ntrees) tdm_die_usage(prog, "--tree none and a tree do not go together", NULL);
    if (tdm_settings_check() != 0) tdm_die_input(prog);
    if (!ntrees && !no_trees)
        for (size_t i = 0; i < sizeof default_trees / sizeof *default_trees; i++) trees[ntrees++] = default_trees[i];
    int rows[ROWS];
    const int nrows = parse_rows(rows_opt, rows);

    /* the series, in the order they run */
    static struct series ser[MAX_SERIES];
    int ns = 0;
    struct series *step = &ser[ns++];
    memset(step, 0, sizeof *step);
    step->kind = K_STEP;
    step->rows = 1;
    snprintf(step->shape, sizeof step->shape, "1");
    for (int i = 0; i < nrows; i++) chain_series(&ser[ns++], K_CHAIN, rows[i]);
    for (int i = 0; i < ntrees; i++)
        if (tree_series(&ser[ns++], trees[i]) != 0) tdm_die_input(prog);
    struct series *spec = &ser[ns];
    for (int k = 1; k <= MAX_DRAFTS; k++) {
        struct series *s = &ser[ns++];
        chain_series(s, K_SPEC, k + 1);
        s->drafts = k;
    }
    struct series *step_end = &ser[ns++]; /* the step again: how far the device drifted over the run (deferred:
                                             * with the pending launches, which the first step has not) */
    *step_end = *step;
    snprintf(step_end->shape, sizeof step_end->shape, "again");

    struct tdm_model *m = tdm_model_load(model_dir);
    if (!m) tdm_die_input(prog);
    const struct tdm_config *c = &m->cfg;
    /* the drafter: the model's MTP layer when the engine runs it */
    char mtp_note[512], how[96];
    int mtp = 0;
    if (!m->has_mtp) snprintf(mtp_note, sizeof mtp_note, "the checkpoint has no MTP layer: the spec rounds run without a drafter");
    else if (tdm_engine_mtp_supported(m) != 0)
        snprintf(mtp_note, sizeof mtp_note, "the engine does not run this MTP layer (%s): the spec rounds run without a drafter",
                 tdm_err());
    else {
        mtp = 1;
        snprintf(mtp_note, sizeof mtp_note,
                 "the MTP layer drafts on the engine (tdm_engine_mtp, %s; its projections and head %s: %.1f MB a draft token, "
                 "%.1f MB as stored)",
                 strcmp(tdm_setting("TANDEM_CUDA_GRAPH"), "off") != 0 ? "a CUDA graph per call shape" : "eager launches",
                 tdm_model_draft_how(m, how, sizeof how),
                 m->mtp.draft_bytes_now / 1e6, m->mtp.draft_bytes / 1e6);
    }
    for (struct series *s = spec; s < step_end; s++) {
        s->drafter = mtp;
        snprintf(s->shape, sizeof s->shape, "k=%d", s->drafts);
    }
    long need = 0;
    for (int i = 0; i < ns; i++) {
        const long sp = n_prompt + series_span(&ser[i], (int)reps);
        if (sp > need) need = sp;
    }
    if (need > ctx) {
        fprintf(stderr, "%s: --ctx %ld: the prompt (%ld tokens) and %ld reps of the largest series (a rep: three rounds) "
                "need %ld positions\n",
                prog, ctx, n_prompt, WARMUP + reps, need);
        tdm_model_free(m);
        return TDM_EXIT_USAGE;
    }
    fprintf(stderr, "# model %s: %s, %d layers, hidden %d, vocab %d%s\n", model_dir, tdm_arch_name(c->arch), c->n_layers,
            c->hidden, c->vocab, m->has_mtp ? ", MTP layer" : "");
    struct tdm_engine *e = tdm_engine_new(m, (int)ctx);
    if (!e) tdm_die_input(prog);
    if (mtp && tdm_engine_mtp_init(e) != 0) tdm_die_input(prog);
    fprintf(stderr, "# drafter: %s\n", mtp_note);
    const int deferred = tdm_engine_gdn_defer(e);
    const char *gdn_commit = deferred ? "deferred" : "replayed";
    fprintf(stderr, "# GDN commit: %s (TANDEM_GDN_DEFER=%s): %s\n", gdn_commit, tdm_setting("TANDEM_GDN_DEFER"),
            deferred ? "the commit records the rows, the next verify applies them as it loads each state"
                     : "the commit replays the rows through the conv and recurrence");

    struct bench b = {.m = m, .e = e, .V = c->vocab, .n_prompt = (int)n_prompt, .reps = (int)reps};
    b.prompt = malloc((size_t)(n_prompt + 1) * sizeof(int32_t));
    b.logits = malloc((size_t)ROWS * c->vocab * sizeof(float));
    int nomem = !b.prompt || !b.logits;
    for (int i = 0; i < 8; i++) nomem |= !(b.t[i] = malloc((size_t)reps * sizeof(double)));
    if (nomem) {
        fprintf(stderr, "%s: out of memory\n", prog);
        return TDM_EXIT_CHECK;
    }
    for (long i = 0; i <= n_prompt; i++) b.prompt[i] = synth_id(i, c->vocab);
    fprintf(stderr, "# the step includes the head and the copy of one logits row (%.0f kB) to the host; verify copies "
            "every row's (verify1: the last row's); the ids-only step and verify_ids copy 4 bytes a row (greedy ids "
            "chosen on the device); CUDA graphs %s\n", c->vocab * 4.0 / 1e3, tdm_setting("TANDEM_CUDA_GRAPH"));
    for (int i = 0; i < ns; i++) {
        if (ser[i].kind == K_STEP) run_step(&b, &ser[i]);
        else run_rounds(&b, &ser[i]);
        if (i == 0)
            fprintf(stderr, "# prompt: %ld tokens prefilled in %.1f ms (reset, %d tokens a call), before every series\n",
                    n_prompt, b.prefill_ms, ROWS);
        fprintf(stderr, "# %s %s: %.3f ms a %s\n", kind_names[ser[i].kind], ser[i].shape, ser[i].round.med,
                ser[i].kind == K_STEP ? "step" : "round");
    }

    printf("%-5s %-8s %4s %6s %8s %9s %9s %9s %9s %7s %10s %9s %7s %11s %9s %7s %10s %9s %10s\n", "kind", "shape", "rows",
           "commit", "draft_ms", "verify_ms", "commit_ms", "round_ms", "min_ms", "x_step", "verify1_ms", "round1_ms",
           "x_step1", "experts", "MB_read", "GB/s", "verify_ids", "round_ids", "x_step_ids");
    for (int i = 0; i < ns; i++) print_row(&ser[i], step);

    /* the tokens/s at the published acceptance lengths */
    const double plain = 1e3 / step->round.med, plain_ids = 1e3 / step->round_ids.med;
    double best = 0.0, best_ids = 0.0;
    json_t *acc = json_array();
    printf("\n%-6s %16s %8s %9s %9s %9s %12s %18s %7s\n", "drafts", "tokens_per_round", "draft_ms", "verify_ms",
           "commit_ms", "round_ms", "tokens_per_s", "plain_tokens_per_s", "speedup");
    for (int k = 1; k <= MAX_DRAFTS; k++) {
        const struct series *s = &spec[k - 1];
        const double L = accept_len[k - 1], tps = L * 1e3 / s->round.med, up = tps / plain;
        if (up > best) best = up;
        char draft[16] = "-";
        if (s->drafter) snprintf(draft, sizeof draft, "%.3f", s->draft.med);
        printf("%-6d %16.2f %8s %9.3f %9.3f %9.3f %12.1f %18.1f %7.3f\n", k, L, draft, s->verify.med, s->commit.med,
               s->round.med, tps, plain, up);
        const double tps_ids = L * 1e3 / s->round_ids.med, up_ids = tps_ids / plain_ids;
        if (up_ids > best_ids) best_ids = up_ids;
        json_t *a = json_pack("{s:i, s:f, s:o, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}", "drafts", k,
                              "tokens_per_round", L, "draft_ms", fig_num(&s->draft, s->drafter), "verify_ms", s->verify.med,
                              "commit_ms", s->commit.med, "round_ms", s->round.med, "tokens_per_s", tps,
                              "plain_tokens_per_s", plain, "speedup", up, "round_ids_ms", s->round_ids.med,
                              "ids_tokens_per_s", tps_ids, "ids_plain_tokens_per_s", plain_ids, "ids_speedup", up_ids);
        json_array_append_new(acc, a);
    }

    /* the targets (stated for Qwen3.8-27B in NVFP4) */
    json_t *tg = json_object();
    for (size_t i = 0; i < sizeof row_target / sizeof *row_target; i++) {
        const struct series *s = NULL;
        for (int j = 0; j < ns; j++)
            if (ser[j].kind == K_CHAIN && ser[j].rows == row_target[i].rows) s = &ser[j];
        char key[32];
        snprintf(key, sizeof key, "round%d", row_target[i].rows);
        if (!s) {
            fprintf(stderr, "# target: a %d-row round: not measured (--rows)\n", row_target[i].rows);
            json_object_set_new(tg, key, json_null());
            continue;
        }
        const double x = s->round.med / step->round.med, x1 = s->round1.med / step->round.med;
        const double xi = s->round_ids.med / step->round_ids.med;
        fprintf(stderr, "# target: a %d-row round is %.3fx a step (%.3fx with the last row's logits only; with greedy ids "
                "only %.3fx the ids-only step), at most %.2fx: %s\n", row_target[i].rows, x, x1, xi, row_target[i].max,
                x <= row_target[i].max ? "met" : "not met");
        json_object_set_new(tg, key, json_pack("{s:f, s:f, s:f, s:f, s:b}", "x_step", x, "x_step_last_row_logits", x1,
                                               "x_step_ids", xi, "max", row_target[i].max, "met", x <= row_target[i].max));
    }
    fprintf(stderr, "# target: the best speedup at the published acceptance lengths is %.3fx plain decode%s, more than "
            "%.1fx: %s\n", best, mtp ? "" : " (no drafter time: the model has no MTP layer the engine runs)", SPEEDUP_TARGET,
            best > SPEEDUP_TARGET ? "met" : "not met");
    fprintf(stderr, "# the same with greedy ids only (rounds and plain decode copying ids, not logits): %.3fx\n", best_ids);
    json_object_set_new(tg, "speedup", json_pack("{s:f, s:f, s:b, s:b, s:f}", "best", best, "min", SPEEDUP_TARGET, "met",
                                                 best > SPEEDUP_TARGET, "drafter_timed", mtp, "best_ids", best_ids));

    int rc = TDM_EXIT_OK;
    if (json_path) {
        json_t *chain = json_array(), *tree = json_array(), *sp = json_array();
        for (int i = 1; i < ns - 1; i++)
            json_array_append_new(ser[i].kind == K_CHAIN ? chain : ser[i].kind == K_TREE ? tree : sp,
                                  series_json(&ser[i], step));
        json_t *st = step_json(step, c->vocab);
        json_t *rec = json_pack("{s:s, s:s, s:i, s:i, s:i, s:s, s:s, s:i, s:i, s:i, s:i, s:{s:b, s:b, s:s}, s:o, s:o, s:o, s:o, "
                                "s:o, s:o, s:o}",
                                "model", model_dir, "arch", tdm_arch_name(c->arch), "layers", c->n_layers, "vocab",
                                c->vocab, "experts", c->n_experts, "graphs", tdm_setting("TANDEM_CUDA_GRAPH"),
                                "gdn_commit", gdn_commit, "ctx", (int)ctx, "prompt_tokens", (int)n_prompt, "reps",
                                (int)reps, "warmup", WARMUP, "mtp",
                                "present", m->has_mtp, "timed", mtp, "note", mtp_note, "step", st, "chain", chain, "tree",
                                tree, "spec", sp, "step_again", step_json(step_end, c->vocab), "acceptance", acc, "targets", tg);
        if (tdm_json_write_atomic(json_path, rec, JSON_INDENT(2) | JSON_PRESERVE_ORDER) != 0) {
            fprintf(stderr, "%s: %s\n", prog, tdm_err());
            rc = TDM_EXIT_USAGE;
        }
        json_decref(rec);
    } else {
        json_decref(acc);
        json_decref(tg);
    }
    for (int i = 0; i < 8; i++) free(b.t[i]);
    free(b.prompt);
    free(b.logits);
    tdm_engine_free(e);
    tdm_model_free(m);
    return rc;
}
