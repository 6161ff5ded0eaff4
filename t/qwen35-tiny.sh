# Sourced (from the repository root) by the tests that run on the tiny qwen3_5 fixture: sets FIX,
# the fixtures' directory (TANDEM_FIXTURES), and F, the fixture; skips the test when it is absent.
FIX=${TANDEM_FIXTURES:-../shared/fixtures}
F=$FIX/qwen35-tiny
if [ ! -d "$F" ]; then
    echo "1..0 # SKIP fixtures not found in $FIX (set TANDEM_FIXTURES)"
    exit 0
fi
