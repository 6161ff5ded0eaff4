// fp8_skinny.cu — the block-FP8 (W8A16) instantiations of the skinny matrix kernel (mm_skinny.cuh).
#include "mm_skinny.cuh"

cudaError_t tdm_mm_skinny_fp8(const tdm_mm::SkinnyArgs &a, int nt, int wn, int cs, int pf, int mt, bool vec,
                              bool direct, bool xs, size_t smem, cudaStream_t st)
{
    return tdm_mm::dispatch<TDM_MMF_FP8>(a, nt, wn, cs, pf, mt, vec, direct, xs, smem, st);
}
