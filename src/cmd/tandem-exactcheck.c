/* tandem-exactcheck — the exactness gate on the CPU reference or the CUDA engine: (a) verify twins:
 * the forward over M rows, a chain verify of M rows, and a verify whose first half is committed
 * followed by a step, against M one-token steps, logits bit for bit, M = 2..32, rows sharing
 * inputs; on the CUDA engine also a tree verify of M nodes (each node against the one-token steps
 * along its path) and a tree path's commit followed by a step; (b) speculative output (chain and
 * tree, each applicable drafter) against
 * one-token-at-a-time output, with the near-tie exception measured and reported; (c) graphed
 * against eager: on the CUDA engine every case of (b) with TANDEM_CUDA_GRAPH on and off, bit for
 * bit, and again without logits (the greedy ids path: the tokens of the run with logits); not
 * applicable on the CPU, said so. On the engine (a)'s passes also return their rows' greedy ids
 * chosen on the device (engine.h: the _ids forms), each checked against the host tdm_argmax of the
 * logits the same pass returned. */
#include "backend.h"
#include "engine.h"
#include "err.h"
#include "jsonfile.h"
#include "model.h"
#include "ref.h"
#include "settings.h"
#include "spec.h"
#include "tokens.h"
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *prog = "tandem-exactcheck";
#define DEFAULT_TIE 0.0625
#define DEFAULT_TREE "3,2,1"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tandem-exactcheck -m DIR -p FILE -n N [options]\n"
            "The exactness gate (design.md), on the CPU reference or the CUDA engine (--backend):\n"
            " (a) verify twins: the forward over M rows, and a chain verify of M rows, give each row the\n"
            "     logits bits of M one-token steps, M = 2..--rows, rows sharing inputs (each id twice); and\n"
            "     after a verify of M rows whose first j = (M+1)/2 are committed, a step on row j gives that\n"
            "     row's one-token bits (the commit left the state of j one-token steps); on cuda also a tree\n"
            "     verify of M nodes (a fixed depth-first tree: chains, siblings, back-ups by three levels)\n"
            "     gives each node the logits bits of one-token steps along its root-to-node path, and after\n"
            "     the commit of the last node's path a step gives the one-token bits; on cuda every row's\n"
            "     greedy id chosen on the device equals the host argmax of the logits returned with it;\n"
            " (b) speculative output against one-token-at-a-time output over N new tokens, for the chain and\n"
            "     the tree of each applicable drafter (mtp when the model has an MTP layer, ngram, draft with\n"
            "     --draft-model): the tokens must be identical, except a first divergence at a near tie: on\n"
            "     the one-token path's logits there, the best logit minus the speculative token's logit (the\n"
            "     gap the flip crossed) is below --tie-margin. Each such case is counted and reported with\n"
            "     that gap and the top-1 minus top-2 margin. A chain\n"
            "     must also give every row's logits bit for bit (it replays one-token decode's arithmetic),\n"
            "     and on cuda so must a tree (its kernels repeat that arithmetic along each path); on the\n"
            "     cpu a tree is the factored form (speculative.md) and reports its largest logit difference.\n"
            "     On the CUDA engine (b) runs chains and trees with every drafter (an mtp tree's nodes\n"
            "     drafted on the engine, the CPU's drafts up to MTP near ties: the tokens and logits are\n"
            "     the verify's in any case), with TANDEM_CUDA_GRAPH=on (the verify rounds and the MTP\n"
            "     drafter's calls from CUDA graphs);\n"
            " (c) graphed against eager runs: on cuda, the one-token run and every case of (b) again with\n"
            "     TANDEM_CUDA_GRAPH=off, tokens and logits bit for bit; and each of them, graphed and eager,\n"
            "     without logits (the greedy ids path: ids chosen on the device, no logits copied) gives\n"
            "     the tokens of the run with logits; not applicable on the cpu backend.\n"
            "\n"
            "  -m, --model DIR        checkpoint directory\n"
            "  -p, --prompt FILE      prompt token file (at least one token)\n"
            "  -n, --new-tokens N     tokens to generate per case (default 32)\n"
            "      --spec LIST        drafters to check, comma-separated from mtp,ngram,draft, or all\n"
            "                         (default all: mtp when the model has one, ngram, draft when given)\n"
            "      --draft N          chain draft tokens per round (default %d)\n"
            "      --tree SPEC        the tree's branching per depth (default %s)\n"
            "      --draft-model DIR  a draft model of the same vocabulary (adds the draft cases)\n"
            "      --tie-margin X     near-tie threshold in logits (default %g = 1/16). The factored tree\n"
            "                         form reorders FP32 sums over the GDN state; once a GDN output lands\n"
            "                         on the other side of a BF16 rounding (relative step 2^-8) the change\n"
            "                         reaches the logits. Measured on tiny synthetic models over 120\n"
            "                         tokens: the largest difference anywhere in a row is 0.05 to 0.21,\n"
            "                         and the flips seen crossed gaps of 0.003 to 0.016. 1/16 excuses\n"
            "                         those; a swap across a wider gap is reported as a failure to be\n"
            "                         looked at (it can happen: the row differences allow it), not excused\n"
            "      --rows M           largest twin row count, 2..32 (default 32)\n"
            "      --backend cpu|cuda backend (default cpu; cuda: the CUDA engine on device 0, for the\n"
            "                         layouts tandem-run --help lists, the draft model too; exit 2\n"
            "                         without a device)\n"
            "      --json FILE        JSON report: every case, its verdict, counts and margins\n"
            "  -h, --help             this text\n"
            "Exit status: 0 all identical or near ties only (reported), 1 a difference (or a CUDA call\n"
            "failed), 2 bad usage or input (one line naming the file and fault).\n",
            TDM_SPEC_DEFAULT_DRAFT, DEFAULT_TREE, DEFAULT_TIE);
}

static int row_bits_equal(const float *a, const float *b, int V) { return memcmp(a, b, (size_t)V * sizeof(float)) == 0; }

static float max_abs_diff(const float *a, const float *b, int V)
{
    float m = 0.0f;
    for (int i = 0; i < V; i++) m = fmaxf(m, fabsf(a[i] - b[i]));
    return m;
}

static int failures, near_ties;
/* (a) on the engine: rows whose greedy id came from the device, and those differing from the host
 * argmax of the logits the same pass returned */
static long id_rows, id_differ;

/* The model under (a), on either backend: the state after the prompt is a snapshot on the CPU, a
 * reset and the prompt again on the engine (the same bits every time: the engine is deterministic). */
struct twin_model {
    struct tdm_ref *r;
    struct tdm_ref_snap *snap;
    struct tdm_engine *e;
    const int32_t *prompt;
    int n_prompt, V;
};

/* A failed call: on the engine a CUDA failure (exit 1), on the CPU bad input (exit 2). */
__attribute__((noreturn)) static void twin_failed(const struct twin_model *t)
{
    if (t->e) tdm_die_check(prog);
    tdm_die_input(prog);
}
static void twin_restart(struct twin_model *t)
{
    int rc = t->e ? tdm_engine_reset(t->e) || tdm_engine_forward(t->e, t->prompt, t->n_prompt, t->n_prompt, NULL)
                  : tdm_ref_snap_load(t->r, t->snap);
    if (rc != 0) twin_failed(t);
}
/* The device's greedy ids of M rows against the host argmax of their logits (counted). */
static void check_ids(const int32_t *gid, const float *logits, int M, int V)
{
    for (int i = 0; i < M; i++) id_differ += gid[i] != tdm_argmax(logits + (size_t)i * V, V);
    id_rows += M;
}
static void twin_forward(struct twin_model *t, const int32_t *ids, int M, float *logits)
{
    int32_t gid[TDM_SPEC_MAX_NODES];
    if ((t->e ? tdm_engine_forward_ids(t->e, ids, M, 0, logits, gid) : tdm_ref_forward(t->r, ids, M, 0, logits, NULL, NULL)) != 0)
        twin_failed(t);
    if (t->e) check_ids(gid, logits, M, t->V);
}
static void twin_verify(struct twin_model *t, const int32_t *ids, int M, float *logits)
{
    int parent[TDM_SPEC_MAX_NODES];
    int32_t gid[TDM_SPEC_MAX_NODES];
    for (int i = 0; i < M; i++) parent[i] = i - 1;
    if ((t->e ? tdm_engine_verify_ids(t->e, ids, M, 0, logits, gid) : tdm_ref_verify(t->r, ids, parent, M, 0, logits, NULL)) != 0)
        twin_failed(t);
    if (t->e) check_ids(gid, logits, M, t->V);
}
static void twin_commit(struct twin_model *t, int j)
{
    int path[TDM_SPEC_MAX_NODES];
    for (int i = 0; i < j; i++) path[i] = i;
    if ((t->e ? tdm_engine_commit(t->e, j) : tdm_ref_commit(t->r, path, j)) != 0) twin_failed(t);
}

/* The twins' tree of M nodes, depth-first: node t's parent is on node t - 1's path — its child
 * (a chain), or one level up (a sibling) when t % 3 == 0, or three levels up when t % 5 == 0. */
static void twin_tree(int M, int *parent, int *depth)
{
    int path[TDM_SPEC_MAX_NODES];
    parent[0] = -1;
    depth[0] = 0;
    path[0] = 0;
    for (int t = 1; t < M; t++) {
        const int back = t % 5 == 0 ? 3 : t % 3 == 0 ? 1 : 0;
        const int a = depth[t - 1] - back > 0 ? depth[t - 1] - back : 0;
        parent[t] = path[a];
        depth[t] = a + 1;
        path[a + 1] = t;
    }
}
/* Node t's path, root first; returns its length. */
static int twin_path(const int *parent, int t, int *path)
{
    int n = 0;
    for (int x = t; x >= 0; x = parent[x]) n++;
    for (int x = t, i = n - 1; i >= 0; i--, x = parent[x]) path[i] = x;
    return n;
}

/* On the engine: a tree verify of M nodes against one-token steps along every path (each leaf's
 * path fed one token at a time from the state after the prompt); kind 1: then the commit of node
 * M - 1's path and a step on ids[0], against the one-token steps over that path and ids[0]. Returns
 * the rows that differ. */
static int twin_tree_check(struct twin_model *t, const int32_t *ids, int M, int kind, float *many, float *one, int V)
{
    int parent[TDM_SPEC_MAX_NODES], depth[TDM_SPEC_MAX_NODES], path[TDM_SPEC_MAX_NODES];
    twin_tree(M, parent, depth);
    twin_restart(t);
    int32_t gid[TDM_SPEC_MAX_NODES];
    if (tdm_engine_verify_tree_ids(t->e, ids, parent, M, 0, many, gid) != 0) twin_failed(t);
    check_ids(gid, many, M, V);
    int bad = 0;
    if (kind == 0) {
        for (int leaf = 0; leaf < M; leaf++) {
            if (leaf + 1 < M && parent[leaf + 1] == leaf) continue; /* not a leaf */
            const int n = twin_path(parent, leaf, path);
            twin_restart(t);
            for (int i = 0; i < n; i++) {
                twin_forward(t, ids + path[i], 1, one);
                bad += !row_bits_equal(many + (size_t)path[i] * V, one, V);
            }
        }
        return bad;
    }
    const int n = twin_path(parent, M - 1, path);
    if (tdm_engine_commit_path(t->e, path, n) != 0) twin_failed(t);
    twin_forward(t, ids, 1, many);
    twin_restart(t);
    for (int i = 0; i < n; i++) twin_forward(t, ids + path[i], 1, one);
    twin_forward(t, ids, 1, one);
    return !row_bits_equal(many, one, V);
}

/* (a): M rows in one call against M one-token steps, from the state after the prompt. */
static json_t *check_twins(const struct tdm_model *m, enum tdm_backend backend, const int32_t *prompt, int n_prompt,
                           int rows_max)
{
    const int V = m->cfg.vocab, ctx = n_prompt + 2 * rows_max + 2;
    struct twin_model t = {.prompt = prompt, .n_prompt = n_prompt, .V = V};
    if (backend == TDM_BACKEND_CUDA) {
        if (!(t.e = tdm_engine_new(m, ctx))) tdm_die_input(prog);
    } else {
        t.r = tdm_ref_new(m, ctx);
        if (tdm_ref_forward(t.r, prompt, n_prompt, n_prompt, NULL, NULL, NULL) != 0) tdm_die_input(prog);
        t.snap = tdm_ref_snap_new(t.r);
        tdm_ref_snap_save(t.r, t.snap);
    }
    float *one = malloc((size_t)rows_max * V * sizeof(float)), *many = malloc((size_t)rows_max * V * sizeof(float));
    int32_t *ids = malloc((size_t)rows_max * sizeof(int32_t));
    if (!one || !many || !ids) { fprintf(stderr, "%s: out of memory\n", prog); exit(1); }
    for (int i = 0; i < rows_max; i++) ids[i] = prompt[(i / 2) % n_prompt]; /* rows sharing inputs */
    twin_restart(&t);
    for (int i = 0; i < rows_max; i++) twin_forward(&t, ids + i, 1, one + (size_t)i * V);
    json_t *cases = json_array();
    static const char *const kinds[] = {"forward rows", "chain verify", "verify+commit", "tree verify", "tree+commit"};
    const int nkinds = t.e ? 5 : 3; /* trees: the engine's are exact; the CPU's factored form is (b)'s */
    for (int kind = 0; kind < nkinds; kind++) {
        int bad_m = 0, first_bad = 0;
        for (int M = 2; M <= rows_max; M++) {
            int bad = 0;
            if (kind >= 3) {
                bad = twin_tree_check(&t, ids, M, kind - 3, many, one + (size_t)(rows_max - 1) * V, V);
                if (bad && !bad_m++) first_bad = M;
                continue;
            }
            twin_restart(&t);
            if (kind == 0) twin_forward(&t, ids, M, many);
            else twin_verify(&t, ids, M, many);
            if (kind < 2) {
                for (int i = 0; i < M; i++) bad += !row_bits_equal(many + (size_t)i * V, one + (size_t)i * V, V);
            } else {
                const int j = (M + 1) / 2;
                twin_commit(&t, j);
                twin_forward(&t, ids + j, 1, many);
                bad = !row_bits_equal(many, one + (size_t)j * V, V);
            }
            if (bad && !bad_m++) first_bad = M;
        }
        const char *verdict = bad_m ? "fail" : "identical";
        failures += bad_m > 0;
        printf("twins %-13s M=2..%d: %s", kinds[kind], rows_max, verdict);
        if (bad_m) printf(" (%d row counts differ, first M=%d)", bad_m, first_bad);
        printf("\n");
        json_array_append_new(cases, json_pack("{s:s, s:i, s:s, s:i, s:i}", "case", kinds[kind], "rows_max", rows_max,
                                               "verdict", verdict, "row_counts_differing", bad_m, "first_differing_m",
                                               first_bad));
    }
    tdm_ref_snap_free(t.snap);
    tdm_ref_free(t.r);
    tdm_engine_free(t.e);
    free(one); free(many); free(ids);
    return cases;
}

/* tdm_spec_generate, exiting on failure: 1 when a CUDA call failed, 2 for bad input. */
static void generate(const struct tdm_model *m, const struct tdm_spec_opts *so, const int32_t *prompt, int n_prompt,
                     int n_new, int32_t *out, float *logits, struct tdm_spec_stats *st)
{
    const int rc = tdm_spec_generate(m, so, prompt, n_prompt, n_new, out, logits, st);
    if (rc == -2) tdm_die_check(prog);
    if (rc != 0) tdm_die_input(prog);
}

/* (b): one case of speculative output against the one-token output (ref, ref_logits). */
static json_t *check_spec(const struct tdm_model *m, struct tdm_spec_opts *so, const int32_t *prompt, int n_prompt,
                          int n_new, const int32_t *ref, const float *ref_logits, double tie)
{
    const int V = m->cfg.vocab;
    int32_t *out = malloc((size_t)n_new * sizeof(int32_t));
    float *lg = malloc((size_t)n_new * V * sizeof(float));
    if (!out || !lg) { fprintf(stderr, "%s: out of memory\n", prog); exit(1); }
    struct tdm_spec_stats st;
    generate(m, so, prompt, n_prompt, n_new, out, lg, &st);
    char shape[128];
    tdm_spec_shape_name(so, shape, sizeof shape);
    int div = -1;
    for (int i = 0; i < n_new && div < 0; i++)
        if (out[i] != ref[i]) div = i;
    int upto = div < 0 ? n_new : div + 1; /* rows computed on the same context */
    int rows_differ = 0;
    float maxd = 0.0f;
    for (int i = 0; i < upto; i++) {
        rows_differ += !row_bits_equal(lg + (size_t)i * V, ref_logits + (size_t)i * V, V);
        maxd = fmaxf(maxd, max_abs_diff(lg + (size_t)i * V, ref_logits + (size_t)i * V, V));
    }
    const char *verdict = "identical";
    double margin = 0.0, gap = 0.0;
    char why[160] = "";
    if (div >= 0) {
        const float *row = ref_logits + (size_t)div * V;
        margin = tdm_margin(row, V);
        gap = row[tdm_argmax(row, V)] - row[out[div]];
        if (gap < tie) {
            verdict = "near-tie";
            near_ties++;
        } else {
            verdict = "fail";
            snprintf(why, sizeof why, "token %d: the speculative token is %.6g below the one-token best, not within the tie margin", div, gap);
        }
    }
    if ((!so->tree_depth || so->backend == TDM_BACKEND_CUDA) && rows_differ && strcmp(verdict, "fail") != 0) {
        verdict = "fail";
        snprintf(why, sizeof why, "a %s must give one-token decode's logits bit for bit: %d rows differ",
                 so->tree_depth ? "tree on cuda" : "chain", rows_differ);
    }
    failures += strcmp(verdict, "fail") == 0;
    printf("speculative %-5s %-12s %d tokens: %s", tdm_spec_name(so->kind), shape, n_new, verdict);
    if (div >= 0)
        printf(" at token %d (one-token %d, speculative %d, gap %.6g, top-1 margin %.6g)", div, ref[div], out[div], gap, margin);
    printf("; %d rounds, %.3f accepted per round; logits rows differing in bits %d of %d, max |diff| %.3g%s%s\n",
           st.rounds, st.rounds ? (double)st.accepted / st.rounds : 0.0, rows_differ, upto, maxd, *why ? "; " : "", why);
    json_t *c = json_pack("{s:s, s:s, s:s, s:i, s:s, s:i, s:i, s:f, s:o}", "drafter", tdm_spec_name(so->kind), "shape", shape,
                          "verdict", verdict, "new_tokens", n_new, "reason", why, "logit_rows_compared", upto,
                          "logit_rows_differing", rows_differ, "max_abs_logit_diff", (double)maxd, "rounds",
                          tdm_spec_stats_json(&st));
    if (div >= 0)
        json_object_set_new(c, "divergence", json_pack("{s:i, s:i, s:i, s:f, s:f}", "token", div, "one_token", ref[div],
                                                       "speculative", out[div], "gap", gap, "margin", margin));
    else json_object_set_new(c, "divergence", json_null());
    free(out);
    free(lg);
    return c;
}

/* (c) on the CUDA engine: each case run again with TANDEM_CUDA_GRAPH=off (eager launches) must give
 * the graphed run's tokens and logits bit for bit; and without logits (the greedy ids path, graphed
 * and eager) the graphed run's tokens. Leaves the switch on. */
static json_t *check_graphs(const struct tdm_model *m, const struct tdm_spec_opts *cases, int n, const int32_t *prompt,
                            int n_prompt, int n_new)
{
    const int V = m->cfg.vocab;
    int32_t *out[2], *ido = malloc((size_t)n_new * sizeof(int32_t));
    float *lg[2];
    for (int g = 0; g < 2; g++) {
        out[g] = malloc((size_t)n_new * sizeof(int32_t));
        lg[g] = malloc((size_t)n_new * V * sizeof(float));
        if (!out[g] || !lg[g] || !ido) { fprintf(stderr, "%s: out of memory\n", prog); exit(1); }
    }
    json_t *list = json_array();
    int bad_cases = 0, bad_ids = 0;
    for (int i = 0; i < n; i++) {
        struct tdm_spec_stats st;
        for (int g = 0; g < 2; g++) {
            if (setenv("TANDEM_CUDA_GRAPH", g ? "off" : "on", 1) != 0) { perror(prog); exit(1); }
            generate(m, &cases[i], prompt, n_prompt, n_new, out[g], lg[g], &st);
        }
        int rows_differ = 0;
        for (int r = 0; r < n_new; r++) rows_differ += !row_bits_equal(lg[0] + (size_t)r * V, lg[1] + (size_t)r * V, V);
        const int same = rows_differ == 0 && memcmp(out[0], out[1], (size_t)n_new * sizeof(int32_t)) == 0;
        bad_cases += !same;
        char shape[128] = "one token";
        if (cases[i].kind != TDM_SPEC_OFF) tdm_spec_shape_name(&cases[i], shape, sizeof shape);
        printf("graphed vs eager %-5s %-12s %d tokens: %s (logits rows differing in bits %d of %d)\n",
               tdm_spec_name(cases[i].kind), shape, n_new, same ? "identical" : "fail", rows_differ, n_new);
        /* the greedy ids path: no logits asked for, so the engine copies only the device's ids */
        int ids_first = -1;
        for (int g = 0; g < 2; g++) {
            if (setenv("TANDEM_CUDA_GRAPH", g ? "off" : "on", 1) != 0) { perror(prog); exit(1); }
            memset(ido, 0xff, (size_t)n_new * sizeof(int32_t));
            generate(m, &cases[i], prompt, n_prompt, n_new, ido, NULL, &st);
            for (int t = 0; t < n_new && ids_first < 0; t++)
                if (ido[t] != out[0][t]) ids_first = t;
        }
        bad_ids += ids_first >= 0;
        printf("greedy ids path  %-5s %-12s %d tokens: %s (no logits copied, graphed and eager, against the run with "
               "logits", tdm_spec_name(cases[i].kind), shape, n_new, ids_first < 0 ? "identical" : "fail");
        if (ids_first >= 0) printf("; first differing token %d", ids_first);
        printf(")\n");
        json_array_append_new(list, json_pack("{s:s, s:s, s:s, s:i, s:s}", "drafter", tdm_spec_name(cases[i].kind), "shape",
                                              shape, "verdict", same ? "identical" : "fail", "logit_rows_differing",
                                              rows_differ, "ids_path_verdict", ids_first < 0 ? "identical" : "fail"));
    }
    if (setenv("TANDEM_CUDA_GRAPH", "on", 1) != 0) { perror(prog); exit(1); }
    failures += bad_cases + bad_ids;
    for (int g = 0; g < 2; g++) { free(out[g]); free(lg[g]); }
    free(ido);
    return json_pack("{s:s, s:s, s:o}", "verdict", bad_cases ? "fail" : "identical", "ids_path_verdict",
                     bad_ids ? "fail" : "identical", "cases", list);
}

int main(int argc, char **argv)
{
    const char *model_dir = NULL, *prompt_path = NULL, *json_path = NULL, *spec_list = "all", *tree_opt = DEFAULT_TREE;
    const char *draft_dir = NULL, *backend_opt = "cpu";
    long n_new = 32, draft_n = TDM_SPEC_DEFAULT_DRAFT, rows_max = 32;
    double tie = DEFAULT_TIE;
    static const struct option opts[] = {
        {"model", 1, 0, 'm'}, {"prompt", 1, 0, 'p'}, {"new-tokens", 1, 0, 'n'}, {"spec", 1, 0, 'S'},
        {"draft", 1, 0, 'D'}, {"tree", 1, 0, 'T'}, {"draft-model", 1, 0, 'M'}, {"tie-margin", 1, 0, 't'},
        {"rows", 1, 0, 'r'}, {"backend", 1, 0, 'b'}, {"json", 1, 0, 'j'}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    int o;
    while ((o = tdm_getopt(prog, argc, argv, "m:p:n:h", opts)) != -1) {
        switch (o) {
        case 'm': model_dir = optarg; break;
        case 'p': prompt_path = optarg; break;
        case 'n': n_new = tdm_opt_long(prog, "-n", optarg, 1, 1 << 20); break;
        case 'S': spec_list = optarg; break;
        case 'D': draft_n = tdm_opt_long(prog, "--draft", optarg, 1, TDM_SPEC_MAX_NODES - 1); break;
        case 'T': tree_opt = optarg; break;
        case 'M': draft_dir = optarg; break;
        case 't': {
            char *end;
            tie = strtod(optarg, &end);
            if (!*optarg || *end || !(tie >= 0.0) || isinf(tie)) tdm_die_usage(prog, "--tie-margin: expected a number >= 0", optarg);
            break;
        }
        case 'r': rows_max = tdm_opt_long(prog, "--rows", optarg, 2, TDM_SPEC_MAX_NODES); break;
        case 'b': backend_opt = optarg; break;
        case 'j': json_path = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return TDM_EXIT_USAGE;
        }
    }
    if (optind < argc) tdm_die_usage(prog, "unexpected argument", argv[optind]);
    if (tdm_settings_check() != 0) tdm_die_input(prog);
    if (!model_dir) tdm_die_usage(prog, "-m DIR is required (see --help)", NULL);
    if (!prompt_path) tdm_die_usage(prog, "-p FILE is required (see --help)", NULL);

    /* which drafters */
    int want[4] = {0};
    int all = strcmp(spec_list, "all") == 0;
    if (!all) {
        char *list = strdup(spec_list), *save = NULL;
        for (char *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            enum tdm_spec_kind k;
            if (tdm_spec_parse(tok, &k) != 0 || k == TDM_SPEC_OFF) {
                free(list);
                tdm_die_usage(prog, "--spec: expected a list from mtp,ngram,draft, or all", spec_list);
            }
            want[k] = 1;
        }
        free(list);
        if (want[TDM_SPEC_DRAFT] && !draft_dir) tdm_die_usage(prog, "--spec draft needs --draft-model DIR", NULL);
    }
    struct tdm_spec_opts base;
    if (tdm_spec_opts_init(&base) != 0) tdm_die_input(prog);
    base.draft = (int)draft_n;
    if (tdm_spec_parse_tree(tree_opt, &base) != 0) tdm_die_input(prog);
    int tree_depth = base.tree_depth;
    base.tree_depth = 0;
    struct tdm_model *m = tdm_model_load(model_dir);
    if (!m) tdm_die_input(prog);
    enum tdm_backend backend;
    const char *why;
    if (tdm_backend_pick(backend_opt, m, &backend, &why) != 0) tdm_die_input(prog);
    (void)why;
    base.backend = backend;
    if (backend == TDM_BACKEND_CUDA) {
        /* (b) from graphs; (c) runs every case again without them */
        if (setenv("TANDEM_CUDA_GRAPH", "on", 1) != 0) { perror(prog); return 1; }
        fprintf(stderr, "# (b) runs with TANDEM_CUDA_GRAPH=on, (c) again with off\n");
    }
    struct tdm_model *dm = NULL;
    if (draft_dir && !(dm = tdm_model_load(draft_dir))) tdm_die_input(prog);
    if (all) {
        want[TDM_SPEC_MTP] = m->has_mtp;
        want[TDM_SPEC_NGRAM] = 1;
        want[TDM_SPEC_DRAFT] = dm != NULL;
    }
    if (want[TDM_SPEC_MTP] && !m->has_mtp) {
        fprintf(stderr, "%s: %s: --spec mtp: the checkpoint has no MTP layer\n", prog, model_dir);
        return TDM_EXIT_USAGE;
    }
    int32_t *prompt = NULL;
    int n_prompt = 0;
    if (tdm_tokens_read(prompt_path, m->cfg.vocab, 0, &prompt, &n_prompt) != 0) tdm_die_input(prog);
    if (n_prompt < 1) {
        fprintf(stderr, "%s: %s: the prompt is empty\n", prog, prompt_path);
        return TDM_EXIT_USAGE;
    }
    fprintf(stderr, "# model %s, prompt %d tokens, %ld new tokens, tie margin %g, backend %s\n", model_dir, n_prompt, n_new,
            tie, tdm_backend_name(backend));

    /* (a) */
    json_t *twins = check_twins(m, backend, prompt, n_prompt, (int)rows_max);
    json_t *dev_ids;
    if (backend == TDM_BACKEND_CUDA) {
        printf("device greedy ids of (a)'s rows vs the host argmax of their logits: %ld rows: %s (%ld differ)\n", id_rows,
               id_differ ? "fail" : "identical", id_differ);
        failures += id_differ > 0;
        dev_ids = json_pack("{s:s, s:I, s:I}", "verdict", id_differ ? "fail" : "identical", "rows", (json_int_t)id_rows,
                            "differing", (json_int_t)id_differ);
    } else {
        dev_ids = json_pack("{s:s, s:s}", "verdict", "not applicable",
                            "reason", "the cpu backend takes greedy ids with tdm_argmax on the host");
    }

    /* (b): the one-token reference first */
    const int V = m->cfg.vocab;
    int32_t *ref = malloc((size_t)n_new * sizeof(int32_t));
    float *ref_logits = malloc((size_t)n_new * V * sizeof(float));
    if (!ref || !ref_logits) { fprintf(stderr, "%s: out of memory\n", prog); return 1; }
    struct tdm_spec_opts plain = base;
    plain.kind = TDM_SPEC_OFF;
    plain.fault_at = 0;
    struct tdm_spec_stats pst;
    generate(m, &plain, prompt, n_prompt, (int)n_new, ref, ref_logits, &pst);
    float min_margin = INFINITY;
    for (long i = 0; i < n_new; i++) min_margin = fminf(min_margin, tdm_margin(ref_logits + (size_t)i * V, V));
    printf("one-token reference: %ld tokens, smallest top-1 margin %.6g\n", n_new, min_margin);
    json_t *spec = json_array();
    struct tdm_spec_opts ran[2 * 3 + 1]; /* the cases run, the one-token run first, for (c) */
    int nran = 0;
    ran[nran++] = plain;
    for (int k = TDM_SPEC_MTP; k <= TDM_SPEC_DRAFT; k++) {
        if (!want[k]) continue;
        for (int tree = 0; tree < 2; tree++) {
            struct tdm_spec_opts so = base;
            so.kind = (enum tdm_spec_kind)k;
            so.draft_model = dm;
            so.tree_depth = tree ? tree_depth : 0;
            json_array_append_new(spec, check_spec(m, &so, prompt, n_prompt, (int)n_new, ref, ref_logits, tie));
            ran[nran++] = so;
        }
    }

    /* (c) */
    json_t *graphs;
    if (backend == TDM_BACKEND_CUDA) graphs = check_graphs(m, ran, nran, prompt, n_prompt, (int)n_new);
    else {
        const char *na = "not applicable on the cpu backend: the CPU reference has no CUDA graphs";
        printf("graphed vs eager: %s\n", na);
        graphs = json_pack("{s:s, s:s}", "verdict", "not applicable", "reason", na);
    }

    int rc = failures ? TDM_EXIT_CHECK : TDM_EXIT_OK;
    printf("exactcheck: %s (%d failures, %d near ties)\n", failures ? "FAIL" : "pass", failures, near_ties);
    if (json_path) {
        json_t *rec = json_pack("{s:s, s:s, s:s, s:i, s:I, s:f, s:f, s:o, s:o, s:o, s:o, s:i, s:i, s:s}", "model",
                                model_dir, "prompt", prompt_path, "backend", tdm_backend_name(backend), "prompt_tokens",
                                n_prompt, "new_tokens", (json_int_t)n_new, "tie_margin", tie, "one_token_min_margin",
                                (double)min_margin, "twins", twins, "device_ids", dev_ids, "speculative", spec, "graphs",
                                graphs, "failures", failures, "near_ties", near_ties, "verdict", failures ? "fail" : "pass");
        if (draft_dir) json_object_set_new(rec, "draft_model", json_string(draft_dir));
        if (tdm_json_write_atomic(json_path, rec, JSON_INDENT(2) | JSON_PRESERVE_ORDER) != 0) {
            fprintf(stderr, "%s: %s\n", prog, tdm_err());
            rc = TDM_EXIT_USAGE;
        }
        json_decref(rec);
    } else {
        json_decref(twins);
        json_decref(dev_ids);
        json_decref(spec);
        json_decref(graphs);
    }
    free(ref); free(ref_logits); free(prompt);
    tdm_model_free(dm);
    tdm_model_free(m);
    return rc;
}
