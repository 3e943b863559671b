// Products with MLX affine-quantized weights (kernels/affine.wgsl) for
// decode and micro-batches: every weight row is read once, 32 values (one
// "unit": QBITS whole words, one group's scale and bias) a lane at a time.
//
//   affine_gemv1     matmul, one row of x: OUT[row0 + r] = W[r] . X
//   affine_gemv      matmul, 2 <= m <= 16 (MT rows of x compiled in):
//                    OUT[i, row0 + r] = W[r] . X[i]
//   affine_gate_up   MoE phase 1 for m <= 16 tokens, one workgroup per
//                    (token, slot) pair and 128 / LPR * RPT1 features:
//                    OUT[p, f] = gelu_tanh(gate_e . x_t) * (up_e . x_t)
//   affine_down      MoE phase 2, one workgroup per token and 256 / LPR *
//                    RPT1 output rows:
//                    OUT[t, h] = sum_j WTS[t, j] * (down_e[h] . X[t, j])
//
// A team of RL lanes holds RPT weight rows; its lanes stride over the rows'
// units. A lane reads a unit of x (32 f32, 128 bytes) once for all RPT rows:
// x's reads, not the weights', bound a 4-bit GEMV that reads x once a unit
// and row (8 bytes of x per byte of weights, all from L1). 4-bit units are
// one 16-byte load, 8-bit two; a row's units start on 16 bytes (the header
// is 16 bytes and a row of k values, k a multiple of 32, holds k * QBITS /
// 32 words, a multiple of 4).
//
// The scales' and biases' word offsets come in the parameters (so, bo:
// the host knows them when it records), not from the binding's header, so
// a unit's values and its scale and bias load in one round instead of
// waiting on the header. The one-row entries (affine_gemv1, and both MoE
// phases) hold RPT1 rows a team of LPR lanes, their sums in named vec4
// registers (never arrays indexed in loops, which the NVIDIA driver keeps
// in local memory), and take the units of a row (KU) compiled in: a lane's
// loop then has a constant trip count and the driver issues all of its
// loads before the first returns (as kernels/gemv.wgsl does).
//
// Bindings (shared by the entries; unused ones get a read-only stand-in):
// 0 W, 1 X (x rows or activations), 2 IDS, 3 WTS, 4 OUT. The pair build
// (kernels/affine_pair.wgsl) runs both MoE phases over two problems in
// one launch.

// One problem's sizes: a GEMV chunk's, or an MoE phase's.
struct Prob {
    // affine_gemv: the output row stride; the MoE phases: inter
    n: u32,
    // the reduced dimension (a multiple of 32)
    k: u32,
    top_k: u32,
    experts: u32,
    // workgroups per pair (phase 1) or token (phase 2)
    nrb: u32,
    // word offsets of the scales and the biases in W (its header's words)
    so: u32,
    bo: u32,
    _p: u32,
}

struct Params {
    // rows of x (affine_gemv) or tokens
    m: u32,
    // affine_gemv: this chunk's weight rows; the MoE phases: hidden
    rows: u32,
    // affine_gemv: the chunk's first output feature
    row0: u32,
    // the pair entries (affine_gemv_pair): workgroups of the first problem
    groups_a: u32,
    a: Prob,
    // the pair entries' second problem (its bindings at 5-9)
    b: Prob,
    // affine_gate_up_pair_slotted: the experts the router ranks (the slot
    // table's length; b.experts is then the slot stack's), and where its
    // log begins
    ranked: u32,
    log_at: u32,
    _q0: u32,
    _q1: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(1) @binding(0) var<storage, read> W: array<vec4<u32>>;
@group(1) @binding(1) var<storage, read> X: array<vec4<f32>>;
@group(1) @binding(2) var<storage, read> IDS: array<u32>;
@group(1) @binding(3) var<storage, read> WTS: array<f32>;
@group(1) @binding(4) var<storage, read_write> OUT: array<f32>;

// Rows of x of affine_gemv (2 ..= 16).
override MT: u32 = 1u;
// Units (32 values) in a row of the reduced dimension, compiled into the
// one-row entries (0: k / 32 at run time).
override KU: u32 = 0u;

const RL: u32 = 32u;
const TEAMS: u32 = 8u;
// Lanes of a team of the one-row entries (32 to 256, compiled in; a
// workgroup holds 256 / LPR teams): more lanes a team where a weight has
// few rows, so that every SM still runs many warps and each lane's serial
// work is short.
override LPR: u32 = 32u;
// Weight rows a team holds in affine_gemv (4), and in the one-row entries
// (1, 2 or 4, compiled in: fewer rows a team where a weight has too few
// rows to give every SM several teams of 4; affine_gate_up holds RPT1 / 2
// features' gate and up rows).
const RPT: u32 = 4u;
override RPT1: u32 = 4u;

var<workgroup> red: array<vec4<f32>, 256>;
var<workgroup> sh_expert: u32;

// The bindings are read and written only through these accessors: the
// pair build (affine_gemv_pair, kernels/affine_pair.wgsl) renames them and
// reads the second problem's bindings in its workgroups, the bodies below
// written once for both.

// Word i of the weight (kernels/affine.wgsl).
fn wword(i: u32) -> u32 {
    return W[i >> 2u][i & 3u];
}

fn wvec(i: u32) -> vec4<u32> {
    return W[i];
}

fn xvec(i: u32) -> vec4<f32> {
    return X[i];
}

fn id_at(i: u32) -> u32 {
    return IDS[i];
}

fn wt_at(i: u32) -> f32 {
    return WTS[i];
}

fn out_set(i: u32, v: f32) {
    OUT[i] = v;
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
        x.w0 = wvec(wb);
    } else if (QBITS == 8u) {
        x.w0 = wvec(wb);
        x.w1 = wvec(wb + 1u);
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

const BYTES: vec4<u32> = vec4<u32>(0u, 8u, 16u, 24u);
// A word's four low nibbles in place (nibble j times 16^j, at most
// 61440: exact through small_to_f32), and the powers that undo the places.
const NIBBLE_MASKS: vec4<u32> = vec4<u32>(0xfu, 0xf0u, 0xf00u, 0xf000u);
const NIBBLE_PLACES: vec4<f32> = vec4<f32>(1.0, 0.0625, 0.00390625, 0.000244140625);

// The 32 unsigned values of a loaded unit of 8 or fewer bits but 4
// (elements 32u .. 32u + 31 of the weight), as f32.
fn unit_q(x: Unit) -> array<vec4<f32>, 8> {
    var q: array<vec4<f32>, 8>;
    if (QBITS == 8u) {
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
        x.v[j] = xvec(xb + j);
        s += x.v[j];
    }
    x.sum = (s.x + s.y) + (s.z + s.w);
    return x;
}

// q . x of a loaded unit's unsigned values.
fn unit_qdot(w: Unit, x: XUnit) -> f32 {
    if (QBITS == 4u) {
        // Each word's nibbles masked in place, not shifted down (one
        // and-or a value instead of a shift besides), the places undone
        // once a unit: a[j] sums nibble j and j + 4 of each word, times 16^j.
        var a = vec4<f32>(0.0);
        for (var i = 0u; i < 4u; i++) {
            let v = w.w0[i];
            a = fma(small_to_f32(vec4<u32>(v) & NIBBLE_MASKS), x.v[2u * i], a);
            a = fma(small_to_f32(vec4<u32>(v >> 16u) & NIBBLE_MASKS), x.v[2u * i + 1u], a);
        }
        return dot(a, NIBBLE_PLACES);
    }
    let q = unit_q(w);
    let a = (dot(q[0], x.v[0]) + dot(q[1], x.v[1])) + (dot(q[2], x.v[2]) + dot(q[3], x.v[3]));
    let b = (dot(q[4], x.v[4]) + dot(q[5], x.v[5])) + (dot(q[6], x.v[6]) + dot(q[7], x.v[7]));
    return a + b;
}

// A loaded unit's 32 values as its dot takes them: for 4 bits each word's
// nibbles masked in place (unit_qdot's), else unit_q's. Decoded once, they
// serve every row of x (affine_gemv).
fn unit_vals(w: Unit) -> array<vec4<f32>, 8> {
    if (QBITS == 4u) {
        var d: array<vec4<f32>, 8>;
        for (var i = 0u; i < 4u; i++) {
            let v = w.w0[i];
            d[2u * i] = small_to_f32(vec4<u32>(v) & NIBBLE_MASKS);
            d[2u * i + 1u] = small_to_f32(vec4<u32>(v >> 16u) & NIBBLE_MASKS);
        }
        return d;
    }
    return unit_q(w);
}

// unit_dot of a unit decoded by unit_vals: the same sums in the same order.
fn vals_dot(w: Unit, d: array<vec4<f32>, 8>, x: XUnit) -> f32 {
    var q: f32;
    if (QBITS == 4u) {
        var a = vec4<f32>(0.0);
        for (var j = 0u; j < 8u; j++) {
            a = fma(d[j], x.v[j], a);
        }
        q = dot(a, NIBBLE_PLACES);
    } else {
        let a = (dot(d[0], x.v[0]) + dot(d[1], x.v[1])) + (dot(d[2], x.v[2]) + dot(d[3], x.v[3]));
        let b = (dot(d[4], x.v[4]) + dot(d[5], x.v[5])) + (dot(d[6], x.v[6]) + dot(d[7], x.v[7]));
        q = a + b;
    }
    return fma(w.sb.x, q, w.sb.y * x.sum);
}

// A loaded unit's weights dotted with x: scale * (q . x) + bias * sum(x),
// the dot of the dequantised weights (scale * q + bias) with its terms
// grouped, so that x's sum serves every row.
fn unit_dot(w: Unit, x: XUnit) -> f32 {
    return fma(w.sb.x, unit_qdot(w, x), w.sb.y * x.sum);
}

// Unit `u` of four weight rows (their first units at b.x .. b.w) dotted
// with the unit of x at vec4 `xb + 8u`, the parts at word offsets `o`:
// every load issued before any decode.
fn dots4(b: vec4<u32>, u: u32, xb: u32, o: vec2<u32>) -> vec4<f32> {
    // (rows past RPT1 are neither loaded nor summed)
    let w0 = load_unit(b.x + u, o);
    var w1: Unit;
    var w2: Unit;
    var w3: Unit;
    if (RPT1 > 1u) {
        w1 = load_unit(b.y + u, o);
    }
    if (RPT1 > 2u) {
        w2 = load_unit(b.z + u, o);
        w3 = load_unit(b.w + u, o);
    }
    let x = load_x(xb + 8u * u);
    var d = vec4<f32>(unit_dot(w0, x), 0.0, 0.0, 0.0);
    if (RPT1 > 1u) {
        d.y = unit_dot(w1, x);
    }
    if (RPT1 > 2u) {
        d.z = unit_dot(w2, x);
        d.w = unit_dot(w3, x);
    }
    return d;
}

// The parts' word offsets of problem q, from the parameters.
fn offsets(q: Prob) -> vec2<u32> {
    return vec2<u32>(q.so, q.bo);
}

// The units of a row of problem q: `ku` (a compiled-in KU), else from q.k.
fn row_units(q: Prob, ku: u32) -> u32 {
    return select(q.k / 32u, ku, ku > 0u);
}

// A lane's sum of four rows' dots with x over units lane, lane + LPR, ...
// of rows of `nu` units (b: the rows' first units; `ku`: nu compiled in,
// or 0). The callers pass override constants as `ku`, so each inlined
// copy has a constant trip count.
fn lane_dots4(q: Prob, b: vec4<u32>, lane: u32, nu: u32, xb: u32, ku: u32) -> vec4<f32> {
    let o = offsets(q);
    var acc = vec4<f32>(0.0);
    if (ku > 0u) {
        // a constant trip count; a lane's step past the row rereads the
        // row's last unit, dropped by the select (no branch between loads)
        let last = max(ku, 1u) - 1u;
        for (var s = 0u; s < (ku + LPR - 1u) / LPR; s++) {
            let u = lane + s * LPR;
            acc += select(vec4<f32>(0.0), dots4(b, min(u, last), xb, o), u < ku);
        }
    } else {
        for (var u = lane; u < nu; u += LPR) {
            acc += dots4(b, u, xb, o);
        }
    }
    return acc;
}

// The team's sums of its lanes' vec4s (each lane's in red[lid], a barrier
// passed): component c of lanes t0 .. t0 + LPR.
fn team_col(t0: u32, c: u32) -> f32 {
    var s = vec4<f32>(0.0);
    for (var j = 0u; j < LPR; j += 4u) {
        s += vec4<f32>(red[t0 + j][c], red[t0 + j + 1u][c], red[t0 + j + 2u][c], red[t0 + j + 3u][c]);
    }
    return (s.x + s.y) + (s.z + s.w);
}

@compute @workgroup_size(256)
fn affine_gemv1(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let team = lid / LPR;
    let lane = lid % LPR;
    let r0 = (linear_group(wg, nwg) * (256u / LPR) + team) * RPT1;
    let nu = row_units(P.a, KU);
    // (rows past the chunk read its last row and write nothing: every
    // thread takes part in the barrier)
    let b = min(vec4<u32>(r0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(P.rows - 1u)) * nu;
    red[lid] = lane_dots4(P.a, b, lane, nu, 0u, KU);
    workgroupBarrier();
    if (lane < RPT1 && r0 + lane < P.rows) {
        out_set(P.row0 + r0 + lane, team_col(lid - lane, lane));
    }
}

@compute @workgroup_size(256)
fn affine_gemv(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let team = lid / RL;
    let lane = lid % RL;
    let r0 = (linear_group(wg, nwg) * TEAMS + team) * RPT;
    let nu = P.a.k / 32u;
    let o = offsets(P.a);
    // acc[r * MT + i]: row r0 + r, row i of x
    var acc: array<f32, 64>;
    for (var u = lane; u < nu; u += RL) {
        var w: array<Unit, RPT>;
        for (var r = 0u; r < RPT; r++) {
            // (rows past the chunk read its last row and write nothing:
            // every thread takes part in the barriers)
            w[r] = load_unit(min(r0 + r, P.rows - 1u) * nu + u, o);
        }
        // Each unit decoded once for all MT rows of x, not once a row.
        var d: array<array<vec4<f32>, 8>, RPT>;
        for (var r = 0u; r < RPT; r++) {
            d[r] = unit_vals(w[r]);
        }
        for (var i = 0u; i < MT; i++) {
            let x = load_x((i * P.a.k) / 4u + 8u * u);
            for (var r = 0u; r < RPT; r++) {
                acc[r * MT + i] += vals_dot(w[r], d[r], x);
            }
        }
    }
    // Four sums a round: each lane's four accumulators published, then lane
    // q of a team adds component q over the team's lanes (team_col: this
    // entry's LPR is RL; two barriers a round, where a tree over the lanes
    // took six).
    for (var a0 = 0u; a0 < RPT * MT; a0 += 4u) {
        red[lid] = vec4<f32>(acc[a0], acc[a0 + 1u], acc[a0 + 2u], acc[a0 + 3u]);
        workgroupBarrier();
        let a = a0 + lane;
        let row = r0 + a / MT;
        if (lane < 4u && a < RPT * MT && row < P.rows) {
            out_set((a % MT) * P.a.n + P.row0 + row, team_col(lid - lane, lane));
        }
        workgroupBarrier();
    }
}

// Phase 1 of problem q for workgroup g of its grid, pair p = g / q.nrb
// (its expert e, read by the caller as a workgroup-uniform value; none
// past q.experts): its features' gate and up rows.
fn gate_up_body(q: Prob, g: u32, e: u32, lid: u32) {
    let p = g / q.nrb;
    // An expert id past E selects nothing (the CPU reports it).
    if (e >= q.experts) {
        return;
    }
    let team = lid / LPR;
    let lane = lid % LPR;
    let n = q.n;
    // features a team computes (a gate and an up row each)
    let fpt = max(RPT1 / 2u, 1u);
    let f0 = ((g % q.nrb) * (256u / LPR) + team) * fpt;
    // (both problems of a pair reduce over hidden: one KU)
    let nu = row_units(q, KU);
    // rows: feature f0's gate and up, f0 + 1's gate and up
    let ga = e * 2u * n + min(f0, n - 1u);
    let gb = e * 2u * n + min(f0 + 1u, n - 1u);
    let b = vec4<u32>(ga, ga + n, gb, gb + n) * nu;
    red[lid] = lane_dots4(q, b, lane, nu, ((p / q.top_k) * q.k) / 4u, KU);
    workgroupBarrier();
    if (lane < fpt && f0 + lane < n) {
        let t0 = lid - lane;
        out_set(p * n + f0 + lane, gelu_tanh(team_col(t0, 2u * lane)) * team_col(t0, 2u * lane + 1u));
    }
}

// Phase 1's expert of workgroup g of problem q, from its ids (past the
// pairs: q.experts, nothing), as a workgroup-uniform value.
fn gate_up_expert(q: Prob, g: u32, lid: u32) -> u32 {
    let p = g / q.nrb;
    if (lid == 0u) {
        sh_expert = q.experts;
        if (p < P.m * q.top_k) {
            sh_expert = id_at(p);
        }
    }
    return workgroupUniformLoad(&sh_expert);
}

@compute @workgroup_size(256)
fn affine_gate_up(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
    let g = linear_group(wg, nwg);
    gate_up_body(P.a, g, gate_up_expert(P.a, g, lid), lid);
}

// Top-k slots of affine_down, compiled in with KU (0: q.top_k at run time).
override TOPK: u32 = 0u;

// A lane's share of a token's down rows (first rows hb: h0 .. h0 + 3
// clamped) over the (expert slot, unit) tasks lane, lane + LPR, ... of `tasks`.
fn down_task(q: Prob, t: u32, task: u32, nu: u32, hb: vec4<u32>) -> vec4<f32> {
    let p = t * q.top_k + task / nu;
    let u = task % nu;
    // (an expert id past E selects nothing: the CPU reports it; its rows
    // are read as expert 0's, the product dropped)
    let e = id_at(p);
    let ok = e < q.experts;
    let b = (select(0u, e, ok) * P.rows + hb) * nu;
    let d = dots4(b, u, (p * q.k) / 4u, offsets(q));
    return select(vec4<f32>(0.0), wt_at(p) * d, ok);
}

// Phase 2 of problem q for workgroup g of its grid (`ku`, `topk`: its KU
// and TOPK compiled in, or 0).
fn down_body(q: Prob, g: u32, lid: u32, ku: u32, topk: u32) {
    let t = g / q.nrb;
    if (t >= P.m) {
        return;
    }
    let team = lid / LPR;
    let lane = lid % LPR;
    let hidden = P.rows;
    let h0 = ((g % q.nrb) * (256u / LPR) + team) * RPT1;
    let hb = min(vec4<u32>(h0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(hidden - 1u));
    let nu = row_units(q, ku);
    // The lanes take the rows' (expert slot, unit) tasks, so that rows of
    // few units (inter 704: 22) still keep every lane busy.
    var acc = vec4<f32>(0.0);
    if (ku > 0u && topk > 0u) {
        let tasks = topk * ku;
        let last = max(tasks, 1u) - 1u;
        for (var s = 0u; s < (tasks + LPR - 1u) / LPR; s++) {
            let task = lane + s * LPR;
            acc += select(vec4<f32>(0.0), down_task(q, t, min(task, last), nu, hb), task < tasks);
        }
    } else {
        for (var task = lane; task < q.top_k * nu; task += LPR) {
            acc += down_task(q, t, task, nu, hb);
        }
    }
    red[lid] = acc;
    workgroupBarrier();
    if (lane < RPT1 && h0 + lane < hidden) {
        out_set(t * hidden + h0 + lane, team_col(lid - lane, lane));
    }
}

@compute @workgroup_size(256)
fn affine_down(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    down_body(P.a, linear_group(wg, nwg), lid, KU, TOPK);
}
