#!/bin/sh
# Every tool: a true --help (exit 0), bad usage exits 2 (an unknown option, or one without its
# value, with one line naming it); the parts not built yet say so and exit 2;
# tandem-run --settings lists every switch with its value and origin; tandem-benchround refuses bad
# options, a missing model, a missing device and a context too small with exit 2 and one line.
n=0
t() { n=$((n + 1)); if eval "$2"; then echo "ok $n - $1"; else echo "not ok $n - $1"; fi; }
for tool in build/san/bin/tandem-*; do
    name=$(basename "$tool")
    t "$name --help exits 0 and shows usage" "$tool --help 2>&1 | grep -q '^usage: $name'"
    t "$name --bogus-option exits 2 with one line naming it" \
      "out=\$($tool --bogus-option 2>&1 >/dev/null); [ \$? -eq 2 ] && [ \$(printf '%s\n' \"\$out\" | wc -l) -eq 1 ] &&
       printf '%s\n' \"\$out\" | grep -q \"^$name: unknown or ambiguous option '--bogus-option'\""
    t "$name -Z (no such short option) exits 2 with one line naming it" \
      "out=\$($tool -Z 2>&1 >/dev/null); [ \$? -eq 2 ] && [ \"\$out\" = \"$name: unknown option '-Z' (--help lists the options)\" ]"
    t "$name --help=x: exit 2, one line saying --help takes no value" \
      "out=\$($tool --help=x 2>&1 >/dev/null); [ \$? -eq 2 ] && [ \"\$out\" = \"$name: option '--help' takes no value (--help lists the options)\" ]"
done
for a in "tandem-run --prompt" "tandem-sweep --shape" "tandem-coldbw --kernel" "tandem-exactcheck -m" "tandem-mkmodel -o"; do
    set -- $a
    t "$a (its value missing): exit 2, one line naming the option" \
      "out=\$(build/san/bin/$a 2>&1 >/dev/null); [ \$? -eq 2 ] && [ \"\$out\" = \"$1: option '$2' needs a value (--help lists the options)\" ]"
done
t "tandem-exactcheck --backend cuda: exit 2 with one line (no device visible, or the bad model)" \
  "out=\$(build/san/bin/tandem-exactcheck -m x -p x --backend cuda 2>&1 >/dev/null); rc=\$?; [ \$rc -eq 2 ] &&
   [ \$(printf '%s\n' \"\$out\" | grep -vc '^# ') -eq 1 ] &&
   printf '%s\n' \"\$out\" | grep -Eq '^tandem-exactcheck: (--backend cuda: no CUDA device visible|x)'"
t "tandem-prefillcheck without -p: exit 2 with one line naming -p (t/prefillcheck.t runs it on the fixtures)" \
  "out=\$(build/san/bin/tandem-prefillcheck -m x 2>&1 >/dev/null); rc=\$?; [ \$rc -eq 2 ] &&
   [ \$(printf '%s\n' \"\$out\" | wc -l) -eq 1 ] && printf '%s\n' \"\$out\" | grep -q -e '-p FILE is required'"
t "tandem-prefillcheck --help is built (no 'NOT BUILT YET')" \
  "! build/san/bin/tandem-prefillcheck --help | grep -qi 'not built'"
# Without a device: exit 2 and one line saying so; with one, the missing model is the one line.
t "tandem-run --backend cuda: exit 2 with one line (no device visible, or the bad model)" \
  "out=\$(build/san/bin/tandem-run -m x --backend cuda 2>&1 >/dev/null); rc=\$?; [ \$rc -eq 2 ] &&
   [ \$(printf '%s\n' \"\$out\" | wc -l) -eq 1 ] &&
   printf '%s\n' \"\$out\" | grep -Eq '^tandem-run: (--backend cuda: no CUDA device visible|x)'"
for a in "--spec mtp" "--spec ngram --tree 2,1" "--spec mtp --tree 2,1"; do
    t "tandem-run --backend cuda $a: taken (exit 2 only for the missing device or the bad model)" \
      "out=\$(build/san/bin/tandem-run -m x --backend cuda $a 2>&1 >/dev/null); rc=\$?; [ \$rc -eq 2 ] &&
       [ \$(printf '%s\n' \"\$out\" | wc -l) -eq 1 ] &&
       printf '%s\n' \"\$out\" | grep -Eq '^tandem-run: (--backend cuda: no CUDA device visible|x)'"
done
# tandem-benchround: the CUDA engine only; bad options, a missing model and no device are one line, exit 2.
BR=build/san/bin/tandem-benchround
br2() { # the exit status is 2 and stderr has one line besides "# " lines, matching $1
    rc=$?; [ $rc -eq 2 ] && [ "$(grep -vc '^# ' "$brerr")" -eq 1 ] && grep -v '^# ' "$brerr" | grep -Eq "$1"; }
brerr=$(mktemp)
for a in "--rows 0" "--rows 4,33" "--rows 2," "--tree 3,x" "--reps 0" "--tree none --tree 2,1"; do
    t "tandem-benchround $a: exit 2, one line naming the option" \
      "$BR -m x $a >/dev/null 2>$brerr; br2 '^tandem-benchround: --(rows|tree|reps)'"
done
t "tandem-benchround without -m: exit 2, one line" "$BR >/dev/null 2>$brerr; br2 '^tandem-benchround: -m DIR is required'"
t "tandem-benchround on a missing model directory: exit 2, one line naming it" \
  "$BR -m $brerr.nope >/dev/null 2>$brerr; br2 \"^tandem-benchround: $brerr.nope\""
brm=$(mktemp -d)
if build/san/bin/tandem-mkmodel -o "$brm/m" --no-mtp >/dev/null 2>&1; then
    t "tandem-benchround without a CUDA device (CUDA_VISIBLE_DEVICES empty): exit 2, one line saying so" \
      "CUDA_VISIBLE_DEVICES= $BR -m $brm/m --reps 1 >/dev/null 2>$brerr; br2 '^tandem-benchround: CUDA engine: no CUDA device visible$'"
    t "tandem-benchround: a context too small for the series: exit 2, one line naming --ctx" \
      "$BR -m $brm/m --ctx 600 >/dev/null 2>$brerr; br2 '^tandem-benchround: --ctx 600: .* need 2624 positions'"
else
    n=$((n + 1)); echo "not ok $n - tandem-mkmodel failed"
fi
rm -rf "$brm" "$brerr"
t "--settings lists TANDEM_BACKEND with its default" \
  "build/san/bin/tandem-run --settings | grep -q '^TANDEM_BACKEND  *auto  *default'"
t "--settings shows a value from the environment" \
  "TANDEM_PREFILL_CHUNK=7 build/san/bin/tandem-run --settings | grep -q '^TANDEM_PREFILL_CHUNK  *7  *env'"
for sw in TANDEM_ATTN_PREFILL TANDEM_GDN_PREFILL TANDEM_MOE_GROUPED TANDEM_CONCURRENT TANDEM_PDL TANDEM_MM_XB TANDEM_GDN_FUSED_NORM; do
t "--settings lists $sw (on by default); a value other than on or off exits 2" \
  "build/san/bin/tandem-run --settings | grep -q '^$sw  *on  *default' &&
   $sw=maybe build/san/bin/tandem-run --settings >/dev/null 2>&1; [ \$? -eq 2 ]"
done
t "--settings lists TANDEM_MM_DIRECT (auto by default); on and off are taken, another value exits 2" \
  "build/san/bin/tandem-run --settings | grep -q '^TANDEM_MM_DIRECT  *auto  *default' &&
   TANDEM_MM_DIRECT=on build/san/bin/tandem-run --settings | grep -q '^TANDEM_MM_DIRECT  *on  *env' &&
   TANDEM_MM_DIRECT=off build/san/bin/tandem-run --settings >/dev/null &&
   TANDEM_MM_DIRECT=maybe build/san/bin/tandem-run --settings >/dev/null 2>&1; [ \$? -eq 2 ]"
t "every switch in the table is listed" \
  "[ \$(build/san/bin/tandem-run --settings | grep -c '^TANDEM_') -eq \$(grep -c '^    {\"TANDEM_' src/common/settings.c) ]"
F=${TANDEM_FIXTURES:-../shared/fixtures}/qwen35-tiny
if [ -d "$F" ]; then
    tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
    # the tiny qwen3_5: 3 GDN layers of 6 x 64 x 64 FP32 states, 1 attention layer of 2 KV heads of 64
    t "tandem-run --json: the bytes a decode step moves (weights + GDN state read and written + KV read)" \
      "build/san/bin/tandem-run -m $F/nvfp4 -p $F/prompt.tok -n 4 --backend cpu --json $tmp/r.json >/dev/null 2>$tmp/err &&
       grep -q '^# a decode step moves' $tmp/err &&
       [ \$(build/t/json_get $tmp/r.json step_bytes.gdn_state) -eq \$((3 * 2 * 6 * 64 * 64 * 4)) ] &&
       [ \$(build/t/json_get $tmp/r.json step_bytes.kv) -eq \$((2 * (40 + 2 + 1) * 2 * 64 * 2)) ] &&
       w=\$(build/t/json_get $tmp/r.json step_bytes.weights) && [ \$w -gt 2000000 ] &&
       [ \$(build/t/json_get $tmp/r.json step_bytes.total) -eq \$((w + 3 * 2 * 6 * 64 * 64 * 4 + 2 * 43 * 2 * 64 * 2)) ]"
    t "tandem-run --json into a directory that does not exist: exit 2, one line naming the file, nothing left behind" \
      "build/san/bin/tandem-run -m $F/nvfp4 -p $F/prompt.tok -n 2 --backend cpu --json $tmp/none/r.json >/dev/null 2>$tmp/err;
       [ \$? -eq 2 ] && [ \$(grep -vc '^# ' $tmp/err) -eq 1 ] && grep -v '^# ' $tmp/err | grep -q '^tandem-run: .*none/r.json' &&
       [ ! -e $tmp/none ]"
fi
echo "1..$n"
