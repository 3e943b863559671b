#!/usr/bin/env bash
# `turbospark bench` on an NVIDIA H200, through Vulkan.
#
# The H200 machine has no cargo and no Vulkan loader, so both travel:
#   on an x86-64 build host, in the repository root:
#     cargo build --release -p turbospark-cli
#     mkdir -p .bin && cp "${CARGO_TARGET_DIR:-target}/release/turbospark" .bin/ && strip .bin/turbospark
#     # .gl/ holds the amd64 Vulkan loader .deb packages (libvulkan1 libegl1
#     # libglvnd0 libopengl0 libgl1 libglx0 libgles2), e.g. from
#     # `apt-get download` on Debian / Ubuntu
#   then on the H200 machine, with .gl/ and .bin/ copied into the repository root:
#     bash scripts/h200-bench.sh            (extra arguments go to `bench`)
#
# The runs so far went through a runner that returns at most 8 files from
# $OUT: this script writes 5; leave room for the peer's peer.json (more
# logs in $OUT crowd it out).
#
# Writes into $OUT (./bench-out when OUT is unset):
#   bench.json  every figure and the machine's description (rewritten after
#               each case, so a run cut short keeps what it measured)
#   bench.svg   achieved GB/s per op against the measured ceiling
#   bench.log   the table (stdout) and progress (stderr)
#   gpu.txt     nvidia-smi's view of the GPU, driver, clocks and the loader used
#   clocks.csv  SM / memory clock, utilisation and power every 200 ms
set -uo pipefail

OUT=${OUT:-$PWD/bench-out}
mkdir -p "$OUT"
. "$(dirname "$0")/h200-env.sh"
require_bin

{
    date -u +%Y-%m-%dT%H:%M:%SZ
    nvidia-smi
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,power.limit,pcie.link.gen.max --format=csv
    echo "VK_DRIVER_FILES=$VK_DRIVER_FILES"
    ldconfig -p | grep -E 'libvulkan|libEGL' || true
    nproc
    uname -a
} >"$OUT/gpu.txt" 2>&1

# Clocks while the bench runs (clocks.csv).
clock_log "$OUT/clocks.csv"
smi=$!

# (With --synthetic gemma-4-26b-a4b it took 220 s on 2026-12-01 at ff0b6d1,
# before the ablation's three pairs a kernel and the second stream kernel at
# op sizes were added: give BENCH_TIMEOUT room.) The whole bench takes a few
# minutes at the real shapes (inputs of up to 1.5 GB are generated on the
# host); the default limit, 540 s, stays inside a 10-minute command limit.
timeout "${BENCH_TIMEOUT:-540}" "$BIN" bench --backend wgpu \
    --json "$OUT/bench.json" --plot "$OUT/bench.svg" "$@" \
    2>&1 | tee "$OUT/bench.log"
rc=${PIPESTATUS[0]}
kill "$smi" 2>/dev/null
echo "bench exit status $rc" | tee -a "$OUT/bench.log"
exit "$rc"
