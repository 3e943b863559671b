#!/usr/bin/env bash
# A session's full device run in one call of the device tool (one machine
# start, not three): the correctness check, the full bench, then the peer.
#
#   here: build and strip the release CLI, the parity example and the
#   decoder / oracle test binaries into .bin/ as scripts/h200-check.sh and
#   scripts/h200-bench.sh say; then the device tool's `run`, with carry
#   [".gl", ".bin"] and, for the full-size model,
#     bash scripts/h200-session.sh --synthetic gemma-4-26b-a4b --prompt-tokens 512 --decode-tokens 64
#   (arguments go to `bench`).
#
# The device tool stops a command at 10 minutes and brings back at most 8
# files: the check's logs go into one archive ($OUT/check.tgz), the bench
# writes its 5, the peer peer.json and peer.txt. The check gets
# CHECK_DEADLINE seconds (170), the bench BENCH_TIMEOUT (300), the peer
# PEER_TIMEOUT (80); the bench still runs if the check fails (its summary
# says so first), and the exit status is the check's, else the bench's.
set -uo pipefail

OUT=${OUT:-$PWD/session-out}
mkdir -p "$OUT"
here=$(dirname "$0")
chk=$(mktemp -d)

OUT=$chk CHECK_DEADLINE=${CHECK_DEADLINE:-170} bash "$here/h200-check.sh" >"$chk/summary.txt" 2>&1
check_rc=$?
tar czf "$OUT/check.tgz" -C "$chk" .
echo "== check (exit $check_rc)"
tail -n 8 "$chk/summary.txt"

OUT=$OUT BENCH_TIMEOUT=${BENCH_TIMEOUT:-300} bash "$here/h200-bench.sh" "$@" >/dev/null 2>&1
bench_rc=$?
echo "== bench (exit $bench_rc)"
grep -E "ceiling|^end to end" "$OUT/bench.log" | tail -n 3

timeout "${PEER_TIMEOUT:-80}" python3 "$here/peer_transformers.py" --json "$OUT/peer.json" >"$OUT/peer.txt" 2>&1
echo "== peer (exit $?)"
tail -n 4 "$OUT/peer.txt"

[ "$check_rc" -ne 0 ] && exit "$check_rc"
exit "$bench_rc"
