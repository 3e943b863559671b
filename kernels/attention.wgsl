// Attention over a KV cache ([kv_heads, capacity, head_dim], key j at slot
// j % capacity), split over the keys (flash-decoding) in two dispatches:
//
// attn_split: one workgroup per (key split, kv head g, query tile). A query
//   tile is up to QT "query slots" of kv head g: slot s of the batch is row
//   s / G, head g * G + s % G (G = heads / kv_heads), so the GQA heads of a
//   group, and the rows of a micro-batch, share every K/V read. The tile's
//   key span (the union of its queries' ranges lo..=pos) is cut into
//   `nsplit` chunks; the workgroup walks its chunk 8 keys at a time with an
//   online softmax and writes, per query, the running max, the sum of exp
//   and the unnormalised V accumulator into scratch.
// attn_combine: one workgroup per (query row and head, 32 vec4 of dims):
//   rescales the splits' partials to a common max and normalises.
//
// Memory access: a K row is read by 32 consecutive lanes, each a vec4 at a
// time (NV vec4 per lane: head_dim 512 -> 4, 256 -> 2); a V row likewise by
// consecutive threads over vec4 columns. attn_split keeps its queries in
// registers (attn_decode: see its header). Partial
// dot products are reduced through workgroup memory; attn_combine's max and
// sum go through workgroup_max / workgroup_sum (kernels/reduce*.wgsl:
// subgroup operations where the device has them).

struct Params {
    m: u32,
    heads: u32,
    kv_heads: u32,
    group: u32,
    // head_dim / 4
    d4: u32,
    capacity: u32,
    window: u32,
    scale: f32,
    // Workgroups per (kv head, tile) along the keys (the scratch's split count).
    nsplit: u32,
    // Fewest keys per split: short spans use fewer splits.
    min_chunk: u32,
    // m * group: query slots per kv head.
    nslots: u32,
    ntiles: u32,
    // attn_decode_qkv only (qkv_post's): rotated pairs, the norms' eps, and
    // 1 where V is the raw k (no v part in the raw row).
    rot_pairs: u32,
    eps: f32,
    v_from_k: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> P: Params;

// Lanes per K row, K rows per step, most query slots per tile.
const LK: u32 = 32u;
const KR: u32 = 8u;
const QMAX: u32 = 8u;
// vec4s per reduction row: 32 lanes plus one vec4 of padding (no bank conflicts).
const RS: u32 = 9u;
// "No key": below any real score, finite so that differences stay finite.
const NEG: f32 = -3.0e38;

// vec4 per lane per row (1, 2 or 4) and query slots per tile (1..8).
override NV: u32 = 4u;
override QT: u32 = 8u;

@group(1) @binding(0) var<storage, read> Q: array<vec4<f32>>;
// (read_write in the attention_qkv build, which adds
// kernels/attention_qkv.wgsl's attn_decode_qkv: backends/wgpu/src/kernels.rs
// VARIANTS)
@group(1) @binding(1) var<storage, read> KC: array<vec4<CacheT>>;
@group(1) @binding(2) var<storage, read> VC: array<vec4<CacheT>>;
@group(1) @binding(3) var<storage, read> POS: array<u32>;
// Scratch: acc [nsplit][m * heads][d4], then (max, sum) [nsplit][m * heads].
// Coherent where the device has it: attn_decode's tail reads the other
// splits' partials (TAIL, below).
@group(1) @binding(4) /* @coherent */ var<storage, read_write> PART: array<vec4<f32>>;

var<workgroup> red: array<vec4<f32>, 576>; // KR * QMAX * RS
var<workgroup> sp: array<f32, 64>; // [q][r]: scores, then probabilities
var<workgroup> smax: array<f32, 8>;
var<workgroup> ssum: array<f32, 8>;
var<workgroup> salpha: array<f32, 8>;
var<workgroup> sacc: array<vec4<f32>, 256>;

// key_range: kernels/attention_keys.wgsl.

// The keys the query slots s0 .. s1 see together: the union of their
// rows' ranges (rows are slot / group).
fn slots_key_span(s0: u32, s1: u32) -> vec2<u32> {
    var lo = 0xffffffffu;
    var hi = 0u;
    for (var t = s0 / P.group; t <= (s1 - 1u) / P.group; t++) {
        let r = key_range(t);
        lo = min(lo, r.x);
        hi = max(hi, r.y);
    }
    return vec2<u32>(lo, hi);
}

@compute @workgroup_size(256)
fn attn_split(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let id = linear_group(wg, nwg);
    let split = id % P.nsplit;
    let rest = id / P.nsplit;
    let g = rest % P.kv_heads;
    let tile = rest / P.kv_heads;
    if (tile >= P.ntiles) {
        return;
    }
    let s0 = tile * QT;
    let s1 = min(s0 + QT, P.nslots);
    let nq = P.m * P.heads;

    // The tile's key span and this split's chunk of it.
    let span = slots_key_span(s0, s1);
    let lo = span.x;
    let hi = span.y;
    let n = hi - lo;
    let nsplit = min(P.nsplit, max(1u, (n + P.min_chunk - 1u) / P.min_chunk));
    let chunk = ((n + nsplit - 1u) / nsplit + KR - 1u) / KR * KR;
    let c_lo = min(lo + split * chunk, hi);
    let c_hi = min(c_lo + chunk, hi);

    // This thread's roles: K lane (row r, lane) and score slot q.
    let r = lid / LK;
    let lane = lid % LK;
    let q_me = lid % QT;
    var q_lo = 0u;
    var q_hi = 0u;
    if (s0 + q_me < s1) {
        let kr = key_range((s0 + q_me) / P.group);
        q_lo = max(kr.x, c_lo);
        q_hi = min(kr.y, c_hi);
    }

    // Query slices in registers: qv[q * NV + i] = dims (lane + 32 i) * 4.. of slot q.
    // (Staged in workgroup memory instead, attn full 8K at m = 16 on the
    // H200 stayed at 1.58 ms: registers are not what holds this kernel.)
    var qv: array<vec4<f32>, 32>;
    for (var q = 0u; q < QT; q++) {
        let s = s0 + q;
        for (var i = 0u; i < NV; i++) {
            let idx = lane + LK * i;
            var v = vec4<f32>(0.0);
            if (s < s1 && idx < P.d4) {
                let h = g * P.group + s % P.group;
                v = Q[((s / P.group) * P.heads + h) * P.d4 + idx];
            }
            qv[q * NV + i] = v;
        }
    }
    if (lid < QT) {
        smax[lid] = NEG;
        ssum[lid] = 0.0;
    }
    // V roles: column c of slice vs; a slice takes every VS-th row of a step.
    let dp = NV * LK;
    let vsn = 256u / dp;
    let c = lid % dp;
    let vs = lid / dp;
    // Slot q's value accumulator is a<q>: named registers, not an array
    // indexed in loops over the slots (attn_decode's rule, 2026-12-01:
    // the NVIDIA driver kept such arrays in local memory); those past QT
    // are computed on other slots' values and never stored (QT is a
    // constant).
    var a0 = vec4<f32>(0.0);
    var a1 = vec4<f32>(0.0);
    var a2 = vec4<f32>(0.0);
    var a3 = vec4<f32>(0.0);
    var a4 = vec4<f32>(0.0);
    var a5 = vec4<f32>(0.0);
    var a6 = vec4<f32>(0.0);
    var a7 = vec4<f32>(0.0);
    let kbase = g * P.capacity;

    for (var j0 = c_lo; j0 < c_hi; j0 += KR) {
        // Issue this step's K and V loads together: the V rows arrive while
        // the scores are reduced. A slice's V rows are vs, vs + vsn, ...
        // (NV of them, since vsn = 8 / NV).
        let j = j0 + r;
        var kreg: array<vec4<f32>, 4>;
        var vreg: array<vec4<f32>, 4>;
        for (var i = 0u; i < NV; i++) {
            let idx = lane + LK * i;
            var k = vec4<f32>(0.0);
            if (j < c_hi && idx < P.d4) {
                k = vec4<f32>(KC[(kbase + j % P.capacity) * P.d4 + idx]);
            }
            kreg[i] = k;
            let jj = j0 + vs + i * vsn;
            var v = vec4<f32>(0.0);
            if (jj < c_hi && c < P.d4) {
                v = vec4<f32>(VC[(kbase + jj % P.capacity) * P.d4 + c]);
            }
            vreg[i] = v;
        }
        // Partial dots of key j with every query over this lane's dims,
        // slots 0-3 and 4-7 as the lanes of two named vec4 (slots past QT
        // dot qv's zeros and are never stored).
        var pa = vec4<f32>(0.0);
        var pb = vec4<f32>(0.0);
        for (var i = 0u; i < NV; i++) {
            let kt = kreg[i];
            pa += vec4<f32>(dot(qv[i], kt), dot(qv[NV + i], kt), dot(qv[2u * NV + i], kt), dot(qv[3u * NV + i], kt));
            if (QT > 4u) {
                pb += vec4<f32>(dot(qv[4u * NV + i], kt), dot(qv[5u * NV + i], kt), dot(qv[6u * NV + i], kt), dot(qv[7u * NV + i], kt));
            }
        }
        for (var q = 0u; q < min(QT, 4u); q++) {
            red[(r * QT + q) * RS + lane / 4u][lane % 4u] = pa[q];
        }
        for (var q = 4u; q < QT; q++) {
            red[(r * QT + q) * RS + lane / 4u][lane % 4u] = pb[q - 4u];
        }
        workgroupBarrier();

        // Scores: one thread per (row, query), summing the 32 lanes.
        if (lid < KR * QT) {
            let rr = lid / QT;
            let base = (rr * QT + q_me) * RS;
            var s4 = vec4<f32>(0.0);
            for (var k = 0u; k < 8u; k++) {
                s4 += red[base + k];
            }
            let jj = j0 + rr;
            var sc = NEG;
            if (jj >= q_lo && jj < q_hi) {
                sc = (s4.x + s4.y + s4.z + s4.w) * P.scale;
            }
            sp[q_me * KR + rr] = sc;
        }
        workgroupBarrier();

        // Online softmax: one thread per query.
        if (lid < QT) {
            let mold = smax[lid];
            var mnew = mold;
            for (var k = 0u; k < KR; k++) {
                mnew = max(mnew, sp[lid * KR + k]);
            }
            let alpha = exp(mold - mnew);
            var l = 0.0;
            for (var k = 0u; k < KR; k++) {
                let sc = sp[lid * KR + k];
                var p = 0.0;
                if (sc > NEG) {
                    p = exp(sc - mnew);
                }
                sp[lid * KR + k] = p;
                l += p;
            }
            ssum[lid] = ssum[lid] * alpha + l;
            smax[lid] = mnew;
            salpha[lid] = alpha;
        }
        workgroupBarrier();

        // V: a<q> = a<q> * alpha + sum_r p[q][r] * V[j0 + r] (slots past
        // QT read other slots' values: finite, unused).
        a0 *= salpha[0];
        a1 *= salpha[min(1u, QT - 1u)];
        a2 *= salpha[min(2u, QT - 1u)];
        a3 *= salpha[min(3u, QT - 1u)];
        if (QT > 4u) {
            a4 *= salpha[min(4u, QT - 1u)];
            a5 *= salpha[min(5u, QT - 1u)];
            a6 *= salpha[min(6u, QT - 1u)];
            a7 *= salpha[min(7u, QT - 1u)];
        }
        for (var i = 0u; i < NV; i++) {
            let rr = vs + i * vsn;
            if (j0 + rr < c_hi) {
                let v = vreg[i];
                a0 += sp[rr] * v;
                a1 += sp[min(1u, QT - 1u) * KR + rr] * v;
                a2 += sp[min(2u, QT - 1u) * KR + rr] * v;
                a3 += sp[min(3u, QT - 1u) * KR + rr] * v;
                if (QT > 4u) {
                    a4 += sp[min(4u, QT - 1u) * KR + rr] * v;
                    a5 += sp[min(5u, QT - 1u) * KR + rr] * v;
                    a6 += sp[min(6u, QT - 1u) * KR + rr] * v;
                    a7 += sp[min(7u, QT - 1u) * KR + rr] * v;
                }
            }
        }
    }

    let mlbase = P.nsplit * nq * P.d4;
    if (lid < QT && s0 + lid < s1) {
        let s = s0 + lid;
        let slot = (s / P.group) * P.heads + g * P.group + s % P.group;
        PART[mlbase + split * nq + slot] = vec4<f32>(smax[lid], ssum[lid], 0.0, 0.0);
    }
    if (c_lo >= c_hi) {
        return;
    }
    // Sum the slices' accumulators and store them, a slot at a time.
    let tile_of = vec4<u32>(split, s0, s1, g);
    split_store(0u, a0, lid, tile_of);
    split_store(1u, a1, lid, tile_of);
    split_store(2u, a2, lid, tile_of);
    split_store(3u, a3, lid, tile_of);
    split_store(4u, a4, lid, tile_of);
    split_store(5u, a5, lid, tile_of);
    split_store(6u, a6, lid, tile_of);
    split_store(7u, a7, lid, tile_of);
}

// Slot q's value partials, summed over the slices, into PART (q < QT: a
// uniform condition, QT being a constant). `t`: the split, the tile's
// first slot and one past its last, the kv head.
fn split_store(q: u32, a: vec4<f32>, lid: u32, t: vec4<u32>) {
    if (q >= QT) {
        return;
    }
    let dp = NV * LK;
    let s = t.y + q;
    let slot = (s / P.group) * P.heads + t.w * P.group + s % P.group;
    slices_to_part(a, lid, dp, 256u / dp, P.d4, t.x * P.m * P.heads + slot, s < t.z);
}

// A value accumulator held in slices (invocation lid has column lid %
// width of slice lid / width) summed over its `nslices` slices into PART
// row `row` (`d4` vec4 a row), where `keep`. Every invocation calls it
// (its barriers).
fn slices_to_part(a: vec4<f32>, lid: u32, width: u32, nslices: u32, d4: u32, row: u32, keep: bool) {
    workgroupBarrier();
    sacc[lid] = a;
    workgroupBarrier();
    if (keep && lid < width && lid < d4) {
        var sum = sacc[lid];
        for (var k = 1u; k < nslices; k++) {
            sum += sacc[k * width + lid];
        }
        PART[row * d4 + lid] = sum;
    }
}

// ---- decode and short batches (m <= 16): attn_decode ----------------------
//
// The split phase for up to 16 query rows, in place of attn_split (same
// PART layout, same attn_combine after it). Workgroup (block of RPW rows,
// kv head g, split) walks its chunk of the rows' keys 32 at a time, over
// NS = RPW x GD query slots (the rows' query heads of g): wide groups (8
// heads of 512) a row a workgroup, the rows' K / V reads shared through the
// cache only; narrow ones as many rows as fill 8 slots.
//   scores  thread (key kk = lid / 8, dim part dp = lid % 8) dots vec4
//           columns dp, dp + 8, ... of its key with the NS queries (a
//           pipeline constant, so the NS accumulators are registers); the
//           8 parts are summed through workgroup memory. The queries are
//           read from global memory (cached: one row of a small group) or
//           staged in workgroup memory first (DQN > 1).
//   softmax one thread per (slot, key): the running max and the key's
//           exp (a key past the slot's row's range: none); one thread per
//           slot sums the chunk's exps.
//   values  thread (column c = lid % D4, key slice lid / D4) accumulates
//           p * V over its slice's keys for the NS slots, in registers.
// No subgroup operations; every loop with a barrier in it has a constant or
// uniform bound.

// Query heads per kv head and head_dim / 4, compiled in per layer type.
override GD: u32 = 1u;
// Query rows a workgroup takes together (a launch of several rows whose
// groups are narrow: 8 / GD of them), and its query slots NS = GD * RPW:
// slot q is row row0 + q / GD's head g * GD + q % GD. Slots are what the
// chunk's roles, sums and accumulators run over; with RPW = 1 they are the
// kv head's query heads.
override RPW: u32 = 1u;
override NS: u32 = GD * RPW;
override D4: u32 = 64u;
// Whether the launch has several query rows. Without, the row is 0 and a
// workgroup's index is one row's (kv head, split): the rows' indexing cost
// one row 1.5-2% at full layers' 8K and 32K keys on the H200 (2026-12-01
// at fa0b043, run 05).
override MROWS: bool = false;
// Whether a split's next chunk of keys is loaded during the current one
// (the launcher sets it where splits take several chunks: on the H200 the
// sliding layers' single-chunk splits were 20% slower with the loads laid
// out so, 14.5 -> 17.4 us at 1K keys, 2026-12-01 at fa0b043, runs 02-03).
override PIPE: bool = false;
// Keys per chunk and dim parts per key (KD * DP = 256 threads).
const KD: u32 = 32u;
const DP: u32 = 8u;
// The width of the device's subgroups where it has one (8, 16 or 32; the
// launcher sets it): thread (slot q, key k) of a chunk is then invocation
// q * KD + k, a slot's keys are whole subgroups, and the chunk's softmax
// takes its max and sum by subgroup (`keys_max`, `keys_sum`) with the
// slots' running max and sum in registers: two barriers a chunk with
// 32-wide subgroups, not seven (narrower ones add two a reduction, their
// subgroups' results combined through dsg). 0: the softmax through
// workgroup memory, one thread per slot.
override SGW: u32 = 0u;
// Subgroup results of the slots' keys where a subgroup is narrower than KD.
var<workgroup> dsg: array<f32, 32>;

var<workgroup> dred: array<f32, 2048>; // [DP][NS][KD], then scores [NS][KD]
// The chunk's probabilities [NS][KD], which the value phase reads.
var<workgroup> dp: array<f32, 256>;
var<workgroup> dmax: array<f32, 8>;
var<workgroup> dsum: array<f32, 8>;
var<workgroup> dalpha: array<f32, 8>;
var<workgroup> dmnew: array<f32, 8>;
// The slots' queries, [NS][D4], where they are staged: DQN = NS * D4
// (at most 1024 with head_dim <= 512), else 1, so the decode kernels of
// one row of a small group do not reserve the 16 KB. Several rows are
// always staged; one row's: for 8 heads of 512 (128 loads of Q per thread
// a chunk) they were a chain of cache round trips per key (attn full 8K
// on the H200: 117 -> 108 us); 2 heads of 256 read them from memory
// (cached): 14.7 us at every context on the H200, BENCHMARKS.md.
override DQN: u32 = 1024u;
var<workgroup> dq: array<vec4<f32>, DQN>;

// Most vec4 a thread loads before using them: the K columns of its key
// (NT = ceil(D4 / DP) of them) and the V rows of its slice (vrows), both at most
// 16 with head_dim <= 512 (ops::MAX_HEAD_DIM). The arrays must unroll into
// registers (constant trip counts): an array indexed by a loop the driver
// cannot unroll lives in memory.
const DB: u32 = 16u;
override NT: u32 = (D4 + DP - 1u) / DP;

// Query vec4 i of the slots ([NS][D4]).
fn query(qbase: u32, i: u32) -> vec4<f32> {
    if (DQN > 1u) {
        return dq[i];
    }
    return Q[qbase + i];
}

// The keys of rows row0 .. row0 + RPW (those below P.m) together.
fn rows_span(row0: u32) -> vec2<u32> {
    var kr = key_range(row0);
    for (var r = row0 + 1u; r < min(row0 + RPW, P.m); r++) {
        let o = key_range(r);
        kr = vec2<u32>(min(kr.x, o.x), max(kr.y, o.y));
    }
    return kr;
}

// Query slot q's row-major index in Q and PART's slots ([m][heads]).
fn slot_of(row0: u32, g: u32, q: u32) -> u32 {
    return (row0 + q / GD) * P.heads + g * GD + q % GD;
}

// The keys [lo, hi) of split `split` of the rows from row0 (the splits
// that short spans leave without keys get an empty range).
fn decode_span(row0: u32, split: u32) -> vec2<u32> {
    let kr = rows_span(row0);
    let n = kr.y - kr.x;
    let nsplit = min(P.nsplit, max(1u, (n + P.min_chunk - 1u) / P.min_chunk));
    let chunk = ((n + nsplit - 1u) / nsplit + KD - 1u) / KD * KD;
    let c_lo = min(kr.x + split * chunk, kr.y);
    return vec2<u32>(c_lo, min(c_lo + chunk, kr.y));
}

@compute @workgroup_size(256)
fn attn_decode(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    decode_body(linear_group(wg, nwg), lid, true);
}

// Workgroup `id`'s split of attn_decode: (block of RPW query rows, kv head
// g, split), the split fastest; `stage`: copy the slots' queries from Q
// into dq first (where DQN > 1; attn_decode_qkv built them there).
fn decode_body(id: u32, lid: u32, stage: bool) {
    let split = id % P.nsplit;
    var g = id / P.nsplit;
    var row0 = 0u;
    if (MROWS) {
        row0 = g / P.kv_heads * RPW;
        g = g % P.kv_heads;
    }
    if (row0 >= P.m || g >= P.kv_heads) {
        return;
    }
    let nq = P.m * P.heads;
    let span = decode_span(row0, split);
    let c_lo = span.x;
    let c_hi = span.y;
    let kbase = g * P.capacity;
    // Slot 0's queries (unstaged: RPW = 1, the slots one row's heads).
    let qbase = slot_of(row0, g, 0u) * D4;

    // Score roles: key kk, vec4 columns dpart, dpart + DP, ... of it (the DP
    // lanes of a key read 128 contiguous bytes per step: coalesced).
    let kk = lid / DP;
    let dpart = lid % DP;
    // Value roles: column c, keys vs * vrows .. of the chunk.
    let c = lid % D4;
    let vslices = min(256u / D4, KD);
    let vs = lid / D4;
    let vrows = (KD + vslices - 1u) / vslices;

    if (lid < NS) {
        dmax[lid] = NEG;
        dsum[lid] = 0.0;
    }
    // (SGW: the running max and sum of this thread's slot, lid / KD)
    var mrun = NEG;
    var lrun = 0.0;
    // With several rows, the keys of this thread's score slot (lid / KD)
    // within the span: its row's (none past P.m).
    var s_lo = c_lo;
    var s_hi = c_hi;
    if (RPW > 1u && lid < NS * KD) {
        let r = row0 + lid / KD / GD;
        var kr = vec2<u32>(0u, 0u);
        if (r < P.m) {
            kr = key_range(r);
        }
        s_lo = max(kr.x, c_lo);
        s_hi = min(kr.y, c_hi);
    }
    // Slot q's value accumulator is a<q>: named registers, not an array
    // indexed in loops (which a driver that does not unroll the loops keeps
    // in local memory); slots past NS are never touched (NS is constant).
    var a0 = vec4<f32>(0.0);
    var a1 = vec4<f32>(0.0);
    var a2 = vec4<f32>(0.0);
    var a3 = vec4<f32>(0.0);
    var a4 = vec4<f32>(0.0);
    var a5 = vec4<f32>(0.0);
    var a6 = vec4<f32>(0.0);
    var a7 = vec4<f32>(0.0);
    if (DQN > 1u && stage) {
        for (var i = lid; i < NS * D4; i += 256u) {
            let q = i / D4;
            var v = vec4<f32>(0.0);
            if (row0 + q / GD < P.m) {
                v = Q[slot_of(row0, g, q) * D4 + i % D4];
            }
            dq[i] = v;
        }
        workgroupBarrier();
    }

    // The K columns of this thread's key (past the chunk: its last key,
    // masked below). With PIPE, those of the first chunk here, and each
    // chunk then loads the next chunk's as soon as its own scores are taken
    // (below), so that they arrive during its softmax and values rather
    // than after its last barrier; without, each chunk its own first.
    var kv: array<vec4<f32>, DB>;
    if (PIPE && c_lo < c_hi) {
        let krow = (kbase + min(c_lo + kk, c_hi - 1u) % P.capacity) * D4;
        for (var t = 0u; t < NT; t++) {
            kv[t] = vec4<f32>(KC[krow + min(dpart + DP * t, D4 - 1u)]);
        }
    }
    for (var j0 = c_lo; j0 < c_hi; j0 += KD) {
        if (!PIPE) {
            let krow = (kbase + min(j0 + kk, c_hi - 1u) % P.capacity) * D4;
            for (var t = 0u; t < NT; t++) {
                kv[t] = vec4<f32>(KC[krow + min(dpart + DP * t, D4 - 1u)]);
            }
        }
        // Heads 0-3 and 4-7's partial scores (as the accumulators: named).
        var pa = vec4<f32>(0.0);
        var pb = vec4<f32>(0.0);
        for (var t = 0u; t < NT; t++) {
            let i = dpart + DP * t;
            if (i < D4) {
                let kt = kv[t];
                pa += vec4<f32>(qdot(qbase, 0u, i, kt), qdot(qbase, 1u, i, kt), qdot(qbase, 2u, i, kt), qdot(qbase, 3u, i, kt));
                if (NS > 4u) {
                    pb += vec4<f32>(qdot(qbase, 4u, i, kt), qdot(qbase, 5u, i, kt), qdot(qbase, 6u, i, kt), qdot(qbase, 7u, i, kt));
                }
            }
        }
        // This slice's V rows, issued once the scores are taken: they
        // arrive while the scores are reduced.
        var vv: array<vec4<f32>, DB>;
        for (var r = 0u; r < vrows; r++) {
            // (past the chunk: its last key's row, finite, unused)
            let key = min(j0 + vs * vrows + r, c_hi - 1u);
            vv[r] = vec4<f32>(VC[(kbase + key % P.capacity) * D4 + c]);
        }
        // The scores are in pa / pb: kv's registers take the next chunk's
        // keys (a uniform test: the span is the workgroup's). (The loads
        // are written out three times rather than in a function taking kv
        // by pointer: the array must stay in registers.)
        if (PIPE && j0 + KD < c_hi) {
            let krow = (kbase + min(j0 + KD + kk, c_hi - 1u) % P.capacity) * D4;
            for (var t = 0u; t < NT; t++) {
                kv[t] = vec4<f32>(KC[krow + min(dpart + DP * t, D4 - 1u)]);
            }
        }
        for (var q = 0u; q < min(NS, 4u); q++) {
            dred[(dpart * NS + q) * KD + kk] = pa[q];
        }
        for (var q = 4u; q < NS; q++) {
            dred[(dpart * NS + q) * KD + kk] = pb[q - 4u];
        }
        workgroupBarrier();

        // Scores: thread (q, key) sums the DP parts.
        var sc = NEG;
        if (lid < NS * KD) {
            let q = lid / KD;
            let k = lid % KD;
            var s = 0.0;
            for (var d = 0u; d < DP; d++) {
                s += dred[(d * NS + q) * KD + k];
            }
            // (with RPW = 1 the span's end alone, as one row's decode had)
            var seen = j0 + k < c_hi;
            if (RPW > 1u) {
                seen = j0 + k >= s_lo && j0 + k < s_hi;
            }
            if (seen) {
                sc = s * P.scale;
            }
        }
        if (SGW > 0u) {
            // Online softmax by subgroup: the slot's chunk max, its keys'
            // exps and their sum, the same in every thread of the slot.
            // (Past NS * KD: no key, nothing written.)
            let mnew = max(mrun, keys_max(sc, lid));
            var pk = 0.0;
            if (sc > NEG) {
                pk = exp(sc - mnew);
            }
            let alpha = exp(mrun - mnew);
            lrun = lrun * alpha + keys_sum(pk, lid);
            mrun = mnew;
            if (lid < NS * KD) {
                dp[lid] = pk;
                if (lid % KD == 0u) {
                    dalpha[lid / KD] = alpha;
                }
            }
            workgroupBarrier();
        } else {
            workgroupBarrier();
            if (lid < NS * KD) {
                dred[lid] = sc;
            }
            workgroupBarrier();

            // Online softmax. Thread (head q, key k) finds the head's new running
            // max over the chunk's scores (independent loads, no chain) and its
            // own key's exp; then one thread per head adds the chunk's exps. The
            // same arithmetic in the same order as one thread per head doing it
            // all, without its chain of 2 x KD dependent steps and KD exps.
            var pk = 0.0;
            if (lid < NS * KD) {
                let q = lid / KD;
                var mnew = dmax[q];
                for (var k = 0u; k < KD; k++) {
                    mnew = max(mnew, dred[q * KD + k]);
                }
                if (sc > NEG) {
                    pk = exp(sc - mnew);
                }
                if (lid % KD == 0u) {
                    dmnew[q] = mnew;
                }
            }
            workgroupBarrier();
            if (lid < NS * KD) {
                dp[lid] = pk;
            }
            workgroupBarrier();
            if (lid < NS) {
                let mold = dmax[lid];
                let mnew = dmnew[lid];
                let alpha = exp(mold - mnew);
                var l = 0.0;
                for (var k = 0u; k < KD; k++) {
                    l += dp[lid * KD + k];
                }
                dsum[lid] = dsum[lid] * alpha + l;
                dmax[lid] = mnew;
                dalpha[lid] = alpha;
            }
            workgroupBarrier();
        }

        // Values: this slice's keys of the chunk.
        if (vs < vslices) {
            a0 *= dalpha[0];
            a1 *= dalpha[1];
            a2 *= dalpha[2];
            a3 *= dalpha[3];
            if (NS > 4u) {
                a4 *= dalpha[4];
                a5 *= dalpha[5];
                a6 *= dalpha[6];
                a7 *= dalpha[7];
            }
            for (var r = 0u; r < vrows; r++) {
                let k = vs * vrows + r;
                if (k < KD && j0 + k < c_hi) {
                    let v = vv[r];
                    // (slots past NS read other slots' p: finite, unused)
                    a0 += dp[k] * v;
                    a1 += dp[KD + k] * v;
                    a2 += dp[2u * KD + k] * v;
                    a3 += dp[3u * KD + k] * v;
                    if (NS > 4u) {
                        a4 += dp[4u * KD + k] * v;
                        a5 += dp[5u * KD + k] * v;
                        a6 += dp[6u * KD + k] * v;
                        a7 += dp[7u * KD + k] * v;
                    }
                }
            }
        }
        // dred and dp are rewritten by the next chunk. (SGW: the next
        // chunk's partial scores go to dred, which this chunk last read
        // before its barrier, and its probabilities to dp after the next
        // barrier, which every thread passes once done with these.)
        if (SGW == 0u) {
            workgroupBarrier();
        }
    }
    if (SGW > 0u) {
        if (lid < NS * KD && lid % KD == 0u) {
            dmax[lid / KD] = mrun;
            dsum[lid / KD] = lrun;
        }
        workgroupBarrier();
    }

    let mlbase = P.nsplit * nq * D4;
    if (lid < NS && row0 + lid / GD < P.m) {
        PART[mlbase + split * nq + slot_of(row0, g, lid)] = vec4<f32>(dmax[lid], dsum[lid], 0.0, 0.0);
    }
    // Sum the slices' accumulators, one slot at a time (a split that saw no
    // keys has none: attn_combine gives it weight 0).
    if (c_lo < c_hi) {
        let at = vec3<u32>(split * nq, row0, g);
        sum_slices(0u, a0, lid, at);
        sum_slices(1u, a1, lid, at);
        sum_slices(2u, a2, lid, at);
        sum_slices(3u, a3, lid, at);
        sum_slices(4u, a4, lid, at);
        sum_slices(5u, a5, lid, at);
        sum_slices(6u, a6, lid, at);
        sum_slices(7u, a7, lid, at);
    }
    if (TAIL) {
        decode_tail(id / P.nsplit, row0, g, lid);
    }
}

// ---- attn_combine as attn_decode's tail (TAIL) ----------------------------
//
// Where the device has coherent storage (the launcher sets TAIL), the last
// split workgroup of each (row block, kv head) to finish combines that
// group's slots into TOUT itself, as attn_combine would: one dependent
// dispatch a decode layer fewer. The splits count in on TCNT[group]
// (kernels/tail.wgsl's tail_last; PART is coherent). The launcher takes it
// only where the group's partials are small (NS * nsplit <= 256 (max, sum)
// pairs, which the tail stages in dred; the bytes, a few tens of KB) so
// that one workgroup combines them in about what attn_combine's launch
// would take.
@group(1) @binding(5) var<storage, read_write> TOUT: array<vec4<f32>>;
@group(1) @binding(6) var<storage, read_write> TCNT: array<atomic<u32>>;
override TAIL: bool = false;

// Count this split of group `gi` (rows from row0, kv head g) in; the last
// combines. Called by every invocation, in uniform control flow.
fn decode_tail(gi: u32, row0: u32, g: u32, lid: u32) {
    if (tail_last(gi, P.nsplit, lid)) {
        tail_combine(row0, g, lid);
    }
}

// attn_combine's arithmetic for the NS slots of (row0, g): the splits'
// (max, sum) staged in dred ([NS][nsplit] maxes from 0, sums from 256,
// weights exp(max - m) from 512), the totals in dsum, then thread (split
// group sg, vec4 column) adds its splits' weighted partials, CB loads at a
// time, and the groups are summed through sacc.
fn tail_combine(row0: u32, g: u32, lid: u32) {
    let nq = P.m * P.heads;
    let ns = P.nsplit;
    let mlbase = ns * nq * D4;
    if (lid < NS * ns) {
        let q = lid / ns;
        var e = vec4<f32>(NEG, 0.0, 0.0, 0.0);
        if (row0 + q / GD < P.m) {
            e = PART[mlbase + (lid % ns) * nq + slot_of(row0, g, q)];
        }
        dred[lid] = select(NEG, e.x, e.y > 0.0);
        dred[256u + lid] = e.y;
    }
    workgroupBarrier();
    if (lid < NS * ns) {
        let q = lid / ns;
        var m = NEG;
        for (var k = 0u; k < ns; k++) {
            m = max(m, dred[q * ns + k]);
        }
        var w = 0.0;
        if (dred[256u + lid] > 0.0) {
            w = exp(dred[lid] - m);
        }
        dred[512u + lid] = w;
    }
    workgroupBarrier();
    if (lid < NS) {
        var l = 0.0;
        for (var k = 0u; k < ns; k++) {
            l += dred[512u + lid * ns + k] * dred[256u + lid * ns + k];
        }
        dsum[lid] = l;
    }
    workgroupBarrier();
    // Columns (slot, vec4) of the group: 256 a pass, or fewer with the
    // splits shared among 256 / width groups of threads.
    let nc = NS * D4;
    let width = min(nc, 256u);
    let nsg = 256u / width;
    let sg = lid / width;
    for (var c0 = 0u; c0 < nc; c0 += 256u) {
        let col = c0 + lid % width;
        let q = min(col / D4, NS - 1u);
        let c = col % D4;
        let slot = slot_of(row0, g, q);
        var a = vec4<f32>(0.0);
        if (sg < nsg) {
            for (var k0 = sg; k0 < ns; k0 += nsg * CB) {
                var pv: array<vec4<f32>, CB>;
                for (var u = 0u; u < CB; u++) {
                    let k = min(k0 + nsg * u, ns - 1u);
                    pv[u] = PART[(k * nq + slot) * D4 + c];
                }
                for (var u = 0u; u < CB; u++) {
                    let k = k0 + nsg * u;
                    let w = select(0.0, dred[512u + q * ns + min(k, ns - 1u)], k < ns);
                    a += select(vec4<f32>(0.0), w * pv[u], w != 0.0);
                }
            }
        }
        // (threads past nsg groups, where width does not divide 256, idle)
        let keep = sg == 0u && col < nc && row0 + q / GD < P.m;
        if (nsg > 1u) {
            sacc[lid] = a;
            workgroupBarrier();
            if (keep) {
                var o = sacc[lid];
                for (var s = 1u; s < nsg; s++) {
                    o += sacc[s * width + lid];
                }
                TOUT[slot * D4 + c] = o / dsum[q];
            }
        } else if (keep) {
            TOUT[slot * D4 + c] = a / dsum[q];
        }
    }
}

// `r`, a subgroup's max (or sum) of its invocations' values, over the
// KD = 32 invocations of this thread's slot (invocations q * KD ..): as it
// is where a subgroup spans them, else through workgroup memory, each
// thread of the slot summing the same partials in the same order. Call
// from uniform control flow.
fn keys_combine(r: f32, lid: u32, is_max: bool) -> f32 {
    if (SGW >= KD) {
        return r;
    }
    // (SGW = 0 never calls this; the max keeps its constants defined)
    let w = max(SGW, 1u);
    if (lid % w == 0u) {
        dsg[lid / w] = r;
    }
    workgroupBarrier();
    let n = KD / w;
    let base = lid / KD * n;
    var t = dsg[base];
    for (var i = 1u; i < n; i++) {
        if (is_max) {
            t = max(t, dsg[base + i]);
        } else {
            t += dsg[base + i];
        }
    }
    workgroupBarrier();
    return t;
}

// The largest `v` of this thread's slot's keys (keys_combine).
fn keys_max(v: f32, lid: u32) -> f32 {
    return keys_combine(lanes_max(v), lid, true);
}

// The sum of `v` over this thread's slot's keys (keys_combine).
fn keys_sum(v: f32, lid: u32) -> f32 {
    return keys_combine(lanes_sum(v), lid, false);
}

// Query slot q's dot with key columns kt at vec4 i, 0 past the slots.
fn qdot(qbase: u32, q: u32, i: u32, kt: vec4<f32>) -> f32 {
    if (q < NS) {
        return dot(query(qbase, q * D4 + i), kt);
    }
    return 0.0;
}

// Slot q's value partials summed over the slices into PART (q < NS: a
// uniform condition, NS being a constant; written where the slot's row is
// below P.m, uniform too). `at`: the split's first PART row, row0 and g.
fn sum_slices(q: u32, a: vec4<f32>, lid: u32, at: vec3<u32>) {
    if (q >= NS) {
        return;
    }
    let keep = at.y + q / GD < P.m;
    slices_to_part(a, lid, D4, min(256u / D4, KD), D4, at.x + slot_of(at.y, at.z, q), keep);
}

@group(1) @binding(0) var<storage, read> PARTS: array<vec4<f32>>;
@group(1) @binding(1) var<storage, read_write> OUT: array<vec4<f32>>;

// Partials a thread of attn_combine loads at once.
const CB: u32 = 8u;

var<workgroup> cw: array<f32, 256>;
var<workgroup> cacc: array<vec4<f32>, 256>;

@compute @workgroup_size(256)
fn attn_combine(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let id = linear_group(wg, nwg);
    let nblk = (P.d4 + 31u) / 32u;
    let slot = id / nblk;
    let blk = id % nblk;
    let nq = P.m * P.heads;
    if (slot >= nq) {
        return;
    }
    let mlbase = P.nsplit * nq * P.d4;

    // Common max over the splits that saw keys.
    var mx = NEG;
    for (var k = lid; k < P.nsplit; k += 256u) {
        let e = PARTS[mlbase + k * nq + slot];
        if (e.y > 0.0) {
            mx = max(mx, e.x);
        }
    }
    let m = workgroup_max(mx, lid, 256u);

    // Each split's weight exp(max_k - m), and the total sum of exp.
    var l = 0.0;
    for (var k = lid; k < P.nsplit; k += 256u) {
        let e = PARTS[mlbase + k * nq + slot];
        var w = 0.0;
        if (e.y > 0.0) {
            w = exp(e.x - m);
        }
        cw[k] = w;
        l += w * e.y;
    }
    // (its barrier, which every build has, also publishes cw)
    let total = workgroup_sum(l, lid, 256u);

    // 8 groups of splits x 32 vec4 columns, then a sum over the groups.
    let ci = lid % 32u;
    let sg = lid / 32u;
    let col = blk * 32u + ci;
    // The partials are loaded CB at a time before they are summed (one wait
    // on memory per CB splits, not per split); a split that saw no keys has
    // weight 0 and an accumulator it never wrote, dropped by the select.
    var a = vec4<f32>(0.0);
    let cc = min(col, P.d4 - 1u);
    for (var k0 = sg; k0 < P.nsplit; k0 += 8u * CB) {
        var pv: array<vec4<f32>, CB>;
        for (var u = 0u; u < CB; u++) {
            let k = min(k0 + 8u * u, P.nsplit - 1u);
            pv[u] = PARTS[(k * nq + slot) * P.d4 + cc];
        }
        for (var u = 0u; u < CB; u++) {
            let k = k0 + 8u * u;
            let w = select(0.0, cw[min(k, 255u)], k < P.nsplit);
            a += select(vec4<f32>(0.0), w * pv[u], w != 0.0);
        }
    }
    cacc[lid] = a;
    workgroupBarrier();
    if (sg == 0u && col < P.d4) {
        var o = cacc[ci];
        for (var k = 1u; k < 8u; k++) {
            o += cacc[k * 32u + ci];
        }
        OUT[slot * P.d4 + col] = o / total;
    }
}

// ---- prefill (m > 16): attn_prefill -----------------------------------------
//
// One workgroup per (block of PB query slots, kv head), over all of the
// block's keys, PK at a time, with an online softmax: no split, no combine,
// the output written directly. Per key block:
//   scores  S = Q K^T for PB slots x PK keys, through workgroup memory 8
//           vec4 of dims at a time (rows padded to 9 vec4: no bank
//           conflicts); thread (slot lid / 8, keys lid % 8 + 8 i) keeps 4.
//   softmax one thread per slot: running max and sum, probabilities in place.
//   values  thread (4 slots of warp lid / 32, vec4 columns lane + 32 v) adds
//           p V: each V load serves 4 slots (read from global memory; a row
//           is 32 lanes x 16 bytes, contiguous).
// Slot s is row s / G, head g G + s % G as in attn_split, so a block shares
// K/V reads across the GQA heads and PB / G consecutive rows. The output
// goes to the PART binding.

const PB: u32 = 32u;
const PK: u32 = 32u;
const PS: u32 = 9u;
const PP: u32 = 33u;

var<workgroup> pq: array<vec4<f32>, 288>; // [PB][PS]
var<workgroup> pk: array<vec4<f32>, 288>; // [PK][PS]
var<workgroup> pp: array<f32, 1056>; // [PB][PP]
var<workgroup> pm: array<f32, 32>;
var<workgroup> pl: array<f32, 32>;
var<workgroup> pa: array<f32, 32>;
var<workgroup> pspan: vec2<u32>;

// Query slot s's vec4 `col` (zero past the block or the head).
fn prefill_q(s: u32, s1: u32, g: u32, col: u32) -> vec4<f32> {
    if (s < s1 && col < P.d4) {
        let h = g * P.group + s % P.group;
        return Q[((s / P.group) * P.heads + h) * P.d4 + col];
    }
    return vec4<f32>(0.0);
}

// Key j's vec4 `col` (zero past the span or the head).
fn prefill_k(kbase: u32, j: u32, hi: u32, col: u32) -> vec4<f32> {
    if (j < hi && col < P.d4) {
        return vec4<f32>(KC[(kbase + j % P.capacity) * P.d4 + col]);
    }
    return vec4<f32>(0.0);
}

// Workgroup (pair i, kv head g) takes slot blocks i and nb - 1 - i in
// turn: under a causal mask block b sees about b + 1 key blocks, so the
// pairs carry equal work (each as much as the heaviest block alone, which
// set the dispatch's time when every block had its own workgroup).
@compute @workgroup_size(256)
fn attn_prefill(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let id = linear_group(wg, nwg);
    let g = id % P.kv_heads;
    let i = id / P.kv_heads;
    let nb = (P.nslots + PB - 1u) / PB;
    if (2u * i >= nb + 1u) {
        return;
    }
    prefill_block(i * PB, g, lid);
    let j = nb - 1u - i;
    if (j != i) {
        // (the first block's last reads of workgroup memory are behind it)
        workgroupBarrier();
        prefill_block(j * PB, g, lid);
    }
}

// One block of PB query slots from s0 over all of its keys.
fn prefill_block(s0: u32, g: u32, lid: u32) {
    let s1 = min(s0 + PB, P.nslots);
    let d4 = P.d4;
    // The block's key span: the union of its rows' ranges.
    if (lid == 0u) {
        pspan = slots_key_span(s0, s1);
    }
    let span = workgroupUniformLoad(&pspan);

    // Score role: slot qi, keys kg + 8 i; its row's key range masks them.
    let qi = lid / 8u;
    let kg = lid % 8u;
    var my = vec2<u32>(0u, 0u);
    if (s0 + qi < s1) {
        my = key_range((s0 + qi) / P.group);
    }
    if (lid < PB) {
        pm[lid] = NEG;
        pl[lid] = 0.0;
    }
    // Value role: slots 4 sg .. + 4, columns lane + 32 v.
    let sg = lid / 32u;
    let lane = lid % 32u;
    // The 4 slots' accumulators for vec4 column lane + 32 v: a<v><slot>,
    // named registers rather than an array indexed in loops (which the
    // driver may keep in local memory, as it did attn_decode's); columns
    // past NV are never touched (NV is constant).
    var a00 = vec4<f32>(0.0);
    var a01 = vec4<f32>(0.0);
    var a02 = vec4<f32>(0.0);
    var a03 = vec4<f32>(0.0);
    var a10 = vec4<f32>(0.0);
    var a11 = vec4<f32>(0.0);
    var a12 = vec4<f32>(0.0);
    var a13 = vec4<f32>(0.0);
    var a20 = vec4<f32>(0.0);
    var a21 = vec4<f32>(0.0);
    var a22 = vec4<f32>(0.0);
    var a23 = vec4<f32>(0.0);
    var a30 = vec4<f32>(0.0);
    var a31 = vec4<f32>(0.0);
    var a32 = vec4<f32>(0.0);
    var a33 = vec4<f32>(0.0);
    let kbase = g * P.capacity;
    let nch = (d4 + 7u) / 8u;

    // Staging role: row lid / 8 (a slot of Q, a key of K), vec4 dv of the
    // dim chunk. A chunk's two vec4 are loaded into registers one chunk
    // ahead (the next key block's first chunk during the last one), so
    // their latency passes while the previous chunk is multiplied.
    let row = lid / 8u;
    let dv = lid % 8u;
    var qn = prefill_q(s0 + row, s1, g, dv);
    var kn = prefill_k(kbase, span.x + row, span.y, dv);
    for (var kb = span.x; kb < span.y; kb += PK) {
        var sc = vec4<f32>(0.0);
        for (var ch = 0u; ch < nch; ch++) {
            workgroupBarrier();
            pq[row * PS + dv] = qn;
            pk[row * PS + dv] = kn;
            workgroupBarrier();
            var nx = ch + 1u;
            var nkb = kb;
            if (nx == nch) {
                nx = 0u;
                nkb = kb + PK;
            }
            qn = prefill_q(s0 + row, s1, g, nx * 8u + dv);
            kn = prefill_k(kbase, nkb + row, span.y, nx * 8u + dv);
            for (var v = 0u; v < 8u; v++) {
                let q = pq[qi * PS + v];
                sc.x += dot(q, pk[kg * PS + v]);
                sc.y += dot(q, pk[(kg + 8u) * PS + v]);
                sc.z += dot(q, pk[(kg + 16u) * PS + v]);
                sc.w += dot(q, pk[(kg + 24u) * PS + v]);
            }
        }
        for (var i = 0u; i < 4u; i++) {
            let key = kg + 8u * i;
            let j = kb + key;
            var v = NEG;
            if (j >= my.x && j < my.y) {
                v = sc[i] * P.scale;
            }
            pp[qi * PP + key] = v;
        }
        workgroupBarrier();

        if (lid < PB) {
            let mold = pm[lid];
            var mnew = mold;
            for (var k = 0u; k < PK; k++) {
                mnew = max(mnew, pp[lid * PP + k]);
            }
            let alpha = exp(mold - mnew);
            var l = 0.0;
            for (var k = 0u; k < PK; k++) {
                let v = pp[lid * PP + k];
                var p = 0.0;
                if (v > NEG) {
                    p = exp(v - mnew);
                }
                pp[lid * PP + k] = p;
                l += p;
            }
            pl[lid] = pl[lid] * alpha + l;
            pm[lid] = mnew;
            pa[lid] = alpha;
        }
        workgroupBarrier();

        let al = vec4<f32>(pa[sg * 4u], pa[sg * 4u + 1u], pa[sg * 4u + 2u], pa[sg * 4u + 3u]);
        a00 *= al.x;
        a01 *= al.y;
        a02 *= al.z;
        a03 *= al.w;
        if (NV > 1u) {
            a10 *= al.x;
            a11 *= al.y;
            a12 *= al.z;
            a13 *= al.w;
        }
        if (NV > 2u) {
            a20 *= al.x;
            a21 *= al.y;
            a22 *= al.z;
            a23 *= al.w;
            a30 *= al.x;
            a31 *= al.y;
            a32 *= al.z;
            a33 *= al.w;
        }
        // Every key of the block, a constant count (the loads can be
        // issued ahead): past the span a key's p is 0 (its score was
        // masked) and its V row is the span's last, finite.
        for (var k = 0u; k < PK; k++) {
            let vrow = (kbase + min(kb + k, span.y - 1u) % P.capacity) * d4;
            let r = sg * 4u * PP + k;
            let p = vec4<f32>(pp[r], pp[r + PP], pp[r + 2u * PP], pp[r + 3u * PP]);
            let v0 = prefill_v(vrow, lane, d4);
            a00 += p.x * v0;
            a01 += p.y * v0;
            a02 += p.z * v0;
            a03 += p.w * v0;
            if (NV > 1u) {
                let v1 = prefill_v(vrow, lane + 32u, d4);
                a10 += p.x * v1;
                a11 += p.y * v1;
                a12 += p.z * v1;
                a13 += p.w * v1;
            }
            if (NV > 2u) {
                let v2 = prefill_v(vrow, lane + 64u, d4);
                let v3 = prefill_v(vrow, lane + 96u, d4);
                a20 += p.x * v2;
                a21 += p.y * v2;
                a22 += p.z * v2;
                a23 += p.w * v2;
                a30 += p.x * v3;
                a31 += p.y * v3;
                a32 += p.z * v3;
                a33 += p.w * v3;
            }
        }
    }

    prefill_out(s0 + sg * 4u, s1, g, lane, array<vec4<f32>, 4>(a00, a10, a20, a30));
    prefill_out(s0 + sg * 4u + 1u, s1, g, lane, array<vec4<f32>, 4>(a01, a11, a21, a31));
    prefill_out(s0 + sg * 4u + 2u, s1, g, lane, array<vec4<f32>, 4>(a02, a12, a22, a32));
    prefill_out(s0 + sg * 4u + 3u, s1, g, lane, array<vec4<f32>, 4>(a03, a13, a23, a33));
}

// V row `vrow`'s vec4 column c (0 past the head).
fn prefill_v(vrow: u32, c: u32, d4: u32) -> vec4<f32> {
    if (c < d4) {
        return vec4<f32>(VC[vrow + c]);
    }
    return vec4<f32>(0.0);
}

// Query slot s's output columns lane + 32 v from its accumulators a[v]
// (the block's slot s - s0 of the sg group), normalised by its sum.
fn prefill_out(s: u32, s1: u32, g: u32, lane: u32, a: array<vec4<f32>, 4>) {
    if (s >= s1) {
        return;
    }
    let l = pl[s % PB];
    let slot = (s / P.group) * P.heads + g * P.group + s % P.group;
    for (var v = 0u; v < NV; v++) {
        let c = lane + 32u * v;
        if (c < P.d4) {
            PART[slot * P.d4 + c] = a[v] / l;
        }
    }
}
