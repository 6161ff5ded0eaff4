#!/bin/sh
# Shapes of both layouts that are not in ../shared: synthetic models (t/data/variants.txt: other
# head counts and ratios, K not a multiple of 128, explicit layer_types, tied embeddings, dense MLP
# layers among MoE ones, norm_topk_prob false, BF16 block scales, non-power-of-two NVFP4 global
# scales, fused experts, prompts of 160-200 tokens), remade here from their seeds, against the
# outputs transformers computed for them (t/data/variants/, by scripts/make-fixture.py), with the
# bounds of the fixture tests.
# The CPU tests pin the reference backend (auto takes the GPU where one is visible).
TANDEM_BACKEND=cpu; export TANDEM_BACKEND
MK=build/san/bin/tandem-mkmodel
RUN=build/san/bin/tandem-run
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
n=0
grep -v '^#' t/data/variants.txt | while IFS="$(printf '\t')" read -r name prompt args; do
    [ -n "$name" ] || continue
    fmt=$(printf '%s' "$args" | sed -n 's/.*--format \([a-z0-9]*\).*/\1/p')
    fx=$tmp/$name
    mkdir -p "$fx"
    cp "$prompt" "$fx/prompt.tok"
    cp "t/data/variants/$name.safetensors" "$fx/ref-$fmt.safetensors"
    cp "t/data/variants/$name.tok" "$fx/greedy-$fmt.tok"
    steps=$(grep -cv '^[[:space:]]*$' "$fx/greedy-$fmt.tok")
    # shellcheck disable=SC2086
    $MK -o "$fx/$fmt" $args 2>"$tmp/err" &&
    $RUN -m "$fx/$fmt" -p "$fx/prompt.tok" -n 0 --dump-logits "$tmp/prompt.st" 2>>"$tmp/err" &&
    $RUN -m "$fx/$fmt" -p "$fx/prompt.tok" -n "$steps" >"$tmp/greedy.tok" 2>>"$tmp/err" &&
    $RUN -m "$fx/$fmt" -p "$fx/prompt.tok" --force "$fx/greedy-$fmt.tok" --dump-logits "$tmp/forced.st" >/dev/null 2>>"$tmp/err"
    rc=$?
    n=$((n + 1))
    if [ $rc -ne 0 ]; then
        echo "not ok $n - $name: made and run (exit $rc)"; sed 's/^/# /' "$tmp/err"
        echo "$n" >"$tmp/count"; continue
    fi
    if build/san/t/fixture_check "$fx" "$fmt" "$tmp/prompt.st" "$tmp/greedy.tok" "$tmp/forced.st" >"$tmp/tap" 2>&1; then
        echo "ok $n - $name ($fmt): reference bounds ($(grep -c '^ok' "$tmp/tap") checks)"
    else
        echo "not ok $n - $name ($fmt): reference bounds"; grep -v '^ok' "$tmp/tap" | sed 's/^/# /'
    fi
    grep -E '^ok|^# ' "$tmp/tap" | sed 's/^/#   /'
    echo "$n" >"$tmp/count"
done
echo "1..$(cat "$tmp/count" 2>/dev/null || echo 0)"
