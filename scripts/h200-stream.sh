#!/usr/bin/env bash
# Streamed experts on an NVIDIA H200, through Vulkan (the setup is
# scripts/h200-bench.sh's: .bin/ and .gl/ carried): the synthetic Gemma 4
# 26B-A4B resident and through SLOTS expert slots a layer (default
# 16,32,64,128), in WEIGHTS (q4 by default; bf16 for bfloat16 weights),
# a PROMPT-token prompt (16: a prefill past the slots runs in waves) and
# DECODE decoded tokens (32), decode passes optimistic as OPTIMISM says
# (never, after-hit: the default, always), routed by the trace TRACE where
# set (`bench --make-trace` writes one). Writes
# stream-<weights>-<optimism>.json and stream-<optimism>.log into $OUT
# (./bench-out when OUT is unset).
set -uo pipefail

OUT=${OUT:-$PWD/bench-out}
mkdir -p "$OUT"
. "$(dirname "$0")/h200-env.sh"
require_bin
gpu_info "$OUT/gpu.txt"
weights=${WEIGHTS:-q4}
optimism=${OPTIMISM:-after-hit}
quant=()
[ "$weights" != bf16 ] && quant=(--quant "$weights")
trace=()
[ -n "${TRACE:-}" ] && trace=(--route-by-trace "$TRACE")
log="$OUT/stream-$optimism.log"
timeout "${STREAM_TIMEOUT:-480}" "$BIN" bench --backend wgpu "${quant[@]}" --synthetic gemma-4-26b-a4b \
    --stream-slots "${SLOTS:-16,32,64,128}" --prompt-tokens "${PROMPT:-16}" --decode-tokens "${DECODE:-32}" \
    --expert-optimism "$optimism" "${trace[@]}" \
    --json "$OUT/stream-$weights-$optimism.json" >"$log" 2>&1
echo "exit status $?" >>"$log"
