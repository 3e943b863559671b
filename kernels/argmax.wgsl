// Argmax: ARG[r] = first index of the largest X[r, :]; P.n = row length.
struct Params {
    n: u32,
    rows: u32,
    s: f32,
    vocab: u32,
}

@group(0) @binding(0) var<uniform> P: Params;

// One workgroup per row; NaN never wins.
@group(1) @binding(0) var<storage, read> X: array<f32>;
@group(1) @binding(1) var<storage, read_write> ARG: array<u32>;

var<workgroup> best_v: array<f32, 256>;
var<workgroup> best_i: array<u32, 256>;

@compute @workgroup_size(256)
fn argmax(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let r = linear_group(wg, nwg);
    if (r >= P.rows) {
        return;
    }
    var bv = -3.402823e38;
    var bi = 0xffffffffu;
    for (var i = lid; i < P.n; i += 256u) {
        let v = X[r * P.n + i];
        if (v > bv || (bi == 0xffffffffu && v == bv)) {
            bv = v;
            bi = i;
        }
    }
    best_v[lid] = bv;
    best_i[lid] = bi;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s >>= 1u) {
        if (lid < s) {
            let ov = best_v[lid + s];
            let oi = best_i[lid + s];
            if (ov > best_v[lid] || (ov == best_v[lid] && oi < best_i[lid])) {
                best_v[lid] = ov;
                best_i[lid] = oi;
            }
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        ARG[r] = select(best_i[0], 0u, best_i[0] == 0xffffffffu);
    }
}
