#!/bin/sh
# The model maker's variants load and run, and storage choices that must not change the model
# (shards, fused experts) give the same tokens; a chunked prefill gives the same tokens as one chunk;
# the number of threads making the rows does not change a byte.
# The CPU tests pin the reference backend (auto takes the GPU where one is visible).
TANDEM_BACKEND=cpu; export TANDEM_BACKEND
MK=build/san/bin/tandem-mkmodel
RUN=build/san/bin/tandem-run
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
printf '5 17 99 3 250 7 1000 42 8 9 10 11\n' >"$tmp/p.tok"
n=0
run() { $RUN -m "$1" -p "$tmp/p.tok" -n 6 2>"$tmp/err"; }
check() { # name, mkmodel args...
    name=$1; shift
    n=$((n + 1))
    if $MK -o "$tmp/$name" "$@" 2>"$tmp/err" && run "$tmp/$name" >"$tmp/$name.tok" && [ "$(wc -l <"$tmp/$name.tok")" -eq 6 ]; then
        echo "ok $n - $name: made, loaded, 6 tokens"
    else
        echo "not ok $n - $name"; sed 's/^/# /' "$tmp/err"
    fi
}
check dense-bf16
check dense-fp8 --format fp8
check dense-nvfp4 --format nvfp4
check next-bf16 --layout qwen3_next
check next-fp8-bf16scales --layout qwen3_next --format fp8 --fp8-scales bf16
check next-nvfp4 --layout qwen3_next --format nvfp4
check moe35-nvfp4 --layout qwen3_5_moe --format nvfp4
check sharded --shard-mb 2
check fused --layout qwen3_next --fused-experts
check perexpert --layout qwen3_next
check tied --tie
check types --layer-types GAGGA --q-heads 8 --kv-heads 2 --gdn-key-heads 4 --gdn-value-heads 8
check mlponly --layout qwen3_next --mlp-only-layers 0,2 --no-norm-topk --experts 6 --top-k 3
check oddk --hidden 200 --intermediate 328 --format fp8
check pow2 --format nvfp4 --pow2-scales
n=$((n + 1))
if [ -f "$tmp/sharded/model.safetensors.index.json" ] && cmp -s "$tmp/sharded.tok" "$tmp/dense-bf16.tok"; then
    echo "ok $n - a sharded checkpoint gives the same tokens as one file"
else echo "not ok $n - sharded differs"; fi
n=$((n + 1))
if cmp -s "$tmp/fused.tok" "$tmp/perexpert.tok"; then echo "ok $n - fused experts give the same tokens as per-expert tensors"
else echo "not ok $n - fused differs"; fi
n=$((n + 1))
if ! grep -q lm_head "$tmp/tied/model.safetensors" && grep -q '"tie_word_embeddings": true' "$tmp/tied/config.json"; then
    echo "ok $n - tied: no lm_head tensor, tie_word_embeddings true"
else echo "not ok $n - tied"; fi
n=$((n + 1))
a=$($RUN -m "$tmp/dense-bf16" -p "$tmp/p.tok" -n 6 2>/dev/null | tr '\n' ' ')
b=$(TANDEM_PREFILL_CHUNK=5 $RUN -m "$tmp/dense-bf16" -p "$tmp/p.tok" -n 6 2>/dev/null | tr '\n' ' ')
if [ "$a" = "$b" ]; then echo "ok $n - prefill in chunks of 5 gives the same tokens"; else echo "not ok $n - chunked prefill: '$a' vs '$b'"; fi
n=$((n + 1))
if $MK -o "$tmp/x" --shape qwen3.8-27b --layout qwen3_next >/dev/null 2>&1; then echo "not ok $n - layout mismatch accepted"
else echo "ok $n - a real shape with the wrong layout is refused"; fi
for f in bf16 fp8 nvfp4; do
    n=$((n + 1))
    # more rows than one parallel round (2048) and an FP8 block cut short (b, a: 6 rows)
    if $MK -o "$tmp/t1-$f" --format $f --vocab 4200 --threads 1 2>"$tmp/err" &&
       $MK -o "$tmp/t3-$f" --format $f --vocab 4200 --threads 3 2>>"$tmp/err" &&
       cmp -s "$tmp/t1-$f/model.safetensors" "$tmp/t3-$f/model.safetensors"; then
        echo "ok $n - $f: --threads 1 and --threads 3 write the same bytes"
    else echo "not ok $n - $f: the bytes depend on --threads"; sed 's/^/# /' "$tmp/err"; fi
done
echo "1..$n"
