#include "parallel.h"
#include <math.h>
#include <pthread.h>
#include <stdlib.h>

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

struct amax_job {
    void (*row)(void *ctx, int64_t r, float *out);
    void *ctx;
    int64_t k;
    pthread_mutex_t mu;   /* amax and oom */
    float amax;
    int oom;
};

static void amax_range(void *ctx, int64_t r0, int64_t r1)
{
    struct amax_job *j = ctx;
    float *buf = malloc((size_t)j->k * sizeof(float)), amax = 0.0f;
    if (!buf) {
        pthread_mutex_lock(&j->mu);
        j->oom = 1;
        pthread_mutex_unlock(&j->mu);
        return;
    }
    for (int64_t r = r0; r < r1; r++) {
        j->row(j->ctx, r, buf);
        for (int64_t c = 0; c < j->k; c++) amax = fmaxf(amax, fabsf(buf[c]));
    }
    free(buf);
    pthread_mutex_lock(&j->mu);
    j->amax = fmaxf(j->amax, amax);
    pthread_mutex_unlock(&j->mu);
}

int tdm_parallel_amax(int threads, int64_t n, int64_t k, void (*row)(void *ctx, int64_t r, float *out), void *ctx,
                      float *amax)
{
    struct amax_job j = {.row = row, .ctx = ctx, .k = k};
    pthread_mutex_init(&j.mu, NULL);
    tdm_parallel_rows(threads, n, 1, amax_range, &j);
    pthread_mutex_destroy(&j.mu);
    if (j.oom) return -1;
    *amax = j.amax;
    return 0;
}
