#!/usr/bin/env bash
# Exact against fast precision on the H200 in one command (one machine
# start): the tensor-core parity and model tests at the default precision,
# then the bench's prefill at both precisions on the full synthetic model
# and fast's fidelity on the transformers fixtures.
#
#   on the build host, in the repository root:
#     cargo build --release -p turbospark-cli
#     cargo test --release -p turbospark --no-run --test parity --test oracle --test precision
#     mkdir -p .bin/precision
#     cp target/release/turbospark .bin/precision/
#     cp target/release/deps/parity-HASH .bin/precision/parityx      # tests/parity.rs
#     cp target/release/deps/oracle-HASH .bin/precision/oraclex      # tests/oracle.rs
#     cp target/release/deps/precision-HASH .bin/precision/precisionx # tests/precision.rs
#     strip .bin/precision/*
#   then on the H200 machine, with .gl/ and .bin/precision/ in the repository root:
#     bash scripts/h200-precision.sh [BENCH_ARGS...]
#
# Writes $OUT/check.log (each test binary's results and failures),
# $OUT/check.tgz (their whole logs), and the bench's bench.json, bench.log,
# gpu.txt and clocks.csv. Each test binary gets at most TEST_TIMEOUT seconds
# (120), the bench BENCH_TIMEOUT (300): within a 10-minute command.
set -uo pipefail

OUT=${OUT:-$PWD/precision-out}
mkdir -p "$OUT"
D=.bin/precision
. "$(dirname "$0")/h200-env.sh"

# (the test binaries read the fixtures from this checkout, not the build host's)
export TURBOSPARK_ROOT=$PWD
bench_args=("$@")
status=0
logs=()
# the test binaries, tensor cores required (a device without them fails)
for spec in "parityx matmul moe_ tensor_core attention qkv_post gemm" "oraclex wgpu_" "precisionx wgpu_"; do
    set -- $spec
    name=$1
    shift
    [ -x "$D/$name" ] || { echo "== $name: not carried" >>"$OUT/check.log"; continue; }
    # (--nocapture: the tests' worst-NMSE lines reach the log)
    TURBOSPARK_TENSOR_CORES=1 timeout "${TEST_TIMEOUT:-120}" "$D/$name" "$@" --nocapture >"$OUT/$name.log" 2>&1
    rc=$?
    [ $rc -ne 0 ] && status=1
    logs+=("$name.log")
    {
        echo "== $name $* (exit $rc)"
        grep -E "^test result|FAILED|panicked|NMSE|worst|fidelity" "$OUT/$name.log" | head -60
    } >>"$OUT/check.log"
done
(cd "$OUT" && tar czf check.tgz "${logs[@]}" && rm -f "${logs[@]}")

{
    date -u +%Y-%m-%dT%H:%M:%SZ
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,power.limit --format=csv
    echo "VK_DRIVER_FILES=$VK_DRIVER_FILES"
    nproc
    uname -a
} >"$OUT/gpu.txt" 2>&1
clock_log "$OUT/clocks.csv"
smi=$!
# (--filter matches no per-op case: the ceiling, the fixtures and the end to end)
timeout "${BENCH_TIMEOUT:-300}" "$D/turbospark" bench --backend wgpu --filter 'no per-op case$' \
    --fidelity tests/fixtures/wide-text,tests/fixtures/tiny-text,tests/fixtures/tiny-multimodal \
    --synthetic gemma-4-26b-a4b --prompt-tokens 512 --decode-tokens 8 --ablation-pairs 0 \
    --json "$OUT/bench.json" "${bench_args[@]}" >"$OUT/bench.log" 2>&1
rc=$?
kill $smi 2>/dev/null
echo "== bench (exit $rc)" >>"$OUT/check.log"
grep -E "fidelity|end to end|precision" "$OUT/bench.log" >>"$OUT/check.log"
[ $rc -ne 0 ] && status=1
exit $status
