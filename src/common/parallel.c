#include "parallel.h"
#include <pthread.h>

struct par {
    void (*fn)(void *ctx, int64_t r0, int64_t r1);
    void *ctx;
    int64_t n, grain;
    int t, nt;
};

static void *par_main(void *arg)
{
    struct par *p = arg;
    const int64_t units = (p->n + p->grain - 1) / p->grain;
    int64_t r0 = units * p->t / p->nt * p->grain, r1 = units * (p->t + 1) / p->nt * p->grain;
    if (r1 > p->n) r1 = p->n;
    if (r0 < r1) p->fn(p->ctx, r0, r1);
    return NULL;
}

void tdm_parallel_rows(int threads, int64_t n, int64_t grain, void (*fn)(void *ctx, int64_t r0, int64_t r1), void *ctx)
{
    enum { MAXT = TDM_PARALLEL_MAX_THREADS };
    const int nt = threads < MAXT ? threads : MAXT;
    if (n < 2 * grain || nt < 2) {
        fn(ctx, 0, n);
        return;
    }
    pthread_t th[MAXT];
    struct par ps[MAXT];
    int joined[MAXT] = {0};
    for (int t = 0; t < nt; t++) ps[t] = (struct par){fn, ctx, n, grain, t, nt};
    for (int t = 1; t < nt; t++)
        if (pthread_create(&th[t], NULL, par_main, &ps[t]) == 0) joined[t] = 1;
        else par_main(&ps[t]);   /* no thread: this range runs here */
    par_main(&ps[0]);
    for (int t = 1; t < nt; t++)
        if (joined[t]) pthread_join(th[t], NULL);
}
