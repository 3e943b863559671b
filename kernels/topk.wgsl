// The router's choice from a token's logits (appended to the router and
// moe_decode families): top-k by rank, ties to the lower expert id, then
// the softmax over the k selected. router_topk runs it once per token;
// moe_gate_up_pair_routed in every workgroup (thousands a decode step), so
// it is written for few instructions: the logits as vec4s, two threads per
// expert where there are at most 128.

// Experts at most (a 256-thread workgroup), and experts per token at most:
// `turbospark::ops::MAX_EXPERTS` / `MAX_TOP_K`, which `Router::validate`
// holds every router to (backends/wgpu/src/ops/moe.rs asserts they agree).
const TOPK_MAXE: u32 = 256u;
const TOPK_MAXK: u32 = 8u;
var<workgroup> tk_log: array<vec4<f32>, 64>;
var<workgroup> tk_rank: array<u32, TOPK_MAXE>;
var<workgroup> tk_id: array<u32, TOPK_MAXK>;
var<workgroup> tk_v: array<f32, TOPK_MAXK>;

// Thread t's part of filling tk_log from logits `l` (a call per vec4 of
// them: t < ceil(ne / 4)); slots past ne hold -inf, which no logit ranks
// behind (an equal one has the lower id).
fn topk_pad(l: vec4<f32>, t: u32, ne: u32) -> vec4<f32> {
    let idx = vec4<u32>(4u * t) + vec4<u32>(0u, 1u, 2u, 3u);
    let ninf = neg_inf();
    return select(vec4<f32>(ninf), l, idx < vec4<u32>(ne));
}

// With tk_log filled (topk_pad) and a barrier since: the k largest into
// tk_id / tk_v, largest first, then a barrier. Expert e's place is the
// number of experts ahead of it (a larger logit, or an equal one and a
// lower id). Every thread of the workgroup calls it.
fn topk_select(lid: u32, ne: u32, k: u32) {
    // Two threads per expert, each over half the logits, where ne <= 128.
    let split = ne <= 128u;
    let e = select(lid, lid & 127u, split);
    let n4 = (ne + 3u) / 4u;
    let per = select(n4, (n4 + 1u) / 2u, split);
    let j0 = select(0u, lid >> 7u, split) * per;
    let j1 = min(j0 + per, n4);
    var rank = 0u;
    var v = 0.0;
    if (e < ne) {
        v = tk_log[e / 4u][e % 4u];
        let vv = vec4<f32>(v);
        let ev = vec4<u32>(e);
        for (var j = j0; j < j1; j++) {
            let o = tk_log[j];
            let idx = vec4<u32>(4u * j) + vec4<u32>(0u, 1u, 2u, 3u);
            let ahead = (o > vv) | ((o == vv) & (idx < ev));
            let c = select(vec4<u32>(0u), vec4<u32>(1u), ahead);
            rank += (c.x + c.y) + (c.z + c.w);
        }
    }
    tk_rank[lid] = rank;
    workgroupBarrier();
    if (lid < ne) {
        var r = tk_rank[lid];
        if (split) {
            r += tk_rank[lid + 128u];
        }
        if (r < k) {
            tk_id[r] = lid;
            tk_v[r] = v;
        }
    }
    workgroupBarrier();
}

// Selected slot j's weight after topk_select: the softmax over the k
// selected logits (the largest is tk_v[0]).
fn topk_weight(j: u32, k: u32) -> f32 {
    let mx = tk_v[0];
    var sum = 0.0;
    for (var i = 0u; i < k; i++) {
        sum += exp(tk_v[i] - mx);
    }
    return exp(tk_v[j] - mx) / sum;
}
