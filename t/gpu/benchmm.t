#!/bin/sh
# tandem-benchmm on the GPU, the 27B's shapes at one and 16 rows with one repeat: a line per
# projection and row count, the SwiGLU pair's lines in its three forms (mlp.gate+up one launch,
# mlp.gate;up*silu and mlp.gate;up;silu) with NVFP4 and FP8 times and the form each format's engine runs,
# and the --json record holding them; the header names the card each shipped table was swept on, as the
# record does.
# Skips without a CUDA device.
JG=build/t/json_get
. t/gpu-skip.sh
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
bin/tandem-benchmm --model qwen3.8-27b --rows 1,16 --reps 1 --no-baseline --no-token --json "$tmp/a.json" >"$tmp/a.out" 2>"$tmp/a.err"
rc=$?
skip_without_device $rc "$tmp/a.err"
echo "1..7"
n=0
t() { n=$((n + 1)); if eval "$2"; then echo "ok $n - $1"; else echo "not ok $n - $1"; tail -5 "$tmp/a.out" "$tmp/a.err" | sed 's/^/# /'; fi; }
t "exit 0" "[ $rc -eq 0 ]"
t "a line per projection shape and row count (9 shapes x 2)" \
  "[ \$(grep -cE '^qwen3.8-27b +[a-z_.]+ +[0-9]+,[0-9]+ +(1|16) \| +[0-9.]+ ' $tmp/a.out) -eq 18 ]"
t "the SwiGLU pair at 1 and 16 rows, timed in NVFP4 and FP8 (the shipped tables' nt 2 on 17408,5120)" \
  "[ \$(grep -cE '^qwen3.8-27b +mlp.gate\+up +17408,5120 +(1|16) \| +[0-9]+\.[0-9]+ +[0-9]+ +[0-9]+% +[0-9.]+ \| +[0-9]+\.[0-9]+ ' $tmp/a.out) -eq 2 ]"
t "the pair's two- and three-launch forms at 1 and 16 rows, timed in NVFP4 and FP8 (graph only)" \
  "[ \$(grep -cE '^qwen3.8-27b +mlp.gate;up(\*silu|;silu) +17408,5120 +(1|16) \| +[0-9]+\.[0-9]+ +[0-9]+ +[0-9]+% +- +\| +[0-9]+\.[0-9]+ ' $tmp/a.out) -eq 4 ]"
# The engine's form, once a format and row count (tdm_matmul_swiglu_form): the one launch at 1 and 16 rows
# in NVFP4 (held tile-major) and FP8.
engine_form() {   # ROWS FORMAT: the suffix of each line marked as that format's engine form
    grep -E "^qwen3.8-27b +mlp.gate[^ ]* +17408,5120 +$1 \|.*\(the engine's: [a-z0-9 ]*\b$2\b" $tmp/a.out | awk '{print $2}' | tr '\n' ' '
}
t "the engine's form named once a format and row count: nvfp4 and fp8 gate+up at 1 and 16 rows" \
  "[ \"\$(engine_form 1 nvfp4)\$(engine_form 16 nvfp4)\$(engine_form 1 fp8)\$(engine_form 16 fp8)\" = 'mlp.gate+up mlp.gate+up mlp.gate+up mlp.gate+up ' ]"
# the JSON record: the SwiGLU entries after the 18 per-shape ones
swiglu_json() {
    i=0
    while p=$($JG "$tmp/a.json" "shapes.$i.projection" 2>/dev/null); do
        [ "$p" = '"mlp.gate+up"' ] && [ "$($JG "$tmp/a.json" "shapes.$i.swiglu")" = true ] &&
            $JG "$tmp/a.json" "shapes.$i.nvfp4_graph_us" >/dev/null && $JG "$tmp/a.json" "shapes.$i.fp8_graph_us" >/dev/null &&
            return 0
        i=$((i + 1))
    done
    return 1
}
t "--json: the pair's record, marked swiglu, with its NVFP4 and FP8 times" swiglu_json
t "the card each table was swept on: a header line and the record's tables_swept_on (the shipped fp8 table's)" \
  "grep -q '^# tables swept on: nvfp4-skinny [^;]*; nvfp4-skinny-wide ' $tmp/a.out &&
   arch=\$(sed -n '1s/^# .* (\\(sm_[0-9]*\\), .*/\\1/p' $tmp/a.out) &&
   [ \"\$($JG $tmp/a.json tables_swept_on.fp8)\" = \"\$($JG tiles/\$arch/fp8.json device)\" ]"
