// device.cu — the CUDA runtime behind device.h.
#include "device.h"
#include "cuda_check.h"
#include "settings.h"
#include <stdio.h>
#include <string.h>

extern "C" int tdm_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError(); /* clear the sticky "no device / no driver" */
        return 0;
    }
    return n;
}

extern "C" int tdm_cuda_device_info(int dev, struct tdm_device_info *info)
{
    cudaDeviceProp p;
    TDM_CUDA_TRY(cudaGetDeviceProperties(&p, dev));
    memset(info, 0, sizeof *info);
    snprintf(info->name, sizeof info->name, "%s", p.name);
    info->sm_major = p.major;
    info->sm_minor = p.minor;
    info->sm_count = p.multiProcessorCount;
    info->l2_bytes = (size_t)p.l2CacheSize;
    info->global_bytes = p.totalGlobalMem;
    info->max_smem_per_block_optin = (int)p.sharedMemPerBlockOptin;
    return 0;
}

extern "C" int tdm_cuda_malloc(void **p, size_t bytes)
{
    *p = NULL;
    cudaError_t e = cudaMalloc(p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        size_t fr = 0, tot = 0;
        (void)cudaGetLastError();
        cudaMemGetInfo(&fr, &tot);
        return tdm_errf("CUDA: out of device memory: %zu MiB asked, %zu of %zu MiB free (%s)", bytes >> 20,
                        fr >> 20, tot >> 20, cudaGetErrorString(e));
    }
    return 0;
}

extern "C" void tdm_cuda_free(void *p) { if (p) cudaFree(p); }
// cudaMemcpy from pageable host memory may return before its last DMA has landed, and cudaMemset
// returns at once; both run on the legacy stream, which the non-blocking streams the kernels run on
// (tdm_stream_create) do not wait for. So both wait here: a kernel launched after the call, on any
// stream, reads the bytes written. (matmul.t failed once in a way this would explain, a check
// of a freshly uploaded x run beside the other GPU tests; bench/NOTES.md, "Uploads that had not
// landed".)
extern "C" int tdm_cuda_h2d(void *d, const void *s, size_t n)
{
    TDM_CUDA_TRY(cudaMemcpy(d, s, n, cudaMemcpyHostToDevice));
    TDM_CUDA_TRY(cudaStreamSynchronize(cudaStreamLegacy));
    return 0;
}
extern "C" int tdm_cuda_d2h(void *d, const void *s, size_t n) { TDM_CUDA_TRY(cudaMemcpy(d, s, n, cudaMemcpyDeviceToHost)); return 0; }
extern "C" int tdm_cuda_memset(void *p, int b, size_t n)
{
    TDM_CUDA_TRY(cudaMemset(p, b, n));
    TDM_CUDA_TRY(cudaStreamSynchronize(cudaStreamLegacy));   // as tdm_cuda_h2d
    return 0;
}
extern "C" int tdm_cuda_sync(void) { TDM_CUDA_TRY(cudaDeviceSynchronize()); return 0; }
extern "C" int tdm_cuda_mem_info(size_t *f, size_t *t) { TDM_CUDA_TRY(cudaMemGetInfo(f, t)); return 0; }

static int pdl_on = -1;   // -1: not read yet
extern "C" int tdm_cuda_pdl(void)
{
    if (pdl_on < 0) pdl_on = strcmp(tdm_setting("TANDEM_PDL"), "off") != 0;
    return pdl_on;
}
extern "C" void tdm_cuda_set_pdl(int on) { pdl_on = on ? 1 : 0; }

extern "C" int tdm_stream_create(tdm_stream *s)
{
    cudaStream_t st;
    TDM_CUDA_TRY(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    *s = st;
    return 0;
}
extern "C" void tdm_stream_destroy(tdm_stream s) { if (s) cudaStreamDestroy((cudaStream_t)s); }
extern "C" int tdm_stream_sync(tdm_stream s) { TDM_CUDA_TRY(cudaStreamSynchronize((cudaStream_t)s)); return 0; }

extern "C" int tdm_event_create(tdm_event *e)
{
    cudaEvent_t ev;
    TDM_CUDA_TRY(cudaEventCreate(&ev));
    *e = ev;
    return 0;
}
extern "C" int tdm_event_create_sync(tdm_event *e)
{
    cudaEvent_t ev;
    TDM_CUDA_TRY(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    *e = ev;
    return 0;
}
extern "C" void tdm_event_destroy(tdm_event e) { if (e) cudaEventDestroy((cudaEvent_t)e); }
extern "C" int tdm_event_record(tdm_event e, tdm_stream s) { TDM_CUDA_TRY(cudaEventRecord((cudaEvent_t)e, (cudaStream_t)s)); return 0; }
extern "C" int tdm_stream_wait(tdm_stream s, tdm_event e)
{
    TDM_CUDA_TRY(cudaStreamWaitEvent((cudaStream_t)s, (cudaEvent_t)e, 0));
    return 0;
}
extern "C" int tdm_stream_after(tdm_stream waiter, tdm_stream s, tdm_event e)
{
    return tdm_event_record(e, s) != 0 || tdm_stream_wait(waiter, e) != 0 ? -1 : 0;
}
extern "C" int tdm_event_ms(tdm_event a, tdm_event b, float *ms)
{
    TDM_CUDA_TRY(cudaEventSynchronize((cudaEvent_t)b));
    TDM_CUDA_TRY(cudaEventElapsedTime(ms, (cudaEvent_t)a, (cudaEvent_t)b));
    return 0;
}

extern "C" int tdm_graph_begin(tdm_stream s)
{
    TDM_CUDA_TRY(cudaStreamBeginCapture((cudaStream_t)s, cudaStreamCaptureModeThreadLocal));
    return 0;
}
extern "C" int tdm_graph_end(tdm_stream s, tdm_graph *g)
{
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    TDM_CUDA_TRY(cudaStreamEndCapture((cudaStream_t)s, &graph));
    cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess) return tdm_errf("CUDA: cudaGraphInstantiate: %s", cudaGetErrorString(e));
    *g = exec;
    return 0;
}
extern "C" int tdm_graph_launch(tdm_graph g, tdm_stream s) { TDM_CUDA_TRY(cudaGraphLaunch((cudaGraphExec_t)g, (cudaStream_t)s)); return 0; }
extern "C" void tdm_graph_destroy(tdm_graph g) { if (g) cudaGraphExecDestroy((cudaGraphExec_t)g); }
