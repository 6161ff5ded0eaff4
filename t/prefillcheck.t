#!/bin/sh
# tandem-prefillcheck on the CPU reference (--backend cpu): on the tiny qwen3_5 fixture in BF16 and
# NVFP4 the gate holds against the CPU reference and against the fixture's transformers logits
# (--ref); --chunk 1 and --chunk 7 work; the JSON record parses and holds the comparisons; an
# injected difference (TANDEM_PREFILL_FAULT) makes the gate fail with exit 1; bad usage and bad
# input exit 2 with one line. Skips a format whose fixture is absent.
# The CPU tests pin the reference backend (auto takes the GPU where one is visible).
TANDEM_BACKEND=cpu; export TANDEM_BACKEND
PC=build/san/bin/tandem-prefillcheck
JG=build/san/t/json_get
. t/qwen35-tiny.sh
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
n=0
t() { n=$((n + 1)); if eval "$2"; then echo "ok $n - $1"; else echo "not ok $n - $1"; sed 's/^/# /' "$tmp/err" 2>/dev/null; fi; }
skip() { n=$((n + 1)); echo "ok $n # SKIP $1"; }
# one line on stderr (no '# ' lines), exit 2, naming $1
one_line() {
    [ "$rc" -eq 2 ] && [ "$(grep -vc '^# ' "$tmp/err")" -eq 1 ] && grep -v "^# " "$tmp/err" | grep -q -e "$1"
}

for fmt in bf16 nvfp4; do
    if [ ! -d "$F/$fmt" ]; then skip "$fmt: fixture $F/$fmt absent"; continue; fi
    M="-m $F/$fmt -p $F/prompt.tok --backend cpu"
    t "$fmt: the gate holds against the CPU reference (exit 0), text report and JSON" \
      "$PC $M --json $tmp/$fmt.json >$tmp/out 2>$tmp/err &&
       grep -q '^prefill vs reference: next-token agreement 40/40' $tmp/out &&
       grep -q '^decode vs reference: next-token agreement 40/40' $tmp/out &&
       grep -q '^prefill vs decode: next-token agreement 40/40' $tmp/out &&
       grep -q '^greedy continuation, 16 tokens: prefill and decode equal' $tmp/out &&
       grep -q '^gate: holds' $tmp/out && grep -q '^# backend cpu (asked for)' $tmp/err && ! grep -qi lossless $tmp/out"
    sed 's/^/#   /' "$tmp/out"
    t "$fmt: the JSON record parses and holds the gate, the comparisons and the greedy tokens" \
      "$JG $tmp/$fmt.json >/dev/null 2>$tmp/err && [ \$($JG $tmp/$fmt.json gate.pass) = true ] &&
       [ \$($JG $tmp/$fmt.json comparisons.0.agree) = 40 ] && [ \$($JG $tmp/$fmt.json comparisons.2.b) = '\"decode\"' ] &&
       [ \$($JG $tmp/$fmt.json greedy.equal) = true ] && [ \$($JG $tmp/$fmt.json prompt_tokens) = 40 ] &&
       $JG $tmp/$fmt.json paths.prefill.greedy.15 >/dev/null && $JG $tmp/$fmt.json paths.decode.min_margin >/dev/null"
    if [ -f "$F/ref-$fmt.safetensors" ]; then
        t "$fmt: the gate holds against the fixture's logits (--ref ref-$fmt.safetensors)" \
          "$PC $M --ref $F/ref-$fmt.safetensors >$tmp/out 2>$tmp/err && grep -q '^gate: holds' $tmp/out &&
           grep -Eq '^prefill vs reference: next-token agreement (3[89]|40)/40' $tmp/out"
        sed 's/^/#   /' "$tmp/out"
    else
        skip "$fmt: $F/ref-$fmt.safetensors absent"
    fi
    for c in 1 7; do
        t "$fmt: --chunk $c works (exit 0, prefill and decode agree on every row)" \
          "$PC $M --chunk $c -n 4 >$tmp/out 2>$tmp/err && grep -q '^prefill vs decode: next-token agreement 40/40' $tmp/out &&
           grep -q 'chunk $c,' $tmp/err"
    done
done

if [ -d "$F/nvfp4" ]; then
    M="-m $F/nvfp4 -p $F/prompt.tok --backend cpu -n 4"
    t "the gate fails on a real difference (TANDEM_PREFILL_FAULT=3 negates 3 prefill rows): exit 1" \
      "TANDEM_PREFILL_FAULT=3 $PC $M --json $tmp/fault.json >$tmp/out 2>$tmp/err; [ \$? -eq 1 ] &&
       grep -q '^prefill vs reference: next-token agreement 37/40' $tmp/out && grep -q '^gate: fails' $tmp/out &&
       [ \$($JG $tmp/fault.json gate.pass) = false ]"
    sed 's/^/#   /' "$tmp/out"
    t "TANDEM_PREFILL_CHUNK sets the default chunk" \
      "TANDEM_PREFILL_CHUNK=5 $PC $M >/dev/null 2>$tmp/err && grep -q 'chunk 5,' $tmp/err"
    t "missing -m: exit 2, one line" "$PC -p $F/prompt.tok >/dev/null 2>$tmp/err; rc=\$?; one_line -m"
    t "missing -p: exit 2, one line" "$PC -m $F/nvfp4 >/dev/null 2>$tmp/err; rc=\$?; one_line -p"
    t "--chunk 0: exit 2, one line" "$PC $M --chunk 0 >/dev/null 2>$tmp/err; rc=\$?; one_line '--chunk 0'"
    t "a missing model directory: exit 2, one line naming it" \
      "$PC -m $tmp/nope -p $F/prompt.tok >/dev/null 2>$tmp/err; rc=\$?; one_line $tmp/nope"
    t "a missing --ref file: exit 2, one line naming it" \
      "$PC $M --ref $tmp/nope.st >/dev/null 2>$tmp/err; rc=\$?; one_line $tmp/nope.st"
    t "unknown --backend: exit 2, one line" "$PC $M --backend gpu >/dev/null 2>$tmp/err; rc=\$?; one_line gpu"
    if [ -f "$F/ref-nvfp4.safetensors" ]; then
        grep -v '^#' "$F/prompt.tok" | tr -s ' \t\n' '\n' | grep . | head -10 >"$tmp/p10.tok"
        t "a --ref file of the wrong shape (40 rows for a 10-token prompt): exit 2, one line naming it and the shapes" \
          "$PC -m $F/nvfp4 -p $tmp/p10.tok --ref $F/ref-nvfp4.safetensors >/dev/null 2>$tmp/err; rc=\$?;
           one_line 'ref-nvfp4.safetensors: .logits. has shape \[40,1024\], expected \[10,1024\]'"
    fi
fi
echo "1..$n"
