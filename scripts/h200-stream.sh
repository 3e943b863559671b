#!/usr/bin/env bash
# Streamed experts on an NVIDIA H200, through Vulkan (the setup is
# scripts/h200-bench.sh's: .bin/ and .gl/ carried): the synthetic Gemma 4
# 26B-A4B resident and through SLOTS expert slots a layer (default
# 16,32,64,128), in WEIGHTS (q4 by default; bf16 for bfloat16 weights),
# a PROMPT-token prompt (16: a prefill past the slots runs in waves) and
# DECODE decoded tokens (32). Writes stream-<weights>.json and stream.log
# into $OUT (./bench-out when OUT is unset).
set -uo pipefail

OUT=${OUT:-$PWD/bench-out}
mkdir -p "$OUT"
. "$(dirname "$0")/h200-env.sh"
require_bin
gpu_info "$OUT/gpu.txt"
weights=${WEIGHTS:-q4}
quant=()
[ "$weights" != bf16 ] && quant=(--quant "$weights")
timeout "${STREAM_TIMEOUT:-480}" "$BIN" bench --backend wgpu "${quant[@]}" --synthetic gemma-4-26b-a4b \
    --stream-slots "${SLOTS:-16,32,64,128}" --prompt-tokens "${PROMPT:-16}" --decode-tokens "${DECODE:-32}" \
    --json "$OUT/stream-$weights.json" >"$OUT/stream.log" 2>&1
echo "exit status $?" >>"$OUT/stream.log"
