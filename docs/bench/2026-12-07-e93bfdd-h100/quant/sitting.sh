#!/usr/bin/env bash
# (.peerz/: llama.cpp 0c1e57098 trimmed and the script that builds it with CUDA, writes a Q4_0 GGUF of the
# synthetic 26B-A4B and runs llama-bench; carried with .bin/ and .gl/, not part of the tree)
# one sitting: q4 e2e, llama.cpp Q4_0, q8 e2e, bf16 e2e
set -u
T0=$SECONDS
export TURBOSPARK_BIN=.bin/turbospark
log() { echo "[$((SECONDS - T0)) s] $*" | tee -a "$OUT/steps.log"; }
E2E_TIMEOUT=110 bash scripts/h200-quant.sh q4
log "q4: $(grep -E 'end to end' "$OUT/e2e.log" | tail -1 | cut -c1-400)"
ONLY_Q4=1 BENCH_ARGS="-p 512 -n 128 -ngl 99 -fa 1 -r 5" bash .peerz/llamacpp_cuda_bench.sh go 380 > "$OUT/llama.log" 2>&1
log "llama: $(grep -E 'q4_0|Q4_0' "$OUT/llama.log" | tail -4 | tr '\n' '|')"
E2E_TIMEOUT=100 bash scripts/h200-quant.sh q8
log "q8: $(grep -E 'end to end' "$OUT/e2e.log" | tail -1 | cut -c1-400)"
E2E_TIMEOUT=$((590 - (SECONDS - T0))) bash scripts/h200-quant.sh bf16
log "bf16: $(grep -E 'end to end' "$OUT/e2e.log" | tail -1 | cut -c1-400)"
