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
trap 'rm -f "$log"' EXIT
status=0
cargo test --workspace "$@" 2>&1 | tee "$log" || status=$?
# One closing line over every test binary (cargo prints one per binary, the
# last of them for doc-tests, which this workspace has none of).
awk '/^test result:/ { p += $4; f += $6 } END { printf "%d passed, %d failed\n", p, f }' "$log"
exit "$status"
