#!/usr/bin/env bash
# one sitting, part 2: llama.cpp's Q4_0 (CUDA), then the batched streams and
# bf16, and the batched streams with the small-batch GEMM from $FROM_M rows
set -u
T0=$SECONDS
O=$OUT
log() { echo "[$((SECONDS - T0)) s] $*" | tee -a "$O/steps.log"; }
ONLY_Q4=1 BENCH_ARGS="-p 512 -n 128 -ngl 99 -fa 1 -r 5" timeout 380 bash .peerz/llamacpp_cuda_bench.sh go 380 >"$O/llama.log" 2>&1
log "llama: $(grep -E 'q4_0|Q4_0' "$O/llama.log" | tail -4 | tr '\n' '|')"
mkdir -p "$O/main"
TURBOSPARK_BIN=.bin/turbospark OUT=$O/main E2E_TIMEOUT=110 BENCH_ARGS="--ablation-pairs 0" bash scripts/h200-quant.sh bf16
log "bf16: $(grep -E 'end to end: gemma|exit status' "$O/main/e2e.log" | tail -2 | cut -c1-330 | tr '\n' '|')"
model=(--backend wgpu --quant q4 --synthetic gemma-4-26b-a4b)
export TURBOSPARK_GEMM_FROM_M=${FROM_M:-17}
timeout $((585 - (SECONDS - T0))) .bin/turbospark bench "${model[@]}" --parallel 1,4,16 \
    --prompt-tokens 128 --decode-tokens 32 --json "$O/parallel-q4.json" >"$O/parallel-q4.log" 2>&1
log "parallel (from m $TURBOSPARK_GEMM_FROM_M): exit $?; $(grep -i 'streams:' "$O/parallel-q4.log" | tail -3 | tr '\n' '|')"
cd "$O" && tar czf sit-b.tgz llama.log main parallel-q4.* 2>/dev/null; ls -la "$O"
