// Products with MLX affine-quantized weights (kernels/affine.wgsl) for
// decode and micro-batches: every weight row is read once, 32 values (one
// "unit": QBITS whole words, one group's scale and bias) a lane at a time.
//
//   affine_gemv      matmul, m <= 16 (MT rows of x compiled in):
//                    OUT[i, row0 + r] = W[r] . X[i]
//   affine_gate_up   MoE phase 1 for m <= 16 tokens, one workgroup per
//                    (token, slot) pair and 16 features:
//                    OUT[p, f] = gelu_tanh(gate_e . x_t) * (up_e . x_t)
//   affine_down      MoE phase 2, one workgroup per token and 32 output
//                    rows: OUT[t, h] = sum_j WTS[t, j] * (down_e[h] . X[t, j])
//
// A team of RL lanes holds RPT weight rows (8 teams a workgroup); its lanes
// stride over the rows' units. A lane reads a unit of x (32 f32, 128 bytes)
// once for all RPT rows: x's reads, not the weights', bound a 4-bit GEMV
// that reads x once a unit and row (8 bytes of x per byte of weights, all
// from L1). 4-bit units are one 16-byte load, 8-bit two; a row's units
// start on 16 bytes (the header is 16 bytes and a row of k values, k a
// multiple of 32, holds k * QBITS / 32 words, a multiple of 4). Lanes are
// summed in workgroup memory (no subgroup operations needed).
//
// Bindings (shared by the three entries; unused ones get a read-only
// stand-in): 0 W, 1 X (x rows or activations), 2 IDS, 3 WTS, 4 OUT.

struct Params {
    // rows of x (affine_gemv) or tokens
    m: u32,
    // affine_gemv: the output row stride; the MoE phases: inter
    n: u32,
    // the reduced dimension (a multiple of 32)
    k: u32,
    // affine_gemv: this chunk's weight rows; the MoE phases: hidden
    rows: u32,
    // affine_gemv: the chunk's first output feature
    row0: u32,
    top_k: u32,
    experts: u32,
    // workgroups per pair (phase 1) or token (phase 2)
    nrb: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(1) @binding(0) var<storage, read> W: array<vec4<u32>>;
@group(1) @binding(1) var<storage, read> X: array<vec4<f32>>;
@group(1) @binding(2) var<storage, read> IDS: array<u32>;
@group(1) @binding(3) var<storage, read> WTS: array<f32>;
@group(1) @binding(4) var<storage, read_write> OUT: array<f32>;

// Rows of x of affine_gemv (1 ..= 16).
override MT: u32 = 1u;

const RL: u32 = 32u;
const TEAMS: u32 = 8u;
// Weight rows a team holds (affine_gemv, affine_down; affine_gate_up holds
// two features' gate and up rows).
const RPT: u32 = 4u;

var<workgroup> red: array<vec4<f32>, 256>;
var<workgroup> sh_expert: u32;

// Word i of the weight (kernels/affine.wgsl).
fn wword(i: u32) -> u32 {
    return W[i >> 2u][i & 3u];
}

// One unit's packed words and its group's (scale, bias): for 4 and 8 bits
// whole vec4s (w0, and w1 for 8 bits), loaded before any is decoded; other
// widths decode value by value from the unit index `u` in `unit_q`.
struct Unit {
    w0: vec4<u32>,
    w1: vec4<u32>,
    sb: vec2<f32>,
    u: u32,
}

fn load_unit(u: u32, o: vec2<u32>) -> Unit {
    var x: Unit;
    x.u = u;
    x.sb = affine_sb_at(u / (QGROUP / 32u), o);
    let wb = (QHEAD + u * QBITS) >> 2u;
    if (QBITS == 4u) {
        x.w0 = W[wb];
    } else if (QBITS == 8u) {
        x.w0 = W[wb];
        x.w1 = W[wb + 1u];
    }
    return x;
}

// Small unsigned integers (< 2^23) to f32, exactly, without the
// int-to-float conversion (a quarter- or eighth-rate instruction on GPUs,
// which held the 4-bit LM head to 1.6 TB/s on the H200): 2^23 + v has v as
// its mantissa, and subtracting 2^23 is exact.
fn small_to_f32(v: vec4<u32>) -> vec4<f32> {
    return bitcast<vec4<f32>>(v | vec4<u32>(0x4b000000u)) - vec4<f32>(8388608.0);
}

const NIBBLES_LO: vec4<u32> = vec4<u32>(0u, 4u, 8u, 12u);
const NIBBLES_HI: vec4<u32> = vec4<u32>(16u, 20u, 24u, 28u);
const BYTES: vec4<u32> = vec4<u32>(0u, 8u, 16u, 24u);

// The 32 unsigned values of a loaded unit (elements 32u .. 32u + 31 of
// the weight), as f32; its weights are sb.x * q + sb.y.
fn unit_q(x: Unit) -> array<vec4<f32>, 8> {
    var q: array<vec4<f32>, 8>;
    if (QBITS == 4u) {
        for (var i = 0u; i < 4u; i++) {
            let v = vec4<u32>(x.w0[i]);
            q[2u * i] = small_to_f32((v >> NIBBLES_LO) & vec4<u32>(15u));
            q[2u * i + 1u] = small_to_f32((v >> NIBBLES_HI) & vec4<u32>(15u));
        }
    } else if (QBITS == 8u) {
        for (var i = 0u; i < 4u; i++) {
            q[i] = small_to_f32((vec4<u32>(x.w0[i]) >> BYTES) & vec4<u32>(255u));
            q[4u + i] = small_to_f32((vec4<u32>(x.w1[i]) >> BYTES) & vec4<u32>(255u));
        }
    } else {
        let wb = QHEAD + x.u * QBITS;
        for (var j = 0u; j < 8u; j++) {
            var v = vec4<f32>(0.0);
            for (var c = 0u; c < 4u; c++) {
                let e = 4u * j + c;
                v[c] = f32(affine_q(e, wb + ((e * QBITS) >> 5u)));
            }
            q[j] = v;
        }
    }
    return q;
}

// 32 values of x from vec4 `xb` on, and their sum.
struct XUnit {
    v: array<vec4<f32>, 8>,
    sum: f32,
}

fn load_x(xb: u32) -> XUnit {
    var x: XUnit;
    var s = vec4<f32>(0.0);
    for (var j = 0u; j < 8u; j++) {
        x.v[j] = X[xb + j];
        s += x.v[j];
    }
    x.sum = (s.x + s.y) + (s.z + s.w);
    return x;
}

// A loaded unit's weights dotted with x: scale * (q . x) + bias * sum(x),
// the dot of the dequantised weights (scale * q + bias) with its terms
// grouped, so that x's sum serves every row.
fn unit_dot(w: Unit, x: XUnit) -> f32 {
    let q = unit_q(w);
    let a = (dot(q[0], x.v[0]) + dot(q[1], x.v[1])) + (dot(q[2], x.v[2]) + dot(q[3], x.v[3]));
    let b = (dot(q[4], x.v[4]) + dot(q[5], x.v[5])) + (dot(q[6], x.v[6]) + dot(q[7], x.v[7]));
    return fma(w.sb.x, a + b, w.sb.y * x.sum);
}

// Sum `red` over each team's RL lanes (into lane 0); from uniform control flow.
fn reduce_team(lid: u32, lane: u32) {
    workgroupBarrier();
    for (var s = RL / 2u; s > 0u; s >>= 1u) {
        if (lane < s) {
            red[lid] += red[lid + s];
        }
        workgroupBarrier();
    }
}

@compute @workgroup_size(256)
fn affine_gemv(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let team = lid / RL;
    let lane = lid % RL;
    let r0 = (linear_group(wg, nwg) * TEAMS + team) * RPT;
    let nu = P.k / 32u;
    let o = affine_offsets();
    // acc[r * MT + i]: row r0 + r, row i of x
    var acc: array<f32, 64>;
    for (var u = lane; u < nu; u += RL) {
        var w: array<Unit, RPT>;
        for (var r = 0u; r < RPT; r++) {
            // (rows past the chunk read its last row and write nothing:
            // every thread takes part in the barriers)
            w[r] = load_unit(min(r0 + r, P.rows - 1u) * nu + u, o);
        }
        for (var i = 0u; i < MT; i++) {
            let x = load_x((i * P.k) / 4u + 8u * u);
            for (var r = 0u; r < RPT; r++) {
                acc[r * MT + i] += unit_dot(w[r], x);
            }
        }
    }
    for (var a0 = 0u; a0 < RPT * MT; a0 += 4u) {
        red[lid] = vec4<f32>(acc[a0], acc[a0 + 1u], acc[a0 + 2u], acc[a0 + 3u]);
        reduce_team(lid, lane);
        if (lane == 0u) {
            let v = red[lid];
            for (var q = 0u; q < 4u; q++) {
                let a = a0 + q;
                let row = r0 + a / MT;
                if (a < RPT * MT && row < P.rows) {
                    OUT[(a % MT) * P.n + P.row0 + row] = v[q];
                }
            }
        }
        workgroupBarrier();
    }
}

// Features a team computes in affine_gate_up (a gate and an up row each).
const FPT: u32 = 2u;

@compute @workgroup_size(256)
fn affine_gate_up(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
    let g = linear_group(wg, nwg);
    let p = g / P.nrb;
    if (p >= P.m * P.top_k) {
        return;
    }
    if (lid == 0u) {
        sh_expert = IDS[p];
    }
    let e = workgroupUniformLoad(&sh_expert);
    // An expert id past E selects nothing (the CPU reports it).
    if (e >= P.experts) {
        return;
    }
    let team = lid / RL;
    let lane = lid % RL;
    let n = P.n;
    let f0 = ((g % P.nrb) * TEAMS + team) * FPT;
    let nu = P.k / 32u;
    let xb = ((p / P.top_k) * P.k) / 4u;
    let o = affine_offsets();
    // acc[2 * f]: feature f0 + f's gate, acc[2 * f + 1]: its up
    var acc: array<f32, 4>;
    for (var u = lane; u < nu; u += RL) {
        var w: array<Unit, 4>;
        for (var f = 0u; f < FPT; f++) {
            let grow = e * 2u * n + min(f0 + f, n - 1u);
            w[2u * f] = load_unit(grow * nu + u, o);
            w[2u * f + 1u] = load_unit((grow + n) * nu + u, o);
        }
        let x = load_x(xb + 8u * u);
        for (var j = 0u; j < 2u * FPT; j++) {
            acc[j] += unit_dot(w[j], x);
        }
    }
    red[lid] = vec4<f32>(acc[0], acc[1], acc[2], acc[3]);
    reduce_team(lid, lane);
    if (lane == 0u) {
        let s = red[lid];
        for (var f = 0u; f < FPT; f++) {
            if (f0 + f < n) {
                OUT[p * n + f0 + f] = gelu_tanh(s[2u * f]) * s[2u * f + 1u];
            }
        }
    }
}

@compute @workgroup_size(256)
fn affine_down(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let g = linear_group(wg, nwg);
    let t = g / P.nrb;
    if (t >= P.m) {
        return;
    }
    let team = lid / RL;
    let lane = lid % RL;
    let hidden = P.rows;
    let h0 = ((g % P.nrb) * TEAMS + team) * RPT;
    let inter = P.k;
    let nu = inter / 32u;
    let o = affine_offsets();
    // The lanes take the rows' (expert slot, unit) tasks, so that rows of
    // few units (inter 704: 22) still keep every lane busy.
    let tasks = P.top_k * nu;
    var acc = vec4<f32>(0.0);
    for (var task = lane; task < tasks; task += RL) {
        let p = t * P.top_k + task / nu;
        let u = task % nu;
        let e = IDS[p];
        // (an expert id past E selects nothing: the CPU reports it)
        if (e < P.experts) {
            var w: array<Unit, RPT>;
            for (var r = 0u; r < RPT; r++) {
                w[r] = load_unit((e * hidden + min(h0 + r, hidden - 1u)) * nu + u, o);
            }
            let x = load_x((p * inter) / 4u + 8u * u);
            let s = WTS[p];
            for (var r = 0u; r < RPT; r++) {
                acc[r] += s * unit_dot(w[r], x);
            }
        }
    }
    red[lid] = acc;
    reduce_team(lid, lane);
    if (lane == 0u) {
        let v = red[lid];
        for (var r = 0u; r < RPT; r++) {
            if (h0 + r < hidden) {
                OUT[t * hidden + h0 + r] = v[r];
            }
        }
    }
}
