// The router's choice from a token's logits (appended to the router and
// moe_decode families): top-k by rank, ties to the lower expert id, then
// the softmax over the k selected. router_topk runs it once per token;
// moe_gate_up_pair_routed in every workgroup, so that the experts' gate_up
// needs no dispatch of its own before it.

// Experts at most (the logits one per thread of a 256-thread workgroup),
// and experts per token at most.
const TOPK_MAXE: u32 = 256u;
const TOPK_MAXK: u32 = 16u;
var<workgroup> tk_log: array<f32, TOPK_MAXE>;
var<workgroup> tk_id: array<u32, TOPK_MAXK>;
var<workgroup> tk_v: array<f32, TOPK_MAXK>;

// With tk_log[0..ne] written and a barrier since: the k largest into
// tk_id / tk_v, largest first, then a barrier. Expert e's place is the
// number of experts ahead of it (a larger logit, or an equal one and a
// lower id). Every thread of the workgroup calls it.
fn topk_select(lid: u32, ne: u32, k: u32) {
    if (lid < ne) {
        let v = tk_log[lid];
        var rank = 0u;
        for (var j = 0u; j < ne; j++) {
            let o = tk_log[j];
            rank += u32(o > v || (o == v && j < lid));
        }
        if (rank < k) {
            tk_id[rank] = lid;
            tk_v[rank] = v;
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
