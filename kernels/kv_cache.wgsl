// KV-cache append: row t of K and V ([m, kv_heads, head_dim]) goes to slot
// POS[t] % capacity of the caches ([kv_heads, capacity, head_dim]); a ring on
// sliding layers, linear on full layers. One invocation per (row, kv head,
// dim), K and V in the same dispatch.

struct Params {
    m: u32,
    kv_heads: u32,
    head_dim: u32,
    capacity: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(1) @binding(0) var<storage, read> K: array<f32>;
@group(1) @binding(1) var<storage, read> V: array<f32>;
@group(1) @binding(2) var<storage, read_write> KC: array<CacheT>;
@group(1) @binding(3) var<storage, read_write> VC: array<CacheT>;
@group(1) @binding(4) var<storage, read> POS: array<u32>;

@compute @workgroup_size(256)
fn kv_append(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let i = linear_group(wg, nwg) * 256u + lid;
    let row = P.kv_heads * P.head_dim;
    if (i >= P.m * row) {
        return;
    }
    let t = i / row;
    let gd = i % row;
    let g = gd / P.head_dim;
    let d = gd % P.head_dim;
    let slot = POS[t] % P.capacity;
    let dst = (g * P.capacity + slot) * P.head_dim + d;
    KC[dst] = to_cache(K[i]);
    VC[dst] = to_cache(V[i]);
}
