#!/bin/sh
# The bytes a decode step and an R-row pass must read (src/common/model.h: tdm_model_step_bytes,
# tdm_model_pass_bytes, which tandem-run and tandem-benchround report), on a dense and a MoE model.
MK=build/san/bin/tandem-mkmodel
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
$MK -o "$tmp/dense" --no-mtp >/dev/null 2>"$tmp/err" && $MK -o "$tmp/moe" --layout qwen3_next --no-mtp >/dev/null 2>>"$tmp/err" ||
    { echo "Bail out! tandem-mkmodel: $(cat "$tmp/err")"; exit 1; }
exec build/san/t/model_bytes "$tmp/dense" "$tmp/moe"
