// The KV caches' element type for the families that read or write them
// (kv_cache, rope, attention, attention_coop): f32 here; their `_f16`
// builds append kernels/kv_f16.wgsl instead (backends/wgpu/src/kernels.rs).
// A family reads a cache as `vec4<f32>(KC[i])` and writes `to_cache(x)`.

alias CacheT = f32;

fn to_cache(x: f32) -> CacheT {
    return x;
}

fn to_cache4(x: vec4<f32>) -> vec4<CacheT> {
    return x;
}
