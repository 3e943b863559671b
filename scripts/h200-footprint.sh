#!/usr/bin/env bash
# Does the weights' footprint slow decode's kernels in the step? One binary's
# decode-step profile on cuts of the synthetic Gemma 4 26B-A4B of growing
# size, side by side: each kernel's GPU time a launch at each cut. The
# ea1d5e7 runs (2026-12-01) saw a two-layer cut (4.4 GiB) run its MoE
# launches about 10% above their lone times and the full model (47 GiB)
# 26-29% above, with different kernels in the two runs (docs/decisions.md);
# this runs the same kernels at every size.
#
#   on the x86-64 build host: build and strip the release CLI into
#   .bin/turbospark (as for scripts/h200-bench.sh); then on the H200
#   machine, with .gl/ and .bin/ copied into the repository root:
#     bash scripts/h200-footprint.sh [LAYERS...]      (default: 2 8 30)
#
# Writes $OUT/layers-N.json (the bench's JSON of each cut) and prints the
# table. A cut of N layers loads in about 2 N seconds.
set -uo pipefail

OUT=${OUT:-$PWD/footprint-out}
mkdir -p "$OUT"
. "$(dirname "$0")/h200-env.sh"
require_bin

layers=("$@")
[ ${#layers[@]} -eq 0 ] && layers=(2 8 30)
for n in "${layers[@]}"; do
    # (one short per-op case: the bench wants one; the end-to-end run is
    # what is read)
    timeout "${CUT_TIMEOUT:-240}" "$BIN" bench --backend wgpu --filter 'router m=1$' \
        --synthetic gemma-4-26b-a4b --layers "$n" --prompt-tokens 64 --decode-tokens 64 \
        --json "$OUT/layers-$n.json" >"$OUT/layers-$n.log" 2>&1
    echo "== $n layers (exit $?): $(grep -E '^end to end' "$OUT/layers-$n.log")"
done

python3 - "$OUT" "${layers[@]}" <<'EOF'
import json, sys
out, cuts = sys.argv[1], sys.argv[2:]
per = {}
for n in cuts:
    try:
        run = json.load(open(f"{out}/layers-{n}.json"))["end_to_end"]["runs"][0]
    except (OSError, KeyError, IndexError, ValueError) as e:
        print(f"{n} layers: no profile ({e})")
        continue
    for k in run.get("decode_step_profile", []):
        d = k["dispatches_per_step"]
        per.setdefault(k["kernel"], {})[n] = (k["us_per_step"] / d if d else 0.0, d)
print("us a launch in the decode step's profile (launches a step)")
print(f"{'kernel':>26} " + " ".join(f"{n + ' layers':>18}" for n in cuts))
for kernel, at in per.items():
    cells = []
    for n in cuts:
        us, d = at.get(n, (None, None))
        cells.append(f"{us:9.1f} ({d:5.0f})" if us is not None else f"{'-':>18}")
    print(f"{kernel:>26} " + " ".join(f"{c:>18}" for c in cells))
EOF
