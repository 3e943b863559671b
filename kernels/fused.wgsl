// Fused decoder steps between the big GEMVs: each replaces several
// rms_norm / add dispatches (see turbospark::ops::{PostAttention, PostFfn}).
// One workgroup per row. The arithmetic is the unfused ops' in the same
// order: (v * inv) * w, then + residual.
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

// Threads per row: 1024 where the device allows, else 256 (a power of two).
override WG: u32 = 256u;
const MAXWG: u32 = 1024u;
var<workgroup> red: array<f32, MAXWG>;

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

// A thread's columns are lid + j * WG for j < PER (PER = ceil(dim / WG), a
// pipeline constant, at most MAXPER): its values stay in registers from pass
// to pass. With 1024 threads a 2816-wide row is 3 columns per thread, so a
// pass waits on at most 3 loads in turn.
override PER: u32 = 11u;
const MAXPER: u32 = 32u;

// ---- post_attention ----

@group(1) @binding(0) var<storage, read> AO: array<f32>;
@group(1) @binding(1) var<storage, read> AX: array<f32>;
@group(1) @binding(2) var<storage, read> AW0: array<u32>;
@group(1) @binding(3) var<storage, read> AW1: array<u32>;
@group(1) @binding(4) var<storage, read> AW2: array<u32>;
@group(1) @binding(5) var<storage, read_write> AR: array<f32>;
@group(1) @binding(6) var<storage, read_write> AFF: array<f32>;
@group(1) @binding(7) var<storage, read_write> AMOE: array<f32>;

@compute @workgroup_size(WG)
fn post_attention(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
    let row = linear_group(wg, nwg);
    if (row >= P.rows) {
        return;
    }
    let base = row * P.dim;
    var v: array<f32, MAXPER>;
    var ss = 0.0;
    for (var j = 0u; j < PER; j++) {
        let i = lid + j * WG;
        var o = 0.0;
        if (i < P.dim) {
            o = AO[base + i];
        }
        v[j] = o;
        ss += o * o;
    }
    let inv = inv_rms(block_sum(ss, lid));
    var ss2 = 0.0;
    for (var j = 0u; j < PER; j++) {
        let i = lid + j * WG;
        if (i < P.dim) {
            let r = v[j] * inv * decode_as(AW0[word_of(i, WD0)], i, WD0) + AX[base + i];
            AR[base + i] = r;
            v[j] = r;
            ss2 += r * r;
        }
    }
    let inv2 = inv_rms(block_sum(ss2, lid));
    for (var j = 0u; j < PER; j++) {
        let i = lid + j * WG;
        if (i < P.dim) {
            let n = v[j] * inv2;
            AFF[base + i] = n * decode_as(AW1[word_of(i, WD1)], i, WD1);
            if ((P.flags & 1u) != 0u) {
                AMOE[base + i] = n * decode_as(AW2[word_of(i, WD2)], i, WD2);
            }
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

@compute @workgroup_size(WG)
fn post_ffn(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let row = linear_group(wg, nwg);
    if (row >= P.rows) {
        return;
    }
    let base = row * P.dim;
    let moe = (P.flags & 1u) != 0u;
    // h: the dense branch, then the branch sum; x: the new residual.
    var h: array<f32, MAXPER>;
    var e: array<f32, MAXPER>;
    var sd = 0.0;
    var se = 0.0;
    for (var j = 0u; j < PER; j++) {
        let i = lid + j * WG;
        var d = 0.0;
        var ev = 0.0;
        if (i < P.dim) {
            d = FD[base + i];
            if (moe) {
                ev = FE[base + i];
            }
        }
        h[j] = d;
        e[j] = ev;
        sd += d * d;
        se += ev * ev;
    }
    let inv_d = inv_rms(block_sum(sd, lid));
    for (var j = 0u; j < PER; j++) {
        let i = lid + j * WG;
        if (i < P.dim) {
            h[j] = h[j] * inv_d * decode_as(FW0[word_of(i, WD0)], i, WD0);
        }
    }
    if (moe) {
        let inv_e = inv_rms(block_sum(se, lid));
        var ss = 0.0;
        for (var j = 0u; j < PER; j++) {
            let i = lid + j * WG;
            if (i < P.dim) {
                let s = e[j] * inv_e * decode_as(FW1[word_of(i, WD1)], i, WD1) + h[j];
                h[j] = s;
                ss += s * s;
            }
        }
        let inv_s = inv_rms(block_sum(ss, lid));
        for (var j = 0u; j < PER; j++) {
            let i = lid + j * WG;
            if (i < P.dim) {
                h[j] = h[j] * inv_s * decode_as(FW2[word_of(i, WD2)], i, WD2);
            }
        }
    }
    var sx = 0.0;
    for (var j = 0u; j < PER; j++) {
        let i = lid + j * WG;
        if (i < P.dim) {
            let x = (FR[base + i] + h[j]) * P.scale;
            FX[base + i] = x;
            h[j] = x;
            sx += x * x;
        }
    }
    if ((P.flags & 2u) != 0u) {
        let inv_x = inv_rms(block_sum(sx, lid));
        for (var j = 0u; j < PER; j++) {
            let i = lid + j * WG;
            if (i < P.dim) {
                FN[base + i] = h[j] * inv_x * decode_as(FW3[word_of(i, WD3)], i, WD3);
            }
        }
    }
}
