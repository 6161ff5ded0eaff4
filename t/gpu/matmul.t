#!/bin/sh
# The matrix kernels on the GPU: check against the CPU reference, verify twins (m = 2..32 rows
# against one-row calls, bit for bit), graph replay against eager, the wide GEMM. Skips without
# a CUDA device.
exec build/t/matmul_gpu
