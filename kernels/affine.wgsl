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
