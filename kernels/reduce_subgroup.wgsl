// Workgroup-wide sum with subgroup operations: prepended (after common.wgsl)
// to every kernel family on devices that have them, in place of
// kernels/reduce.wgsl (same functions). Two barriers per sum instead of
// log2(n) + 2: a subgroup sums in registers, one lane per subgroup writes
// the partial, every thread adds the partials in a fixed order (the result
// does not depend on timing).
//
// Assumes subgroups are runs of consecutive local invocation indices (a 1-D
// workgroup split in order), as on NVIDIA, AMD, Intel, Apple and lavapipe;
// the subgroup size is counted, not assumed.

const RED_MAX: u32 = 1024u;
var<workgroup> red_buf: array<f32, RED_MAX>;

// Each subgroup's first lane writes its subgroup's `s` at the subgroup's
// index of red_buf; returns how many partials `n` threads leave.
fn publish_partials(s: f32, lid: u32, n: u32) -> u32 {
    let size = subgroupAdd(1u);
    // this thread's place in its subgroup (0 for the first)
    if (subgroupExclusiveAdd(1u) == 0u) {
        red_buf[lid / size] = s;
    }
    workgroupBarrier();
    return (n + size - 1u) / size;
}

// Sum of `v` over the `n` threads of the workgroup (`n` a power of two of at
// most 1024, `lid` its local index); every thread gets the total. Call from
// workgroup-uniform control flow.
fn workgroup_sum(v: f32, lid: u32, n: u32) -> f32 {
    let parts = publish_partials(subgroupAdd(v), lid, n);
    // Four independent chains: the loads issue back to back.
    var a = vec4<f32>(0.0);
    var k = 0u;
    for (; k + 4u <= parts; k += 4u) {
        a += vec4<f32>(red_buf[k], red_buf[k + 1u], red_buf[k + 2u], red_buf[k + 3u]);
    }
    var total = (a.x + a.y) + (a.z + a.w);
    for (; k < parts; k++) {
        total += red_buf[k];
    }
    workgroupBarrier();
    return total;
}

// Largest `v` over the `n` threads of the workgroup (same rules as
// workgroup_sum; a max does not depend on order).
fn workgroup_max(v: f32, lid: u32, n: u32) -> f32 {
    let parts = publish_partials(subgroupMax(v), lid, n);
    var m = red_buf[0];
    for (var k = 1u; k < parts; k++) {
        m = max(m, red_buf[k]);
    }
    workgroupBarrier();
    return m;
}
