/* gputest.h — the helpers the GPU test programs share (the t/unit programs that run on the GPU): a deterministic
 * generator, TAP bail-outs, checked allocations and copies, the relative error with routing near
 * ties excused. Header-only (static), included after
 * tap.h by each program. */
#ifndef TDM_GPUTEST_H
#define TDM_GPUTEST_H
#include "compare.h"
#include "device.h"
#include "err.h"
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static inline uint64_t next(void)
{
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return rng;
}
static inline float frand(void) { return (float)((next() >> 40) & 0xffffff) / 8388608.0f - 1.0f; } /* [-1, 1) */

static inline void bail(const char *what)
{
    printf("Bail out! %s: %s\n", what, tdm_err());
    exit(1);
}
static inline void *dal(size_t bytes)
{
    void *p = NULL;
    if (tdm_cuda_malloc(&p, bytes ? bytes : 1) != 0) bail("cudaMalloc");
    return p;
}
/* Zeroed host memory. */
static inline void *hal(size_t bytes)
{
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) { printf("Bail out! out of host memory\n"); exit(1); }
    return p;
}
/* Copies to the device, fenced by device-wide synchronisations on both sides (the tests' streams
 * do not wait for the legacy stream). */
static inline void up(void *d, const void *h, size_t n)
{
    if (tdm_cuda_sync() != 0 || tdm_cuda_h2d(d, h, n) != 0 || tdm_cuda_sync() != 0) bail("copy to device");
}
/* ||got - ref|| / ||ref|| over rows of V, leaving out a row whose own error exceeds bound where
 * the CPU reference saw a routing near tie at it (gaps[i] < TDM_ROUTER_NEAR_TIE, compare.h; +inf
 * without MoE): reported with its margin, counted in *nskip, marked in skip[]. */
static inline double rel_err_excused(const char *what, const float *got, const float *ref, int rows, int V,
                                     const float *gaps, double bound, int *skip, int *nskip)
{
    double num = 0, den = 0;
    *nskip = 0;
    for (int i = 0; i < rows; i++) {
        const double e = tdm_rel_err(got + (size_t)i * V, ref + (size_t)i * V, V);
        skip[i] = e > bound && gaps[i] < TDM_ROUTER_NEAR_TIE;
        if (skip[i]) {
            (*nskip)++;
            printf("# %s row %d: relative error %.2e at a routing near tie (router margin %.4f): reported, left out\n", what,
                   i, e, gaps[i]);
            continue;
        }
        for (int j = 0; j < V; j++) {
            const double d = (double)got[(size_t)i * V + j] - ref[(size_t)i * V + j];
            num += d * d;
            den += (double)ref[(size_t)i * V + j] * ref[(size_t)i * V + j];
        }
    }
    return isnan(num) ? INFINITY : den > 0 ? sqrt(num / den) : sqrt(num);
}

#endif
