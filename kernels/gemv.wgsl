// Decode GEMV, the bandwidth-bound fast path of `matmul` for one row of x and
// 16-bit weights with k a multiple of 8: OUT[row0 + r] = W[r, :] . X.
// Each row is read by 32 threads as vec4<u32> (8 weights, 16 bytes) per load,
// consecutive threads on consecutive 16-byte blocks, with plain scalar
// accumulators (no arrays that could spill); 8 rows per workgroup, reduced
// in workgroup memory (no subgroup operations).

struct Params {
    n: u32,
    k: u32,
    rows: u32,
    row0: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(1) @binding(0) var<storage, read> W: array<vec4<u32>>;
@group(1) @binding(1) var<storage, read> X: array<vec4<f32>>;
@group(1) @binding(2) var<storage, read_write> OUT: array<f32>;

const LANES: u32 = 32u;
const ROWS: u32 = 8u;
var<workgroup> part: array<f32, 256>;

fn dot8(w: vec4<u32>, i: u32) -> f32 {
    let a = decode_pair(w.x);
    let b = decode_pair(w.y);
    let c = decode_pair(w.z);
    let d = decode_pair(w.w);
    let x0 = X[2u * i];
    let x1 = X[2u * i + 1u];
    return dot(vec4<f32>(a, b), x0) + dot(vec4<f32>(c, d), x1);
}

@compute @workgroup_size(256)
fn gemv(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
    let lane = t % LANES;
    let r = linear_group(wg, nwg) * ROWS + t / LANES;
    let blocks = P.k / 8u;
    var acc = 0.0;
    if (r < P.rows) {
        let base = r * blocks;
        // Two independent accumulators keep two loads in flight per thread.
        var acc2 = 0.0;
        var i = lane;
        for (; i + LANES < blocks; i += 2u * LANES) {
            let w0 = W[base + i];
            let w1 = W[base + i + LANES];
            acc += dot8(w0, i);
            acc2 += dot8(w1, i + LANES);
        }
        if (i < blocks) {
            acc += dot8(W[base + i], i);
        }
        acc += acc2;
    }
    part[t] = acc;
    workgroupBarrier();
    for (var s = LANES / 2u; s > 0u; s >>= 1u) {
        if (lane < s) {
            part[t] += part[t + s];
        }
        workgroupBarrier();
    }
    if (lane == 0u && r < P.rows) {
        OUT[P.row0 + r] = part[t];
    }
}

// ---- gemv_rows: a few rows of x (prefill micro-batches, m <= 16) ----------
//
// OUT[j, row0 + r] = W[r, :] . X[j, :] for the MT rows j of X (MT = m,
// compiled in). Laid out as `gemv`: each weight row read once by 32 lanes,
// 16 bytes per load, and each block applied to all MT rows of x (read from
// cache) with MT scalar accumulators per lane. The lane sums go through
// workgroup memory for all rows at once (5 barriers, not 5 per row).

override MT: u32 = 1u;
const MAXT: u32 = 16u;
var<workgroup> pt: array<f32, 4096>; // [MAXT][256]

@compute @workgroup_size(256)
fn gemv_rows(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) t: u32) {
    let lane = t % LANES;
    let r = linear_group(wg, nwg) * ROWS + t / LANES;
    let blocks = P.k / 8u;
    let k4 = P.k / 4u;
    var acc: array<f32, MAXT>;
    if (r < P.rows) {
        let base = r * blocks;
        for (var i = lane; i < blocks; i += LANES) {
            let w = W[base + i];
            let lo = vec4<f32>(decode_pair(w.x), decode_pair(w.y));
            let hi = vec4<f32>(decode_pair(w.z), decode_pair(w.w));
            for (var j = 0u; j < MT; j++) {
                let xi = j * k4 + 2u * i;
                acc[j] += dot(lo, X[xi]) + dot(hi, X[xi + 1u]);
            }
        }
    }
    for (var j = 0u; j < MT; j++) {
        pt[j * 256u + t] = acc[j];
    }
    workgroupBarrier();
    for (var s = LANES / 2u; s > 0u; s >>= 1u) {
        if (lane < s) {
            for (var j = 0u; j < MT; j++) {
                pt[j * 256u + t] += pt[j * 256u + t + s];
            }
        }
        workgroupBarrier();
    }
    if (lane == 0u && r < P.rows) {
        for (var j = 0u; j < MT; j++) {
            OUT[j * P.n + P.row0 + r] = pt[j * 256u + t];
        }
    }
}
