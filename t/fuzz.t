#!/bin/sh
# A short libFuzzer smoke over the safetensors and token-file parsers (seeded with valid files).
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
SECONDS_EACH=${TANDEM_FUZZ_SECONDS:-10}
mkdir -p "$tmp/st" "$tmp/tok"
build/san/bin/tandem-mkmodel -o "$tmp/m" --hidden 32 --vocab 64 --intermediate 32 --layers 1 --layer-types A \
    --q-heads 2 --kv-heads 1 --head-dim 16 --rotary-dim 8 --no-mtp 2>/dev/null
head -c 4096 "$tmp/m/model.safetensors" >"$tmp/st/head"
printf '1 2 3 # c\n4\n' >"$tmp/tok/a"
n=0
for target in safetensors tokens; do
    n=$((n + 1))
    corpus=$tmp/st
    [ $target = tokens ] && corpus=$tmp/tok
    if [ ! -x build/fuzz/$target ]; then
        echo "not ok $n - fuzz $target: build/fuzz/$target missing (make fuzz)"
        continue
    fi
    if build/fuzz/$target -max_total_time="$SECONDS_EACH" -max_len=8192 -timeout=5 -print_final_stats=1 "$corpus" >"$tmp/log" 2>&1; then
        echo "ok $n - fuzz $target: ${SECONDS_EACH}s, $(grep -o 'stat::number_of_executed_units: [0-9]*' "$tmp/log" | grep -o '[0-9]*$' || echo '?') runs, no crash"
    else
        echo "not ok $n - fuzz $target: crash"
        tail -n 30 "$tmp/log" | sed 's/^/# /'
    fi
done
echo "1..$n"
