/* engine_spec.c — the CUDA engine's speculative rounds (engine.h): the checks and bookkeeping of a
 * chain or tree verify and its commit, over the launch sequences of engine.c (engine_impl.h). */
#include "engine.h"
#include "engine_impl.h"
#include "err.h"

/* The checks a verify of R rows shares with a tree verify; who names the call. */
static int verify_check(const struct tdm_engine *e, const char *who, const int32_t *ids, int R, int logits_from)
{
    const struct tdm_config *c = &tdm_engine_model(e)->cfg;
    const int pos = tdm_engine_pos(e), ctx = tdm_engine_ctx(e);
    if (R < 1 || R > TDM_ENGINE_MAX_ROWS) return tdm_errf("%s: %d rows: a verify takes 1 to %d", who, R, TDM_ENGINE_MAX_ROWS);
    if (logits_from < 0 || logits_from > R) return tdm_errf("%s: logits_from %d outside 0..%d", who, logits_from, R);
    if (pos + R > ctx) return tdm_errf("context full: %d + %d verify rows exceed --ctx %d", pos, R, ctx);
    for (int r = 0; r < R; r++)
        if (ids[r] < 0 || ids[r] >= c->vocab) return tdm_errf("token id %d is out of the vocabulary (%d ids)", ids[r], c->vocab);
    return 0;
}

int tdm_engine_verify_ids(struct tdm_engine *e, const int32_t *ids, int R, int logits_from, float *logits, int32_t *out_ids)
{
    if (verify_check(e, "tdm_engine_verify", ids, R, logits_from) != 0) return -1;
    if (tdm_engine_verify_rows(e, ids, R, logits_from, logits, out_ids) != 0)
        return tdm_err_prefix("CUDA engine: verify of %d rows at position %d", R, tdm_engine_pos(e));
    return 0;
}

int tdm_engine_verify(struct tdm_engine *e, const int32_t *ids, int R, int logits_from, float *logits)
{
    return tdm_engine_verify_ids(e, ids, R, logits_from, logits, NULL);
}

int tdm_engine_verify_tree_ids(struct tdm_engine *e, const int32_t *ids, const int *parent, int n, int logits_from,
                               float *logits, int32_t *out_ids)
{
    if (verify_check(e, "tdm_engine_verify_tree", ids, n, logits_from) != 0) return -1;
    for (int t = 0; t < n; t++)
        if (t == 0 ? parent[0] != -1 : parent[t] < 0 || parent[t] >= t)
            return tdm_errf("tdm_engine_verify_tree: node %d's parent %d: node 0 is the root (-1), every other node's "
                            "parent comes before it", t, parent[t]);
    if (tdm_engine_verify_tree_rows(e, ids, parent, n, logits_from, logits, out_ids) != 0)
        return tdm_err_prefix("CUDA engine: tree verify of %d nodes at position %d", n, tdm_engine_pos(e));
    return 0;
}

int tdm_engine_verify_tree(struct tdm_engine *e, const int32_t *ids, const int *parent, int n, int logits_from, float *logits)
{
    return tdm_engine_verify_tree_ids(e, ids, parent, n, logits_from, logits, NULL);
}

int tdm_engine_commit_path(struct tdm_engine *e, const int *path, int len)
{
    const int R = tdm_engine_round_rows(e), pos = tdm_engine_pos(e);
    if (R == 0) return tdm_errf("tdm_engine_commit: no verify round to commit at position %d", pos);
    if (len < 1 || len > R) return tdm_errf("tdm_engine_commit: %d rows of a %d-row round: commit 1 to %d", len, R, R);
    const int *parent = tdm_engine_round_parents(e);
    for (int j = 0; j < len; j++)
        if (j == 0 ? path[0] != 0 : path[j] <= 0 || path[j] >= R || parent[path[j]] != path[j - 1])
            return tdm_errf("tdm_engine_commit: path[%d] = %d is not %s", j, path[j],
                            j == 0 ? "the root 0" : "a child of the path's previous node in the round");
    if (tdm_engine_commit_path_rows(e, path, len) != 0)
        return tdm_err_prefix("CUDA engine: commit of %d of %d rows at position %d", len, R, pos);
    return 0;
}

int tdm_engine_commit(struct tdm_engine *e, int j)
{
    int path[TDM_ENGINE_MAX_ROWS];
    for (int i = 0; i < j && i < TDM_ENGINE_MAX_ROWS; i++) path[i] = i;
    return tdm_engine_commit_path(e, path, j);
}
