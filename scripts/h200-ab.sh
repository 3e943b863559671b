#!/usr/bin/env bash
# A/B of release binaries on the H200: each binary's `bench` run with
# the same arguments, interleaved over rounds (A B A B ...), so that clock
# and thermal drift fall on both sides alike.
#
#   bash scripts/h200-ab.sh [--rounds N] BIN... -- BENCH_ARGS...
#
# BIN: names of binaries in .bin/ (built on the x86-64 build host from the
# commits compared, stripped, carried with .gl/ as for h200-bench.sh). Every
# run's JSON and log, and the clocks, go into one archive, $OUT/ab.tgz (the
# runner the H200 runs went through returns only a few files); the summary printed at the end has each
# case's median, the end-to-end line and the decode-step profile of every
# run. With --synthetic, compare the decode-step profiles (GPU time per
# kernel): the wall-clock tok/s of short runs has moved by tens of percent
# between identical binaries (docs/decisions.md; docs/bench/2026-12-01-ff0b6d1-h200 run 03).
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

clock_log "$work/ab/clocks.csv"
smi=$!

# Written for a 10-minute command limit that returns only what is in $OUT:
# the archive is rewritten after every run, and no run starts past
# AB_DEADLINE seconds (each also ends at AB_TIMEOUT).
summary="$work/ab/summary.txt"
deadline=$((SECONDS + ${AB_DEADLINE:-540}))
for r in $(seq 1 "$rounds"); do
    for b in "${bins[@]}"; do
        tag="r$r-$b"
        left=$((deadline - SECONDS))
        if [ $left -le 10 ]; then
            echo "== round $r $b: not run, past AB_DEADLINE" >>"$summary"
            continue
        fi
        [ $left -gt "${AB_TIMEOUT:-300}" ] && left=${AB_TIMEOUT:-300}
        timeout "$left" ".bin/$b" bench --backend wgpu --json "$work/ab/$tag.json" "$@" \
            >"$work/ab/$tag.log" 2>&1
        rc=$?
        {
            echo "== round $r $b (exit $rc)"
            grep -E "^[a-z].* wgpu +[0-9.]+ [mun]?s|^end to end|decode step profile" "$work/ab/$tag.log" |
                cut -c1-160
        } >>"$summary"
        cp "$summary" "$OUT/ab-summary-partial.txt"
        tar czf "$OUT/ab.tgz" -C "$work" ab
    done
done
kill "$smi" 2>/dev/null
tar czf "$OUT/ab.tgz" -C "$work" ab
rm -f "$OUT/ab-summary-partial.txt"
cat "$summary"
