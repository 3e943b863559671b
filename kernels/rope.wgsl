// NeoX RoPE in place on X [m, heads, head_dim]: for d < rot_pairs, dims d and
// d + head_dim/2 turn by angle = f32(pos) * FREQ[d]; other dims are untouched.
// FREQ is the host table `turbospark::ops::rope_inv_freq`, so both backends
// use identical frequencies. One invocation per (row, head, rotated pair).
//
// Parity with the CPU reference at positions of 40000+ needs two things:
// - the angle must be the same IEEE product as the CPU's `pos as f32 * f`.
//   It is computed with integer ops (`mul_rn`), so no compiler can contract it
//   into an FMA with the range reduction below (which would change the angle
//   by up to half an ulp of 40000, ~2e-3 rad);
// - GPU sin/cos are only accurate near [-pi, pi]: the angle is reduced first
//   (Cody-Waite, 2 pi split into three constants).

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

// Round-to-nearest-even of a value `m * 2^s` (m > 0 held as hi * 2^24 + lo,
// below 2^48) to a 24-bit mantissa; returns (mantissa, extra exponent).
fn round24(hi: u32, lo: u32) -> vec2<i32> {
    var nbits: u32;
    if (hi != 0u) {
        nbits = 56u - countLeadingZeros(hi);
    } else {
        nbits = 32u - countLeadingZeros(lo);
    }
    var s = i32(nbits) - 24;
    var m: u32;
    if (s <= 0) {
        m = lo << u32(-s);
    } else {
        let su = u32(s);
        m = (hi << (24u - su)) | (lo >> su);
        let rem = lo & ((1u << su) - 1u);
        let half = 1u << (su - 1u);
        if (rem > half || (rem == half && (m & 1u) == 1u)) {
            m += 1u;
        }
        if (m == (1u << 24u)) {
            m = 1u << 23u;
            s += 1;
        }
    }
    return vec2<i32>(i32(m), s);
}

// f32(p) * f, correctly rounded (round to nearest even), as the CPU computes
// it, with integer arithmetic only. f is a positive normal number.
fn mul_rn(p: u32, f: f32) -> f32 {
    let fb = bitcast<u32>(f);
    let e = (fb >> 23u) & 0xffu;
    if (p == 0u || e == 0u || e == 255u) {
        return f32(p) * f;
    }
    let mf = (fb & 0x7fffffu) | 0x800000u;
    // p rounded to 24 bits first, like the CPU's `p as f32`.
    var mp = p;
    var ep = 0u;
    let nb = 32u - countLeadingZeros(p);
    if (nb > 24u) {
        let s = nb - 24u;
        mp = p >> s;
        let rem = p & ((1u << s) - 1u);
        let half = 1u << (s - 1u);
        if (rem > half || (rem == half && (mp & 1u) == 1u)) {
            mp += 1u;
        }
        ep = s;
    }
    // 48-bit product mp * mf from 12-bit halves, as hi * 2^24 + lo.
    let a1 = mp >> 12u;
    let a0 = mp & 0xfffu;
    let b1 = mf >> 12u;
    let b0 = mf & 0xfffu;
    let mid = a1 * b0 + a0 * b1;
    let t = a0 * b0 + ((mid & 0xfffu) << 12u);
    let lo = t & 0xffffffu;
    let hi = a1 * b1 + (mid >> 12u) + (t >> 24u);
    let r = round24(hi, lo);
    let biased = u32(r.y + i32(ep) + i32(e));
    return bitcast<f32>((biased << 23u) | (u32(r.x) & 0x7fffffu));
}

// 2 pi = C1 + C2 + C3: C1 = 201/32 (8 significant bits) and C2 = 127/65536
// (7 bits), so k * C1 and k * C2 are exact for k < 2^16 (angles up to ~4e5)
// and the first two subtractions are exact; C3 carries the rest (error 2e-14).
const TWO_PI_C1: f32 = 6.28125;
const TWO_PI_C2: f32 = 0.0019378662109375;
const TWO_PI_C3: f32 = -2.559031372584286e-06;
const INV_TWO_PI: f32 = 0.15915493667125702;

// angle - k * 2 pi, k = round(angle / 2 pi): a value in about [-pi, pi].
fn reduce_angle(a: f32) -> f32 {
    let k = round(a * INV_TWO_PI);
    var r = a - k * TWO_PI_C1;
    r = r - k * TWO_PI_C2;
    r = r - k * TWO_PI_C3;
    return r;
}

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
    let r = reduce_angle(mul_rn(POS[t], FREQ[d]));
    let s = sin(r);
    let c = cos(r);
    let base = row * P.head_dim;
    let half = P.head_dim / 2u;
    let a = X[base + d];
    let b = X[base + d + half];
    X[base + d] = a * c - b * s;
    X[base + d + half] = b * c + a * s;
}

// ---- qkv_post: after the fused q|k|v projection -------------------------
//
// One workgroup per (token t, head slot): slots [0, heads) are query heads,
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

@compute @workgroup_size(256)
fn qkv_post(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let id = linear_group(wg, nwg);
    let slots = QP.heads + 2u * QP.kv_heads;
    let t = id / slots;
    let s = id % slots;
    if (t >= QP.m) {
        return;
    }
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
    for (var i = lid; i < d; i += 256u) {
        let v = RAW[src + i];
        ss += v * v;
    }
    let inv = inverseSqrt(workgroup_sum(ss, lid, 256u) / f32(d) + QP.eps);
    let slot = QPOS[t] % QP.capacity;

    if (kind == 2u) {
        let dst = (h * QP.capacity + slot) * d;
        for (var i = lid; i < d; i += 256u) {
            VCACHE[dst + i] = RAW[src + i] * inv;
        }
        return;
    }
    let half = d / 2u;
    let pos = QPOS[t];
    for (var i = lid; i < half; i += 256u) {
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
            let r = reduce_angle(mul_rn(pos, QFREQ[i]));
            let sn = sin(r);
            let cs = cos(r);
            ra = a * cs - b * sn;
            rb = b * cs + a * sn;
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
