/* device.h — the CUDA runtime as plain C for host code: device discovery, memory, streams,
 * events and graphs. Every call is checked; failures return -1 with tdm_err() set. */
#ifndef TDM_DEVICE_H
#define TDM_DEVICE_H
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

struct tdm_device_info {
    char name[256];
    int sm_major, sm_minor, sm_count;
    size_t l2_bytes, global_bytes;
    int max_smem_per_block_optin;
};

/* Number of visible CUDA devices; 0 when there is no device or no driver (never an error). */
int tdm_cuda_device_count(void);
int tdm_cuda_device_info(int dev, struct tdm_device_info *info);

int tdm_cuda_malloc(void **p, size_t bytes);
void tdm_cuda_free(void *p);
/* Copies and fills that have landed when they return: a kernel launched after them on any stream
 * sees the bytes (device.cu). */
int tdm_cuda_h2d(void *dst, const void *src, size_t bytes);
int tdm_cuda_d2h(void *dst, const void *src, size_t bytes);
int tdm_cuda_memset(void *p, int byte, size_t bytes);
int tdm_cuda_sync(void);
int tdm_cuda_mem_info(size_t *free_bytes, size_t *total_bytes);
/* Whether kernels that may start before the one ahead of them in their stream has finished (the
 * programmatic dependent launches of kernels/pdl.cuh) are launched so: TANDEM_PDL, read at the first
 * call, unless tdm_cuda_set_pdl() said otherwise (tests compare the two in one process). */
int tdm_cuda_pdl(void);
void tdm_cuda_set_pdl(int on);

typedef void *tdm_stream;   /* cudaStream_t */
typedef void *tdm_event;    /* cudaEvent_t */
typedef void *tdm_graph;    /* cudaGraphExec_t */
int tdm_stream_create(tdm_stream *s);
void tdm_stream_destroy(tdm_stream s);
int tdm_stream_sync(tdm_stream s);
int tdm_event_create(tdm_event *e);
/* An event for ordering only (no timestamps: cudaEventDisableTiming), cheaper to record and wait
 * on; tdm_event_ms cannot time it. */
int tdm_event_create_sync(tdm_event *e);
void tdm_event_destroy(tdm_event e);
int tdm_event_record(tdm_event e, tdm_stream s);
/* Work launched on s after this call waits for the work before e's last record (cudaStreamWaitEvent);
 * inside a graph capture, a record on the capturing stream and a wait on another stream fork the
 * capture into that stream, and a record there and a wait on the capturing stream join it back. */
int tdm_stream_wait(tdm_stream s, tdm_event e);
/* Records e on s and makes waiter wait for it: work launched on waiter afterwards runs after
 * everything launched on s so far (a fork or a join of two streams). */
int tdm_stream_after(tdm_stream waiter, tdm_stream s, tdm_event e);
int tdm_event_ms(tdm_event start, tdm_event stop, float *ms);
/* Capture everything launched on s between begin and end into an instantiated graph. */
int tdm_graph_begin(tdm_stream s);
int tdm_graph_end(tdm_stream s, tdm_graph *g);
int tdm_graph_launch(tdm_graph g, tdm_stream s);
void tdm_graph_destroy(tdm_graph g);

#ifdef __cplusplus
}
#endif
#endif
