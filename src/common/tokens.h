/* tokens.h — token files: decimal ids separated by white space; '#' starts a comment to end of line. */
#ifndef TDM_TOKENS_H
#define TDM_TOKENS_H
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

/* Parses buf (len bytes, need not be NUL-terminated). vocab > 0 rejects ids >= vocab.
 * An empty file is an error unless allow_empty. name is used in messages. */
int tdm_tokens_parse(const char *name, const char *buf, size_t len, int64_t vocab, int allow_empty,
                     int32_t **ids, int *n);
/* Reads path ("-" or NULL: standard input). */
int tdm_tokens_read(const char *path, int64_t vocab, int allow_empty, int32_t **ids, int *n);
/* Writes ids one per line, atomically. */
int tdm_tokens_write(const char *path, const int32_t *ids, int n);
#ifdef __cplusplus
}
#endif
#endif
