// Argmax: ARG[r] = first index of the largest X[r, :]; P.n = row length.
// NaN never wins; a row with no value at or above -3.402823e38 (every value
// NaN or -inf) gives 0xffffffff (turbospark::ops::NO_ARGMAX).
//
// Two dispatches so a 262144-wide row is read by many workgroups, not one:
//   argmax_partial  workgroup (r, c) reduces chunk c of row r (P.chunks
//                   per row, P.s unused) to PART[r * chunks + c] =
//                   (value bits, index), index 0xffffffff when it saw none;
//   argmax_final    one workgroup per row reduces the row's chunks.
// Ties go to the lower index at every step, so the result is the first one.
struct Params {
    n: u32,
    rows: u32,
    s: f32,
    // chunks per row
    chunks: u32,
}

@group(0) @binding(0) var<uniform> P: Params;

const NONE: u32 = 0xffffffffu;
var<workgroup> best_v: array<f32, 256>;
var<workgroup> best_i: array<u32, 256>;

// Whether (v, i) beats (bv, bi): larger, or equal at a lower index (a real
// index is always lower than NONE).
fn better(v: f32, i: u32, bv: f32, bi: u32) -> bool {
    return v > bv || (v == bv && i < bi);
}

// Tree reduction of the 256 (value, index) pairs into slot 0.
fn reduce(lid: u32) {
    workgroupBarrier();
    for (var s = 128u; s > 0u; s >>= 1u) {
        if (lid < s) {
            let ov = best_v[lid + s];
            let oi = best_i[lid + s];
            if (better(ov, oi, best_v[lid], best_i[lid])) {
                best_v[lid] = ov;
                best_i[lid] = oi;
            }
        }
        workgroupBarrier();
    }
}

@group(1) @binding(0) var<storage, read> X: array<f32>;
@group(1) @binding(1) var<storage, read_write> PART: array<vec2<u32>>;

@compute @workgroup_size(256)
fn argmax_partial(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
    let id = linear_group(wg, nwg);
    let chunks = P.chunks;
    let r = id / chunks;
    let c = id % chunks;
    if (r >= P.rows) {
        return;
    }
    let len = (P.n + chunks - 1u) / chunks;
    let lo = c * len;
    let hi = min(lo + len, P.n);
    var bv = -3.402823e38;
    var bi = NONE;
    for (var i = lo + lid; i < hi; i += 256u) {
        let v = X[r * P.n + i];
        // The first value at the floor counts too (bi == NONE); NaN never.
        if (v > bv || (bi == NONE && v == bv)) {
            bv = v;
            bi = i;
        }
    }
    best_v[lid] = bv;
    best_i[lid] = bi;
    reduce(lid);
    if (lid == 0u) {
        PART[id] = vec2<u32>(bitcast<u32>(best_v[0]), best_i[0]);
    }
}

@group(1) @binding(0) var<storage, read> PARTS: array<vec2<u32>>;
@group(1) @binding(1) var<storage, read_write> ARG: array<u32>;

@compute @workgroup_size(256)
fn argmax_final(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let r = linear_group(wg, nwg);
    if (r >= P.rows) {
        return;
    }
    var bv = -3.402823e38;
    var bi = NONE;
    for (var c = lid; c < P.chunks; c += 256u) {
        let e = PARTS[r * P.chunks + c];
        let v = bitcast<f32>(e.x);
        if (better(v, e.y, bv, bi)) {
            bv = v;
            bi = e.y;
        }
    }
    best_v[lid] = bv;
    best_i[lid] = bi;
    reduce(lid);
    if (lid == 0u) {
        ARG[r] = best_i[0];
    }
}
