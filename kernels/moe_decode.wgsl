// MoE expert GEMVs for decode (m = 1) with 16-bit weights: the bandwidth-bound
// fast path of kernels/moe.wgsl, laid out like kernels/gemv.wgsl. Each weight
// row is read by 32 threads as vec4<u32> (8 weights, 16 bytes) per load,
// consecutive threads on consecutive 16-byte blocks, with plain scalar
// accumulators (no dynamically indexed arrays that could spill); 8 weight
// rows per 256-thread workgroup, reduced in workgroup memory (no subgroup
// operations).
//
//   moe_gate_up_decode  ACT[j, i] = gelu_tanh(gate_e . x) * (up_e . x), e = IDS[j]
//                       (hidden a multiple of 8: rows start on 16-byte boundaries)
//   moe_down_decode     OUT[r] = sum_j WTS[j] * (down_e[r, :] . ACT[j]), e = IDS[j]
//                       (inter a multiple of 8).
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

// Eight weights (one 16-byte block) dotted with the 8 activations starting at
// vec4 index `xi` of A.
fn dot8(w: vec4<u32>, xi: u32) -> f32 {
    let a = decode_pair(w.x);
    let b = decode_pair(w.y);
    let c = decode_pair(w.z);
    let d = decode_pair(w.w);
    return dot(vec4<f32>(a, b), A[xi]) + dot(vec4<f32>(c, d), A[xi + 1u]);
}

// Sum part_a over the 32 lanes of each row (into lane 0).
fn reduce_lanes(t: u32, lane: u32) {
    workgroupBarrier();
    for (var s = LANES / 2u; s > 0u; s >>= 1u) {
        if (lane < s) {
            part_a[t] += part_a[t + s];
        }
        workgroupBarrier();
    }
}

// Blocks (8 weights, 16 bytes) per reduced row -- hidden / 8 for gate_up,
// inter / 8 for down -- and the expert count per token, compiled in: every
// lane's loop has a constant trip count, so the driver can issue all of a
// lane's loads before the first one returns.
override BK: u32 = 352u;
override TOPK: u32 = 8u;
const MAXK: u32 = 16u;
var<workgroup> sid: array<u32, MAXK>;
var<workgroup> swt: array<f32, MAXK>;

// Workgroup g: slot j = g / nrb, activation rows i0 = (g % nrb) * 4 .. + 4.
// Each 32 threads take one weight row: threads 0-127 the gate rows i0.., 128-255
// the up rows i0.. (one row per 32 lanes rather than a gate and an up row
// each: twice the lanes, each with half the loads in turn; on the H200 this
// is 3x faster at top-8 of 128, see BENCHMARKS.md).
const PAIRS: u32 = 4u;

@compute @workgroup_size(256)
fn moe_gate_up_decode(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                      @builtin(local_invocation_index) t: u32) {
    let g = linear_group(wg, nwg);
    let j = g / P.nrb;
    let lane = t % LANES;
    let s = t / LANES;
    let i0 = (g % P.nrb) * PAIRS;
    let i = i0 + s % PAIRS;
    let up = s / PAIRS;
    let n = P.inter;
    var acc = 0.0;
    var valid = false;
    if (j < TOPK) {
        valid = IDS[j] < P.experts;
    }
    if (valid && i < n) {
        let e = IDS[j];
        {
            let base = (e * 2u * n + up * n + i) * BK;
            for (var c = 0u; c < (BK + LANES - 1u) / LANES; c++) {
                let b = lane + c * LANES;
                if (b < BK) {
                    acc += dot8(W[base + b], 2u * b);
                }
            }
        }
    }
    part_a[t] = acc;
    reduce_lanes(t, lane);
    // Thread t < 4 writes activation row i0 + t (valid is the slot's, the
    // same for every thread).
    if (t < PAIRS && valid && i0 + t < n) {
        OUT[j * n + i0 + t] = gelu_tanh(part_a[t * LANES]) * part_a[(t + PAIRS) * LANES];
    }
}

// Workgroup g: output rows g * 8 .. + 8, one row per 32 threads. The slots'
// expert ids and weights are read once into workgroup memory; a lane then
// walks its blocks of every slot's down row (TOPK x ceil(BK / 32) loads, a
// constant count), the sum over slots in registers in a fixed order:
// deterministic, no atomics.
@compute @workgroup_size(256)
fn moe_down_decode(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) t: u32) {
    if (t < TOPK) {
        sid[t] = IDS[t];
        swt[t] = WTS[t];
    }
    workgroupBarrier();
    let lane = t % LANES;
    let r = linear_group(wg, nwg) * ROWS + t / LANES;
    let h = P.hidden;
    let arow = P.inter / 4u;
    var acc = 0.0;
    if (r < h) {
        // No branch around a load: a slot with no expert reads expert 0's
        // row and is dropped by a select, and the last partial block column
        // rereads block BK - 1; so every load of all TOPK slots can issue
        // before the first returns (a branch per slot made them wait slot
        // by slot).
        for (var j = 0u; j < TOPK; j++) {
            let e = sid[j];
            let ok = e < P.experts;
            let base = (select(0u, e, ok) * h + r) * BK;
            var a = 0.0;
            for (var c = 0u; c < (BK + LANES - 1u) / LANES; c++) {
                let b = lane + c * LANES;
                let bb = min(b, BK - 1u);
                let d = dot8(W[base + bb], j * arow + 2u * bb);
                a += select(0.0, d, b < BK);
            }
            acc += select(0.0, swt[j] * a, ok);
        }
    }
    part_a[t] = acc;
    reduce_lanes(t, lane);
    if (lane == 0u && r < h) {
        OUT[r] = part_a[t];
    }
}
