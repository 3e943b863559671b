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
    // post_attention_logits: the router's expert count
    experts: u32,
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

// Row sums through workgroup_sum / workgroup_sum2 (kernels/reduce*.wgsl): one
// barrier with subgroup operations, log2(WG) + 2 without.
fn block_sum(v: f32, lid: u32) -> f32 {
    return workgroup_sum(v, lid, WG);
}

// Two independent row sums with one reduction.
fn block_sum2(v: vec2<f32>, lid: u32) -> vec2<f32> {
    return workgroup_sum2(v, lid, WG);
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
    post_attention_row(row, lid);
}

fn post_attention_row(row: u32, lid: u32) {
    let base = row * P.dim;
    let moe = (P.flags & 1u) != 0u;
    // Every input a thread needs is loaded first, so its loads are in flight
    // together (one memory latency, not one per step of the chain).
    var v: array<f32, MAXPER>;
    var x: array<f32, MAXPER>;
    var w0: array<f32, MAXPER>;
    var w1: array<f32, MAXPER>;
    var w2: array<f32, MAXPER>;
    var ss = 0.0;
    for (var j = 0u; j < PER; j++) {
        let i = lid + j * WG;
        var o = 0.0;
        if (i < P.dim) {
            o = AO[base + i];
            x[j] = AX[base + i];
            w0[j] = decode_as(AW0[word_of(i, WD0)], i, WD0);
            w1[j] = decode_as(AW1[word_of(i, WD1)], i, WD1);
            if (moe) {
                w2[j] = decode_as(AW2[word_of(i, WD2)], i, WD2);
            }
        }
        v[j] = o;
        ss += o * o;
    }
    let inv = inv_rms(block_sum(ss, lid));
    var ss2 = 0.0;
    for (var j = 0u; j < PER; j++) {
        let i = lid + j * WG;
        if (i < P.dim) {
            let r = v[j] * inv * w0[j] + x[j];
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
            AFF[base + i] = n * w1[j];
            if (moe) {
                AMOE[base + i] = n * w2[j];
            }
        }
    }
}

// ---- post_attention_logits: post_attention and the router's logits ----
//
// Decode (one row) with experts: workgroup 0 is post_attention; workgroup
// 1 + e writes expert e's logit proj[e] . (r * eff_scale) * rms(r)^-1, the
// router's z, scaled (router_topk with SCALED, or the routed gate_up pair,
// takes the top-k), one dependent dispatch sooner than router_logits. Each
// such workgroup recomputes r = x + rmsnorm(o) * w_post from the same
// inputs with the same reduction, so it is the r workgroup 0 writes. The
// router's weight has the module's WDTYPE, or with QBITS != 0 is MLX
// affine (kernels/affine.wgsl; mlx-lm writes Gemma 4's router at 8 bits).

@group(1) @binding(8) var<storage, read> RSCALE: array<f32>;
@group(1) @binding(9) var<storage, read> RPROJ: array<u32>;
@group(1) @binding(10) var<storage, read_write> RLOG: array<f32>;

// Word i of the router's weight (kernels/affine.wgsl reads through it).
fn wword(i: u32) -> u32 {
    return RPROJ[i];
}

// The affine header's offsets, read once a thread (none for 16-bit
// weights).
fn router_offsets() -> vec2<u32> {
    if (QBITS != 0u) {
        return affine_offsets();
    }
    return vec2<u32>(0u);
}

// Element gi of the router's weight, the affine parts at word offsets `o`.
fn router_weight(gi: u32, o: vec2<u32>) -> f32 {
    if (QBITS != 0u) {
        let sb = affine_sb_at(gi / QGROUP, o);
        return sb.x * f32(affine_q(gi, affine_word(gi))) + sb.y;
    }
    return decode_weight(RPROJ[weight_word(gi)], gi);
}

fn router_logit(e: u32, lid: u32) {
    // Every load first, as post_attention's.
    var v: array<f32, MAXPER>;
    var x: array<f32, MAXPER>;
    var w0: array<f32, MAXPER>;
    var pw: array<f32, MAXPER>;
    var ss = 0.0;
    let qo = router_offsets();
    for (var j = 0u; j < PER; j++) {
        let i = lid + j * WG;
        var o = 0.0;
        if (i < P.dim) {
            o = AO[i];
            x[j] = AX[i];
            w0[j] = decode_as(AW0[word_of(i, WD0)], i, WD0);
            let gi = e * P.dim + i;
            pw[j] = router_weight(gi, qo) * RSCALE[i];
        }
        v[j] = o;
        ss += o * o;
    }
    let inv = inv_rms(block_sum(ss, lid));
    var acc = 0.0;
    var ss2 = 0.0;
    for (var j = 0u; j < PER; j++) {
        let i = lid + j * WG;
        if (i < P.dim) {
            let r = v[j] * inv * w0[j] + x[j];
            acc += pw[j] * r;
            ss2 += r * r;
        }
    }
    let sums = block_sum2(vec2<f32>(acc, ss2), lid);
    if (lid == 0u) {
        RLOG[e] = sums.x * inv_rms(sums.y);
    }
}

@compute @workgroup_size(WG)
fn post_attention_logits(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                         @builtin(local_invocation_index) lid: u32) {
    let g = linear_group(wg, nwg);
    if (g == 0u) {
        post_attention_row(0u, lid);
    } else if (g <= P.experts) {
        router_logit(g - 1u, lid);
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
    let next = (P.flags & 2u) != 0u;
    // Every input a thread needs is loaded first (see post_attention).
    // h: the dense branch, then the branch sum, then the new residual x.
    var h: array<f32, MAXPER>;
    var e: array<f32, MAXPER>;
    var r: array<f32, MAXPER>;
    var w0: array<f32, MAXPER>;
    var w1: array<f32, MAXPER>;
    var w2: array<f32, MAXPER>;
    var w3: array<f32, MAXPER>;
    var sd = 0.0;
    var se = 0.0;
    for (var j = 0u; j < PER; j++) {
        let i = lid + j * WG;
        var d = 0.0;
        var ev = 0.0;
        if (i < P.dim) {
            d = FD[base + i];
            r[j] = FR[base + i];
            w0[j] = decode_as(FW0[word_of(i, WD0)], i, WD0);
            if (moe) {
                ev = FE[base + i];
                w1[j] = decode_as(FW1[word_of(i, WD1)], i, WD1);
                w2[j] = decode_as(FW2[word_of(i, WD2)], i, WD2);
            }
            if (next) {
                w3[j] = decode_as(FW3[word_of(i, WD3)], i, WD3);
            }
        }
        h[j] = d;
        e[j] = ev;
        sd += d * d;
        se += ev * ev;
    }
    // (the dense and expert branches' sums together: the same sums, one
    // reduction)
    let sde = block_sum2(vec2<f32>(sd, se), lid);
    let inv_d = inv_rms(sde.x);
    for (var j = 0u; j < PER; j++) {
        h[j] = h[j] * inv_d * w0[j];
    }
    if (moe) {
        let inv_e = inv_rms(sde.y);
        var ss = 0.0;
        for (var j = 0u; j < PER; j++) {
            let i = lid + j * WG;
            if (i < P.dim) {
                let s = e[j] * inv_e * w1[j] + h[j];
                h[j] = s;
                ss += s * s;
            }
        }
        let inv_s = inv_rms(block_sum(ss, lid));
        for (var j = 0u; j < PER; j++) {
            h[j] = h[j] * inv_s * w2[j];
        }
    }
    var sx = 0.0;
    for (var j = 0u; j < PER; j++) {
        let i = lid + j * WG;
        if (i < P.dim) {
            let x = (r[j] + h[j]) * P.scale;
            FX[base + i] = x;
            h[j] = x;
            sx += x * x;
        }
    }
    if (next) {
        let inv_x = inv_rms(block_sum(sx, lid));
        for (var j = 0u; j < PER; j++) {
            let i = lid + j * WG;
            if (i < P.dim) {
                FN[base + i] = h[j] * inv_x * w3[j];
            }
        }
    }
}
