// The routed gate_up pairs' shared part (appended with kernels/topk.wgsl to
// the moe_decode family and the affine_gemv_pair build): the second
// problem's experts picked in the launch from the router's scaled logits,
// and for streamed experts their slots looked up in the layer's slot table
// (as slot_lookup, kernels/slots.wgsl, looks them up). Bindings 10-13 are
// the routed pairs', 14-16 the slotted pairs' too.

@group(1) @binding(10) var<storage, read> RLOG: array<f32>;
@group(1) @binding(11) var<storage, read> RPES: array<f32>;
@group(1) @binding(12) var<storage, read_write> RIDS: array<u32>;
@group(1) @binding(13) var<storage, read_write> RWTS: array<f32>;
@group(1) @binding(14) var<storage, read> TABLE: array<u32>;
@group(1) @binding(15) var<storage, read_write> LOG: array<u32>;
@group(1) @binding(16) var<storage, read_write> SLOTS: array<u32>;

const SLOT_MISSED: u32 = 0x80000000u;

// The token's scaled logits RLOG (ne experts) ranked into tk_id / tk_v,
// the top k first (kernels/topk.wgsl), by every workgroup that calls it.
fn rank_logits(t: u32, ne: u32, k: u32) {
    if (t < (ne + 3u) / 4u) {
        // (RLOG is padded to whole vec4s: `router_logits_buffer`)
        let l = vec4<f32>(RLOG[4u * t], RLOG[4u * t + 1u], RLOG[4u * t + 2u], RLOG[4u * t + 3u]);
        tk_log[t] = topk_pad(l, t, ne);
    }
    workgroupBarrier();
    topk_select(t, ne, k);
}

// The first workgroup's routing for phase 2: thread t < k writes the t-th
// expert and its weight (softmax over the k, times RPES).
fn write_routing(t: u32, k: u32) {
    let e = tk_id[t];
    RIDS[t] = e;
    RWTS[t] = topk_weight(t, k) * RPES[e];
}

// The slot of a `slots`-slot stack holding expert e (of the `ranked` the
// table maps), or `slots` where it holds none.
fn slot_of(e: u32, ranked: u32, slots: u32) -> u32 {
    var s = slots;
    if (e < ranked) {
        s = TABLE[e];
    }
    return min(s, slots);
}

// The slot whose rows a pair reads for expert e: its own, or slot 0 where
// it has none (finite weights; the host discards the pass that read them).
fn slot_read(e: u32, ranked: u32, slots: u32) -> u32 {
    let s = slot_of(e, ranked, slots);
    return select(0u, s, s < slots);
}

// write_routing, and the t-th expert's slot into SLOTS and the expert into
// LOG at `at` (bit 31 set where it holds no slot).
fn write_slotted_routing(t: u32, k: u32, ranked: u32, slots: u32, at: u32) {
    write_routing(t, k);
    let e = tk_id[t];
    let s = slot_of(e, ranked, slots);
    SLOTS[t] = select(0u, s, s < slots);
    LOG[at + t] = select(e | SLOT_MISSED, e, s < slots);
}
