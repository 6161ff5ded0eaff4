/* engine_spec.c — the CUDA engine's speculative rounds (engine.h): the checks and bookkeeping of a
 * chain verify and its commit, over the launch sequences of engine.c (engine_impl.h). */
#include "engine.h"
#include "engine_impl.h"
#include "err.h"

int tdm_engine_verify(struct tdm_engine *e, const int32_t *ids, int R, int logits_from, float *logits)
{
    const struct tdm_config *c = &tdm_engine_model(e)->cfg;
    const int pos = tdm_engine_pos(e), ctx = tdm_engine_ctx(e);
    if (R < 1 || R > TDM_ENGINE_MAX_ROWS)
        return tdm_errf("tdm_engine_verify: %d rows: a verify takes 1 to %d", R, TDM_ENGINE_MAX_ROWS);
    if (logits_from < 0 || logits_from > R)
        return tdm_errf("tdm_engine_verify: logits_from %d outside 0..%d", logits_from, R);
    if (pos + R > ctx) return tdm_errf("context full: %d + %d verify rows exceed --ctx %d", pos, R, ctx);
    for (int r = 0; r < R; r++)
        if (ids[r] < 0 || ids[r] >= c->vocab) return tdm_errf("token id %d is out of the vocabulary (%d ids)", ids[r], c->vocab);
    if (tdm_engine_verify_rows(e, ids, R, logits_from, logits) != 0)
        return tdm_err_prefix("CUDA engine: verify of %d rows at position %d", R, pos);
    return 0;
}

int tdm_engine_commit(struct tdm_engine *e, int j)
{
    const int R = tdm_engine_round_rows(e), pos = tdm_engine_pos(e);
    if (R == 0) return tdm_errf("tdm_engine_commit: no verify round to commit at position %d", pos);
    if (j < 1 || j > R) return tdm_errf("tdm_engine_commit: %d rows of a %d-row round: commit 1 to %d", j, R, R);
    if (tdm_engine_commit_rows(e, j) != 0) return tdm_err_prefix("CUDA engine: commit of %d of %d rows at position %d", j, R, pos);
    return 0;
}
