/* The CUDA engine's speculative rounds (engine.h: tdm_engine_verify / tdm_engine_verify_tree /
 * tdm_engine_commit / tdm_engine_commit_path; spec.h on the CUDA backend) on the tiny qwen3_5 fixture (TANDEM_FIXTURES/qwen35-tiny), per stored format;
 * skips without a device or the fixture.
 *   rounds against one-token decode: the prompt, then a fixed schedule of (rows R, committed j)
 *     rounds over a token sequence with repeated ids, R from 1 to 32, j from 1 to R, shapes
 *     repeated so that the verify and commit graphs are captured and replayed: every verified
 *     row's logits equal the one-token step's at that position bit for bit (rows past the
 *     committed ones too: they are fed the same tokens), so each round also checks that the
 *     previous commit left the states of one-token decoding; after the last commit a plain step
 *     equals the one-token step; the position advances by j. The same schedule with the deferred
 *     GDN commit (TANDEM_GDN_DEFER, the default) and the replayed one, each graphed and eager
 *     (TANDEM_CUDA_GRAPH=off), gives the same bits, and after the step the state
 *     (tdm_engine_state_hash: KV rows, conv and GDN states) of one-token decode. Greedy ids on the
 *     device (tdm_engine_verify_ids): before each round's verify (but every fourth, so that the
 *     compared verify is the pass right after a commit) an ids-only verify of the same rows (from
 *     row 0, or R/2 in odd rounds; it is replaced by the verify after it) gives the host argmax of
 *     the one-token logits, and the verify with logits and ids gives the host argmax of its own;
 *   the deferred commit's paths, in all four modes: rounds followed by plain steps (the step's graph
 *     captured and replayed) and by verifies, by a prefill chunk of 40 rows (the chunked kernel)
 *     and of 7, and a reset with rows pending, against one-token decode or an engine without rounds,
 *     logits and state bit for bit; the pending count; the round bytes (deferred: the commit moves
 *     no state, the verify after it reads and writes each state once);
 *   plain decode before any round pays nothing for the deferred commit (test_defer_graphs; deferred,
 *     graphed and eager): steps, verifies and tree verifies whose graphs are captured and replayed
 *     before the first deferred commit, then rounds and steps after it (the graphs captured before
 *     dropped, not replayed): one-token decode's bits; no pass takes pending rows up before that
 *     commit (tdm_engine_gdn_taking, tdm_engine_gdn_pend_passes), the expected passes after it, and
 *     after a reset with rows pending;
 *   the round protocol: a commit without a verify, a commit of 0 or R + 1 rows, a verify of 0 or
 *     33 rows, a verify past the context, and a commit after a forward are refused without
 *     changing the position; a refused round leaves the state intact (the next rows still equal
 *     one-token decode);
 *   the MTP drafter on the engine (tdm_engine_mtp), on qwen35-tiny (dense MTP MLP) per format and
 *     qwen3next-tiny in BF16 (MoE MTP MLP): the prompt fed one row at a time (one draft each) gives
 *     the MTP logits of every prompt position: against the CPU reference's tdm_ref_mtp_h relative
 *     error <= 1e-2 (engine_gpu.c's bound for the forward), top-1 equal where the reference's margin
 *     >= 0.25, and against the fixture's mtp_logits (transformers) <= 2e-2 (MoE: a row over the bound
 *     at a routing near tie, margin < 0.0625, of the CPU's main router at its position or MTP router
 *     on its way, is reported and left out, at most one in eight); the prompt in chunks of 32 rows (the way tdm_spec_generate feeds it) and a
 *     chain of 6 drafts: the first row equals the one-row feed's last row bit for bit, the chained
 *     steps' logits are within 1e-2 of the CPU's chain (the CPU fed its own drafts), the drafts equal
 *     the CPU's up to the first CPU near tie (margin < 0.25); the same call again (a rewind over the
 *     drafts' rows) gives the same bits; bad positions, row counts and draft counts, and a drafter
 *     not uploaded, are refused with the position unchanged;
 *   tree rounds: a fixed schedule of trees (1 to 32 nodes; branching 3,2,1, stars, siblings and
 *     back-ups, a chain verify between), random ids a third of which repeat the parent's or the
 *     previous node's, a root-to-node path committed each round (paths 0..j-1 and others): every
 *     node's logits equal the one-token steps along its path on a reference engine fed the same
 *     committed tokens, bit for bit; the position advances by the path; a step after the rounds
 *     equals the reference, and so does the state after it; deferred and replayed commits, graphed
 *     and eager alike; an ids-only verify before each round's verify (but every third)
 *     and the verify's own ids (tdm_engine_verify_ids, tdm_engine_verify_tree_ids) give the host
 *     argmax of the node rows' logits. Bad parents (no root, a parent after its node,
 *     a node its own parent), a tree past the context, bad paths (not from the root, not a child,
 *     too long, empty, rows 0..2 that are no path) and a commit after a forward are refused with the
 *     position unchanged, and a round after them still follows one-token decode;
 *   MTP trees on the engine (test_mtp_tree: tdm_engine_mtp_node, tdm_engine_mtp_path), on the same
 *     fixtures: node calls along a chain give the chain's bits; a 3,2,1 tree's drafts are the CPU
 *     reference's top-b on the same inputs except at near ties (the CPU's b+1 best logits closer than
 *     0.25, or a routing near tie), its logits within 1e-2; graphed = eager; a tree verify's path
 *     fed gathered = its rows one a call; bad calls refused;
 *   tdm_spec_generate on the CUDA backend: mtp chains (1, 4, 31 drafts; a prefill chunk of 5), ngram
 *     chains and draft chains (the model drafting for itself, every draft accepted; another format's
 *     checkpoint as the draft model) give plain CUDA decode's tokens and logits bit for bit, and the
 *     round statistics add up; an mtp chain accepts per depth what the CPU reference's mtp chain
 *     accepts (the drafts are the CPU's unless an MTP near tie flips one: then this fails and the
 *     draft check above shows the margin); mtp trees (3,2,1, 2,2,2,2, 1,1,1, 4,2,1,1 with prefill
 *     chunks of 5), ngram and draft trees give plain CUDA decode's bits too, and mtp trees the CPU
 *     reference's acceptance per depth (unless an MTP near tie reorders a top-b: test_mtp_tree shows
 *     the margins); without logits asked for (the greedy ids path: ids chosen on the device, no
 *     logits copied) plain decode and every case give the same tokens, graphed and eager; the
 *     statistics name the deferred commit and count its traffic (a chain round: each state read once,
 *     written once after the first round); the first case and the trees again with
 *     TANDEM_GDN_DEFER=off: the same tokens and logits, the replayed commit's traffic. */
#include "compare.h"
#include "device.h"
#include "engine.h"
#include "err.h"
#include "model.h"
#include "ref.h"
#include "safetensors.h"
#include "settings.h"
#include "spec.h"
#include "tap.h"
#include "tokens.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "gputest.h"

#define NSEQ 128 /* tokens after the prompt that the rounds and the one-token steps feed */
#define CPU_BOUND 1e-2          /* engine_gpu.c's bounds: against the CPU reference, */
#define FIX_BOUND 2e-2          /* against the fixture (transformers) */
#define CLEAR_MARGIN 0.25f
#define KCHAIN 6                /* chained MTP drafts checked against the CPU's */

/* (rows, committed) of each round: every R and j range, shapes repeated (graphs on the second use) */
static const int schedule[][2] = {{5, 5}, {5, 1}, {5, 3}, {1, 1}, {2, 2}, {5, 2}, {32, 7}, {17, 17}, {8, 4},
                                  {3, 1}, {5, 5}, {1, 1}, {32, 32}, {8, 8}, {5, 4}, {2, 1}, {32, 1}, {1, 1}};
#define NROUNDS ((int)(sizeof schedule / sizeof schedule[0]))

static int same_bits(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof(float)) == 0; }

/* One-token logits of every position after the prompt: one[i] is the step that feeds seq[i];
 * *hash: tdm_engine_state_hash after the first `at` tokens. */
static void one_token(const struct tdm_model *m, const int32_t *prompt, int np, const int32_t *seq, float *one, int at,
                      uint64_t *hash)
{
    struct tdm_engine *e = tdm_engine_new(m, np + NSEQ);
    if (!e) bail("engine");
    if (tdm_engine_forward(e, prompt, np, np, NULL) != 0) bail("prefill");
    const int V = m->cfg.vocab;
    for (int i = 0; i < NSEQ; i++) {
        if (tdm_engine_forward(e, &seq[i], 1, 0, one + (size_t)i * V) != 0) bail("one-token step");
        if (i + 1 == at && tdm_engine_state_hash(e, hash) != 0) bail("tdm_engine_state_hash");
    }
    tdm_engine_free(e);
}

/* The engine switches the runs below flip (read by tdm_engine_new). */
static void set_modes(int defer, int graph)
{
    if (setenv("TANDEM_GDN_DEFER", defer ? "on" : "off", 1) != 0 || setenv("TANDEM_CUDA_GRAPH", graph ? "on" : "off", 1) != 0)
        bail("setenv");
}
static const char *mode_name(int defer, int graph)
{
    static const char *const names[2][2] = {{"replayed commit, eager", "replayed commit, graphed"},
                                            {"deferred commit, eager", "deferred commit, graphed"}};
    return names[defer][graph];
}

/* The schedule of rounds on a fresh engine; returns the rows that differ from one[] (bit for bit),
 * -1 if the position went wrong. *id_bad: greedy ids from the device that differ from the host
 * argmax (of one[] for the ids-only verifies, of the returned logits otherwise), of *id_rows. */
static long rounds(const struct tdm_model *m, const int32_t *prompt, int np, const int32_t *seq, const float *one,
                   float *got, int *verified, long *id_bad, long *id_rows, uint64_t *hash)
{
    const int V = m->cfg.vocab;
    struct tdm_engine *e = tdm_engine_new(m, np + NSEQ);
    if (!e) bail("engine");
    if (tdm_engine_forward(e, prompt, np, np, NULL) != 0) bail("prefill");
    long bad = 0;
    int p = 0;
    int32_t gid[TDM_ENGINE_MAX_ROWS];
    *verified = 0;
    *id_bad = *id_rows = 0;
    for (int k = 0; k < NROUNDS; k++) {
        const int R = schedule[k][0], j = schedule[k][1];
        if (p + R > NSEQ) bail("the schedule outruns the sequence");
        /* the greedy ids path: ids only (the verify below replaces this round); not every fourth
         * round, so that the verify whose logits are compared is the pass right after a commit (a
         * deferred commit's rows applied in its kernels) */
        const int from = k % 2 ? R / 2 : 0;
        if (k % 4 != 1) {
            if (tdm_engine_verify_ids(e, seq + p, R, from, NULL, gid) != 0) bail("tdm_engine_verify_ids, ids only");
            for (int r = from; r < R; r++) *id_bad += gid[r - from] != tdm_argmax(one + (size_t)(p + r) * V, V);
            *id_rows += R - from;
        }
        if ((k % 3 == 2 ? tdm_engine_verify(e, seq + p, R, 0, got) : tdm_engine_verify_ids(e, seq + p, R, 0, got, gid)) != 0)
            bail("tdm_engine_verify");
        for (int r = 0; r < R; r++) bad += !same_bits(got + (size_t)r * V, one + (size_t)(p + r) * V, (size_t)V);
        if (k % 3 != 2) {
            for (int r = 0; r < R; r++) *id_bad += gid[r] != tdm_argmax(got + (size_t)r * V, V);
            *id_rows += R;
        }
        *verified += R;
        if (tdm_engine_commit(e, j) != 0) bail("tdm_engine_commit");
        p += j;
        if (tdm_engine_pos(e) != np + p) { tdm_engine_free(e); return -1; }
    }
    if (tdm_engine_forward(e, seq + p, 1, 0, got) != 0) bail("step after the rounds");
    bad += !same_bits(got, one + (size_t)p * V, (size_t)V);
    ++*verified;
    if (tdm_engine_state_hash(e, hash) != 0) bail("tdm_engine_state_hash");
    tdm_engine_free(e);
    return bad;
}

/* Where the schedule ends: the committed rows, plus the step after the rounds. */
static int rounds_end(void)
{
    int p = 1;
    for (int k = 0; k < NROUNDS; k++) p += schedule[k][1];
    return p;
}

/* The deferred commit's paths (engine.h; TANDEM_GDN_DEFER on and off, graphed and eager), on a
 * fresh engine after the prompt, against one-token decode (one[]) or a reference engine that runs
 * no rounds: rounds followed by a plain step (twice: the step's graph captured and replayed), by a
 * verify (the rows applied in its kernels), by a prefill chunk of 40 rows (the chunked kernel, the
 * rows applied by a launch of their own) and by one of 7 rows (the token-serial kernels), and a
 * reset with rows pending; logits bit for bit, the state (tdm_engine_state_hash) after the prefill
 * chunks, the pending count and the round bytes (deferred: a commit moves no state, the verify
 * after it reads and writes each once; replayed: the commit reads and writes it). */
static void test_defer(const struct tdm_model *m, const char *fmt, const int32_t *prompt, int np, const int32_t *seq,
                       const float *one)
{
    enum { PF = 40, PS = 7 };
    const int V = m->cfg.vocab, ctx = np + NSEQ;
    float *got = hal((size_t)PF * V * 4), *want = hal((size_t)PF * V * 4), *wv = hal((size_t)5 * V * 4);
    float *ws = hal((size_t)PS * V * 4);
    /* the reference: 32 tokens as one forward (one-token bits), a prefill of PF; then a verify of 5
     * rows, 2 of them forwarded, a prefill of PS */
    set_modes(1, 1);
    struct tdm_engine *r = tdm_engine_new(m, ctx);
    uint64_t hw[2];
    if (!r || tdm_engine_forward(r, prompt, np, np, NULL) != 0 || tdm_engine_forward(r, seq, 32, 32, NULL) != 0 ||
        tdm_engine_prefill(r, seq + 32, PF, 0, want) != 0 || tdm_engine_state_hash(r, &hw[0]) != 0 ||
        tdm_engine_verify(r, seq + 72, 5, 0, wv) != 0 || tdm_engine_forward(r, seq + 72, 2, 2, NULL) != 0 ||
        tdm_engine_prefill(r, seq + 74, PS, 0, ws) != 0 || tdm_engine_state_hash(r, &hw[1]) != 0)
        bail("the reference engine");
    tdm_engine_free(r);
    for (int defer = 1; defer >= 0; defer--)
        for (int graph = 1; graph >= 0; graph--) {
            set_modes(defer, graph);
            const char *mode = mode_name(defer, graph);
            struct tdm_engine *e = tdm_engine_new(m, ctx);
            if (!e || tdm_engine_forward(e, prompt, np, np, NULL) != 0) bail("engine");
            const int64_t S = (int64_t)tdm_engine_mem(e)->gdn_state;
            long bad = 0;
            int p = 0, pend_ok = tdm_engine_gdn_defer(e) == defer, bytes_ok = 1;
            struct tdm_engine_round_bytes b0, b1;
#define BYTES_MOVED(rd, wr) (b1 = *tdm_engine_round_bytes(e), bytes_ok &= b1.state_read - b0.state_read == (rd) && \
                             b1.state_written - b0.state_written == (wr), b0 = b1)
            /* rounds of 6 rows, 4 committed, each followed by a plain step */
            for (int i = 0; i < 2; i++) {
                b0 = *tdm_engine_round_bytes(e);
                if (tdm_engine_verify(e, seq + p, 6, 0, got) != 0) bail("verify");
                for (int t = 0; t < 6; t++) bad += !same_bits(got + (size_t)t * V, one + (size_t)(p + t) * V, (size_t)V);
                BYTES_MOVED(S, 0);
                if (tdm_engine_commit(e, 4) != 0) bail("commit");
                BYTES_MOVED(defer ? 0 : S, defer ? 0 : S);
                pend_ok &= tdm_engine_gdn_pending(e) == (defer ? 4 : 0);
                p += 4;
                if (tdm_engine_forward(e, seq + p, 1, 0, got) != 0) bail("step");
                bad += !same_bits(got, one + (size_t)p * V, (size_t)V);
                pend_ok &= tdm_engine_gdn_pending(e) == 0;
                p += 1;
            }
            /* rounds of 8 committed whole, each followed by a verify of 3 (the pass right after the
             * commit), committed whole */
            for (int i = 0; i < 2; i++) {
                if (tdm_engine_verify(e, seq + p, 8, 0, got) != 0 || tdm_engine_commit(e, 8) != 0) bail("round");
                for (int t = 0; t < 8; t++) bad += !same_bits(got + (size_t)t * V, one + (size_t)(p + t) * V, (size_t)V);
                p += 8;
                b0 = *tdm_engine_round_bytes(e);
                if (tdm_engine_verify(e, seq + p, 3, 0, got) != 0) bail("verify after a commit");
                BYTES_MOVED(S, defer ? S : 0);
                for (int t = 0; t < 3; t++) bad += !same_bits(got + (size_t)t * V, one + (size_t)(p + t) * V, (size_t)V);
                if (tdm_engine_commit(e, 3) != 0) bail("commit");
                p += 3;
            }
#undef BYTES_MOVED
            if (p != 32) bail("the schedule of test_defer");
            ok(bad == 0 && tdm_engine_pos(e) == np + p,
               "%s %s: rounds followed by plain steps and by verifies: %ld rows differ from one-token decode (bit for bit)",
               fmt, mode, bad);
            ok(pend_ok, "%s %s: the engine says %s; a commit leaves %s rows pending, the next pass none", fmt, mode,
               defer ? "deferred" : "replayed", defer ? "its" : "no");
            ok(bytes_ok, "%s %s: state bytes: a verify reads each GDN state once and writes it %s; a commit %s", fmt, mode,
               defer ? "once when rows are pending, else not" : "never",
               defer ? "moves none" : "reads and writes each once");
            /* a prefill chunk of PF rows right after a commit (p = 32: the commit of 3 above) */
            uint64_t h;
            if (tdm_engine_prefill(e, seq + p, PF, 0, got) != 0 || tdm_engine_state_hash(e, &h) != 0) bail("prefill chunk");
            ok(same_bits(got, want, (size_t)PF * V) && h == hw[0],
               "%s %s: a prefill chunk of %d rows right after a commit: the logits and state of the same chunk after the "
               "same tokens fed as a forward, bit for bit", fmt, mode, PF);
            p += PF;
            if (tdm_engine_verify(e, seq + p, 5, 0, got) != 0) bail("verify");
            int same = same_bits(got, wv, (size_t)5 * V);
            if (tdm_engine_commit(e, 2) != 0 || tdm_engine_prefill(e, seq + p + 2, PS, 0, got) != 0 ||
                tdm_engine_state_hash(e, &h) != 0)
                bail("prefill after a round");
            ok(same && same_bits(got, ws, (size_t)PS * V) && h == hw[1],
               "%s %s: after the chunk, a round (5 rows, 2 committed) and a prefill chunk of %d rows: the logits and state "
               "of a verify and a forward of the 2 rows, bit for bit", fmt, mode, PS);
            p += 2 + PS;
            /* a reset with rows pending */
            if (tdm_engine_verify(e, seq + p, 4, 0, got) != 0 || tdm_engine_commit(e, 3) != 0) bail("round before the reset");
            const int pending = tdm_engine_gdn_pending(e);
            if (tdm_engine_reset(e) != 0 || tdm_engine_forward(e, prompt, np, np, NULL) != 0 ||
                tdm_engine_forward(e, seq, 1, 0, got) != 0)
                bail("reset");
            ok(pending == (defer ? 3 : 0) && tdm_engine_gdn_pending(e) == 0 && same_bits(got, one, (size_t)V) &&
               tdm_engine_pos(e) == np + 1,
               "%s %s: a reset with %d rows pending drops them: the prompt and a step after it give one-token decode's bits",
               fmt, mode, pending);
            tdm_engine_free(e);
        }
    set_modes(1, 1);
    free(got); free(want); free(wv); free(ws);
}

/* Plain decode before any round pays nothing for the deferred commit (engine.c, take_pending):
 * until the engine's first deferred commit with rows no pass takes pending rows up
 * (tdm_engine_gdn_taking 0, tdm_engine_gdn_pend_passes 0), and that commit drops the graphs
 * captured without the pending launches (start_taking). Deferred, graphed and eager, on a fresh
 * engine after the prompt: plain steps (graphed: the step's graph captured and replayed), chain
 * verifies of 6 rows and tree verifies of a 6-node chain, not committed (their graphs captured and
 * replayed), then a round committing 4; then steps, chain rounds and tree rounds (4 of 6 committed)
 * and a step, each pass right after a commit or a step: a graph of the same shape captured before
 * the round, replayed, would leave the pending rows out. Every row against one-token decode (one[])
 * bit for bit; the passes that took pending rows up counted; a reset keeps the engine taking them
 * up and drops the rows. */
static void test_defer_graphs(const struct tdm_model *m, const char *fmt, const int32_t *prompt, int np,
                              const int32_t *seq, const float *one)
{
    enum { R = 6, J = 4 };
    const int V = m->cfg.vocab;
    const int chain[R] = {-1, 0, 1, 2, 3, 4}, path[J] = {0, 1, 2, 3};
    float *got = hal((size_t)R * V * 4);
    for (int graph = 1; graph >= 0; graph--) {
        set_modes(1, graph);
        const char *mode = mode_name(1, graph);
        struct tdm_engine *e = tdm_engine_new(m, np + NSEQ);
        if (!e || tdm_engine_forward(e, prompt, np, np, NULL) != 0) bail("engine");
        long bad = 0;
        int p = 0;
#define STEP() (tdm_engine_forward(e, seq + p, 1, 0, got) != 0 ? bail("step") : (void)0, \
                bad += !same_bits(got, one + (size_t)p * V, (size_t)V), p++)
#define ROWS_OK() for (int t = 0; t < R; t++) bad += !same_bits(got + (size_t)t * V, one + (size_t)(p + t) * V, (size_t)V)
        /* before any round: 4 steps (graphed: eager, captured, replayed twice), 2 verifies and 2
         * tree verifies of the same rows (the second of each captured), not committed */
        for (int i = 0; i < 4; i++) STEP();
        for (int i = 0; i < 2; i++) {
            if (tdm_engine_verify(e, seq + p, R, 0, got) != 0) bail("verify before a round");
            ROWS_OK();
        }
        for (int i = 0; i < 2; i++) {
            if (tdm_engine_verify_tree(e, seq + p, chain, R, 0, got) != 0) bail("tree verify before a round");
            ROWS_OK();
        }
        /* the first round (graphed: its verify replays the graph captured above) */
        if (tdm_engine_verify(e, seq + p, R, 0, got) != 0) bail("verify");
        ROWS_OK();
        const int taking0 = tdm_engine_gdn_taking(e);
        const long passes0 = tdm_engine_gdn_pend_passes(e);
        if (tdm_engine_commit(e, J) != 0) bail("commit");
        p += J;
        const int taking1 = tdm_engine_gdn_taking(e), pending1 = tdm_engine_gdn_pending(e);
        ok(taking0 == 0 && passes0 == 0 && taking1 == 1 && pending1 == J,
           "%s %s: before the first deferred commit no pass takes pending rows up (taking %d, %ld passes), after it "
           "the engine does (taking %d, %d rows pending)", fmt, mode, taking0, passes0, taking1, pending1);
        /* after it: 3 steps (the first right after the commit; graphed: eager, captured, replayed),
         * 3 chain rounds and 3 tree rounds (graphed: eager, captured, replayed), a step (graphed:
         * replayed right after a commit) */
        for (int i = 0; i < 3; i++) STEP();
        for (int i = 0; i < 3; i++) {
            if (tdm_engine_verify(e, seq + p, R, 0, got) != 0) bail("verify after the first round");
            ROWS_OK();
            if (tdm_engine_commit(e, J) != 0) bail("commit");
            p += J;
        }
        for (int i = 0; i < 3; i++) {
            if (tdm_engine_verify_tree(e, seq + p, chain, R, 0, got) != 0) bail("tree verify after the first round");
            ROWS_OK();
            if (tdm_engine_commit_path(e, path, J) != 0) bail("tree commit");
            p += J;
        }
        STEP();
        /* the passes that took rows up: graphed, every one since the commit but the first verify
         * (eager, right after a step: none pending) — 3 steps, 2 verifies, 3 tree verifies, a step;
         * eager, those with rows pending — the first step, 2 verifies, 3 tree verifies, the step */
        const long passes = tdm_engine_gdn_pend_passes(e), want = graph ? 9 : 7;
        ok(bad == 0 && tdm_engine_pos(e) == np + p && passes == want,
           "%s %s: plain steps, verifies and tree verifies before the first round (graphs captured and replayed), "
           "then rounds and steps: %ld rows differ from one-token decode (bit for bit); %ld passes took pending rows up "
           "(%ld expected: graphed, every step and verify graph captured since the commit)", fmt, mode, bad, passes, want);
        /* a reset with rows pending: still taking, the rows dropped */
        if (tdm_engine_verify(e, seq + p, R, 0, got) != 0 || tdm_engine_commit(e, J) != 0) bail("round before the reset");
        const long passes2 = tdm_engine_gdn_pend_passes(e);
        if (tdm_engine_reset(e) != 0 || tdm_engine_forward(e, prompt, np, np, NULL) != 0) bail("reset");
        p = 0;
        bad = 0;
        STEP();
        STEP();
        ok(bad == 0 && tdm_engine_gdn_taking(e) == 1 && tdm_engine_gdn_pending(e) == 0 &&
           tdm_engine_gdn_pend_passes(e) - passes2 == (graph ? 2 : 0),
           "%s %s: after a reset with rows pending the engine still takes them up (graphed steps: the step's graph, "
           "captured since the first commit) and there are none: the prompt and 2 steps give one-token decode's bits",
           fmt, mode);
#undef STEP
#undef ROWS_OK
        tdm_engine_free(e);
    }
    set_modes(1, 1);
    free(got);
}

static void test_rounds(const struct tdm_model *m, const char *fmt, const int32_t *prompt, int np)
{
    const int V = m->cfg.vocab;
    int32_t seq[NSEQ];
    for (int i = 0; i < NSEQ; i++) seq[i] = i % 7 == 3 ? seq[i - 3] : (int32_t)(next() % (uint64_t)V); /* repeated ids */
    float *one = hal((size_t)NSEQ * V * 4), *got = hal((size_t)TDM_ENGINE_MAX_ROWS * V * 4);
    uint64_t h1, hr;
    one_token(m, prompt, np, seq, one, rounds_end(), &h1);
    int n;
    long id_bad, id_rows;
    /* deferred (the default) and replayed commits, graphed and eager: every run against one-token
     * decode, so all four give the same logits; and the same state (hash) as one-token decode at
     * the end */
    for (int defer = 1; defer >= 0; defer--)
        for (int graph = 1; graph >= 0; graph--) {
            set_modes(defer, graph);
            long bad = rounds(m, prompt, np, seq, one, got, &n, &id_bad, &id_rows, &hr);
            ok(bad == 0, "%s: %d rounds of 1..32 rows, 1..R committed (%s): %ld of %d verified rows differ from one-token "
               "decode (bit for bit), the position advances by the committed rows", fmt, NROUNDS, mode_name(defer, graph),
               bad, n);
            ok(id_bad == 0, "%s: the rounds' greedy ids on the device (%s; ids-only verifies and verifies with logits): "
               "%ld of %ld differ from the host argmax", fmt, mode_name(defer, graph), id_bad, id_rows);
            ok(hr == h1, "%s: after the rounds and a step (%s): the state (KV rows, conv and GDN states) is one-token "
               "decode's bit for bit (hash %016llx, one-token %016llx)", fmt, mode_name(defer, graph),
               (unsigned long long)hr, (unsigned long long)h1);
        }
    set_modes(1, 1);
    test_defer(m, fmt, prompt, np, seq, one);
    test_defer_graphs(m, fmt, prompt, np, seq, one);

    /* the protocol */
    struct tdm_engine *e = tdm_engine_new(m, np + 8);
    if (!e) bail("engine");
    if (tdm_engine_forward(e, prompt, np, np, NULL) != 0) bail("prefill");
    const int pos = tdm_engine_pos(e);
    int refused = 0, cases = 0;
#define REFUSED(call) (cases++, refused += (call) != 0 && tdm_engine_pos(e) == pos)
    REFUSED(tdm_engine_commit(e, 1));                         /* no round */
    REFUSED(tdm_engine_verify(e, seq, 0, 0, got));
    REFUSED(tdm_engine_verify(e, seq, TDM_ENGINE_MAX_ROWS + 1, 0, got));
    REFUSED(tdm_engine_verify(e, seq, 9, 0, got));            /* np + 9 > ctx */
    if (tdm_engine_verify(e, seq, 4, 0, got) != 0) bail("verify");
    REFUSED(tdm_engine_commit(e, 0));
    REFUSED(tdm_engine_commit(e, 5));
    if (tdm_engine_verify(e, seq, 3, 0, got) != 0) bail("verify");
    int32_t other = seq[1];
    if (tdm_engine_forward(e, &seq[0], 1, 0, got) != 0) bail("forward");
    cases++;
    refused += tdm_engine_commit(e, 1) != 0 && tdm_engine_pos(e) == pos + 1; /* the forward dropped the round */
#undef REFUSED
    ok(refused == cases, "%s: %d of %d bad calls refused with the position unchanged (last: \"%s\")", fmt, refused, cases,
       tdm_err());
    /* after all that, the next rows still follow one-token decode */
    if (tdm_engine_verify(e, &other, 1, 0, got) != 0 || tdm_engine_commit(e, 1) != 0 ||
        tdm_engine_forward(e, &seq[2], 1, 0, got + V) != 0)
        bail("round after the refusals");
    ok(same_bits(got, one + (size_t)1 * V, (size_t)V) && same_bits(got + V, one + (size_t)2 * V, (size_t)V),
       "%s: after the refused calls, a round and a step give one-token decode's bits", fmt);
    tdm_engine_free(e);
    free(one);
    free(got);
}

/* ---- the MTP drafter ---- */

/* A fixture checkpoint fix/model/fmt that has an MTP layer, and its prompt of at least two tokens
 * (bails otherwise); lab becomes "model/fmt what". */
static struct tdm_model *mtp_fixture(const char *fix, const char *model, const char *fmt, const char *what, char *lab,
                                     size_t nlab, int32_t **prompt, int *np)
{
    char dir[4096], path[4096];
    snprintf(dir, sizeof dir, "%s/%s/%s", fix, model, fmt);
    snprintf(lab, nlab, "%s/%s %s", model, fmt, what);
    struct tdm_model *m = tdm_model_load(dir);
    if (!m) bail("model");
    if (!m->has_mtp) bail("the fixture has no MTP layer");
    snprintf(path, sizeof path, "%s/%s/prompt.tok", fix, model);
    if (tdm_tokens_read(path, m->cfg.vocab, 0, prompt, np) != 0 || *np < 2) bail("prompt");
    return m;
}

static void test_mtp(const char *fix, const char *model, const char *fmt)
{
    char path[4096], lab[160];
    int32_t *prompt;
    int np;
    struct tdm_model *m = mtp_fixture(fix, model, fmt, "MTP", lab, sizeof lab, &prompt, &np);
    const int V = m->cfg.vocab, H = m->cfg.hidden;
    snprintf(path, sizeof path, "%s/%s/ref-%s.safetensors", fix, model, fmt);
    struct tdm_stfile *rf = tdm_st_open(path);
    if (!rf) bail("fixture");
    const struct tdm_tensor *ft = tdm_st_find(rf, "mtp_logits");
    if (!ft || ft->dtype != TDM_DT_F32 || ft->ndim != 2 || ft->shape[0] != np - 1 || ft->shape[1] != V)
        bail("fixture tensor mtp_logits [prompt - 1][V] F32");
    const float *fm = ft->data;
    const int ctx = np + 2 * KCHAIN + 8;

    /* the CPU reference: the prompt's final-norm rows, the MTP over every prompt row (the last one
     * takes the greedy token after the prompt), then KCHAIN drafts chained on its own argmax */
    struct tdm_ref *r = tdm_ref_new(m, ctx);
    float *ph = hal((size_t)np * H * 4), *lg = hal((size_t)V * 4), *cm = hal((size_t)np * V * 4);
    float *mh = hal((size_t)np * H * 4), *oh = hal((size_t)H * 4), *cc = hal((size_t)KCHAIN * V * 4);
    int32_t *next = hal((size_t)np * 4), cd[KCHAIN];
    if (tdm_ref_forward(r, prompt, np, np - 1, lg, NULL, ph) != 0) bail("reference forward");
    for (int i = 0; i + 1 < np; i++) next[i] = prompt[i + 1];
    next[np - 1] = tdm_argmax(lg, V);
    if (tdm_ref_mtp_h(r, next, ph, np, cm, mh) != 0) bail("reference MTP");
    memcpy(cc, cm + (size_t)(np - 1) * V, (size_t)V * 4);
    memcpy(oh, mh + (size_t)(np - 1) * H, (size_t)H * 4);
    for (int j = 0; j < KCHAIN; j++) {
        cd[j] = tdm_argmax(cc + (size_t)j * V, V);
        if (j + 1 < KCHAIN && tdm_ref_mtp_h(r, &cd[j], oh, 1, cc + (size_t)(j + 1) * V, oh) != 0) bail("reference MTP chain");
    }
    /* the routing margins a row depends on (+inf without MoE): row i of the prompt, the main model's
     * at position i and the MTP's at i; chain row j also the MTP's at the chain's earlier steps */
    float *gaps = hal((size_t)ctx * sizeof *gaps);
    const float *g0 = tdm_ref_router_gaps(r, 0), *g1m = tdm_ref_router_gaps(r, 1);
    for (int i = 0; i < np; i++) gaps[i] = fminf(g0[i], g1m[i]);
    for (int j = 1; j < KCHAIN; j++) gaps[np - 1 + j] = fminf(gaps[np - 2 + j], g1m[np - 1 + j]);
    tdm_ref_free(r);

    struct tdm_engine *e = tdm_engine_new(m, ctx);
    if (!e) bail("engine");
    int32_t d1;
    ok(tdm_engine_mtp(e, 0, next, 1, 1, &d1, NULL) == -1 && strstr(tdm_err(), "not on the device"),
       "%s: the drafter before tdm_engine_mtp_init refused (%s)", lab, tdm_err());
    if (tdm_engine_mtp_init(e) != 0) bail("tdm_engine_mtp_init");

    /* one row at a time: the MTP logits of every prompt position */
    float *g1 = hal((size_t)np * V * 4);
    for (int i = 0; i < np; i++)
        if (tdm_engine_forward(e, &prompt[i], 1, 1, NULL) != 0 || tdm_engine_mtp(e, i, &next[i], 1, 1, &d1, g1 + (size_t)i * V) != 0)
            bail("one-row MTP feed");
    int *skip = hal((size_t)np * sizeof *skip), nskip, nclear = 0, differ = 0;
    char what[240];
    snprintf(what, sizeof what, "%s vs the CPU reference", lab);
    double ec = rel_err_excused(what, g1, cm, np, V, gaps, CPU_BOUND, skip, &nskip);
    for (int i = 0; i < np; i++) {
        if (skip[i] || tdm_margin(cm + (size_t)i * V, V) < CLEAR_MARGIN) continue;
        nclear++;
        differ += tdm_argmax(g1 + (size_t)i * V, V) != tdm_argmax(cm + (size_t)i * V, V);
    }
    /* The MTP layer routes (qwen3_next) on a hidden state that has been through the whole forward's
     * rounding, so more of its rows sit at routing near ties than the main model's: a quarter of the
     * rows may be excused here (the main model's tests allow an eighth). */
    int ntie = 0;
    for (int i = 0; i < np; i++) ntie += gaps[i] < TDM_ROUTER_NEAR_TIE;
    ok(ec <= CPU_BOUND && nskip * 4 <= np, "%s: logits of the %d prompt positions (one row a call) vs the CPU reference: "
       "relative error %.2e <= %.0e (%d rows excused at routing near ties; %d rows at near ties)", lab, np, ec, CPU_BOUND,
       nskip, ntie);
    ok(differ == 0, "%s: top-1 equal to the CPU reference's on the %d rows with margin >= %.2f (%d differ)", lab, nclear,
       CLEAR_MARGIN, differ);
    snprintf(what, sizeof what, "%s vs the fixture", lab);
    double ef = rel_err_excused(what, g1, fm, np - 1, V, gaps, FIX_BOUND, skip, &nskip);
    ok(ef <= FIX_BOUND && nskip * 8 <= np - 1, "%s: logits of positions 0..%d vs the fixture's mtp_logits: relative error "
       "%.2e <= %.0e (%d rows excused at routing near ties)", lab, np - 2, ef, FIX_BOUND, nskip);

    /* the prompt in chunks of 32 rows, then a chain of KCHAIN drafts */
    if (tdm_engine_reset(e) != 0) bail("reset");
    int last_at = 0;
    for (int at = 0; at < np; at += TDM_ENGINE_MAX_ROWS) {
        const int T = np - at < TDM_ENGINE_MAX_ROWS ? np - at : TDM_ENGINE_MAX_ROWS;
        if (tdm_engine_forward(e, prompt + at, T, T, NULL) != 0) bail("prefill chunk");
        last_at = at;
        if (at + T < np && tdm_engine_mtp(e, at, next + at, T, 0, NULL, NULL) != 0) bail("chunk MTP feed");
    }
    const int TL = np - last_at;
    int32_t gd[KCHAIN], gd2[KCHAIN];
    float *gc = hal((size_t)KCHAIN * V * 4), *gc2 = hal((size_t)KCHAIN * V * 4);
    if (tdm_engine_mtp(e, last_at, next + last_at, TL, KCHAIN, gd, gc) != 0) bail("chained MTP");
    ok(memcmp(gc, g1 + (size_t)(np - 1) * V, (size_t)V * 4) == 0 && gd[0] == tdm_argmax(gc, V) &&
       tdm_engine_mtp_pos(e) == np + KCHAIN - 1,
       "%s: the prompt in chunks of %d: the last row's logits equal the one-row feed's bit for bit, draft 0 is their "
       "argmax, position %d = prompt + drafts - 1", lab, TDM_ENGINE_MAX_ROWS, tdm_engine_mtp_pos(e));
    int div = -1;
    for (int j = 0; j < KCHAIN && div < 0; j++)
        if (gd[j] != cd[j]) div = j;
    const int cmp_rows = div < 0 ? KCHAIN : div + 1; /* row j takes draft j-1: the same inputs up to the first difference */
    snprintf(what, sizeof what, "%s chain vs the CPU reference", lab);
    double ech = rel_err_excused(what, gc, cc, cmp_rows, V, gaps + np - 1, CPU_BOUND, skip, &nskip);
    /* a chained row takes the previous row's hidden state, so a routing near tie at one row is inherited
     * by every later one (gaps[] is the running minimum): excused rows may be the whole tail after the
     * first near tie (rel_err_excused excuses no row before it), as long as one row is compared, or the
     * first row is itself at a near tie (then every row may be: on qwen3next-tiny/bf16 the last prompt
     * position routes at a margin of 0.039, and its MTP logits are 0.9-1.1e-2 from the CPU's, on either
     * side of the bound with the RMS norm's sum order; the prompt positions' test above compares the
     * rows clear of near ties) */
    int first_tie = cmp_rows;
    for (int j = cmp_rows - 1; j >= 0; j--)
        if (gaps[np - 1 + j] < TDM_ROUTER_NEAR_TIE) first_tie = j;
    ok(ech <= CPU_BOUND && (nskip < cmp_rows || first_tie == 0),
       "%s: %d chained draft rows vs the CPU reference's chain: relative error %.2e <= %.0e (%d rows excused at routing "
       "near ties, the first near tie at row %d)", lab, cmp_rows, ech, CPU_BOUND, nskip, first_tie);
    ok(div < 0 || tdm_margin(cc + (size_t)div * V, V) < CLEAR_MARGIN,
       "%s: drafts equal the CPU's (%d of %d%s%.4f)", lab, div < 0 ? KCHAIN : div, KCHAIN,
       div < 0 ? "; smallest CPU margin " : "; the first difference at a CPU margin of ",
       div < 0 ? (double)tdm_margin(cc, V) : (double)tdm_margin(cc + (size_t)div * V, V));
    /* graphs (TANDEM_CUDA_GRAPH on): a call shape runs eager on its first use, is captured on its
     * second and replayed after, with the positions from device memory */
    const int graphs = strcmp(tdm_setting("TANDEM_CUDA_GRAPH"), "off") != 0;
    int same = 1;
    for (int run = 0; run < 2; run++) {
        if (tdm_engine_mtp(e, last_at, next + last_at, TL, KCHAIN, gd2, gc2) != 0) bail("chained MTP again");
        same &= memcmp(gd, gd2, sizeof gd) == 0 && memcmp(gc, gc2, (size_t)KCHAIN * V * 4) == 0;
    }
    ok(same, "%s: the same feed and chain after a rewind over the drafts' rows, twice more: the same bits (%s)", lab,
       graphs ? "the first call eager, the second captured and replayed, the third replayed" : "eager, graphs off");
    /* refusals */
    const int mpos = tdm_engine_mtp_pos(e);
    int refused = 0, cases = 0;
#define REFUSED(call) (cases++, refused += (call) != 0 && tdm_engine_mtp_pos(e) == mpos)
    REFUSED(tdm_engine_mtp(e, mpos + 1, next, 1, 0, NULL, NULL));                 /* past the rows fed */
    REFUSED(tdm_engine_mtp(e, last_at, next + last_at, TL + 1, 0, NULL, NULL));   /* more rows than the last chunk */
    REFUSED(tdm_engine_mtp(e, last_at, next + last_at, 0, 1, gd2, NULL));
    int32_t big[TDM_ENGINE_MAX_ROWS];
    REFUSED(tdm_engine_mtp(e, last_at, next + last_at, TL, TDM_ENGINE_MAX_ROWS, big, NULL));
    REFUSED(tdm_engine_mtp(e, last_at, next + last_at, TL, 2, NULL, NULL));       /* drafts and nowhere to put them */
    REFUSED(tdm_engine_mtp(e, last_at, next + last_at, TL, TDM_ENGINE_MAX_ROWS - 1, big, NULL)); /* past the context */
    int32_t badid = V;
    REFUSED(tdm_engine_mtp(e, last_at, &badid, 1, 0, NULL, NULL));
#undef REFUSED
    ok(refused == cases, "%s: %d of %d bad calls refused with the position unchanged (last: \"%s\")", lab, refused, cases,
       tdm_err());

    /* a one-row call at position 0: the loop above ran it eager (its shape's first use) and
     * graphed at every later position; now graphed at position 0 */
    if (tdm_engine_reset(e) != 0 || tdm_engine_forward(e, &prompt[0], 1, 1, NULL) != 0 ||
        tdm_engine_mtp(e, 0, &next[0], 1, 1, &d1, gc2) != 0)
        bail("one-row MTP call at position 0 again");
    ok(memcmp(gc2, g1, (size_t)V * 4) == 0, "%s: a one-row call at position 0 %s: the first call's bits", lab,
       graphs ? "replayed from its graph" : "again");

    tdm_engine_free(e);
    free(ph); free(lg); free(cm); free(mh); free(oh); free(cc); free(next); free(gaps); free(g1); free(skip);
    free(gc); free(gc2); free(prompt);
    tdm_st_close(rf);
    tdm_model_free(m);
}

/* ---- MTP trees on the engine (tdm_engine_mtp_node, tdm_engine_mtp_path) ---- */

#define MTP_TREE "3,2,1" /* the tree test_mtp_tree drafts: 16 nodes, 10 of them drafting */

/* The prompt on the engine in chunks of 32 rows, each chunk's rows fed to the MTP drafter as they
 * come (as tdm_spec_generate feeds them), the last chunk with one draft: root_draft and root_logits
 * [V] are the prompt's last MTP row's, whose output is slot 0. Returns the last chunk's first row. */
static int engine_prompt(struct tdm_engine *e, const int32_t *prompt, int np, const int32_t *next, int32_t *root_draft,
                         float *root_logits)
{
    if (tdm_engine_reset(e) != 0) bail("reset");
    int last_at = 0;
    for (int at = 0; at < np; at += TDM_ENGINE_MAX_ROWS) {
        const int T = np - at < TDM_ENGINE_MAX_ROWS ? np - at : TDM_ENGINE_MAX_ROWS, last = at + T == np;
        if (tdm_engine_forward(e, prompt + at, T, T, NULL) != 0 ||
            tdm_engine_mtp(e, at, next + at, T, last, root_draft, last ? root_logits : NULL) != 0)
            bail("the prompt and its MTP rows");
        last_at = at;
    }
    return last_at;
}

/* The children of node t: their count, their indices in kids. */
static int children(const int *parent, int n, int t, int *kids)
{
    int b = 0;
    for (int c = t + 1; c < n; c++)
        if (parent[c] == t) kids[b++] = c;
    return b;
}

/* The tree (parent, depth: tdm_spec_tree_layout's, n nodes) drafted on the engine as spec.c's
 * expand drafts it, after engine_prompt (lg row 0 its root logits): in depth-first order each node
 * t with children takes its row of MTP logits (t > 0: tdm_engine_mtp_node at position np - 1 +
 * depth, fed ids[t] and its parent's slot, its output in slot t; lg row t, the device's argmax in
 * top1[t]) and gives its children its top-b (tdm_topk). ids[0] given, the others out. */
static void engine_tree(struct tdm_engine *e, int np, const int *parent, const int *depth, int n, int32_t *ids, float *lg,
                        int32_t *top1, int V)
{
    for (int t = 0; t < n; t++) {
        int kids[TDM_SPEC_MAX_NODES];
        const int b = children(parent, n, t, kids);
        top1[t] = -1;
        if (!b) continue;
        if (t > 0 && tdm_engine_mtp_node(e, np - 1 + depth[t], ids[t], parent[t], t, &top1[t], lg + (size_t)t * V) != 0)
            bail("tdm_engine_mtp_node");
        int32_t top[TDM_SPEC_MAX_NODES];
        tdm_topk(lg + (size_t)t * V, V, b, top);
        for (int i = 0; i < b; i++) ids[kids[i]] = top[i];
    }
}

/* MTP trees on the engine, on one fixture checkpoint:
 *   a chain of tree nodes (each node the previous one's argmax, its parent the previous slot) gives
 *     the drafts and logits of tdm_engine_mtp's chain bit for bit, twice (the node graph captured,
 *     then replayed);
 *   the tree MTP_TREE drafted on the engine as expand does (engine_tree) against the CPU reference
 *     fed the same tokens at the same positions in the same order (tdm_ref_mtp_rewind /
 *     tdm_ref_mtp_h with each parent's output): each drafting node's logits within CPU_BOUND
 *     relative error, its top-b (the children's ids, in order) the CPU's top-b except where the CPU's
 *     b+1 best logits have two neighbours closer than CLEAR_MARGIN (a near tie: reported with the
 *     gap) or the row sits at a routing near tie (MoE); each node's device argmax the host argmax of
 *     its logits; the same tree graphed twice and eager (TANDEM_CUDA_GRAPH=off): the same bits;
 *   tdm_engine_mtp_path after a tree verify and the commit of a path that is not rows 0..: the
 *     drafts and logits of the path's rows fed one row a call (tdm_engine_mtp_at), bit for bit, and
 *     again (its graph); a node on its slot 0 gives its chain's second draft row;
 *   bad node calls (slots outside 0..TDM_ENGINE_MTP_SLOTS-1, a parent slot not written since the
 *     reset, a position past the rows fed, an id outside the vocabulary) and bad paths (not
 *     increasing, past the verify's rows) are refused with the position unchanged. */
static void test_mtp_tree(const char *fix, const char *model, const char *fmt)
{
    char lab[160];
    int32_t *prompt;
    int np;
    struct tdm_model *m = mtp_fixture(fix, model, fmt, "MTP tree", lab, sizeof lab, &prompt, &np);
    const int V = m->cfg.vocab, H = m->cfg.hidden;
    struct tdm_spec_opts so;
    if (tdm_spec_opts_init(&so) != 0 || tdm_spec_parse_tree(MTP_TREE, &so) != 0) bail("tree");
    int parent[TDM_SPEC_MAX_NODES], depth[TDM_SPEC_MAX_NODES];
    const int n = tdm_spec_tree_layout(&so, parent, depth);
    const int ctx = np + KCHAIN + 8;

    /* the CPU reference: the prompt and its MTP rows (the last one takes the greedy token after it) */
    struct tdm_ref *r = tdm_ref_new(m, ctx);
    float *ph = hal((size_t)np * H * 4), *cm = hal((size_t)np * V * 4), *mh = hal((size_t)np * H * 4);
    int32_t *next = hal((size_t)np * 4);
    if (tdm_ref_forward(r, prompt, np, np - 1, cm, NULL, ph) != 0) bail("reference forward");
    for (int i = 0; i + 1 < np; i++) next[i] = prompt[i + 1];
    next[np - 1] = tdm_argmax(cm, V);
    if (tdm_ref_mtp_h(r, next, ph, np, cm, mh) != 0) bail("reference MTP");
    const float root_gap = fminf(tdm_ref_router_gaps(r, 0)[np - 1], tdm_ref_router_gaps(r, 1)[np - 1]);

    struct tdm_engine *e = tdm_engine_new(m, ctx);
    if (!e || tdm_engine_mtp_init(e) != 0) bail("engine");

    /* a chain of nodes against tdm_engine_mtp's chain */
    int32_t gd[KCHAIN], nd[KCHAIN], d0;
    float *gc = hal((size_t)KCHAIN * V * 4), *gn = hal((size_t)KCHAIN * V * 4);
    const int last_at = engine_prompt(e, prompt, np, next, &d0, gn);
    const int TL = np - last_at;
    if (tdm_engine_mtp(e, last_at, next + last_at, TL, KCHAIN, gd, gc) != 0) bail("chained MTP");
    int same = 1;
    for (int run = 0; run < 2; run++) {
        memset(gn, 0, (size_t)KCHAIN * V * 4);
        if (tdm_engine_mtp(e, last_at, next + last_at, TL, 1, &nd[0], gn) != 0) bail("the root");
        for (int j = 1; j < KCHAIN; j++)
            if (tdm_engine_mtp_node(e, np - 1 + j, nd[j - 1], j - 1, j, &nd[j], gn + (size_t)j * V) != 0)
                bail("tdm_engine_mtp_node along a chain");
        same &= memcmp(nd, gd, sizeof gd) == 0 && same_bits(gn, gc, (size_t)KCHAIN * V) &&
                tdm_engine_mtp_pos(e) == np + KCHAIN - 1;
    }
    ok(same, "%s: a chain of %d node calls (each on the previous node's slot) gives tdm_engine_mtp's chain of drafts "
       "and logits bit for bit, twice (the node graph captured, then replayed), position %d", lab, KCHAIN - 1,
       tdm_engine_mtp_pos(e));

    /* the tree on the engine, then the CPU fed the same tokens */
    int32_t ids[TDM_SPEC_MAX_NODES], ids2[TDM_SPEC_MAX_NODES], top1[TDM_SPEC_MAX_NODES], top1b[TDM_SPEC_MAX_NODES];
    float *lg = hal((size_t)n * V * 4), *lg2 = hal((size_t)n * V * 4);
    ids[0] = ids2[0] = next[np - 1];
    engine_prompt(e, prompt, np, next, &d0, lg);
    engine_tree(e, np, parent, depth, n, ids, lg, top1, V);
    float *ch = hal((size_t)n * H * 4), *cl = hal((size_t)n * V * 4), ng[TDM_SPEC_MAX_NODES];
    memcpy(cl, cm + (size_t)(np - 1) * V, (size_t)V * 4);
    memcpy(ch, mh + (size_t)(np - 1) * H, (size_t)H * 4);
    ng[0] = root_gap;
    float *er = hal((size_t)n * V * 4), *cr = hal((size_t)n * V * 4), eg[TDM_SPEC_MAX_NODES];
    int nexp = 0, nodes_tied = 0, nodes_bad = 0, id_bad = 0, skip[TDM_SPEC_MAX_NODES], nskip;
    for (int t = 0; t < n; t++) {
        int kids[TDM_SPEC_MAX_NODES];
        const int b = children(parent, n, t, kids);
        if (!b) continue;
        if (t > 0) {
            const int pos = np - 1 + depth[t];
            if (tdm_ref_mtp_rewind(r, pos) != 0 ||
                tdm_ref_mtp_h(r, &ids[t], ch + (size_t)parent[t] * H, 1, cl + (size_t)t * V, ch + (size_t)t * H) != 0)
                bail("reference MTP tree node");
            ng[t] = fminf(ng[parent[t]], tdm_ref_router_gaps(r, 1)[pos]);
            id_bad += top1[t] != tdm_argmax(lg + (size_t)t * V, V);
        }
        memcpy(er + (size_t)nexp * V, lg + (size_t)t * V, (size_t)V * 4);
        memcpy(cr + (size_t)nexp * V, cl + (size_t)t * V, (size_t)V * 4);
        eg[nexp++] = ng[t];
        /* the top-b against the CPU's on the same inputs; a difference needs a near tie among the CPU's b+1 best */
        int32_t ct[TDM_SPEC_MAX_NODES + 1];
        const float *x = cl + (size_t)t * V;
        tdm_topk(x, V, b + 1, ct);
        int differ = 0;
        for (int i = 0; i < b; i++) differ |= ids[kids[i]] != ct[i];
        if (!differ) continue;
        float gap = INFINITY;
        for (int i = 0; i < b; i++) gap = fminf(gap, x[ct[i]] - x[ct[i + 1]]);
        const int tied = gap < CLEAR_MARGIN || ng[t] < TDM_ROUTER_NEAR_TIE;
        nodes_tied += tied;
        nodes_bad += !tied;
        printf("# %s: node %d (depth %d): the engine's top-%d differs from the CPU's; the CPU's %d best logits are %.4f "
               "apart at the closest (router margin %.4f): %s\n", lab, t, depth[t], b, b + 1, gap, ng[t],
               tied ? "a near tie, reported" : "NOT a near tie");
    }
    char what[240];
    snprintf(what, sizeof what, "%s vs the CPU reference", lab);
    const double et = rel_err_excused(what, er, cr, nexp, V, eg, CPU_BOUND, skip, &nskip);
    /* every node inherits the root's routing gap (ng[0]): as the chain above, all may be excused only
     * when the root itself is at a near tie */
    ok(et <= CPU_BOUND && (nskip < nexp || root_gap < TDM_ROUTER_NEAR_TIE), "%s %s: the logits of its %d drafting nodes "
       "vs the CPU reference fed the same tokens: relative error %.2e <= %.0e (%d rows excused at routing near ties; the "
       "root's router margin %.4f)", lab, MTP_TREE, nexp, et, CPU_BOUND, nskip, root_gap);
    ok(nodes_bad == 0, "%s %s: every drafting node's top-b (its children, in order) is the CPU reference's top-b on the "
       "same inputs, except where the CPU's b+1 best logits lie closer than %.2f (%d nodes differ there, %d elsewhere)",
       lab, MTP_TREE, CLEAR_MARGIN, nodes_tied, nodes_bad);
    ok(id_bad == 0, "%s: each node's argmax chosen on the device is the host argmax of its logits (%d of %d differ)", lab,
       id_bad, nexp - 1);
    /* the same tree graphed again, and eager on another engine */
    engine_prompt(e, prompt, np, next, &d0, lg2);
    engine_tree(e, np, parent, depth, n, ids2, lg2, top1b, V);
    same = memcmp(ids, ids2, (size_t)n * 4) == 0 && memcmp(top1, top1b, (size_t)n * 4) == 0;
    for (int t = 0; t < n; t++) {
        int kids[TDM_SPEC_MAX_NODES];
        if (children(parent, n, t, kids)) same &= same_bits(lg + (size_t)t * V, lg2 + (size_t)t * V, (size_t)V);
    }
    if (setenv("TANDEM_CUDA_GRAPH", "off", 1) != 0) bail("setenv");
    struct tdm_engine *eg0 = tdm_engine_new(m, ctx);
    if (setenv("TANDEM_CUDA_GRAPH", "on", 1) != 0) bail("setenv");
    if (!eg0 || tdm_engine_mtp_init(eg0) != 0) bail("eager engine");
    memset(lg2, 0, (size_t)n * V * 4);
    engine_prompt(eg0, prompt, np, next, &d0, lg2);
    engine_tree(eg0, np, parent, depth, n, ids2, lg2, top1b, V);
    int same_eager = memcmp(ids, ids2, (size_t)n * 4) == 0 && memcmp(top1, top1b, (size_t)n * 4) == 0;
    for (int t = 0; t < n; t++) {
        int kids[TDM_SPEC_MAX_NODES];
        if (children(parent, n, t, kids)) same_eager &= same_bits(lg + (size_t)t * V, lg2 + (size_t)t * V, (size_t)V);
    }
    tdm_engine_free(eg0);
    ok(same && same_eager, "%s %s: graphed again and eager (TANDEM_CUDA_GRAPH=off): the same drafts and logits bit for "
       "bit (again %s, eager %s)", lab, MTP_TREE, same ? "same" : "DIFFERENT", same_eager ? "same" : "DIFFERENT");

    /* a tree verify of the main model, the commit of the path 0, 3, 4, and the path's rows to the drafter */
    engine_prompt(e, prompt, np, next, &d0, lg2);
    const int32_t tv[5] = {next[np - 1], prompt[0], prompt[1], prompt[np - 1], prompt[np / 2]};
    const int tpar[5] = {-1, 0, 1, 0, 3}, tpath[3] = {0, 3, 4};
    if (tdm_engine_verify_tree(e, tv, tpar, 5, 5, NULL) != 0 || tdm_engine_commit_path(e, tpath, 3) != 0)
        bail("tree verify and path commit");
    const int32_t nx[3] = {tv[3], tv[4], prompt[1]};
    int32_t pd[3][2];
    float *pl = hal((size_t)3 * 2 * V * 4);
    for (int run = 0; run < 2; run++)
        if (tdm_engine_mtp_path(e, np, tpath, nx, 3, 2, pd[run], pl + (size_t)run * 2 * V) != 0) bail("tdm_engine_mtp_path");
    for (int j = 0; j < 3; j++)
        if (tdm_engine_mtp_at(e, np + j, tpath[j], &nx[j], 1, j == 2 ? 2 : 0, pd[2], j == 2 ? pl + (size_t)4 * V : NULL) != 0)
            bail("the path's rows one a call");
    ok(memcmp(pd[0], pd[2], sizeof pd[0]) == 0 && memcmp(pd[1], pd[2], sizeof pd[0]) == 0 &&
           same_bits(pl, pl + (size_t)4 * V, (size_t)2 * V) && same_bits(pl + (size_t)2 * V, pl + (size_t)4 * V, (size_t)2 * V) &&
           tdm_engine_mtp_pos(e) == np + 4,
       "%s: tdm_engine_mtp_path over rows 0, 3, 4 of a tree verify (twice: eager, then captured) gives the drafts and "
       "logits of those rows fed one a call, bit for bit", lab);
    /* slot 0 is the path's last row: a node on it, fed the first draft, gives the chain's second row */
    int32_t d2;
    if (tdm_engine_mtp_path(e, np, tpath, nx, 3, 1, &d0, NULL) != 0 ||
        tdm_engine_mtp_node(e, np + 3, d0, 0, 1, &d2, gn) != 0)
        bail("a node after the path");
    ok(d2 == pd[0][1] && same_bits(gn, pl + (size_t)V, (size_t)V),
       "%s: a node on slot 0 after the path, fed its first draft, gives the path's second draft row bit for bit", lab);

    /* refusals */
    const int mpos = tdm_engine_mtp_pos(e);
    int refused = 0, cases = 0;
#define REFUSED(call) (cases++, refused += (call) != 0 && tdm_engine_mtp_pos(e) == mpos)
    const int back[3] = {0, 4, 3}, past[2] = {0, 5};
    REFUSED(tdm_engine_mtp_path(e, np, back, nx, 3, 1, &d0, NULL));
    REFUSED(tdm_engine_mtp_path(e, np, past, nx, 2, 1, &d0, NULL));
    REFUSED(tdm_engine_mtp_node(e, mpos, d0, 0, TDM_ENGINE_MTP_SLOTS, &d2, NULL));
    REFUSED(tdm_engine_mtp_node(e, mpos, d0, -1, 1, &d2, NULL));
    REFUSED(tdm_engine_mtp_node(e, mpos, d0, TDM_ENGINE_MTP_SLOTS - 1, 1, &d2, NULL)); /* never written */
    REFUSED(tdm_engine_mtp_node(e, mpos + 1, d0, 0, 1, &d2, NULL));
    REFUSED(tdm_engine_mtp_node(e, mpos, V, 0, 1, &d2, NULL));
#undef REFUSED
    if (tdm_engine_reset(e) != 0) bail("reset");
    cases++;
    refused += tdm_engine_mtp_node(e, 0, d0, 0, 1, &d2, NULL) != 0 && tdm_engine_mtp_pos(e) == 0; /* the reset cleared the slots */
    ok(refused == cases, "%s: %d of %d bad node and path calls refused with the position unchanged (last: \"%s\")", lab,
       refused, cases, tdm_err());

    tdm_engine_free(e);
    tdm_ref_free(r);
    free(ph); free(cm); free(mh); free(next); free(gc); free(gn); free(lg); free(lg2); free(ch); free(cl); free(er);
    free(cr); free(pl); free(prompt);
    tdm_model_free(m);
}

/* ---- tree rounds (tdm_engine_verify_tree / tdm_engine_commit_path) ---- */

/* Round shapes: n nodes, a depth-first tree from a rule (0: a chain verified with tdm_engine_verify,
 * 1: branching 3,2,1, 2: a star, 3: siblings and back-ups, 4: one node), and the node whose path is
 * committed. Shapes repeat so that the tree and path-commit graphs are captured and replayed. */
static const int tree_sched[][3] = {{16, 1, 15}, {5, 3, 4}, {32, 3, 31}, {16, 1, 7}, {9, 2, 5}, {16, 1, 15}, {5, 3, 4},
                                    {6, 0, 3}, {1, 4, 0}, {32, 3, 20}, {9, 2, 0}, {16, 1, 1}, {32, 3, 31}, {5, 3, 2}};
#define NTROUNDS ((int)(sizeof tree_sched / sizeof tree_sched[0]))

static void sched_tree(int n, int rule, int *parent)
{
    int path[TDM_ENGINE_MAX_ROWS], d = 0;
    parent[0] = -1;
    path[0] = 0;
    if (rule == 1) { /* 3,2,1: children of the root, each with 2, each with 1 */
        int at = 1;
        for (int a = 0; a < 3 && at < n; a++) {
            const int c1 = at++;
            parent[c1] = 0;
            for (int b = 0; b < 2 && at < n; b++) {
                const int c2 = at++;
                parent[c2] = c1;
                if (at < n) parent[at++] = c2;
            }
        }
        for (; at < n; at++) parent[at] = at - 1;
        return;
    }
    for (int t = 1; t < n; t++) {
        int a = d; /* rule 0: a chain */
        if (rule == 2) a = 0;
        else if (rule == 3) a = t % 5 == 0 ? (d > 3 ? d - 3 : 0) : t % 3 == 0 ? (d > 0 ? d - 1 : 0) : d;
        parent[t] = path[a];
        d = a + 1;
        path[d] = t;
    }
}

/* Node t's path, root first; returns its length. */
static int node_path(const int *parent, int t, int *path)
{
    int n = 0;
    for (int x = t; x >= 0; x = parent[x]) n++;
    for (int x = t, i = n - 1; i >= 0; i--, x = parent[x]) path[i] = x;
    return n;
}

/* The one-token logits along a path on a reference engine: the prompt and the committed history
 * hist[0..nh-1] fed as forwards (row-invariant: the bits of one-token steps), then the path's
 * tokens one at a time; out [n][V]. */
static void ref_path(struct tdm_engine *r, const int32_t *prompt, int np, const int32_t *hist, int nh, const int32_t *tok,
                     int n, float *out, int V)
{
    if (tdm_engine_reset(r) != 0 || tdm_engine_forward(r, prompt, np, np, NULL) != 0 ||
        (nh && tdm_engine_forward(r, hist, nh, nh, NULL) != 0))
        bail("reference engine");
    for (int i = 0; i < n; i++)
        if (tdm_engine_forward(r, &tok[i], 1, 0, out + (size_t)i * V) != 0) bail("reference step");
}

/* The tree schedule on a fresh engine; returns the node rows that differ from the reference.
 * *id_bad: greedy ids from the device (an ids-only verify before each round's, and the round's
 * own) that differ from the host argmax of the round's node logits, of *id_rows. */
static long tree_rounds(const struct tdm_model *m, const int32_t *prompt, int np, float *got, float *refl, int *verified,
                        long *id_bad, long *id_rows, uint64_t *hash, uint64_t *ref_hash)
{
    const int V = m->cfg.vocab, ctx = np + NSEQ;
    struct tdm_engine *e = tdm_engine_new(m, ctx), *r = tdm_engine_new(m, ctx);
    if (!e || !r) bail("engine");
    if (tdm_engine_forward(e, prompt, np, np, NULL) != 0) bail("prefill");
    int32_t hist[NSEQ], ids[TDM_ENGINE_MAX_ROWS], tok[TDM_ENGINE_MAX_ROWS];
    int nh = 0, parent[TDM_ENGINE_MAX_ROWS], path[TDM_ENGINE_MAX_ROWS];
    long bad = 0;
    int32_t gid_a[TDM_ENGINE_MAX_ROWS], gid_b[TDM_ENGINE_MAX_ROWS];
    *verified = 0;
    *id_bad = *id_rows = 0;
    uint64_t saved = rng;
    rng = 0x5eed5eed5eedull; /* the same ids whatever ran before: graphed and eager runs compare */
    for (int k = 0; k < NTROUNDS; k++) {
        const int n = tree_sched[k][0], rule = tree_sched[k][1], pick = tree_sched[k][2];
        sched_tree(n, rule, parent);
        /* ids: random, a third repeating the parent's token or the previous node's (rows sharing inputs) */
        ids[0] = (int32_t)(next() % (uint64_t)V);
        for (int t = 1; t < n; t++) {
            const uint64_t x = next();
            ids[t] = x % 6 == 0 ? ids[parent[t]] : x % 6 == 1 ? ids[t - 1] : (int32_t)(next() % (uint64_t)V);
        }
        if (nh + n > NSEQ - 2) bail("the schedule outruns the context");
        /* the greedy ids path first: ids only (the verify below replaces this round); not every
         * third round, so that the compared verify is the pass right after a (deferred) commit */
        const int pre = k % 3 != 1;
        if (pre && (rule == 0 ? tdm_engine_verify_ids(e, ids, n, 0, NULL, gid_a)
                              : tdm_engine_verify_tree_ids(e, ids, parent, n, 0, NULL, gid_a)) != 0)
            bail("verify, ids only");
        if ((rule == 0 ? tdm_engine_verify_ids(e, ids, n, 0, got, gid_b)
                       : tdm_engine_verify_tree_ids(e, ids, parent, n, 0, got, gid_b)) != 0)
            bail("verify");
        for (int t = 0; t < n; t++) {
            const int32_t want = tdm_argmax(got + (size_t)t * V, V);
            *id_bad += (pre && gid_a[t] != want) + (gid_b[t] != want);
        }
        *id_rows += (1 + pre) * n;
        /* every node against the one-token steps along its path (each leaf's path once) */
        for (int leaf = 0; leaf < n; leaf++) {
            if (leaf + 1 < n && parent[leaf + 1] == leaf) continue;
            const int len = node_path(parent, leaf, path);
            for (int i = 0; i < len; i++) tok[i] = ids[path[i]];
            ref_path(r, prompt, np, hist, nh, tok, len, refl, V);
            for (int i = 0; i < len; i++) bad += !same_bits(got + (size_t)path[i] * V, refl + (size_t)i * V, (size_t)V);
        }
        *verified += n;
        const int len = node_path(parent, pick, path);
        if (tdm_engine_commit_path(e, path, len) != 0) bail("tdm_engine_commit_path");
        for (int i = 0; i < len; i++) hist[nh++] = ids[path[i]]; /* the path's tokens are consumed, root first */
        if (tdm_engine_pos(e) != np + nh) { tdm_engine_free(e); tdm_engine_free(r); rng = saved; return -1; }
    }
    /* a step after the rounds */
    const int32_t last = (int32_t)(next() % (uint64_t)V);
    if (tdm_engine_forward(e, &last, 1, 0, got) != 0) bail("step after the rounds");
    ref_path(r, prompt, np, hist, nh, &last, 1, refl, V);
    bad += !same_bits(got, refl, (size_t)V);
    ++*verified;
    if (tdm_engine_state_hash(e, hash) != 0 || tdm_engine_state_hash(r, ref_hash) != 0) bail("tdm_engine_state_hash");
    rng = saved;
    tdm_engine_free(e);
    tdm_engine_free(r);
    return bad;
}

static void test_tree_rounds(const struct tdm_model *m, const char *fmt, const int32_t *prompt, int np)
{
    const int V = m->cfg.vocab, R = TDM_ENGINE_MAX_ROWS;
    float *got = hal((size_t)R * V * 4), *refl = hal((size_t)R * V * 4);
    int n;
    long id_bad, id_rows;
    uint64_t h, hr;
    /* deferred (the default) and replayed commits, graphed and eager */
    for (int defer = 1; defer >= 0; defer--)
        for (int graph = 1; graph >= 0; graph--) {
            set_modes(defer, graph);
            long bad = tree_rounds(m, prompt, np, got, refl, &n, &id_bad, &id_rows, &h, &hr);
            ok(bad == 0, "%s: %d tree rounds (1 to 32 nodes: branching 3,2,1, stars, siblings and back-ups, a chain "
               "between) with root-to-node paths committed (%s): %ld of %d node rows differ from the one-token steps "
               "along their paths (bit for bit), the position advances by the path", fmt, NTROUNDS, mode_name(defer, graph),
               bad, n);
            ok(id_bad == 0, "%s: the tree rounds' greedy ids on the device (%s; ids only and with logits): %ld of %ld "
               "differ from the host argmax of the node logits", fmt, mode_name(defer, graph), id_bad, id_rows);
            ok(h == hr, "%s: after the tree rounds and a step (%s): the state is the reference engine's bit for bit "
               "(hash %016llx, reference %016llx)", fmt, mode_name(defer, graph), (unsigned long long)h,
               (unsigned long long)hr);
        }
    set_modes(1, 1);

    /* the protocol */
    struct tdm_engine *e = tdm_engine_new(m, np + 8), *r = tdm_engine_new(m, np + 8);
    if (!e || !r) bail("engine");
    if (tdm_engine_forward(e, prompt, np, np, NULL) != 0) bail("prefill");
    const int pos = tdm_engine_pos(e);
    const int32_t ids[4] = {prompt[0], prompt[np - 1], prompt[0], prompt[np / 2]};
    const int tree[4] = {-1, 0, 0, 2}, no_root[4] = {0, 0, 0, 2}, late[4] = {-1, 0, 3, 2}, self[4] = {-1, 1, 0, 2};
    int refused = 0, cases = 0;
#define REFUSED(call) (cases++, refused += (call) != 0 && tdm_engine_pos(e) == pos)
    REFUSED(tdm_engine_verify_tree(e, ids, no_root, 4, 0, got));
    REFUSED(tdm_engine_verify_tree(e, ids, late, 4, 0, got));
    REFUSED(tdm_engine_verify_tree(e, ids, self, 4, 0, got));
    REFUSED(tdm_engine_verify_tree(e, ids, tree, 9, 0, got)); /* np + 9 > ctx */
    if (tdm_engine_verify_tree(e, ids, tree, 4, 0, got) != 0) bail("verify");
    const int p_bad0[2] = {1, 3}, p_notchild[2] = {0, 3}, p_gap[3] = {0, 1, 3}, p_ok[3] = {0, 2, 3};
    REFUSED(tdm_engine_commit_path(e, p_bad0, 2));
    REFUSED(tdm_engine_commit_path(e, p_notchild, 2));
    REFUSED(tdm_engine_commit_path(e, p_gap, 3));
    REFUSED(tdm_engine_commit_path(e, p_ok, 0));
    REFUSED(tdm_engine_commit_path(e, p_ok, 5));
    REFUSED(tdm_engine_commit(e, 3)); /* rows 0..2 are not a path of this tree */
    if (tdm_engine_forward(e, &ids[0], 1, 0, got) != 0) bail("forward");
    cases++;
    refused += tdm_engine_commit_path(e, p_ok, 3) != 0 && tdm_engine_pos(e) == pos + 1; /* the forward dropped the round */
#undef REFUSED
    ok(refused == cases, "%s: %d of %d bad tree calls refused with the position unchanged (last: \"%s\")", fmt, refused,
       cases, tdm_err());
    /* after all that, a tree round and its commit still follow one-token decode */
    int32_t hist[2] = {ids[0]}, tok[3] = {ids[0], ids[2], ids[3]};
    if (tdm_engine_verify_tree(e, ids, tree, 4, 0, got) != 0 || tdm_engine_commit_path(e, p_ok, 3) != 0 ||
        tdm_engine_forward(e, &ids[1], 1, 0, got + (size_t)4 * V) != 0)
        bail("round after the refusals");
    ref_path(r, prompt, np, hist, 1, tok, 3, refl, V);
    int same = same_bits(got, refl, (size_t)V) && same_bits(got + (size_t)2 * V, refl + (size_t)V, (size_t)V) &&
               same_bits(got + (size_t)3 * V, refl + (size_t)2 * V, (size_t)V);
    ref_path(r, prompt, np, hist, 1, (const int32_t[]){ids[0], ids[2], ids[3], ids[1]}, 4, refl, V);
    same = same && same_bits(got + (size_t)4 * V, refl + (size_t)3 * V, (size_t)V) && tdm_engine_pos(e) == pos + 5;
    ok(same, "%s: after the refused calls, a tree round, the commit of the path 0, 2, 3 and a step give one-token decode's "
       "bits", fmt);
    tdm_engine_free(e);
    tdm_engine_free(r);
    free(got);
    free(refl);
}

static void test_generate(const struct tdm_model *m, const struct tdm_model *other, const char *fmt, const int32_t *prompt,
                          int np)
{
    const int V = m->cfg.vocab, N = 40;
    int32_t *ref = hal((size_t)N * 4), *out = hal((size_t)N * 4), *cref = hal((size_t)N * 4);
    float *rl = hal((size_t)N * V * 4), *ol = hal((size_t)N * V * 4), *crl = hal((size_t)N * V * 4);
    struct tdm_spec_opts o;
    struct tdm_spec_stats st;
    if (tdm_spec_opts_init(&o) != 0) bail("options");
    o.fault_at = 0;
    o.backend = TDM_BACKEND_CUDA;
    if (tdm_spec_generate(m, &o, prompt, np, N, ref, rl, &st) != 0) bail("plain CUDA decode");
    /* the greedy ids path of so (no logits asked for), graphed and eager: the first token that
     * differs from want, or -1 */
    int32_t *ido = hal((size_t)N * 4);
#define IDS_PATH(so, want, first)                                                                                  \
    do {                                                                                                           \
        (first) = -1;                                                                                              \
        for (int g = 0; g < 2; g++) {                                                                              \
            struct tdm_spec_stats ist;                                                                             \
            if (setenv("TANDEM_CUDA_GRAPH", g ? "off" : "on", 1) != 0) bail("setenv");                             \
            memset(ido, 0xff, (size_t)N * 4);                                                                      \
            if (tdm_spec_generate(m, &(so), prompt, np, N, ido, NULL, &ist) != 0) bail("the greedy ids path");     \
            for (int t = 0; t < N && (first) < 0; t++)                                                             \
                if (ido[t] != (want)[t]) (first) = t;                                                              \
        }                                                                                                          \
        if (setenv("TANDEM_CUDA_GRAPH", "on", 1) != 0) bail("setenv");                                             \
    } while (0)
    int idiv;
    IDS_PATH(o, ref, idiv);
    ok(idiv < 0, "%s plain decode without logits (greedy ids on the device), graphed and eager: the %d tokens of plain "
       "decode with logits (first differing token %d)", fmt, N, idiv);
    struct { enum tdm_spec_kind kind; const struct tdm_model *dm; int draft, chunk; const char *tree, *name; } cases[] = {
        {TDM_SPEC_MTP, NULL, 4, 0, NULL, "mtp chain 4"},
        {TDM_SPEC_MTP, NULL, 1, 0, NULL, "mtp chain 1"},
        {TDM_SPEC_MTP, NULL, 31, 0, NULL, "mtp chain 31"},
        {TDM_SPEC_MTP, NULL, 3, 5, NULL, "mtp chain 3 (prefill chunks of 5)"},
        {TDM_SPEC_MTP, NULL, 0, 0, "3,2,1", "mtp tree 3,2,1"},
        {TDM_SPEC_MTP, NULL, 0, 0, "2,2,2,2", "mtp tree 2,2,2,2"},
        {TDM_SPEC_MTP, NULL, 0, 0, "1,1,1", "mtp tree 1,1,1 (top-1 ids only)"},
        {TDM_SPEC_MTP, NULL, 0, 5, "4,2,1,1", "mtp tree 4,2,1,1 (prefill chunks of 5)"},
        {TDM_SPEC_NGRAM, NULL, 4, 0, NULL, "ngram chain 4"},
        {TDM_SPEC_NGRAM, NULL, 31, 0, NULL, "ngram chain 31"},
        {TDM_SPEC_DRAFT, m, 4, 0, NULL, "draft chain 4 (itself)"},
        {TDM_SPEC_DRAFT, m, 31, 0, NULL, "draft chain 31 (itself)"},
        {TDM_SPEC_DRAFT, other, 3, 0, NULL, "draft chain 3 (another format)"},
        {TDM_SPEC_NGRAM, NULL, 0, 0, "3,2,1", "ngram tree 3,2,1"},
        {TDM_SPEC_NGRAM, NULL, 0, 0, "2,2,2,2", "ngram tree 2,2,2,2"},
        {TDM_SPEC_DRAFT, m, 0, 0, "3,2,1", "draft tree 3,2,1 (itself)"},
        {TDM_SPEC_DRAFT, other, 0, 0, "4,2,1,1", "draft tree 4,2,1,1 (another format)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct tdm_spec_opts so = o;
        so.kind = cases[i].kind;
        so.draft_model = cases[i].dm;
        so.draft = cases[i].draft ? cases[i].draft : so.draft;
        if (cases[i].chunk) so.prefill_chunk = cases[i].chunk;
        if (cases[i].tree && tdm_spec_parse_tree(cases[i].tree, &so) != 0) bail("tree");
        /* the plain decode to match: with other prefill chunks, plain decode with the same chunks
         * (the prompt's bits depend on its chunks: tdm_engine_prefill) */
        const int32_t *want = ref;
        const float *want_l = rl;
        if (cases[i].chunk) {
            struct tdm_spec_opts po = o;
            po.prefill_chunk = cases[i].chunk;
            if (tdm_spec_generate(m, &po, prompt, np, N, cref, crl, &st) != 0) bail("plain CUDA decode, other chunks");
            want = cref;
            want_l = crl;
        }
        memset(out, 0xff, (size_t)N * 4);
        int rc = tdm_spec_generate(m, &so, prompt, np, N, out, ol, &st);
        if (rc != 0) { ok(0, "%s %s: %s", fmt, cases[i].name, tdm_err()); continue; }
        int div = -1;
        for (int t = 0; t < N && div < 0; t++)
            if (out[t] != want[t]) div = t;
        ok(div < 0 && same_bits(ol, want_l, (size_t)N * V),
           "%s %s: plain CUDA decode's %d tokens and logits bit for bit (%d rounds, %ld accepted; first differing token %d)",
           fmt, cases[i].name, N, st.rounds, st.accepted, div);
        IDS_PATH(so, want, idiv);
        ok(idiv < 0, "%s %s without logits (greedy ids on the device), graphed and eager: the same %d tokens (first "
           "differing token %d)", fmt, cases[i].name, N, idiv);
        /* a tree verify reads the states once more per node whose parent is not the node before it;
         * deferred (the default), a chain round reads each state once and writes it once in the verify
         * after the commit (none after the first round's prefill: rounds - 1 writes) */
        const int tree = cases[i].tree != NULL;
        const int64_t reads = (int64_t)st.rounds * st.state_bytes;
        ok(st.rounds > 0 && st.accepted + st.rounds + 1 == N && strcmp(st.commit, "deferred") == 0 &&
           (tree ? st.bytes.state_read >= reads && st.bytes.state_read % st.state_bytes == 0 : st.bytes.state_read == reads) &&
           st.bytes.state_written == (int64_t)(st.rounds - 1) * st.state_bytes && st.nshapes > 0 && st.shapes[0].tree == tree,
           "%s %s: statistics add up (tokens = prefill's 1 + rounds + accepted; deferred commit: state written once per "
           "round after the first, read once per chain round, at least that per tree round: %.2f states)", fmt,
           cases[i].name, (double)st.bytes.state_read / ((double)st.rounds * st.state_bytes));
        if (i == 0 || cases[i].tree) { /* the replayed commit: the same tokens and logits, its traffic */
            struct tdm_spec_stats rst;
            set_modes(0, 1);
            memset(out, 0xff, (size_t)N * 4);
            rc = tdm_spec_generate(m, &so, prompt, np, N, out, ol, &rst);
            set_modes(1, 1);
            if (rc != 0) bail("the replayed commit");
            ok(memcmp(out, want, (size_t)N * 4) == 0 && same_bits(ol, want_l, (size_t)N * V) &&
               strcmp(rst.commit, "replayed") == 0 && rst.rounds == st.rounds &&
               (tree ? rst.bytes.state_read == st.bytes.state_read + reads : rst.bytes.state_read == 2 * reads) &&
               rst.bytes.state_written == reads,
               "%s %s, TANDEM_GDN_DEFER=off: plain decode's tokens and logits bit for bit; the commit replayed, each round "
               "reading each state once more and writing it once", fmt, cases[i].name);
        }
        if (cases[i].dm == m) {
            int all = st.accepted_at[1] > 0;
            for (int d = 1; d < TDM_SPEC_MAX_NODES; d++) all &= st.accepted_at[d] == st.drafted_at[d];
            ok(all, "%s %s: a model drafting for itself is always accepted, at every depth (depth 1: %ld of %ld)", fmt,
               cases[i].name, st.accepted_at[1], st.drafted_at[1]);
        }
        if (cases[i].kind == TDM_SPEC_MTP) { /* the drafts are the CPU reference's (trees: test_mtp_tree): the same acceptance */
            struct tdm_spec_stats cst;
            so.backend = TDM_BACKEND_CPU;
            if (tdm_spec_generate(m, &so, prompt, np, N, out, NULL, &cst) != 0) bail("CPU mtp round");
            int same = cst.rounds == st.rounds && cst.accepted == st.accepted;
            for (int dd = 1; dd < TDM_SPEC_MAX_NODES; dd++)
                same &= cst.drafted_at[dd] == st.drafted_at[dd] && cst.accepted_at[dd] == st.accepted_at[dd];
            /* the CPU's tree is the factored form, which may flip a near tie of the main model: other
             * tokens leave nothing to compare (said so) */
            int cdiv = -1;
            for (int t = 0; t < N && cdiv < 0; t++)
                if (out[t] != want[t]) cdiv = t;
            if (tree && cdiv >= 0)
                printf("# %s %s: the CPU's tokens differ from token %d on: acceptance not compared\n", fmt, cases[i].name,
                       cdiv);
            ok(same || (tree && cdiv >= 0),
               "%s %s: the CPU reference's rounds and acceptance per depth (cuda %d rounds, %ld accepted; cpu %d, %ld)",
               fmt, cases[i].name, st.rounds, st.accepted, cst.rounds, cst.accepted);
        }
    }
#undef IDS_PATH
    free(ref); free(out); free(rl); free(ol); free(cref); free(crl); free(ido);
}

int main(void)
{
    if (tdm_cuda_device_count() < 1) skip_all("no CUDA device visible");
    const char *fix = tdm_setting("TANDEM_FIXTURES");
    char dir[4096], path[4096];
    struct stat sb;
    snprintf(dir, sizeof dir, "%s/qwen35-tiny", fix);
    if (stat(dir, &sb) != 0) skip_all("fixtures not found in %s (set TANDEM_FIXTURES)", fix);
    if (setenv("TANDEM_CUDA_GRAPH", "on", 1) != 0) bail("setenv");
    snprintf(path, sizeof path, "%s/qwen35-tiny/prompt.tok", fix);
    const char *fmts[3] = {"bf16", "fp8", "nvfp4"};
    struct tdm_model *ms[3];
    for (int i = 0; i < 3; i++) {
        snprintf(dir, sizeof dir, "%s/qwen35-tiny/%s", fix, fmts[i]);
        if (!(ms[i] = tdm_model_load(dir))) bail("model");
    }
    int32_t *prompt;
    int np;
    if (tdm_tokens_read(path, ms[0]->cfg.vocab, 0, &prompt, &np) != 0) bail("prompt");
    for (int i = 0; i < 3; i++) {
        test_rounds(ms[i], fmts[i], prompt, np);
        test_mtp(fix, "qwen35-tiny", fmts[i]);
        test_mtp_tree(fix, "qwen35-tiny", fmts[i]);
        test_tree_rounds(ms[i], fmts[i], prompt, np);
        test_generate(ms[i], ms[(i + 1) % 3], fmts[i], prompt, np);
    }
    snprintf(dir, sizeof dir, "%s/qwen3next-tiny", fix);
    if (stat(dir, &sb) == 0) {
        test_mtp(fix, "qwen3next-tiny", "bf16");
        test_mtp_tree(fix, "qwen3next-tiny", "bf16");
    } else {
        ok(1, "# SKIP fixture qwen3next-tiny not found in %s", fix);
    }
    for (int i = 0; i < 3; i++) tdm_model_free(ms[i]);
    free(prompt);
    return done_testing();
}
