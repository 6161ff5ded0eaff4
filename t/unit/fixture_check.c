/* fixture_check FIXTURE FMT PROMPT_DUMP GREEDY FORCED_DUMP
 * Compares a model against a transformers fixture (ref-FMT.safetensors beside FIXTURE/FMT):
 * the logits tandem-run dumped for the prompt (-n 0), its greedy ids (-n 24) and its logits under
 * teacher forcing (--force greedy-FMT.tok), then, in process, the per-layer hidden states and the
 * MTP drafter's logits. Bounds (issue: foundation, item 10): relative error <= 2e-2; top-1 equal
 * wherever the reference margin >= 0.25; greedy ids equal up to the first reference near tie. */
#include "compare.h"
#include "err.h"
#include "model.h"
#include "ref.h"
#include "safetensors.h"
#include "tap.h"
#include "tokens.h"
#include <stdlib.h>
#include <string.h>

#define REL_BOUND 2e-2
#define CLEAR_MARGIN 0.25f

static const struct tdm_tensor *get(const struct tdm_stfile *f, const char *name, int64_t numel)
{
    const struct tdm_tensor *t = tdm_st_find(f, name);
    if (!t || t->dtype != TDM_DT_F32 || (numel && t->numel != numel)) {
        printf("Bail out! %s: tensor %s missing or not F32 of %lld values\n", f->path, name, (long long)numel);
        exit(1);
    }
    return t;
}

static void check_logits(const char *what, const float *got, const float *ref, int rows, int V)
{
    double e = tdm_rel_err(got, ref, (int64_t)rows * V);
    ok(e <= REL_BOUND, "%s: relative error %.2e <= %.0e", what, e, REL_BOUND);
    struct tdm_top1 t = tdm_top1_compare(got, ref, rows, V, CLEAR_MARGIN);
    ok(t.clear_differ == 0, "%s: top-1 equal on all %d of %d rows with margin >= %.2f (first differing row %d)", what,
       t.clear, t.rows, CLEAR_MARGIN, t.first_differ);
}

int main(int argc, char **argv)
{
    if (argc != 6) { fprintf(stderr, "usage: fixture_check FIXTURE FMT PROMPT_DUMP GREEDY FORCED_DUMP\n"); return 2; }
    const char *fix = argv[1], *fmt = argv[2];
    char path[4096], dir[4096];
    snprintf(dir, sizeof dir, "%s/%s", fix, fmt);
    snprintf(path, sizeof path, "%s/ref-%s.safetensors", fix, fmt);
    struct tdm_stfile *ref = tdm_st_open(path);
    struct tdm_model *m = tdm_model_load(dir);
    if (!ref || !m) { printf("Bail out! %s\n", tdm_err()); return 1; }
    const int V = m->cfg.vocab, H = m->cfg.hidden, L = m->cfg.n_layers;
    const struct tdm_tensor *rl = get(ref, "logits", 0);
    const int T = (int)rl->shape[0];
    const struct tdm_tensor *rs = get(ref, "step_logits", 0);
    const int S = (int)rs->shape[0];
    const struct tdm_tensor *rh = get(ref, "hidden_states", (int64_t)(L + 2) * T * H);
    const struct tdm_tensor *rm = get(ref, "mtp_logits", (int64_t)(T - 1) * V);

    /* 1. prompt logits from tandem-run -n 0 --dump-logits */
    struct tdm_stfile *d = tdm_st_open(argv[3]);
    if (!d) { printf("Bail out! %s\n", tdm_err()); return 1; }
    check_logits("prompt logits (tandem-run -n 0)", get(d, "logits", (int64_t)T * V)->data, rl->data, T, V);

    /* 2. greedy ids from tandem-run -n S, up to the first reference near tie */
    int32_t *ids, *prompt;
    int n, np;
    snprintf(path, sizeof path, "%s/prompt.tok", fix);
    if (tdm_tokens_read(argv[4], V, 0, &ids, &n) || tdm_tokens_read(path, V, 0, &prompt, &np)) {
        printf("Bail out! %s\n", tdm_err());
        return 1;
    }
    int32_t *gref;
    int ng;
    snprintf(path, sizeof path, "%s/greedy-%s.tok", fix, fmt);
    if (tdm_tokens_read(path, V, 0, &gref, &ng)) { printf("Bail out! %s\n", tdm_err()); return 1; }
    float *margins = malloc((size_t)S * sizeof *margins);
    for (int i = 0; i < S; i++) margins[i] = tdm_margin((const float *)rs->data + (size_t)i * V, V);
    int checked, differ = n == ng && ng == S ? tdm_greedy_compare(ids, gref, margins, S, CLEAR_MARGIN, &checked) : 0;
    ok(n == S && ng == S, "greedy: %d ids generated, %d in the reference", n, ng);
    ok(differ < 0, "greedy ids equal for the %d steps before the first near tie (first difference at %d)", checked, differ);

    /* 3. step logits under teacher forcing */
    struct tdm_stfile *fd = tdm_st_open(argv[5]);
    if (!fd) { printf("Bail out! %s\n", tdm_err()); return 1; }
    check_logits("step logits under teacher forcing", get(fd, "logits", (int64_t)S * V)->data, rs->data, S, V);

    /* 4. per-layer hidden states, in process */
    struct tdm_ref *r = tdm_ref_new(m, T + 1);
    float *hid = malloc((size_t)(L + 2) * T * H * sizeof(float)), *lg = malloc((size_t)T * V * sizeof(float));
    if (tdm_ref_forward(r, prompt, T, T, lg, hid, NULL)) { printf("Bail out! %s\n", tdm_err()); return 1; }
    for (int i = 0; i < L + 2; i++) {
        double e = tdm_rel_err(hid + (size_t)i * T * H, (const float *)rh->data + (size_t)i * T * H, (int64_t)T * H);
        ok(e <= REL_BOUND, "hidden state %d (%s): relative error %.2e <= %.0e", i,
           i == 0 ? "embedding" : i == L + 1 ? "final norm" : "layer output", e, REL_BOUND);
    }
    /* 5. the MTP drafter at positions 0..T-2: (token p+1, final-norm hidden at p) */
    tdm_ref_free(r);
    r = tdm_ref_new(m, T + 1);
    float *hfin = malloc((size_t)T * H * sizeof(float));
    if (tdm_ref_forward(r, prompt, T, T, NULL, NULL, hfin) || tdm_ref_mtp(r, prompt + 1, hfin, T - 1, lg)) {
        printf("Bail out! %s\n", tdm_err());
        return 1;
    }
    check_logits("MTP drafter logits", lg, rm->data, T - 1, V);

    free(hid); free(lg); free(hfin); free(margins); free(ids); free(prompt); free(gref);
    tdm_ref_free(r);
    tdm_st_close(d); tdm_st_close(fd); tdm_st_close(ref);
    tdm_model_free(m);
    return done_testing();
}
