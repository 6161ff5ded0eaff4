// coldbw.cu — memory-bound helper kernels: the streaming read and copy that tandem-coldbw times,
// pseudo-random fills for tests, sweeps and benchmarks (never time on zeros), and a bitwise diff.
#include "matmul.h"
#include "mm_layout.h"
#include "cuda_check.h"
#include "device.h"
#include "pdl.cuh"
#include <cuda_bf16.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <vector>

namespace {

__device__ __forceinline__ uint64_t mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

__global__ void fill_bytes_kernel(uint8_t *p, size_t n, uint64_t seed, uint8_t mask, uint8_t set)
{
    for (size_t i = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) * 8; i < n; i += (size_t)gridDim.x * blockDim.x * 8) {
        uint64_t r = mix64(seed ^ (i * 0x2545f4914f6cdd1dull));
        for (int b = 0; b < 8 && i + b < n; b++) p[i + b] = (uint8_t)(((r >> (8 * b)) & mask) | set);
    }
}

__global__ void fill_bf16_kernel(uint16_t *p, size_t n, uint64_t seed, float amp)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float u = (float)(mix64(seed ^ (i * 0x2545f4914f6cdd1dull)) >> 40) * (1.0f / 16777216.0f);
        __nv_bfloat16 b = __float2bfloat16_rn((2.0f * u - 1.0f) * amp);
        p[i] = *reinterpret_cast<uint16_t *>(&b);
    }
}

__global__ void fill_f32_kernel(float *p, size_t n, uint64_t seed, float lo, float hi)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float u = (float)(mix64(seed ^ (i * 0x2545f4914f6cdd1dull)) >> 40) * (1.0f / 16777216.0f);
        p[i] = lo + (hi - lo) * u;
    }
}

__global__ void diff_kernel(const uint8_t *a, const uint8_t *b, size_t n, unsigned long long *count)
{
    unsigned long long c = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        c += a[i] != b[i];
    // one partial per thread, summed on the host: no atomics anywhere in the project's kernels
    count[blockIdx.x * (size_t)blockDim.x + threadIdx.x] = c;
}

// Streaming read: 16-byte loads, four in flight per thread per iteration, XOR-folded into one
// word per thread so the loads cannot be removed.
__global__ void read_kernel(const uint4 *p, size_t n16, uint64_t *sink)
{
    uint32_t acc = 0;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n16; i += 4 * stride) {
        uint4 a = __ldcs(p + i), b = __ldcs(p + i + stride), c = __ldcs(p + i + 2 * stride), d = __ldcs(p + i + 3 * stride);
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < n16; i += stride) {
        uint4 a = __ldcs(p + i);
        acc ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    if (acc == 0x9e3779b9u) sink[0] = acc;   // practically never taken; keeps the reads live
}

__global__ void copy_kernel(uint4 *dst, const uint4 *src, size_t n16)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    for (; i + stride < n16; i += 2 * stride) {
        uint4 a = __ldcs(src + i), b = __ldcs(src + i + stride);
        __stcs(dst + i, a);
        __stcs(dst + i + stride, b);
    }
    for (; i < n16; i += stride) __stcs(dst + i, __ldcs(src + i));
}

// The skinny kernel's weight reads alone (mm_skinny.cuh, NVFP4): a warp owns 16 rows (two n8-tiles)
// and one chain of K; in each slab lane (g, t) loads 16 bytes of rows g and g + 8 at 64 * slab +
// 16 t (TDM_ROWS_STORED), or its 32 bytes of the warp's 1 KB where the layout puts that
// (enum tdm_rows_layout), with `D` slabs in flight; no decode, no mma, the words XOR-folded so the
// loads stay. What the access pattern and the depth of loads in flight allow, apart from the arithmetic.
template <int D>
__global__ void rows_read_kernel(const uint8_t *w, int64_t n, int64_t rowbytes, int chains, int layout, uint64_t *sink)
{
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int64_t warp = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5, tiles = n / 16;
    const int64_t tw = warp % tiles, ch = warp / tiles;
    if (ch >= chains) return;
    const int64_t slabs = rowbytes / 64, per = (slabs + chains - 1) / chains;   // as the kernel cuts K
    const int64_t len = per < slabs - ch * per ? per : slabs - ch * per;
    if (len <= 0) return;
    const uint8_t *p0;
    int64_t half, step;   // row g + 8's bytes from row g's; one slab to the next
    if (layout == TDM_ROWS_TILES) {
        p0 = w + (tw * slabs + ch * per) * 1024 + 32 * lane, half = 16, step = 1024;
    } else if (layout == TDM_ROWS_SLABS) {
        p0 = w + (ch * per * tiles + tw) * 1024 + 32 * lane, half = 16, step = 1024 * tiles;
    } else {
        p0 = w + (16 * tw + g) * rowbytes + ch * per * 64 + 16 * t, half = 8 * rowbytes, step = 64;
    }
    const uint8_t *p1 = p0 + half;
    uint32_t acc = 0;
    uint4 r0[D], r1[D];
#pragma unroll
    for (int d = 0; d < D; d++) {
        r0[d] = r1[d] = make_uint4(0, 0, 0, 0);
        if (d < len) { r0[d] = __ldcs((const uint4 *)(p0 + step * d)); r1[d] = __ldcs((const uint4 *)(p1 + step * d)); }
    }
    for (int64_t i = 0; i < len; i += D) {
#pragma unroll
        for (int d = 0; d < D; d++) {
            acc ^= r0[d].x ^ r0[d].y ^ r0[d].z ^ r0[d].w ^ r1[d].x ^ r1[d].y ^ r1[d].z ^ r1[d].w;
            const int64_t nx = i + d + D;
            if (nx < len) {
                r0[d] = __ldcs((const uint4 *)(p0 + step * nx));
                r1[d] = __ldcs((const uint4 *)(p1 + step * nx));
            }
        }
    }
    if (acc == 0x9e3779b9u) sink[0] = acc;
}

// A kernel that does nothing but take part in the launch order (programmatic where TANDEM_PDL is
// on): one thread bumps a counter after the wait, so each launch depends on the one before.
__global__ void floor_kernel(uint64_t *sink)
{
    tdm_pdl::release();
    tdm_pdl::wait();
    if (blockIdx.x == 0 && threadIdx.x == 0) sink[1] += 1;
}

int sm_count()
{
    static int n = 0;
    if (!n) {
        int dev = 0;
        if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
            n = 132;
    }
    return n;
}

}  // namespace

extern "C" int tdm_dev_fill_bytes(void *p, size_t bytes, uint64_t seed, uint8_t mask, uint8_t set, void *stream)
{
    if (!bytes) return 0;
    fill_bytes_kernel<<<sm_count() * 8, 256, 0, (cudaStream_t)stream>>>((uint8_t *)p, bytes, seed, mask, set);
    TDM_LAUNCH_CHECK();
    return 0;
}

extern "C" int tdm_dev_fill_bf16(uint16_t *p, size_t n, uint64_t seed, float amp, void *stream)
{
    if (!n) return 0;
    fill_bf16_kernel<<<sm_count() * 8, 256, 0, (cudaStream_t)stream>>>(p, n, seed, amp);
    TDM_LAUNCH_CHECK();
    return 0;
}

extern "C" int tdm_dev_fill_f32(float *p, size_t n, uint64_t seed, float lo, float hi, void *stream)
{
    if (!n) return 0;
    fill_f32_kernel<<<sm_count() * 8, 256, 0, (cudaStream_t)stream>>>(p, n, seed, lo, hi);
    TDM_LAUNCH_CHECK();
    return 0;
}

extern "C" int tdm_dev_count_diff(const void *a, const void *b, size_t bytes, int64_t *diff, void *stream)
{
    const int blocks = sm_count() * 4, threads = 256, parts = blocks * threads;
    unsigned long long *d, h[8192];
    TDM_CUDA_TRY(cudaMalloc(&d, (size_t)parts * sizeof *d));
    diff_kernel<<<blocks, threads, 0, (cudaStream_t)stream>>>((const uint8_t *)a, (const uint8_t *)b, bytes, d);
    cudaError_t e = cudaGetLastError();
    int64_t total = 0;
    for (int off = 0; e == cudaSuccess && off < parts; off += 8192) {
        const int cnt = parts - off < 8192 ? parts - off : 8192;
        e = cudaMemcpyAsync(h, d + off, (size_t)cnt * sizeof *d, cudaMemcpyDeviceToHost, (cudaStream_t)stream);
        if (e == cudaSuccess) e = cudaStreamSynchronize((cudaStream_t)stream);
        for (int i = 0; e == cudaSuccess && i < cnt; i++) total += (int64_t)h[i];
    }
    cudaFree(d);
    if (e != cudaSuccess) return tdm_errf("CUDA: diff: %s", cudaGetErrorString(e));
    *diff = total;
    return 0;
}

extern "C" int tdm_dev_read(const void *p, size_t bytes, uint64_t *sink, void *stream)
{
    read_kernel<<<sm_count() * 8, 512, 0, (cudaStream_t)stream>>>((const uint4 *)p, bytes / 16, sink);
    TDM_LAUNCH_CHECK();
    return 0;
}

extern "C" int tdm_dev_read_rows(const void *w, int64_t n, int64_t rowbytes, int chains, int depth,
                                 enum tdm_rows_layout layout, uint64_t *sink, void *stream)
{
    if (layout != TDM_ROWS_STORED && layout != TDM_ROWS_TILES && layout != TDM_ROWS_SLABS)
        return tdm_errf("tdm_dev_read_rows: layout %d unknown", (int)layout);
    if (n % 16 || rowbytes % 64 || chains < 1)
        return tdm_errf("tdm_dev_read_rows: %lld rows of %lld bytes in %d chains: need rows a multiple of 16 and whole "
                        "64-byte slabs", (long long)n, (long long)rowbytes, chains);
    const int threads = 192;
    const int64_t warps = n / 16 * chains;
    const unsigned blocks = (unsigned)((warps * 32 + threads - 1) / threads);
    cudaStream_t st = (cudaStream_t)stream;
    const uint8_t *p = (const uint8_t *)w;
    switch (depth) {
    case 1: rows_read_kernel<1><<<blocks, threads, 0, st>>>(p, n, rowbytes, chains, (int)layout, sink); break;
    case 2: rows_read_kernel<2><<<blocks, threads, 0, st>>>(p, n, rowbytes, chains, (int)layout, sink); break;
    case 4: rows_read_kernel<4><<<blocks, threads, 0, st>>>(p, n, rowbytes, chains, (int)layout, sink); break;
    case 8: rows_read_kernel<8><<<blocks, threads, 0, st>>>(p, n, rowbytes, chains, (int)layout, sink); break;
    default: return tdm_errf("tdm_dev_read_rows: depth %d: expected 1, 2, 4 or 8", depth);
    }
    TDM_LAUNCH_CHECK();
    return 0;
}

// One lane chunk (cb bytes; NVFP4: and its 2 scale bytes) of the copy in `order` a thread, from where
// the stored order has it to where that order does (mm_layout.h: tdm_mm_chunk_at, tdm_mm_scales_at):
// chunk t of slab s of row r for e = (r * slabs + s) * 4 + t.
__global__ void reorder_kernel(const uint8_t *w, const uint8_t *scale, int64_t n, int64_t k, int64_t rowbytes, int cb,
                                  int order, uint8_t *codes, uint8_t *scales)
{
    const int64_t slabs = k / TDM_MM_SLAB_K, chunks = n * slabs * 4;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < chunks; e += (int64_t)gridDim.x * blockDim.x) {
        const int t = (int)(e % 4);
        const int64_t s = e / 4 % slabs, r = e / 4 / slabs;
        const uint4 *src = reinterpret_cast<const uint4 *>(w + tdm_mm_chunk_at(TDM_MM_ORDER_ROWS, rowbytes, cb, r, s, t));
        uint4 *dst = reinterpret_cast<uint4 *>(codes + tdm_mm_chunk_at(order, rowbytes, cb, r, s, t));
        for (int q = 0; q < cb / 16; q++) dst[q] = src[q];
        if (scales) {
            const uint8_t *ss = scale + tdm_mm_scales_at(TDM_MM_ORDER_ROWS, k, r, s, t);
            uint8_t *sd = scales + tdm_mm_scales_at(order, k, r, s, t);
            sd[0] = ss[0], sd[1] = ss[1];
        }
    }
}

extern "C" int tdm_dev_reorder(const struct tdm_dweight *w, int order, void *codes, void *scales, void *stream)
{
    if (!w || (w->fmt != TDM_W_NVFP4 && w->fmt != TDM_W_FP8) || w->k % TDM_MM_SLAB_K || (uintptr_t)w->w % 16 ||
        (uintptr_t)codes % 16 || (w->fmt == TDM_W_NVFP4 && !scales))
        return tdm_errf("tdm_dev_reorder: NVFP4 or FP8, k a multiple of %d, aligned storage", TDM_MM_SLAB_K);
    const int64_t n = w->row0 + w->n, rowbytes = tdm_wfmt_code_bytes(w->fmt, 1, w->k);
    if (order != TDM_MM_ORDER_TILES || n % TDM_MM_TILE_ROWS)
        return tdm_errf("tdm_dev_reorder: order %d of %" PRId64 " stored rows (tile-major, of a multiple of %d)", order, n,
                        TDM_MM_TILE_ROWS);
    reorder_kernel<<<(unsigned)sm_count() * 8, 256, 0, (cudaStream_t)stream>>>(
        (const uint8_t *)w->w, (const uint8_t *)w->scale, n, w->k, rowbytes, tdm_mm_chunk_bytes((int)w->fmt), order,
        (uint8_t *)codes, w->fmt == TDM_W_NVFP4 ? (uint8_t *)scales : nullptr);
    TDM_LAUNCH_CHECK();
    return 0;
}

extern "C" int tdm_dev_launch_floor(uint64_t *sink, int blocks, void *stream)
{
    TDM_CUDA_TRY(tdm_pdl::launch(floor_kernel, dim3((unsigned)blocks), dim3(128), 0, (cudaStream_t)stream, sink));
    return 0;
}

extern "C" int tdm_dev_copy(void *dst, const void *src, size_t bytes, void *stream)
{
    copy_kernel<<<sm_count() * 8, 512, 0, (cudaStream_t)stream>>>((uint4 *)dst, (const uint4 *)src, bytes / 16);
    TDM_LAUNCH_CHECK();
    return 0;
}

extern "C" size_t tdm_dev_l2_bytes(void)
{
    int dev = 0, l2 = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return (size_t)l2;
}

// The warm-up before the timed passes of tdm_time_calls. With one untimed pass, the product timed
// first after a shape's weights were made read up to 12 % slower than the same product timed again
// (H100, benchmm --rows 1,2,1,2: the 27B's NVFP4 gate_proj 21.3-21.5 us first, 18.9 again; bench/NOTES.md,
// the first timing of a shape): its passes ran before the card's clocks had come back up after the
// host's allocations. So the first timing of a process and the first after weight sets were made or
// freed (tdm_wset_alloc, tdm_wset_free) warm up with passes until they took TDM_TIME_WARMUP_MS
// together; the others, with the card busy since, with one pass. Measured (the first timing's
// excess over the same product timed again, the gate / down / SwiGLU pair): one pass +2.2 / +2.9 /
// +2.4 us, 20 ms +0.6 / +0.7 / +0.4, 100 ms +0.2 / +0.2 / +0.3.
#ifndef TDM_TIME_WARMUP_MS
#define TDM_TIME_WARMUP_MS 100.0f
#endif
static bool time_cold = true;   // the next tdm_time_calls warms up for TDM_TIME_WARMUP_MS

extern "C" int tdm_wset_alloc(struct tdm_wset *s, enum tdm_wfmt fmt, int64_t n, int64_t k, enum tdm_dtype sdt,
                              size_t min_bytes, int min_copies, uint64_t seed)
{
    memset(s, 0, sizeof *s);
    if (fmt != TDM_W_NVFP4 && fmt != TDM_W_FP8 && fmt != TDM_W_BF16)
        return tdm_errf("working set: format %s has no GPU kernel", tdm_wfmt_name(fmt));
    const int64_t wb = tdm_wfmt_code_bytes(fmt, n, k), sb = tdm_wfmt_scale_bytes(fmt, sdt, n, k);
    const int64_t soff = (wb + 255) / 256 * 256, each = (soff + sb + 255) / 256 * 256;
    int copies = (int)((min_bytes + each - 1) / each);
    if (copies < min_copies) copies = min_copies;
    if (copies < 1) copies = 1;
    s->w = (struct tdm_dweight *)calloc((size_t)copies, sizeof *s->w);
    if (!s->w) return tdm_errf("working set: out of memory");
    if (tdm_cuda_malloc(&s->mem, (size_t)(each * copies)) != 0) {
        free(s->w);
        s->w = NULL;
        return -1;
    }
    s->copies = copies;
    s->bytes = (size_t)(each * copies);
    for (int c = 0; c < copies; c++) {
        uint8_t *base = (uint8_t *)s->mem + (size_t)c * each;
        struct tdm_dweight *w = &s->w[c];
        w->fmt = fmt;
        w->n = n;
        w->k = k;
        w->row0 = 0;
        w->w = base;
        w->scale = sb ? base + soff : NULL;
        w->scale_dt = sdt;
        w->scale2 = 1.0f / 4096;
        // random codes and scales: any order holds them; held as an upload would hold them
        w->order = tdm_dweight_order_for(fmt, n, k);
        const uint64_t sd = seed * 0x9e3779b97f4a7c15ull + (uint64_t)c;
        int rc = 0;
        if (fmt == TDM_W_BF16) rc = tdm_dev_fill_bf16((uint16_t *)base, (size_t)(n * k), sd, 0.05f, NULL);
        else if (fmt == TDM_W_FP8) rc = tdm_dev_fill_bytes(base, (size_t)wb, sd, 0xbf, 0, NULL);  /* exponent <= 7: no NaN */
        else rc = tdm_dev_fill_bytes(base, (size_t)wb, sd, 0xff, 0, NULL);
        if (rc == 0 && fmt == TDM_W_NVFP4) rc = tdm_dev_fill_bytes(base + soff, (size_t)sb, sd ^ 1, 0x37, 0x20, NULL);
        if (rc == 0 && fmt == TDM_W_FP8)
            rc = sdt == TDM_DT_BF16 ? tdm_dev_fill_bf16((uint16_t *)(base + soff), (size_t)sb / 2, sd ^ 1, 0.01f, NULL)
                                    : tdm_dev_fill_f32((float *)(base + soff), (size_t)sb / 4, sd ^ 1, 0.001f, 0.01f, NULL);
        if (rc != 0) {
            tdm_wset_free(s);
            return -1;
        }
    }
    TDM_CUDA_TRY(cudaDeviceSynchronize());
    time_cold = true;
    return 0;
}

extern "C" void tdm_wset_free(struct tdm_wset *s)
{
    if (!s) return;
    time_cold = true;
    if (s->mem) tdm_cuda_free(s->mem);
    free(s->w);
    memset(s, 0, sizeof *s);
}

extern "C" int tdm_time_calls(tdm_launch_fn fn, void *ctx, int calls, int reps, int graph, void *stream, double *ms_per_call)
{
    cudaStream_t st = (cudaStream_t)stream;
    cudaEvent_t e0, e1;
    cudaGraphExec_t exec = NULL;
    std::vector<double> t;
    int rc = -1;
    if (calls < 1 || reps < 1) return tdm_errf("timing: %d calls, %d repeats", calls, reps);
    TDM_CUDA_TRY(cudaEventCreate(&e0));
    if (cudaEventCreate(&e1) != cudaSuccess) {
        cudaEventDestroy(e0);
        return tdm_errf("CUDA: cudaEventCreate failed");
    }
    if (graph) {
        cudaGraph_t g;
        if (cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
            tdm_errf("CUDA: cannot capture a graph on this stream (the legacy default stream cannot be captured)");
            goto out;
        }
        for (int i = 0; i < calls; i++)
            if (fn(ctx, i, stream) != 0) {
                cudaStreamEndCapture(st, &g);
                if (g) cudaGraphDestroy(g);
                goto out;
            }
        if (cudaStreamEndCapture(st, &g) != cudaSuccess) { tdm_errf("CUDA: graph capture failed"); goto out; }
        cudaError_t e = cudaGraphInstantiate(&exec, g, 0);
        cudaGraphDestroy(g);
        if (e != cudaSuccess) { tdm_errf("CUDA: cudaGraphInstantiate: %s", cudaGetErrorString(e)); goto out; }
    }
    {
        // one pass (every call once), its elapsed ms into *ms; false with tdm_err() on a failure
        auto pass = [&](float *ms) -> bool {
            if (cudaEventRecord(e0, st) != cudaSuccess) return tdm_errf("CUDA: event record failed"), false;
            if (graph) {
                if (cudaGraphLaunch(exec, st) != cudaSuccess) return tdm_errf("CUDA: graph launch failed"), false;
            } else {
                for (int i = 0; i < calls; i++)
                    if (fn(ctx, i, stream) != 0) return false;
            }
            if (cudaEventRecord(e1, st) != cudaSuccess || cudaEventSynchronize(e1) != cudaSuccess)
                return tdm_errf("CUDA: %s", cudaGetErrorString(cudaGetLastError())), false;
            *ms = 0;
            cudaEventElapsedTime(ms, e0, e1);
            return true;
        };
        const float warm_for = time_cold ? TDM_TIME_WARMUP_MS : 0.0f;
        time_cold = false;
        float ms, warm_ms = 0;
        for (int w = 0; w == 0 || (warm_ms < warm_for && w < 100000); w++) {   // warm-up passes
            if (!pass(&ms)) goto out;
            warm_ms += ms;
        }
        for (int r = 0; r < reps; r++) {
            if (!pass(&ms)) goto out;
            t.push_back(ms / calls);
        }
    }
    std::sort(t.begin(), t.end());
    *ms_per_call = t[t.size() / 2];
    rc = 0;
out:
    if (exec) cudaGraphExecDestroy(exec);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return rc;
}
