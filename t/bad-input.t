#!/bin/sh
# Malformed input of every kind gets one line on stderr naming the file and the fault, and exit 2:
# never a crash, a hang or a silent success (issue: foundation, item 11).
# The CPU tests pin the reference backend (auto takes the GPU where one is visible).
TANDEM_BACKEND=cpu; export TANDEM_BACKEND
RUN=build/san/bin/tandem-run
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
build/san/bin/tandem-mkmodel -o "$tmp/good" --hidden 64 --vocab 1024 --intermediate 128 2>/dev/null || {
    echo "Bail out! could not make the good model"; exit 1; }
printf '1 2 3\n' >"$tmp/p.tok"
build/san/t/mkbad "$tmp/good" "$tmp/bad" >"$tmp/cases" || { echo "Bail out! mkbad failed"; exit 1; }
n=0
while IFS="$(printf '\t')" read -r name args expect; do
    n=$((n + 1))
    case "$args" in *" -p "*) ;; *) args="$args -p $tmp/p.tok" ;; esac
    # shellcheck disable=SC2086
    timeout 60 $RUN $args -n 1 >"$tmp/out" 2>"$tmp/err"
    rc=$?
    lines=$(grep -cv '^#' "$tmp/err")
    msg=$(grep -v '^#' "$tmp/err" | head -n 1)
    if [ $rc -eq 2 ] && [ "$lines" -eq 1 ] && printf '%s' "$msg" | grep -qF -- "$expect" && [ ! -s "$tmp/out" ]; then
        echo "ok $n - $name: exit 2, '$msg'"
    else
        echo "not ok $n - $name: exit $rc, $lines line(s), expected '$expect'"
        sed 's/^/# /' "$tmp/err" | head -n 5
    fi
done <"$tmp/cases"
# usage errors
for args in "" "-m" "-m $tmp/good -n -1" "-m $tmp/good -n x" "-m $tmp/good --bogus" "-m $tmp/good --backend gpu" \
            "-m $tmp/good -p $tmp/p.tok -n 4 --ctx 2"; do
    n=$((n + 1))
    # shellcheck disable=SC2086
    $RUN $args >/dev/null 2>"$tmp/err" </dev/null
    rc=$?
    if [ $rc -eq 2 ] && [ -s "$tmp/err" ]; then echo "ok $n - usage '$args': exit 2"; else echo "not ok $n - usage '$args': exit $rc"; fi
done
n=$((n + 1))
TANDEM_BACKEND=quantum $RUN -m "$tmp/good" -p "$tmp/p.tok" >/dev/null 2>"$tmp/err"
rc=$?
if [ $rc -eq 2 ] && grep -q 'TANDEM_BACKEND=quantum' "$tmp/err"; then echo "ok $n - bad switch value: exit 2"; else echo "not ok $n - bad switch value: exit $rc"; fi
n=$((n + 1))
TANDEM_NO_SUCH=1 $RUN -m "$tmp/good" -p "$tmp/p.tok" >/dev/null 2>"$tmp/err"
rc=$?
if [ $rc -eq 2 ] && grep -q 'unknown switch TANDEM_NO_SUCH' "$tmp/err"; then echo "ok $n - unknown switch: exit 2"; else echo "not ok $n - unknown switch: exit $rc"; fi
echo "1..$n"
