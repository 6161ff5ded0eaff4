#!/bin/sh
# tandem-coldbw on the GPU, small buffers and few repeats: the read, copy and launch-floor lines,
# the NVFP4 kernel's lines (eager, graphed, on one copy) and its weight reads alone at 1, 2, 4 and
# 8 slabs in flight; the JSON record holds each with a positive rate; a shape whose K is not a
# multiple of 128 prints no reads-alone lines. Skips without a CUDA device.
CB=bin/tandem-coldbw
JG=build/t/json_get
. t/gpu-skip.sh
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
$CB --mib 64 --reps 3 --kernel nvfp4 --shape 2048,4096 --json "$tmp/c.json" >"$tmp/c.out" 2>"$tmp/c.err"
rc=$?
skip_without_device $rc "$tmp/c.err"
echo "1..9"
n=0
t() { n=$((n + 1)); if eval "$2"; then echo "ok $n - $1"; else echo "not ok $n - $1"; sed 's/^/# /' "$tmp/c.err" "$tmp/c.out"; fi; }
pos() { v=$($JG "$1" "$2") && awk -v v="$v" 'BEGIN { exit !(v + 0 > 0) }'; }
t "exit 0" "[ $rc -eq 0 ]"
t "read, copy, eager and graphed kernel lines" \
  "grep -q '^read ' $tmp/c.out && grep -q '^copy ' $tmp/c.out && grep -q '^nvfp4 2048x4096 m=1 eager' $tmp/c.out &&
   grep -q '^nvfp4 2048x4096 m=1 graph' $tmp/c.out"
t "the launch floor's line (programmatic), and its time in the JSON record" \
  "grep -q '^launch floor (graph, programmatic)' $tmp/c.out && pos $tmp/c.json launch_floor.ms"
t "the one-copy line, and its time in the JSON record" \
  "grep -q '^nvfp4 2048x4096 m=1 one copy' $tmp/c.out && pos $tmp/c.json kernel.one_copy_ms"
t "four reads-alone lines, depth 1 2 4 8" \
  "[ \$(grep -c '^nvfp4 rows read alone, depth [1248] ' $tmp/c.out) -eq 4 ]"
t "JSON: read, copy and the kernel's rates positive" \
  "pos $tmp/c.json read.gbps && pos $tmp/c.json copy.gbps && pos $tmp/c.json kernel.graph_gbps"
t "JSON: the reads alone at each depth, positive" \
  "pos $tmp/c.json rows_read_alone.0.gbps && pos $tmp/c.json rows_read_alone.3.gbps &&
   [ \$($JG $tmp/c.json rows_read_alone.3.depth) = 8 ] && [ \$($JG $tmp/c.json rows_read_alone.3.layout) = '\"stored\"' ]"
t "the other two layouts' reads alone, depth 1 and 4, in the table and the JSON" \
  "[ \$(grep -c '^nvfp4 tiles read alone, depth [14] ' $tmp/c.out) -eq 2 ] &&
   [ \$(grep -c '^nvfp4 slabs read alone, depth [14] ' $tmp/c.out) -eq 2 ] &&
   [ \$($JG $tmp/c.json rows_read_alone.7.layout) = '\"slabs\"' ] && [ \$($JG $tmp/c.json rows_read_alone.7.depth) = 4 ] &&
   pos $tmp/c.json rows_read_alone.7.gbps"
$CB --mib 64 --reps 2 --kernel nvfp4 --shape 1024,2064 >"$tmp/d.out" 2>"$tmp/d.err"
t "K not a multiple of 128: the kernel's lines, no reads-alone lines" \
  "grep -q '^nvfp4 1024x2064 m=1 graph' $tmp/d.out && ! grep -q 'read alone' $tmp/d.out"
