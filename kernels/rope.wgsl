// NeoX RoPE in place on X [m, heads, head_dim]: for d < rot_pairs, dims d and
// d + head_dim/2 turn by angle = f32(pos) * FREQ[d]; other dims are untouched.
// FREQ is the host table `turbospark::ops::rope_inv_freq`, so both backends
// use identical frequencies. One invocation per (row, head, rotated pair).
//
// The angle arithmetic (an exact product, then a range reduction before
// sin/cos) is kernels/rope_angle.wgsl's, appended to this family and to
// attention's (attn_decode_qkv).

struct Params {
    m: u32,
    heads: u32,
    head_dim: u32,
    rot_pairs: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(1) @binding(0) var<storage, read_write> X: array<f32>;
@group(1) @binding(1) var<storage, read> POS: array<u32>;
@group(1) @binding(2) var<storage, read> FREQ: array<f32>;

@compute @workgroup_size(256)
fn rope(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = linear_group(wg, nwg) * 256u + lid;
    if (i >= P.m * P.heads * P.rot_pairs) {
        return;
    }
    let d = i % P.rot_pairs;
    let row = i / P.rot_pairs; // t * heads + h
    let t = row / P.heads;
    let base = row * P.head_dim;
    let half = P.head_dim / 2u;
    let ab = turn_pair(X[base + d], X[base + d + half], POS[t], FREQ[d]);
    X[base + d] = ab.x;
    X[base + d + half] = ab.y;
}

// ---- qkv_post: after the fused q|k|v projection -------------------------
//
// Items (token t, head slot): slots [0, heads) are query heads, then
// kv_heads key heads, then kv_heads value heads. Each head's raw row is
// RMS-normalised (q and k times their weights WQ / WK, v without one), q and
// k are turned by RoPE as in `rope` above, q goes to QO and k / v to the
// caches at slot POS[t] % capacity. The raw row of a token is
// [q | k | v], or [q | k] with V taken from the raw k (attention_k_eq_v).
//
// Two launches of the same work (backends/wgpu/src/ops/attention.rs picks
// by the item count): `qkv_post`, a 256-thread workgroup per item, and
// `qkv_post_warps`, a warp (32 invocations) per item and eight a
// workgroup. On the H200 (2026-12-01 at f16691c, runs 08 / 09) a workgroup
// per item took 3.8-4.3 us at 32-512 items and 41.8 us at 16384 (a
// 512-token batch: as many short chains); a warp per item 5.8-6.8 us and
// 21.5 us.

struct QkvParams {
    m: u32,
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    rot_pairs: u32,
    capacity: u32,
    eps: f32,
    // 1: V is the raw k (no v part in the raw row)
    v_from_k: u32,
}

@group(0) @binding(0) var<uniform> QP: QkvParams;
@group(1) @binding(0) var<storage, read> RAW: array<f32>;
@group(1) @binding(1) var<storage, read> WQ: array<u32>;
@group(1) @binding(2) var<storage, read> WK: array<u32>;
@group(1) @binding(3) var<storage, read> QPOS: array<u32>;
@group(1) @binding(4) var<storage, read> QFREQ: array<f32>;
@group(1) @binding(5) var<storage, read_write> QO: array<f32>;
@group(1) @binding(6) var<storage, read_write> KCACHE: array<CacheT>;
@group(1) @binding(7) var<storage, read_write> VCACHE: array<CacheT>;

// dtype codes of WQ and WK
override WQD: u32 = 0u;
override WKD: u32 = 0u;

// Item `id`'s token, kind (0: query, 1: key, 2: value), head within its
// kind and first raw element.
struct QkvItem {
    t: u32,
    kind: u32,
    h: u32,
    src: u32,
}

fn qkv_item(id: u32) -> QkvItem {
    let slots = QP.heads + 2u * QP.kv_heads;
    let t = id / slots;
    let s = id % slots;
    let d = QP.head_dim;
    let qd = QP.heads * d;
    let kd = QP.kv_heads * d;
    let row = qd + kd * (2u - QP.v_from_k);
    var it = QkvItem(t, 0u, s, t * row + s * d);
    if (s >= QP.heads + QP.kv_heads) {
        it.kind = 2u;
        it.h = s - QP.heads - QP.kv_heads;
        it.src = t * row + qd + select(kd, 0u, QP.v_from_k == 1u) + it.h * d;
    } else if (s >= QP.heads) {
        it.kind = 1u;
        it.h = s - QP.heads;
        it.src = t * row + qd + it.h * d;
    }
    return it;
}

// This invocation's part of the item's squared sum: elements lane, lane +
// n, ...
fn qkv_squares(it: QkvItem, lane: u32, n: u32) -> f32 {
    var ss = 0.0;
    for (var i = lane; i < QP.head_dim; i += n) {
        let v = RAW[it.src + i];
        ss += v * v;
    }
    return ss;
}

// The item's outputs from its inverse RMS, by n invocations (this one
// `lane`).
fn qkv_write(it: QkvItem, inv: f32, lane: u32, n: u32) {
    let d = QP.head_dim;
    let slot = QPOS[it.t] % QP.capacity;
    if (it.kind == 2u) {
        let dst = (it.h * QP.capacity + slot) * d;
        for (var i = lane; i < d; i += n) {
            VCACHE[dst + i] = to_cache(RAW[it.src + i] * inv);
        }
        return;
    }
    let half = d / 2u;
    let pos = QPOS[it.t];
    for (var i = lane; i < half; i += n) {
        var a: f32;
        var b: f32;
        if (it.kind == 0u) {
            a = RAW[it.src + i] * inv * decode_as(WQ[word_of(i, WQD)], i, WQD);
            b = RAW[it.src + i + half] * inv * decode_as(WQ[word_of(i + half, WQD)], i + half, WQD);
        } else {
            a = RAW[it.src + i] * inv * decode_as(WK[word_of(i, WKD)], i, WKD);
            b = RAW[it.src + i + half] * inv * decode_as(WK[word_of(i + half, WKD)], i + half, WKD);
        }
        var ra = a;
        var rb = b;
        if (i < QP.rot_pairs) {
            let ab = turn_pair(a, b, pos, QFREQ[i]);
            ra = ab.x;
            rb = ab.y;
        }
        if (it.kind == 0u) {
            let dst = (it.t * QP.heads + it.h) * d;
            QO[dst + i] = ra;
            QO[dst + i + half] = rb;
        } else {
            let dst = (it.h * QP.capacity + slot) * d;
            KCACHE[dst + i] = to_cache(ra);
            KCACHE[dst + i + half] = to_cache(rb);
        }
    }
}

fn qkv_inv(ss: f32) -> f32 {
    return inverseSqrt(ss / f32(QP.head_dim) + QP.eps);
}

@compute @workgroup_size(256)
fn qkv_post(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let id = linear_group(wg, nwg);
    if (id >= QP.m * (QP.heads + 2u * QP.kv_heads)) {
        return;
    }
    let it = qkv_item(id);
    let inv = qkv_inv(workgroup_sum(qkv_squares(it, lid, 256u), lid, 256u));
    qkv_write(it, inv, lid, 256u);
}

// qkv_post_warps: each warp's squared sums, summed by a tree (every warp
// takes every step, so the barriers are uniform).
var<workgroup> qred: array<f32, 256>;

@compute @workgroup_size(256)
fn qkv_post_warps(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
    let items = QP.m * (QP.heads + 2u * QP.kv_heads);
    let id0 = linear_group(wg, nwg) * 8u;
    if (id0 >= items) {
        return;
    }
    let warp = lid / 32u;
    let lane = lid % 32u;
    // (a warp past the last item computes on it and writes nothing)
    let it = qkv_item(min(id0 + warp, items - 1u));
    qred[lid] = qkv_squares(it, lane, 32u);
    for (var st = 16u; st > 0u; st >>= 1u) {
        workgroupBarrier();
        if (lane < st) {
            qred[lid] += qred[lid + st];
        }
    }
    workgroupBarrier();
    if (id0 + warp < items) {
        qkv_write(it, qkv_inv(qred[warp * 32u]), lane, 32u);
    }
}
