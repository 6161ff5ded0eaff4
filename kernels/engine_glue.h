/* engine_glue.h — the small kernels the CUDA engine (src/common/engine.c) needs between the
 * projection products (matmul.h) and the layer kernels (layers.h): the embedding row gather, the
 * dense MLP's SiLU(gate) * up, and asynchronous copies on the engine's stream. Each replaces a
 * line of the CPU reference (src/common/ref.c, named per launcher) and is checked against it in
 * t/unit/engine_gpu.c. Conventions as layers.h: activations BF16 (uint16_t) row-major, an
 * explicit stream (cudaStream_t, NULL = legacy default), every launch checked, 0 or -1 with
 * tdm_err(). The kernels are copies or elementwise per row: a row's bits never depend on the other
 * rows. */
#ifndef TDM_ENGINE_GLUE_H
#define TDM_ENGINE_GLUE_H
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

/* h[r][:] = row ids[r] of the embedding table [V][H] (ref: tdm_ref_forward's tdm_qweight_row):
 * table_f32 = 0: BF16 rows copied bit for bit; 1: F32 rows rounded to BF16 (the reference keeps
 * them FP32: the only place the engine rounds where the reference does not; the fixtures' tables
 * are BF16). ids [M] in device memory; an id outside 0..V-1 writes a row of NaN (the host checks
 * ids before it launches). */
int tdm_embed_rows(const void *table, int table_f32, int64_t V, int H, const int32_t *ids, int M, uint16_t *h,
                   void *stream);

/* out[r][i] = bf16(bf16(silu(g[r][i])) * u[r][i]) (ref: mlp_forward), for M rows of I values; g, u
 * and out [M][I] contiguous; out may be g or u. silu(x) = x / (1 + expf(-x)) as ref.c's siluf.
 * outb: out's blocked copy (layers.h: tdm_add_rmsnorm). */
int tdm_silu_mul(const uint16_t *g, const uint16_t *u, int64_t I, int M, uint16_t *out, uint16_t *outb, void *stream);

/* A tree commit's gather (ref: tdm_ref_commit's copy of the accepted path's K/V rows; the GDN rows
 * of the path fed in order): rows [][W] BF16 with row stride ld (elements) from row base (the
 * device int32 *d_base instead when not NULL); for t = 0..n-1 in that order, row t = row path[t].
 * path [n] is in device memory and increasing from path[0] >= 0 (a root-to-node path of a tree
 * whose nodes come after their parents), so path[t] >= t and every row is read before anything
 * overwrites it. In place; one thread a column, the rows in sequence; copies only. The caller
 * owns rows base..base + path[n-1]. */
int tdm_rows_compact(uint16_t *rows, int64_t ld, int W, int base, const int32_t *d_base, const int32_t *path, int n,
                     void *stream);

/* cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream): host<->device in either direction.
 * From pageable host memory the source may be reused on return; to pageable host memory the
 * copy is complete on return (CUDA's rules); sync the stream before reading pinned results. */
int tdm_copy_async(void *dst, const void *src, size_t bytes, void *stream);

/* cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDefault, stream): rows of width
 * bytes from src (spitch bytes apart) to dst (dpitch bytes apart), on the engine's stream (the MTP
 * drafter places its two normed halves side by side: [e | h] per row). */
int tdm_copy2d_async(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows, void *stream);

#ifdef __cplusplus
}
#endif
#endif
