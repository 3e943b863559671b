// RoPE's turn of a pair (turn_pair), appended to the rope family and the
// attention_qkv variant (backends/wgpu/src/kernels.rs): angle = f32(pos) *
// freq, reduced, then the rotation.
//
// Parity with the CPU reference at positions of 40000+ needs two things:
// - the angle must be the same IEEE product as the CPU's `pos as f32 * f`.
//   It is computed with integer ops (`mul_rn`), so no compiler can contract it
//   into an FMA with the range reduction below (which would change the angle
//   by up to half an ulp of 40000, ~2e-3 rad);
// - GPU sin/cos are only accurate near [-pi, pi]: the angle is reduced first
//   (Cody-Waite, 2 pi split into three constants).

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

// The pair (a, b) turned by RoPE at position `pos`, the pair's table
// frequency `freq`: (a cos - b sin, b cos + a sin). rope, qkv_post and
// attn_decode_qkv all turn through it.
fn turn_pair(a: f32, b: f32, pos: u32, freq: f32) -> vec2<f32> {
    let r = reduce_angle(mul_rn(pos, freq));
    let s = sin(r);
    let c = cos(r);
    return vec2<f32>(a * c - b * s, b * c + a * s);
}

// angle - k * 2 pi, k = round(angle / 2 pi): a value in about [-pi, pi].
fn reduce_angle(a: f32) -> f32 {
    let k = round(a * INV_TWO_PI);
    var r = a - k * TWO_PI_C1;
    r = r - k * TWO_PI_C2;
    r = r - k * TWO_PI_C3;
    return r;
}
