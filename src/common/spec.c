/* spec.c — speculative rounds on the CPU reference or the CUDA engine (spec.h says how each
 * drafter stays consistent after a rejection). */
#include "spec.h"
#include "engine.h"
#include "err.h"
#include "settings.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAXN TDM_SPEC_MAX_NODES

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) { fprintf(stderr, "tandem: out of memory (%zu bytes)\n", n); abort(); }
    return p;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static const char *const kind_names[] = {"off", "mtp", "ngram", "draft"};
const char *tdm_spec_name(enum tdm_spec_kind k) { return kind_names[k]; }

int tdm_spec_parse(const char *s, enum tdm_spec_kind *out)
{
    for (int i = 0; i < 4; i++)
        if (strcmp(s, kind_names[i]) == 0) { *out = (enum tdm_spec_kind)i; return 0; }
    return tdm_errf("--spec %s: expected off, mtp, ngram or draft", s);
}

int tdm_spec_opts_init(struct tdm_spec_opts *o)
{
    memset(o, 0, sizeof *o);
    o->draft = TDM_SPEC_DEFAULT_DRAFT;
    o->ngram_max = TDM_SPEC_DEFAULT_NGRAM;
    o->defer = strcmp(tdm_setting("TANDEM_SPEC_DEFER"), "off") != 0;
    long v;
    if (tdm_setting_int("TANDEM_SPEC_FAULT", &v) != 0) return -1;
    o->fault_at = v;
    if (tdm_setting_int("TANDEM_PREFILL_CHUNK", &v) != 0) return -1;
    if (v < 1) return tdm_errf("TANDEM_PREFILL_CHUNK must be a positive integer");
    o->prefill_chunk = (int)(v > 1 << 30 ? 1 << 30 : v);
    return 0;
}

int tdm_spec_parse_tree(const char *spec, struct tdm_spec_opts *o)
{
    int d = 0;
    const char *p = spec;
    while (*p) {
        char *end;
        long b = strtol(p, &end, 10);
        if (end == p || b < 1 || b > 16 || d >= MAXN - 1 || (*end && *end != ','))
            return tdm_errf("--tree %s: expected branching per depth such as 3,2,1 (each 1..16, at most %d depths)", spec,
                            MAXN - 1);
        o->branch[d++] = (int)b;
        p = *end ? end + 1 : end;
        if (*end && !*p) return tdm_errf("--tree %s: trailing comma", spec);
    }
    if (d == 0) return tdm_errf("--tree %s: empty", spec);
    o->tree_depth = d;
    return 0;
}

void tdm_spec_shape_name(const struct tdm_spec_opts *o, char *buf, size_t n)
{
    if (!o->tree_depth) { snprintf(buf, n, "chain %d", o->draft); return; }
    size_t at = (size_t)snprintf(buf, n, "tree ");
    for (int d = 0; d < o->tree_depth && at < n; d++) at += (size_t)snprintf(buf + at, n - at, d ? ",%d" : "%d", o->branch[d]);
}

int tdm_ngram_propose(const int32_t *h, int n, int ngram_max, int want, int32_t *out)
{
    int k = 0;
    for (int len = ngram_max < n - 1 ? ngram_max : n - 1; len >= 1 && k < want; len--)
        for (int i = n - len - 1; i >= 0 && k < want; i--) {
            if (memcmp(h + i, h + n - len, (size_t)len * sizeof *h) != 0) continue;
            int32_t tok = h[i + len], seen = 0;
            for (int j = 0; j < k; j++) seen |= out[j] == tok;
            if (!seen) out[k++] = tok;
        }
    return k;
}

/* ---- drafters ---- */

struct drafter {
    enum tdm_spec_kind kind;
    const struct tdm_spec_opts *o;
    int V, H;
    /* the round's tree */
    int n;
    int32_t ids[MAXN];
    int parent[MAXN], depth[MAXN], nchild[MAXN];
    /* mtp */
    struct tdm_ref *r;
    float *mh, *mlog;        /* [MAXN][H]: MTP output h per node; [V]: logits of the latest step */
    float *root_log;         /* [V]: the root's draft logits (from the catch-up) */
    int root_pos;            /* main-model position of the root */
    struct tdm_engine *me;   /* the CUDA engine running the MTP (then the chain below and its slots, not r) */
    int32_t chain[MAXN];     /* [d]: the engine's draft at depth d + 1, chained at the last feed (a tree: the root's top-1) */
    int nchain;
    /* ngram */
    int32_t *hist;
    int nhist, caphist;
    /* draft model: on the CPU reference (dr, snapshots) or a second CUDA engine (de: each node's
     * path verified on top of the committed tokens; dver: the rows of its last verify) */
    struct tdm_ref *dr;
    struct tdm_ref_snap *snap[MAXN + 1];
    int snap_owner[MAXN + 1], cur;
    float *dlog;
    struct tdm_engine *de;
    int32_t dver[MAXN];
    int ndver;
};

static void hist_add(struct drafter *d, const int32_t *t, int n)
{
    if (d->nhist + n + MAXN > d->caphist) {
        d->caphist = 2 * (d->nhist + n + MAXN);
        d->hist = realloc(d->hist, (size_t)d->caphist * sizeof *d->hist);
        if (!d->hist) { fprintf(stderr, "tandem: out of memory\n"); abort(); }
    }
    memcpy(d->hist + d->nhist, t, (size_t)n * sizeof *t);
    d->nhist += n;
}

/* The MTP rows of main positions p0..p0+T-1: (token at p+1, h_p); logits of the last row to root_log. */
static int mtp_feed_real(struct drafter *d, int p0, const int32_t *next, const float *h, int T)
{
    if (tdm_ref_mtp_rewind(d->r, p0) != 0) return -1;
    if (T > 1 && tdm_ref_mtp_h(d->r, next, h, T - 1, NULL, NULL) != 0) return -1;
    return tdm_ref_mtp_h(d->r, next + T - 1, h + (size_t)(T - 1) * d->H, 1, d->root_log, d->mh);
}

/* The CUDA engine's MTP (engine.h: tdm_engine_mtp): rewound to p0 and fed the T real rows (next[t],
 * the main model's final-norm rows of the engine's last forward chunk or verify, read on the
 * device: rows 0..T-1, TDM_ENGINE_MAX_ROWS a call, or with rows the rows rows[0..T-1], a tree
 * round's accepted path), then k drafts chained on the device into d->chain: the inputs and
 * positions of mtp_feed_real and of expand's chain steps. For a tree k is at most 1 (the root's
 * top-1) and the last real row's logits go to root_log when the root has more than one child; the
 * last real row's output stays on the device as slot 0, the root of expand's node calls. */
static int mtp_engine_feed(struct drafter *d, int p0, const int *rows, const int32_t *next, int T, int k)
{
    float *lg = d->o->tree_depth && d->o->branch[0] > 1 && k > 0 ? d->root_log : NULL;
    d->nchain = 0;
    if (rows) {
        if (tdm_engine_mtp_path(d->me, p0, rows, next, T, k, d->chain, lg) != 0) return -1;
    } else {
        for (int r0 = 0; r0 < T; r0 += TDM_ENGINE_MAX_ROWS) {
            const int n = T - r0 < TDM_ENGINE_MAX_ROWS ? T - r0 : TDM_ENGINE_MAX_ROWS, last = r0 + n == T;
            if (tdm_engine_mtp_at(d->me, p0 + r0, r0, next + r0, n, last ? k : 0, d->chain, last ? lg : NULL) != 0)
                return -1;
        }
    }
    d->nchain = k;
    return 0;
}

/* The depth of the next round's chain or tree when e of n_new tokens are out. */
static int round_depth(const struct tdm_spec_opts *o, long e, int n_new)
{
    const int want = o->tree_depth ? o->tree_depth : o->draft;
    const long left = n_new - e - 1;
    return left < want ? (int)(left > 0 ? left : 0) : want;
}

/* The drafts the engine's MTP chains at a feed: a chain's depth; for a tree only the root's top-1
 * (expand's node calls draft the rest). */
static int feed_drafts(const struct tdm_spec_opts *o, long e, int n_new)
{
    const int k = round_depth(o, e, n_new);
    return o->tree_depth && k > 1 ? 1 : k;
}

/* Up to want proposals for the children of node t (its path fed as the drafter needs). */
static int expand(struct drafter *d, int t, int want, int32_t *out)
{
    const int dep = d->depth[t], p = d->parent[t];
    switch (d->kind) {
    case TDM_SPEC_MTP:
        if (d->me && (!d->o->tree_depth || t == 0)) { /* a chain, or a tree's root: drafted at the last feed */
            if (dep >= d->nchain) return tdm_errf("MTP chain: no draft at depth %d (%d drafted)", dep + 1, d->nchain);
            if (want == 1) { out[0] = d->chain[dep]; return 1; }
            return tdm_topk(d->root_log, d->V, want, out);
        }
        if (d->me) { /* a tree node: one MTP row on the engine, its output in slot t; a top-1 chosen on the device */
            int32_t top;
            if (tdm_engine_mtp_node(d->me, d->root_pos - 1 + dep, d->ids[t], p, t, want == 1 ? &top : NULL,
                                    want == 1 ? NULL : d->mlog) != 0)
                return -1;
            if (want == 1) { out[0] = top; return 1; }
            return tdm_topk(d->mlog, d->V, want, out);
        }
        if (t == 0) return tdm_topk(d->root_log, d->V, want, out);
        /* node t at depth dep >= 1: MTP position root_pos - 1 + dep, fed (its token, its parent's h) */
        if (tdm_ref_mtp_rewind(d->r, d->root_pos - 1 + dep) != 0) return -1;
        if (tdm_ref_mtp_h(d->r, &d->ids[t], d->mh + (size_t)p * d->H, 1, d->mlog, d->mh + (size_t)t * d->H) != 0) return -1;
        return tdm_topk(d->mlog, d->V, want, out);
    case TDM_SPEC_NGRAM: {
        int n0 = d->nhist;
        for (int a = 1; a <= dep; a++) { /* the node's path beyond the root (the root is in the history) */
            int x = t;
            for (int up = dep; up > a; up--) x = d->parent[x];
            d->hist[n0 + a - 1] = d->ids[x];
        }
        return tdm_ngram_propose(d->hist, n0 + dep, d->o->ngram_max, want, out);
    }
    case TDM_SPEC_DRAFT:
        if (d->de) { /* t's path (root..t) as one verify on the committed state; its last row drafts */
            for (int x = t, a = dep; a >= 0; a--, x = d->parent[x]) d->dver[a] = d->ids[x];
            d->ndver = dep + 1;
            if (want == 1) /* a chain's draft, the top-1: its id chosen on the device, no logits copied */
                return tdm_engine_verify_ids(d->de, d->dver, dep + 1, dep, NULL, out) != 0 ? -1 : 1;
            if (tdm_engine_verify(d->de, d->dver, dep + 1, dep, d->dlog) != 0) return -1;
            return tdm_topk(d->dlog, d->V, want, out);
        }
        /* the draft model's state must hold the committed tokens plus t's path up to its parent */
        if (d->cur != p) {
            if (d->snap_owner[dep] != p) return tdm_errf("draft tree: no snapshot for node %d's parent", t);
            if (tdm_ref_snap_load(d->dr, d->snap[dep]) != 0) return -1;
        } else if (t > 0 && d->nchild[p] > 1 && d->snap_owner[dep] != p) {
            if (!d->snap[dep]) d->snap[dep] = tdm_ref_snap_new(d->dr);
            tdm_ref_snap_save(d->dr, d->snap[dep]);
            d->snap_owner[dep] = p;
        }
        if (tdm_ref_forward(d->dr, &d->ids[t], 1, 0, d->dlog, NULL, NULL) != 0) return -1;
        d->cur = t;
        return tdm_topk(d->dlog, d->V, want, out);
    default:
        return 0;
    }
}

static int build(struct drafter *d, int t, int maxdepth)
{
    const int dep = d->depth[t];
    d->nchild[t] = 0;
    if (dep >= maxdepth) return 0;
    int want = d->o->tree_depth ? d->o->branch[dep] : 1;
    if (want > MAXN - d->n) want = MAXN - d->n;
    if (want <= 0) return 0;
    int32_t cand[MAXN];
    int k = expand(d, t, want, cand);
    if (k < 0) return -1;
    d->nchild[t] = k;
    for (int i = 0; i < k && d->n < MAXN; i++) {
        int c = d->n++;
        d->ids[c] = cand[i];
        d->parent[c] = t;
        d->depth[c] = dep + 1;
        if (build(d, c, maxdepth) != 0) return -1;
    }
    return 0;
}

/* build()'s recursion without a drafter: every node at depth d gets branch[d] children while
 * there is room. */
static void layout(const struct tdm_spec_opts *o, int t, int dep, int *n, int *parent, int *depth)
{
    if (dep >= o->tree_depth) return;
    for (int i = 0; i < o->branch[dep] && *n < MAXN; i++) {
        const int c = (*n)++;
        parent[c] = t;
        if (depth) depth[c] = dep + 1;
        layout(o, c, dep + 1, n, parent, depth);
    }
}

int tdm_spec_tree_layout(const struct tdm_spec_opts *o, int *parent, int *depth)
{
    int n = 1;
    parent[0] = -1;
    if (depth) depth[0] = 0;
    layout(o, 0, 0, &n, parent, depth);
    return n;
}

/* The draft engine follows a commit of the path fed[0..len-1]: a commit of its last verify when
 * that began with the path, else a verify of the path (no head) and its commit. */
static int draft_engine_follow(struct drafter *d, const int32_t *fed, int len)
{
    if (d->ndver < len || memcmp(d->dver, fed, (size_t)len * sizeof *fed) != 0)
        if (tdm_engine_verify(d->de, fed, len, len, NULL) != 0) return -1;
    d->ndver = 0;
    return tdm_engine_commit(d->de, len);
}

/* ---- the verified model: the CPU reference or the CUDA engine ----
 * Each pass gives the greedy ids of its rows (from..T-1) in gid, and their logits in logits when
 * keep: the CPU reference computes the logits in any case and takes the ids from them with
 * tdm_argmax; the engine chooses the ids on the device (engine.h: the _ids forms) and copies the
 * logits only when keep (4 bytes a row instead of 4V). */

struct target { struct tdm_ref *r; struct tdm_engine *e; int V; };

static int host_ids(const struct target *t, const float *logits, int rows, int32_t *gid)
{
    for (int i = 0; i < rows; i++) gid[i] = (int32_t)tdm_argmax(logits + (size_t)i * t->V, t->V);
    return 0;
}
static int target_forward(struct target *t, const int32_t *ids, int T, int from, int keep, float *logits, int32_t *gid,
                          float *final_h)
{
    if (t->e) return tdm_engine_forward_ids(t->e, ids, T, from, keep ? logits : NULL, gid);
    return tdm_ref_forward(t->r, ids, T, from, logits, NULL, final_h) != 0 ? -1 : host_ids(t, logits, T - from, gid);
}
/* The prompt: on the engine in prefill chunks (tdm_engine_prefill_ids), as tandem-run's plain
 * decode does, so that both start from the same state. */
static int target_prefill(struct target *t, const int32_t *ids, int T, int from, int keep, float *logits, int32_t *gid,
                          float *final_h)
{
    if (t->e) return tdm_engine_prefill_ids(t->e, ids, T, from, keep ? logits : NULL, gid);
    return tdm_ref_forward(t->r, ids, T, from, logits, NULL, final_h) != 0 ? -1 : host_ids(t, logits, T - from, gid);
}
static int target_pos(const struct target *t) { return t->e ? tdm_engine_pos(t->e) : tdm_ref_pos(t->r); }
static int target_verify(struct target *t, const struct drafter *d, int tree, int keep, float *logits, int32_t *gid,
                         float *final_h)
{
    if (!t->e)
        return tdm_ref_verify(t->r, d->ids, d->parent, d->n, tree, logits, final_h) != 0 ? -1 : host_ids(t, logits, d->n, gid);
    float *lg = keep ? logits : NULL;
    return tree ? tdm_engine_verify_tree_ids(t->e, d->ids, d->parent, d->n, 0, lg, gid)
                : tdm_engine_verify_ids(t->e, d->ids, d->n, 0, lg, gid);
}
static int target_commit(struct target *t, const int *path, int len)
{
    return t->e ? tdm_engine_commit_path(t->e, path, len) : tdm_ref_commit(t->r, path, len);
}
/* GDN state traffic so far. */
static struct tdm_ref_stats target_bytes(const struct target *t)
{
    if (!t->e) return *tdm_ref_stats(t->r);
    const struct tdm_engine_round_bytes *b = tdm_engine_round_bytes(t->e);
    return (struct tdm_ref_stats){b->state_read, b->state_written, 0, 0};
}

/* ---- rounds ---- */

static void shape_add(struct tdm_spec_stats *st, int nodes, int tree, double ms)
{
    int i = 0;
    while (i < st->nshapes && !(st->shapes[i].nodes == nodes && st->shapes[i].tree == tree)) i++;
    if (i == st->nshapes) {
        if (i == TDM_SPEC_MAX_SHAPES) return;
        st->nshapes++;
        st->shapes[i].nodes = nodes;
        st->shapes[i].tree = tree;
    }
    st->shapes[i].rounds++;
    st->shapes[i].ms += ms;
}

/* Greedy pick of the e-th emitted token (0-based). TANDEM_SPEC_FAULT=N makes the N-th pick the
 * lowest logit instead, so the exactness gate can be shown to fail. */
static int pick(const struct tdm_spec_opts *o, const float *x, int V, long e)
{
    if (o->fault_at > 0 && e + 1 == o->fault_at) {
        int w = 0;
        for (int i = 1; i < V; i++)
            if (x[i] < x[w]) w = i;
        return w;
    }
    return tdm_argmax(x, V);
}

/* The e-th emitted token from a row: with its logits on the host (keep), pick() on them, as
 * before the ids came from the device; else the row's greedy id (the same token: pick() without
 * a fault is tdm_argmax, the ids' rule). */
static int32_t choose(const struct tdm_spec_opts *o, int keep, const float *row, int32_t id, int V, long e)
{
    return keep ? (int32_t)pick(o, row, V, e) : id;
}

int tdm_spec_generate(const struct tdm_model *m, const struct tdm_spec_opts *o, const int32_t *prompt, int n_prompt,
                      int n_new, int32_t *out, float *out_logits, struct tdm_spec_stats *st)
{
    const struct tdm_config *c = &m->cfg;
    const int V = c->vocab, H = c->hidden;
    memset(st, 0, sizeof *st);
    /* on cuda the engine's, once it is made (below) */
    st->commit = o->backend == TDM_BACKEND_CUDA ? "replayed" : o->defer ? "deferred" : "immediate";
    if (n_prompt < 1) return tdm_errf("speculative decoding needs a prompt of at least one token");
    if (o->kind == TDM_SPEC_MTP && !m->has_mtp) return tdm_errf("%s: --spec mtp: the checkpoint has no MTP layer", m->dir);
    if (o->kind == TDM_SPEC_DRAFT && !o->draft_model) return tdm_errf("--spec draft needs --draft-model DIR");
    if (o->kind == TDM_SPEC_DRAFT && o->draft_model->cfg.vocab != V)
        return tdm_errf("%s: the draft model's vocabulary (%d) differs from the model's (%d)", o->draft_model->dir,
                        o->draft_model->cfg.vocab, V);
    if (!o->tree_depth && (o->draft < 1 || o->draft > MAXN - 1)) return tdm_errf("--draft %d: expected 1 to %d", o->draft, MAXN - 1);
    if (n_new <= 0) return 0;
    const int ctx = n_prompt + n_new + MAXN + 1;
    struct target tg = {NULL, NULL, V};
    /* the logits cross to the host only when they are asked for, or a fault is to be injected */
    const int keep = out_logits != NULL || o->fault_at > 0;
    int32_t gid[MAXN];
    struct drafter d = {.kind = o->kind, .o = o, .V = V, .H = H, .cur = -1};
    float *logits = xmalloc((size_t)MAXN * V * sizeof(float)), *fh = xmalloc((size_t)MAXN * H * sizeof(float));
    const int cuda = o->backend == TDM_BACKEND_CUDA;
    float *ph = o->kind == TDM_SPEC_MTP && !cuda ? xmalloc((size_t)n_prompt * H * sizeof(float)) : NULL;
    int rc = -1;
    if (cuda) {
        if (!(tg.e = tdm_engine_new(m, ctx))) goto done;
        st->commit = tdm_engine_gdn_defer(tg.e) ? "deferred" : "replayed"; /* TANDEM_GDN_DEFER */
        if (o->kind == TDM_SPEC_MTP && tdm_engine_mtp_init(tg.e) != 0) goto done;
        d.me = o->kind == TDM_SPEC_MTP ? tg.e : NULL;
        if (o->kind == TDM_SPEC_DRAFT && !(d.de = tdm_engine_new(o->draft_model, ctx)))
            { tdm_err_prefix("draft model %s", o->draft_model->dir); goto done; }
        rc = -2; /* from here on a failure is a failed CUDA call */
    } else {
        tg.r = d.r = tdm_ref_new(m, ctx);
        tdm_ref_set_defer(tg.r, o->defer);
    }

    /* prefill, chunk by chunk (final-norm outputs kept for the MTP drafter: on the CPU in ph; on the
     * engine each chunk's rows stay on the device until the next pass, so chunks of at most
     * TDM_ENGINE_MAX_ROWS, each fed to the drafter at once — the last one after its token is picked) */
    double t0 = now_ms();
    int last_at = 0;
    /* on the engine, chunks it prefills in one piece, so that the MTP drafter finds each chunk's rows */
    int pc = o->prefill_chunk;
    if (tg.e && pc > tdm_engine_prefill_rows(tg.e)) pc = tdm_engine_prefill_rows(tg.e);
    for (int at = 0; at < n_prompt; at += pc) {
        int T = n_prompt - at < pc ? n_prompt - at : pc;
        if (target_prefill(&tg, prompt + at, T, at + T == n_prompt ? T - 1 : T, keep, logits, gid,
                           ph ? ph + (size_t)at * H : NULL) != 0)
            goto done;
        last_at = at;
        if (d.me && at + T < n_prompt && mtp_engine_feed(&d, at, NULL, prompt + at + 1, T, 0) != 0) goto done;
    }
    st->prefill_ms = now_ms() - t0;
    long e = 0;
    int32_t last = choose(o, keep, logits, gid[0], V, e);
    if (out_logits) memcpy(out_logits, logits, (size_t)V * sizeof(float));
    out[e++] = last;

    double td = now_ms();
    const struct tdm_ref_stats b0 = target_bytes(&tg);
    /* the drafters' start */
    if (o->kind == TDM_SPEC_MTP) {
        d.mh = xmalloc((size_t)MAXN * H * sizeof(float));
        d.mlog = xmalloc((size_t)V * sizeof(float));
        d.root_log = xmalloc((size_t)V * sizeof(float));
        int32_t *next = xmalloc((size_t)n_prompt * sizeof(int32_t));
        memcpy(next, prompt + 1, (size_t)(n_prompt - 1) * sizeof(int32_t));
        next[n_prompt - 1] = last;
        int frc = d.me ? mtp_engine_feed(&d, last_at, NULL, next + last_at, n_prompt - last_at, feed_drafts(o, e, n_new))
                       : mtp_feed_real(&d, 0, next, ph, n_prompt);
        free(next);
        if (frc != 0) goto done;
    } else if (o->kind == TDM_SPEC_NGRAM) {
        hist_add(&d, prompt, n_prompt);
        hist_add(&d, &last, 1);
    } else if (o->kind == TDM_SPEC_DRAFT) {
        d.dlog = xmalloc((size_t)V * sizeof(float));
        if (!d.de) {
            d.dr = tdm_ref_new(o->draft_model, ctx);
            d.snap[0] = tdm_ref_snap_new(d.dr);
        }
        for (int at = 0; at < n_prompt; at += o->prefill_chunk) {
            int T = n_prompt - at < o->prefill_chunk ? n_prompt - at : o->prefill_chunk;
            if ((d.de ? tdm_engine_prefill(d.de, prompt + at, T, T, NULL) : tdm_ref_forward(d.dr, prompt + at, T, T, NULL, NULL, NULL)) != 0)
                goto done;
        }
    }

    while (o->kind == TDM_SPEC_OFF && e < n_new) { /* one token at a time: the plain decode path */
        if (target_forward(&tg, &last, 1, 0, keep, logits, gid, NULL) != 0) goto done;
        last = choose(o, keep, logits, gid[0], V, e);
        if (out_logits) memcpy(out_logits + (size_t)e * V, logits, (size_t)V * sizeof(float));
        out[e++] = last;
    }
    while (e < n_new) {
        double tr = now_ms();
        const int maxdepth = round_depth(o, e, n_new);
        d.n = 1;
        d.ids[0] = last;
        d.parent[0] = -1;
        d.depth[0] = 0;
        d.root_pos = target_pos(&tg);
        d.ndver = 0;
        if (d.dr) {
            tdm_ref_snap_save(d.dr, d.snap[0]);
            for (int i = 0; i <= MAXN; i++) d.snap_owner[i] = -2;
            d.snap_owner[0] = -1;
            d.cur = -1;
        }
        if (build(&d, 0, maxdepth) != 0) goto done;
        const int tree = o->tree_depth > 0;
        if (target_verify(&tg, &d, tree, keep, logits, gid, fh) != 0) goto done;
        /* greedy acceptance: the longest path of argmax tokens, plus the bonus */
        int path[MAXN], len = 1, cur = 0;
        path[0] = 0;
        for (;;) {
            const float *row = logits + (size_t)cur * V;
            int32_t tok = choose(o, keep, row, gid[cur], V, e);
            if (out_logits) memcpy(out_logits + (size_t)e * V, row, (size_t)V * sizeof(float));
            out[e++] = tok;
            last = tok;
            if (e == n_new) break;
            int next = -1;
            for (int t = cur + 1; t < d.n && next < 0; t++)
                if (d.parent[t] == cur && d.ids[t] == tok) next = t;
            if (next < 0) break;
            path[len++] = cur = next;
        }
        if (target_commit(&tg, path, len) != 0) goto done;
        st->rounds++;
        st->accepted += len - 1;
        int seen[MAXN] = {0};
        for (int t = 1; t < d.n; t++) seen[d.depth[t]] = 1;
        for (int dd = 1; dd < MAXN; dd++) st->drafted_at[dd] += seen[dd];
        for (int j = 1; j < len; j++) st->accepted_at[j]++;
        if (e < n_new) {
            /* the drafters follow the commit */
            if (o->kind == TDM_SPEC_MTP) {
                int32_t next[MAXN];
                for (int j = 0; j < len; j++) next[j] = j + 1 < len ? d.ids[path[j + 1]] : last;
                if (d.me) { /* the verify's rows of the path, left in place by the commit */
                    if (mtp_engine_feed(&d, d.root_pos, path, next, len, feed_drafts(o, e, n_new)) != 0) goto done;
                } else {
                    float *hp = xmalloc((size_t)len * H * sizeof(float));
                    for (int j = 0; j < len; j++) memcpy(hp + (size_t)j * H, fh + (size_t)path[j] * H, (size_t)H * sizeof(float));
                    int frc = mtp_feed_real(&d, d.root_pos, next, hp, len);
                    free(hp);
                    if (frc != 0) goto done;
                }
            } else if (o->kind == TDM_SPEC_NGRAM) {
                for (int j = 1; j < len; j++) hist_add(&d, &d.ids[path[j]], 1);
                hist_add(&d, &last, 1);
            } else if (o->kind == TDM_SPEC_DRAFT) {
                int32_t fed[MAXN];
                for (int j = 0; j < len; j++) fed[j] = d.ids[path[j]];
                if (d.de) {
                    if (draft_engine_follow(&d, fed, len) != 0) goto done;
                } else if (tdm_ref_snap_load(d.dr, d.snap[0]) != 0 || tdm_ref_forward(d.dr, fed, len, len, NULL, NULL, NULL) != 0) {
                    goto done;
                }
            }
        }
        shape_add(st, d.n, tree, now_ms() - tr);
    }
    st->decode_ms = now_ms() - td;
    const struct tdm_ref_stats b1 = target_bytes(&tg);
    st->bytes.state_read = b1.state_read - b0.state_read;
    st->bytes.state_written = b1.state_written - b0.state_written;
    st->bytes.factor_read = b1.factor_read - b0.factor_read;
    st->bytes.factor_written = b1.factor_written - b0.factor_written;
    st->state_bytes = tg.e ? (int64_t)tdm_engine_mem(tg.e)->gdn_state : (int64_t)tdm_ref_state_bytes(tg.r);
    rc = 0;
done:
    free(logits); free(fh); free(ph);
    free(d.mh); free(d.mlog); free(d.root_log); free(d.hist); free(d.dlog);
    for (int i = 0; i <= MAXN; i++) tdm_ref_snap_free(d.snap[i]);
    tdm_ref_free(d.dr);
    tdm_ref_free(tg.r);
    tdm_engine_free(d.de);
    tdm_engine_free(tg.e);
    return rc;
}

/* ---- reports ---- */

void tdm_spec_stats_print(FILE *f, const struct tdm_spec_stats *st)
{
    if (!st->rounds) return;
    fprintf(f, "# speculative: %d rounds, %.3f drafted tokens accepted per round (%.3f tokens per round)\n", st->rounds,
            (double)st->accepted / st->rounds, (double)st->accepted / st->rounds + 1.0);
    fprintf(f, "# acceptance by draft depth:");
    for (int dd = 1; dd < MAXN && st->drafted_at[dd]; dd++)
        fprintf(f, " %d:%.3f", dd, (double)st->accepted_at[dd] / (double)st->drafted_at[dd]);
    fprintf(f, "\n");
    for (int i = 0; i < st->nshapes; i++)
        fprintf(f, "# round shape %s of %d nodes: %d rounds, %.3f ms per round\n", st->shapes[i].tree ? "tree" : "chain",
                st->shapes[i].nodes, st->shapes[i].rounds, st->shapes[i].ms / st->shapes[i].rounds);
    fprintf(f,
            "# GDN state traffic (%s commit): %.0f B read, %.0f B written per round (state %.0f B); factors %.0f B "
            "written, %.0f B read per round\n",
            st->commit, (double)st->bytes.state_read / st->rounds,
            (double)st->bytes.state_written / st->rounds, (double)st->state_bytes,
            (double)st->bytes.factor_written / st->rounds, (double)st->bytes.factor_read / st->rounds);
}

json_t *tdm_spec_stats_json(const struct tdm_spec_stats *st)
{
    json_t *acc = json_array(), *shapes = json_array();
    for (int dd = 1; dd < MAXN && st->drafted_at[dd]; dd++)
        json_array_append_new(acc, json_pack("{s:i, s:I, s:I, s:f}", "depth", dd, "drafted", (json_int_t)st->drafted_at[dd],
                                             "accepted", (json_int_t)st->accepted_at[dd],
                                             "rate", (double)st->accepted_at[dd] / (double)st->drafted_at[dd]));
    for (int i = 0; i < st->nshapes; i++)
        json_array_append_new(shapes, json_pack("{s:s, s:i, s:i, s:f}", "shape", st->shapes[i].tree ? "tree" : "chain", "nodes",
                                                st->shapes[i].nodes, "rounds", st->shapes[i].rounds, "ms_per_round",
                                                st->shapes[i].ms / st->shapes[i].rounds));
    int R = st->rounds ? st->rounds : 1;
    return json_pack("{s:i, s:I, s:f, s:o, s:o, s:{s:s, s:I, s:f, s:f, s:f, s:f}}", "rounds", st->rounds, "accepted",
                     (json_int_t)st->accepted, "accepted_per_round", (double)st->accepted / R, "acceptance_by_depth", acc,
                     "round_shapes", shapes, "gdn_state_traffic", "commit", st->commit,
                     "state_bytes", (json_int_t)st->state_bytes, "state_read_per_round",
                     (double)st->bytes.state_read / R, "state_written_per_round", (double)st->bytes.state_written / R,
                     "factor_read_per_round", (double)st->bytes.factor_read / R, "factor_written_per_round",
                     (double)st->bytes.factor_written / R);
}
