/* compare.h — how logits are compared: relative error of a whole matrix, top-1 agreement where
 * the reference is clear, and greedy sequences up to the first near tie. */
#ifndef TDM_COMPARE_H
#define TDM_COMPARE_H
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

/* A routing near tie: the k-th chosen expert's router logit within 4 BF16 steps (at magnitude 2)
 * of the best one left out. Another implementation may route that row differently, and the row
 * then differs by far more than rounding: the tests excuse a row whose own relative error exceeds
 * their bound only where the CPU reference saw such a near tie, report it with its margin and
 * leave it out of the matrix's relative error (at most one row in eight). */
#define TDM_ROUTER_NEAR_TIE 0.0625f

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
