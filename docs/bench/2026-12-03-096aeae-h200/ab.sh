#!/usr/bin/env bash
# usage: ab.sh "filter" bins...   (per-op A/B, q4)
. scripts/h200-env.sh
gpu_info "$OUT/gpu.txt"
F=$1; shift
for b in "$@"; do
  timeout ${OPS_T:-100} .bin/turbospark-$b bench --backend wgpu --quant q4 --filter "$F" --gpu-seconds ${GS:-0.25} --json $OUT/ops-$b.json > $OUT/ops-$b.log 2>&1
  echo "$b exit $?" >> $OUT/ops-$b.log
  grep -E "^\S*bench: \[|wgpu " $OUT/ops-$b.log | paste - - | sed 's/bench: //g'
done
