/* tiletest.h — tile tables written by the GPU test programs: an FP8 table whose entries set nt 2
 * (the weights as the mma's A operand per lane from x's blocked copy at 1-16 rows: the form that
 * runs a SwiGLU pair as one FP8 product), for shapes the shipped tables leave at nt 1. Header-only
 * (static); used by t/unit/matmul_gpu.c and t/unit/engine_gpu.c. */
#ifndef TDM_TILETEST_H
#define TDM_TILETEST_H
#include "err.h"
#include "tiles.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A temporary directory holding <arch>/fp8.json with one nt 2 setting (wn 2, pf 1, the shape's
 * default otherwise) for each of the ns shapes {n, k}: its path in dir (room for 64 bytes), the
 * loaded tables in *out (those of every other kernel are the defaults). 0, or -1 with tdm_err(). */
static inline int fp8_nt2_tables(const char *arch, const int64_t (*shapes)[2], int ns, char *dir, struct tdm_tiles **out)
{
    struct tdm_tile_entry *ent = calloc((size_t)ns, sizeof *ent);
    if (!ent) return tdm_errf("out of host memory");
    for (int i = 0; i < ns; i++) {
        ent[i].n = shapes[i][0];
        ent[i].k = shapes[i][1];
        ent[i].tile = tdm_tile_default(TDM_MMK_FP8, ent[i].n, ent[i].k);
        ent[i].tile.nt = 2;
        ent[i].tile.wn = 2;
        ent[i].tile.pf = 1;
        ent[i].tile.lo_rows = 0;
        ent[i].measured = "none: a test's setting";
    }
    char sub[96], path[128];
    const struct tdm_tile_table tb = {TDM_MMK_FP8, arch, "none", "written by a test (t/tiletest.h)", ns, ent};
    strcpy(dir, "/tmp/tandem-tiles-XXXXXX");
    *out = NULL;
    int rc = -1;
    if (!mkdtemp(dir)) {
        tdm_errf("%s: cannot make a temporary directory", dir);
    } else {
        snprintf(sub, sizeof sub, "%s/%s", dir, arch);
        snprintf(path, sizeof path, "%s/fp8.json", sub);
        if (mkdir(sub, 0700) != 0) tdm_errf("%s: cannot make the directory", sub);
        else rc = tdm_tile_table_write(path, &tb) == 0 && tdm_tiles_load(dir, arch, out) == 0 ? 0 : -1;
    }
    free(ent);
    return rc;
}
/* Removes what fp8_nt2_tables wrote. */
static inline void fp8_nt2_tables_remove(const char *arch, const char *dir)
{
    char sub[96], path[128];
    snprintf(sub, sizeof sub, "%s/%s", dir, arch);
    snprintf(path, sizeof path, "%s/fp8.json", sub);
    unlink(path);
    rmdir(sub);
    rmdir(dir);
}

#endif
