// MoE decode variants for examples/kernel_lab.rs: top-8 experts, bf16,
// hidden 2816, inter 704. Compiled after kernels/moe_decode.wgsl, whose
// parameters, bindings, constants (LANES, BK, TOPK) and dot8 it reuses.
// Kept: the flat-GEMV forms that isolate what the expert layout costs (an
// open question, BENCHMARKS.md). The gate_up split into one row per lane
// group became the backend's kernel; the down variants timed the same as
// it or slower and were dropped (their outputs: docs/bench/*/lab).

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

// ---- the decode GEMVs on tile-ordered expert weights (moe_tiled) ----
// The layout the grouped tensor-core GEMM read 17% / 11% faster at 512
// tokens (fourteenth session, run 04): each expert's matrix in blocks of
// 64 tile rows (gate_up: 16 gate rows then the 16 up rows of the same
// features, twice; down: its rows in order), each block in chunks of 16 of
// k, a chunk its 64 rows' 32 bytes one after another (2 KB). Can decode
// read it as fast as the row-major kernels above read theirs? Each warp
// reads 512 contiguous bytes a load.

// vec4 index of (expert base eb, block b, chunk c of nch, tile row jl, half h).
fn tile_at(eb: u32, b: u32, c: u32, jl: u32, h: u32, nch: u32) -> u32 {
    return eb + ((b * nch + c) * 64u + jl) * 2u + h;
}

// Features of a gu_tiled workgroup (16, 8 or 4: its gate rows and their up
// rows, 4 * TGU_FEAT threads a chunk) and its loop's rounds: hidden / 16
// chunks, 64 / TGU_FEAT a round.
override TGU_FEAT: u32 = 16u;
override TGU_ROUNDS: u32 = 44u;
var<workgroup> lab_trow: array<f32, 32>;

// gate_up: workgroup g takes TGU_FEAT features of slot j (their gate rows,
// then their up rows, 16 tile rows further), thread t the (row, half)
// t % (4 TGU_FEAT) of every (64 / TGU_FEAT)-th chunk from t / (4
// TGU_FEAT); ACT[j, f] = gelu(gate . x) * (up . x).
@compute @workgroup_size(256)
fn gu_tiled(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) t: u32) {
    let g = linear_group(wg, nwg);
    let n = P.inter;
    let groups = n / TGU_FEAT;
    let j = g / groups;
    let f0 = (g % groups) * TGU_FEAT;
    let b = f0 / 32u;
    // the tile row of feature f0's gate row
    let jl0 = 32u * ((f0 % 32u) / 16u) + f0 % 16u;
    let nch = P.hidden / 16u;
    let eb = IDS[j] * (2u * n * P.hidden / 8u);
    let per = 4u * TGU_FEAT;
    let ct = t / per;
    let q = (t % per) / 2u;
    let jl = jl0 + 16u * (q / TGU_FEAT) + q % TGU_FEAT;
    let h = t % 2u;
    var acc = 0.0;
    for (var i = 0u; i < TGU_ROUNDS; i++) {
        let c = ct + (256u / per) * i;
        acc += dot8(W[tile_at(eb, b, c, jl, h, nch)], 4u * c + 2u * h);
    }
    part_a[t] = acc;
    workgroupBarrier();
    if (t < 2u * TGU_FEAT) {
        var s = 0.0;
        for (var r = 0u; r < 256u / per; r++) {
            s += part_a[r * per + 2u * t] + part_a[r * per + 2u * t + 1u];
        }
        lab_trow[t] = s;
    }
    workgroupBarrier();
    if (t < TGU_FEAT) {
        OUT[j * n + f0 + t] = gelu_tanh(lab_trow[t]) * lab_trow[t + TGU_FEAT];
    }
}

// Output rows of a dn_tiled workgroup (4, 8 or 16: a part of one block)
// and its loop's rounds: top_k * (inter / 16) pieces of TDN_ROWS rows,
// 128 / TDN_ROWS a round.
override TDN_ROWS: u32 = 8u;
override TDN_ROUNDS: u32 = 22u;

// down: workgroup g takes output rows g * TDN_ROWS.. over every slot's
// expert: OUT[r] = sum_j WTS[j] * (down_e[r, :] . ACT[j, :]).
@compute @workgroup_size(256)
fn dn_tiled(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) t: u32) {
    let g = linear_group(wg, nwg);
    let r0 = g * TDN_ROWS;
    let b = r0 / 64u;
    let jl0 = r0 % 64u;
    let nch = P.inter / 16u;
    if (t < P.top_k) {
        sid[t] = IDS[t] * (P.hidden * P.inter / 8u);
        swt[t] = WTS[t];
    }
    workgroupBarrier();
    let per = 2u * TDN_ROWS;
    let pieces = 256u / per;
    let ut = t / per;
    let rr = (t % per) / 2u;
    let h = t % 2u;
    var acc = 0.0;
    for (var i = 0u; i < TDN_ROUNDS; i++) {
        let u = ut + pieces * i;
        let j = u / nch;
        let c = u % nch;
        let w = W[tile_at(sid[j], b, c, jl0 + rr, h, nch)];
        acc += swt[j] * dot8(w, (j * P.inter + 16u * c + 8u * h) / 4u);
    }
    part_a[t] = acc;
    workgroupBarrier();
    if (t < TDN_ROWS) {
        var s = 0.0;
        for (var q = 0u; q < pieces; q++) {
            s += part_a[q * per + 2u * t] + part_a[q * per + 2u * t + 1u];
        }
        OUT[r0 + t] = s;
    }
}
