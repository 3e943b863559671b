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

fn ffn_inv_rms(ss: f32) -> f32 {
    return inverseSqrt(ss / f32(ffn_dim()) + ffn_eps());
}

// The branch sum before its norm at column i: rmsnorm(d) * w_d +
// rmsnorm(e) * w_e (with the experts branch).
fn ffn_branch_sum(base: u32, i: u32, inv_d: f32, inv_e: f32) -> f32 {
    let h = ffn_dense(base + i) * inv_d * decode_as(FW0[word_of(i, WD0)], i, WD0);
    return ffn_moe(base + i) * inv_e * decode_as(FW1[word_of(i, WD1)], i, WD1) + h;
}

// The row at `base`, by the workgroup's WG threads, thread lid on columns
// lid, lid + WG, .. . Each pass rereads its inputs (from cache: the row is a
// few KB) rather than keeping them in registers between the reductions: the
// MoE down pair's tail runs this in the pair's own launch, where registers
// held here would be held by every workgroup of the pair and cut its
// occupancy (the eighteenth session's form, with the row in registers, made
// the launch 40.0 us against 15.5 + 5.9 for the two launches on the H200).
fn post_ffn_row(base: u32, lid: u32) {
    let moe = (ffn_flags() & 1u) != 0u;
    let next = (ffn_flags() & 2u) != 0u;
    let dim = ffn_dim();
    // The two branches' sums of squares, with one reduction.
    var sd = 0.0;
    var se = 0.0;
    for (var i = lid; i < dim; i += WG) {
        let d = ffn_dense(base + i);
        sd += d * d;
        if (moe) {
            let ev = ffn_moe(base + i);
            se += ev * ev;
        }
    }
    let sde = block_sum2(vec2<f32>(sd, se), lid);
    let inv_d = ffn_inv_rms(sde.x);
    let inv_e = ffn_inv_rms(sde.y);
    var inv_s = 0.0;
    if (moe) {
        var ss = 0.0;
        for (var i = lid; i < dim; i += WG) {
            let s = ffn_branch_sum(base, i, inv_d, inv_e);
            ss += s * s;
        }
        inv_s = ffn_inv_rms(block_sum(ss, lid));
    }
    var sx = 0.0;
    for (var i = lid; i < dim; i += WG) {
        var h: f32;
        if (moe) {
            h = ffn_branch_sum(base, i, inv_d, inv_e) * inv_s * decode_as(FW2[word_of(i, WD2)], i, WD2);
        } else {
            h = ffn_dense(base + i) * inv_d * decode_as(FW0[word_of(i, WD0)], i, WD0);
        }
        let x = (FR[base + i] + h) * ffn_scale();
        FX[base + i] = x;
        sx += x * x;
    }
    if (next) {
        let inv_x = ffn_inv_rms(block_sum(sx, lid));
        // (FX[base + i] is this thread's own write above)
        for (var i = lid; i < dim; i += WG) {
            FN[base + i] = FX[base + i] * inv_x * decode_as(FW3[word_of(i, WD3)], i, WD3);
        }
    }
}
