#!/usr/bin/env bash
# one sitting: speculative q4 (settled proposals, expected speed-ups),
# streamed experts on a trace with the full-layer prefill, speculative bf16
set -u
T0=$SECONDS
O=$OUT
log() { echo "[$((SECONDS - T0)) s] $*" | tee -a "$O/steps.log"; }
. scripts/h200-env.sh
require_bin
gpu_info "$O/gpu.txt"
timeout 200 "$BIN" bench --backend wgpu --quant q4 --synthetic gemma-4-26b-a4b --speculative \
    --prompt-tokens 128 --decode-tokens 48 --json "$O/spec-q4.json" >"$O/spec-q4.log" 2>&1
log "spec q4: exit $?; $(grep -E '^(first|verify 5|plain|forced rate 0.7|a draft|acceptance 0.7)' "$O/spec-q4.log" | cut -c1-230 | tr '\n' '|')"
"$BIN" bench --make-trace "$O/trace.txt" --synthetic gemma-4-26b-a4b --trace-skew 1 \
    --trace-reuse 0.45 >"$O/trace.log" 2>&1
timeout 200 "$BIN" bench --backend wgpu --quant q4 --synthetic gemma-4-26b-a4b --stream-slots 16 --prompt-tokens 512 \
    --decode-tokens 32 --route-by-trace "$O/trace.txt" --json "$O/stream-trace.json" >"$O/stream-trace.log" 2>&1
log "stream trace: exit $?; $(grep -E 'slots:|prefill of' "$O/stream-trace.log" | cut -c1-260 | tr '\n' '|')"
rm -f "$O/trace.txt"
left=$((${BUDGET:-585} - (SECONDS - T0)))
timeout $((left > 230 ? 230 : left)) "$BIN" bench --backend wgpu --synthetic gemma-4-26b-a4b --speculative \
    --prompt-tokens 128 --decode-tokens 48 --json "$O/spec-bf16.json" >"$O/spec-bf16.log" 2>&1
log "spec bf16: exit $?; $(grep -E '^(first|verify 5|plain|forced rate 0.7|a draft|acceptance 0.7)' "$O/spec-bf16.log" | cut -c1-230 | tr '\n' '|')"
cd "$O" && tar czf sit-f.tgz --exclude=steps.log --exclude=sit-f.tgz * && ls | grep -v -e sit-f.tgz -e steps.log | xargs rm -f
