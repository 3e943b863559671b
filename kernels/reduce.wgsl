// Workgroup-wide sum through workgroup memory: prepended (after common.wgsl)
// to every kernel family on devices without subgroup operations. Its twin,
// kernels/reduce_subgroup.wgsl, has the same functions and is used where the
// device has them; the parity suite runs both (tests/parity.rs, the
// `*_without_subgroups` tests).

const RED_MAX: u32 = 1024u;
var<workgroup> red_buf: array<f32, RED_MAX>;

// Sum of `v` over the `n` threads of the workgroup (`n` a power of two of at
// most 1024, `lid` its local index); every thread gets the total. Call from
// workgroup-uniform control flow.
fn workgroup_sum(v: f32, lid: u32, n: u32) -> f32 {
    red_buf[lid] = v;
    workgroupBarrier();
    for (var s = n / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            red_buf[lid] += red_buf[lid + s];
        }
        workgroupBarrier();
    }
    let total = red_buf[0];
    workgroupBarrier();
    return total;
}

// Two sums at once, as workgroup_sum (the same pairing of values).
var<workgroup> red_buf2: array<vec2<f32>, RED_MAX>;

fn workgroup_sum2(v: vec2<f32>, lid: u32, n: u32) -> vec2<f32> {
    red_buf2[lid] = v;
    workgroupBarrier();
    for (var s = n / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            red_buf2[lid] += red_buf2[lid + s];
        }
        workgroupBarrier();
    }
    let total = red_buf2[0];
    workgroupBarrier();
    return total;
}

// Largest `v` over the `n` threads of the workgroup (same rules as
// workgroup_sum).
fn workgroup_max(v: f32, lid: u32, n: u32) -> f32 {
    red_buf[lid] = v;
    workgroupBarrier();
    for (var s = n / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            red_buf[lid] = max(red_buf[lid], red_buf[lid + s]);
        }
        workgroupBarrier();
    }
    let m = red_buf[0];
    workgroupBarrier();
    return m;
}

// The max and the sum of `v` over this invocation's subgroup, in a build
// without subgroup operations: each invocation is a subgroup of one (the
// launchers then tell the kernels a width of 0 or 1).
fn lanes_max(v: f32) -> f32 {
    return v;
}

fn lanes_sum(v: f32) -> f32 {
    return v;
}
