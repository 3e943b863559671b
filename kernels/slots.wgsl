// Streamed experts' slot lookup (turbospark::ops::SlotLookup): for each of
// the P.n routed ids, SLOT[i] = TABLE[IDS[i]], the slot of the layer's
// stack holding that expert, and LOG[P.at + i] = IDS[i]. An expert that
// holds no slot (0xffffffff, an entry of P.slots or more, an id past the
// table) reads slot 0 and is logged with bit 31 set: the host sees the miss
// and discards the pass that read it.
struct Params {
    n: u32,
    experts: u32,
    slots: u32,
    at: u32,
}

@group(0) @binding(0) var<uniform> P: Params;

@group(1) @binding(0) var<storage, read> IDS: array<u32>;
@group(1) @binding(1) var<storage, read> TABLE: array<u32>;
@group(1) @binding(2) var<storage, read_write> SLOT: array<u32>;
@group(1) @binding(3) var<storage, read_write> LOG: array<u32>;

const MISSED: u32 = 0x80000000u;

@compute @workgroup_size(64)
fn slot_lookup(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let i = linear_group(wg, nwg) * 64u + lid;
    if (i >= P.n) {
        return;
    }
    let e = IDS[i];
    var s = P.slots;
    if (e < P.experts) {
        s = TABLE[e];
    }
    if (s < P.slots) {
        SLOT[i] = s;
        LOG[P.at + i] = e;
    } else {
        SLOT[i] = 0u;
        LOG[P.at + i] = e | MISSED;
    }
}
