// Gemma 4 router:
//   z       = x * (mean(x^2) + eps)^-1/2 * eff_scale
//   logits  = proj z                          (f32, E <= 256 rows)
//   top-k by logit (ties to the lower expert id), softmax over the k selected
//   (== softmax over all E, renormalised), times per_expert_scale[e].
// IDS [m, k] and WTS [m, k] are written in descending order of probability.
//
// Two dispatches (prefill batches: three or four, see router_scale). One workgroup
// per token would read the whole of proj
// (720 KB at E = 128, hidden = 2816, bf16) through one compute unit, which a
// single workgroup's loads in flight cannot do in less than tens of
// microseconds; so:
//   router_logits  one workgroup per (token, expert): the raw dot product
//                  proj[e] . (x * eff_scale), all of the row's loads in flight
//                  at once (up to 8 pairs per thread), into LOG [m, E];
//                  (prefill batches: router_scale, then the prefill GEMM);
//   router_topk    one workgroup per token: the RMS factor (the norm is a
//                  scalar per token, so it scales the raw logits exactly as it
//                  would scale z; skipped with SCALED, where
//                  post_attention_logits applied it), then kernels/topk.wgsl:
//                  top-k by rank, softmax, per-expert scale.
// Decode with the gate_up pair fused (post_attention_gate_up) has no
// router_topk at all: moe_gate_up_pair_routed ranks the scaled logits.

struct Params {
    m: u32,
    hidden: u32,
    experts: u32,
    top_k: u32,
    eps: f32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(1) @binding(0) var<storage, read> X: array<f32>;
@group(1) @binding(1) var<storage, read> SCALE: array<f32>;
@group(1) @binding(2) var<storage, read> PROJ: array<u32>;
@group(1) @binding(3) var<storage, read> PES: array<f32>;
@group(1) @binding(4) var<storage, read_write> LOG: array<f32>;
@group(1) @binding(5) var<storage, read_write> IDS: array<u32>;
@group(1) @binding(6) var<storage, read_write> WTS: array<f32>;

const WG: u32 = 256u;

// Whether LOG already holds the scaled logits (post_attention_logits,
// kernels/fused.wgsl, applies the RMS factor itself): router_topk then
// skips its pass over x.
override SCALED: bool = false;


// Word i of the weight (kernels/affine.wgsl).
fn wword(i: u32) -> u32 {
    return PROJ[i];
}

// Weight element pair `u` of row `row` (hidden even): one word for 16-bit
// weights, two for f32.
fn proj_pair(row: u32, u: u32) -> vec2<f32> {
    let base = row * P.hidden;
    if (QBITS != 0u) {
        return affine_pair(base + 2u * u);
    }
    if (WDTYPE == 0u) {
        return vec2<f32>(bitcast<f32>(PROJ[base + 2u * u]), bitcast<f32>(PROJ[base + 2u * u + 1u]));
    }
    return decode_pair(PROJ[(base >> 1u) + u]);
}

// Pair `u` of x_t * eff_scale (x row at `xb`).
fn xs_pair(xb: u32, u: u32) -> vec2<f32> {
    let i = 2u * u;
    return vec2<f32>(X[xb + i], X[xb + i + 1u]) * vec2<f32>(SCALE[i], SCALE[i + 1u]);
}

// Pair u's contribution, zero past the row's nu pairs (the loads stay in range).
fn pair_dot(row: u32, xb: u32, u: u32, nu: u32) -> f32 {
    let uc = min(u, nu - 1u);
    return select(0.0, dot(proj_pair(row, uc), xs_pair(xb, uc)), u < nu);
}

@compute @workgroup_size(256)
fn router_logits(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let g = linear_group(wg, nwg);
    let t = g / P.experts;
    let e = g % P.experts;
    if (t >= P.m) {
        return;
    }
    let h = P.hidden;
    let xb = t * h;
    var acc = 0.0;
    if ((h & 1u) == 0u) {
        let nu = h / 2u;
        // Eight pairs in flight per thread: one pass for rows up to 4096.
        for (var u = lid; u < nu; u += 8u * WG) {
            let d0 = pair_dot(e, xb, u, nu);
            let d1 = pair_dot(e, xb, u + WG, nu);
            let d2 = pair_dot(e, xb, u + 2u * WG, nu);
            let d3 = pair_dot(e, xb, u + 3u * WG, nu);
            let d4 = pair_dot(e, xb, u + 4u * WG, nu);
            let d5 = pair_dot(e, xb, u + 5u * WG, nu);
            let d6 = pair_dot(e, xb, u + 6u * WG, nu);
            let d7 = pair_dot(e, xb, u + 7u * WG, nu);
            acc += ((d0 + d1) + (d2 + d3)) + ((d4 + d5) + (d6 + d7));
        }
    } else {
        // Odd rows: 16-bit rows may start mid-word; element by element.
        for (var i = lid; i < h; i += WG) {
            let gi = e * h + i;
            acc += decode_weight(PROJ[weight_word(gi)], gi) * (X[xb + i] * SCALE[i]);
        }
    }
    let sum = workgroup_sum(acc, lid, WG);
    if (lid == 0u) {
        LOG[t * P.experts + e] = sum;
    }
}

// Prefill batches: LOG[t, i] = X[t, i] * SCALE[i] (LOG bound to scratch of
// m * hidden), the input of the prefill GEMM (kernels/gemm.wgsl), which then
// writes the raw logits for router_topk: one read of proj per batch instead
// of one per token.
@compute @workgroup_size(256)
fn router_scale(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let i = linear_group(wg, nwg) * WG + lid;
    if (i < P.m * P.hidden) {
        LOG[i] = X[i] * SCALE[i % P.hidden];
    }
}

@compute @workgroup_size(256)
fn router_topk(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let t = linear_group(wg, nwg);
    if (t >= P.m) {
        return;
    }
    let h = P.hidden;
    let ne = P.experts;
    let xb = t * h;

    var inv = 1.0;
    if (!SCALED) {
        var ss = 0.0;
        for (var i = lid; i < h; i += WG) {
            let v = X[xb + i];
            ss += v * v;
        }
        inv = inverseSqrt(workgroup_sum(ss, lid, WG) / f32(h) + P.eps);
    }
    if (lid < (ne + 3u) / 4u) {
        let b = t * ne + 4u * lid;
        // (the loads past ne stay within LOG: its last row is padded)
        let l = vec4<f32>(LOG[b], LOG[b + 1u], LOG[b + 2u], LOG[b + 3u]);
        tk_log[lid] = topk_pad(l * inv, lid, ne);
    }
    workgroupBarrier();
    let k = P.top_k;
    topk_select(lid, ne, k);
    // Softmax over the k selected, times per_expert_scale.
    if (lid < k) {
        let e = tk_id[lid];
        IDS[t * k + lid] = e;
        WTS[t * k + lid] = topk_weight(lid, k) * PES[e];
    }
}
