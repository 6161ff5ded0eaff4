/* compare.h — how logits are compared: relative error of a whole matrix, top-1 agreement where
 * the reference is clear, and greedy sequences up to the first near tie. */
#ifndef TDM_COMPARE_H
#define TDM_COMPARE_H
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

/* ||got - ref|| / ||ref|| over n values (NaN anywhere gives +inf). */
double tdm_rel_err(const float *got, const float *ref, int64_t n);

struct tdm_top1 {
    int rows;          /* rows compared */
    int clear;         /* rows whose reference margin >= the threshold */
    int clear_differ;  /* of those, rows whose top-1 differs */
    int first_differ;  /* first such row, -1 if none */
};
/* Compares the argmax of each of rows x width rows where the reference margin >= min_margin. */
struct tdm_top1 tdm_top1_compare(const float *got, const float *ref, int rows, int width, float min_margin);

/* Greedy sequences: the index of the first step where got != ref among steps before the first
 * reference near tie (margins[i] < min_margin); -1 when they agree that far. *checked gets the
 * number of steps compared. */
int tdm_greedy_compare(const int32_t *got, const int32_t *ref, const float *ref_margins, int n,
                       float min_margin, int *checked);
#ifdef __cplusplus
}
#endif
#endif
