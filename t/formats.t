#!/bin/sh
# Number formats (BF16, e4m3, e2m1, block FP8, NVFP4): known values and round trips.
exec build/san/t/formats
