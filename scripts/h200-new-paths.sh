#!/usr/bin/env bash
# The paths without a device figure yet, in one call of at most 10 minutes
# on an NVIDIA H200 through Vulkan (the setup is scripts/h200-bench.sh's:
# .bin/ with the release CLI, and .bin/parityx for the split, and .gl/
# carried), each step logged with its seconds into $OUT/steps.log:
#   1. the exact split of MLX affine weights on the tensor cores
#      (TURBOSPARK_AFFINE_SPLIT=1): the quantized matmul and MoE parity
#      families at full size, tensor cores required;
#   2. bench --speculative, q4g64 (verification of k + 1 = 2..5 tokens
#      against a decode step, forced acceptance 0.5 / 0.7 / 0.9);
#   3. bench --parallel 1,4,16, q4g64 (aggregate decode of batched streams,
#      each step run ahead, and the same steps not run ahead);
#   4. streamed experts, q4g64: 16 and 128 slots on a generated trace
#      (skew 1, reuse 0.45: about 70% LFU hits at 16 slots) and, without a
#      trace, 128 slots (every expert hits) against resident; PROMPT=512
#      in the environment makes their prompts 512 tokens (prefill through
#      the slots beside resident prefill);
#   5. bench --serve, q4g64: one stream through generate's path and through
#      the server on the same loaded model;
#   6. stream-prefill: a 512-token prompt through 16 slots on the generated
#      trace, through the full-layer stacks (the default) and in token
#      waves, with the copy ceilings (one write, the slot path);
#   and, named in STEPS only, stream-store: 16 slots on the generated trace
#   with misses copied from a host store (--expert-store host) and from the
#   mapping; spec-bf16: bench --speculative with bf16 weights;
#   f32units: q4 and bf16 end to end on the f32 units (TURBOSPARK_TENSOR_CORES=0),
#   the path an Apple GPU without matrix units takes; small: the dense
#   projections and LM head at 4, 8 and 16 rows through the streaming GEMVs
#   (TURBOSPARK_GEMM_FROM_M=17) and through the small-batch GEMM (=2).
# STEPS picks some of them (default "split spec parallel stream serve
# stream-prefill").
set -uo pipefail

OUT=${OUT:-$PWD/bench-out}
mkdir -p "$OUT"
. "$(dirname "$0")/h200-env.sh"
require_bin
gpu_info "$OUT/gpu.txt"
t0=$SECONDS
step() { echo "[$((SECONDS - t0)) s] $*" | tee -a "$OUT/steps.log"; }
model=(--backend wgpu --quant q4 --synthetic gemma-4-26b-a4b)
# The generated trace the streamed steps route by (skew 1, reuse 0.45: about
# 70% LFU hits at 16 slots), into $OUT/trace.txt.
make_trace() {
    "$BIN" bench --make-trace "$OUT/trace.txt" --synthetic gemma-4-26b-a4b --trace-skew 1 \
        --trace-reuse 0.45 >"$OUT/trace.log" 2>&1
}

for s in ${STEPS:-split spec parallel stream serve stream-prefill}; do
    case "$s" in
    split)
        for f in matmul_quantized moe_gate_up_quantized moe_down_quantized; do
            TURBOSPARK_TENSOR_CORES=1 TURBOSPARK_AFFINE_SPLIT=1 timeout 40 .bin/parityx "$f" --full \
                >"$OUT/split-$f.log" 2>&1
            step "split $f: exit $?, $(grep -c '^ok' "$OUT/split-$f.log") ok, $(grep -ci '^fail' "$OUT/split-$f.log") failed"
        done
        ;;
    spec)
        timeout 170 "$BIN" bench "${model[@]}" --speculative --prompt-tokens 128 --decode-tokens 48 \
            --json "$OUT/spec-q4.json" >"$OUT/spec-q4.log" 2>&1
        step "speculative: exit $?; $(grep -E '^(verify|first|plain|forced|a draft|acceptance 0.7)' "$OUT/spec-q4.log" | tr '\n' '|')"
        ;;
    spec-bf16)
        timeout 200 "$BIN" bench --backend wgpu --synthetic gemma-4-26b-a4b --speculative \
            --prompt-tokens 128 --decode-tokens 48 --json "$OUT/spec-bf16.json" >"$OUT/spec-bf16.log" 2>&1
        step "speculative bf16: exit $?; $(grep -E '^(verify|first|plain|forced|a draft|acceptance 0.7)' "$OUT/spec-bf16.log" | tr '\n' '|')"
        ;;
    parallel)
        timeout 150 "$BIN" bench "${model[@]}" --parallel 1,4,16 \
            --prompt-tokens 128 --decode-tokens 32 --json "$OUT/parallel-q4.json" >"$OUT/parallel-q4.log" 2>&1
        step "parallel: exit $?; $(grep -i 'stream' "$OUT/parallel-q4.log" | tail -4 | tr '\n' '|')"
        ;;
    stream)
        make_trace
        TRACE=$OUT/trace.txt SLOTS=16,128 STREAM_TIMEOUT=150 bash "$(dirname "$0")/h200-stream.sh" >/dev/null 2>&1
        mv "$OUT/stream-after-hit.log" "$OUT/stream-trace.log"
        mv "$OUT/stream-q4-after-hit.json" "$OUT/stream-q4-trace.json"
        SLOTS=128 STREAM_TIMEOUT=120 bash "$(dirname "$0")/h200-stream.sh" >/dev/null 2>&1
        step "stream: $(grep -hE 'slots|resident' "$OUT/stream-trace.log" "$OUT/stream-after-hit.log" | tail -6 | tr '\n' '|')"
        ;;
    stream-prefill)
        make_trace
        for p in full-layer token-waves; do
            timeout 150 "$BIN" bench "${model[@]}" --stream-slots 16 --prompt-tokens 512 --decode-tokens 32 \
                --route-by-trace "$OUT/trace.txt" --stream-prefill "$p" \
                --json "$OUT/stream-prefill-$p.json" >"$OUT/stream-prefill-$p.log" 2>&1
            step "stream prefill $p: exit $?; $(grep -E 'host to device|slots:|prefill of' "$OUT/stream-prefill-$p.log" | cut -c1-300 | tr '\n' '|')"
        done
        rm -f "$OUT/trace.txt"
        ;;
    stream-store)
        make_trace
        for st in host mapping; do
            timeout 180 "$BIN" bench "${model[@]}" --stream-slots 16 --prompt-tokens 512 --decode-tokens 32 \
                --route-by-trace "$OUT/trace.txt" --expert-store "$st" \
                --json "$OUT/stream-store-$st.json" >"$OUT/stream-store-$st.log" 2>&1
            step "stream store $st: exit $?; $(grep -E 'host to device|slots:|prefill of' "$OUT/stream-store-$st.log" | cut -c1-300 | tr '\n' '|')"
        done
        rm -f "$OUT/trace.txt"
        ;;
    serve)
        timeout 150 "$BIN" bench "${model[@]}" --serve --prompt-tokens 128 --decode-tokens 64 \
            --json "$OUT/serve-q4.json" >"$OUT/serve-q4.log" 2>&1
        step "serve: exit $?; $(grep -E '^(generate|serve):' "$OUT/serve-q4.log" | tr '\n' '|')"
        ;;
    f32units)
        for w in q4 bf16; do
            quant=()
            [ "$w" != bf16 ] && quant=(--quant "$w")
            TURBOSPARK_TENSOR_CORES=0 timeout 120 "$BIN" bench --backend wgpu "${quant[@]}" \
                --filter "no such case" --synthetic gemma-4-26b-a4b --decode-tokens 16 --ablation-pairs 0 \
                --json "$OUT/f32units-$w.json" >"$OUT/f32units-$w.log" 2>&1
            step "f32 units $w: exit $?; $(grep -E '^end to end' "$OUT/f32units-$w.log" | cut -c1-200)"
        done
        ;;
    small)
        f=""
        for m in 4 8 16; do
            f="$f,q|k|v sliding m=$m q4g64\$,o_proj full m=$m q4g64\$,dense down m=$m q4g64\$,lm_head m=$m q4g64\$,lm_head m=$m\$"
        done
        for from in 17 2; do
            TURBOSPARK_GEMM_FROM_M=$from timeout 150 "$BIN" bench --backend wgpu --quant q4 --filter "${f#,}" \
                --gpu-seconds 0.2 --json "$OUT/small-from-$from.json" >"$OUT/small-from-$from.log" 2>&1
            step "small batches, the GEMM from $from rows: exit $?"
        done
        ;;
    *)
        echo "unknown step $s (split, spec, spec-bf16, parallel, stream, serve, stream-prefill, stream-store, f32units, small)" >&2
        exit 2
        ;;
    esac
done

# (a call brings back at most eight files: every log and JSON in one archive,
# the step log beside it)
cd "$OUT" && tar czf paths.tgz --exclude=paths.tgz --exclude=steps.log --exclude=trace.txt \
    $(ls | grep -v -e '^paths.tgz$' -e '^steps.log$' -e '^trace.txt$') && \
    ls | grep -v -e '^paths.tgz$' -e '^steps.log$' | xargs rm -f
