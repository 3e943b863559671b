// moe_down_pair_post_ffn, appended to kernels/moe_decode.wgsl (with its two
// outputs coherent) and kernels/post_ffn_row.wgsl as the `moe_decode_ffn`
// family (backends/wgpu/src/kernels.rs VARIANTS).
//
// ---- moe_down_pair_post_ffn: the down pair, then post_ffn in its tail ----
//
// One decode row: moe_down_pair_decode's workgroups (problem A the dense
// MLP's down projection into OUT, B the routed experts' into OUT2), then
// the last of them to finish runs post_ffn on the two rows: one dependent
// dispatch a decode layer fewer. The launch's 2 x groups_a workgroups count
// in on TCNT[0] (kernels/tail.wgsl's tail_last; OUT and OUT2 are
// coherent). post_ffn's parameters ride in the pair's spare words: _p0 eps
// and _p1 the layer scalar (f32 bits), _p2 its flags.

@group(1) @binding(10) var<storage, read> FR: array<f32>;
@group(1) @binding(11) var<storage, read> FW0: array<u32>;
@group(1) @binding(12) var<storage, read> FW1: array<u32>;
@group(1) @binding(13) var<storage, read> FW2: array<u32>;
@group(1) @binding(14) var<storage, read> FW3: array<u32>;
@group(1) @binding(15) var<storage, read_write> FX: array<f32>;
@group(1) @binding(16) var<storage, read_write> FN: array<f32>;
@group(1) @binding(17) var<storage, read_write> TCNT: array<atomic<u32>>;

// kernels/post_ffn_row.wgsl's accessors.
fn ffn_dense(i: u32) -> f32 {
    return OUT[i];
}
fn ffn_moe(i: u32) -> f32 {
    return OUT2[i];
}
fn ffn_dim() -> u32 {
    return P.hidden;
}
fn ffn_eps() -> f32 {
    return bitcast<f32>(P._p0);
}
fn ffn_scale() -> f32 {
    return bitcast<f32>(P._p1);
}
fn ffn_flags() -> u32 {
    return P._p2;
}

@compute @workgroup_size(256)
fn moe_down_pair_post_ffn(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                          @builtin(local_invocation_index) t: u32) {
    let g = linear_group(wg, nwg);
    let n = 2u * P.groups_a;
    if (g >= n) {
        return;
    }
    if (g < P.groups_a) {
        down_a(g, t, 0u);
    } else {
        down_b(g - P.groups_a, t);
    }
    if (tail_last(0u, n, t)) {
        post_ffn_row(0u, t);
    }
}
