// The quantized MoE phases over two problems in one launch (the family
// affine_gemv_pair: kernels/affine_gemv.wgsl with its binding accessors
// renamed `_a`, then this file). Decode runs the dense MLP (a one-expert
// MoE) beside the routed experts this way, as kernels/moe_decode.wgsl's
// pairs do for 16-bit weights: workgroups below P.groups_a take problem a
// (P.a, bindings 0-4), the rest problem b (P.b, bindings 5-9, the same
// order). Both problems share the weights' format (QBITS, QGROUP, WDTYPE),
// hidden (P.rows), the tokens (P.m) and a team's rows and lanes (RPT1,
// LPR); each has its own offsets, sizes and compiled-in trip counts (KU,
// TOPK; KU2, TOPK2 for b's down problem, whose rows are its own inter).
//
//   affine_gate_up_pair         phase 1 of both problems (one KU: both
//                               reduce over hidden)
//   affine_gate_up_pair_routed  the same with b's experts picked in the
//                               launch from the router's scaled logits
//   affine_down_pair            phase 2 of both problems
//
// The bodies are kernels/affine_gemv.wgsl's, written once: they reach the
// bindings only through the accessors below, which read b's where PB is
// set. PB is set once at the entry, so each inlined body sees one value
// (a workgroup takes one problem: the branch never diverges).

@group(1) @binding(5) var<storage, read> W2: array<vec4<u32>>;
@group(1) @binding(6) var<storage, read> X2: array<vec4<f32>>;
@group(1) @binding(7) var<storage, read> IDS2: array<u32>;
@group(1) @binding(8) var<storage, read> WTS2: array<f32>;
@group(1) @binding(9) var<storage, read_write> OUT2: array<f32>;

var<private> PB: bool;

override KU2: u32 = 0u;
override TOPK2: u32 = 0u;

fn wword(i: u32) -> u32 {
    var v: u32;
    if (PB) {
        v = W2[i >> 2u][i & 3u];
    } else {
        v = wword_a(i);
    }
    return v;
}

fn wvec(i: u32) -> vec4<u32> {
    var v: vec4<u32>;
    if (PB) {
        v = W2[i];
    } else {
        v = wvec_a(i);
    }
    return v;
}

fn xvec(i: u32) -> vec4<f32> {
    var v: vec4<f32>;
    if (PB) {
        v = X2[i];
    } else {
        v = xvec_a(i);
    }
    return v;
}

fn id_at(i: u32) -> u32 {
    var v: u32;
    if (PB) {
        v = IDS2[i];
    } else {
        v = id_at_a(i);
    }
    return v;
}

fn wt_at(i: u32) -> f32 {
    var v: f32;
    if (PB) {
        v = WTS2[i];
    } else {
        v = wt_at_a(i);
    }
    return v;
}

fn out_set(i: u32, v: f32) {
    if (PB) {
        OUT2[i] = v;
    } else {
        out_set_a(i, v);
    }
}

@compute @workgroup_size(256)
fn affine_gate_up_pair(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                       @builtin(local_invocation_index) lid: u32) {
    let g = linear_group(wg, nwg);
    if (g < P.groups_a) {
        PB = false;
        gate_up_body(P.a, g, gate_up_expert(P.a, g, lid), lid);
    } else {
        PB = true;
        let gb = g - P.groups_a;
        gate_up_body(P.b, gb, gate_up_expert(P.b, gb, lid), lid);
    }
}

@compute @workgroup_size(256)
fn affine_down_pair(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                    @builtin(local_invocation_index) lid: u32) {
    let g = linear_group(wg, nwg);
    if (g < P.groups_a) {
        PB = false;
        down_body(P.a, g, lid, KU, TOPK);
    } else {
        PB = true;
        down_body(P.b, g - P.groups_a, lid, KU2, TOPK2);
    }
}

// ---- affine_gate_up_pair_routed: b's experts from the router's logits ----
//
// As moe_gate_up_pair_routed (kernels/moe_decode.wgsl) for one token: each
// of b's workgroups ranks the scaled logits RLOG (kernels/topk.wgsl) and
// takes its slot's expert; b's first workgroup writes the routing (RIDS,
// RWTS: softmax times RPES) for phase 2. IDS2 (binding 7) is not read. Its
// bindings past 9 and helpers: kernels/routed_pair.wgsl.

@compute @workgroup_size(256)
fn affine_gate_up_pair_routed(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                              @builtin(local_invocation_index) lid: u32) {
    let g = linear_group(wg, nwg);
    if (g < P.groups_a) {
        PB = false;
        gate_up_body(P.a, g, gate_up_expert(P.a, g, lid), lid);
        return;
    }
    PB = true;
    let gb = g - P.groups_a;
    let ne = P.b.experts;
    let k = P.b.top_k;
    rank_logits(lid, ne, k);
    if (gb == 0u && lid < k) {
        write_routing(lid, k);
    }
    // (one token: pair p is slot p)
    let j = gb / P.b.nrb;
    if (lid == 0u) {
        sh_expert = ne;
        if (j < k) {
            sh_expert = tk_id[j];
        }
    }
    gate_up_body(P.b, gb, workgroupUniformLoad(&sh_expert), lid);
}

// ---- affine_gate_up_pair_slotted: the routed pair on streamed experts' slots ----
//
// affine_gate_up_pair_routed where b's weights are a slot stack of
// P.b.experts slots (streamed experts), as moe_gate_up_pair_slotted
// (kernels/moe_decode.wgsl) for 16-bit weights: each picked expert e (of
// the P.ranked the router ranks) is looked up in the layer's slot table
// TABLE and its slot's rows read; b's first workgroup writes the routing
// (RIDS, RWTS), the slots into SLOTS, and e into LOG at P.log_at, bit 31
// set where e holds no slot (slot 0 is read then; the host discards the
// pass).

@compute @workgroup_size(256)
fn affine_gate_up_pair_slotted(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                               @builtin(local_invocation_index) lid: u32) {
    let g = linear_group(wg, nwg);
    if (g < P.groups_a) {
        PB = false;
        gate_up_body(P.a, g, gate_up_expert(P.a, g, lid), lid);
        return;
    }
    PB = true;
    let gb = g - P.groups_a;
    let ne = P.ranked;
    let slots = P.b.experts;
    let k = P.b.top_k;
    rank_logits(lid, ne, k);
    if (gb == 0u && lid < k) {
        write_slotted_routing(lid, k, ne, slots, P.log_at);
    }
    // (one token: pair p is slot p)
    let j = gb / P.b.nrb;
    if (lid == 0u) {
        sh_expert = slots;
        if (j < k) {
            sh_expert = slot_read(tk_id[j], ne, slots);
        }
    }
    gate_up_body(P.b, gb, workgroupUniformLoad(&sh_expert), lid);
}
