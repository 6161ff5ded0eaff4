#!/bin/sh
# tandem-coldbw on the GPU, small buffers and few repeats: the read, copy and launch-floor lines,
# the NVFP4 kernel's lines (eager, graphed, on one copy) and its weight reads alone at 1, 2, 4 and
# 8 slabs in flight; the JSON record holds each with a positive rate; a shape whose K is not a
# multiple of 128 prints no reads-alone lines. The slab-major probe (--slab-major): refused by the
# default build; in the variant built with TDM_MM_SLAB_MAJOR=1 (bin/tandem-coldbw-slab, scripts/variant-build
# slab "-DTDM_MM_SLAB_MAJOR=1" tandem-coldbw) the kernel on slab-major copies gives the stored order's
# bits at each row form, NVFP4 and FP8; the same for tile-major copies in the variant built with
# TDM_MM_SLAB_MAJOR=2 (bin/tandem-coldbw-tile). Skips without a CUDA device.
CB=bin/tandem-coldbw
JG=build/t/json_get
. t/gpu-skip.sh
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
$CB --mib 64 --reps 3 --kernel nvfp4 --shape 2048,4096 --json "$tmp/c.json" >"$tmp/c.out" 2>"$tmp/c.err"
rc=$?
skip_without_device $rc "$tmp/c.err"
echo "1..14"
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
$CB --mib 64 --reps 2 --kernel nvfp4 --shape 1024,2048 --slab-major >"$tmp/e.out" 2>"$tmp/e.err"
rc=$?
t "--slab-major in the default build: exit 2, saying the build has no such kernel, before any line" \
  "[ $rc -eq 2 ] && grep -q 'no slab-major kernel' $tmp/e.err && [ ! -s $tmp/e.out ]"
# the variants: each row form (1 row; 2-8, 9-16 per lane from x's blocked copy; 17-24, 25-32), both
# formats; VB the variant, WORD its line's word, ORDER its JSON order
order_runs() {
    for run in "nvfp4 1" "nvfp4 5" "nvfp4 16" "nvfp4 20" "nvfp4 32" "fp8 1" "fp8 12" "fp8 32"; do
        set -- $run
        $VB --mib 64 --reps 2 --kernel "$1" --shape 2048,4096 --rows "$2" --slab-major --json "$tmp/s.json" \
            >"$tmp/s.out" 2>"$tmp/s.err" || { echo "# $1 at $2 rows: exit $?"; sed 's/^/# /' "$tmp/s.err"; return 1; }
        grep -q "^$1 2048x4096 m=$2 $WORD " "$tmp/s.out" && [ "$($JG "$tmp/s.json" kernel.slab_major_bytes_differ)" = 0 ] &&
            [ "$($JG "$tmp/s.json" kernel.slab_major_order)" = "\"$ORDER\"" ] &&
            pos "$tmp/s.json" kernel.slab_major_gbps || { echo "# $1 at $2 rows: no line, order or rate"; return 1; }
    done
}
# variant_tests NAME KNOB WORD ORDER WHAT SHAPE FAULT MESSAGE: bin/tandem-coldbw-NAME (TDM_MM_SLAB_MAJOR=KNOB)
# gives WHAT's bits at each row form; --shape SHAPE is its usage fault FAULT (exit 2, MESSAGE on stderr)
variant_tests() {
    VB=bin/tandem-coldbw-$1 WORD=$3 ORDER=$4
    if [ -x "$VB" ]; then
        t "$3 variant: the same bits as $5, NVFP4 at 1 5 16 20 32 rows, FP8 at 1 12 32" order_runs
        $VB --mib 64 --reps 2 --kernel nvfp4 --shape "$6" --slab-major >"$tmp/f.out" 2>"$tmp/f.err"
        rc=$?
        t "$3 variant, $7: exit 2 naming it" "[ $rc -eq 2 ] && grep -q '$8' $tmp/f.err"
    else
        n=$((n + 1)); echo "ok $n # skip $VB not built (scripts/variant-build $1 \"-DTDM_MM_SLAB_MAJOR=$2\" tandem-coldbw)"
        n=$((n + 1)); echo "ok $n # skip $VB not built"
    fi
}
variant_tests slab 1 slab-major slabs "the stored order" 1024,2064 "K not a multiple of 128" "K a multiple of 128"
# the tile-major variant's fast path reads tiles alone, so its stored-order product (the check's other
# side) takes the checked path
variant_tests tile 2 tile-major tiles "the checked path on the stored order" 1032,2048 "N not a multiple of 16" \
    "N a multiple of 16"
