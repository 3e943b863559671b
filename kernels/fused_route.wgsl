// post_attention_route, appended to kernels/fused.wgsl (its logits
// coherent), kernels/topk.wgsl and kernels/tail.wgsl as the `fused_route`
// family (backends/wgpu/src/kernels.rs VARIANTS).
//
// ---- post_attention_route: post_attention_logits, routed in its tail ----
//
// post_attention_logits' workgroups (post_attention, then one router logit
// each), then the last of them to finish ranks the logits (topk.wgsl, as
// router_topk does) and writes the token's routing: RIDS the experts, RWTS
// the softmax over the picked logits times their per-expert scales RPES.
// Decode's gate_up pair then reads its experts rather than ranking the
// logits in each of its workgroups (moe_gate_up_pair_routed), which holds
// every workgroup's first weight load behind the ranking. P._p1 is the
// router's top_k.

@group(1) @binding(11) var<storage, read> RPES: array<f32>;
@group(1) @binding(12) var<storage, read_write> RIDS: array<u32>;
@group(1) @binding(13) var<storage, read_write> RWTS: array<f32>;
@group(1) @binding(14) var<storage, read_write> TCNT: array<atomic<u32>>;

@compute @workgroup_size(WG)
fn post_attention_route(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                        @builtin(local_invocation_index) lid: u32) {
    let g = linear_group(wg, nwg);
    let n = 1u + P.experts;
    if (g >= n) {
        return;
    }
    if (g == 0u) {
        post_attention_row(0u, lid);
    } else {
        router_logit(g - 1u, lid);
    }
    if (!tail_last(0u, n, lid)) {
        return;
    }
    let ne = P.experts;
    let k = P._p1;
    if (lid < (ne + 3u) / 4u) {
        // (RLOG is padded to whole vec4s: `router_logits_buffer`)
        let l = vec4<f32>(RLOG[4u * lid], RLOG[4u * lid + 1u], RLOG[4u * lid + 2u], RLOG[4u * lid + 3u]);
        tk_log[lid] = topk_pad(l, lid, ne);
    }
    workgroupBarrier();
    topk_select(lid, ne, k);
    if (lid < k) {
        let e = tk_id[lid];
        RIDS[lid] = e;
        RWTS[lid] = topk_weight(lid, k) * RPES[e];
    }
}
