// A launch's last workgroup to finish (a "tail": docs/decisions.md,
// eighteenth session), appended to the families that finish in one
// (attention, moe_decode_ffn). The host declares the counters
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

// Workgroups per first-level counter of tail_last_tree.
const TAIL_FAN: u32 = 32u;

// tail_last for a launch of many workgroups: workgroup k of the n counts in
// on its group's counter TCNT[i + 1 + k / TAIL_FAN] first, and only each
// group's last on TCNT[i], so no counter takes more than TAIL_FAN counts
// (on the H200 a launch of 1408 workgroups counting on one counter cost
// about 15 ns a workgroup, as if the counts ran one at a time). A group's
// last has acquired its members' writes (tail_last's second barrier)
// before it releases them on TCNT[i] with its own: the top's last sees
// every workgroup's writes. Uses counters i .. i + ceil(n / TAIL_FAN).
fn tail_last_tree(i: u32, n: u32, k: u32, lid: u32) -> bool {
    let grp = k / TAIL_FAN;
    if (!tail_last(i + 1u + grp, min(TAIL_FAN, n - grp * TAIL_FAN), lid)) {
        return false;
    }
    return tail_last(i, (n + TAIL_FAN - 1u) / TAIL_FAN, lid);
}
