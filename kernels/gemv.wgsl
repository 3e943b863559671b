// Decode GEMV, the bandwidth-bound fast path of `matmul` for one row of x and
// 16-bit weights with k a multiple of 8: OUT[row0 + r] = W[r, :] . X.
// k / 8 is the pipeline constant BK. Each row is read by 32 threads as
// vec4<u32> (8 weights, 16 bytes) per load,
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
// 16-byte blocks per row (k / 8), compiled in per shape.
override BK: u32 = 352u;
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
    var acc = 0.0;
    if (r < P.rows) {
        let base = r * BK;
        // A constant trip count (BK is compiled in) and no branch around a
        // load (the last partial column of blocks rereads block BK - 1 and
        // drops it): all of a lane's loads can issue before the first
        // returns. Two accumulators for the adds.
        var acc2 = 0.0;
        for (var c = 0u; c < (BK + LANES - 1u) / LANES; c++) {
            let b = lane + c * LANES;
            let bb = min(b, BK - 1u);
            let d = select(0.0, dot8(W[base + bb], bb), b < BK);
            if ((c & 1u) == 0u) {
                acc += d;
            } else {
                acc2 += d;
            }
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
