#include "compare.h"
#include "ref.h"
#include <math.h>

double tdm_rel_err(const float *got, const float *ref, int64_t n)
{
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)got[i] - (double)ref[i];
        num += d * d;
        den += (double)ref[i] * (double)ref[i];
    }
    if (isnan(num) || isnan(den)) return INFINITY;
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

struct tdm_top1 tdm_top1_compare(const float *got, const float *ref, int rows, int width, float min_margin)
{
    struct tdm_top1 r = {.rows = rows, .first_differ = -1};
    for (int i = 0; i < rows; i++) {
        const float *g = got + (int64_t)i * width, *f = ref + (int64_t)i * width;
        if (tdm_margin(f, width) < min_margin) continue;
        r.clear++;
        if (tdm_argmax(g, width) != tdm_argmax(f, width)) {
            r.clear_differ++;
            if (r.first_differ < 0) r.first_differ = i;
        }
    }
    return r;
}

int tdm_greedy_compare(const int32_t *got, const int32_t *ref, const float *ref_margins, int n,
                       float min_margin, int *checked)
{
    int i;
    for (i = 0; i < n && ref_margins[i] >= min_margin; i++)
        if (got[i] != ref[i]) break;
    *checked = i;
    return i < n && ref_margins[i] >= min_margin ? i : -1;
}
