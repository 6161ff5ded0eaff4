/* err.h — one error message per thread: library calls return -1 (or NULL) after tdm_errf()
 * recorded why; a tool prints tdm_err() as one line and exits 2. */
#ifndef TDM_ERR_H
#define TDM_ERR_H
#include <stdio.h>
#ifdef __cplusplus
extern "C" {
#endif

/* Records a formatted message ("FILE: fault") and returns -1. */
int tdm_errf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Prefixes the recorded message with "prefix: " (adds context on the way up); returns -1. */
int tdm_err_prefix(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *tdm_err(void);

/* Exit codes shared by every tool. */
enum { TDM_EXIT_OK = 0, TDM_EXIT_CHECK = 1, TDM_EXIT_USAGE = 2 };

/* Prints "prog: message" (the recorded error) to stderr and exits 2 (bad usage or bad input). */
__attribute__((noreturn)) void tdm_die_input(const char *prog);
/* Prints "prog: msg" or "prog: msg: arg" and exits 2 (bad usage). */
__attribute__((noreturn)) void tdm_die_usage(const char *prog, const char *msg, const char *arg);
/* Prints "prog: message" (the recorded error) and exits 1 (a check or a CUDA call failed). */
__attribute__((noreturn)) void tdm_die_check(const char *prog);
/* An integer option value in lo..hi, or exit 2 with one line naming the option and the range. */
long tdm_opt_long(const char *prog, const char *opt, const char *v, long lo, long hi);
struct option;
/* getopt_long with getopt's own messages off: an unknown option, or one without its value, exits 2
 * with one line naming it ("prog: unknown option '--x' (--help lists the options)"). */
int tdm_getopt(const char *prog, int argc, char **argv, const char *shortopts, const struct option *longopts);
#ifdef __cplusplus
}
#endif
#endif
