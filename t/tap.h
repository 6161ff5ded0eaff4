/* tap.h — a few lines of TAP for the C unit tests under t/unit, run by prove through t/NAME.t. */
#ifndef TDM_TAP_H
#define TDM_TAP_H
#include <stdio.h>
#include <stdlib.h>

static int tap_n, tap_failed;
#define ok(cond, ...)                                                    \
    do {                                                                 \
        int ok_ = !!(cond);                                              \
        tap_n++;                                                         \
        if (!ok_) tap_failed++;                                          \
        printf("%sok %d - ", ok_ ? "" : "not ", tap_n);                  \
        printf(__VA_ARGS__);                                             \
        printf("\n");                                                    \
        if (!ok_) printf("#   failed at %s:%d\n", __FILE__, __LINE__);   \
        fflush(stdout);                                                  \
    } while (0)
#define skip_all(...)                      \
    do {                                   \
        printf("1..0 # SKIP ");            \
        printf(__VA_ARGS__);               \
        printf("\n");                      \
        exit(0);                           \
    } while (0)
static inline int done_testing(void)
{
    printf("1..%d\n", tap_n);
    return tap_failed ? 1 : 0;
}
#endif
