#!/usr/bin/env bash
# one sitting, call 1: batched streams run ahead, speculative verify (q4),
# streamed experts on a generated trace with a 512-token prompt, serve
set -u
T0=$SECONDS
O=$OUT
log() { echo "[$((SECONDS - T0)) s] $*" | tee -a "$O/steps.log"; }
. scripts/h200-env.sh
require_bin
gpu_info "$O/gpu.txt"
nvidia-smi -q -d CLOCK > "$O/clocks.txt" 2>&1
M=(--backend wgpu --quant q4 --synthetic gemma-4-26b-a4b)
timeout 150 "$BIN" bench "${M[@]}" --parallel 1,4,16 --prompt-tokens 128 --decode-tokens 32 \
    --json "$O/parallel-q4.json" >"$O/parallel-q4.log" 2>&1
log "parallel: exit $?; $(grep -E 'stream' "$O/parallel-q4.log" | tail -4 | cut -c1-220 | tr '\n' '|')"
timeout 150 "$BIN" bench "${M[@]}" --speculative --prompt-tokens 128 --decode-tokens 48 \
    --json "$O/spec-q4.json" >"$O/spec-q4.log" 2>&1
log "spec q4: exit $?; $(grep -E '^(bench: )?(verify|plain|forced)' "$O/spec-q4.log" | cut -c1-200 | tr '\n' '|')"
F='q|k|v sliding m=4 q4g64$,o_proj full m=4 q4g64$,dense down m=4 q4g64$,lm_head m=4 q4g64$,q|k|v sliding m=8 q4g64$,o_proj full m=8 q4g64$,lm_head m=8 q4g64$,q|k|v sliding m=1 q4g64$'
for b in turbospark turbospark-prev; do
    timeout 60 .bin/$b bench --backend wgpu --quant q4 --filter "$F" --gpu-seconds 0.2 \
        --json "$O/small-$b.json" >"$O/small-$b.log" 2>&1
    log "small $b: exit $?; $(grep -E 'q4g64 +wgpu' "$O/small-$b.log" | awk '{print $1,$2,$3,$4,$6,$7}' | tr '\n' '|')"
done
"$BIN" bench --make-trace "$O/trace.txt" --synthetic gemma-4-26b-a4b --trace-skew 1 \
    --trace-reuse 0.45 >"$O/trace.log" 2>&1
left=$((575 - (SECONDS - T0)))
timeout $((left > 180 ? 180 : left)) "$BIN" bench "${M[@]}" --stream-slots 16 --prompt-tokens 512 \
    --decode-tokens 32 --route-by-trace "$O/trace.txt" --json "$O/stream-trace.json" >"$O/stream-trace.log" 2>&1
log "stream trace: exit $?; $(grep -E 'slots:|resident' "$O/stream-trace.log" | cut -c1-200 | tr '\n' '|')"
for w in q4 bf16; do
    left=$((588 - (SECONDS - T0)))
    [ $left -lt 60 ] && break
    quant=()
    [ "$w" != bf16 ] && quant=(--quant "$w")
    TURBOSPARK_TENSOR_CORES=0 timeout $left "$BIN" bench --backend wgpu "${quant[@]}" \
        --filter "no such case" --synthetic gemma-4-26b-a4b --decode-tokens 16 --ablation-pairs 0 \
        --json "$O/f32units-$w.json" >"$O/f32units-$w.log" 2>&1
    log "f32 units $w: exit $?; $(grep -E 'end to end: gemma' "$O/f32units-$w.log" | cut -c1-260)"
done
rm -f "$O/trace.txt"
cd "$O" && tar czf sit-c.tgz --exclude=steps.log --exclude=sit-c.tgz * && ls | grep -v -e sit-c.tgz -e steps.log | xargs rm -f
