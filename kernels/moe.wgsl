// MoE expert GEMVs, expert ids read on the device (no host round trip).
//
//   moe_route    one workgroup: from IDS [m, k] builds the ROUTE list that
//                groups the batch's (token, slot) pairs by expert.
//   moe_gate_up  phase 1: ACT[p, i] = gelu_tanh(gate_e . x_t) * (up_e . x_t)
//                for every pair p = t * k + j with e = IDS[p].
//   moe_down     phase 2: OUT[t] = sum_j WTS[t, j] * down_e ACT[t, j].
//
// ROUTE layout (u32), E = P.experts:
//   [0]                 number of experts used (expert slots)
//   [1 .. 1+E]          expert id of slot s (ascending ids)
//   [1+E .. 1+2E]       pairs of slot s
//   [1+2E .. 1+3E]      offset of slot s's pairs in the pair list
//   [1+3E ..]           the pair list: pair ids p, grouped by slot
// With P.direct = 1 (decode, m = 1) there is no list: slot s is pair s.
//
// Phase 1: 8 teams of 32 lanes per workgroup, phase 2: 4 teams of 64; one
// weight row (phase 1: a gate row and its up row) per team; lanes stride over the row in 32-bit
// words, several words in flight each, so one load instruction of a team
// reads a contiguous 128-byte run. Each weight row is read once and applied to all
// the tokens routed to its expert. Phase 2 loops over the experts inside the
// workgroup that owns the output rows, so the sum over the k experts is a
// fixed-order register sum: deterministic, no atomics.
//
// Bindings are shared by the three entry points (same type per slot):
//   0 IDS, 1 ROUTE, 2 W (weights), 3 A (x or act), 4 WTS, 5 OUT (act or out).

struct Params {
    m: u32,
    hidden: u32,
    inter: u32,
    experts: u32,
    top_k: u32,
    // 1: slot s is pair s (no route list)
    direct: u32,
    // expert slots dispatched (phase 1)
    nslots: u32,
    // row blocks per slot (phase 1) or per token group (phase 2)
    nrb: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(1) @binding(0) var<storage, read> IDS: array<u32>;
@group(1) @binding(1) var<storage, read_write> ROUTE: array<u32>;
@group(1) @binding(2) var<storage, read> W: array<u32>;
@group(1) @binding(3) var<storage, read> A: array<f32>;
@group(1) @binding(4) var<storage, read> WTS: array<f32>;
@group(1) @binding(5) var<storage, read_write> OUT: array<f32>;

const L: u32 = 32u;   // lanes per team
const T: u32 = 8u;    // teams (rows) per workgroup
const TG: u32 = 16u;  // tokens per phase-2 workgroup

var<workgroup> scan: array<vec2<u32>, 256>;
var<workgroup> red_a: array<vec4<f32>, 256>;
var<workgroup> red_b: array<vec4<f32>, 256>;
var<workgroup> sh_slot: vec4<u32>;

// ---- route list ------------------------------------------------------------

// Per-expert pair counts, then each expert's fill position, in workgroup
// atomics: every thread takes pairs lid, lid + 256, ... Scanning IDS once
// per expert instead (a thread per expert) took 0.3-0.4 ms at 4096 pairs on
// the H200, as long as a prefill GEMM. Within a slot the pairs land in
// whatever order the atomics give: no consumer's arithmetic depends on it
// (every pair's row is computed on its own, and a token's sum over its
// experts runs in slot order here, in top-k order in kernels/gemm.wgsl's
// moe_sum; a token has at most one pair per slot).
var<workgroup> route_cnt: array<atomic<u32>, 256>;
var<workgroup> route_fill: array<atomic<u32>, 256>;

@compute @workgroup_size(256)
fn moe_route(@builtin(local_invocation_index) lid: u32) {
    let n = P.m * P.top_k;
    let ne = P.experts;
    atomicStore(&route_cnt[lid], 0u);
    atomicStore(&route_fill[lid], 0u);
    workgroupBarrier();
    for (var p = lid; p < n; p += 256u) {
        let e = IDS[p];
        if (e < ne) {
            atomicAdd(&route_cnt[e], 1u);
        }
    }
    workgroupBarrier();
    let c = atomicLoad(&route_cnt[lid]);
    // Inclusive scans of (pair count, expert used) over the experts.
    let mine = vec2<u32>(c, u32(c > 0u));
    scan[lid] = mine;
    workgroupBarrier();
    for (var off = 1u; off < 256u; off <<= 1u) {
        var v = scan[lid];
        if (lid >= off) {
            v += scan[lid - off];
        }
        workgroupBarrier();
        scan[lid] = v;
        workgroupBarrier();
    }
    let incl = scan[lid];
    let excl = incl - mine;
    if (lid == 255u) {
        ROUTE[0] = incl.y;
    }
    if (c > 0u) {
        let s = excl.y;
        ROUTE[1u + s] = lid;
        ROUTE[1u + ne + s] = c;
        ROUTE[1u + 2u * ne + s] = excl.x;
    }
    // Scatter: the scan (complete after its last barrier) holds every
    // expert's slot offset.
    for (var p = lid; p < n; p += 256u) {
        let e = IDS[p];
        if (e < ne) {
            let first = scan[e].x - atomicLoad(&route_cnt[e]);
            let q = atomicAdd(&route_fill[e], 1u);
            ROUTE[1u + 3u * ne + first + q] = p;
        }
    }
}

// Slots in use (non-uniform: read from storage).
fn used_slots() -> u32 {
    if (P.direct != 0u) {
        return P.nslots;
    }
    return ROUTE[0];
}

// (expert, pair count, pair offset) of slot s.
fn slot_info(s: u32) -> vec3<u32> {
    if (P.direct != 0u) {
        return vec3<u32>(IDS[s], 1u, s);
    }
    let ne = P.experts;
    return vec3<u32>(ROUTE[1u + s], ROUTE[1u + ne + s], ROUTE[1u + 2u * ne + s]);
}

// The q-th pair of a slot whose pairs start at `off`.
fn pair_at(off: u32, q: u32) -> u32 {
    if (P.direct != 0u) {
        return off + q;
    }
    return ROUTE[1u + 3u * P.experts + off + q];
}

// ---- weights -----------------------------------------------------------------

// Word i of the weight (kernels/affine.wgsl; quantized experts are
// row-major, never tiled).
fn wword(i: u32) -> u32 {
    return W[i];
}

// Element pair `u` (elements 2u, 2u+1) of weight row `row` of length `n` (n even).
fn wpair(row: u32, n: u32, u: u32) -> vec2<f32> {
    let base = row * n;
    if (QBITS != 0u) {
        return affine_pair(base + 2u * u);
    }
    if (WDTYPE == 0u) {
        return vec2<f32>(bitcast<f32>(W[base + 2u * u]), bitcast<f32>(W[base + 2u * u + 1u]));
    }
    return decode_pair(W[(base >> 1u) + u]);
}

// 1: the weights are in tile order (common.wgsl's expert_row: 16-bit
// weights, rows a multiple of 16 long, so the even-row paths only).
override TILED: u32 = 0u;

// Phase 2's weight pair u of row rr of the expert matrix whose first row
// is `row0` (`n` long): from the tiles (TILED; common.wgsl's expert_row,
// 4 pairs a vec4), else wpair. (Phase 1 reads the tiles in gate_up_tiled.)
fn down_wpair(row0: u32, rr: u32, n: u32, u: u32) -> vec2<f32> {
    if (TILED == 1u) {
        let row = expert_row(row0 * (n / 8u), rr, n / 8u, true, false, 0u);
        return decode_pair(W[4u * (row + expert_step(u / 4u, true)) + u % 4u]);
    }
    return wpair(row0 + rr, n, u);
}

// Element i of weight row `row` of length `n` (any n: 16-bit rows may start
// mid-word).
fn welem(row: u32, n: u32, i: u32) -> f32 {
    let gi = row * n + i;
    if (QBITS != 0u) {
        return affine_elem(gi);
    }
    return decode_weight(W[weight_word(gi)], gi);
}

// Gate pair (xy) and up pair (zw) of unit u; zero past the row's nu units
// (the loads stay in range).
fn gu_unit(grow: u32, urow: u32, u: u32, nu: u32) -> vec4<f32> {
    let h = P.hidden;
    let uc = min(u, nu - 1u);
    let v = vec4<f32>(wpair(grow, h, uc), wpair(urow, h, uc));
    return select(vec4<f32>(0.0), v, u < nu);
}

fn apair(i: u32) -> vec2<f32> {
    return vec2<f32>(A[i], A[i + 1u]);
}

// Sum red_a / red_b over the `width` lanes of each team (into lane 0).
fn reduce_lanes(lid: u32, lane: u32, width: u32) {
    workgroupBarrier();
    for (var s = width / 2u; s > 0u; s >>= 1u) {
        if (lane < s) {
            red_a[lid] += red_a[lid + s];
            red_b[lid] += red_b[lid + s];
        }
        workgroupBarrier();
    }
}

// ---- phase 1 -------------------------------------------------------------------

// The x row offsets of a phase-1 group's np (<= 4) tokens, the slot's
// pairs q0.. from `off` (unused lanes repeat the last).
fn token_rows(off: u32, q0: u32, np: u32) -> vec4<u32> {
    var xb = vec4<u32>(0u);
    for (var q = 0u; q < 4u; q++) {
        xb[q] = (pair_at(off, q0 + min(q, np - 1u)) / P.top_k) * P.hidden;
    }
    return xb;
}

// Workgroup g: expert slot g / nrb, output rows (g % nrb) * 8 .. + 8. The
// slot's pairs go through in groups of 4 (one vec4 accumulator lane each).
@compute @workgroup_size(256)
fn moe_gate_up(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let g = linear_group(wg, nwg);
    let s = g / P.nrb;
    if (s >= P.nslots) {
        return;
    }
    if (lid == 0u) {
        var info = vec4<u32>(0u);
        if (s < used_slots()) {
            let si = slot_info(s);
            // An expert id past E selects nothing (the CPU reports it).
            info = vec4<u32>(si.x, select(0u, si.y, si.x < P.experts), si.z, 0u);
        }
        sh_slot = info;
    }
    let info = workgroupUniformLoad(&sh_slot);
    let e = info.x;
    let cnt = info.y;
    let off = info.z;
    if (cnt == 0u) {
        return;
    }

    if (TILED == 1u) {
        gate_up_tiled(e, cnt, off, (g % P.nrb) * T, lid);
        return;
    }

    let h = P.hidden;
    let n = P.inter;
    let team = lid / L;
    let lane = lid % L;
    let i = (g % P.nrb) * T + team;
    let ir = min(i, n - 1u);
    let grow = e * 2u * n + ir;
    let urow = grow + n;

    for (var q0 = 0u; q0 < cnt; q0 += 4u) {
        let np = min(4u, cnt - q0);
        let xb = token_rows(off, q0, np);
        var ag = vec4<f32>(0.0);
        var au = vec4<f32>(0.0);
        if ((h & 1u) == 0u) {
            let nu = h / 2u;
            let last = nu - 1u;
            // Eight units in flight per lane (16 weight words: gate and up).
            for (var u0 = lane; u0 < nu; u0 += 8u * L) {
                let w0 = gu_unit(grow, urow, u0, nu);
                let w1 = gu_unit(grow, urow, u0 + L, nu);
                let w2 = gu_unit(grow, urow, u0 + 2u * L, nu);
                let w3 = gu_unit(grow, urow, u0 + 3u * L, nu);
                let w4 = gu_unit(grow, urow, u0 + 4u * L, nu);
                let w5 = gu_unit(grow, urow, u0 + 5u * L, nu);
                let w6 = gu_unit(grow, urow, u0 + 6u * L, nu);
                let w7 = gu_unit(grow, urow, u0 + 7u * L, nu);
                for (var q = 0u; q < 4u; q++) {
                    if (q < np) {
                        let b = xb[q];
                        let x0 = apair(b + 2u * min(u0, last));
                        let x1 = apair(b + 2u * min(u0 + L, last));
                        let x2 = apair(b + 2u * min(u0 + 2u * L, last));
                        let x3 = apair(b + 2u * min(u0 + 3u * L, last));
                        let x4 = apair(b + 2u * min(u0 + 4u * L, last));
                        let x5 = apair(b + 2u * min(u0 + 5u * L, last));
                        let x6 = apair(b + 2u * min(u0 + 6u * L, last));
                        let x7 = apair(b + 2u * min(u0 + 7u * L, last));
                        ag[q] += ((dot(w0.xy, x0) + dot(w1.xy, x1)) + (dot(w2.xy, x2) + dot(w3.xy, x3)))
                            + ((dot(w4.xy, x4) + dot(w5.xy, x5)) + (dot(w6.xy, x6) + dot(w7.xy, x7)));
                        au[q] += ((dot(w0.zw, x0) + dot(w1.zw, x1)) + (dot(w2.zw, x2) + dot(w3.zw, x3)))
                            + ((dot(w4.zw, x4) + dot(w5.zw, x5)) + (dot(w6.zw, x6) + dot(w7.zw, x7)));
                    }
                }
            }
        } else {
            for (var c = lane; c < h; c += L) {
                let wgv = welem(grow, h, c);
                let wuv = welem(urow, h, c);
                for (var q = 0u; q < 4u; q++) {
                    if (q < np) {
                        let xv = A[xb[q] + c];
                        ag[q] += wgv * xv;
                        au[q] += wuv * xv;
                    }
                }
            }
        }
        red_a[lid] = ag;
        red_b[lid] = au;
        reduce_lanes(lid, lane, L);
        if (lane == 0u && i < n) {
            let gs = red_a[lid];
            let us = red_b[lid];
            for (var q = 0u; q < np; q++) {
                OUT[pair_at(off, q0 + q) * n + i] = gelu_tanh(gs[q]) * us[q];
            }
        }
        workgroupBarrier();
    }
}

// Phase 1 on tile-ordered experts (TILED): the workgroup's T features'
// gate rows and their up rows are 16 tile rows, two 256-byte runs of each
// 16-wide chunk of k. A warp reads a chunk's 16 rows with one 16-byte load
// a lane (two lanes a row) and the 8 warps take every 8th chunk, so a
// warp's loads are two whole runs (the row-major body above, re-indexed,
// read 32-byte pieces 2 KB apart: 238 -> 329 us at 16 tokens on the H200,
// 2026-12-01 at a94f43a, run 09). The slot's tokens go through 4 at a time.
var<workgroup> t_rows: array<vec4<f32>, 16>;

fn gate_up_tiled(e: u32, cnt: u32, off: u32, i0: u32, lid: u32) {
    let h = P.hidden;
    let n = P.inter;
    let kq = h / 8u;
    let nch = kq / 2u;
    let warp = lid / 32u;
    let lane = lid % 32u;
    // this lane's row (gate rows of features i0.., then their up rows) and half
    let q = lane / 2u;
    let r = select(0u, n, q >= T) + i0 + q % T;
    let base = expert_row(e * 2u * n * kq, r, kq, true, true, n);
    let half = lane % 2u;
    for (var q0 = 0u; q0 < cnt; q0 += 4u) {
        let np = min(4u, cnt - q0);
        let xb = token_rows(off, q0, np);
        var acc = vec4<f32>(0.0);
        for (var c = warp; c < nch; c += 8u) {
            let v = 2u * c + half;
            let wi = 4u * (base + expert_step(v, true));
            let w01 = decode_pair(W[wi]);
            let w23 = decode_pair(W[wi + 1u]);
            let w45 = decode_pair(W[wi + 2u]);
            let w67 = decode_pair(W[wi + 3u]);
            for (var t = 0u; t < 4u; t++) {
                if (t < np) {
                    let xi = xb[t] + 8u * v;
                    acc[t] += (dot(w01, apair(xi)) + dot(w23, apair(xi + 2u)))
                        + (dot(w45, apair(xi + 4u)) + dot(w67, apair(xi + 6u)));
                }
            }
        }
        // Row q's partials: lanes 2q and 2q + 1 of every warp.
        red_a[lid] = acc;
        workgroupBarrier();
        if (lid < 2u * T) {
            var sum = vec4<f32>(0.0);
            for (var w = 0u; w < 8u; w++) {
                sum += red_a[w * 32u + 2u * lid] + red_a[w * 32u + 2u * lid + 1u];
            }
            t_rows[lid] = sum;
        }
        workgroupBarrier();
        if (lid < T && i0 + lid < n) {
            let gs = t_rows[lid];
            let us = t_rows[lid + T];
            for (var t = 0u; t < np; t++) {
                OUT[pair_at(off, q0 + t) * n + i0 + lid] = gelu_tanh(gs[t]) * us[t];
            }
        }
        workgroupBarrier();
    }
}

// ---- phase 2 -------------------------------------------------------------------
//
// Workgroup g: output rows (g % nrb) * 4 .. + 4 of tokens (g / nrb) * 16 ..
// + 16, one row per team of 64 lanes. A team walks the row of every expert
// slot as one flat run of (slot, unit) indices, 8 units in flight per lane,
// so the k experts' loads overlap instead of following one another. Each
// unit of a down row is read once and applied to all of the slot's pairs in
// the token group: acc[token] += WTS[p] * (row . ACT[p]), in registers.

const L2: u32 = 64u;  // lanes per team (phase 2)
const T2: u32 = 4u;   // teams (rows) per workgroup (phase 2)

var<workgroup> sl_row: array<u32, 256>;  // first weight row of slot s's expert
var<workgroup> sl_cnt: array<u32, 256>;  // pairs of slot s (0: invalid expert)
var<workgroup> sl_off: array<u32, 256>;  // offset of slot s's pairs

fn add_token(a: ptr<function, array<vec4<f32>, 4>>, tt: u32, v: f32) {
    let oh = select(vec4<f32>(0.0), vec4<f32>(v), vec4<u32>(0u, 1u, 2u, 3u) == vec4<u32>(tt & 3u));
    switch (tt >> 2u) {
        case 0u: { (*a)[0] += oh; }
        case 1u: { (*a)[1] += oh; }
        case 2u: { (*a)[2] += oh; }
        default: { (*a)[3] += oh; }
    }
}

// One unit of phase 2's flat run: weights of slot s, unit u (u = NONE past
// the end), and the activations of the slot's first pair, loaded together.
struct Unit {
    w: vec2<f32>,
    a: vec2<f32>,
    s: u32,
    u: u32,
}

const NONE: u32 = 0xffffffffu;

fn down_load(f: u32, total: u32, nu: u32, rr: u32) -> Unit {
    let n = P.inter;
    let fc = min(f, total - 1u);
    let s = fc / nu;
    let u = fc - s * nu;
    let w = down_wpair(sl_row[s], rr, n, u);
    let a = apair(pair_at(sl_off[s], 0u) * n + 2u * u);
    return Unit(w, a, s, select(u, NONE, f >= total));
}

fn down_apply(acc: ptr<function, array<vec4<f32>, 4>>, x: Unit, t0: u32) {
    if (x.u == NONE) {
        return;
    }
    let n = P.inter;
    let k = P.top_k;
    let cnt = sl_cnt[x.s];
    let off = sl_off[x.s];
    for (var q = 0u; q < cnt; q++) {
        let p = pair_at(off, q);
        let tt = p / k - t0;
        if (tt >= TG) {
            continue;
        }
        var a = x.a;
        if (q > 0u) {
            a = apair(p * n + 2u * x.u);
        }
        add_token(acc, tt, WTS[p] * dot(x.w, a));
    }
}

@compute @workgroup_size(256)
fn moe_down(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let g = linear_group(wg, nwg);
    let t0 = (g / P.nrb) * TG;
    if (t0 >= P.m) {
        return;
    }
    let h = P.hidden;
    let n = P.inter;
    let k = P.top_k;

    // The slot table, in workgroup memory.
    if (lid == 0u) {
        sh_slot = vec4<u32>(used_slots(), 0u, 0u, 0u);
    }
    let ns = workgroupUniformLoad(&sh_slot).x;
    for (var s = lid; s < ns; s += 256u) {
        let si = slot_info(s);
        let ok = si.x < P.experts;
        sl_row[s] = select(0u, si.x * h, ok);
        sl_cnt[s] = select(0u, si.y, ok);
        sl_off[s] = si.z;
    }
    workgroupBarrier();

    let team = lid / L2;
    let lane = lid % L2;
    let r = (g % P.nrb) * T2 + team;
    let rr = min(r, h - 1u);

    var acc: array<vec4<f32>, 4>;
    for (var c = 0u; c < 4u; c++) {
        acc[c] = vec4<f32>(0.0);
    }
    if ((n & 1u) == 0u) {
        let nu = n / 2u;
        let total = ns * nu;
        for (var f = lane; f < total; f += 8u * L2) {
            let x0 = down_load(f, total, nu, rr);
            let x1 = down_load(f + L2, total, nu, rr);
            let x2 = down_load(f + 2u * L2, total, nu, rr);
            let x3 = down_load(f + 3u * L2, total, nu, rr);
            let x4 = down_load(f + 4u * L2, total, nu, rr);
            let x5 = down_load(f + 5u * L2, total, nu, rr);
            let x6 = down_load(f + 6u * L2, total, nu, rr);
            let x7 = down_load(f + 7u * L2, total, nu, rr);
            down_apply(&acc, x0, t0);
            down_apply(&acc, x1, t0);
            down_apply(&acc, x2, t0);
            down_apply(&acc, x3, t0);
            down_apply(&acc, x4, t0);
            down_apply(&acc, x5, t0);
            down_apply(&acc, x6, t0);
            down_apply(&acc, x7, t0);
        }
    } else {
        // Odd rows: 16-bit rows may start mid-word; element by element.
        for (var s = 0u; s < ns; s++) {
            let row = sl_row[s] + rr;
            let cnt = sl_cnt[s];
            let off = sl_off[s];
            for (var c = lane; c < n; c += L2) {
                let wv = welem(row, n, c);
                for (var q = 0u; q < cnt; q++) {
                    let p = pair_at(off, q);
                    let tt = p / k - t0;
                    if (tt >= TG) {
                        continue;
                    }
                    add_token(&acc, tt, WTS[p] * (wv * A[p * n + c]));
                }
            }
        }
    }

    // Reduce over lanes, 8 tokens per round (red_a: tokens +0..3, red_b: +4..7).
    let ntok = min(TG, P.m - t0);
    for (var c = 0u; c < ntok; c += 8u) {
        red_a[lid] = acc[c / 4u];
        red_b[lid] = acc[c / 4u + 1u];
        reduce_lanes(lid, lane, L2);
        if (lane == 0u && r < h) {
            let va = red_a[lid];
            let vb = red_b[lid];
            for (var j = 0u; j < 4u; j++) {
                if (c + j < ntok) {
                    OUT[(t0 + c + j) * h + r] = va[j];
                }
                if (c + 4u + j < ntok) {
                    OUT[(t0 + c + 4u + j) * h + r] = vb[j];
                }
            }
        }
        workgroupBarrier();
    }
}
