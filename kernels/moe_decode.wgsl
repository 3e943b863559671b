// MoE expert GEMVs for decode (m = 1) with 16-bit weights: the bandwidth-bound
// fast path of kernels/moe.wgsl, laid out like kernels/gemv.wgsl. Each weight
// row is read by LANES threads as vec4<u32> (8 weights, 16 bytes) per load,
// consecutive threads on consecutive 16-byte blocks, with plain scalar
// accumulators (no dynamically indexed arrays that could spill); 256 / LANES
// weight rows per 256-thread workgroup, reduced in workgroup memory (no
// subgroup operations).
//
//   moe_gate_up_decode  ACT[j, i] = gelu_tanh(gate_e . x) * (up_e . x), e = IDS[j]
//                       (hidden a multiple of 8: rows start on 16-byte boundaries)
//   moe_down_decode     OUT[t, r] = sum_j WTS[t, j] * (down_e[r, :] . ACT[t, j]),
//                       e = IDS[t, j], for each of P.m tokens (decode: 1; a
//                       prefill batches up to 16) (inter a multiple of 8).
//
// An expert id past P.experts selects nothing, as in kernels/moe.wgsl: phase 1
// leaves its activation row untouched and phase 2 adds nothing for the slot
// (it reads expert 0's row in the flat loop and drops it by a select).
//
// Bindings: 0 IDS, 1 W (weights), 2 A (x or act), 3 WTS, 4 OUT (act or out).
//
// Pairs (moe_gate_up_pair_decode, moe_down_pair_decode): two independent
// problems in one launch, the second one's bindings at 5-9 in the same order
// and its sizes in the `*2` parameters; workgroups below P.groups_a take the
// first problem. Decode runs the dense MLP (a one-expert MoE) beside the
// routed experts this way: one launch instead of two, and the small dense
// problem fills the GPU while the experts' workgroups drain. WGSL cannot
// pass a storage binding to a function, so each phase's body is written
// once per binding set (`_a` / `_b`), the same code on different names.

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
    // the second problem of a pair launch
    inter2: u32,
    experts2: u32,
    top_k2: u32,
    nrb2: u32,
    groups_a: u32,
    // moe_gate_up_pair_slotted: the experts the router ranks (the slot
    // table's length; experts2 is then the slot stack's), and where its
    // log begins
    ranked: u32,
    log_at: u32,
    _p2: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(1) @binding(0) var<storage, read> IDS: array<u32>;
@group(1) @binding(1) var<storage, read> W: array<vec4<u32>>;
@group(1) @binding(2) var<storage, read> A: array<vec4<f32>>;
@group(1) @binding(3) var<storage, read> WTS: array<f32>;
@group(1) @binding(4) var<storage, read_write> OUT: array<f32>;
@group(1) @binding(5) var<storage, read> IDS2: array<u32>;
@group(1) @binding(6) var<storage, read> W2: array<vec4<u32>>;
@group(1) @binding(7) var<storage, read> A2: array<vec4<f32>>;
@group(1) @binding(8) var<storage, read> WTS2: array<f32>;
@group(1) @binding(9) var<storage, read_write> OUT2: array<f32>;

// Threads per weight row (a power of two, 32 to 128, compiled in; the
// launcher's choice per phase is in backends/wgpu/src/ops/moe.rs): weight
// rows per workgroup ROWS, activation rows per gate_up workgroup PAIRS.
override LANES: u32 = 32u;
override ROWS: u32 = 256u / LANES;
override PAIRS: u32 = 128u / LANES;
var<workgroup> part_a: array<f32, 256>;

// Eight weights (one 16-byte block) dotted with the 8 activations starting at
// vec4 index `xi` of A (dot8b: of A2).
fn dot8(w: vec4<u32>, xi: u32) -> f32 {
    return dot8_with(w, A[xi], A[xi + 1u]);
}

fn dot8b(w: vec4<u32>, xi: u32) -> f32 {
    return dot8_with(w, A2[xi], A2[xi + 1u]);
}

fn dot8_with(w: vec4<u32>, x0: vec4<f32>, x1: vec4<f32>) -> f32 {
    let a = decode_pair(w.x);
    let b = decode_pair(w.y);
    let c = decode_pair(w.z);
    let d = decode_pair(w.w);
    return dot(vec4<f32>(a, b), x0) + dot(vec4<f32>(c, d), x1);
}

// Sum part_a over the LANES lanes of each row (into lane 0).
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
// inter / 8 for down -- and the expert count per token (down only), compiled
// in: every lane's loop has a constant trip count, so the driver can issue
// all of a lane's loads before the first one returns. BK2 / TOPK2: the
// second problem of a down pair (a gate_up pair shares BK: same hidden).
override BK: u32 = 352u;
// 1: the first (A) or second (B) problem's weights are in tile order
// (common.wgsl's expert_row; a pair's dense MLP keeps row-major).
override TILED_A: u32 = 0u;
override TILED_B: u32 = 0u;
override TOPK: u32 = 8u;
override BK2: u32 = 352u;
override TOPK2: u32 = 8u;
const MAXK: u32 = 16u;
var<workgroup> sid: array<u32, MAXK>;
var<workgroup> swt: array<f32, MAXK>;

// Workgroup g: slot j = g / nrb, activation rows i0 = (g % nrb) * PAIRS ..
// + PAIRS. Each LANES threads take one weight row: threads 0-127 the gate
// rows i0.., 128-255 the up rows i0.. (one row per lane team rather than a
// gate and an up row each: twice the lanes, each with half the loads in
// turn; on the H200 this is 3x faster at top-8 of 128, see BENCHMARKS.md).

// ---- tile-ordered experts (TILED_A / TILED_B: common.wgsl's expert_row) ----
// A workgroup reads its rows' pieces of each 16-wide chunk of k, which lie
// together in the tile order, as runs: phase 1 takes its PAIRS features'
// gate rows then their up rows (4 PAIRS threads a chunk, 256 / (4 PAIRS)
// chunks a round), phase 2 TROWS output rows of one block across every
// slot's chunks (2 TROWS threads a (slot, chunk) piece, 256 / (2 TROWS)
// pieces a round). Re-indexing the row-major bodies instead, so that two
// lanes share a 32-byte piece and the next pair reads 2 KB further on, was
// 18% / 15% slower on the H200 (2026-12-01 at a94f43a, run 08); kernel_lab's
// moe_tiled (its first form, since replaced) measured this layout of the
// work at the row-major kernels' speed (runs 05-07).

// Output rows of a tiled phase-2 workgroup (the launcher's
// TILED_DOWN_ROWS).
const TROWS: u32 = 4u;
var<workgroup> trow: array<f32, 32>;

// Phase 1 of slot j (expert e; none past P.experts) for features f0 ..
// f0 + PAIRS, tile-ordered: ACT[j, f] = gelu(gate . x) * (up . x).
fn gate_up_tiled_a(j: u32, f0: u32, e: u32, t: u32) {
    let n = P.inter;
    let valid = e < P.experts;
    let per = 4u * PAIRS;
    let nch = BK / 2u;
    // this thread's row (gate rows first, then the up rows) and half
    let q = (t % per) / 2u;
    let r = select(0u, n, q >= PAIRS) + f0 + q % PAIRS;
    let base = expert_row(select(0u, e, valid) * 2u * n * BK, r, BK, true, true, n);
    let h = t % 2u;
    var acc = 0.0;
    for (var i = 0u; i < (nch + 256u / per - 1u) / (256u / per); i++) {
        let c = t / per + (256u / per) * i;
        let v = 2u * min(c, nch - 1u) + h;
        acc += select(0.0, dot8(W[base + expert_step(v, true)], 2u * v), c < nch && valid);
    }
    part_a[t] = acc;
    tiled_rows_out(t, 2u * PAIRS);
    if (t < PAIRS && valid && f0 + t < n) {
        OUT[j * n + f0 + t] = gelu_tanh(trow[t]) * trow[t + PAIRS];
    }
}

// gate_up_tiled_a on the second binding set.
fn gate_up_tiled_b(j: u32, f0: u32, e: u32, t: u32) {
    let n = P.inter2;
    let valid = e < P.experts2;
    let per = 4u * PAIRS;
    let nch = BK / 2u;
    let q = (t % per) / 2u;
    let r = select(0u, n, q >= PAIRS) + f0 + q % PAIRS;
    let base = expert_row(select(0u, e, valid) * 2u * n * BK, r, BK, true, true, n);
    let h = t % 2u;
    var acc = 0.0;
    for (var i = 0u; i < (nch + 256u / per - 1u) / (256u / per); i++) {
        let c = t / per + (256u / per) * i;
        let v = 2u * min(c, nch - 1u) + h;
        acc += select(0.0, dot8b(W2[base + expert_step(v, true)], 2u * v), c < nch && valid);
    }
    part_a[t] = acc;
    tiled_rows_out(t, 2u * PAIRS);
    if (t < PAIRS && valid && f0 + t < n) {
        OUT2[j * n + f0 + t] = gelu_tanh(trow[t]) * trow[t + PAIRS];
    }
}

// The sums of a tiled body's `rows` rows (per = 2 rows threads a round:
// row q's partials at k per + 2 q and + 1) from part_a into trow.
fn tiled_rows_out(t: u32, rows: u32) {
    let per = 2u * rows;
    workgroupBarrier();
    if (t < rows) {
        var s = 0.0;
        for (var k = 0u; k < 256u / per; k++) {
            s += part_a[k * per + 2u * t] + part_a[k * per + 2u * t + 1u];
        }
        trow[t] = s;
    }
    workgroupBarrier();
}

// Phase 2 of token tok, output rows g * TROWS .., tile-ordered (sid / swt
// hold the token's slots).
fn down_tiled_a(g: u32, t: u32, tok: u32) {
    let h = P.hidden;
    let r0 = g * TROWS;
    let nch = BK / 2u;
    let per = 2u * TROWS;
    let units = TOPK * nch;
    let r = min(r0 + (t % per) / 2u, h - 1u);
    let half = t % 2u;
    let arow = P.inter / 4u;
    let a0 = tok * TOPK * arow;
    var acc = 0.0;
    for (var i = 0u; i < (units + 256u / per - 1u) / (256u / per); i++) {
        let u = t / per + (256u / per) * i;
        let uc = min(u, units - 1u);
        let j = uc / nch;
        let v = 2u * (uc % nch) + half;
        let e = sid[j];
        let valid = e < P.experts && u < units;
        let w = W[expert_row(select(0u, e, valid) * h * BK, r, BK, true, false, 0u) + expert_step(v, true)];
        acc += select(0.0, swt[j] * dot8(w, a0 + j * arow + 2u * v), valid);
    }
    part_a[t] = acc;
    tiled_rows_out(t, TROWS);
    if (t < TROWS && r0 + t < h) {
        OUT[tok * h + r0 + t] = trow[t];
    }
}

// down_tiled_a on the second binding set (one token).
fn down_tiled_b(g: u32, t: u32) {
    let h = P.hidden;
    let r0 = g * TROWS;
    let nch = BK2 / 2u;
    let per = 2u * TROWS;
    let units = TOPK2 * nch;
    let r = min(r0 + (t % per) / 2u, h - 1u);
    let half = t % 2u;
    let arow = P.inter2 / 4u;
    var acc = 0.0;
    for (var i = 0u; i < (units + 256u / per - 1u) / (256u / per); i++) {
        let u = t / per + (256u / per) * i;
        let uc = min(u, units - 1u);
        let j = uc / nch;
        let v = 2u * (uc % nch) + half;
        let e = sid[j];
        let valid = e < P.experts2 && u < units;
        let w = W2[expert_row(select(0u, e, valid) * h * BK2, r, BK2, true, false, 0u) + expert_step(v, true)];
        acc += select(0.0, swt[j] * dot8b(w, j * arow + 2u * v), valid);
    }
    part_a[t] = acc;
    tiled_rows_out(t, TROWS);
    if (t < TROWS && r0 + t < h) {
        OUT2[r0 + t] = trow[t];
    }
}

// Thread t's role in workgroup g of a gate_up problem with nrb workgroups
// per slot: slot j, activation rows i0 .. i0 + PAIRS, its own weight row
// (`i`, gate or `up`) and lane.
struct GateUpRole {
    j: u32,
    i0: u32,
    i: u32,
    up: u32,
    lane: u32,
}

fn gate_up_role(g: u32, t: u32, nrb: u32) -> GateUpRole {
    let s = t / LANES;
    let i0 = (g % nrb) * PAIRS;
    return GateUpRole(g / nrb, i0, i0 + s % PAIRS, s / PAIRS, t % LANES);
}

fn gate_up_a(g: u32, t: u32) {
    let q = gate_up_role(g, t, P.nrb);
    let n = P.inter;
    if (TILED_A == 1u) {
        var e = P.experts;
        if (q.j < P.top_k) {
            e = IDS[q.j];
        }
        gate_up_tiled_a(q.j, q.i0, e, t);
        return;
    }
    var valid = false;
    if (q.j < P.top_k) {
        valid = IDS[q.j] < P.experts;
    }
    var acc = 0.0;
    if (valid && q.i < n) {
        let base = (IDS[q.j] * 2u * n + q.up * n + q.i) * BK;
        for (var c = 0u; c < (BK + LANES - 1u) / LANES; c++) {
            let b = q.lane + c * LANES;
            let bb = min(b, BK - 1u);
            acc += select(0.0, dot8(W[base + bb], 2u * bb), b < BK);
        }
    }
    part_a[t] = acc;
    reduce_lanes(t, q.lane);
    // Thread t < PAIRS writes activation row i0 + t (valid is the slot's, the
    // same for every thread).
    if (t < PAIRS && valid && q.i0 + t < n) {
        OUT[q.j * n + q.i0 + t] = gelu_tanh(part_a[t * LANES]) * part_a[(t + PAIRS) * LANES];
    }
}

// gate_up_a on the second binding set.
fn gate_up_b(g: u32, t: u32) {
    let q = gate_up_role(g, t, P.nrb2);
    var e = P.experts2;
    if (q.j < P.top_k2) {
        e = IDS2[q.j];
    }
    gate_up_b_expert(q, e, t);
}

// The second problem's workgroup with role q on expert e (none past
// P.experts2).
fn gate_up_b_expert(q: GateUpRole, e: u32, t: u32) {
    if (TILED_B == 1u) {
        gate_up_tiled_b(q.j, q.i0, e, t);
        return;
    }
    let n = P.inter2;
    let valid = e < P.experts2;
    var acc = 0.0;
    if (valid && q.i < n) {
        let base = (e * 2u * n + q.up * n + q.i) * BK;
        for (var c = 0u; c < (BK + LANES - 1u) / LANES; c++) {
            let b = q.lane + c * LANES;
            let bb = min(b, BK - 1u);
            acc += select(0.0, dot8b(W2[base + bb], 2u * bb), b < BK);
        }
    }
    part_a[t] = acc;
    reduce_lanes(t, q.lane);
    if (t < PAIRS && valid && q.i0 + t < n) {
        OUT2[q.j * n + q.i0 + t] = gelu_tanh(part_a[t * LANES]) * part_a[(t + PAIRS) * LANES];
    }
}

@compute @workgroup_size(256)
fn moe_gate_up_decode(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                      @builtin(local_invocation_index) t: u32) {
    gate_up_a(linear_group(wg, nwg), t);
}

@compute @workgroup_size(256)
fn moe_gate_up_pair_decode(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                           @builtin(local_invocation_index) t: u32) {
    let g = linear_group(wg, nwg);
    if (g < P.groups_a) {
        gate_up_a(g, t);
    } else {
        gate_up_b(g - P.groups_a, t);
    }
}

// Workgroup g: output rows g * ROWS .. + ROWS, one row per LANES threads.
// The slots' expert ids and weights are read once into workgroup memory; a
// lane then walks the row's TOPK x BK blocks (every slot's down row) as one
// flat range, block f = lane + c * LANES being slot f / BK's block f % BK:
// a constant trip count of independent loads with no branch between them,
// so the driver issues them all before the first returns. (A loop over
// slots, each behind an `if` on its expert id, left each slot's loads
// waiting for the previous slot's: eight memory round trips in series.)
// An absent slot (id past P.experts) reads expert 0's row and drops it by a
// select, as does the range's padding past TOPK x BK. The sum per lane is
// in a fixed order: deterministic, no atomics.
fn down_a(g: u32, t: u32, tok: u32) {
    if (t < TOPK) {
        sid[t] = IDS[tok * TOPK + t];
        swt[t] = WTS[tok * TOPK + t];
    }
    workgroupBarrier();
    if (TILED_A == 1u) {
        down_tiled_a(g, t, tok);
        return;
    }
    let lane = t % LANES;
    let r = g * ROWS + t / LANES;
    let h = P.hidden;
    let arow = P.inter / 4u;
    let a0 = tok * TOPK * arow;
    var acc = 0.0;
    if (r < h) {
        for (var c = 0u; c < (TOPK * BK + LANES - 1u) / LANES; c++) {
            let f = min(lane + c * LANES, TOPK * BK - 1u);
            let j = f / BK;
            let b = f % BK;
            let e = sid[j];
            let valid = e < P.experts && lane + c * LANES < TOPK * BK;
            let w = W[(select(0u, e, valid) * h + r) * BK + b];
            acc += select(0.0, swt[j] * dot8(w, a0 + j * arow + 2u * b), valid);
        }
    }
    part_a[t] = acc;
    reduce_lanes(t, lane);
    if (lane == 0u && r < h) {
        OUT[tok * h + r] = part_a[t];
    }
}

// down_a on the second binding set (its BK2, TOPK2).
fn down_b(g: u32, t: u32) {
    if (t < TOPK2) {
        sid[t] = IDS2[t];
        swt[t] = WTS2[t];
    }
    workgroupBarrier();
    if (TILED_B == 1u) {
        down_tiled_b(g, t);
        return;
    }
    let lane = t % LANES;
    let r = g * ROWS + t / LANES;
    let h = P.hidden;
    let arow = P.inter2 / 4u;
    var acc = 0.0;
    if (r < h) {
        for (var c = 0u; c < (TOPK2 * BK2 + LANES - 1u) / LANES; c++) {
            let f = min(lane + c * LANES, TOPK2 * BK2 - 1u);
            let j = f / BK2;
            let b = f % BK2;
            let e = sid[j];
            let valid = e < P.experts2 && lane + c * LANES < TOPK2 * BK2;
            let w = W2[(select(0u, e, valid) * h + r) * BK2 + b];
            acc += select(0.0, swt[j] * dot8b(w, j * arow + 2u * b), valid);
        }
    }
    part_a[t] = acc;
    reduce_lanes(t, lane);
    if (lane == 0u && r < h) {
        OUT2[r] = part_a[t];
    }
}

// Workgroup g: token g / per, its output rows (g % per) * rows .. + rows
// (rows: ROWS, or TROWS on tile-ordered experts; per = ceil(hidden / rows)). Prefill batches of m <= 16 take this too: each
// token reads its own k experts' rows, which on the H200 beats the route-list
// kernel of kernels/moe.wgsl that reads each expert once for all its tokens
// (moe_down M = 16: 1.03 ms there).
@compute @workgroup_size(256)
fn moe_down_decode(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) t: u32) {
    let g = linear_group(wg, nwg);
    let rows = select(ROWS, TROWS, TILED_A == 1u);
    let per = (P.hidden + rows - 1u) / rows;
    let tok = g / per;
    if (tok < P.m) {
        down_a(g % per, t, tok);
    }
}

@compute @workgroup_size(256)
fn moe_down_pair_decode(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                        @builtin(local_invocation_index) t: u32) {
    let g = linear_group(wg, nwg);
    if (g < P.groups_a) {
        down_a(g, t, 0u);
    } else {
        down_b(g - P.groups_a, t);
    }
}

// ---- moe_gate_up_pair_routed: the pair, routed from the router's logits ----
//
// moe_gate_up_pair_decode with the second problem's experts picked in the
// launch: each of its workgroups ranks the token's scaled logits RLOG
// (post_attention_logits, kernels/fused.wgsl) itself (kernels/topk.wgsl,
// as router_topk does), and its first workgroup writes the routing (RIDS,
// RWTS: softmax times RPES) for phase 2. One dependent dispatch a decode
// layer fewer than router_topk before the pair. IDS2 (binding 5) is not
// read. Its bindings past 9 and helpers: kernels/routed_pair.wgsl.

@compute @workgroup_size(256)
fn moe_gate_up_pair_routed(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                           @builtin(local_invocation_index) t: u32) {
    let g = linear_group(wg, nwg);
    if (g < P.groups_a) {
        gate_up_a(g, t);
        return;
    }
    let gb = g - P.groups_a;
    let ne = P.experts2;
    let k = P.top_k2;
    rank_logits(t, ne, k);
    if (gb == 0u && t < k) {
        write_routing(t, k);
    }
    let q = gate_up_role(gb, t, P.nrb2);
    var e = ne;
    if (q.j < k) {
        e = tk_id[q.j];
    }
    gate_up_b_expert(q, e, t);
}

// ---- moe_gate_up_pair_slotted: the routed pair on streamed experts' slots ----
//
// moe_gate_up_pair_routed where b's weights are a slot stack of P.experts2
// slots (streamed experts): each picked expert e (of the P.ranked the
// router ranks) is looked up in the layer's slot table TABLE and its
// slot's rows are read; b's first workgroup writes the routing (RIDS,
// RWTS) as the routed pair does, the slots into SLOTS (phase 2 reads
// them), and e into LOG at P.log_at, bit 31 set where e holds no slot
// (slot 0 is read then; the host discards the pass). The lookup rides in
// the launch: no dispatch of its own.

@compute @workgroup_size(256)
fn moe_gate_up_pair_slotted(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                            @builtin(local_invocation_index) t: u32) {
    let g = linear_group(wg, nwg);
    if (g < P.groups_a) {
        gate_up_a(g, t);
        return;
    }
    let gb = g - P.groups_a;
    let ne = P.ranked;
    let slots = P.experts2;
    let k = P.top_k2;
    rank_logits(t, ne, k);
    if (gb == 0u && t < k) {
        write_slotted_routing(t, k, ne, slots, P.log_at);
    }
    let q = gate_up_role(gb, t, P.nrb2);
    var s = slots;
    if (q.j < k) {
        s = slot_read(tk_id[q.j], ne, slots);
    }
    gate_up_b_expert(q, s, t);
}
