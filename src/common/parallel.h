/* parallel.h — rows [0, n) split over threads, for host work whose rows are independent. */
#ifndef TDM_PARALLEL_H
#define TDM_PARALLEL_H
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif
#define TDM_PARALLEL_MAX_THREADS 64
/* Calls fn on a partition of rows [0, n) into up to `threads` ranges (multiples of grain; at most
 * TDM_PARALLEL_MAX_THREADS), one a thread, and returns when every range is done. A range no thread
 * could be made for runs on the caller's thread; fewer than 2 grains, or threads < 2: one call. */
void tdm_parallel_rows(int threads, int64_t n, int64_t grain, void (*fn)(void *ctx, int64_t r0, int64_t r1), void *ctx);
/* The largest magnitude over rows [0, n) of k floats each, row(ctx, r, out) writing row r into out,
 * over tdm_parallel_rows (a maximum: the same whatever the split). Returns 0 with *amax, or -1 when
 * a range's row buffer could not be allocated. */
int tdm_parallel_amax(int threads, int64_t n, int64_t k, void (*row)(void *ctx, int64_t r, float *out), void *ctx,
                      float *amax);
#ifdef __cplusplus
}
#endif
#endif
