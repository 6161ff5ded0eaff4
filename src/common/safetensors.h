/* safetensors.h — one reader for checkpoints, fixtures and dumps, and one writer.
 * The reader maps the file and validates everything before anyone touches a byte: the header
 * length (capped), the JSON, every dtype, shape and offset, size = shape x dtype, and that the
 * tensors cover the data area exactly (no holes, no overlaps). */
#ifndef TDM_SAFETENSORS_H
#define TDM_SAFETENSORS_H
#include <stddef.h>
#include <stdint.h>
#include "dtype.h"
#ifdef __cplusplus
extern "C" {
#endif

#define TDM_ST_MAX_DIMS 8
#define TDM_ST_HEADER_CAP (100u << 20) /* bytes of JSON header we accept */

struct tdm_stfile;

struct tdm_tensor {
    const char *name;
    enum tdm_dtype dtype;
    int ndim;
    int64_t shape[TDM_ST_MAX_DIMS];
    int64_t numel;
    size_t nbytes;
    const void *data;              /* aligned to the element size */
    const struct tdm_stfile *file;
};

struct tdm_stfile {
    char *path;
    void *map;
    size_t size;
    int ntensors;
    struct tdm_tensor *tensors;   /* sorted by name */
    void **copies;                /* tensors re-aligned into the heap (rare) */
    int ncopies;
};

/* Opens and validates; returns NULL with tdm_err() naming the file and the fault. */
struct tdm_stfile *tdm_st_open(const char *path);
/* Validates an in-memory image (used by the fuzz target and by tdm_st_open). */
struct tdm_stfile *tdm_st_parse(const char *name, const void *buf, size_t size);
void tdm_st_close(struct tdm_stfile *f);
const struct tdm_tensor *tdm_st_find(const struct tdm_stfile *f, const char *name);

/* Writing: describe every tensor first, then put the data in order (or all at once). */
struct tdm_st_desc {
    const char *name;
    enum tdm_dtype dtype;
    int ndim;
    int64_t shape[TDM_ST_MAX_DIMS];
    const void *data;              /* for tdm_st_write; ignored by the streaming writer */
};
struct tdm_st_writer;
struct tdm_st_writer *tdm_stw_begin(const char *path, const struct tdm_st_desc *d, int n);
int tdm_stw_put(struct tdm_st_writer *w, const void *data, size_t nbytes); /* more bytes, in order; may span a tensor in pieces */
int tdm_stw_finish(struct tdm_st_writer *w);                               /* atomic rename */
void tdm_stw_abort(struct tdm_st_writer *w);
int tdm_st_write(const char *path, const struct tdm_st_desc *d, int n);
size_t tdm_st_desc_bytes(const struct tdm_st_desc *d);
#ifdef __cplusplus
}
#endif
#endif
