// Elementwise ops: add, scale, gelu_mul, softcap (embed and argmax have
// their own files).
// Each entry point is one op; flat ops use 256 threads per workgroup over a
// grid spread across x and y.

struct Params {
    n: u32,
    rows: u32,
    // scale for `scale` and `embed`, cap for `softcap`
    s: f32,
    // gelu_mul: the row length n; else unused
    count: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(1) @binding(0) var<storage, read> A: array<f32>;
@group(1) @binding(1) var<storage, read> B: array<f32>;
@group(1) @binding(2) var<storage, read_write> OUT: array<f32>;

fn flat_index(wg: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return linear_group(wg, nwg) * 256u + lid;
}

@compute @workgroup_size(256)
fn add(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
       @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wg, nwg, lid);
    if (i < P.n) {
        OUT[i] = A[i] + B[i];
    }
}

@compute @workgroup_size(256)
fn scale(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wg, nwg, lid);
    if (i < P.n) {
        OUT[i] = A[i] * P.s;
    }
}

// OUT[r, i] = gelu_tanh(A[r, i]) * A[r, n + i] for A [rows, 2n]; P.n = rows * n
// output elements, P.count carries n.
@compute @workgroup_size(256)
fn gelu_mul(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wg, nwg, lid);
    if (i < P.n) {
        let n = P.count;
        let r = i / n;
        let c = i % n;
        OUT[i] = gelu_tanh(A[r * 2u * n + c]) * A[r * 2u * n + n + c];
    }
}

@compute @workgroup_size(256)
fn softcap(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wg, nwg, lid);
    if (i < P.n) {
        OUT[i] = P.s * safe_tanh(A[i] / P.s);
    }
}
