// Shared helpers, prepended to every kernel family file when it is compiled
// (and when the test suite validates it). Binding convention:
//   @group(0) @binding(0)  the op's uniform parameter block `P`
//   @group(1) @binding(i)  storage buffers in the launcher's order
// Weights are bound as array<u32> and decoded here according to the WDTYPE
// override: 0 = f32, 1 = f16, 2 = bf16 (two 16-bit values per word, the
// element with the lower index in the low half).

override WDTYPE: u32 = 0u;

// -inf. Made from a `let`, at run time: WGSL makes a constant expression
// that evaluates to an infinity a shader-creation error, so Tint rejects
// `bitcast<f32>(0xff800000u)` written inline (naga folds it to -inf).
fn neg_inf() -> f32 {
    let bits = 0xff800000u;
    return bitcast<f32>(bits);
}

// Linear workgroup id of a grid spread over x and y (see WgpuBackend::grid).
fn linear_group(wg: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wg.x + wg.y * nwg.x;
}

// An IEEE half (low 16 bits of `h`) to f32, exactly, with integer ops only
// (unpack2x16float needs a capability not every backend grants).
fn f16_to_f32(h: u32) -> f32 {
    let sign = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    if (e == 0u) {
        // zero or subnormal: m * 2^-24
        let v = f32(m) * 5.9604644775390625e-8;
        return select(v, -v, sign != 0u);
    }
    if (e == 31u) {
        return bitcast<f32>(sign | 0x7f800000u | (m << 13u));
    }
    return bitcast<f32>(sign | ((e + 112u) << 23u) | (m << 13u));
}

// Element `i` of a weight of dtype code `dt` stored as words, given the word
// that holds it. A bf16 is the high half of an f32, so its decode is a shift.
fn decode_as(word: u32, i: u32, dt: u32) -> f32 {
    if (dt == 0u) {
        return bitcast<f32>(word);
    }
    let hi = (i & 1u) == 1u;
    if (dt == 1u) {
        return f16_to_f32(select(word & 0xffffu, word >> 16u, hi));
    }
    return bitcast<f32>(select(word << 16u, word & 0xffff0000u, hi));
}

// Index of the word holding element `i` of a weight of dtype code `dt`.
fn word_of(i: u32, dt: u32) -> u32 {
    return select(i >> 1u, i, dt == 0u);
}

// The same for the kernel's one weight dtype, WDTYPE.
fn decode_weight(word: u32, i: u32) -> f32 {
    return decode_as(word, i, WDTYPE);
}

fn weight_word(i: u32) -> u32 {
    return word_of(i, WDTYPE);
}

// Both elements of a 16-bit word as f32 (low index first).
fn decode_pair(word: u32) -> vec2<f32> {
    if (WDTYPE == 1u) {
        return vec2<f32>(f16_to_f32(word & 0xffffu), f16_to_f32(word >> 16u));
    }
    return vec2<f32>(bitcast<f32>(word << 16u), bitcast<f32>(word & 0xffff0000u));
}

// tanh clamped to a range where it is exactly +-1 in f32: some drivers
// (Metal fast math) return NaN for large arguments. A NaN stays NaN (a
// clamp would make it +-1, and a broken model's logits finite), tested on
// its bits: a compiler may assume no NaN in float comparisons.
fn safe_tanh(x: f32) -> f32 {
    let nan = (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
    return select(tanh(clamp(x, -15.0, 15.0)), x, nan);
}

// gelu, tanh approximation (gelu_pytorch_tanh).
fn gelu_tanh(x: f32) -> f32 {
    let c = 0.7978845608028654;
    return 0.5 * x * (1.0 + safe_tanh(c * (x + 0.044715 * x * x * x)));
}

// ---- expert weights in tile order (backends/wgpu/src/expert_tiles.rs) ----
// A layer's expert stack may be stored tile by tile (16-bit weights): each
// expert's matrix in blocks of 64 rows, each block in chunks of 16 of k
// (two vec4 a row), a chunk its 64 rows' 32 bytes one after another; a
// gate_up matrix's block holds 16 gate rows, then the up rows of the same
// 16 features, twice (the order the prefill GEMMs' tiles take them in).
// The prefill GEMM's tiles then read whole runs of memory a step
// (docs/decisions.md).

// The vec4 index of the first 8 weights of row `r` of the expert matrix
// that starts at vec4 `eb`, `kq` vec4 a row: row-major, or `tiled` (a
// gate_up matrix `gu` of `n` features: r < n the gate row of feature r,
// else the up row of feature r - n).
fn expert_row(eb: u32, r: u32, kq: u32, tiled: bool, gu: bool, n: u32) -> u32 {
    if (!tiled) {
        return eb + r * kq;
    }
    var b = r / 64u;
    var jl = r % 64u;
    if (gu) {
        let up = r >= n;
        let f = select(r, r - n, up);
        b = f / 32u;
        jl = 32u * ((f % 32u) / 16u) + f % 16u + select(0u, 16u, up);
    }
    return eb + (b * (kq / 2u) * 64u + jl) * 2u;
}

// Vec4 `q` (weights 8q .. 8q + 7) of a row, from its expert_row.
fn expert_step(q: u32, tiled: bool) -> u32 {
    return select(q, (q / 2u) * 128u + q % 2u, tiled);
}
