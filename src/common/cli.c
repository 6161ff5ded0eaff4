/* cli.c — see cli.h. */
#include "cli.h"
#include <stdlib.h>
#include <time.h>

double tdm_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int tdm_parse_int_list(const char *s, long lo, long hi, int *out, int max)
{
    int n = 0;
    if (!*s) return 0;
    for (;;) {
        char *end;
        const long v = strtol(s, &end, 10);
        if (end == s || v < lo || v > hi || n == max || (*end && *end != ',')) return -1;
        out[n++] = (int)v;
        if (!*end) return n;
        s = end + 1;
    }
}
