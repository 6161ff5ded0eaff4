/* ckpt.h — a checkpoint directory: model.safetensors, or the shards named by
 * model.safetensors.index.json. Tensors are found by their hub names. */
#ifndef TDM_CKPT_H
#define TDM_CKPT_H
#include "safetensors.h"
#ifdef __cplusplus
extern "C" {
#endif

struct tdm_ckpt {
    char *dir;
    int nfiles;
    struct tdm_stfile **files;
};

struct tdm_ckpt *tdm_ckpt_open(const char *dir);
void tdm_ckpt_close(struct tdm_ckpt *ck);
const struct tdm_tensor *tdm_ckpt_find(const struct tdm_ckpt *ck, const char *name);
/* Same, with a printf-style name. */
const struct tdm_tensor *tdm_ckpt_findf(const struct tdm_ckpt *ck, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
#ifdef __cplusplus
}
#endif
#endif
