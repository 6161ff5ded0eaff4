#!/bin/sh
# The probes kept as source under bench/probes/ build against the current library, so that a later
# session can run them as they are: the wgmma product (bench/probes/wgmma, sm_90a) compiles and links
# with no compiler warnings, and ptxas neither serializes its wgmma instructions (the C7513/C7515
# notes: the pipelining the probe measures would be gone) nor spills. No GPU needed.
echo "1..3"
[ -f build/libtandem.a ] || { echo "Bail out! build/libtandem.a is not built (make all first)"; exit 1; }
log=build/probe/build.log
mkdir -p build/probe
rm -f build/wgmma-probe build/probe/ptxas.log
built=0
if sh bench/probes/wgmma/build.sh >"$log" 2>&1 && [ -x build/wgmma-probe ]; then echo "ok 1 - bench/probes/wgmma builds"; built=1
else echo "not ok 1 - bench/probes/wgmma builds"; sed 's/^/# /' "$log" | tail -20; fi
if [ $built = 0 ]; then
    echo "not ok 2 - no ptxas report (the build failed)"
elif grep -q 'C751[0-9]' build/probe/ptxas.log; then
    echo "not ok 2 - no wgmma serialization"; grep 'C751' build/probe/ptxas.log | sed 's/^/# /' | head -5
else echo "ok 2 - ptxas serializes no wgmma of the probe"; fi
if [ $built = 0 ]; then
    echo "not ok 3 - no build to check (the build failed)"
elif grep -E 'warning|[1-9][0-9]* bytes spill' "$log" build/probe/ptxas.log >/dev/null 2>&1; then
    echo "not ok 3 - no warnings, no spills"; grep -E 'warning|[1-9][0-9]* bytes spill' "$log" build/probe/ptxas.log | sed 's/^/# /' | head -5
else echo "ok 3 - the probe builds with no warnings and no spills"; fi
