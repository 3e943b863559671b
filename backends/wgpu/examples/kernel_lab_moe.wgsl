// MoE decode variants for examples/kernel_lab.rs: top-8 experts, bf16,
// hidden 2816, inter 704. Compiled after kernels/moe_decode.wgsl, whose
// parameters, bindings, constants (LANES, BK, TOPK) and dot8 it reuses.
// Kept: the flat-GEMV forms that isolate what the expert layout costs (an
// open question, BENCHMARKS.md). The gate_up split into one row per lane
// group became the backend's kernel; the down variants timed the same as
// it or slower and were dropped (their outputs: docs/bench/*/lab). The
// tile-ordered decode kernels first written here (gu_tiled, dn_tiled; H200
// runs 05-07 of 2026-12-01 at a94f43a) became moe_decode.wgsl's
// tiled bodies, which the `moe_tiled` case now times.

fn row_dot(base: u32, lane: u32) -> f32 {
    var a0 = 0.0;
    var a1 = 0.0;
    var i = lane;
    for (; i + LANES < BK; i += 2u * LANES) {
        let w0 = W[base + i];
        let w1 = W[base + i + LANES];
        a0 += dot8(w0, 2u * i);
        a1 += dot8(w1, 2u * (i + LANES));
    }
    if (i < BK) {
        a0 += dot8(W[base + i], 2u * i);
    }
    return a0 + a1;
}

// gate_up as a flat GEMV over top_k * 2 * inter rows (8 rows per workgroup,
// one subgroup per row, a dense GEMV plus the expert indirection);
// writes raw dots (no activation): isolates what the MoE layout costs.
@compute @workgroup_size(256)
fn gu_flat(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let lane = t % LANES;
    let r = wg.x * 8u + t / LANES;
    let per = 2u * P.inter;
    let j = r / per;
    let e = IDS[j];
    let base = (e * per + r % per) * BK;
    let s = subgroupAdd(row_dot(base, lane));
    if (lane == 0u) {
        OUT[r % (P.top_k * P.inter)] = s;
    }
}

// gu_flat with expert 16 * j for slot j (no IDS load).
@compute @workgroup_size(256)
fn gu_flat_noid(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let lane = t % LANES;
    let r = wg.x * 8u + t / LANES;
    let per = 2u * P.inter;
    let j = r / per;
    let base = (j * 16u * per + r % per) * BK;
    let s = subgroupAdd(row_dot(base, lane));
    if (lane == 0u) {
        OUT[r % (P.top_k * P.inter)] = s;
    }
}
