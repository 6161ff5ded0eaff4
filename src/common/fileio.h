/* fileio.h — whole-file reads and atomic writes (temporary file beside the target, fsync, rename),
 * so that a crash never leaves a half-written result under the final name. */
#ifndef TDM_FILEIO_H
#define TDM_FILEIO_H
#include <stdio.h>
#include <stddef.h>
#ifdef __cplusplus
extern "C" {
#endif

/* Reads a whole file (NUL-terminated copy); max_bytes caps the size. Returns 0 or -1 (tdm_err). */
int tdm_read_file(const char *path, size_t max_bytes, char **buf, size_t *len);

struct tdm_atomic { FILE *f; char *path, *tmp; };
int tdm_atomic_open(struct tdm_atomic *a, const char *path);
/* Flushes, fsyncs and renames into place; on any failure removes the temporary. */
int tdm_atomic_commit(struct tdm_atomic *a);
void tdm_atomic_abort(struct tdm_atomic *a);
/* Writes len bytes atomically to path. */
int tdm_write_file_atomic(const char *path, const void *data, size_t len);
#ifdef __cplusplus
}
#endif
#endif
