#!/usr/bin/env bash
# The whole test suite, on any Linux machine: installs Mesa's lavapipe (a
# Vulkan driver that runs on the CPU) when no Vulkan driver is present, so the
# wgpu kernels are tested even without a GPU. `.ci/run` runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

have_vulkan() {
  ldconfig -p 2>/dev/null | grep -q 'libvulkan\.so\.1' &&
    compgen -G '/usr/share/vulkan/icd.d/*.json' >/dev/null
}

if ! have_vulkan || [ "${CI:-}" = "true" ] && ! compgen -G '/usr/share/vulkan/icd.d/lvp_icd*.json' >/dev/null; then
  echo "== installing Mesa lavapipe (mesa-vulkan-drivers, libvulkan1)"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq mesa-vulkan-drivers libvulkan1 >/dev/null
fi

# lavapipe warns about this on every device creation when it is unset.
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp/turbospark-xdg-$(id -u)}"
mkdir -p "$XDG_RUNTIME_DIR" && chmod 700 "$XDG_RUNTIME_DIR"

echo "== cargo test --workspace"
log=$(mktemp)
pipelines=$(mktemp)
trap 'rm -f "$log" "$pipelines"' EXIT
status=0
cargo test --workspace "$@" 2>&1 | tee "$log" || status=$?

# Portability: in CI (and with TURBOSPARK_PORTABILITY=1) the parity and
# oracle suites again with the device held to Metal's Apple7-class limits,
# then parity under WebGPU's default limits, whose pipelines are logged for
# the Tint check below (the families a profile cannot hold are named in
# tests/parity.rs; docs/architecture.md, "Portability"). (--workspace with
# --test: the same features as the run above, so nothing rebuilds.)
if [ "${CI:-}" = "true" ] || [ "${TURBOSPARK_PORTABILITY:-}" = "1" ]; then
  echo "== parity and oracle under TURBOSPARK_LIMITS=apple7"
  TURBOSPARK_LIMITS=apple7 cargo test --workspace --test parity --test oracle 2>&1 | tee -a "$log" || status=$?
  echo "== parity under TURBOSPARK_LIMITS=webgpu"
  TURBOSPARK_LIMITS=webgpu TURBOSPARK_PIPELINE_LOG="$pipelines" \
    cargo test --workspace --test parity 2>&1 | tee -a "$log" || status=$?
fi

# Every kernel module through a second WGSL compiler: Tint, in Dawn's Node
# bindings (the webgpu npm package, pinned), on Dawn's null backend. In CI
# always (Node.js is installed if missing); locally where node is there.
WEBGPU_VERSION=0.6.2
tint=skip
if [ "${CI:-}" = "true" ] && ! command -v node >/dev/null; then
  echo "== installing Node.js (nodejs, npm)"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq nodejs npm >/dev/null
fi
if command -v node >/dev/null && command -v npm >/dev/null; then
  echo "== Tint: every emitted kernel module (webgpu@$WEBGPU_VERSION, Dawn's null backend)"
  tint=ok
  if ! grep -qs "\"version\": \"$WEBGPU_VERSION\"" .tint/node_modules/webgpu/package.json; then
    npm install --prefix .tint --no-save --no-audit --no-fund --ignore-scripts \
      "webgpu@$WEBGPU_VERSION" >/dev/null || tint=failed
  fi
  logs=()
  [ -s "$pipelines" ] && logs=(--pipelines "$pipelines")
  if [ "$tint" = ok ]; then
    rm -rf .tint/emit
    "${CARGO_TARGET_DIR:-target}/debug/turbospark" kernels --emit .tint/emit "${logs[@]}" &&
      node scripts/tint-check.mjs .tint/emit || tint=failed
  fi
  [ "$tint" = failed ] && status=1
elif [ "${CI:-}" = "true" ]; then
  echo "Tint check: no node or npm after installing them"
  tint=failed
  status=1
fi

# The API documentation builds without a warning (a link to a private item
# or a missing one is a warning rustdoc prints and nobody reads).
echo "== cargo doc --workspace --no-deps (warnings are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet 2>&1 | tee -a "$log" || status=1

# No two files import each other, through any chain (a circle ties them
# into one unit nobody can read or change alone).
echo "== import circles between files"
python3 scripts/import-circles.py 2>&1 | tee -a "$log" || status=1

# One closing line over every test binary (cargo prints one per binary, the
# last of them for doc-tests, which this workspace has none of), the Tint
# check counted as one.
awk -v tint="$tint" '/^test result:/ { p += $4; f += $6 }
  END { if (tint == "ok") p++; if (tint == "failed") f++; printf "%d passed, %d failed\n", p, f }' "$log"
exit "$status"
