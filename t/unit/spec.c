/* Speculative rounds on the CPU reference (argv[1]: a model with an MTP layer and a vocabulary of at least 512): the n-gram
 * drafter's proposals on a constructed history; a chain verify gives one-token decode's logits bit
 * for bit; a tree verify (factored form) is close to a chain verify of each of its paths; deferred
 * commit leaves the same state as immediate commit (and, for a chain, as one-token decoding); a
 * one-token step after a deferred commit applies the pending factors; the speculative engine's
 * chains (mtp, ngram, draft) give one-token decode's logits bit for bit, its trees the same
 * tokens or a first divergence at a near tie; without logits asked for (the greedy ids path: on the
 * CPU the ids are tdm_argmax of the logits, on the CUDA engine chosen on the device) every run
 * gives the tokens of the run with logits, and TANDEM_SPEC_FAULT still acts. */
#include "err.h"
#include "model.h"
#include "ref.h"
#include "spec.h"
#include "tap.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const int32_t prompt[] = {5, 17, 99, 3, 250, 7, 400, 42, 8, 9, 10, 11, 5, 17, 99};
#define NP ((int)(sizeof prompt / sizeof prompt[0]))

static int same_bits(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof(float)) == 0; }
static float maxdiff(const float *a, const float *b, size_t n)
{
    float m = 0;
    for (size_t i = 0; i < n; i++) m = fmaxf(m, fabsf(a[i] - b[i]));
    return m;
}

static void ngram_tests(void)
{
    int32_t out[8];
    const int32_t h1[] = {1, 2, 3, 4, 1, 2, 3, 5, 9, 1, 2, 3};
    int k = tdm_ngram_propose(h1, 12, 3, 2, out);
    ok(k == 2 && out[0] == 5 && out[1] == 4, "ngram: suffix 1 2 3 proposes 5 (most recent match), then 4 (got %d: %d %d)", k,
       out[0], out[1]);
    k = tdm_ngram_propose(h1, 12, 3, 1, out);
    ok(k == 1 && out[0] == 5, "ngram: a chain takes the most recent longest match");
    const int32_t h2[] = {7, 8, 9, 6, 8};
    k = tdm_ngram_propose(h2, 5, 3, 1, out);
    ok(k == 1 && out[0] == 9, "ngram: falls back to a shorter suffix (8 -> 9)");
    const int32_t h3[] = {4, 5, 6, 7, 6, 1, 2, 6};
    k = tdm_ngram_propose(h3, 8, 3, 4, out);
    ok(k == 2 && out[0] == 1 && out[1] == 7, "ngram: distinct followers of every match, most recent first (got %d)", k);
    const int32_t h4[] = {1, 2, 3};
    ok(tdm_ngram_propose(h4, 3, 3, 4, out) == 0, "ngram: no match, no proposal");
    ok(tdm_ngram_propose(h4, 1, 3, 4, out) == 0, "ngram: a one-token history proposes nothing");
}

/* A state after the prompt, and one-token logits for ids[0..n-1] fed from there. */
/* The full tree of a branching spec (what tandem-benchround times): depth-first, cut at 32 nodes. */
static void tree_layout_tests(void)
{
    struct tdm_spec_opts o;
    int parent[TDM_SPEC_MAX_NODES], depth[TDM_SPEC_MAX_NODES];
    static const int want[] = {-1, 0, 1, 2, 1, 4, 0, 6, 7, 6, 9};
    memset(&o, 0, sizeof o);
    tdm_spec_parse_tree("2,2,1", &o);
    int n = tdm_spec_tree_layout(&o, parent, depth);
    ok(n == 11 && memcmp(parent, want, sizeof want) == 0 && depth[3] == 3 && depth[6] == 1 && depth[10] == 3,
       "tree 2,2,1: 11 nodes depth-first, each subtree before the next sibling (%d nodes)", n);
    memset(&o, 0, sizeof o);
    tdm_spec_parse_tree("8,3", &o);
    n = tdm_spec_tree_layout(&o, parent, NULL);
    ok(n == TDM_SPEC_MAX_NODES && parent[30] == 29 && parent[31] == 29,
       "tree 8,3 (33 nodes) is cut at %d: the last depth-1 node keeps 2 of its 3 children (%d nodes)", TDM_SPEC_MAX_NODES, n);
    memset(&o, 0, sizeof o);
    tdm_spec_parse_tree("1,1,1", &o);
    n = tdm_spec_tree_layout(&o, parent, depth);
    ok(n == 4 && parent[1] == 0 && parent[2] == 1 && parent[3] == 2 && depth[3] == 3, "tree 1,1,1 is a chain of 4");
}

static void one_token(const struct tdm_model *m, const int32_t *ids, int n, float *lg, uint64_t *hash_after)
{
    struct tdm_ref *r = tdm_ref_new(m, 128);
    tdm_ref_forward(r, prompt, NP, NP, NULL, NULL, NULL);
    for (int i = 0; i < n; i++) tdm_ref_forward(r, ids + i, 1, 0, lg + (size_t)i * m->cfg.vocab, NULL, NULL);
    if (hash_after) *hash_after = tdm_ref_state_hash(r);
    tdm_ref_free(r);
}

static void verify_tests(const struct tdm_model *m)
{
    const int V = m->cfg.vocab;
    const int32_t ids[] = {11, 300, 300, 77, 5, 201, 2};
    const int n = 7;
    float *one = malloc((size_t)16 * V * sizeof(float)), *ver = malloc((size_t)32 * V * sizeof(float));
    float *chain = malloc((size_t)16 * V * sizeof(float));
    uint64_t h_one;
    one_token(m, ids, n, one, &h_one);

    /* chain verify + commit, deferred and immediate */
    int parent[32], path[32];
    for (int i = 0; i < n; i++) parent[i] = i - 1, path[i] = i;
    uint64_t h[2];
    for (int defer = 0; defer < 2; defer++) {
        struct tdm_ref *r = tdm_ref_new(m, 128);
        tdm_ref_set_defer(r, defer);
        tdm_ref_forward(r, prompt, NP, NP, NULL, NULL, NULL);
        ok(tdm_ref_verify(r, ids, parent, n, 0, ver, NULL) == 0, "chain verify of %d nodes runs", n);
        ok(same_bits(ver, one, (size_t)n * V), "chain verify (defer %d): every row has one-token decode's logits bits", defer);
        ok(tdm_ref_commit(r, path, n) == 0 && tdm_ref_pos(r) == NP + n, "commit of the whole chain");
        h[defer] = tdm_ref_state_hash(r);
        /* the next one-token step applies pending factors first (deferred) or finds them applied */
        int32_t nx = 123;
        float *a = malloc((size_t)V * sizeof(float)), *b = malloc((size_t)(n + 1) * V * sizeof(float));
        tdm_ref_forward(r, &nx, 1, 0, a, NULL, NULL);
        int32_t ids2[8];
        memcpy(ids2, ids, sizeof ids);
        ids2[n] = nx;
        one_token(m, ids2, n + 1, b, NULL);
        ok(same_bits(a, b + (size_t)n * V, (size_t)V), "defer %d: a one-token step after the commit has one-token decode's bits", defer);
        free(a);
        free(b);
        tdm_ref_free(r);
    }
    ok(h[0] == h[1], "chain: deferred commit leaves the state of immediate commit, bit for bit");
    ok(h[1] == h_one, "chain: the committed state is one-token decoding's state, bit for bit");

    /* a partial chain commit: the rejected rows are dropped */
    {
        struct tdm_ref *r = tdm_ref_new(m, 128);
        tdm_ref_forward(r, prompt, NP, NP, NULL, NULL, NULL);
        tdm_ref_verify(r, ids, parent, n, 0, ver, NULL);
        tdm_ref_commit(r, path, 3);
        float *a = malloc((size_t)V * sizeof(float));
        tdm_ref_forward(r, &ids[3], 1, 0, a, NULL, NULL);
        ok(same_bits(a, one + (size_t)3 * V, (size_t)V), "after accepting 3 of 7 rows, the next step has one-token bits");
        free(a);
        tdm_ref_free(r);
    }

    /* a tree: root 11; children 300 (-> 300 -> 77, and 5) and 201 (-> 2); depth-first */
    const int32_t tid[] = {11, 300, 300, 77, 5, 201, 2};
    const int tpar[] = {-1, 0, 1, 2, 1, 0, 5};
    const int tn = 7;
    uint64_t th[2];
    for (int defer = 0; defer < 2; defer++) {
        struct tdm_ref *r = tdm_ref_new(m, 128);
        tdm_ref_set_defer(r, defer);
        tdm_ref_forward(r, prompt, NP, NP, NULL, NULL, NULL);
        ok(tdm_ref_verify(r, tid, tpar, tn, 1, ver, NULL) == 0, "tree verify of %d nodes runs", tn);
        if (defer) {
            /* each root-to-leaf path against the materialised chain of that path */
            static const int paths[3][4] = {{0, 1, 2, 3}, {0, 1, 4, -1}, {0, 5, 6, -1}};
            float worst = 0, scale = 0;
            for (int p = 0; p < 3; p++) {
                int32_t pid[4];
                int len = 0;
                while (len < 4 && paths[p][len] >= 0) { pid[len] = tid[paths[p][len]]; len++; }
                one_token(m, pid, len, chain, NULL);
                for (int j = 0; j < len; j++) {
                    worst = fmaxf(worst, maxdiff(ver + (size_t)paths[p][j] * V, chain + (size_t)j * V, (size_t)V));
                    for (int i = 0; i < V; i++) scale = fmaxf(scale, fabsf(chain[(size_t)j * V + i]));
                }
            }
            ok(worst < 0.02f * scale, "tree: every node's logits are within 2%% of the largest logit of its own path's "
                                      "one-token logits (max diff %.4g, largest logit %.3g)", worst, scale);
        }
        int tpath[] = {0, 1, 4};
        ok(tdm_ref_commit(r, tpath, 3) == 0, "commit of the tree path 11 300 5");
        th[defer] = tdm_ref_state_hash(r);
        tdm_ref_free(r);
    }
    ok(th[0] == th[1], "tree: deferred commit leaves the state of immediate commit, bit for bit");
    {
        struct tdm_ref *r = tdm_ref_new(m, 128);
        tdm_ref_forward(r, prompt, NP, NP, NULL, NULL, NULL);
        int bad[] = {-1, 0, 1, 0, 2};
        ok(tdm_ref_verify(r, tid, bad, 5, 1, ver, NULL) != 0 && strstr(tdm_err(), "depth-first"),
           "a layout that is not depth-first is refused: %s", tdm_err());
        int notchain[] = {-1, 0, 0};
        ok(tdm_ref_verify(r, tid, notchain, 3, 0, ver, NULL) != 0, "chain mode refuses a tree");
        tdm_ref_verify(r, tid, tpar, tn, 1, ver, NULL);
        int badpath[] = {0, 5, 3};
        ok(tdm_ref_commit(r, badpath, 3) != 0, "a commit path that is not parent-to-child is refused");
        tdm_ref_free(r);
    }
    free(one); free(ver); free(chain);
}

/* The MTP drafter's rollback rule: chained draft steps above the real rows, rewound and replaced
 * by real rows, leave the drafter as if only real rows had been fed. */
static void mtp_rewind_tests(const struct tdm_model *m)
{
    const int H = m->cfg.hidden, V = m->cfg.vocab;
    float *h = malloc((size_t)(NP + 4) * H * sizeof(float)), *mh = malloc((size_t)H * sizeof(float));
    float *la = malloc((size_t)V * sizeof(float)), *lb = malloc((size_t)V * sizeof(float));
    int32_t next[NP + 4];
    uint64_t hash[2];
    for (int k = 0; k < 2; k++) {
        struct tdm_ref *r = tdm_ref_new(m, 128);
        tdm_ref_forward(r, prompt, NP, NP, NULL, NULL, h);
        memcpy(next, prompt + 1, (NP - 1) * sizeof(int32_t));
        next[NP - 1] = 77;
        tdm_ref_mtp_h(r, next, h, NP - 3, NULL, NULL); /* real rows 0..NP-4 */
        if (k == 1) {
            /* three chained draft steps on top (drafted tokens, the MTP's own h), then rewound */
            int32_t d = 300;
            for (int i = 0; i < 3; i++) tdm_ref_mtp_h(r, &d, i ? mh : h + (size_t)(NP - 3) * H, 1, NULL, mh);
            tdm_ref_mtp_rewind(r, NP - 3);
        }
        tdm_ref_mtp_h(r, next + NP - 3, h + (size_t)(NP - 3) * H, 3, NULL, NULL); /* the real rows NP-3..NP-1 */
        hash[k] = tdm_ref_state_hash(r);
        int32_t d = 5;
        tdm_ref_mtp_h(r, &d, h, 1, k ? lb : la, NULL);
        tdm_ref_free(r);
    }
    ok(hash[0] == hash[1] && same_bits(la, lb, (size_t)V), "MTP: draft steps rewound and refed with real rows leave the state of real rows only");
    free(h); free(mh); free(la); free(lb);
}

/* TANDEM_DRAFT_FORMAT=nvfp4|fp8 (name, fmt): the drafter's weights requantized at load (model.c:
 * draft_requant), and the reference drafter reads them: its logits differ from the stored drafter's
 * but stay near them, within bound (NVFP4 keeps ~3 significant bits a weight, FP8 4; the bounds are
 * loose on purpose: random weights, small margins); a draft token reads under frac of the stored
 * bytes. The verify's side (spec output = one-token decode) is t/spec.t's. */
static void draft_format_tests(const char *dir, const struct tdm_model *m, const char *name, enum tdm_wfmt fmt,
                               double frac, double bound)
{
    setenv("TANDEM_DRAFT_FORMAT", name, 1);
    struct tdm_model *q = tdm_model_load(dir);
    unsetenv("TANDEM_DRAFT_FORMAT");
    if (!q) { ok(0, "TANDEM_DRAFT_FORMAT=%s: load: %s", name, tdm_err()); return; }
    const struct tdm_mtp *a = &m->mtp, *b = &q->mtp;
    ok(b->fc.fmt == fmt && b->layer.attn.q.fmt == fmt && b->layer.attn.o.fmt == fmt && b->layer.mlp.down.fmt == fmt &&
           b->has_head && b->head.fmt == fmt && !a->has_head && b->requant == (int)fmt && a->requant == -1 &&
           q->head.fmt == m->head.fmt && q->layers[0].mlp.down.fmt == m->layers[0].mlp.down.fmt,
       "TANDEM_DRAFT_FORMAT=%s: the MTP layer's projections and the drafter's head are %s, the model's are as stored", name,
       tdm_wfmt_title(fmt));
    ok(b->draft_bytes == a->draft_bytes && a->draft_bytes_now == a->draft_bytes && b->draft_bytes_now < frac * (double)a->draft_bytes,
       "%s: a draft token reads %lld bytes requantized against %lld stored", name, (long long)b->draft_bytes_now,
       (long long)a->draft_bytes);
    const int H = m->cfg.hidden, V = m->cfg.vocab;
    float *h = malloc((size_t)NP * H * sizeof(float)), *la = malloc((size_t)V * sizeof(float)), *lb = malloc((size_t)V * sizeof(float));
    int32_t next[NP];
    memcpy(next, prompt + 1, (NP - 1) * sizeof(int32_t));
    next[NP - 1] = 77;
    const struct tdm_model *mm[2] = {m, q};
    float *lg[2] = {la, lb};
    for (int k = 0; k < 2; k++) {
        struct tdm_ref *r = tdm_ref_new(mm[k], 128);
        tdm_ref_forward(r, prompt, NP, NP, NULL, NULL, h);   /* the main model: the same in both */
        tdm_ref_mtp_h(r, next, h, NP, NULL, NULL);
        int32_t d = 5;
        tdm_ref_mtp_h(r, &d, h + (size_t)(NP - 1) * H, 1, lg[k], NULL);
        tdm_ref_free(r);
    }
    double num = 0, den = 0;
    int ia = 0, ib = 0;
    for (int v = 0; v < V; v++) {
        num += (double)(la[v] - lb[v]) * (la[v] - lb[v]);
        den += (double)la[v] * la[v];
        if (la[v] > la[ia]) ia = v;
        if (lb[v] > lb[ib]) ib = v;
    }
    const double rel = sqrt(num / (den > 0 ? den : 1));
    ok(!same_bits(la, lb, (size_t)V) && rel < bound,
       "%s: the requantized drafter's logits: relative L2 distance %.3f to the stored drafter's (< %g), argmax %s", name, rel,
       bound, ia == ib ? "the same" : "different");
    free(h); free(la); free(lb);
    tdm_model_free(q);
}

/* Whether two weights hold the same stored bits: their codes, and their scales where they have them. */
static int same_qweight(const struct tdm_qweight *a, const struct tdm_qweight *b)
{
    if (a->fmt != b->fmt || a->n != b->n || a->k != b->k || a->scale2 != b->scale2 || a->scale_dt != b->scale_dt) return 0;
    const size_t sb = (size_t)tdm_qweight_scale_bytes(a), wb = (size_t)tdm_qweight_bytes(a) - sb;
    return memcmp(a->w, b->w, wb) == 0 && (!sb || memcmp(a->scale, b->scale, sb) == 0);
}

/* TANDEM_HEAD_FORMAT=nvfp4|fp8 (name, fmt): the model's BF16 head requantized at load (model.c:
 * head_requant); the reference's logits read it (near the stored head's, within bound, not equal),
 * the head reads under frac of the stored bytes, the embedding and the layers stay as stored, and
 * with TANDEM_DRAFT_FORMAT the same as well the drafter shares the model's head, which is the bits
 * of the head requantized alone. */
static void head_format_tests(const char *dir, const struct tdm_model *m, const char *name, enum tdm_wfmt fmt, double frac,
                              double bound)
{
    setenv("TANDEM_HEAD_FORMAT", name, 1);
    struct tdm_model *q = tdm_model_load(dir);
    setenv("TANDEM_DRAFT_FORMAT", name, 1);
    struct tdm_model *qd = tdm_model_load(dir);
    unsetenv("TANDEM_HEAD_FORMAT");
    struct tdm_model *d = tdm_model_load(dir);   /* the drafter requantized alone */
    unsetenv("TANDEM_DRAFT_FORMAT");
    if (!q || !qd || !d) {
        ok(0, "TANDEM_HEAD_FORMAT=%s: load: %s", name, tdm_err());
        tdm_model_free(q); tdm_model_free(qd); tdm_model_free(d);
        return;
    }
    const int64_t stored = tdm_qweight_bytes(&m->head);
    ok(m->head.fmt == TDM_W_BF16 && q->head.fmt == fmt && q->head_bytes_stored == stored && !m->head_bytes_stored &&
           tdm_qweight_bytes(&q->head) < frac * (double)stored && same_qweight(&q->embed, &m->embed) &&
           same_qweight(&q->layers[0].mlp.down, &m->layers[0].mlp.down) && !q->mtp.has_head,
       "TANDEM_HEAD_FORMAT=%s: the head is %s (%lld bytes, %lld stored), the embedding and the layers as stored", name,
       tdm_wfmt_title(fmt), (long long)tdm_qweight_bytes(&q->head), (long long)stored);
    ok(qd->head.fmt == fmt && !qd->mtp.has_head && d->mtp.has_head && same_qweight(&qd->head, &q->head) &&
           same_qweight(&d->mtp.head, &q->head) && qd->mtp.draft_bytes_now == d->mtp.draft_bytes_now &&
           qd->mtp.draft_bytes == m->mtp.draft_bytes,
       "with TANDEM_DRAFT_FORMAT=%s too, the drafter shares the model's requantized head (the same bits as either alone)", name);
    const int V = m->cfg.vocab;
    float *la = malloc((size_t)NP * V * sizeof(float)), *lb = malloc((size_t)NP * V * sizeof(float));
    const struct tdm_model *mm[2] = {m, q};
    float *lg[2] = {la, lb};
    for (int k = 0; k < 2; k++) {
        struct tdm_ref *r = tdm_ref_new(mm[k], 128);
        tdm_ref_forward(r, prompt, NP, 0, lg[k], NULL, NULL);
        tdm_ref_free(r);
    }
    double num = 0, den = 0;
    for (size_t i = 0; i < (size_t)NP * V; i++) {
        num += (double)(la[i] - lb[i]) * (la[i] - lb[i]);
        den += (double)la[i] * la[i];
    }
    const double rel = sqrt(num / (den > 0 ? den : 1));
    ok(!same_bits(la, lb, (size_t)NP * V) && rel < bound,
       "%s: the requantized head's prompt logits: relative L2 distance %.3f to the stored head's (< %g)", name, rel, bound);
    free(la); free(lb);
    tdm_model_free(q); tdm_model_free(qd); tdm_model_free(d);
}

static void engine_tests(const struct tdm_model *m)
{
    const int V = m->cfg.vocab, N = 24;
    int32_t ref[64], out[64];
    float *rl = malloc((size_t)N * V * sizeof(float)), *ol = malloc((size_t)N * V * sizeof(float));
    struct tdm_spec_opts o;
    struct tdm_spec_stats st;
    ok(tdm_spec_opts_init(&o) == 0, "options from the settings table");
    o.fault_at = 0;
    if (tdm_spec_generate(m, &o, prompt, NP, N, ref, rl, &st) != 0) {
        ok(0, "plain decode: %s", tdm_err());
        free(rl);
        free(ol);
        return;
    }
    /* the greedy ids path (no logits asked for): the same tokens */
    int32_t ids_out[64];
    memset(ids_out, 0xff, sizeof ids_out);
    ok(tdm_spec_generate(m, &o, prompt, NP, N, ids_out, NULL, &st) == 0 && memcmp(ids_out, ref, (size_t)N * sizeof *ref) == 0,
       "plain decode without logits (greedy ids path): the tokens of the run with logits");
    static const enum tdm_spec_kind kinds[] = {TDM_SPEC_MTP, TDM_SPEC_NGRAM, TDM_SPEC_DRAFT};
    for (int ki = 0; ki < 3; ki++)
        for (int tree = 0; tree < 2; tree++) {
            struct tdm_spec_opts so = o;
            so.kind = kinds[ki];
            so.draft_model = m; /* the model as its own drafter: every draft accepted */
            so.draft = 3;
            if (tree) tdm_spec_parse_tree("2,2,1", &so);
            int rc = tdm_spec_generate(m, &so, prompt, NP, N, out, ol, &st);
            const char *name = tdm_spec_name(so.kind);
            if (rc != 0) { ok(0, "%s %s: %s", name, tree ? "tree" : "chain", tdm_err()); continue; }
            struct tdm_spec_stats ist;
            memset(ids_out, 0xff, sizeof ids_out);
            ok(tdm_spec_generate(m, &so, prompt, NP, N, ids_out, NULL, &ist) == 0 &&
                   memcmp(ids_out, out, (size_t)N * sizeof *out) == 0 && ist.rounds == st.rounds && ist.accepted == st.accepted,
               "%s %s without logits (greedy ids path): the tokens, rounds and acceptance of the run with logits", name,
               tree ? "tree" : "chain");
            if (!tree) {
                ok(memcmp(out, ref, (size_t)N * sizeof *out) == 0 && same_bits(ol, rl, (size_t)N * V),
                   "%s chain: one-token decode's tokens and logits bits (%d rounds, %ld accepted)", name, st.rounds, st.accepted);
            } else {
                int div = -1;
                for (int i = 0; i < N && div < 0; i++)
                    if (out[i] != ref[i]) div = i;
                const float *row = rl + (size_t)(div >= 0 ? div : 0) * V;
                float gap = div >= 0 ? row[tdm_argmax(row, V)] - row[out[div]] : 0;
                ok(div < 0 || gap < 0.0625f, "%s tree: the same tokens%s (%d rounds, %ld accepted; gap %.4g)", name,
                   div < 0 ? "" : ", first divergence at a near tie", st.rounds, st.accepted, gap);
            }
            if (kinds[ki] == TDM_SPEC_DRAFT)
                ok(st.accepted > 0 && st.accepted_at[1] == st.drafted_at[1], "%s %s: a model drafting for itself is always accepted at depth 1",
                   name, tree ? "tree" : "chain");
            if (kinds[ki] == TDM_SPEC_DRAFT && tree) {
                int par[TDM_SPEC_MAX_NODES];
                const int n = tdm_spec_tree_layout(&so, par, NULL);
                ok(st.nshapes > 0 && st.shapes[0].nodes == n,
                   "%s tree: the first round's tree has tdm_spec_tree_layout's %d nodes (%d)", name, n,
                   st.nshapes ? st.shapes[0].nodes : 0);
            }
        }
    /* a fault (TANDEM_SPEC_FAULT=3) acts without logits asked for too: the third token is the lowest logit's */
    {
        struct tdm_spec_opts so = o;
        so.kind = TDM_SPEC_NGRAM;
        so.fault_at = 3;
        memset(ids_out, 0xff, sizeof ids_out);
        const int rc = tdm_spec_generate(m, &so, prompt, NP, N, ids_out, NULL, &st);
        int lowest = 0;
        for (int i = 1; i < V; i++)
            if (rl[(size_t)2 * V + i] < rl[(size_t)2 * V + lowest]) lowest = i;
        ok(rc == 0 && memcmp(ids_out, ref, 2 * sizeof *ref) == 0 && ids_out[2] == lowest && ids_out[2] != ref[2],
           "ngram chain with TANDEM_SPEC_FAULT=3 and no logits asked for: tokens 0, 1 as plain decode's, token 2 the lowest "
           "logit (%d, plain %d)", ids_out[2], ref[2]);
    }
    /* traffic: deferral reads each state once per round, immediate commit twice */
    struct tdm_spec_opts so = o;
    so.kind = TDM_SPEC_DRAFT;
    so.draft_model = m;
    struct tdm_spec_stats a, b;
    so.defer = 1;
    tdm_spec_generate(m, &so, prompt, NP, N, out, NULL, &a);
    so.defer = 0;
    tdm_spec_generate(m, &so, prompt, NP, N, ref, NULL, &b);
    ok(a.bytes.state_read == (int64_t)a.rounds * a.state_bytes && b.bytes.state_read == (int64_t)b.rounds * 2 * b.state_bytes,
       "state bytes read per round: deferred 1x, immediate 2x the state (%lld vs %lld)",
       (long long)(a.bytes.state_read / a.rounds), (long long)(b.bytes.state_read / b.rounds));
    ok(memcmp(out, ref, (size_t)N * sizeof *out) == 0, "deferred and immediate commit give the same tokens");
    ok(strcmp(a.commit, "deferred") == 0 && strcmp(b.commit, "immediate") == 0, "the statistics name the commit (%s, %s)",
       a.commit, b.commit);
    free(rl);
    free(ol);
}

int main(int argc, char **argv)
{
    if (argc < 2) skip_all("usage: spec MODEL_DIR");
    struct tdm_model *m = tdm_model_load(argv[1]);
    if (!m) { printf("Bail out! %s\n", tdm_err()); return 1; }
    ngram_tests();
    tree_layout_tests();
    verify_tests(m);
    mtp_rewind_tests(m);
    draft_format_tests(argv[1], m, "nvfp4", TDM_W_NVFP4, 1.0 / 3, 0.5);
    draft_format_tests(argv[1], m, "fp8", TDM_W_FP8, 0.6, 0.15);
    head_format_tests(argv[1], m, "nvfp4", TDM_W_NVFP4, 1.0 / 3, 0.5);
    head_format_tests(argv[1], m, "fp8", TDM_W_FP8, 0.6, 0.15);
    engine_tests(m);
    tdm_model_free(m);
    return done_testing();
}
