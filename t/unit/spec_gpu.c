/* The CUDA engine's speculative rounds (engine.h: tdm_engine_verify / tdm_engine_commit; spec.h on
 * the CUDA backend) on the tiny qwen3_5 fixture (TANDEM_FIXTURES/qwen35-tiny), per stored format;
 * skips without a device or the fixture.
 *   rounds against one-token decode: the prompt, then a fixed schedule of (rows R, committed j)
 *     rounds over a token sequence with repeated ids, R from 1 to 32, j from 1 to R, shapes
 *     repeated so that the verify and commit graphs are captured and replayed: every verified
 *     row's logits equal the one-token step's at that position bit for bit (rows past the
 *     committed ones too: they are fed the same tokens), so each round also checks that the
 *     previous commit left the states of one-token decoding; after the last commit a plain step
 *     equals the one-token step; the position advances by j. The same schedule with
 *     TANDEM_CUDA_GRAPH=off gives the same bits;
 *   the round protocol: a commit without a verify, a commit of 0 or R + 1 rows, a verify of 0 or
 *     33 rows, a verify past the context, and a commit after a forward are refused without
 *     changing the position; a refused round leaves the state intact (the next rows still equal
 *     one-token decode);
 *   tdm_spec_generate on the CUDA backend: ngram chains and draft chains (the model drafting for
 *     itself, every draft accepted; another format's checkpoint as the draft model) give plain CUDA
 *     decode's tokens and logits bit for bit, and the round statistics add up; mtp and trees are
 *     refused as not supported by the CUDA engine yet. */
#include "device.h"
#include "engine.h"
#include "err.h"
#include "model.h"
#include "ref.h"
#include "settings.h"
#include "spec.h"
#include "tap.h"
#include "tokens.h"
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "gputest.h"

#define NSEQ 128 /* tokens after the prompt that the rounds and the one-token steps feed */

/* (rows, committed) of each round: every R and j range, shapes repeated (graphs on the second use) */
static const int schedule[][2] = {{5, 5}, {5, 1}, {5, 3}, {1, 1}, {2, 2}, {5, 2}, {32, 7}, {17, 17}, {8, 4},
                                  {3, 1}, {5, 5}, {1, 1}, {32, 32}, {8, 8}, {5, 4}, {2, 1}, {32, 1}, {1, 1}};
#define NROUNDS ((int)(sizeof schedule / sizeof schedule[0]))

static int same_bits(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof(float)) == 0; }

/* One-token logits of every position after the prompt: one[i] is the step that feeds seq[i]. */
static void one_token(const struct tdm_model *m, const int32_t *prompt, int np, const int32_t *seq, float *one)
{
    struct tdm_engine *e = tdm_engine_new(m, np + NSEQ);
    if (!e) bail("engine");
    if (tdm_engine_forward(e, prompt, np, np, NULL) != 0) bail("prefill");
    const int V = m->cfg.vocab;
    for (int i = 0; i < NSEQ; i++)
        if (tdm_engine_forward(e, &seq[i], 1, 0, one + (size_t)i * V) != 0) bail("one-token step");
    tdm_engine_free(e);
}

/* The schedule of rounds on a fresh engine; returns the rows that differ from one[] (bit for bit),
 * -1 if the position went wrong. */
static long rounds(const struct tdm_model *m, const int32_t *prompt, int np, const int32_t *seq, const float *one,
                   float *got, int *verified)
{
    const int V = m->cfg.vocab;
    struct tdm_engine *e = tdm_engine_new(m, np + NSEQ);
    if (!e) bail("engine");
    if (tdm_engine_forward(e, prompt, np, np, NULL) != 0) bail("prefill");
    long bad = 0;
    int p = 0;
    *verified = 0;
    for (int k = 0; k < NROUNDS; k++) {
        const int R = schedule[k][0], j = schedule[k][1];
        if (p + R > NSEQ) bail("the schedule outruns the sequence");
        if (tdm_engine_verify(e, seq + p, R, 0, got) != 0) bail("tdm_engine_verify");
        for (int r = 0; r < R; r++) bad += !same_bits(got + (size_t)r * V, one + (size_t)(p + r) * V, (size_t)V);
        *verified += R;
        if (tdm_engine_commit(e, j) != 0) bail("tdm_engine_commit");
        p += j;
        if (tdm_engine_pos(e) != np + p) { tdm_engine_free(e); return -1; }
    }
    if (tdm_engine_forward(e, seq + p, 1, 0, got) != 0) bail("step after the rounds");
    bad += !same_bits(got, one + (size_t)p * V, (size_t)V);
    ++*verified;
    tdm_engine_free(e);
    return bad;
}

static void test_rounds(const struct tdm_model *m, const char *fmt, const int32_t *prompt, int np)
{
    const int V = m->cfg.vocab;
    int32_t seq[NSEQ];
    for (int i = 0; i < NSEQ; i++) seq[i] = i % 7 == 3 ? seq[i - 3] : (int32_t)(next() % (uint64_t)V); /* repeated ids */
    float *one = hal((size_t)NSEQ * V * 4), *got = hal((size_t)TDM_ENGINE_MAX_ROWS * V * 4);
    one_token(m, prompt, np, seq, one);
    int n;
    long bad = rounds(m, prompt, np, seq, one, got, &n);
    ok(bad == 0, "%s: %d rounds of 1..32 rows, 1..R committed (graphs on): %ld of %d verified rows differ from one-token "
       "decode (bit for bit), the position advances by the committed rows", fmt, NROUNDS, bad, n);
    if (setenv("TANDEM_CUDA_GRAPH", "off", 1) != 0) bail("setenv");
    bad = rounds(m, prompt, np, seq, one, got, &n);
    if (setenv("TANDEM_CUDA_GRAPH", "on", 1) != 0) bail("setenv");
    ok(bad == 0, "%s: the same rounds eager (TANDEM_CUDA_GRAPH=off): %ld of %d rows differ", fmt, bad, n);

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

static void test_generate(const struct tdm_model *m, const struct tdm_model *other, const char *fmt, const int32_t *prompt,
                          int np)
{
    const int V = m->cfg.vocab, N = 40;
    int32_t *ref = hal((size_t)N * 4), *out = hal((size_t)N * 4);
    float *rl = hal((size_t)N * V * 4), *ol = hal((size_t)N * V * 4);
    struct tdm_spec_opts o;
    struct tdm_spec_stats st;
    if (tdm_spec_opts_init(&o) != 0) bail("options");
    o.fault_at = 0;
    o.backend = TDM_BACKEND_CUDA;
    if (tdm_spec_generate(m, &o, prompt, np, N, ref, rl, &st) != 0) bail("plain CUDA decode");
    struct { enum tdm_spec_kind kind; const struct tdm_model *dm; int draft; const char *name; } cases[] = {
        {TDM_SPEC_NGRAM, NULL, 4, "ngram chain 4"},
        {TDM_SPEC_NGRAM, NULL, 31, "ngram chain 31"},
        {TDM_SPEC_DRAFT, m, 4, "draft chain 4 (itself)"},
        {TDM_SPEC_DRAFT, m, 31, "draft chain 31 (itself)"},
        {TDM_SPEC_DRAFT, other, 3, "draft chain 3 (another format)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct tdm_spec_opts so = o;
        so.kind = cases[i].kind;
        so.draft_model = cases[i].dm;
        so.draft = cases[i].draft;
        memset(out, 0xff, (size_t)N * 4);
        int rc = tdm_spec_generate(m, &so, prompt, np, N, out, ol, &st);
        if (rc != 0) { ok(0, "%s %s: %s", fmt, cases[i].name, tdm_err()); continue; }
        int div = -1;
        for (int t = 0; t < N && div < 0; t++)
            if (out[t] != ref[t]) div = t;
        ok(div < 0 && same_bits(ol, rl, (size_t)N * V),
           "%s %s: plain CUDA decode's %d tokens and logits bit for bit (%d rounds, %ld accepted; first differing token %d)",
           fmt, cases[i].name, N, st.rounds, st.accepted, div);
        ok(st.rounds > 0 && st.accepted + st.rounds + 1 == N &&
           st.bytes.state_read == 2 * (int64_t)st.rounds * st.state_bytes &&
           st.bytes.state_written == (int64_t)st.rounds * st.state_bytes,
           "%s %s: statistics add up (tokens = prefill's 1 + rounds + accepted; state read twice, written once per round)",
           fmt, cases[i].name);
        if (cases[i].dm == m)
            ok(st.accepted_at[1] == st.drafted_at[1] && st.accepted_at[1] > 0,
               "%s %s: a model drafting for itself is always accepted at depth 1 (%ld of %ld)", fmt, cases[i].name,
               st.accepted_at[1], st.drafted_at[1]);
    }
    struct tdm_spec_opts so = o;
    so.kind = TDM_SPEC_MTP;
    ok(tdm_spec_generate(m, &so, prompt, np, N, out, NULL, &st) == -1 && strstr(tdm_err(), "not supported by the CUDA engine yet"),
       "%s: --spec mtp refused on the CUDA backend: %s", fmt, tdm_err());
    so.kind = TDM_SPEC_NGRAM;
    if (tdm_spec_parse_tree("2,1", &so) != 0) bail("tree");
    ok(tdm_spec_generate(m, &so, prompt, np, N, out, NULL, &st) == -1 && strstr(tdm_err(), "not supported by the CUDA engine yet"),
       "%s: a tree refused on the CUDA backend: %s", fmt, tdm_err());
    free(ref); free(out); free(rl); free(ol);
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
        test_generate(ms[i], ms[(i + 1) % 3], fmts[i], prompt, np);
    }
    for (int i = 0; i < 3; i++) tdm_model_free(ms[i]);
    free(prompt);
    return done_testing();
}
