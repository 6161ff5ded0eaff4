/* logits_cmp — compares two F32 'logits' dumps [rows, vocab] (tandem-run --dump-logits):
 *   build/t/logits_cmp GOT REF BOUND
 * prints one TAP-style comment with the relative error and the top-1 agreement where the reference
 * is clear (margin >= 0.25), and exits 0 when the relative error is <= BOUND and no clear row
 * differs, 1 otherwise, 2 on bad input. Used by t/gpu/engine.t on synthetic models. */
#include "compare.h"
#include "err.h"
#include "safetensors.h"
#include <stdio.h>
#include <stdlib.h>

static const struct tdm_tensor *logits(struct tdm_stfile **f, const char *path)
{
    if (!(*f = tdm_st_open(path))) tdm_die_input("logits_cmp");
    const struct tdm_tensor *t = tdm_st_find(*f, "logits");
    if (!t || t->dtype != TDM_DT_F32 || t->ndim != 2) {
        fprintf(stderr, "logits_cmp: %s: no F32 [rows, vocab] 'logits'\n", path);
        exit(TDM_EXIT_USAGE);
    }
    return t;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: logits_cmp GOT REF BOUND\n");
        return TDM_EXIT_USAGE;
    }
    struct tdm_stfile *fg, *fr;
    const struct tdm_tensor *g = logits(&fg, argv[1]), *r = logits(&fr, argv[2]);
    if (g->shape[0] != r->shape[0] || g->shape[1] != r->shape[1]) {
        fprintf(stderr, "logits_cmp: %s: shape [%lld, %lld], %s has [%lld, %lld]\n", argv[1], (long long)g->shape[0],
                (long long)g->shape[1], argv[2], (long long)r->shape[0], (long long)r->shape[1]);
        return TDM_EXIT_USAGE;
    }
    const double bound = atof(argv[3]);
    const int rows = (int)r->shape[0], V = (int)r->shape[1];
    const double rel = tdm_rel_err(g->data, r->data, r->numel);
    const struct tdm_top1 t = tdm_top1_compare(g->data, r->data, rows, V, 0.25f);
    printf("# %d rows: relative error %.3e (bound %.1e); top-1 differs on %d of %d clear rows (first %d)\n", rows, rel,
           bound, t.clear_differ, t.clear, t.first_differ);
    tdm_st_close(fg);
    tdm_st_close(fr);
    return rel <= bound && t.clear_differ == 0 ? 0 : 1;
}
