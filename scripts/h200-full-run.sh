#!/usr/bin/env bash
# The full H200 run in one command (one machine start, not three): the
# correctness check, the full bench, then the transformers peer.
#
#   on the x86-64 build host: build and strip the release CLI, the parity
#   example and the decoder / oracle test binaries into .bin/ as
#   scripts/h200-check.sh and scripts/h200-bench.sh say; put the Vulkan
#   loader .deb packages in .gl/; copy both folders to the H200 machine and
#   run there, from the repository root, for the full-size model
#     bash scripts/h200-full-run.sh --synthetic gemma-4-26b-a4b --prompt-tokens 512 --decode-tokens 64
#   (arguments go to `bench`).
#
# Written for a runner that stops a command at 10 minutes and returns at
# most 8 files from $OUT: the check's logs go into one archive
# ($OUT/check.tgz), the bench writes its 5, the peer peer.json and
# peer.txt. The check gets CHECK_DEADLINE seconds (170), the bench
# BENCH_TIMEOUT (300), the peer PEER_TIMEOUT (80); the bench still runs if
# the check fails (its summary says so first), and the exit status is the
# check's, else the bench's.
set -uo pipefail

OUT=${OUT:-$PWD/full-run-out}
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
