// Products with MLX affine-quantized weights (kernels/affine.wgsl) for
// decode and micro-batches: every weight row is read once, 32 values (one
// "unit": QBITS whole words, one group's scale and bias) a lane at a time.
//
//   affine_gemv      matmul, m <= 16 (MT rows of x compiled in):
//                    OUT[i, row0 + r] = W[r] . X[i]
//   affine_gate_up   MoE phase 1 for m <= 16 tokens, one workgroup per
//                    (token, slot) pair and 8 features:
//                    OUT[p, f] = gelu_tanh(gate_e . x_t) * (up_e . x_t)
//   affine_down      MoE phase 2, one workgroup per token and 8 output rows:
//                    OUT[t, h] = sum_j WTS[t, j] * (down_e[h] . X[t, j])
//
// A team of RL lanes per weight row (8 teams a workgroup); its lanes stride
// over the row's units, so one load instruction of a team reads 32
// consecutive 16-byte runs of packed values (4-bit: one vec4 a unit, 8-bit:
// two). A row's units start on a 16-byte boundary: the header is 16 bytes
// and a row of k values (k a multiple of the group, so of 32) holds
// k * QBITS / 32 words, a multiple of 4 for QBITS 4 and 8. Lanes are summed
// in workgroup memory (no subgroup operations needed).
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
    // 8-feature (or 8-row) blocks per pair or token
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

var<workgroup> red: array<vec4<f32>, 256>;
var<workgroup> sh_expert: u32;

// Word i of the weight (kernels/affine.wgsl).
fn wword(i: u32) -> u32 {
    return W[i >> 2u][i & 3u];
}

// One unit's packed words and its group's (scale, bias), loaded: for 4 and
// 8 bits whole vec4s (w0, and w1 for 8 bits), so a lane can have several
// units' loads in flight before it decodes any; other widths decode value
// by value from the unit index `u` in `unit_values`.
struct Unit {
    w0: vec4<u32>,
    w1: vec4<u32>,
    sb: vec2<f32>,
    u: u32,
}

// The header's word offsets of the scales and the biases (read once a thread).
fn sb_offsets() -> vec2<u32> {
    let h = W[0];
    return h.xy;
}

// (scale, bias) of group g, the parts at word offsets `o`.
fn unit_sb(g: u32, o: vec2<u32>) -> vec2<f32> {
    let w = word_of(g, WDTYPE);
    return vec2<f32>(decode_as(wword(o.x + w), g, WDTYPE), decode_as(wword(o.y + w), g, WDTYPE));
}

fn load_unit(u: u32, o: vec2<u32>) -> Unit {
    var x: Unit;
    x.u = u;
    x.sb = unit_sb(u / (QGROUP / 32u), o);
    let wb = (QHEAD + u * QBITS) >> 2u;
    if (QBITS == 4u) {
        x.w0 = W[wb];
    } else if (QBITS == 8u) {
        x.w0 = W[wb];
        x.w1 = W[wb + 1u];
    }
    return x;
}

// The 32 dequantised values of a loaded unit (elements 32u .. 32u + 31 of
// the weight), as the CPU reference computes each: scale * q + bias in f32.
fn unit_values(x: Unit) -> array<vec4<f32>, 8> {
    var q: array<vec4<f32>, 8>;
    if (QBITS == 4u) {
        for (var i = 0u; i < 4u; i++) {
            let v = x.w0[i];
            q[2u * i] = vec4<f32>(f32(v & 15u), f32((v >> 4u) & 15u), f32((v >> 8u) & 15u), f32((v >> 12u) & 15u));
            q[2u * i + 1u] = vec4<f32>(f32((v >> 16u) & 15u), f32((v >> 20u) & 15u), f32((v >> 24u) & 15u), f32(v >> 28u));
        }
    } else if (QBITS == 8u) {
        for (var i = 0u; i < 4u; i++) {
            let a = x.w0[i];
            let b = x.w1[i];
            q[i] = vec4<f32>(f32(a & 255u), f32((a >> 8u) & 255u), f32((a >> 16u) & 255u), f32(a >> 24u));
            q[4u + i] = vec4<f32>(f32(b & 255u), f32((b >> 8u) & 255u), f32((b >> 16u) & 255u), f32(b >> 24u));
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
    for (var j = 0u; j < 8u; j++) {
        q[j] = x.sb.x * q[j] + vec4<f32>(x.sb.y);
    }
    return q;
}

// Units a lane has in flight (loaded before any is decoded).
const UF: u32 = 4u;

// Unit u's dot with the 32 values of x from vec4 `xb` on.
fn unit_dot(w: array<vec4<f32>, 8>, xb: u32) -> f32 {
    let a = (dot(w[0], X[xb]) + dot(w[1], X[xb + 1u])) + (dot(w[2], X[xb + 2u]) + dot(w[3], X[xb + 3u]));
    let b = (dot(w[4], X[xb + 4u]) + dot(w[5], X[xb + 5u])) + (dot(w[6], X[xb + 6u]) + dot(w[7], X[xb + 7u]));
    return a + b;
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
    let r = linear_group(wg, nwg) * TEAMS + team;
    // (rows past the chunk read its last row and write nothing: every
    // thread takes part in the barriers)
    let rc = min(r, P.rows - 1u);
    let nu = P.k / 32u;
    let o = sb_offsets();
    var acc: array<f32, 16>;
    for (var u0 = lane; u0 < nu; u0 += UF * RL) {
        var units: array<Unit, UF>;
        for (var f = 0u; f < UF; f++) {
            units[f] = load_unit(rc * nu + min(u0 + f * RL, nu - 1u), o);
        }
        for (var f = 0u; f < UF; f++) {
            let u = u0 + f * RL;
            if (u < nu) {
                let w = unit_values(units[f]);
                for (var i = 0u; i < MT; i++) {
                    acc[i] += unit_dot(w, (i * P.k) / 4u + 8u * u);
                }
            }
        }
    }
    for (var i0 = 0u; i0 < MT; i0 += 4u) {
        red[lid] = vec4<f32>(acc[i0], acc[i0 + 1u], acc[i0 + 2u], acc[i0 + 3u]);
        reduce_team(lid, lane);
        if (lane == 0u && r < P.rows) {
            let v = red[lid];
            for (var q = 0u; q < 4u; q++) {
                if (i0 + q < MT) {
                    OUT[(i0 + q) * P.n + P.row0 + r] = v[q];
                }
            }
        }
        workgroupBarrier();
    }
}

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
    let f = (g % P.nrb) * TEAMS + team;
    let fc = min(f, n - 1u);
    let nu = P.k / 32u;
    let grow = e * 2u * n + fc;
    let xb = ((p / P.top_k) * P.k) / 4u;
    let o = sb_offsets();
    var ag = 0.0;
    var au = 0.0;
    // (UF / 2 units of each row in flight)
    for (var u0 = lane; u0 < nu; u0 += (UF / 2u) * RL) {
        var units: array<Unit, UF>;
        for (var f = 0u; f < UF / 2u; f++) {
            let uc = min(u0 + f * RL, nu - 1u);
            units[2u * f] = load_unit(grow * nu + uc, o);
            units[2u * f + 1u] = load_unit((grow + n) * nu + uc, o);
        }
        for (var f = 0u; f < UF / 2u; f++) {
            let u = u0 + f * RL;
            if (u < nu) {
                ag += unit_dot(unit_values(units[2u * f]), xb + 8u * u);
                au += unit_dot(unit_values(units[2u * f + 1u]), xb + 8u * u);
            }
        }
    }
    red[lid] = vec4<f32>(ag, au, 0.0, 0.0);
    reduce_team(lid, lane);
    if (lane == 0u && f < n) {
        let s = red[lid];
        OUT[p * n + f] = gelu_tanh(s.x) * s.y;
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
    let h = (g % P.nrb) * TEAMS + team;
    let hc = min(h, hidden - 1u);
    let inter = P.k;
    let nu = inter / 32u;
    let o = sb_offsets();
    // The lanes take the row's (expert slot, unit) tasks, UF in flight, so
    // that rows of few units (inter 704: 22) still keep every lane busy.
    let tasks = P.top_k * nu;
    var acc = 0.0;
    for (var t0 = lane; t0 < tasks; t0 += UF * RL) {
        var units: array<Unit, UF>;
        var slot: array<u32, UF>;
        for (var f = 0u; f < UF; f++) {
            let task = min(t0 + f * RL, tasks - 1u);
            let j = task / nu;
            let p = t * P.top_k + j;
            // (an expert id past E selects nothing: the CPU reports it)
            let e = min(IDS[p], P.experts - 1u);
            slot[f] = p;
            units[f] = load_unit((e * hidden + hc) * nu + task % nu, o);
        }
        for (var f = 0u; f < UF; f++) {
            let task = t0 + f * RL;
            let p = slot[f];
            if (task < tasks && IDS[p] < P.experts) {
                let u = task % nu;
                acc += WTS[p] * unit_dot(unit_values(units[f]), (p * inter) / 4u + 8u * u);
            }
        }
    }
    red[lid] = vec4<f32>(acc, 0.0, 0.0, 0.0);
    reduce_team(lid, lane);
    if (lane == 0u && h < hidden) {
        OUT[t * hidden + h] = red[lid].x;
    }
}
