#!/bin/sh
# The matrix tools' command lines: --help, bad usage (exit 2, one line naming the option), no
# visible CUDA device (exit 2, "no CUDA device visible", forced with CUDA_VISIBLE_DEVICES=), and
# tandem-sweep --write-defaults, which needs no GPU; the device helpers' (scripts/variant-build,
# scripts/bundle) usage and scripts/bundle's list; scripts/gpu-run's tile-table A/B on stand-in tools.
. t/cmd-tap.sh
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for tool in tandem-coldbw tandem-sweep tandem-benchmm; do
    t "$tool --help exits 0 and prints the usage" sh -c "bin/$tool --help | grep -q '^usage: $tool'"
    t "$tool: an unknown option exits 2" sh -c "bin/$tool --no-such-option >/dev/null 2>&1; [ \$? -eq 2 ]"
    t "$tool: an unexpected argument exits 2 with one line" exits 2 "unexpected argument" bin/$tool extra
done
t "tandem-coldbw --rows x: exit 2 naming --rows" exits 2 "--rows" bin/tandem-coldbw --rows x
t "tandem-coldbw --kernel foo: exit 2 naming --kernel" exits 2 "--kernel" bin/tandem-coldbw --kernel foo --shape 1,16
t "tandem-coldbw --kernel without --shape: exit 2" exits 2 "--shape" bin/tandem-coldbw --kernel nvfp4
t "tandem-coldbw --shape 5120: exit 2 naming --shape" exits 2 "--shape" bin/tandem-coldbw --kernel fp8 --shape 5120
t "tandem-sweep without shapes: exit 2" exits 2 "no shapes" bin/tandem-sweep
t "tandem-sweep --model-shapes foo: exit 2 naming the option" exits 2 "--model-shapes" bin/tandem-sweep --model-shapes foo
t "tandem-sweep --kernel foo: exit 2 naming the option" exits 2 "--kernel" bin/tandem-sweep --shape 64,256 --kernel foo
t "tandem-sweep NVFP4 with K not a multiple of 16: exit 2" exits 2 "multiple of 16" bin/tandem-sweep --shape 64,200
t "tandem-sweep --objective foo: exit 2 naming the option" exits 2 "--objective" bin/tandem-sweep --shape 64,256 --objective foo
t "tandem-sweep --lo-rows 9: exit 2 naming the option" exits 2 "--lo-rows" bin/tandem-sweep --shape 64,256 --lo-rows 9
t "tandem-sweep --lo-rows x: exit 2 naming the option" exits 2 "--lo-rows" bin/tandem-sweep --shape 64,256 --lo-rows x
t "tandem-sweep --objective split --lo-rows 0: exit 2 naming the option" exits 2 "--lo-rows" bin/tandem-sweep --shape 64,256 --objective split --lo-rows 0
t "scripts/variant-build --help exits 0 and prints the usage" sh -c "scripts/variant-build --help | grep -q '^scripts/variant-build NAME'"
t "scripts/variant-build without a name and defines: exit 2 with its usage" exits 2 "usage" scripts/variant-build
t "scripts/variant-build with a bad name: exit 2 naming NAME" exits 2 "NAME" scripts/variant-build "a/b" "-DX=1"
t "scripts/bundle --help exits 0 and prints the usage" sh -c "scripts/bundle --help | grep -q '^Usage: scripts/bundle'"
t "scripts/bundle with an unknown argument: exit 2" sh -c "scripts/bundle --no-such >/dev/null 2>&1; [ \$? -eq 2 ]"
t "scripts/bundle --variant a/b: exit 2 naming --variant" exits 2 "--variant a/b" scripts/bundle --variant a/b --list
t "scripts/bundle --variant of no build: exit 2 naming it" exits 2 "nosuch" scripts/bundle --variant nosuch --list
t "scripts/bundle --list: every tool and test program, the fixtures, nothing written" sh -c "scripts/bundle --list \
    -o '$tmp/none.txz' >'$tmp/list' 2>/dev/null && grep -qx bin/tandem-run '$tmp/list' && grep -qx build/t/layers_gpu '$tmp/list' &&
    [ \$(grep -c '^bin/' '$tmp/list') -eq \$(ls src/cmd/*.c | wc -l) ] && [ ! -e '$tmp/none.txz' ] &&
    { [ ! -d '${TANDEM_FIXTURES:-../shared/fixtures}/qwen35-tiny' ] || grep -qx .fixtures/qwen35-tiny '$tmp/list'; }"
# scripts/gpu-run ab80 on stand-in tools (no GPU): each GPU_RUN_AB_TILES directory is one more "build", the
# default binary with TANDEM_TILES set to it; a missing directory fails the part
g=$tmp/gr; mkdir -p "$g/scripts" "$g/bin" "$tmp/tA/sm_90" && cp scripts/gpu-run "$g/scripts/"
printf '#!/bin/sh\nexit 0\n' >"$g/bin/tandem-coldbw"
printf '#!/bin/sh\necho "$*" >>"%s/mkargs"\nwhile [ $# -gt 0 ]; do [ "$1" = -o ] && mkdir -p "$2" && : >"$2/config.json"; shift; done\n' "$tmp" >"$g/bin/tandem-mkmodel"
printf '#!/bin/sh\necho "$0 $TANDEM_TILES" >>"%s/runs"\necho "$*" >>"%s/args"\necho "fuse=$TANDEM_MLP_FUSE" >>"%s/fuses0"\necho "step 1 a b c d e 0.5"\n' "$tmp" "$tmp" "$tmp" >"$g/bin/tandem-benchround"
chmod +x "$g/bin/"*
t "gpu-run ab80 with GPU_RUN_AB_TILES: the default build, then the tiles directory through TANDEM_TILES" sh -c "
    GPU_RUN_AB_TILES='$tmp/tA' GPU_RUN_AB_PASSES=1 GPU_RUN_MODEL80='$tmp/m80' OUT='$tmp/gro' '$g/scripts/gpu-run' ab80 >/dev/null 2>&1 &&
    grep -qx 'new 1 step 1 0.5' '$tmp/gro/ab80.txt' && grep -qx 'tiles1 1 step 1 0.5' '$tmp/gro/ab80.txt' &&
    grep -q 'tandem-benchround \$' '$tmp/runs' && grep -q 'tandem-benchround $tmp/tA\$' '$tmp/runs'"
t "gpu-run ab27: the 16-layer 27B made into GPU_RUN_MODEL27S, rounds of 1, 16 and 32 rows on it" sh -c "
    GPU_RUN_MODEL27S='$tmp/m27' OUT='$tmp/gro27' '$g/scripts/gpu-run' ab27 >/dev/null 2>&1 && [ -f '$tmp/m27/config.json' ] &&
    grep -qx 'new 1 step 1 0.5' '$tmp/gro27/ab27.txt' && grep -qx 'new 2 step 1 0.5' '$tmp/gro27/ab27.txt' &&
    grep -qx -- '-m $tmp/m27 --rows 1,16,32 --tree none --reps 10' '$tmp/args'"
t "gpu-run ab27: ab27-times.txt, a line a run: build, pass, its start and end (seconds, end >= start); four passes by default" sh -c "
    [ \$(wc -l < '$tmp/gro27/ab27-times.txt') -eq 4 ] &&
    awk '\$1 != \"new\" || \$2 != NR || NF != 4 || \$4 + 0 < \$3 + 0 || \$3 + 0 < 1e9 { bad = 1 } END { exit bad }' '$tmp/gro27/ab27-times.txt'"
t "gpu-run ab27 with GPU_RUN_AB27_FORMAT=fp8: the 16-layer 27B made in FP8" sh -c "
    GPU_RUN_AB27_FORMAT=fp8 GPU_RUN_AB_PASSES=1 GPU_RUN_MODEL27S='$tmp/m27f' OUT='$tmp/gro27f' '$g/scripts/gpu-run' ab27 >/dev/null 2>&1 &&
    grep -q -- '-o $tmp/m27f --shape qwen3.8-27b --format fp8 --layers 16' '$tmp/mkargs' &&
    grep -qx 'new 1 step 1 0.5' '$tmp/gro27f/ab27.txt'"
t "gpu-run with GPU_RUN_AB27_FORMAT=nvfp8: exit 2 naming the formats" exits 2 "nvfp4, fp8 or bf16" env GPU_RUN_AB27_FORMAT=nvfp8 \
    OUT="$tmp/gro27x" "$g/scripts/gpu-run" ab27
printf '#!/bin/sh\necho "fuse=$TANDEM_MLP_FUSE" >>"%s/fuses"\necho "step 1 a b c d e 0.5"\n' "$tmp" >"$g/bin/tandem-benchround-fz"
chmod +x "$g/bin/tandem-benchround-fz"
t "gpu-run ab27 with GPU_RUN_AB_SETTINGS: the default build, then the default binary with the setting (set1)" sh -c "
    GPU_RUN_AB=fz GPU_RUN_AB_SETTINGS='TANDEM_MLP_FUSE=on' GPU_RUN_AB_PASSES=1 GPU_RUN_MODEL27S='$tmp/m27' OUT='$tmp/gros' \
        '$g/scripts/gpu-run' ab27 >/dev/null 2>&1 &&
    grep -qx 'new 1 step 1 0.5' '$tmp/gros/ab27.txt' && grep -qx 'fz 1 step 1 0.5' '$tmp/gros/ab27.txt' &&
    grep -qx 'set1 1 step 1 0.5' '$tmp/gros/ab27.txt' && grep -qx 'fuse=' '$tmp/fuses' &&
    [ \"\$(tail -2 '$tmp/fuses0' | tr '\n' ' ')\" = 'fuse= fuse=on ' ]"
printf '#!/bin/sh\necho "step 1 a b c d e 0.55"\n' >"$g/bin/tandem-benchround-sl" && chmod +x "$g/bin/tandem-benchround-sl"
t "gpu-run ab27 over its default four passes: even ones in the reverse order (new sl, sl new, ...), each build against new as the median of the passes' ratios" sh -c "
    GPU_RUN_AB=sl GPU_RUN_MODEL27S='$tmp/m27' OUT='$tmp/grab' '$g/scripts/gpu-run' ab27 >'$tmp/grab.out' 2>&1 &&
    [ \"\$(cut -d' ' -f1,2 '$tmp/grab/ab27.txt' | tr '\n' ' ')\" = 'new 1 sl 1 sl 2 new 2 new 3 sl 3 sl 4 new 4 ' ] &&
    grep -q '^ *sl vs new (median of the passes.* ratios): step 1 +10.0 % (4)\$' '$tmp/grab.out'"
t "gpu-run ab27: a GPU_RUN_AB_SETTINGS word not TANDEM_NAME=VALUE: exit 2 naming it" exits 2 "'MLP_FUSE=on' is not TANDEM_NAME=VALUE" \
    env GPU_RUN_AB_SETTINGS=MLP_FUSE=on GPU_RUN_MODEL27S="$tmp/m27" OUT="$tmp/grox" "$g/scripts/gpu-run" ab27
t "gpu-run ab80 with a GPU_RUN_AB_TILES directory that is not there: exit 1 naming it" sh -c "
    GPU_RUN_AB_TILES='$tmp/nosuch' GPU_RUN_MODEL80='$tmp/m80' OUT='$tmp/gro' '$g/scripts/gpu-run' ab80 >/dev/null 2>'$tmp/gre';
    [ \$? -eq 1 ] && grep -q 'no tile directory $tmp/nosuch' '$tmp/gre'"
# scripts/gpu-run order on stand-in tools: without the variant the part fails naming how to make it; with
# it, each case the default build then the variant, over GPU_RUN_ORDER_PASSES passes
t "gpu-run order without a variant: exit 1, the summary naming scripts/variant-build" sh -c "
    OUT='$tmp/gro0' '$g/scripts/gpu-run' order >'$tmp/gro0.out' 2>&1; [ \$? -eq 1 ] &&
    grep -q 'order: *FAILED (no bin/tandem-coldbw-rows or -tiles: scripts/variant-build rows' '$tmp/gro0.out'"
printf '#!/bin/sh\necho "tiles $*"\n' >"$g/bin/tandem-coldbw-tiles" && chmod +x "$g/bin/tandem-coldbw-tiles"
printf '#!/bin/sh\necho "default $*"\n' >"$g/bin/tandem-coldbw"
t "gpu-run order: six NVFP4 cases (1, 16, 32 rows), the default build then tiles, two passes" sh -c "
    OUT='$tmp/gor' '$g/scripts/gpu-run' order >/dev/null 2>&1 && [ \$(grep -c '^tiles --kernel nvfp4' '$tmp/gor/order.txt') -eq 12 ] &&
    [ \$(grep -c '^default --kernel nvfp4' '$tmp/gor/order.txt') -eq 12 ] &&
    grep -q '^tiles --kernel nvfp4 --shape 17408,5120 --rows 32 ' '$tmp/gor/order.txt' &&
    awk '/^default --kernel nvfp4 --shape 5120,6144 --rows 1 /{d=NR} /^tiles --kernel nvfp4 --shape 5120,6144 --rows 1 /{if (d && NR > d) ok=1} END{exit !ok}' '$tmp/gor/order.txt' &&
    grep -q -- '--json $tmp/gor/order-default-5120,6144-1-p2.json' '$tmp/gor/order.txt' &&
    grep -q -- '--json $tmp/gor/order-tiles-5120,6144-1-p2.json' '$tmp/gor/order.txt'"
t "gpu-run order with GPU_RUN_ORDER_PASSES=1: six of each" sh -c "
    GPU_RUN_ORDER_PASSES=1 OUT='$tmp/gor1' '$g/scripts/gpu-run' order >/dev/null 2>&1 &&
    [ \$(grep -c '^tiles --kernel' '$tmp/gor1/order.txt') -eq 6 ] && [ \$(grep -c '^default --kernel' '$tmp/gor1/order.txt') -eq 6 ]"
printf '#!/bin/sh\necho "rows $*"\n' >"$g/bin/tandem-coldbw-rows" && chmod +x "$g/bin/tandem-coldbw-rows"
t "gpu-run order with both variants built: each case the default build, then rows, then tiles" sh -c "
    GPU_RUN_ORDER_PASSES=1 OUT='$tmp/gor2' '$g/scripts/gpu-run' order >/dev/null 2>&1 &&
    [ \$(grep -c '^rows --kernel' '$tmp/gor2/order.txt') -eq 6 ] && [ \$(grep -c '^tiles --kernel' '$tmp/gor2/order.txt') -eq 6 ] &&
    awk '/^default --kernel nvfp4 --shape 17408,5120 --rows 32 /{d=NR} /^tiles --kernel nvfp4 --shape 17408,5120 --rows 32 /{t=NR}
         /^rows --kernel nvfp4 --shape 17408,5120 --rows 32 /{r=NR} END{exit !(d && d < r && r < t)}' '$tmp/gor2/order.txt'"
# scripts/gpu-run tests on stand-in test files: one job slot starts them longest first (the script's list, then
# any other file), or in the order GPU_RUN_TESTS names them
mkdir -p "$g/t/gpu"
for f in benchmm coldbw layers sweep zz; do
    printf '#!/bin/sh\necho %s >>"%s/started"\necho 1..1\necho ok 1\n' "$f" "$tmp" >"$g/t/gpu/$f.t"
done
t "gpu-run tests with one job slot: longest first (layers, sweep, benchmm, coldbw), then the file not in its list" sh -c "
    : >'$tmp/started'; GPU_RUN_TEST_JOBS=1 OUT='$tmp/gte' '$g/scripts/gpu-run' tests >/dev/null 2>&1 &&
    [ \"\$(tr '\n' ' ' <'$tmp/started')\" = 'layers sweep benchmm coldbw zz ' ] &&
    grep -q '^# t/gpu/zz.t: exit 0, ' '$tmp/gte/gpu-tests.log'"
t "gpu-run tests with GPU_RUN_TESTS: its files in its order; a file not there fails the part" sh -c "
    : >'$tmp/started'; GPU_RUN_TEST_JOBS=1 GPU_RUN_TESTS='t/gpu/coldbw.t t/gpu/sweep.t' OUT='$tmp/gtf' '$g/scripts/gpu-run' tests >/dev/null 2>&1 &&
    [ \"\$(tr '\n' ' ' <'$tmp/started')\" = 'coldbw sweep ' ] &&
    { GPU_RUN_TESTS='t/gpu/nosuch.t' OUT='$tmp/gtg' '$g/scripts/gpu-run' tests >/dev/null 2>&1; [ \$? -eq 1 ]; }"
printf '#!/bin/sh\nexit 0\n' >"$g/bin/tandem-coldbw"
t "tandem-benchmm --rows 0: exit 2 naming --rows" exits 2 "--rows" bin/tandem-benchmm --rows 0
t "tandem-benchmm --model foo: exit 2 naming --model" exits 2 "--model" bin/tandem-benchmm --model foo
t "TANDEM_ unknown switch: exit 2" exits 2 "unknown switch" env TANDEM_NO_SUCH=1 bin/tandem-coldbw
export CUDA_VISIBLE_DEVICES=
t "tandem-coldbw without a device: exit 2, no CUDA device visible" exits 2 "no CUDA device visible" bin/tandem-coldbw
t "tandem-sweep without a device: exit 2" exits 2 "no CUDA device visible" bin/tandem-sweep --shape 64,256
t "tandem-benchmm without a device: exit 2" exits 2 "no CUDA device visible" bin/tandem-benchmm
t "tandem-sweep --write-defaults needs no device" bin/tandem-sweep --model-shapes qwen3-next-80b --kernel all --write-defaults --out "$tmp/sm_90"
t "and writes a table per kernel, headed 'none (defaults)'" sh -c "grep -q 'none (defaults)' '$tmp/sm_90/nvfp4-skinny.json' && \
    [ -f '$tmp/sm_90/nvfp4-skinny-wide.json' ] && [ -f '$tmp/sm_90/fp8.json' ] && [ -f '$tmp/sm_90/bf16.json' ]"
t "a second --write-defaults merges into the table" sh -c "bin/tandem-sweep --shape 100,1040 --kernel fp8 --write-defaults \
    --out '$tmp/sm_90' 2>/dev/null && grep -q '\"100,1040\"' '$tmp/sm_90/fp8.json' && grep -q '\"12288,2048\"' '$tmp/sm_90/fp8.json'"
t "--note is appended to the table's sweep line" sh -c "bin/tandem-sweep --shape 64,2048 --kernel fp8 --write-defaults \
    --note 'why: a note' --out '$tmp/note' 2>/dev/null && grep -q '\"sweep\": \"none (defaults); why: a note\"' '$tmp/note/fp8.json'"
t "tandem-sweep --note past 600 characters: exit 2 naming --note" exits 2 "--note" bin/tandem-sweep --shape 64,256 \
    --write-defaults --out "$tmp/note" --note "$(printf '%0601d' 0)"
t "tandem-sweep --plan --note: exit 2, --plan writes no table" exits 2 "writes no table" bin/tandem-sweep --plan --shape 64,256 --note x
fx=${TANDEM_FIXTURES:-../shared/fixtures}/qwen35-tiny/nvfp4
if [ -f "$fx/config.json" ]; then
    t "tandem-sweep -m DIR takes a checkpoint's projection shapes" sh -c "bin/tandem-sweep -m '$fx' --kernel nvfp4-skinny \
        --write-defaults --out '$tmp/m' 2>/dev/null && grep -q '\"768,256\"' '$tmp/m/nvfp4-skinny.json' && \
        grep -q '\"256,512\"' '$tmp/m/nvfp4-skinny.json' && [ \$(grep -c '\"kchains\"' '$tmp/m/nvfp4-skinny.json') -eq 9 ]"
else
    n=$((n + 1)); echo "ok $n # SKIP no fixture at $fx"
fi
t "tandem-sweep -m a missing directory: exit 2 naming it" exits 2 "/nonexistent" bin/tandem-sweep -m /nonexistent --write-defaults
echo "1..$n"
[ "$failed" -eq 0 ]
