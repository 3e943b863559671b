// A launch's last workgroup to finish (a "tail": docs/decisions.md),
// appended to the families that finish in one
// (attention). The host declares the counters
// `TCNT: array<atomic<u32>>` (zero between launches) and makes what the
// last workgroup reads of the others' writes `@coherent`
// (kernels.rs COHERENT_MARK).

var<workgroup> tail_flag: u32;

// Whether this workgroup is the last of the `n` that count in on TCNT[i].
// Each publishes its writes with a storage barrier (device scope on Vulkan
// and DX12) before it counts; the one that brings the count to n has seen
// every other's count, so after its own storage barrier their writes are
// visible to it, and it resets the count for the next launch. No workgroup
// waits on another (WGSL promises no forward progress between them). Every
// invocation calls it, in uniform control flow; the result is uniform.
fn tail_last(i: u32, n: u32, lid: u32) -> bool {
    storageBarrier();
    if (lid == 0u) {
        var last = 0u;
        if (atomicAdd(&TCNT[i], 1u) + 1u == n) {
            last = 1u;
            atomicStore(&TCNT[i], 0u);
        }
        tail_flag = last;
    }
    let last = workgroupUniformLoad(&tail_flag) != 0u;
    if (last) {
        storageBarrier();
    }
    return last;
}
