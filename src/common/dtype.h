/* dtype.h — the one table of tensor element types (safetensors names and sizes). */
#ifndef TDM_DTYPE_H
#define TDM_DTYPE_H
#include <stddef.h>
#ifdef __cplusplus
extern "C" {
#endif

enum tdm_dtype {
    TDM_DT_INVALID = 0,
    TDM_DT_F64, TDM_DT_F32, TDM_DT_F16, TDM_DT_BF16,
    TDM_DT_F8_E4M3, TDM_DT_F8_E5M2,
    TDM_DT_I64, TDM_DT_I32, TDM_DT_I16, TDM_DT_I8,
    TDM_DT_U64, TDM_DT_U32, TDM_DT_U16, TDM_DT_U8, TDM_DT_BOOL,
    TDM_DT_COUNT
};

enum tdm_dtype tdm_dtype_from_name(const char *name); /* TDM_DT_INVALID when unknown */
const char *tdm_dtype_name(enum tdm_dtype dt);
size_t tdm_dtype_size(enum tdm_dtype dt);              /* bytes per element */
#ifdef __cplusplus
}
#endif
#endif
