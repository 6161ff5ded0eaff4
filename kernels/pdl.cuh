// pdl.cuh — programmatic dependent launch (sm_90 and later; CUDA sources only).
//
// A decode step is ~700 short kernels in a row, and each of them used to start only when the one
// before it had finished: its CTAs came up, asked DRAM for their first weights and waited with the
// memory system idle, while the kernel before sat in its own tail (its last CTAs, its reductions and
// stores). With a programmatic launch, a kernel's CTAs may start once every CTA of the kernel before
// it in the stream has called release() and there is room on a SM (the norm and attention kernels
// release at their start, the skinny kernels once past their K loop: see there). Until it calls
// wait(), the early kernel may only read what no kernel writes (the model's weights and norm
// parameters); wait() returns when the kernels before it have finished and their writes are
// visible, and only then does it read its inputs or write anything. The arithmetic is untouched, so
// the bits are the same with it on or off.
//
// Rules that keep it sound:
// - every kernel launched with the attribute (launch() below, or add_attr() in a launch of its own)
//   calls wait() in every thread before it reads an input or writes an output: it may be running
//   beside the kernel that makes its input, or beside one still reading the buffer it writes;
// - such a kernel's completion then implies its predecessors' completion, so ordering stays
//   transitive along the stream;
// - release() only lets dependents start early; it promises nothing about this kernel's writes (a
//   dependent's wait() waits for the whole grid and its memory).
// TANDEM_PDL=off (tdm_cuda_pdl) launches everything plainly, for comparison.
#pragma once
#include <cuda_runtime.h>
#include <utility>
#include "device.h"

namespace tdm_pdl {

// Lets the kernels launched after this one with the attribute start (no effect on others).
__device__ __forceinline__ void release() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
// Waits until the grids this one depends on have completed and their writes are visible (returns at
// once when it was launched without the attribute).
__device__ __forceinline__ void wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// Adds the attribute to attrs[n] where TANDEM_PDL is on; returns the new attribute count.
inline unsigned add_attr(cudaLaunchAttribute *attrs, unsigned n)
{
    if (!tdm_cuda_pdl()) return n;
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n].val.programmaticStreamSerializationAllowed = 1;
    return n + 1;
}

// kern<<<grid, block, smem, st>>>(args...), as a programmatic dependent launch where programmatic
// (and TANDEM_PDL is on), else plainly (a build-time choice such as moe.cu's TDM_MOE_DOWN_PDL).
template <typename... P, typename... A>
cudaError_t launch_if(bool programmatic, void (*kern)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                      A &&...args)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cudaLaunchAttribute attr[1];
    cfg.attrs = attr;
    cfg.numAttrs = programmatic ? add_attr(attr, 0) : 0;
    return cudaLaunchKernelEx(&cfg, kern, std::forward<A>(args)...);
}

// kern<<<grid, block, smem, st>>>(args...) as a programmatic dependent launch (where on). kern must
// call wait() before it reads an input or writes an output (the rules above).
template <typename... P, typename... A>
cudaError_t launch(void (*kern)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t st, A &&...args)
{
    return launch_if(true, kern, grid, block, smem, st, std::forward<A>(args)...);
}

}  // namespace tdm_pdl
