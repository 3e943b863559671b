// MoE decode variants for examples/kernel_lab.rs: top-8 experts, bf16,
// hidden 2816, inter 704. Compiled after kernels/moe_decode.wgsl, whose
// parameters, bindings, constants (LANES, BK, TOPK) and dot8 it reuses.

var<workgroup> wsum: array<f32, 64>;

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

// 4 rows per workgroup: subgroups 0-3 the gate rows, 4-7 the up rows.
@compute @workgroup_size(256)
fn gu_split(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let n = P.inter;
    let nrb = n / 4u;
    let j = wg.x / nrb;
    let i = (wg.x % nrb) * 4u + (t / LANES) % 4u;
    let up = t / 128u;
    let lane = t % LANES;
    let e = IDS[j];
    let base = (e * 2u * n + up * n + i) * BK;
    let s = subgroupAdd(row_dot(base, lane));
    if (lane == 0u) {
        wsum[t / LANES] = s;
    }
    workgroupBarrier();
    if (t < 4u) {
        OUT[j * n + (wg.x % nrb) * 4u + t] = gelu_tanh(wsum[t]) * wsum[t + 4u];
    }
}

// 64 threads: subgroup 0 the gate row, 1 the up row.
@compute @workgroup_size(64)
fn gu_small(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let n = P.inter;
    let j = wg.x / n;
    let i = wg.x % n;
    let up = t / LANES;
    let lane = t % LANES;
    let e = IDS[j];
    let base = (e * 2u * n + up * n + i) * BK;
    let s = subgroupAdd(row_dot(base, lane));
    if (lane == 0u) {
        wsum[up] = s;
    }
    workgroupBarrier();
    if (t == 0u) {
        OUT[j * n + i] = gelu_tanh(wsum[0]) * wsum[1];
    }
}

// Down: 8 output rows per workgroup, 32 lanes per row; the slots' bases are
// computed once; slot-major loop with a compile-time trip count.
@compute @workgroup_size(256)
fn dn_slots(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let lane = t % LANES;
    let r = wg.x * 8u + t / LANES;
    let h = P.hidden;
    var acc = 0.0;
    for (var j = 0u; j < TOPK; j++) {
        let e = IDS[j];
        let base = (e * h + r) * BK;
        let xb = j * (P.inter / 4u);
        var a = 0.0;
        for (var b = lane; b < BK; b += LANES) {
            a += dot8(W[base + b], xb + 2u * b);
        }
        acc += WTS[j] * a;
    }
    let s = subgroupAdd(acc);
    if (lane == 0u) {
        OUT[r] = s;
    }
}

// Down with 64-thread workgroups (2 rows).
@compute @workgroup_size(64)
fn dn_small(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let lane = t % LANES;
    let r = wg.x * 2u + t / LANES;
    let h = P.hidden;
    var acc = 0.0;
    for (var j = 0u; j < TOPK; j++) {
        let e = IDS[j];
        let base = (e * h + r) * BK;
        let xb = j * (P.inter / 4u);
        var a = 0.0;
        for (var b = lane; b < BK; b += LANES) {
            a += dot8(W[base + b], xb + 2u * b);
        }
        acc += WTS[j] * a;
    }
    let s = subgroupAdd(acc);
    if (lane == 0u) {
        OUT[r] = s;
    }
}

// Down, one subgroup per row and slot pair split: lanes 0-15 / 16-31 take
// alternate slots (16 lanes x 88 blocks: 5.5 blocks each).
@compute @workgroup_size(256)
fn dn_half(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let lane = t % LANES;
    let half = lane / 16u;
    let hl = lane % 16u;
    let r = wg.x * 8u + t / LANES;
    let h = P.hidden;
    var acc = 0.0;
    for (var jj = 0u; jj < TOPK / 2u; jj++) {
        let j = jj * 2u + half;
        let e = IDS[j];
        let base = (e * h + r) * BK;
        let xb = j * (P.inter / 4u);
        var a = 0.0;
        for (var b = hl; b < BK; b += 16u) {
            a += dot8(W[base + b], xb + 2u * b);
        }
        acc += WTS[j] * a;
    }
    let s = subgroupAdd(acc);
    if (lane == 0u) {
        OUT[r] = s;
    }
}

// gate_up as a flat GEMV over top_k * 2 * inter rows (8 rows per workgroup,
// one subgroup per row, the dense `sg` kernel plus the expert indirection);
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

// gu_flat with the expert id taken as the slot index (no IDS load).
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
