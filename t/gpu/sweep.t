#!/bin/sh
# tandem-sweep on the GPU, one small shape and few repeats: the tables it writes (the picks, with a
# few-row setting of at most --lo-rows rows where one is faster at one row) load back, a second
# sweep merges into them (reading and validating the first), --lo-rows 0 writes none, the
# --json report times the rows each table serves, and --objective split's main setting is the
# fastest of its nt at 16 rows in its own report, its few-row setting (if any) serving rows 1..8;
# --plan prints the best setting of each chain count with the rule's count marked and its verdict
# line, reports every timed candidate in --json, and refuses --out (it writes no table).
# Skips without a CUDA device.
SW=bin/tandem-sweep
JG=build/t/json_get
. t/gpu-skip.sh
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
t0=$(date +%s)
took() { t1=$(date +%s); echo "# $1: $((t1 - t0)) s"; t0=$t1; }
$SW --shape 1024,5120 --kernel nvfp4-skinny --reps 3 --out "$tmp/sm" --json "$tmp/a.json" >"$tmp/a.out" 2>"$tmp/a.err"
rc=$?
skip_without_device $rc "$tmp/a.err"
echo "1..11"
took "the sweep of 1024,5120"
n=0
t() { n=$((n + 1)); if eval "$2"; then echo "ok $n - $1"; else echo "not ok $n - $1"; tail -5 "$tmp"/*.err 2>/dev/null | sed 's/^/# /'; fi; }
T=$tmp/sm/nvfp4-skinny.json
timed() { for r in "$@"; do $JG "$tmp/a.json" "0.us.$r" >/dev/null || return 1; done; }
t "exit 0, a table for the shape" "[ $rc -eq 0 ] && [ \"\$($JG $T kernel)\" = '\"nvfp4-skinny\"' ] && $JG $T shapes.1024,5120.kchains >/dev/null"
t "the report: the default first and identical, timed at rows 1, 2, 4, 8 and 16" \
  "[ \$($JG $tmp/a.json 0.default) = true ] && [ \"\$($JG $tmp/a.json 0.verdict)\" = '\"identical\"' ] &&
   timed 1 2 4 8 16"
t "a few-row setting, where written, serves at most 2 rows and has its time" \
  "! $JG $T shapes.1024,5120.lo >/dev/null 2>&1 ||
   { r=\$($JG $T shapes.1024,5120.lo.rows) && [ \$r -ge 1 ] && [ \$r -le 2 ] && $JG $T shapes.1024,5120.lo.us >/dev/null; }"
$SW --shape 2048,5120 --kernel nvfp4-skinny --reps 3 --lo-rows 0 --out "$tmp/sm" >"$tmp/b.out" 2>"$tmp/b.err"
rcb=$?
took "the merging sweep of 2048,5120"
t "a second sweep merges into the table (the first entry read back and kept)" \
  "[ $rcb -eq 0 ] && $JG $T shapes.1024,5120.nt >/dev/null && $JG $T shapes.2048,5120.nt >/dev/null"
t "--lo-rows 0: no few-row setting" "! $JG $T shapes.2048,5120.lo >/dev/null 2>&1"
t "the picks on stderr" "grep -q '1024,5120: picked nt=' $tmp/a.err && grep -q '2048,5120: picked nt=' $tmp/b.err"
$SW --shape 1024,5120 --kernel nvfp4-skinny --reps 3 --objective split --out "$tmp/sp" --json "$tmp/c.json" >"$tmp/c.out" 2>"$tmp/c.err"
rcc=$?
took "the split sweep"
S=$tmp/sp/nvfp4-skinny.json
E=shapes.1024,5120
t "split: exit 0; lo, where written, has the main setting's nt and serves rows 1..8" \
  "[ $rcc -eq 0 ] && $JG $S $E.nt >/dev/null &&
   { ! $JG $S $E.lo >/dev/null 2>&1 || { [ \$($JG $S $E.lo.rows) = 8 ] && [ \$($JG $S $E.lo.nt) = \$($JG $S $E.nt) ]; }; }"
# the report's 16-row medians: the main setting's, and the least among the identical settings of its nt
split_main_fastest() {
    key=""; for f in nt wn wk cs pf; do key="$key $($JG $S $E.$f)" || return 1; done
    i=0; mine=""; least=""
    while v=$($JG "$tmp/c.json" "$i.verdict" 2>/dev/null); do
        if [ "$v" = '"identical"' ] && [ "$($JG "$tmp/c.json" "$i.setting.nt")" = "$($JG $S $E.nt)" ]; then
            us=$($JG "$tmp/c.json" "$i.us.16") || return 1
            k=""; for f in nt wn wk cs pf; do k="$k $($JG "$tmp/c.json" "$i.setting.$f")"; done
            [ "$k" = "$key" ] && mine=$us
            least=$(awk -v a="$us" -v b="$least" 'BEGIN { print (b == "" || a + 0 < b + 0) ? a : b }')
        fi
        i=$((i + 1))
    done
    [ -n "$mine" ] && awk -v a="$mine" -v b="$least" 'BEGIN { exit !(a + 0 == b + 0) }'
}
t "split: the main setting is the fastest of its nt at 16 rows in the report" split_main_fastest
$SW --plan --shape 1024,5120 --kernel nvfp4-skinny --reps 2 --json "$tmp/p.json" >"$tmp/p.out" 2>"$tmp/p.err"
rcp=$?
took "--plan"
rule=$(sed -n 's/^# nvfp4-skinny 1024,5120: fastest at \([0-9]*\) chains, the rule picks \([0-9]*\)$/\2/p' "$tmp/p.out")
t "--plan: exit 0, one verdict line, the rule's count among the timed counts" \
  "[ $rcp -eq 0 ] && [ -n \"$rule\" ] && awk -v r=\"$rule\" '\$1 == \"nvfp4-skinny\" && \$2 == \"1024,5120\" && \$3 == r && /the rule.s count/ { f = 1 } END { exit !f }' $tmp/p.out"
t "--plan: the report holds timed candidates of the shape" \
  "[ \"\$($JG $tmp/p.json 0.n)\" = 1024 ] && [ \"\$($JG $tmp/p.json 0.k)\" = 5120 ] && $JG $tmp/p.json 0.score_us >/dev/null && $JG $tmp/p.json 0.us.1 >/dev/null"
$SW --plan --shape 1024,5120 --kernel nvfp4-skinny --out "$tmp/x" >"$tmp/q.out" 2>"$tmp/q.err"
rcq=$?
t "--plan with --out: exit 2 naming the conflict, no table" "[ $rcq -eq 2 ] && grep -q 'writes no table' $tmp/q.err && [ ! -e $tmp/x ]"
