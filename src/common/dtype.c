#include "dtype.h"
#include <string.h>

static const struct { const char *name; size_t size; } table[TDM_DT_COUNT] = {
    [TDM_DT_INVALID] = {"?", 0},
    [TDM_DT_F64] = {"F64", 8}, [TDM_DT_F32] = {"F32", 4}, [TDM_DT_F16] = {"F16", 2},
    [TDM_DT_BF16] = {"BF16", 2}, [TDM_DT_F8_E4M3] = {"F8_E4M3", 1}, [TDM_DT_F8_E5M2] = {"F8_E5M2", 1},
    [TDM_DT_I64] = {"I64", 8}, [TDM_DT_I32] = {"I32", 4}, [TDM_DT_I16] = {"I16", 2}, [TDM_DT_I8] = {"I8", 1},
    [TDM_DT_U64] = {"U64", 8}, [TDM_DT_U32] = {"U32", 4}, [TDM_DT_U16] = {"U16", 2}, [TDM_DT_U8] = {"U8", 1},
    [TDM_DT_BOOL] = {"BOOL", 1},
};

enum tdm_dtype tdm_dtype_from_name(const char *name)
{
    for (int i = 1; i < TDM_DT_COUNT; i++)
        if (strcmp(table[i].name, name) == 0) return (enum tdm_dtype)i;
    return TDM_DT_INVALID;
}

const char *tdm_dtype_name(enum tdm_dtype dt) { return dt > 0 && dt < TDM_DT_COUNT ? table[dt].name : "?"; }
size_t tdm_dtype_size(enum tdm_dtype dt) { return dt > 0 && dt < TDM_DT_COUNT ? table[dt].size : 0; }
