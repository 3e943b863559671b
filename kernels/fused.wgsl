// Fused decoder steps between the big GEMVs: each replaces several
// rms_norm / add dispatches (see turbospark::ops::{PostAttention, PostFfn}).
// One workgroup per row; each thread keeps to the same columns in every pass,
// so it reads back what it wrote itself. The arithmetic is the unfused ops'
// in the same order: (v * inv) * w, then + residual.
//
//   post_attention  r = x + rmsnorm(o) * w_post; ff = rmsnorm(r) * w_ff;
//                   moe = rmsnorm(r) * w_moe (when P.flags & 1)
//   post_ffn        h = rmsnorm(d) * w_d; with experts (flags & 1)
//                   h = rmsnorm(h + rmsnorm(e) * w_e) * w_s;
//                   x = (r + h) * scale; normed = rmsnorm(x) * w_n (flags & 2)
//
// Norm weights may each be f32, f16 or bf16: WD0..WD3 are their dtype codes.

struct Params {
    rows: u32,
    dim: u32,
    eps: f32,
    scale: f32,
    flags: u32,
    _p0: u32,
    _p1: u32,
    _p2: u32,
}

@group(0) @binding(0) var<uniform> P: Params;

override WD0: u32 = 0u;
override WD1: u32 = 0u;
override WD2: u32 = 0u;
override WD3: u32 = 0u;

const WG: u32 = 256u;
var<workgroup> red: array<f32, WG>;

fn block_sum(v: f32, lid: u32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            red[lid] += red[lid + s];
        }
        workgroupBarrier();
    }
    let total = red[0];
    workgroupBarrier();
    return total;
}

fn inv_rms(ss: f32) -> f32 {
    return inverseSqrt(ss / f32(P.dim) + P.eps);
}

// ---- post_attention ----

@group(1) @binding(0) var<storage, read> AO: array<f32>;
@group(1) @binding(1) var<storage, read> AX: array<f32>;
@group(1) @binding(2) var<storage, read> AW0: array<u32>;
@group(1) @binding(3) var<storage, read> AW1: array<u32>;
@group(1) @binding(4) var<storage, read> AW2: array<u32>;
@group(1) @binding(5) var<storage, read_write> AR: array<f32>;
@group(1) @binding(6) var<storage, read_write> AFF: array<f32>;
@group(1) @binding(7) var<storage, read_write> AMOE: array<f32>;

@compute @workgroup_size(256)
fn post_attention(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
    let row = linear_group(wg, nwg);
    if (row >= P.rows) {
        return;
    }
    let base = row * P.dim;
    var ss = 0.0;
    for (var i = lid; i < P.dim; i += WG) {
        let v = AO[base + i];
        ss += v * v;
    }
    let inv = inv_rms(block_sum(ss, lid));
    var ss2 = 0.0;
    for (var i = lid; i < P.dim; i += WG) {
        let r = AO[base + i] * inv * decode_as(AW0[word_of(i, WD0)], i, WD0) + AX[base + i];
        AR[base + i] = r;
        ss2 += r * r;
    }
    let inv2 = inv_rms(block_sum(ss2, lid));
    for (var i = lid; i < P.dim; i += WG) {
        let n = AR[base + i] * inv2;
        AFF[base + i] = n * decode_as(AW1[word_of(i, WD1)], i, WD1);
        if ((P.flags & 1u) != 0u) {
            AMOE[base + i] = n * decode_as(AW2[word_of(i, WD2)], i, WD2);
        }
    }
}

// ---- post_ffn ----

@group(1) @binding(0) var<storage, read> FD: array<f32>;
@group(1) @binding(1) var<storage, read> FE: array<f32>;
@group(1) @binding(2) var<storage, read> FR: array<f32>;
@group(1) @binding(3) var<storage, read> FW0: array<u32>;
@group(1) @binding(4) var<storage, read> FW1: array<u32>;
@group(1) @binding(5) var<storage, read> FW2: array<u32>;
@group(1) @binding(6) var<storage, read> FW3: array<u32>;
@group(1) @binding(7) var<storage, read_write> FX: array<f32>;
@group(1) @binding(8) var<storage, read_write> FN: array<f32>;

@compute @workgroup_size(256)
fn post_ffn(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let row = linear_group(wg, nwg);
    if (row >= P.rows) {
        return;
    }
    let base = row * P.dim;
    let moe = (P.flags & 1u) != 0u;
    var sd = 0.0;
    var se = 0.0;
    for (var i = lid; i < P.dim; i += WG) {
        let d = FD[base + i];
        sd += d * d;
        if (moe) {
            let e = FE[base + i];
            se += e * e;
        }
    }
    let inv_d = inv_rms(block_sum(sd, lid));
    var inv_s = 0.0;
    if (moe) {
        // FX holds h + rmsnorm(e) * w_e until x is written.
        let inv_e = inv_rms(block_sum(se, lid));
        var ss = 0.0;
        for (var i = lid; i < P.dim; i += WG) {
            let h = FD[base + i] * inv_d * decode_as(FW0[word_of(i, WD0)], i, WD0);
            let s = FE[base + i] * inv_e * decode_as(FW1[word_of(i, WD1)], i, WD1) + h;
            FX[base + i] = s;
            ss += s * s;
        }
        inv_s = inv_rms(block_sum(ss, lid));
    }
    var sx = 0.0;
    for (var i = lid; i < P.dim; i += WG) {
        var h: f32;
        if (moe) {
            h = FX[base + i] * inv_s * decode_as(FW2[word_of(i, WD2)], i, WD2);
        } else {
            h = FD[base + i] * inv_d * decode_as(FW0[word_of(i, WD0)], i, WD0);
        }
        let x = (FR[base + i] + h) * P.scale;
        FX[base + i] = x;
        sx += x * x;
    }
    if ((P.flags & 2u) != 0u) {
        let inv_x = inv_rms(block_sum(sx, lid));
        for (var i = lid; i < P.dim; i += WG) {
            FN[base + i] = FX[base + i] * inv_x * decode_as(FW3[word_of(i, WD3)], i, WD3);
        }
    }
}
