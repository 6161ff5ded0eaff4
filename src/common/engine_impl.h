/* engine_impl.h — the hooks engine.c gives engine_spec.c (the speculative rounds' protocol), so that
 * the round's bookkeeping and checks live apart from the engine's launch sequences. Not for tools:
 * they take engine.h. */
#ifndef TDM_ENGINE_IMPL_H
#define TDM_ENGINE_IMPL_H
#include "engine.h"

const struct tdm_model *tdm_engine_model(const struct tdm_engine *e);
int tdm_engine_ctx(const struct tdm_engine *e);
/* Rows of the last verify that a commit may take; 0 when there is none (after a forward, a reset,
 * a commit, or a failed verify). */
int tdm_engine_round_rows(const struct tdm_engine *e);
/* The launches of a verify of R rows (checked by the caller: 1..TDM_ENGINE_MAX_ROWS, in the context,
 * ids in the vocabulary, 0 <= from <= R) and of a commit of j of them (1 <= j <= the round's rows),
 * as engine.h's tdm_engine_verify and tdm_engine_commit describe; the stream is synchronised on
 * return. */
int tdm_engine_verify_rows(struct tdm_engine *e, const int32_t *ids, int R, int from, float *logits);
int tdm_engine_commit_rows(struct tdm_engine *e, int j);
/* A tree verify (parent checked by the caller: parent[0] = -1, 0 <= parent[r] < r) and the commit
 * of a root-to-node path of the last verify (checked against its parents: path[0] = 0, path[j]'s
 * parent path[j-1]); a path 0..len-1 commits as tdm_engine_commit_rows(e, len). */
int tdm_engine_verify_tree_rows(struct tdm_engine *e, const int32_t *ids, const int *parent, int R, int from,
                                float *logits);
int tdm_engine_commit_path_rows(struct tdm_engine *e, const int *path, int len);
/* The parents of the last verify's rows (a chain's are r - 1); valid while tdm_engine_round_rows
 * is not 0. */
const int *tdm_engine_round_parents(const struct tdm_engine *e);
#endif
