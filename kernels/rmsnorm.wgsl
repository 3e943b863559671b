// RMSNorm: out[r] = (residual[r] + x[r] * (mean(x[r]^2) + eps)^-1/2 * w) * scale.
// One workgroup per row; weight and residual are optional (flags in P).

struct Params {
    rows: u32,
    dim: u32,
    eps: f32,
    scale: f32,
    has_weight: u32,
    has_residual: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(1) @binding(0) var<storage, read> X: array<f32>;
@group(1) @binding(1) var<storage, read> W: array<u32>;
@group(1) @binding(2) var<storage, read> R: array<f32>;
@group(1) @binding(3) var<storage, read_write> OUT: array<f32>;

const WG: u32 = 256u;

@compute @workgroup_size(256)
fn rms_norm(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let row = linear_group(wg, nwg);
    if (row >= P.rows) {
        return;
    }
    let base = row * P.dim;
    var ss = 0.0;
    for (var i = lid; i < P.dim; i += WG) {
        let v = X[base + i];
        ss += v * v;
    }
    let inv = inverseSqrt(workgroup_sum(ss, lid, WG) / f32(P.dim) + P.eps);
    for (var i = lid; i < P.dim; i += WG) {
        var y = X[base + i] * inv;
        if (P.has_weight != 0u) {
            y *= decode_weight(W[weight_word(i)], i);
        }
        if (P.has_residual != 0u) {
            y += R[base + i];
        }
        OUT[base + i] = y * P.scale;
    }
}
