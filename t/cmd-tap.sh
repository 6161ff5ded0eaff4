# Sourced (from the repository root) by the tests of command lines (t/matmul-tools.t, t/trace-diff.t):
#   t DESCRIPTION COMMAND...       one TAP line: ok when COMMAND succeeds (its output dropped); counts
#                                  the tests in n and the failures in failed
#   exits CODE PATTERN COMMAND...  succeeds when COMMAND exits CODE with one line on stderr matching PATTERN
n=0; failed=0
t() {
    n=$((n + 1)); d=$1; shift
    if "$@" >/dev/null 2>&1; then echo "ok $n - $d"; else echo "not ok $n - $d"; failed=$((failed + 1)); fi
}
exits() {
    code=$1; pat=$2; shift 2
    err=$("$@" 2>&1 >/dev/null); rc=$?
    [ "$rc" -eq "$code" ] && [ "$(printf '%s\n' "$err" | wc -l)" -eq 1 ] && printf "%s" "$err" | grep -q -e "$pat"
}
