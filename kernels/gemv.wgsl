// Decode GEMV, the bandwidth-bound fast path of `matmul` for one row of x and
// 16-bit weights with k a multiple of 8: OUT[row0 + r] = W[r, :] . X.
// Each row is read by RL threads (a power of two, 32 to 256, compiled in) as
// vec4<u32> (8 weights, 16 bytes) per load, consecutive threads on
// consecutive 16-byte blocks, with plain scalar accumulators (no arrays that
// could spill); 256 / RL rows per workgroup, reduced in workgroup memory (no
// subgroup operations). The launcher gives short weights (up to 4096
// rows) 64 lanes a row, the rest 32; for weights of at most 2816 rows
// (o_proj, k_proj) it compiles in the blocks per row (GBK = k / 8), so a
// lane's loop has a constant trip count and the driver issues all of its
// loads before the first returns (as kernels/moe_decode.wgsl does). The
// others keep k a parameter (GBK = 0), their loads coming back a pair per
// round trip, which on the H200 was faster for them (q_proj sliding 9.3
// against 10.6 us, full 14.7 against 17.2; BENCHMARKS.md, twelfth session).

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

// (gemv_rows' lane groups)
const LANES: u32 = 32u;
const ROWS: u32 = 8u;
override RL: u32 = 32u;
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

override GBK: u32 = 0u;

@compute @workgroup_size(256)
fn gemv(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
    let lane = t % RL;
    let r = linear_group(wg, nwg) * (256u / RL) + t / RL;
    var acc = 0.0;
    if (r < P.rows && GBK > 0u) {
        let base = r * GBK;
        // A lane's last block past the row rereads the row's last block,
        // dropped by the select (no branch between the loads).
        for (var c = 0u; c < (GBK + RL - 1u) / RL; c++) {
            let b = lane + c * RL;
            // (max: GBK - 1 with GBK = 0 would overflow at pipeline creation,
            // though this branch is then dead)
            let bb = min(b, max(GBK, 1u) - 1u);
            acc += select(0.0, dot8(W[base + bb], bb), b < GBK);
        }
    } else if (r < P.rows) {
        let blocks = P.k / 8u;
        let base = r * blocks;
        // Two independent accumulators keep two loads in flight per thread.
        var acc2 = 0.0;
        var i = lane;
        for (; i + RL < blocks; i += 2u * RL) {
            let w0 = W[base + i];
            let w1 = W[base + i + RL];
            acc += dot8(w0, i);
            acc2 += dot8(w1, i + RL);
        }
        if (i < blocks) {
            acc += dot8(W[base + i], i);
        }
        acc += acc2;
    }
    part[t] = acc;
    workgroupBarrier();
    for (var s = RL / 2u; s > 0u; s >>= 1u) {
        if (lane < s) {
            part[t] += part[t + s];
        }
        workgroupBarrier();
    }
    if (lane == 0u && r < P.rows) {
        OUT[P.row0 + r] = part[t];
    }
}

// ---- gemv_rows: a few rows of x (prefill batches of m <= 16) -------------
//
// OUT[j, row0 + r] = W[r, :] . X[j, :] for the MT rows j of X (MT = m,
// compiled in). Laid out as `gemv`, with RPL weight rows (1 or 2, compiled
// in) per 32 lanes: each weight row is read once, 16 bytes per load, and
// each block is applied to all MT rows of x, an x block read once (from
// cache) for the RPL weight rows, with RPL x MT accumulators per lane
// (arrays indexed by loops over the compiled-in MT). The lane sums go
// through workgroup memory for all of x's rows at once (one tree of
// barriers per weight row, not per x row). Two rows per lane group
// pay off for wide weights (4096+ rows) and cost for narrow ones (fewer
// workgroups in flight): the launcher picks by shape, BENCHMARKS.md.

override MT: u32 = 1u;
override RPL: u32 = 2u;
const MAXT: u32 = 16u;
var<workgroup> pt: array<f32, 4096>; // [MAXT][256]

// Sum each row's 32 lanes of `acc` (MT values per lane) and write them as
// weight row r of OUT.
fn rows_out(acc: ptr<function, array<f32, MAXT>>, t: u32, lane: u32, r: u32, ok: bool) {
    for (var j = 0u; j < MT; j++) {
        pt[j * 256u + t] = (*acc)[j];
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
    if (lane == 0u && ok) {
        for (var j = 0u; j < MT; j++) {
            OUT[j * P.n + P.row0 + r] = pt[j * 256u + t];
        }
    }
    workgroupBarrier();
}

@compute @workgroup_size(256)
fn gemv_rows(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) t: u32) {
    let lane = t % LANES;
    let r0 = (linear_group(wg, nwg) * ROWS + t / LANES) * RPL;
    let r1 = r0 + 1u;
    let ok0 = r0 < P.rows;
    let ok1 = RPL == 2u && r1 < P.rows;
    let blocks = P.k / 8u;
    let k4 = P.k / 4u;
    var acc0: array<f32, MAXT>;
    var acc1: array<f32, MAXT>;
    if (ok0) {
        let b0 = r0 * blocks;
        // A missing second row rereads the first (dropped when written).
        let b1 = select(r0, r1, ok1) * blocks;
        for (var i = lane; i < blocks; i += LANES) {
            let w0 = W[b0 + i];
            let lo0 = vec4<f32>(decode_pair(w0.x), decode_pair(w0.y));
            let hi0 = vec4<f32>(decode_pair(w0.z), decode_pair(w0.w));
            if (RPL == 2u) {
                let w1 = W[b1 + i];
                let lo1 = vec4<f32>(decode_pair(w1.x), decode_pair(w1.y));
                let hi1 = vec4<f32>(decode_pair(w1.z), decode_pair(w1.w));
                for (var j = 0u; j < MT; j++) {
                    let xi = j * k4 + 2u * i;
                    let x0 = X[xi];
                    let x1 = X[xi + 1u];
                    acc0[j] += dot(lo0, x0) + dot(hi0, x1);
                    acc1[j] += dot(lo1, x0) + dot(hi1, x1);
                }
            } else {
                for (var j = 0u; j < MT; j++) {
                    let xi = j * k4 + 2u * i;
                    acc0[j] += dot(lo0, X[xi]) + dot(hi0, X[xi + 1u]);
                }
            }
        }
    }
    rows_out(&acc0, t, lane, r0, ok0);
    if (RPL == 2u) {
        rows_out(&acc1, t, lane, r1, ok1);
    }
}
