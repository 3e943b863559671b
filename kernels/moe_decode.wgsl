// MoE expert GEMVs for decode (m = 1) with 16-bit weights: the bandwidth-bound
// fast path of kernels/moe.wgsl, laid out like kernels/gemv.wgsl. Each weight
// row is read by 32 threads as vec4<u32> (8 weights, 16 bytes) per load,
// consecutive threads on consecutive 16-byte blocks, with plain scalar
// accumulators (no dynamically indexed arrays that could spill); 8 rows per
// 256-thread workgroup, reduced in workgroup memory (no subgroup operations).
//
//   moe_gate_up_decode  ACT[j, i] = gelu_tanh(gate_e . x) * (up_e . x), e = IDS[j]
//                       (hidden a multiple of 8: rows start on 16-byte boundaries)
//   moe_down_decode     OUT[r] = sum_j WTS[j] * (down_e[r, :] . ACT[j]), e = IDS[j]
//                       (inter a multiple of 8), the sum over j in registers in
//                       a fixed order: deterministic, no atomics.
//
// An expert id past P.experts selects nothing, as in kernels/moe.wgsl: phase 1
// leaves its activation row untouched and phase 2 skips the slot.
//
// Bindings: 0 IDS, 1 W (weights), 2 A (x or act), 3 WTS, 4 OUT (act or out).

struct Params {
    m: u32,
    hidden: u32,
    inter: u32,
    experts: u32,
    top_k: u32,
    direct: u32,
    nslots: u32,
    // row blocks per slot (phase 1)
    nrb: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(1) @binding(0) var<storage, read> IDS: array<u32>;
@group(1) @binding(1) var<storage, read> W: array<vec4<u32>>;
@group(1) @binding(2) var<storage, read> A: array<vec4<f32>>;
@group(1) @binding(3) var<storage, read> WTS: array<f32>;
@group(1) @binding(4) var<storage, read_write> OUT: array<f32>;

const LANES: u32 = 32u;
const ROWS: u32 = 8u;
var<workgroup> part_a: array<f32, 256>;
var<workgroup> part_b: array<f32, 256>;

// Eight weights (one 16-byte block) dotted with the 8 activations starting at
// vec4 index `xi` of A.
fn dot8(w: vec4<u32>, xi: u32) -> f32 {
    let a = decode_pair(w.x);
    let b = decode_pair(w.y);
    let c = decode_pair(w.z);
    let d = decode_pair(w.w);
    return dot(vec4<f32>(a, b), A[xi]) + dot(vec4<f32>(c, d), A[xi + 1u]);
}

// Sum part_a (and part_b when `both`) over the 32 lanes of each row (into lane 0).
fn reduce_lanes(t: u32, lane: u32, both: bool) {
    workgroupBarrier();
    for (var s = LANES / 2u; s > 0u; s >>= 1u) {
        if (lane < s) {
            part_a[t] += part_a[t + s];
            if (both) {
                part_b[t] += part_b[t + s];
            }
        }
        workgroupBarrier();
    }
}

// Workgroup g: slot j = g / nrb, rows (g % nrb) * 8 .. + 8 of the slot's
// activation row, one gate row and its up row per 32 threads.
@compute @workgroup_size(256)
fn moe_gate_up_decode(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                      @builtin(local_invocation_index) t: u32) {
    let g = linear_group(wg, nwg);
    let j = g / P.nrb;
    let lane = t % LANES;
    let i = (g % P.nrb) * ROWS + t / LANES;
    let n = P.inter;
    let blocks = P.hidden / 8u;
    var ag = 0.0;
    var au = 0.0;
    var valid = false;
    if (j < P.top_k && i < n) {
        let e = IDS[j];
        valid = e < P.experts;
        if (valid) {
            let gbase = (e * 2u * n + i) * blocks;
            let ubase = gbase + n * blocks;
            // Two blocks of each row per iteration: four loads in flight.
            var ag2 = 0.0;
            var au2 = 0.0;
            var b = lane;
            for (; b + LANES < blocks; b += 2u * LANES) {
                let g0 = W[gbase + b];
                let u0 = W[ubase + b];
                let g1 = W[gbase + b + LANES];
                let u1 = W[ubase + b + LANES];
                ag += dot8(g0, 2u * b);
                au += dot8(u0, 2u * b);
                ag2 += dot8(g1, 2u * (b + LANES));
                au2 += dot8(u1, 2u * (b + LANES));
            }
            if (b < blocks) {
                let g0 = W[gbase + b];
                let u0 = W[ubase + b];
                ag += dot8(g0, 2u * b);
                au += dot8(u0, 2u * b);
            }
            ag += ag2;
            au += au2;
        }
    }
    part_a[t] = ag;
    part_b[t] = au;
    reduce_lanes(t, lane, true);
    if (lane == 0u && valid) {
        OUT[j * n + i] = gelu_tanh(part_a[t]) * part_b[t];
    }
}

// Block f of the flat run over (slot, block) of output row r: WTS[j] times
// the block's dot with ACT[j]; zero past the end or for an invalid expert
// (the loads stay in range).
fn down_block(f: u32, total: u32, blocks: u32, r: u32) -> f32 {
    let fc = min(f, total - 1u);
    let j = fc / blocks;
    let b = fc - j * blocks;
    let e = IDS[j];
    let ok = e < P.experts && f < total;
    let ec = select(0u, e, ok);
    let w = W[(ec * P.hidden + r) * blocks + b];
    let v = WTS[j] * dot8(w, j * (P.inter / 4u) + 2u * b);
    return select(0.0, v, ok);
}

// Workgroup g: output rows g * 8 .. + 8, one row per 32 threads. The threads
// of a row walk the down rows of all top_k slots as one flat run of (slot,
// block) indices, four blocks in flight, so the slots' loads overlap.
@compute @workgroup_size(256)
fn moe_down_decode(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) t: u32) {
    let lane = t % LANES;
    let r = linear_group(wg, nwg) * ROWS + t / LANES;
    let h = P.hidden;
    let blocks = P.inter / 8u;
    let total = P.top_k * blocks;
    var acc = 0.0;
    if (r < h && total > 0u) {
        var acc2 = 0.0;
        var acc3 = 0.0;
        var acc4 = 0.0;
        for (var f = lane; f < total; f += 4u * LANES) {
            let v0 = down_block(f, total, blocks, r);
            let v1 = down_block(f + LANES, total, blocks, r);
            let v2 = down_block(f + 2u * LANES, total, blocks, r);
            let v3 = down_block(f + 3u * LANES, total, blocks, r);
            acc += v0;
            acc2 += v1;
            acc3 += v2;
            acc4 += v3;
        }
        acc = (acc + acc2) + (acc3 + acc4);
    }
    part_a[t] = acc;
    reduce_lanes(t, lane, false);
    if (lane == 0u && r < h) {
        OUT[r] = part_a[t];
    }
}
