// nvfp4_skinny.cu — the NVFP4 (W4A16) instantiations of the skinny matrix kernel (mm_skinny.cuh).
#include "mm_skinny.cuh"

cudaError_t tdm_mm_skinny_nvfp4(const tdm_mm::SkinnyArgs &a, int nt, int wn, int cs, int pf, int mt, bool vec,
                                bool direct, bool xs, size_t smem, cudaStream_t st)
{
    return tdm_mm::dispatch<TDM_MMF_NVFP4>(a, nt, wn, cs, pf, mt, vec, direct, xs, smem, st);
}
