/* jsonfile.h — a small JSON file (config, shard index, tile table) read whole and parsed. */
#ifndef TDM_JSONFILE_H
#define TDM_JSONFILE_H
#include <jansson.h>
#include <stddef.h>

/* Reads path (at most cap bytes) and parses it; the top level must be an object. Returns a new
 * reference, or NULL with tdm_err() naming the file and the fault ("not JSON: ... (line N)",
 * "not a JSON object"). */
json_t *tdm_json_read_object(const char *path, size_t cap);
#endif
