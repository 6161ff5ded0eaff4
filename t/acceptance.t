#!/bin/sh
# scripts/acceptance on the CPU reference, a few tokens on the tiny qwen3_5 fixture: a header and
# one line for each prompt, drafter and shape (2 x 3 x 2), each with tokens a round >= 1 and an
# acceptance for every draft depth (n-gram lookup may draft nothing on a few tokens: said so); the
# model drafting for itself accepts every draft.
TANDEM_BACKEND=cpu; export TANDEM_BACKEND
. t/qwen35-tiny.sh
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
echo "1..4"
n=0
t() { n=$((n + 1)); if eval "$2"; then echo "ok $n - $1"; else echo "not ok $n - $1"; sed 's/^/# /' "$tmp/out" "$tmp/err"; fi; }
scripts/acceptance "$F/bf16" "$F/prompt.tok" cpu 6 >"$tmp/out" 2>"$tmp/err"
rc=$?
t "exit 0" "[ $rc -eq 0 ]"
t "a header and 12 lines" "[ \$(wc -l <$tmp/out) -eq 13 ] && head -1 $tmp/out | grep -q 'tok/round'"
t "every line: tokens a round >= 1; an acceptance for each depth (4 for chains, 3 for 3,2,1), or none drafted (ngram only)" \
  "awk 'NR > 1 { if (\$4 + 0 < 1) exit 1; n = 0; for (i = 6; i <= NF; i++) if (\$i ~ /^[1-4]:[0-9.]+\$/) n++;
                  if (n != (\$3 == \"chain-4\" ? 4 : 3) && !(\$2 == \"ngram\" && \$6 == \"-\")) exit 1 } END { exit NR != 13 }' $tmp/out"
t "the model drafting for itself accepts every draft" \
  "[ \$(awk '\$2 == \"draft\" && /1:1.000/' $tmp/out | wc -l) -eq 4 ]"
