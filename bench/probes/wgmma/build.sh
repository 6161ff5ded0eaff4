#!/bin/sh
# bench/probes/wgmma/build.sh: builds build/wgmma-probe (needs `make` first: links build/libtandem.a).
set -e
cd "$(dirname "$0")/../../.."
CUDA=${CUDA:-/usr/local/cuda}
mkdir -p build/probe
"$CUDA/bin/nvcc" -O3 -lineinfo -std=c++17 -gencode arch=compute_90a,code=sm_90a -Isrc/common -Ikernels \
    -Xcompiler -Wall,-Wextra -Xptxas -v -c bench/probes/wgmma/wgmma_nvfp4.cu -o build/probe/wgmma_nvfp4.o 2>build/probe/ptxas.log ||
    { cat build/probe/ptxas.log >&2; exit 1; }
grep -E "wgmma|Used|spill|arning" build/probe/ptxas.log | grep -v "^$" >&2 || true
cc -O2 -std=c11 -D_GNU_SOURCE -Wall -Wextra -Isrc/common -Ikernels -c bench/probes/wgmma/probe.c -o build/probe/probe.o
cc -o build/wgmma-probe build/probe/probe.o build/probe/wgmma_nvfp4.o build/libtandem.a -Wl,-Bstatic -ljansson -Wl,-Bdynamic \
    -L"$CUDA/lib64" -Wl,-rpath,"$CUDA/lib64" -lcublasLt -lcublas -lcudart_static -lstdc++ -lm -ldl -lrt -lpthread
echo "build/wgmma-probe"
