/* cuda_check.h — (CUDA sources only) turn a failed runtime call or launch into tdm_err + -1. */
#ifndef TDM_CUDA_CHECK_H
#define TDM_CUDA_CHECK_H
#include <cuda_runtime.h>
#include "err.h"

#define TDM_CUDA_TRY(call)                                                                       \
    do {                                                                                         \
        cudaError_t e_ = (call);                                                                 \
        if (e_ != cudaSuccess)                                                                   \
            return tdm_errf("CUDA: %s: %s (%s:%d)", #call, cudaGetErrorString(e_), __FILE__, __LINE__); \
    } while (0)

/* After a launch: the launch itself must have been accepted. */
#define TDM_LAUNCH_CHECK() TDM_CUDA_TRY(cudaGetLastError())
#endif
