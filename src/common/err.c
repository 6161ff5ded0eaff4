#include <errno.h>
#include "err.h"
#include <getopt.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local char msg[1024];

int tdm_errf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return -1;
}

int tdm_err_prefix(const char *fmt, ...)
{
    char pre[512], old[sizeof msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pre, sizeof pre, fmt, ap);
    va_end(ap);
    memcpy(old, msg, sizeof old);
    size_t n = strlen(pre);
    if (n > sizeof msg - 3) n = sizeof msg - 3;
    memcpy(msg, pre, n);
    msg[n] = ':';
    msg[n + 1] = ' ';
    size_t rest = sizeof msg - n - 2;
    memcpy(msg + n + 2, old, rest - 1);
    msg[sizeof msg - 1] = 0;
    return -1;
}

const char *tdm_err(void) { return msg[0] ? msg : "unknown error"; }

void tdm_die_input(const char *prog)
{
    fprintf(stderr, "%s: %s\n", prog, tdm_err());
    exit(TDM_EXIT_USAGE);
}

void tdm_die_usage(const char *prog, const char *msg, const char *arg)
{
    fprintf(stderr, "%s: %s%s%s\n", prog, msg, arg ? ": " : "", arg ? arg : "");
    exit(TDM_EXIT_USAGE);
}

void tdm_die_check(const char *prog)
{
    fprintf(stderr, "%s: %s\n", prog, tdm_err());
    exit(TDM_EXIT_CHECK);
}

long tdm_opt_long(const char *prog, const char *opt, const char *v, long lo, long hi)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (!*v || *end || errno || x < lo || x > hi) {
        fprintf(stderr, "%s: %s %s: expected an integer from %ld to %ld\n", prog, opt, v, lo, hi);
        exit(TDM_EXIT_USAGE);
    }
    return x;
}

/* The long option named by argv token arg ("--name" or "--name=value"), or NULL. */
static const struct option *long_opt(const struct option *longopts, const char *arg)
{
    if (strncmp(arg, "--", 2) != 0) return NULL;
    const size_t len = strcspn(arg + 2, "=");
    for (const struct option *o = longopts; o && o->name; o++)
        if (strlen(o->name) == len && strncmp(arg + 2, o->name, len) == 0) return o;
    return NULL;
}

int tdm_getopt(const char *prog, int argc, char **argv, const char *shortopts, const struct option *longopts)
{
    opterr = 0;
    const int c = getopt_long(argc, argv, shortopts, longopts, NULL);
    if (c != '?') return c;
    const char *arg = optind > 0 && optind <= argc ? argv[optind - 1] : "";
    const struct option *o = long_opt(longopts, arg);
    char name[64];
    const char *fault;   /* NULL: no such option */
    if (strncmp(arg, "--", 2) == 0 && (!optopt || (o && o->val == optopt))) {   /* a long option, as written */
        snprintf(name, sizeof name, "%.*s", (int)strcspn(arg, "="), arg);
        fault = !o ? NULL : o->has_arg == no_argument ? "takes no value" : "needs a value";
        if (!o) fprintf(stderr, "%s: unknown or ambiguous option '%s' (--help lists the options)\n", prog, name);
    } else {   /* a short option: known (its value missing) or not */
        snprintf(name, sizeof name, "-%c", optopt ? optopt : '?');
        fault = optopt && optopt != ':' && strchr(shortopts, optopt) ? "needs a value" : NULL;
        if (!fault) fprintf(stderr, "%s: unknown option '%s' (--help lists the options)\n", prog, name);
    }
    if (fault) fprintf(stderr, "%s: option '%s' %s (--help lists the options)\n", prog, name, fault);
    exit(TDM_EXIT_USAGE);
}
