#!/bin/sh
# The row concatenation of two stored weights (linear.h: tdm_qweight_cat), exact cases and refusals.
exec build/san/t/qweight_cat
