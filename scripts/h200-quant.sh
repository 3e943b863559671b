#!/usr/bin/env bash
# Quantized against bf16 weights on an NVIDIA H200, through Vulkan (the
# setup is scripts/h200-bench.sh's: .bin/ and .gl/ carried).
#   bash scripts/h200-quant.sh ops        the decode and micro-batch per-op
#                                         (or OPS_FILTER's)
#                                         cases, each in bf16 then q4g64
#                                         (ops.json, ops.log)
#   bash scripts/h200-quant.sh q4 q8 bf16 end to end on the synthetic Gemma 4
#                                         26B-A4B with those weights, a
#                                         512-token prompt and 64 decoded
#                                         tokens each (e2e-<w>.json, e2e.log)
# Writes into $OUT (./bench-out when OUT is unset); BENCH_ARGS go to every
# bench call.
set -uo pipefail

OUT=${OUT:-$PWD/bench-out}
mkdir -p "$OUT"
. "$(dirname "$0")/h200-env.sh"
require_bin
gpu_info "$OUT/gpu.txt"
read -r -a extra <<<"${BENCH_ARGS:-}"

for job in "$@"; do
    case "$job" in
    ops)
        timeout "${OPS_TIMEOUT:-240}" "$BIN" bench --backend wgpu --quant q4 --filter "${OPS_FILTER:-m=1,m=16}" \
            --json "$OUT/ops.json" "${extra[@]}" >"$OUT/ops.log" 2>&1
        echo "ops exit status $?" >>"$OUT/ops.log"
        ;;
    q4 | q8 | bf16)
        quant=()
        [ "$job" != bf16 ] && quant=(--quant "$job")
        # (a filter that selects no per-op case: the end-to-end run alone)
        timeout "${E2E_TIMEOUT:-280}" "$BIN" bench --backend wgpu "${quant[@]}" --filter "no such case" \
            --synthetic gemma-4-26b-a4b --json "$OUT/e2e-$job.json" "${extra[@]}" >>"$OUT/e2e.log" 2>&1
        echo "$job exit status $?" >>"$OUT/e2e.log"
        ;;
    *)
        echo "unknown job $job (ops, q4, q8, bf16)" >&2
        exit 2
        ;;
    esac
done
