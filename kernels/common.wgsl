// Shared helpers, prepended to every kernel family file when it is compiled
// (and when the test suite validates it). Binding convention:
//   @group(0) @binding(0)  the op's uniform parameter block `P`
//   @group(1) @binding(i)  storage buffers in the launcher's order
// Weights are bound as array<u32> and decoded here according to the WDTYPE
// override: 0 = f32, 1 = f16, 2 = bf16 (two 16-bit values per word, the
// element with the lower index in the low half).

override WDTYPE: u32 = 0u;

// Linear workgroup id of a grid spread over x and y (see WgpuBackend::grid).
fn linear_group(wg: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wg.x + wg.y * nwg.x;
}

// Element `i` of a weight stored as words, given the word that holds it.
// A bf16 is the high half of an f32, so its decode is a shift.
fn decode_weight(word: u32, i: u32) -> f32 {
    if (WDTYPE == 0u) {
        return bitcast<f32>(word);
    }
    let hi = (i & 1u) == 1u;
    if (WDTYPE == 1u) {
        let pair = unpack2x16float(word);
        return select(pair.x, pair.y, hi);
    }
    return bitcast<f32>(select(word << 16u, word & 0xffff0000u, hi));
}

// Index of the word holding weight element `i`.
fn weight_word(i: u32) -> u32 {
    return select(i >> 1u, i, WDTYPE == 0u);
}

// Both elements of a 16-bit word as f32 (low index first).
fn decode_pair(word: u32) -> vec2<f32> {
    if (WDTYPE == 1u) {
        return unpack2x16float(word);
    }
    return vec2<f32>(bitcast<f32>(word << 16u), bitcast<f32>(word & 0xffff0000u));
}

// tanh clamped to a range where it is exactly +-1 in f32: some drivers
// (Metal fast math) return NaN for large arguments.
fn safe_tanh(x: f32) -> f32 {
    return tanh(clamp(x, -15.0, 15.0));
}

// gelu, tanh approximation (gelu_pytorch_tanh).
fn gelu_tanh(x: f32) -> f32 {
    let c = 0.7978845608028654;
    return 0.5 * x * (1.0 + safe_tanh(c * (x + 0.044715 * x * x * x)));
}
