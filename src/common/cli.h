/* cli.h — small pieces the tools share: a monotonic clock for wall times, and the parsing of
 * comma-separated integer lists (--rows, --mlp-only-layers). */
#ifndef TDM_CLI_H
#define TDM_CLI_H

/* Milliseconds on the monotonic clock (differences only). */
double tdm_now_ms(void);

/* s: integers in lo..hi separated by single commas ("" is the empty list). Writes them to
 * out[0..max-1] in order and returns their count, or -1 when s is not such a list (a stray
 * character, an empty item such as a trailing comma, a value outside lo..hi, more than max). */
int tdm_parse_int_list(const char *s, long lo, long hi, int *out, int max);

#endif
