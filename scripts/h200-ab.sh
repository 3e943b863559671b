#!/usr/bin/env bash
# A/B of release binaries on the lent H200: each binary's `bench` run with
# the same arguments, interleaved over rounds (A B A B ...), so that clock
# and thermal drift fall on both sides alike.
#
#   bash scripts/h200-ab.sh [--rounds N] BIN... -- BENCH_ARGS...
#
# BIN: names of binaries in .bin/ (built here from the commits compared,
# stripped, carried with .gl/ as for h200-bench.sh). Every run's JSON and
# log, and the clocks, go into one archive, $OUT/ab.tgz (the device tool
# brings back only a few files); the summary printed at the end has each
# case's median, the end-to-end line and the decode-step profile of every
# run. With --synthetic, compare the decode-step profiles (GPU time per
# kernel): the wall-clock tok/s of short runs has moved by tens of percent
# between identical binaries (docs/decisions.md, twelfth session).
#
# Example (two MoE kernels, per op and on a 6-layer cut):
#   bash scripts/h200-ab.sh --rounds 2 tsA tsB -- --filter 'moe_down m=1$,pair m=1$' \
#       --synthetic gemma-4-26b-a4b --layers 6 --prompt-tokens 128
set -uo pipefail

rounds=2
bins=()
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) rounds=$2; shift 2 ;;
        --) shift; break ;;
        *) bins+=("$1"); shift ;;
    esac
done
if [ ${#bins[@]} -eq 0 ]; then
    echo "usage: $0 [--rounds N] BIN... -- BENCH_ARGS..." >&2
    exit 2
fi
for b in "${bins[@]}"; do
    if [ ! -x ".bin/$b" ]; then
        echo "no binary .bin/$b" >&2
        exit 2
    fi
done

OUT=${OUT:-$PWD/bench-out}
work=$(mktemp -d)
mkdir -p "$OUT" "$work/ab"
. "$(dirname "$0")/h200-env.sh"

nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,utilization.gpu,power.draw,temperature.gpu \
    --format=csv -lms 200 >"$work/ab/clocks.csv" 2>/dev/null &
smi=$!

summary="$work/ab/summary.txt"
for r in $(seq 1 "$rounds"); do
    for b in "${bins[@]}"; do
        tag="r$r-$b"
        timeout "${AB_TIMEOUT:-300}" ".bin/$b" bench --backend wgpu --json "$work/ab/$tag.json" "$@" \
            >"$work/ab/$tag.log" 2>&1
        rc=$?
        {
            echo "== round $r $b (exit $rc)"
            grep -E "^[a-z].* wgpu +[0-9.]+ [mun]?s|^end to end|decode step profile" "$work/ab/$tag.log" |
                cut -c1-160
        } >>"$summary"
    done
done
kill "$smi" 2>/dev/null
tar czf "$OUT/ab.tgz" -C "$work" ab
cat "$summary"
