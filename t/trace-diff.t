#!/bin/sh
# scripts/trace-diff on two small traces in kerneltrace's format: graphs matched by number, each kernel's
# span a launch in both, the largest change first, a kernel in one trace alone shown with "-", --graph and
# --min, and bad usage or a file that is no trace (exit 2, one line naming it).
. t/cmd-tap.sh
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
TD=scripts/trace-diff
cat >"$tmp/a.txt" <<'T'
graph  launches kernels    span_us    busy_us   gaps  first
2            23     169     2128.2     2115.8   0.6%  k

# graph 2: 23 launches of 3 kernels, 300.0 us of kernel time and 200.0 us of span a launch (mean); by kernel:
   calls         us  share    span_us sshare  kernel
    16.0      150.0  50.0%      120.0  60.0%  void big<3, 2> <<<726,1,1>>>
    12.0      100.0  33.3%       50.0  25.0%  recur_kernel<16, false> <<<48,4,1>>>
     4.0       50.0  16.7%       30.0  15.0%  gone_kernel <<<1,1,1>>>

# graph 5: 11 launches of 1 kernels, 10.0 us of kernel time and 10.0 us of span a launch (mean); by kernel:
   calls         us  share    span_us sshare  kernel
     1.0       10.0 100.0%       10.0 100.0%  only_a <<<1,1,1>>>
T
cat >"$tmp/b.txt" <<'T'
# graph 2: 23 launches of 3 kernels, 250.0 us of kernel time and 150.0 us of span a launch (mean); by kernel:
   calls         us  share    span_us sshare  kernel
    16.0      120.0  48.0%       80.0  53.3%  void big<3, 2> <<<726,1,1>>>
    12.0      100.0  40.0%       52.0  34.7%  recur_kernel<16, false> <<<48,4,1>>>
     2.0       30.0  12.0%       18.0  12.0%  new_kernel <<<2,1,1>>>
T
$TD "$tmp/a.txt" "$tmp/b.txt" >"$tmp/out" 2>"$tmp/err"; rc=$?
t "exit 0, one graph (5 is in A alone)" sh -c "[ $rc -eq 0 ] && [ \$(grep -c '^# graph' '$tmp/out') -eq 1 ] && [ ! -s '$tmp/err' ]"
t "the graph's span a launch: 200.0 -> 150.0 us (-50.0, -25.0%)" grep -qx '# graph 2: span a launch 200.0 -> 150.0 us (-50.0, -25.0%)' "$tmp/out"
t "the largest change first: big (-40.0, -33.3 %), gone (-30.0), new (+18.0), recur (+2.0)" \
    awk '/void big</ { b = NR } /gone_kernel/ { g = NR } /new_kernel/ { n = NR } /recur_kernel/ { r = NR }
         END { exit !(b && b < g && g < n && n < r) }' "$tmp/out"
t "a kernel and grid as one key; its calls, spans, change and share" \
    grep -q '^ *16.0 *120.0 *80.0 *-40.0 *-33.3  void big<3, 2> <<<726,1,1>>>$' "$tmp/out"
t "a kernel in one trace alone: '-' on the other side" sh -c "
    grep -q '^ *4.0 *30.0 *- *-30.0 *-100.0  gone_kernel' '$tmp/out' && grep -q '^ *2.0 *- *18.0 *+18.0 *-  new_kernel' '$tmp/out'"
t "--min 5 leaves out recur's +2.0" sh -c "$TD --min 5 '$tmp/a.txt' '$tmp/b.txt' | grep -q big && ! $TD --min 5 '$tmp/a.txt' '$tmp/b.txt' | grep -q recur_kernel"
t "--graph 5: no graph in both, nothing printed" sh -c "[ -z \"\$($TD --graph 5 '$tmp/a.txt' '$tmp/b.txt')\" ]"
t "--graph 2 --graph 5: graph 2" sh -c "$TD --graph 2 --graph 5 '$tmp/a.txt' '$tmp/b.txt' | grep -q '^# graph 2:'"
echo "plain text" >"$tmp/c.txt"
t "a file that is no trace: exit 2 naming it" exits 2 "c.txt: no graph in it" $TD "$tmp/a.txt" "$tmp/c.txt"
t "a missing file: exit 2 naming it" exits 2 "nosuch.txt: cannot read" $TD "$tmp/a.txt" "$tmp/nosuch.txt"
t "--graph x: exit 2 naming it" exits 2 "--graph x" $TD --graph x "$tmp/a.txt" "$tmp/b.txt"
t "--min x: exit 2 naming it" exits 2 "--min x" $TD --min x "$tmp/a.txt" "$tmp/b.txt"
t "an unknown option: exit 2 naming it" exits 2 "unknown option '--bogus'" $TD --bogus "$tmp/a.txt" "$tmp/b.txt"
t "one file: exit 2 with the usage" sh -c "$TD '$tmp/a.txt' >/dev/null 2>'$tmp/u'; [ \$? -eq 2 ] && grep -q 'Usage: scripts/trace-diff' '$tmp/u'"
t "--help: exit 0, the usage on stdout" sh -c "$TD --help | grep -q 'Usage: scripts/trace-diff'"
echo "1..$n"
[ "$failed" -eq 0 ]
