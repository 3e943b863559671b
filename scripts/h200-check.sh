#!/usr/bin/env bash
# Correctness on the H200's tensor cores: the test binaries built on the
# x86-64 build host run there with TURBOSPARK_TENSOR_CORES=1 (the paths
# lavapipe cannot run: the cooperative-matrix GEMMs and attention). Run it
# first whenever kernels changed since the last H200 run: a kernel validated
# by naga alone has read NaN there (2026-12-01, docs/bench/2026-12-01-f16691c-h200).
#
#   on the build host, in the repository root:
#     cargo build --release -p turbospark --example parity
#     mkdir -p .bin && cp target/release/examples/parity .bin/parityx     # examples/parity.rs
#     cargo test --release -p turbospark --no-run   # note the tests/ binaries' paths
#     cp target/release/deps/decoder-HASH .bin/decoderx                   # tests/decoder.rs
#     cp target/release/deps/oracle-HASH .bin/oraclex                     # tests/oracle.rs
#     cp target/release/deps/expert_streaming-HASH .bin/streamingx        # tests/expert_streaming.rs
#     cp target/release/deps/batched_decode-HASH .bin/batchedx            # tests/batched_decode.rs
#     cp target/release/deps/drafter-HASH .bin/drafterx                   # tests/drafter.rs
#     strip .bin/*x
#   then on the H200 machine, with .gl/ and .bin/ copied into the repository root:
#     bash scripts/h200-check.sh [PARITY_FILTER]
#
# Runs whichever of these binaries .bin/ holds: the parity suite with
# its full-size cases (the example's `--full`; PARITY_FILTER narrows it,
# e.g. attention), then the decoder and oracle tests, streamed experts
# against resident (the full-layer stacks and token waves), batched decode
# against each sequence alone, and the drafter. Writes $OUT/check.log (each binary's
# FAIL lines and results) and $OUT/check-NAME.log (its whole output);
# exits non-zero if any failed.
set -uo pipefail

OUT=${OUT:-$PWD/check-out}
mkdir -p "$OUT"
. "$(dirname "$0")/h200-env.sh"
export TURBOSPARK_TENSOR_CORES=1

status=0
ran=0
# Written for a 10-minute command limit: each binary gets at most
# CHECK_TIMEOUT seconds and what is left of CHECK_DEADLINE, so a hang is
# logged (below) before the limit would kill the script.
deadline=$((SECONDS + ${CHECK_DEADLINE:-540}))
for name in parityx decoderx oraclex streamingx batchedx drafterx; do
    bin=.bin/$name
    [ -x "$bin" ] || continue
    ran=$((ran + 1))
    limit=$((deadline - SECONDS))
    [ $limit -gt "${CHECK_TIMEOUT:-300}" ] && limit=${CHECK_TIMEOUT:-300}
    args=()
    if [ "$name" = parityx ]; then
        args=(${1:+"$1"} --full)
    fi
    # (in the background and watched, so that a hang leaves each thread's
    # kernel wait channel in the log: run 01 of 2026-12-01 at a94f43a
    # saw the oracle binary hang once and not again)
    "$bin" "${args[@]}" >"$OUT/check-$name.log" 2>&1 &
    pid=$!
    waited=0
    while kill -0 $pid 2>/dev/null && [ $waited -lt $limit ]; do
        sleep 1
        waited=$((waited + 1))
    done
    if kill -0 $pid 2>/dev/null; then
        {
            echo "== $name still running after ${waited} s: its threads (name, wait channel, state)"
            for t in /proc/$pid/task/*; do
                echo "$(cat "$t/comm") $(cat "$t/wchan") $(cut -d' ' -f3 "$t/stat")"
            done
            nvidia-smi --query-gpu=utilization.gpu,clocks.sm,power.draw --format=csv
        } >>"$OUT/check-$name.log" 2>&1
        kill -9 $pid
    fi
    wait $pid
    rc=$?
    [ $rc -ne 0 ] && status=1
    {
        echo "== $name (exit $rc)"
        grep -E "^FAIL|^test result|panicked|passed|failed|still running" "$OUT/check-$name.log" | cut -c1-300
    } | tee -a "$OUT/check.log"
done
if [ $ran -eq 0 ]; then
    echo "no test binaries in .bin/ (parityx, decoderx, oraclex): see the header" >&2
    exit 2
fi
exit $status
