#!/bin/sh
# The skinny matrix kernels' lane and fragment mapping, emulated on the CPU against the reference.
exec build/san/t/matmul_emul
