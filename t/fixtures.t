#!/bin/sh
# The CPU reference against transformers' fixtures, both layouts, every format: prompt logits
# (tandem-run -n 0 --dump-logits), greedy ids (-n 24), step logits under teacher forcing
# (--force), per-layer hidden states and the MTP drafter's logits (fixture_check, in process).
# The CPU tests pin the reference backend (auto takes the GPU where one is visible).
TANDEM_BACKEND=cpu; export TANDEM_BACKEND
FIX=${TANDEM_FIXTURES:-../shared/fixtures}
if [ ! -d "$FIX/qwen35-tiny" ] || [ ! -d "$FIX/qwen3next-tiny" ]; then
    echo "1..0 # SKIP fixtures not found in $FIX (set TANDEM_FIXTURES)"
    exit 0
fi
RUN=build/san/bin/tandem-run
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
n=0
for model in qwen35-tiny qwen3next-tiny; do
    for fmt in bf16 fp8 nvfp4; do
        dir=$FIX/$model/$fmt
        steps=$(grep -cv '^[[:space:]]*$' "$FIX/$model/greedy-$fmt.tok")
        $RUN -m "$dir" -p "$FIX/$model/prompt.tok" -n 0 --dump-logits "$tmp/prompt.st" 2>"$tmp/err" &&
        $RUN -m "$dir" -p "$FIX/$model/prompt.tok" -n "$steps" >"$tmp/greedy.tok" 2>>"$tmp/err" &&
        $RUN -m "$dir" -p "$FIX/$model/prompt.tok" --force "$FIX/$model/greedy-$fmt.tok" \
             --dump-logits "$tmp/forced.st" >/dev/null 2>>"$tmp/err"
        rc=$?
        n=$((n + 1))
        if [ $rc -ne 0 ]; then
            echo "not ok $n - $model/$fmt: tandem-run failed (exit $rc)"
            sed 's/^/# /' "$tmp/err"
            continue
        fi
        echo "ok $n - $model/$fmt: tandem-run ran"
        # The checker's TAP goes into this stream as a subtest summary.
        if build/san/t/fixture_check "$FIX/$model" "$fmt" "$tmp/prompt.st" "$tmp/greedy.tok" "$tmp/forced.st" >"$tmp/tap" 2>&1; then
            n=$((n + 1)); echo "ok $n - $model/$fmt: reference bounds ($(grep -c '^ok' "$tmp/tap") checks)"
        else
            n=$((n + 1)); echo "not ok $n - $model/$fmt: reference bounds"
            grep -v '^ok' "$tmp/tap" | sed 's/^/# /'
        fi
        grep '^ok' "$tmp/tap" | sed 's/^/#   /'
    done
done
echo "1..$n"
