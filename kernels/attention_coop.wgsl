enable f16;
enable wgpu_cooperative_matrix;

// Prefill attention on cooperative matrices (tensor cores): the softmax
// attention of kernels/attention.wgsl's attn_prefill for head_dim 128, 256
// or 512, for devices whose wgpu adapter offers 16x16x16 f16 x f16 -> f32
// matrices (the tensor-core GEMM's, kernels/gemm_coop.wgsl). Two dispatches:
//
//   attn_coop_prep     the batch's queries and the keys and values it sees,
//                      to f16 scratch, a row (one head's head_dim values)
//                      per warp. Queries and keys: each row scaled by the
//                      power of two that puts its largest |x| in
//                      [2^14, 2^15), rounded to f16 (to nearest even), its
//                      inverse scale kept (the GEMM's rule,
//                      turbospark::GemmRounding). Values: rounded to f16 as
//                      they are, or, where a row's largest |v| reaches
//                      2^15, first scaled down by the power of two that
//                      puts it in [2^14, 2^15), the probabilities that
//                      multiply that row scaled up by the same.
//   attn_prefill_coop  a workgroup per (16 query rows, NSG query heads of
//                      one kv head): S = Q K^T on the matrix units, 16 keys
//                      a step, in two passes over the rows' keys: the first
//                      finds each row's max and sum of exp, the second
//                      writes P = exp(S - max) / sum (to f16) to workgroup
//                      memory and accumulates O += P V. Two passes rather
//                      than an online softmax because a cooperative
//                      accumulator cannot be rescaled per row in WGSL; S
//                      costs twice, O never leaves the matrix units.
//
// SPLIT (turbospark::Precision::Exact): the prep writes each of those
// values as two f16 parts, hi = f16(v) and lo = f16(v - hi) (f16's
// subnormals kept: half_grid), lo after every hi row of its scratch; the
// probabilities are split the same way as they are staged; and each
// product takes three matrix multiplies, hi hi' + hi lo' + lo hi' (lo lo',
// under 2^-22 of the product, left out), all into the same f32
// accumulators. Its extra fragments need DW = 64.
//
// Warps: head_dim is cut into ND chunks of DW dims (64 or 128: 8 or 4
// warps, the launcher's choice per head size), one warp per (query head
// slot sg < NSG, chunk dc): it holds its 16 rows' queries over its DW dims
// (DW / 16 fragments) and their output over the same dims (as many
// accumulators). A step's S is the sum of the ND warps' partial products
// (over their chunks) in workgroup memory. The next step's K fragments and
// key scales are loaded a step ahead, a step's V before its S.
//
// Masking: key j counts for row t iff lo(t) <= j <= pos(t) (key_range,
// kernels/attention_keys.wgsl); a masked score takes no part and its
// probability is 0. The K / V scratch mirrors the cache slot for slot
// (key j at row j % capacity, whatever the positions), with 16 rows past
// the ring repeating it (row r holds slot r % capacity: slots 0-15 once
// more, or a cache under 16 slots several times), so a step's 16 rows are
// contiguous where it wraps. The prep converts the slots of the batch's keys (the union of
// its rows' ranges) and zeroes up to 16 free slots after them, so that a
// step that runs past the last key reads finite values.

struct Params {
    m: u32,
    heads: u32,
    kv_heads: u32,
    group: u32,
    d: u32,
    capacity: u32,
    window: u32,
    scale: f32,
    // Q16 rows: m rounded up to 16, times heads.
    qrows: u32,
    // K16 / V16 rows per kv head: capacity, then 16 mirror rows (row r
    // holds slot r % capacity).
    kvrows: u32,
    // Row blocks of 16 and query head blocks of NSG per kv head.
    nrb: u32,
    nhb: u32,
}

@group(0) @binding(0) var<uniform> P: Params;

@group(1) @binding(0) var<storage, read> POS: array<u32>;
@group(1) @binding(1) var<storage, read> QF: array<vec4<f32>>;
@group(1) @binding(2) var<storage, read> KC: array<vec4<CacheT>>;
@group(1) @binding(3) var<storage, read> VC: array<vec4<CacheT>>;
// [t][head][d] for t < qrows / heads (rows past m are zeros).
@group(1) @binding(4) var<storage, read_write> Q16: array<f16>;
// [kv head][cache slot, then the 16 mirror rows][d].
@group(1) @binding(5) var<storage, read_write> K16: array<f16>;
@group(1) @binding(6) var<storage, read_write> V16: array<f16>;
// The Q rows' inverse scales (qrows), the K rows' (kv_heads * kvrows) and
// the V rows' probability factors (kv_heads * kvrows).
@group(1) @binding(7) var<storage, read_write> SC: array<f32>;
// [m][heads][d].
@group(1) @binding(8) var<storage, read_write> OUT: array<f32>;

// "No key": below any real score, finite so that differences stay finite.
const NEG: f32 = -3.0e38;

// key_range: kernels/attention_keys.wgsl.

fn k_scale_at(g: u32, i: u32) -> u32 {
    return P.qrows + g * P.kvrows + i;
}

fn v_factor_at(g: u32, i: u32) -> u32 {
    return P.qrows + (P.kv_heads + g) * P.kvrows + i;
}

// 1: split products (above); the lo parts start at these elements of Q16
// and of K16 / V16.
override SPLIT: u32 = 0u;

fn q_lo() -> u32 {
    return P.qrows * P.d;
}

fn kv_lo() -> u32 {
    return P.kv_heads * P.kvrows * P.d;
}

// ---- attn_coop_prep ----

var<workgroup> pmax: array<f32, 256>;
var<workgroup> plo: array<u32, 256>;
var<workgroup> phi: array<u32, 256>;

// The batch's keys [lo, hi): the union of its rows' ranges, by the whole
// workgroup (every thread calls it).
fn batch_span(lid: u32) -> vec2<u32> {
    var lo = 0xffffffffu;
    var hi = 0u;
    for (var t = lid; t < P.m; t += 256u) {
        let r = key_range(t);
        lo = min(lo, r.x);
        hi = max(hi, r.y);
    }
    plo[lid] = lo;
    phi[lid] = hi;
    for (var s = 128u; s > 0u; s >>= 1u) {
        workgroupBarrier();
        if (lid < s) {
            plo[lid] = min(plo[lid], plo[lid + s]);
            phi[lid] = max(phi[lid], phi[lid + s]);
        }
    }
    workgroupBarrier();
    return vec2<u32>(plo[0], phi[0]);
}

// Eight rows per workgroup, a warp per row: Q rows (qrows), then K rows and
// V rows (kv_heads * kvrows each). A K / V warp's row i is the i-th key of
// the batch's union [lo, hi) (or, past it, one of the zeroed slots after
// it), written at its cache slot's row and at each mirror row of it.
@compute @workgroup_size(256)
fn attn_coop_prep(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
    let r0 = linear_group(wg, nwg) * 8u;
    let kvn = P.kv_heads * P.kvrows;
    if (r0 >= P.qrows + 2u * kvn) {
        return;
    }
    let warp = lid / 32u;
    let lane = lid % 32u;
    let r = r0 + warp;
    let d4 = P.d / 4u;
    // Only K and V rows need the span (a uniform test: r0 is the
    // workgroup's).
    // (qrows is a multiple of 16: a workgroup's rows are all Q or all K/V)
    var span = vec2<u32>(0u, 0u);
    if (r0 >= P.qrows) {
        span = batch_span(lid);
    }
    // The union's keys, each slot once (positions spread wider than the
    // cache share slots), then as many zeroed slots after it as are free.
    let keys = min(span.y - span.x, P.capacity);
    let after = min(16u, P.capacity - keys);
    // kind 0: Q, 1: K, 2: V; `src` the source row's first vec4, `on`
    // whether it exists (else the row is zeros), `dst` the scratch row (a K
    // / V row's slot within its kv head: `g`, `slot`), and `copies` how many
    // rows hold it (a K / V slot: every capacity rows within kvrows).
    var kind = 0u;
    var on = false;
    var src = 0u;
    var dst = r;
    var g = 0u;
    var slot = 0u;
    var copies = 1u;
    var write = r < P.qrows + 2u * kvn;
    if (r < P.qrows) {
        let t = r / P.heads;
        on = t < P.m;
        src = r * d4;
    } else if (write) {
        let r2 = r - P.qrows;
        kind = 1u + r2 / kvn;
        g = (r2 % kvn) / P.kvrows;
        let i = (r2 % kvn) % P.kvrows;
        on = i < keys;
        // (past the zeroed slots nothing is read or written)
        write = i < keys + after;
        slot = (span.x + i) % P.capacity;
        src = (g * P.capacity + slot) * d4;
        dst = g * P.kvrows + slot;
        copies = (P.kvrows - 1u - slot) / P.capacity + 1u;
    }
    var a: array<vec4<f32>, 4>;
    var mx = 0.0;
    for (var u = 0u; u < 4u; u++) {
        let c = lane + 32u * u;
        a[u] = vec4<f32>(0.0);
        if (on && c < d4) {
            if (kind == 0u) {
                a[u] = QF[src + c];
            } else if (kind == 1u) {
                a[u] = vec4<f32>(KC[src + c]);
            } else {
                a[u] = vec4<f32>(VC[src + c]);
            }
        }
        let b = abs(a[u]);
        mx = max(mx, max(max(b.x, b.y), max(b.z, b.w)));
    }
    // The warp's largest |x| (a tree over its 32 slots; every warp takes
    // every step, so the barriers are uniform).
    pmax[lid] = mx;
    for (var s = 16u; s > 0u; s >>= 1u) {
        workgroupBarrier();
        if (lane < s) {
            pmax[lid] = max(pmax[lid], pmax[lid + s]);
        }
    }
    workgroupBarrier();
    if (!write) {
        return;
    }
    let e = row_exponent(pmax[warp * 32u]);
    var sc = pow2(14 - e);
    var inv = pow2(e - 14);
    if (kind == 2u && e < 15) {
        sc = 1.0;
        inv = 1.0;
    }
    // The row, then its mirror copies; `a` indexed by the inner loop's
    // variable alone, a 4-trip loop the driver unrolls (an index it cannot
    // resolve would put `a` in local memory).
    for (var w = 0u; w < copies; w++) {
        let o = (dst + w * P.capacity) * P.d;
        for (var u = 0u; u < 4u; u++) {
            let c = lane + 32u * u;
            if (c < d4) {
                let v = a[u] * sc;
                var hf = nearest_half4(v);
                if (SPLIT == 1u) {
                    hf = half_grid4(v);
                }
                let h = vec4<f16>(hf);
                let l = vec4<f16>(split_lo4(v, hf));
                let i = o + 4u * c;
                if (kind == 0u) {
                    Q16[i] = h.x;
                    Q16[i + 1u] = h.y;
                    Q16[i + 2u] = h.z;
                    Q16[i + 3u] = h.w;
                    if (SPLIT == 1u) {
                        let j = q_lo() + i;
                        Q16[j] = l.x;
                        Q16[j + 1u] = l.y;
                        Q16[j + 2u] = l.z;
                        Q16[j + 3u] = l.w;
                    }
                } else if (kind == 1u) {
                    K16[i] = h.x;
                    K16[i + 1u] = h.y;
                    K16[i + 2u] = h.z;
                    K16[i + 3u] = h.w;
                    if (SPLIT == 1u) {
                        let j = kv_lo() + i;
                        K16[j] = l.x;
                        K16[j + 1u] = l.y;
                        K16[j + 2u] = l.z;
                        K16[j + 3u] = l.w;
                    }
                } else {
                    V16[i] = h.x;
                    V16[i + 1u] = h.y;
                    V16[i + 2u] = h.z;
                    V16[i + 3u] = h.w;
                    if (SPLIT == 1u) {
                        let j = kv_lo() + i;
                        V16[j] = l.x;
                        V16[j + 1u] = l.y;
                        V16[j + 2u] = l.z;
                        V16[j + 3u] = l.w;
                    }
                }
            }
        }
    }
    if (lane == 0u) {
        if (kind == 0u) {
            SC[r] = inv;
        } else {
            for (var w = 0u; w < copies; w++) {
                let sm = slot + w * P.capacity;
                SC[select(v_factor_at(g, sm), k_scale_at(g, sm), kind == 1u)] = inv;
            }
        }
    }
}

// ---- attn_prefill_coop ----

// Dims per warp (64 or 128: 4 or 8 fragments), warps along head_dim
// (head_dim / DW), query heads per workgroup, and threads (32 ND NSG): the
// launcher's (backends/wgpu/src/ops/attention_coop.rs).
override DW: u32 = 128u;
override ND: u32 = 2u;
override NSG: u32 = 2u;
override WG: u32 = 128u;
// The staged probabilities' row stride in f16 (16 and 8 of padding: every
// fragment row starts 16-byte aligned, rows on different banks).
const PPS: u32 = 24u;

// A step's S partials [warp][16][16] (8 warps at most), then the output's
// staging.
var<workgroup> csp: array<f32, 2048>;
// A step's probabilities [query head slot][16][PPS] (4 slots at most),
// then with SPLIT their lo parts, CPL on.
const CPL: u32 = 1536u;
var<workgroup> cpp: array<f16, 3072>;
// Per (query head slot, row): the softmax's max and 1 / sum, and the
// query's inverse scale times the attention scale.
var<workgroup> cmax: array<f32, 64>;
var<workgroup> cinv: array<f32, 64>;
var<workgroup> cqi: array<f32, 64>;
// The rows' key ranges (empty past m), and a step's keys' inverse scales
// [0, 16) and probability factors [16, 32).
var<workgroup> crange: array<vec2<u32>, 16>;
var<workgroup> ckey: array<f32, 32>;
// The workgroup's keys [lo, hi) (lanes 2-3 unused). A vec4, not a vec2:
// every workgroup variable here is a whole number of 16-byte units. With
// cspan a vec2 the kernel read NaN on the H200 (2026-12-01 at f16691c,
// run 02), most likely because the driver packs the variables in an order of
// its own and a cooperative load or store in csp / cpp, which needs 16-byte
// alignment, then started 8 bytes off.
var<workgroup> cspan: vec4<u32>;

// Row r's score of step key c from the partials (query head slot sg),
// masked: NEG where key kb + c is not row r's.
fn step_score(sg: u32, r: u32, c: u32, kb: u32) -> f32 {
    let j = kb + c;
    let rg = crange[r];
    if (j < rg.x || j >= rg.y) {
        return NEG;
    }
    var s = 0.0;
    for (var dc = 0u; dc < ND; dc++) {
        s += csp[(sg * ND + dc) * 256u + r * 16u + c];
    }
    return s * cqi[sg * 16u + r] * ckey[c];
}

// Thread lid's part of a step's key scales (K: threads 0-15, V: 16-31) for
// the 16 keys from scratch row i.
fn key_scale(g: u32, i: u32, lid: u32) -> f32 {
    if (lid < 16u) {
        return SC[k_scale_at(g, i + lid)];
    }
    if (lid < 32u) {
        return SC[v_factor_at(g, i + lid - 16u)];
    }
    return 0.0;
}

@compute @workgroup_size(WG)
fn attn_prefill_coop(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                     @builtin(local_invocation_index) lid: u32) {
    // (linear_group inline: naga takes a function's result as non-uniform,
    // and id decides the early return before cooperative operations)
    let id = wg.x + wg.y * nwg.x;
    let per = P.kv_heads * P.nhb;
    if (id >= per * P.nrb) {
        return;
    }
    // The latest rows (the most keys) first: the dispatch's tail is light.
    let rb = P.nrb - 1u - id / per;
    let g = (id % per) / P.nhb;
    let hb = id % P.nhb;
    let t0 = rb * 16u;
    let warp = lid / 32u;
    let lane = lid % 32u;
    let sg = warp / ND;
    let dc = warp % ND;
    let hh = hb * NSG + sg;
    // (a slot past the group computes on its group's last head and writes
    // nothing: cooperative operations need every warp)
    let h = g * P.group + min(hh, P.group - 1u);
    let d = P.d;

    if (lid < 16u) {
        let t = t0 + lid;
        var rg = vec2<u32>(0u, 0u);
        if (t < P.m) {
            rg = key_range(t);
        }
        crange[lid] = rg;
    }
    if (lid < NSG * 16u) {
        let s2 = lid / 16u;
        let h2 = g * P.group + min(hb * NSG + s2, P.group - 1u);
        cqi[lid] = SC[(t0 + lid % 16u) * P.heads + h2] * P.scale;
    }
    workgroupBarrier();
    if (lid == 0u) {
        var lo = 0xffffffffu;
        var hi = 0u;
        for (var r = 0u; r < 16u; r++) {
            let rg = crange[r];
            if (rg.y > rg.x) {
                lo = min(lo, rg.x);
                hi = max(hi, rg.y);
            }
        }
        cspan = vec4<u32>(lo, max(lo, hi), 0u, 0u);
    }
    let span = workgroupUniformLoad(&cspan);
    let klo = span.x;
    let khi = span.y;

    // This warp's queries: rows t0.., head h, dims dc * DW .. + DW.
    let qs = d * P.heads;
    let qb = (t0 * P.heads + h) * d + dc * DW;
    let qi0 = qb;
    let qi1 = qb + 16u;
    let qi2 = qb + 32u;
    let qi3 = qb + 48u;
    let qi4 = qb + 64u;
    let qi5 = qb + 80u;
    let qi6 = qb + 96u;
    let qi7 = qb + 112u;
    var q0: coop_mat16x16<f16, A>;
    var q1: coop_mat16x16<f16, A>;
    var q2: coop_mat16x16<f16, A>;
    var q3: coop_mat16x16<f16, A>;
    var q4: coop_mat16x16<f16, A>;
    var q5: coop_mat16x16<f16, A>;
    var q6: coop_mat16x16<f16, A>;
    var q7: coop_mat16x16<f16, A>;
    q0 = coopLoadT<coop_mat16x16<f16, A>>(&Q16[qi0], qs);
    q1 = coopLoadT<coop_mat16x16<f16, A>>(&Q16[qi1], qs);
    q2 = coopLoadT<coop_mat16x16<f16, A>>(&Q16[qi2], qs);
    q3 = coopLoadT<coop_mat16x16<f16, A>>(&Q16[qi3], qs);
    if (DW > 64u) {
        q4 = coopLoadT<coop_mat16x16<f16, A>>(&Q16[qi4], qs);
    }
    if (DW > 64u) {
        q5 = coopLoadT<coop_mat16x16<f16, A>>(&Q16[qi5], qs);
    }
    if (DW > 64u) {
        q6 = coopLoadT<coop_mat16x16<f16, A>>(&Q16[qi6], qs);
    }
    if (DW > 64u) {
        q7 = coopLoadT<coop_mat16x16<f16, A>>(&Q16[qi7], qs);
    }
    // SPLIT: the queries' lo parts (DW = 64: four fragments).
    var ql0: coop_mat16x16<f16, A>;
    var ql1: coop_mat16x16<f16, A>;
    var ql2: coop_mat16x16<f16, A>;
    var ql3: coop_mat16x16<f16, A>;
    let qlo = q_lo();
    let kvl = kv_lo();
    if (SPLIT == 1u) {
        let qj0 = qlo + qi0;
        let qj1 = qlo + qi1;
        let qj2 = qlo + qi2;
        let qj3 = qlo + qi3;
        ql0 = coopLoadT<coop_mat16x16<f16, A>>(&Q16[qj0], qs);
        ql1 = coopLoadT<coop_mat16x16<f16, A>>(&Q16[qj1], qs);
        ql2 = coopLoadT<coop_mat16x16<f16, A>>(&Q16[qj2], qs);
        ql3 = coopLoadT<coop_mat16x16<f16, A>>(&Q16[qj3], qs);
    }
    let cb = warp * 256u;
    // Key step kb's first scratch element for this warp's dims is
    // (g * kvrows + kb % capacity) * d + dc * DW: its slot's row, the
    // step's 16 rows contiguous through the mirror rows (every fragment
    // index a `let`: naga's SPIR-V writer needs it emitted before the
    // cooperative load takes it).
    let kg = g * P.kvrows;
    let kr0 = (kg + klo % P.capacity) * d + dc * DW;

    // Pass 1: each row's max and sum of exp. Thread (slot, row, part) keeps
    // a running max and sum over its part of every step's keys (TPR parts
    // a row); the parts merge once, after the last step.
    let tpr = WG / (NSG * 16u);
    let srow = lid / tpr;
    let part = lid % tpr;
    let kpt = 16u / tpr;
    var rmax = NEG;
    var rsum = 0.0;
    // K^T fragments of the step (column-major) and its key scales, loaded
    // a step ahead.
    let ka0 = kr0;
    let ka1 = kr0 + 16u;
    let ka2 = kr0 + 32u;
    let ka3 = kr0 + 48u;
    let ka4 = kr0 + 64u;
    let ka5 = kr0 + 80u;
    let ka6 = kr0 + 96u;
    let ka7 = kr0 + 112u;
    var k0: coop_mat16x16<f16, B>;
    var k1: coop_mat16x16<f16, B>;
    var k2: coop_mat16x16<f16, B>;
    var k3: coop_mat16x16<f16, B>;
    var k4: coop_mat16x16<f16, B>;
    var k5: coop_mat16x16<f16, B>;
    var k6: coop_mat16x16<f16, B>;
    var k7: coop_mat16x16<f16, B>;
    var kl0: coop_mat16x16<f16, B>;
    var kl1: coop_mat16x16<f16, B>;
    var kl2: coop_mat16x16<f16, B>;
    var kl3: coop_mat16x16<f16, B>;
    k0 = coopLoad<coop_mat16x16<f16, B>>(&K16[ka0], d);
    k1 = coopLoad<coop_mat16x16<f16, B>>(&K16[ka1], d);
    k2 = coopLoad<coop_mat16x16<f16, B>>(&K16[ka2], d);
    k3 = coopLoad<coop_mat16x16<f16, B>>(&K16[ka3], d);
    if (DW > 64u) {
        k4 = coopLoad<coop_mat16x16<f16, B>>(&K16[ka4], d);
    }
    if (DW > 64u) {
        k5 = coopLoad<coop_mat16x16<f16, B>>(&K16[ka5], d);
    }
    if (DW > 64u) {
        k6 = coopLoad<coop_mat16x16<f16, B>>(&K16[ka6], d);
    }
    if (DW > 64u) {
        k7 = coopLoad<coop_mat16x16<f16, B>>(&K16[ka7], d);
    }
    if (SPLIT == 1u) {
        let kj0 = kvl + ka0;
        let kj1 = kvl + ka1;
        let kj2 = kvl + ka2;
        let kj3 = kvl + ka3;
        kl0 = coopLoad<coop_mat16x16<f16, B>>(&K16[kj0], d);
        kl1 = coopLoad<coop_mat16x16<f16, B>>(&K16[kj1], d);
        kl2 = coopLoad<coop_mat16x16<f16, B>>(&K16[kj2], d);
        kl3 = coopLoad<coop_mat16x16<f16, B>>(&K16[kj3], d);
    }
    var kscale = key_scale(g, klo % P.capacity, lid);
    for (var kb = klo; kb < khi; kb += 16u) {
        var s = coop_mat16x16<f32, C>();
        s = coopMultiplyAdd(q0, k0, s);
        s = coopMultiplyAdd(q1, k1, s);
        s = coopMultiplyAdd(q2, k2, s);
        s = coopMultiplyAdd(q3, k3, s);
        if (DW > 64u) {
            s = coopMultiplyAdd(q4, k4, s);
        }
        if (DW > 64u) {
            s = coopMultiplyAdd(q5, k5, s);
        }
        if (DW > 64u) {
            s = coopMultiplyAdd(q6, k6, s);
        }
        if (DW > 64u) {
            s = coopMultiplyAdd(q7, k7, s);
        }
        if (SPLIT == 1u) {
            s = coopMultiplyAdd(q0, kl0, s);
            s = coopMultiplyAdd(q1, kl1, s);
            s = coopMultiplyAdd(q2, kl2, s);
            s = coopMultiplyAdd(q3, kl3, s);
            s = coopMultiplyAdd(ql0, k0, s);
            s = coopMultiplyAdd(ql1, k1, s);
            s = coopMultiplyAdd(ql2, k2, s);
            s = coopMultiplyAdd(ql3, k3, s);
        }
        // The next step's (past the last key: rows never used).
        let kn = (kg + (kb + 16u) % P.capacity) * d + dc * DW;
        let kn0 = kn;
        let kn1 = kn + 16u;
        let kn2 = kn + 32u;
        let kn3 = kn + 48u;
        let kn4 = kn + 64u;
        let kn5 = kn + 80u;
        let kn6 = kn + 96u;
        let kn7 = kn + 112u;
        k0 = coopLoad<coop_mat16x16<f16, B>>(&K16[kn0], d);
        k1 = coopLoad<coop_mat16x16<f16, B>>(&K16[kn1], d);
        k2 = coopLoad<coop_mat16x16<f16, B>>(&K16[kn2], d);
        k3 = coopLoad<coop_mat16x16<f16, B>>(&K16[kn3], d);
        if (DW > 64u) {
            k4 = coopLoad<coop_mat16x16<f16, B>>(&K16[kn4], d);
        }
        if (DW > 64u) {
            k5 = coopLoad<coop_mat16x16<f16, B>>(&K16[kn5], d);
        }
        if (DW > 64u) {
            k6 = coopLoad<coop_mat16x16<f16, B>>(&K16[kn6], d);
        }
        if (DW > 64u) {
            k7 = coopLoad<coop_mat16x16<f16, B>>(&K16[kn7], d);
        }
        if (SPLIT == 1u) {
            let kj0 = kvl + kn0;
            let kj1 = kvl + kn1;
            let kj2 = kvl + kn2;
            let kj3 = kvl + kn3;
            kl0 = coopLoad<coop_mat16x16<f16, B>>(&K16[kj0], d);
            kl1 = coopLoad<coop_mat16x16<f16, B>>(&K16[kj1], d);
            kl2 = coopLoad<coop_mat16x16<f16, B>>(&K16[kj2], d);
            kl3 = coopLoad<coop_mat16x16<f16, B>>(&K16[kj3], d);
        }
        if (lid < 32u) {
            ckey[lid] = kscale;
        }
        kscale = key_scale(g, (kb + 16u) % P.capacity, lid);
        coopStoreT(s, &csp[cb], 16u);
        workgroupBarrier();
        let s2 = srow / 16u;
        let r = srow % 16u;
        var sv: array<f32, 16>;
        var mx = rmax;
        for (var c = 0u; c < kpt; c++) {
            sv[c] = step_score(s2, r, part * kpt + c, kb);
            mx = max(mx, sv[c]);
        }
        var add = 0.0;
        for (var c = 0u; c < kpt; c++) {
            if (sv[c] > NEG) {
                add += exp(sv[c] - mx);
            }
        }
        rsum = rsum * exp(rmax - mx) + add;
        rmax = mx;
        workgroupBarrier();
    }
    // (csp is free: the last step's barrier is behind every read of it)
    csp[2u * lid] = rmax;
    csp[2u * lid + 1u] = rsum;
    workgroupBarrier();
    if (lid < NSG * 16u) {
        var m = NEG;
        for (var i = 0u; i < tpr; i++) {
            m = max(m, csp[2u * (lid * tpr + i)]);
        }
        var l = 0.0;
        for (var i = 0u; i < tpr; i++) {
            let pm = csp[2u * (lid * tpr + i)];
            l += csp[2u * (lid * tpr + i) + 1u] * exp(pm - m);
        }
        cmax[lid] = m;
        cinv[lid] = select(0.0, 1.0 / l, l > 0.0);
    }
    workgroupBarrier();

    // Pass 2: P to f16 in workgroup memory, O += P V.
    var o0 = coop_mat16x16<f32, C>();
    var o1 = coop_mat16x16<f32, C>();
    var o2 = coop_mat16x16<f32, C>();
    var o3 = coop_mat16x16<f32, C>();
    var o4 = coop_mat16x16<f32, C>();
    var o5 = coop_mat16x16<f32, C>();
    var o6 = coop_mat16x16<f32, C>();
    var o7 = coop_mat16x16<f32, C>();
    let pb = sg * 16u * PPS;
    k0 = coopLoad<coop_mat16x16<f16, B>>(&K16[ka0], d);
    k1 = coopLoad<coop_mat16x16<f16, B>>(&K16[ka1], d);
    k2 = coopLoad<coop_mat16x16<f16, B>>(&K16[ka2], d);
    k3 = coopLoad<coop_mat16x16<f16, B>>(&K16[ka3], d);
    if (DW > 64u) {
        k4 = coopLoad<coop_mat16x16<f16, B>>(&K16[ka4], d);
    }
    if (DW > 64u) {
        k5 = coopLoad<coop_mat16x16<f16, B>>(&K16[ka5], d);
    }
    if (DW > 64u) {
        k6 = coopLoad<coop_mat16x16<f16, B>>(&K16[ka6], d);
    }
    if (DW > 64u) {
        k7 = coopLoad<coop_mat16x16<f16, B>>(&K16[ka7], d);
    }
    if (SPLIT == 1u) {
        let kj0 = kvl + ka0;
        let kj1 = kvl + ka1;
        let kj2 = kvl + ka2;
        let kj3 = kvl + ka3;
        kl0 = coopLoad<coop_mat16x16<f16, B>>(&K16[kj0], d);
        kl1 = coopLoad<coop_mat16x16<f16, B>>(&K16[kj1], d);
        kl2 = coopLoad<coop_mat16x16<f16, B>>(&K16[kj2], d);
        kl3 = coopLoad<coop_mat16x16<f16, B>>(&K16[kj3], d);
    }
    var v0: coop_mat16x16<f16, B>;
    var v1: coop_mat16x16<f16, B>;
    var v2: coop_mat16x16<f16, B>;
    var v3: coop_mat16x16<f16, B>;
    var v4: coop_mat16x16<f16, B>;
    var v5: coop_mat16x16<f16, B>;
    var v6: coop_mat16x16<f16, B>;
    var v7: coop_mat16x16<f16, B>;
    var vl0: coop_mat16x16<f16, B>;
    var vl1: coop_mat16x16<f16, B>;
    var vl2: coop_mat16x16<f16, B>;
    var vl3: coop_mat16x16<f16, B>;
    kscale = key_scale(g, klo % P.capacity, lid);
    for (var kb = klo; kb < khi; kb += 16u) {
        // This step's V (row-major), issued before S so that its loads
        // overlap the scores and the softmax.
        let vr = (kg + kb % P.capacity) * d + dc * DW;
        let vi0 = vr;
        let vi1 = vr + 16u;
        let vi2 = vr + 32u;
        let vi3 = vr + 48u;
        let vi4 = vr + 64u;
        let vi5 = vr + 80u;
        let vi6 = vr + 96u;
        let vi7 = vr + 112u;
        v0 = coopLoadT<coop_mat16x16<f16, B>>(&V16[vi0], d);
        v1 = coopLoadT<coop_mat16x16<f16, B>>(&V16[vi1], d);
        v2 = coopLoadT<coop_mat16x16<f16, B>>(&V16[vi2], d);
        v3 = coopLoadT<coop_mat16x16<f16, B>>(&V16[vi3], d);
        if (DW > 64u) {
            v4 = coopLoadT<coop_mat16x16<f16, B>>(&V16[vi4], d);
        }
        if (DW > 64u) {
            v5 = coopLoadT<coop_mat16x16<f16, B>>(&V16[vi5], d);
        }
        if (DW > 64u) {
            v6 = coopLoadT<coop_mat16x16<f16, B>>(&V16[vi6], d);
        }
        if (DW > 64u) {
            v7 = coopLoadT<coop_mat16x16<f16, B>>(&V16[vi7], d);
        }
        if (SPLIT == 1u) {
            let vj0 = kvl + vi0;
            let vj1 = kvl + vi1;
            let vj2 = kvl + vi2;
            let vj3 = kvl + vi3;
            vl0 = coopLoadT<coop_mat16x16<f16, B>>(&V16[vj0], d);
            vl1 = coopLoadT<coop_mat16x16<f16, B>>(&V16[vj1], d);
            vl2 = coopLoadT<coop_mat16x16<f16, B>>(&V16[vj2], d);
            vl3 = coopLoadT<coop_mat16x16<f16, B>>(&V16[vj3], d);
        }
        var s = coop_mat16x16<f32, C>();
        s = coopMultiplyAdd(q0, k0, s);
        s = coopMultiplyAdd(q1, k1, s);
        s = coopMultiplyAdd(q2, k2, s);
        s = coopMultiplyAdd(q3, k3, s);
        if (DW > 64u) {
            s = coopMultiplyAdd(q4, k4, s);
        }
        if (DW > 64u) {
            s = coopMultiplyAdd(q5, k5, s);
        }
        if (DW > 64u) {
            s = coopMultiplyAdd(q6, k6, s);
        }
        if (DW > 64u) {
            s = coopMultiplyAdd(q7, k7, s);
        }
        if (SPLIT == 1u) {
            s = coopMultiplyAdd(q0, kl0, s);
            s = coopMultiplyAdd(q1, kl1, s);
            s = coopMultiplyAdd(q2, kl2, s);
            s = coopMultiplyAdd(q3, kl3, s);
            s = coopMultiplyAdd(ql0, k0, s);
            s = coopMultiplyAdd(ql1, k1, s);
            s = coopMultiplyAdd(ql2, k2, s);
            s = coopMultiplyAdd(ql3, k3, s);
        }
        let kn = (kg + (kb + 16u) % P.capacity) * d + dc * DW;
        let kn0 = kn;
        let kn1 = kn + 16u;
        let kn2 = kn + 32u;
        let kn3 = kn + 48u;
        let kn4 = kn + 64u;
        let kn5 = kn + 80u;
        let kn6 = kn + 96u;
        let kn7 = kn + 112u;
        k0 = coopLoad<coop_mat16x16<f16, B>>(&K16[kn0], d);
        k1 = coopLoad<coop_mat16x16<f16, B>>(&K16[kn1], d);
        k2 = coopLoad<coop_mat16x16<f16, B>>(&K16[kn2], d);
        k3 = coopLoad<coop_mat16x16<f16, B>>(&K16[kn3], d);
        if (DW > 64u) {
            k4 = coopLoad<coop_mat16x16<f16, B>>(&K16[kn4], d);
        }
        if (DW > 64u) {
            k5 = coopLoad<coop_mat16x16<f16, B>>(&K16[kn5], d);
        }
        if (DW > 64u) {
            k6 = coopLoad<coop_mat16x16<f16, B>>(&K16[kn6], d);
        }
        if (DW > 64u) {
            k7 = coopLoad<coop_mat16x16<f16, B>>(&K16[kn7], d);
        }
        if (SPLIT == 1u) {
            let kj0 = kvl + kn0;
            let kj1 = kvl + kn1;
            let kj2 = kvl + kn2;
            let kj3 = kvl + kn3;
            kl0 = coopLoad<coop_mat16x16<f16, B>>(&K16[kj0], d);
            kl1 = coopLoad<coop_mat16x16<f16, B>>(&K16[kj1], d);
            kl2 = coopLoad<coop_mat16x16<f16, B>>(&K16[kj2], d);
            kl3 = coopLoad<coop_mat16x16<f16, B>>(&K16[kj3], d);
        }
        if (lid < 32u) {
            ckey[lid] = kscale;
        }
        kscale = key_scale(g, (kb + 16u) % P.capacity, lid);
        coopStoreT(s, &csp[cb], 16u);
        workgroupBarrier();
        for (var e = lid; e < NSG * 256u; e += WG) {
            let s2 = e / 256u;
            let r = (e / 16u) % 16u;
            let c = e % 16u;
            let sv = step_score(s2, r, c, kb);
            var p = 0.0;
            if (sv > NEG) {
                let i = s2 * 16u + r;
                p = exp(sv - cmax[i]) * cinv[i] * ckey[16u + c];
            }
            let pi = s2 * 16u * PPS + r * PPS + c;
            if (SPLIT == 1u) {
                let ph = half_grid(p);
                cpp[pi] = f16(ph);
                cpp[CPL + pi] = f16(split_lo(p, ph));
            } else {
                cpp[pi] = f16(nearest_half(p));
            }
        }
        workgroupBarrier();
        let pf = coopLoadT<coop_mat16x16<f16, A>>(&cpp[pb], PPS);
        if (SPLIT == 1u) {
            let pbl = CPL + pb;
            let pl = coopLoadT<coop_mat16x16<f16, A>>(&cpp[pbl], PPS);
            o0 = coopMultiplyAdd(pf, vl0, o0);
            o1 = coopMultiplyAdd(pf, vl1, o1);
            o2 = coopMultiplyAdd(pf, vl2, o2);
            o3 = coopMultiplyAdd(pf, vl3, o3);
            o0 = coopMultiplyAdd(pl, v0, o0);
            o1 = coopMultiplyAdd(pl, v1, o1);
            o2 = coopMultiplyAdd(pl, v2, o2);
            o3 = coopMultiplyAdd(pl, v3, o3);
        }
        o0 = coopMultiplyAdd(pf, v0, o0);
        o1 = coopMultiplyAdd(pf, v1, o1);
        o2 = coopMultiplyAdd(pf, v2, o2);
        o3 = coopMultiplyAdd(pf, v3, o3);
        if (DW > 64u) {
            o4 = coopMultiplyAdd(pf, v4, o4);
        }
        if (DW > 64u) {
            o5 = coopMultiplyAdd(pf, v5, o5);
        }
        if (DW > 64u) {
            o6 = coopMultiplyAdd(pf, v6, o6);
        }
        if (DW > 64u) {
            o7 = coopMultiplyAdd(pf, v7, o7);
        }
    }

    // Out through this warp's 16 x 16 of csp, a fragment at a time.
    let on = hh < P.group;
    let ob = h * d + dc * DW;
    workgroupBarrier();
    coopStoreT(o0, &csp[cb], 16u);
    workgroupBarrier();
    emit(on, cb, lane, t0, ob + 0u);
    workgroupBarrier();
    coopStoreT(o1, &csp[cb], 16u);
    workgroupBarrier();
    emit(on, cb, lane, t0, ob + 16u);
    workgroupBarrier();
    coopStoreT(o2, &csp[cb], 16u);
    workgroupBarrier();
    emit(on, cb, lane, t0, ob + 32u);
    workgroupBarrier();
    coopStoreT(o3, &csp[cb], 16u);
    workgroupBarrier();
    emit(on, cb, lane, t0, ob + 48u);
    workgroupBarrier();
    if (DW > 64u) {
        coopStoreT(o4, &csp[cb], 16u);
        workgroupBarrier();
        emit(on, cb, lane, t0, ob + 64u);
        workgroupBarrier();
    }
    if (DW > 64u) {
        coopStoreT(o5, &csp[cb], 16u);
        workgroupBarrier();
        emit(on, cb, lane, t0, ob + 80u);
        workgroupBarrier();
    }
    if (DW > 64u) {
        coopStoreT(o6, &csp[cb], 16u);
        workgroupBarrier();
        emit(on, cb, lane, t0, ob + 96u);
        workgroupBarrier();
    }
    if (DW > 64u) {
        coopStoreT(o7, &csp[cb], 16u);
        workgroupBarrier();
        emit(on, cb, lane, t0, ob + 112u);
        workgroupBarrier();
    }
}

// A 16 x 16 output fragment staged at csp[cb..] (row-major) to OUT: rows
// t0.., columns from `col` of each row's [heads][d] (the head's offset in).
fn emit(on: bool, cb: u32, lane: u32, t0: u32, col: u32) {
    for (var u = 0u; u < 8u; u++) {
        let idx = lane + 32u * u;
        let t = t0 + idx / 16u;
        if (on && t < P.m) {
            OUT[t * P.heads * P.d + col + idx % 16u] = csp[cb + idx];
        }
    }
}
