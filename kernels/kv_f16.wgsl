// The KV caches' element type for the `_f16` builds of the families that
// read or write them (kernels/kv_f32.wgsl: f32). A cache row is written
// as turbospark::dtype::kv_half rounds it, the same bits on every device:
// to nearest even; finite values past 65504 held there (an inf key would
// turn every later score to NaN); below f16's smallest normal, a signed
// zero (devices differ in keeping f16 subnormals). Inf and NaN pass.

alias CacheT = f16;

fn to_cache(x: f32) -> CacheT {
    let b = bitcast<u32>(x);
    let sign = b & 0x80000000u;
    let mag = b & 0x7fffffffu;
    if (mag >= 0x7f800000u) {
        return f16(x);
    }
    if (mag < 0x38800000u) {
        return f16(bitcast<f32>(sign));
    }
    // The low 13 mantissa bits rounded away, to nearest even: the value
    // is one f16 holds, so the conversion is exact on every device.
    let r = (b + 0xfffu + ((b >> 13u) & 1u)) & 0xffffe000u;
    if ((r & 0x7fffffffu) > 0x477fe000u) {
        return f16(bitcast<f32>(sign | 0x477fe000u));
    }
    return f16(bitcast<f32>(r));
}

fn to_cache4(x: vec4<f32>) -> vec4<CacheT> {
    return vec4<CacheT>(to_cache(x.x), to_cache(x.y), to_cache(x.z), to_cache(x.w));
}
