// ---- MLX affine-quantized weights (appended to the families that read them) ----
// With QBITS != 0 a weight binding holds, as u32 words (src/quant.rs, mlx's
// format; the wgpu backend adds the header, backends/wgpu/src/quant.rs):
//   [0]              word offset of the scales
//   [1]              word offset of the biases
//   [2], [3]         zero (the packed words start 16-byte aligned)
//   [QHEAD ..]       the packed values: element i's QBITS bits start at bit
//                    i * QBITS of the stream, least significant bits first
//                    (values of 3, 5 and 6 bits cross word boundaries)
//   scales, biases   one per QGROUP consecutive elements of a row, of the
//                    dtype WDTYPE codes (f32, f16 or bf16)
// and element i is scales[g] * q + biases[g], g = i / QGROUP, in f32 (for
// 16-bit scales the product is exact, so it is the CPU reference's value
// whether or not a compiler fuses it). Rows are whole groups, so a row's
// values start on a word and any index pair (2u, 2u + 1) shares a group.
// The family supplies `fn wword(i: u32) -> u32`, word i of its weight.

// Bits per value (0: the weight is not quantized; WDTYPE is its dtype).
override QBITS: u32 = 0u;
// Values per scale and bias.
override QGROUP: u32 = 64u;

const QHEAD: u32 = 4u;

// The word holding the first bit of element i (i * QBITS overflows u32 for
// the largest expert stacks; 32 values span QBITS whole words).
fn affine_word(i: u32) -> u32 {
    return QHEAD + (i >> 5u) * QBITS + (((i & 31u) * QBITS) >> 5u);
}

// The unsigned value of element i, its first bit in word `lo` (`hi` the
// next word, read only when the value crosses into it).
fn affine_q(i: u32, w: u32) -> u32 {
    let s = ((i & 31u) * QBITS) & 31u;
    var v = wword(w) >> s;
    if (s + QBITS > 32u) {
        v |= wword(w + 1u) << (32u - s);
    }
    return v & ((1u << QBITS) - 1u);
}

// The header's word offsets of the scales and the biases: a loop over
// many values reads them once (affine_sb_at, affine_pair_at).
fn affine_offsets() -> vec2<u32> {
    return vec2<u32>(wword(0u), wword(1u));
}

// (scale, bias) of group g, the parts at word offsets `o`.
fn affine_sb_at(g: u32, o: vec2<u32>) -> vec2<f32> {
    let w = word_of(g, WDTYPE);
    return vec2<f32>(decode_as(wword(o.x + w), g, WDTYPE), decode_as(wword(o.y + w), g, WDTYPE));
}

// (scale, bias) of group g.
fn affine_sb(g: u32) -> vec2<f32> {
    return affine_sb_at(g, affine_offsets());
}

// Element i of the weight.
fn affine_elem(i: u32) -> f32 {
    let sb = affine_sb(i / QGROUP);
    return sb.x * f32(affine_q(i, affine_word(i))) + sb.y;
}

// Elements i and i + 1 (i even: one group, one scale and bias), the
// parts at word offsets `o`.
fn affine_pair_at(i: u32, o: vec2<u32>) -> vec2<f32> {
    let sb = affine_sb_at(i / QGROUP, o);
    let q = vec2<f32>(f32(affine_q(i, affine_word(i))), f32(affine_q(i + 1u, affine_word(i + 1u))));
    return sb.x * q + vec2<f32>(sb.y);
}

// Elements i and i + 1.
fn affine_pair(i: u32) -> vec2<f32> {
    return affine_pair_at(i, affine_offsets());
}

// ---- Eight values at a time (the GEMM tile loaders) ----
// Elements e .. e + 7, e a multiple of 8 (so one group), span 8 * QBITS
// bits from bit affine_bit8(e) of the word holding e's first bit: at most
// 64 bits for every width mlx writes (2-6 and 8), so two words. A loader
// reads them with the group's scale and bias words a step ahead
// (affine_load8), and decodes them from registers when it stores the tile.

// The bit of its first word where element e (a multiple of 8) starts: 0
// at 4 and 8 bits, where it folds to a constant.
fn affine_bit8(e: u32) -> u32 {
    if (QBITS == 4u || QBITS == 8u) {
        return 0u;
    }
    return ((e & 31u) * QBITS) & 31u;
}

// (the word holding e's first bit, the next one where the eight run into
// it or 0, the group's scale word, its bias word), the parts at word
// offsets `o`.
fn affine_load8(e: u32, o: vec2<u32>) -> vec4<u32> {
    let w = affine_word(e);
    let g = word_of(e / QGROUP, WDTYPE);
    var next = 0u;
    if (affine_bit8(e) + 8u * QBITS > 32u) {
        next = wword(w + 1u);
    }
    return vec4<u32>(wword(w), next, wword(o.x + g), wword(o.y + g));
}

// Code j of the eight (j a constant at each call) from affine_load8's
// words `v` for element e, as f32 (exact).
fn affine_code8(v: vec4<u32>, e: u32, j: u32) -> f32 {
    let p = affine_bit8(e) + j * QBITS;
    var c = v.y >> (p & 31u);
    if (p < 32u) {
        c = v.x >> p;
        if (p + QBITS > 32u) {
            c |= v.y << (32u - p);
        }
    }
    return f32(c & ((1u << QBITS) - 1u));
}

// (scale, bias) from affine_load8's words `v` for element e (all-zero
// words, a loader's padding, give zero values).
fn affine_sb8(v: vec4<u32>, e: u32) -> vec2<f32> {
    let g = e / QGROUP;
    return vec2<f32>(decode_as(v.z, g, WDTYPE), decode_as(v.w, g, WDTYPE));
}

// Values 2h and 2h + 1 of the eight (h a constant at each call): scale *
// q + bias in f32, as affine_pair_at.
fn affine_pair8(v: vec4<u32>, e: u32, sb: vec2<f32>, h: u32) -> vec2<f32> {
    let q = vec2<f32>(affine_code8(v, e, 2u * h), affine_code8(v, e, 2u * h + 1u));
    return sb.x * q + vec2<f32>(sb.y);
}
