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
// against 10.6 us, full 14.7 against 17.2; BENCHMARKS.md, 2026-12-01 at
// ff0b6d1).

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
// compiled in). GL lanes (a power of two, 32 to 256) take RPL weight rows
// (1 or 4), both compiled in and picked by the launcher from the weight's
// rows. Each weight row is read once, 16 bytes per load; each x block is
// loaded once for the group's RPL weight rows and all MT rows of x. Why
// four rows: x is f32 and a group reads all MT rows of it per weight row,
// so at 16 rows x's traffic from cache is 32 times the weight's, and
// sharing each x load over four weight rows cut it by four (q_proj
// sliding at 16 rows 49.7 -> 31.8 us on the H200; ops/matmul.rs has the
// rule and its figures). The sums are named vec4 registers (x rows 0-3,
// 4-7, ... of weight row 0 in c0..c3, row 1 in d*, 2 in e*, 3 in f*), not
// arrays indexed by loops, which the NVIDIA driver has kept in local
// memory elsewhere (docs/decisions.md). The lane sums go
// through workgroup memory for all of x's rows at once (one tree of
// barriers per weight row, not per x row).

override MT: u32 = 1u;
override RPL: u32 = 4u;
override GL: u32 = 32u;
const MAXT: u32 = 16u;
var<workgroup> pt: array<f32, MAXT * 256u>; // [MAXT][256]

// Eight weights of a block, as two vec4.
struct Block {
    lo: vec4<f32>,
    hi: vec4<f32>,
}

fn block(w: vec4<u32>) -> Block {
    return Block(vec4<f32>(decode_pair(w.x), decode_pair(w.y)),
                 vec4<f32>(decode_pair(w.z), decode_pair(w.w)));
}

// Block i of x rows j0 .. j0 + 3; rows past MT reread row MT - 1 (their
// sums are never written).
struct XRows {
    a0: vec4<f32>, a1: vec4<f32>,
    b0: vec4<f32>, b1: vec4<f32>,
    c0: vec4<f32>, c1: vec4<f32>,
    d0: vec4<f32>, d1: vec4<f32>,
}

fn x_rows(i: u32, j0: u32, k4: u32) -> XRows {
    let j = min(vec4<u32>(j0, j0 + 1u, j0 + 2u, j0 + 3u), vec4<u32>(MT - 1u));
    let xi = j * k4 + 2u * i;
    return XRows(X[xi.x], X[xi.x + 1u], X[xi.y], X[xi.y + 1u],
                 X[xi.z], X[xi.z + 1u], X[xi.w], X[xi.w + 1u]);
}

// One weight block's dots with four x rows.
fn dots(w: Block, x: XRows) -> vec4<f32> {
    return vec4<f32>(dot(w.lo, x.a0) + dot(w.hi, x.a1),
                     dot(w.lo, x.b0) + dot(w.hi, x.b1),
                     dot(w.lo, x.c0) + dot(w.hi, x.c1),
                     dot(w.lo, x.d0) + dot(w.hi, x.d1));
}

// The group's weight blocks (w1..w3 only read with RPL = 4).
struct Rows4 {
    w0: Block,
    w1: Block,
    w2: Block,
    w3: Block,
}

// One step's dots of the group's weight rows with four x rows, added to
// their sums (c: weight row 0, d: 1, e: 2, f: 3).
fn add_dots(w: Rows4, x: XRows, c: ptr<function, vec4<f32>>, d: ptr<function, vec4<f32>>,
            e: ptr<function, vec4<f32>>, f: ptr<function, vec4<f32>>) {
    *c += dots(w.w0, x);
    if (RPL == 4u) {
        *d += dots(w.w1, x);
        *e += dots(w.w2, x);
        *f += dots(w.w3, x);
    }
}

// x rows j0 .. j0 + 3 of one lane's sums into workgroup memory.
fn rows_put(v: vec4<f32>, j0: u32, t: u32) {
    if (j0 < MT) { pt[j0 * 256u + t] = v.x; }
    if (j0 + 1u < MT) { pt[(j0 + 1u) * 256u + t] = v.y; }
    if (j0 + 2u < MT) { pt[(j0 + 2u) * 256u + t] = v.z; }
    if (j0 + 3u < MT) { pt[(j0 + 3u) * 256u + t] = v.w; }
}

// Sum each x row's GL lanes of sums (v0: x rows 0-3, v1: 4-7, ...) and write
// them as weight row r of OUT.
fn rows_out(v0: vec4<f32>, v1: vec4<f32>, v2: vec4<f32>, v3: vec4<f32>,
            t: u32, lane: u32, r: u32, ok: bool) {
    rows_put(v0, 0u, t);
    rows_put(v1, 4u, t);
    rows_put(v2, 8u, t);
    rows_put(v3, 12u, t);
    workgroupBarrier();
    for (var s = GL / 2u; s > 0u; s >>= 1u) {
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
    let lane = t % GL;
    let r0 = (linear_group(wg, nwg) * (256u / GL) + t / GL) * RPL;
    let blocks = P.k / 8u;
    let k4 = P.k / 4u;
    // A weight row past the last rereads row r0 (dropped when written).
    let b0 = r0 * blocks;
    let b1 = select(r0, r0 + 1u, r0 + 1u < P.rows) * blocks;
    let b2 = select(r0, r0 + 2u, r0 + 2u < P.rows) * blocks;
    let b3 = select(r0, r0 + 3u, r0 + 3u < P.rows) * blocks;
    var c0 = vec4<f32>(); var c1 = vec4<f32>(); var c2 = vec4<f32>(); var c3 = vec4<f32>();
    var d0 = vec4<f32>(); var d1 = vec4<f32>(); var d2 = vec4<f32>(); var d3 = vec4<f32>();
    var e0 = vec4<f32>(); var e1 = vec4<f32>(); var e2 = vec4<f32>(); var e3 = vec4<f32>();
    var f0 = vec4<f32>(); var f1 = vec4<f32>(); var f2 = vec4<f32>(); var f3 = vec4<f32>();
    if (r0 < P.rows) {
        for (var i = lane; i < blocks; i += GL) {
            let w0 = block(W[b0 + i]);
            var w = Rows4(w0, w0, w0, w0);
            // (RPL and MT are compiled in: the conditions fold away)
            if (RPL == 4u) {
                w.w1 = block(W[b1 + i]);
                w.w2 = block(W[b2 + i]);
                w.w3 = block(W[b3 + i]);
            }
            add_dots(w, x_rows(i, 0u, k4), &c0, &d0, &e0, &f0);
            if (MT > 4u) {
                add_dots(w, x_rows(i, 4u, k4), &c1, &d1, &e1, &f1);
            }
            if (MT > 8u) {
                add_dots(w, x_rows(i, 8u, k4), &c2, &d2, &e2, &f2);
            }
            if (MT > 12u) {
                add_dots(w, x_rows(i, 12u, k4), &c3, &d3, &e3, &f3);
            }
        }
    }
    rows_out(c0, c1, c2, c3, t, lane, r0, r0 < P.rows);
    if (RPL == 4u) {
        rows_out(d0, d1, d2, d3, t, lane, r0 + 1u, r0 + 1u < P.rows);
        rows_out(e0, e1, e2, e3, t, lane, r0 + 2u, r0 + 2u < P.rows);
        rows_out(f0, f1, f2, f3, t, lane, r0 + 3u, r0 + 3u < P.rows);
    }
}
