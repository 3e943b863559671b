// f32 -> f16 rounding every device does the same way, appended to the
// families that round inputs for tensor cores (gemm_prep, attention_coop).

// `v` rounded to f16's 11 significant bits, to nearest even, in its own
// f32 bits: WGSL leaves the rounding of f32 -> f16 to the device, so the
// conversion is given a value it holds exactly, and every device, and the
// CPU reference's model of these kernels, gets the same halves, as long as
// the value is within f16's normal range. Below it (2^-14) the device's
// conversion still rounds, or flushes to zero: for a row at gemm_prep's
// scale that is 2^28 under its largest, but attention_coop also rounds
// values it leaves unscaled (V rows under 2^15, and the probabilities),
// where such values are ordinary.
// Inf and NaN pass unchanged: the carry would turn a NaN's payload into
// an inf or a sign flip.
fn nearest_half(v: f32) -> f32 {
    let b = bitcast<u32>(v);
    if ((b & 0x7f800000u) == 0x7f800000u) {
        return v;
    }
    return bitcast<f32>((b + 0xfffu + ((b >> 13u) & 1u)) & 0xffffe000u);
}

// `v` on f16's grid to nearest even, its subnormals (below 2^-14, steps of
// 2^-24) included, as an f32 the conversion to f16 keeps exactly wherever
// the device keeps f16 subnormals (NVIDIA's and Mesa's do): the split
// products' rounding (turbospark::Precision::Exact), where a low part or
// an unscaled probability is often that small. (v * 2^24 is exact, and
// WGSL's round() takes ties to even.)
fn half_grid(v: f32) -> f32 {
    if (abs(v) < 6.103515625e-5) {
        return round(v * 16777216.0) * 5.9604644775390625e-8;
    }
    return nearest_half(v);
}

// The low part of a split: v - hi (exact in f32) on f16's grid; zero where
// hi is inf or NaN, so that v's own inf or NaN is what the products see.
fn split_lo(v: f32, hi: f32) -> f32 {
    let r = v - hi;
    if ((bitcast<u32>(hi) & 0x7f800000u) == 0x7f800000u) {
        return 0.0;
    }
    return half_grid(r);
}

fn half_grid4(v: vec4<f32>) -> vec4<f32> {
    return vec4<f32>(half_grid(v.x), half_grid(v.y), half_grid(v.z), half_grid(v.w));
}

fn split_lo4(v: vec4<f32>, hi: vec4<f32>) -> vec4<f32> {
    return vec4<f32>(split_lo(v.x, hi.x), split_lo(v.y, hi.y), split_lo(v.z, hi.z), split_lo(v.w, hi.w));
}

// nearest_half on each component.
fn nearest_half4(v: vec4<f32>) -> vec4<f32> {
    return vec4<f32>(nearest_half(v.x), nearest_half(v.y), nearest_half(v.z), nearest_half(v.w));
}

// The exponent e of a row's largest |x| (amax in [2^e, 2^(e + 1))), held
// at -112 or above so that the scales built from it stay normal f32; an
// inf or NaN row gives 128.
fn row_exponent(amax: f32) -> i32 {
    return max(i32((bitcast<u32>(amax) >> 23u) & 0xffu) - 127, -112);
}

// 2^p for p in [-126, 127].
fn pow2(p: i32) -> f32 {
    return bitcast<f32>(u32(127 + p) << 23u);
}
