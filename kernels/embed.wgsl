// Embedding gather: OUT[t, :] = TABLE[IDS[t], :] * s; P.n = hidden, P.rows = tokens.
struct Params {
    n: u32,
    rows: u32,
    s: f32,
    vocab: u32,
}

@group(0) @binding(0) var<uniform> P: Params;

// Ids are checked against the vocabulary on the host; the clamp only keeps a
// bad id in bounds.
@group(1) @binding(0) var<storage, read> IDS: array<u32>;
@group(1) @binding(1) var<storage, read> TABLE: array<u32>;
@group(1) @binding(2) var<storage, read_write> EMB: array<f32>;

// Word i of the table (kernels/affine.wgsl).
fn wword(i: u32) -> u32 {
    return TABLE[i];
}

@compute @workgroup_size(256)
fn embed(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
    let t = linear_group(wg, nwg);
    if (t >= P.rows) {
        return;
    }
    let id = min(IDS[t], P.vocab - 1u);
    for (var i = lid; i < P.n; i += 256u) {
        let e = id * P.n + i;
        var v: f32;
        if (QBITS != 0u) {
            v = affine_elem(e);
        } else {
            v = decode_weight(TABLE[weight_word(e)], e);
        }
        EMB[t * P.n + i] = v * P.s;
    }
}

