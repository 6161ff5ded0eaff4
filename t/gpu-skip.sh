# Sourced (from the repository root) by the GPU tests: skip_without_device RC ERR ends the test as
# skipped when a tool's first run exited RC = 2 saying "no CUDA device visible" on stderr (file ERR).
skip_without_device() {
    if [ "$1" -eq 2 ] && grep -q 'no CUDA device visible' "$2"; then
        echo "1..0 # SKIP no CUDA device visible"
        exit 0
    fi
}
