# Sourced by the h200-*.sh scripts on the H200 machine: the Vulkan loader
# from the carried amd64 .deb packages in .gl/ (libvulkan1 and the GL / EGL
# libraries beside it, unpacked into /) and the environment that makes wgpu
# take the NVIDIA ICD (the driver's, under /usr/local/nvidia) through Vulkan.
if ! ls .gl/*.deb >/dev/null 2>&1; then
    echo "no .gl/*.deb: carry the Vulkan loader debs (.gl) with the command" >&2
    exit 2
fi
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
# Vulkan only: the adapter is the H200 through NVIDIA's ICD, not a GL one.
export WGPU_BACKEND=${WGPU_BACKEND:-vulkan}

# SM / memory clocks, utilisation, power and temperature every 200 ms into
# $1, in the background (idle GPUs sit at low clocks, which short cases
# feel); the caller kills $! when done.
clock_log() {
    nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,utilization.gpu,power.draw,temperature.gpu \
        --format=csv -lms 200 >"$1" 2>/dev/null &
}

# The carried release CLI: $TURBOSPARK_BIN, else .bin/turbospark, into $BIN;
# exits if it is not there.
require_bin() {
    BIN=${TURBOSPARK_BIN:-.bin/turbospark}
    if [ ! -x "$BIN" ]; then
        echo "no turbospark binary at $BIN (build it on the build host and carry .bin/)" >&2
        exit 2
    fi
}

# The GPU's name, driver, memory and top clocks into $1 (a run's gpu.txt).
gpu_info() {
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv >"$1" 2>&1
}
