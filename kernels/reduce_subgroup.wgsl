// Workgroup-wide sum with subgroup operations: prepended (after common.wgsl)
// to every kernel family on devices that have them, in place of
// kernels/reduce.wgsl (same functions). A few barriers per sum instead of
// log2(n) + 2: subgroups sum in registers, in rounds, in a fixed order (the
// result does not depend on timing).
//
// Assumes subgroups are runs of consecutive local invocation indices (a 1-D
// workgroup split in order), as on NVIDIA, AMD, Intel, Apple and lavapipe;
// the subgroup size is counted, not assumed.

const RED_MAX: u32 = 1024u;
var<workgroup> red_buf: array<f32, RED_MAX>;

// Sum of `v` over the `n` threads of the workgroup (`n` a power of two of at
// most 1024, `lid` its local index); every thread gets the total. Call from
// workgroup-uniform control flow.
//
// Rounds: every subgroup adds its values in registers and its first lane
// writes the sum at the subgroup's index, so `count` values become
// ceil(count / size); the first `next` threads load them for the next round.
// 1024 threads in subgroups of 32: two rounds, four barriers, two loads per
// thread (adding all 32 partials in every thread instead was 32K
// workgroup-memory loads per sum). Lavapipe's subgroups of 8 take four.
fn workgroup_sum(v: f32, lid: u32, n: u32) -> f32 {
    let size = subgroupAdd(1u);
    let lead = subgroupExclusiveAdd(1u) == 0u;
    var x = v;
    var count = n;
    loop {
        let s = subgroupAdd(x);
        if (lead && lid < count) {
            red_buf[lid / size] = s;
        }
        workgroupBarrier();
        let next = (count + size - 1u) / size;
        if (next == 1u) {
            break;
        }
        x = select(0.0, red_buf[min(lid, next - 1u)], lid < next);
        count = next;
        // every read done before the next round writes
        workgroupBarrier();
    }
    let total = red_buf[0];
    workgroupBarrier();
    return total;
}

// Largest `v` over the `n` threads of the workgroup (same rules and rounds
// as workgroup_sum; threads past the values repeat the first one).
fn workgroup_max(v: f32, lid: u32, n: u32) -> f32 {
    let size = subgroupAdd(1u);
    let lead = subgroupExclusiveAdd(1u) == 0u;
    var x = v;
    var count = n;
    loop {
        let s = subgroupMax(x);
        if (lead && lid < count) {
            red_buf[lid / size] = s;
        }
        workgroupBarrier();
        let next = (count + size - 1u) / size;
        if (next == 1u) {
            break;
        }
        x = red_buf[select(0u, lid, lid < next)];
        count = next;
        workgroupBarrier();
    }
    let m = red_buf[0];
    workgroupBarrier();
    return m;
}
