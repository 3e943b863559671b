#!/usr/bin/env bash
# one sitting, part 1: q4 (main, base, main with the exact affine split), the
# small-batch GEMM per-op sweep, q8
set -u
T0=$SECONDS
O=$OUT
log() { echo "[$((SECONDS - T0)) s] $*" | tee -a "$O/steps.log"; }
run() { # name bin job timeout [env...]
    local name=$1 bin=$2 job=$3 to=$4; shift 4
    mkdir -p "$O/$name"
    env "$@" TURBOSPARK_BIN=$bin OUT=$O/$name E2E_TIMEOUT=$to bash scripts/h200-quant.sh "$job"
    log "$name $job: $(grep -E 'end to end: gemma|exit status' "$O/$name/e2e.log" | tail -2 | cut -c1-330 | tr '\n' '|')"
}
run main .bin/turbospark q4 100 BENCH_ARGS="--ablation-pairs 0"
run base .bin/turbospark-base q4 100 BENCH_ARGS="--ablation-pairs 0"
run split .bin/turbospark q4 100 TURBOSPARK_AFFINE_SPLIT=1 BENCH_ARGS="--ablation-pairs 0"
F='q|k|v sliding m=4 q4g64$,q|k|v sliding m=16 q4g64$,o_proj full m=4 q4g64$,o_proj full m=16 q4g64$,lm_head m=4 q4g64$,lm_head m=16 q4g64$,dense down m=16 q4g64$,lm_head m=4$,lm_head m=16$'
mkdir -p "$O/small"
i=0
for cfg in "X=0" "TURBOSPARK_GEMM_FROM_M=2" "TURBOSPARK_GEMM_FROM_M=2 TURBOSPARK_GEMM_TILES=4,2,8,8;" "TURBOSPARK_GEMM_FROM_M=2 TURBOSPARK_GEMM_TILES=4,1,8,8;"; do
    i=$((i + 1))
    for q in "--quant q4" ""; do
        env $cfg timeout 60 .bin/turbospark bench --backend wgpu $q --filter "$F" --gpu-seconds 0.2 \
            --json "$O/small/ops-$i${q:+-q4}.json" >>"$O/small/ops.log" 2>&1
        echo "cfg $i ($cfg) $q exit $?" >>"$O/small/ops.log"
    done
    log "small $i ($cfg): $(grep -E '^(q\||o_proj|lm_head|dense down)' "$O/small/ops.log" | tail -9 | awk '{print $1,$2,$3,$4,$5}' | tr '\n' '|')"
done
run main .bin/turbospark q8 $((585 - (SECONDS - T0))) BENCH_ARGS="--ablation-pairs 0"
cd "$O" && tar czf sit-a.tgz main base split small 2>/dev/null; ls -la "$O"
