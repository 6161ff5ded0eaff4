// bf16_skinny.cu — the BF16-weight instantiations of the skinny matrix kernel (mm_skinny.cuh).
#include "mm_skinny.cuh"

cudaError_t tdm_mm_skinny_bf16(const tdm_mm::SkinnyArgs &a, int nt, int wn, int cs, int pf, int mt, bool vec,
                             size_t smem, cudaStream_t st)
{
    return tdm_mm::dispatch<TDM_MMF_BF16>(a, nt, wn, cs, pf, mt, vec, false, false, smem, st);
}
