// Workgroup-wide sum with subgroup operations: prepended (after common.wgsl)
// to every kernel family on devices that have them, in place of
// kernels/reduce.wgsl (same functions). One barrier per sum instead of
// log2(n) + 2: a subgroup sums in registers, one lane per subgroup writes
// the partial, every subgroup sums the partials (the result does not depend
// on timing).
//
// Assumes subgroups are runs of consecutive local invocation indices (a 1-D
// workgroup split in order), as on NVIDIA, AMD, Intel, Apple and lavapipe;
// the subgroup size is counted, not assumed.

const RED_MAX: u32 = 1024u;
var<workgroup> red_buf: array<f32, RED_MAX>;
// Which half of red_buf the next reduction publishes in. Consecutive
// reductions alternate halves, so one needs a single barrier: a thread that
// publishes reduction i + 2's partials in a half has passed reduction
// i + 1's barrier, which every thread reaches only after reading reduction
// i's partials from that half. Every thread makes the same calls in the same
// order (workgroup-uniform control flow), so the phase is uniform.
var<private> red_phase: u32 = 0u;

// The next reduction's place for `n` threads: (the half's offset, the
// number of partials, the subgroup size, this thread's lane). Lanes are
// local indices modulo the size (subgroups are runs of consecutive
// indices), which saves a subgroup scan.
fn red_slot(lid: u32, n: u32) -> vec4<u32> {
    let size = subgroupAdd(1u);
    let off = red_phase * (RED_MAX / 2u);
    red_phase ^= 1u;
    return vec4<u32>(off, (n + size - 1u) / size, size, lid % size);
}

// Sum of `v` over the `n` threads of the workgroup (`n` a power of two of at
// most 1024, `lid` its local index); every thread gets the total. Call from
// workgroup-uniform control flow. One lane per subgroup publishes its
// subgroup's sum, then every subgroup sums the partials itself (lane l
// those at l, l + size, ...; then a subgroup sum): the same operations on
// the same values in every subgroup, so every thread gets the same bits,
// whatever the timing.
fn workgroup_sum(v: f32, lid: u32, n: u32) -> f32 {
    let s = subgroupAdd(v);
    let q = red_slot(lid, n);
    if (q.w == 0u) {
        red_buf[q.x + lid / q.z] = s;
    }
    workgroupBarrier();
    var t = 0.0;
    // (a uniform trip count: the subgroup operation after it is reached by
    // every lane together)
    for (var k = 0u; k < q.y; k += q.z) {
        if (k + q.w < q.y) {
            t += red_buf[q.x + k + q.w];
        }
    }
    return subgroupAdd(t);
}

// Two sums at once (one barrier for both), as workgroup_sum.
fn workgroup_sum2(v: vec2<f32>, lid: u32, n: u32) -> vec2<f32> {
    let s = subgroupAdd(v);
    let q = red_slot(lid, n);
    if (q.w == 0u) {
        let i = q.x + 2u * (lid / q.z);
        red_buf[i] = s.x;
        red_buf[i + 1u] = s.y;
    }
    workgroupBarrier();
    var t = vec2<f32>(0.0);
    for (var k = 0u; k < q.y; k += q.z) {
        if (k + q.w < q.y) {
            let i = q.x + 2u * (k + q.w);
            t += vec2<f32>(red_buf[i], red_buf[i + 1u]);
        }
    }
    return subgroupAdd(t);
}

// Largest `v` over the `n` threads of the workgroup (same rules as
// workgroup_sum).
fn workgroup_max(v: f32, lid: u32, n: u32) -> f32 {
    let s = subgroupMax(v);
    let q = red_slot(lid, n);
    if (q.w == 0u) {
        red_buf[q.x + lid / q.z] = s;
    }
    workgroupBarrier();
    var m = neg_inf();
    for (var k = 0u; k < q.y; k += q.z) {
        if (k + q.w < q.y) {
            m = max(m, red_buf[q.x + k + q.w]);
        }
    }
    return subgroupMax(m);
}

// The max and the sum of `v` over this invocation's subgroup (for kernels
// that arrange their work by subgroup: attention's keys_max / keys_sum).
// Call from uniform control flow.
fn lanes_max(v: f32) -> f32 {
    return subgroupMax(v);
}

fn lanes_sum(v: f32) -> f32 {
    return subgroupAdd(v);
}
