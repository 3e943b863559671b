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
// A warp (32 invocations) per (token t, head slot), eight a workgroup: slots
// [0, heads) are query heads,
// then kv_heads key heads, then kv_heads value heads. Each head's raw row is
// RMS-normalised (q and k times their weights WQ / WK, v without one), q and
// k are turned by RoPE as in `rope` above, q goes to QO and k / v to the
// caches at slot POS[t] % capacity. The raw row of a token is
// [q | k | v], or [q | k] with V taken from the raw k (attention_k_eq_v).

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
@group(1) @binding(6) var<storage, read_write> KCACHE: array<f32>;
@group(1) @binding(7) var<storage, read_write> VCACHE: array<f32>;

// dtype codes of WQ and WK
override WQD: u32 = 0u;
override WKD: u32 = 0u;

// Per warp: the squared sums of its lanes, summed by a tree (every warp
// takes every step, so the barriers are uniform). (A workgroup per head,
// its sum by workgroup_sum, left each 256-thread workgroup of a 512-token
// batch one short chain, 16384 of them: 41 us a call on the H200.)
var<workgroup> qred: array<f32, 256>;

@compute @workgroup_size(256)
fn qkv_post(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let slots = QP.heads + 2u * QP.kv_heads;
    let items = QP.m * slots;
    let id0 = linear_group(wg, nwg) * 8u;
    if (id0 >= items) {
        return;
    }
    let warp = lid / 32u;
    let lane = lid % 32u;
    // (a warp past the last item computes on it and writes nothing)
    let on = id0 + warp < items;
    let id = min(id0 + warp, items - 1u);
    let t = id / slots;
    let s = id % slots;
    let d = QP.head_dim;
    let qd = QP.heads * d;
    let kd = QP.kv_heads * d;
    let row = qd + kd * (2u - QP.v_from_k);
    // 0: query, 1: key, 2: value; h: head within its kind.
    var kind = 0u;
    var h = s;
    var off = s * d;
    if (s >= QP.heads + QP.kv_heads) {
        kind = 2u;
        h = s - QP.heads - QP.kv_heads;
        off = qd + select(kd, 0u, QP.v_from_k == 1u) + h * d;
    } else if (s >= QP.heads) {
        kind = 1u;
        h = s - QP.heads;
        off = qd + h * d;
    }
    let src = t * row + off;

    var ss = 0.0;
    for (var i = lane; i < d; i += 32u) {
        let v = RAW[src + i];
        ss += v * v;
    }
    qred[lid] = ss;
    for (var st = 16u; st > 0u; st >>= 1u) {
        workgroupBarrier();
        if (lane < st) {
            qred[lid] += qred[lid + st];
        }
    }
    workgroupBarrier();
    let inv = inverseSqrt(qred[warp * 32u] / f32(d) + QP.eps);
    if (!on) {
        return;
    }
    let slot = QPOS[t] % QP.capacity;

    if (kind == 2u) {
        let dst = (h * QP.capacity + slot) * d;
        for (var i = lane; i < d; i += 32u) {
            VCACHE[dst + i] = RAW[src + i] * inv;
        }
        return;
    }
    let half = d / 2u;
    let pos = QPOS[t];
    for (var i = lane; i < half; i += 32u) {
        var a: f32;
        var b: f32;
        if (kind == 0u) {
            a = RAW[src + i] * inv * decode_as(WQ[word_of(i, WQD)], i, WQD);
            b = RAW[src + i + half] * inv * decode_as(WQ[word_of(i + half, WQD)], i + half, WQD);
        } else {
            a = RAW[src + i] * inv * decode_as(WK[word_of(i, WKD)], i, WKD);
            b = RAW[src + i + half] * inv * decode_as(WK[word_of(i + half, WKD)], i + half, WKD);
        }
        var ra = a;
        var rb = b;
        if (i < QP.rot_pairs) {
            let ab = turn_pair(a, b, pos, QFREQ[i]);
            ra = ab.x;
            rb = ab.y;
        }
        if (kind == 0u) {
            let dst = (t * QP.heads + h) * d;
            QO[dst + i] = ra;
            QO[dst + i + half] = rb;
        } else {
            let dst = (h * QP.capacity + slot) * d;
            KCACHE[dst + i] = ra;
            KCACHE[dst + i + half] = rb;
        }
    }
}
