/* model_bytes DENSE_DIR MOE_DIR — the bytes a pass must read (model.h): tdm_model_pass_bytes against
 * tdm_model_step_bytes and the model's own tensors, on a dense model and a MoE model (the experts R
 * rows touch: top_k for one row, at most min(E, R top_k), about E (1 - (1 - top_k/E)^R) under
 * uniform routing). TAP. */
#include "err.h"
#include "model.h"
#include "tap.h"
#include <math.h>

static int near(double a, double b) { return fabs(a - b) <= 1e-9 * fabs(b) + 1e-6; }

int main(int argc, char **argv)
{
    if (argc != 3) skip_all("usage: model_bytes DENSE_DIR MOE_DIR");
    struct tdm_model *d = tdm_model_load(argv[1]), *x = tdm_model_load(argv[2]);
    if (!d || !x) { printf("Bail out! %s\n", tdm_err()); return 1; }

    const double dw = (double)tdm_model_projection_bytes(d);
    const struct tdm_step_bytes s = tdm_model_step_bytes(d, 40);
    const struct tdm_pass_bytes p1 = tdm_model_pass_bytes(d, 40, 1), p16 = tdm_model_pass_bytes(d, 40, 16);
    ok(p1.weights_even == dw && p1.weights_max == dw && p16.weights_even == dw && p16.weights_max == dw &&
           p1.experts_max == 0 && p16.experts_even == 0,
       "dense: every row count reads every projection weight once (%.0f B), no experts", dw);
    ok(p1.kv == s.kv, "dense: one row at position 40 reads the K/V a decode step there does (%lld B)", (long long)s.kv);
    ok(p16.kv == s.kv / 41 * 56, "dense: 16 rows at 40 read K/V rows 0..55 (%lld B)", (long long)p16.kv);

    const struct tdm_config *c = &x->cfg;
    const int E = c->n_experts, k = c->top_k;
    double experts = 0; /* every routed expert of every MoE layer */
    for (int i = 0; i < c->n_layers; i++) {
        if (!x->layers[i].is_moe) continue;
        for (int e = 0; e < E; e++) {
            const struct tdm_mlp *w = &x->layers[i].moe.experts[e];
            experts += (double)(tdm_qweight_bytes(&w->gate) + tdm_qweight_bytes(&w->up) + tdm_qweight_bytes(&w->down));
        }
    }
    const double all = (double)tdm_model_projection_bytes(x), rest = all - experts;
    ok(experts > 0 && k < E, "moe: %d experts, top %d, %.0f B of routed experts", E, k, experts);
    const struct tdm_pass_bytes m1 = tdm_model_pass_bytes(x, 0, 1);
    ok(m1.experts_max == k && near(m1.experts_even, k) && near(m1.weights_max, rest + experts * k / E) &&
           near(m1.weights_even, m1.weights_max),
       "moe: one row touches top_k = %d experts a layer (%.0f B)", k, m1.weights_max);
    const int R = (E + k - 1) / k; /* enough rows to reach every expert */
    const struct tdm_pass_bytes m2 = tdm_model_pass_bytes(x, 0, 2), mr = tdm_model_pass_bytes(x, 0, R);
    const double even2 = E * (1 - pow(1 - (double)k / E, 2));
    ok(m2.experts_max == (2 * k < E ? 2 * k : E) && near(m2.experts_even, even2) &&
           near(m2.weights_even, rest + experts * even2 / E) && m2.weights_even < m2.weights_max,
       "moe: two rows touch at most %.0f experts, %.3f expected under uniform routing", m2.experts_max, m2.experts_even);
    ok(mr.experts_max == E && near(mr.weights_max, all) && mr.weights_even < all && mr.experts_even > m2.experts_even,
       "moe: %d rows may touch all %d experts (%.0f B, every projection); %.3f expected", R, E, mr.weights_max,
       mr.experts_even);
    tdm_model_free(d);
    tdm_model_free(x);
    return done_testing();
}
