// post_ffn's row (kernels/fused.wgsl's header has its arithmetic), shared
// by fused.wgsl's post_ffn and the MoE down pair's tail
// (kernels/moe_decode_ffn.wgsl), with the row kernels' launch constants.
// The host declares FR, FW0..FW3, FX and FN and defines the accessors
// ffn_dense(i) and ffn_moe(i) (the two branches' rows) and ffn_dim(),
// ffn_eps(), ffn_scale() and ffn_flags() (bit 0: the experts branch; bit 1:
// the next layer's normed input).

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

// A thread's columns are lid + j * WG for j < PER (PER = ceil(dim / WG), a
// pipeline constant, at most MAXPER): its values stay in registers from pass
// to pass. With 1024 threads a 2816-wide row is 3 columns per thread, so a
// pass waits on at most 3 loads in turn.
override PER: u32 = 11u;
const MAXPER: u32 = 32u;

fn ffn_inv_rms(ss: f32) -> f32 {
    return inverseSqrt(ss / f32(ffn_dim()) + ffn_eps());
}

// The row at `base`, by the workgroup's WG threads.
fn post_ffn_row(base: u32, lid: u32) {
    let moe = (ffn_flags() & 1u) != 0u;
    let next = (ffn_flags() & 2u) != 0u;
    // Every input a thread needs is loaded first (as kernels/fused.wgsl's
    // post_attention does).
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
        if (i < ffn_dim()) {
            d = ffn_dense(base + i);
            r[j] = FR[base + i];
            w0[j] = decode_as(FW0[word_of(i, WD0)], i, WD0);
            if (moe) {
                ev = ffn_moe(base + i);
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
    let inv_d = ffn_inv_rms(sde.x);
    for (var j = 0u; j < PER; j++) {
        h[j] = h[j] * inv_d * w0[j];
    }
    if (moe) {
        let inv_e = ffn_inv_rms(sde.y);
        var ss = 0.0;
        for (var j = 0u; j < PER; j++) {
            let i = lid + j * WG;
            if (i < ffn_dim()) {
                let s = e[j] * inv_e * w1[j] + h[j];
                h[j] = s;
                ss += s * s;
            }
        }
        let inv_s = ffn_inv_rms(block_sum(ss, lid));
        for (var j = 0u; j < PER; j++) {
            h[j] = h[j] * inv_s * w2[j];
        }
    }
    var sx = 0.0;
    for (var j = 0u; j < PER; j++) {
        let i = lid + j * WG;
        if (i < ffn_dim()) {
            let x = (r[j] + h[j]) * ffn_scale();
            FX[base + i] = x;
            h[j] = x;
            sx += x * x;
        }
    }
    if (next) {
        let inv_x = ffn_inv_rms(block_sum(sx, lid));
        for (var j = 0u; j < PER; j++) {
            let i = lid + j * WG;
            if (i < ffn_dim()) {
                FN[base + i] = h[j] * inv_x * w3[j];
            }
        }
    }
}
