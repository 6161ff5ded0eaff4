/* jsonfile.h — a small JSON file (config, shard index, tile table, a tool's report), read whole
 * and parsed, or written atomically. */
#ifndef TDM_JSONFILE_H
#define TDM_JSONFILE_H
#include <jansson.h>
#include <stddef.h>

/* Reads path (at most cap bytes) and parses it; the top level must be an object. Returns a new
 * reference, or NULL with tdm_err() naming the file and the fault ("not JSON: ... (line N)",
 * "not a JSON object"). */
json_t *tdm_json_read_object(const char *path, size_t cap);
/* Writes j to path as json_dumps formats it with flags (JSON_INDENT, JSON_SORT_KEYS, ...), plus a
 * trailing newline, atomically (fileio.h: a temporary beside it, fsync, rename): a crash or a full
 * disk leaves the old file or none, never half of one. 0, or -1 with tdm_err() naming the file. */
int tdm_json_write_atomic(const char *path, const json_t *j, size_t flags);
#endif
