// Decode GEMV design variants for examples/kernel_lab.rs (not used by the
// backend): OUT[r] = W[r, :] . X with bf16 weights (vec4<u32> = 8 weights)
// and f32 X. Each variant is one entry point; the lab
// times them side by side at real Gemma 4 shapes. Kept: the ones
// docs/decisions.md cites (empty: the per-dispatch cost; kc: a constant
// trip count, which the backend's gemv takes for short weights as its GBK)
// and u4 (more loads in flight), their baseline. Variants measured slower
// and dropped (X staged in workgroup memory, four rows per lane group,
// 64-thread groups, a subgroup lane sum, a row norm inside the GEMV) are in
// the H200 lab outputs in docs/bench/ (435a108, 93ea97b, f16691c).

// Compiled after kernels/gemv.wgsl (as the backend composes it), whose
// Params (k = P.k, rows = P.rows), bindings W / X / OUT, `part` and dot8 it
// reuses.

// Lanes per weight row of every variant here.
const LANES: u32 = 32u;

// Blocks per row as a pipeline constant (variant kc): the loop trip count
// is known when the driver compiles, so it can unroll and hoist the loads.
override BK: u32 = 352u;

fn reduce32(t: u32, lane: u32, v: f32) -> f32 {
    part[t] = v;
    workgroupBarrier();
    for (var s = LANES / 2u; s > 0u; s >>= 1u) {
        if (lane < s) {
            part[t] += part[t + s];
        }
        workgroupBarrier();
    }
    return part[t];
}

// Row r's lane sums into OUT[r] (every thread calls it: reduce32's
// barriers).
fn finish_row(t: u32, lane: u32, r: u32, acc: f32) {
    let s = reduce32(t, lane, acc);
    if (lane == 0u && r < P.rows) {
        OUT[r] = s;
    }
}

@compute @workgroup_size(256)
fn empty(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    if (wg.x == 0u && t == 0u) {
        OUT[0] = 1.0;
    }
}

// `empty` again under another name: a second pipeline, for the cost of
// switching pipelines between dependent dispatches (the `dispatch` case).
@compute @workgroup_size(256)
fn empty_b(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    if (wg.x == 0u && t == 0u) {
        OUT[1] = 2.0;
    }
}

// kernels/gemv.wgsl's loop as of 435a108, 2026-11-29 (the backend's own
// kernel is timed beside the variants as `real gemv`).
@compute @workgroup_size(256)
fn base(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let lane = t % LANES;
    let r = wg.x * 8u + t / LANES;
    let blocks = P.k / 8u;
    var acc = 0.0;
    if (r < P.rows) {
        let base = r * blocks;
        var acc2 = 0.0;
        var i = lane;
        for (; i + LANES < blocks; i += 2u * LANES) {
            let w0 = W[base + i];
            let w1 = W[base + i + LANES];
            acc += dot8(w0, i);
            acc2 += dot8(w1, i + LANES);
        }
        if (i < blocks) {
            acc += dot8(W[base + i], i);
        }
        acc += acc2;
    }
    finish_row(t, lane, r, acc);
}

// Four loads in flight per thread, X from global memory, shared-memory reduce.
@compute @workgroup_size(256)
fn u4(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let lane = t % LANES;
    let r = wg.x * 8u + t / LANES;
    let blocks = P.k / 8u;
    var a0 = 0.0;
    var a1 = 0.0;
    var a2 = 0.0;
    var a3 = 0.0;
    if (r < P.rows) {
        let base = r * blocks;
        var i = lane;
        for (; i + 3u * LANES < blocks; i += 4u * LANES) {
            let w0 = W[base + i];
            let w1 = W[base + i + LANES];
            let w2 = W[base + i + 2u * LANES];
            let w3 = W[base + i + 3u * LANES];
            a0 += dot8(w0, i);
            a1 += dot8(w1, i + LANES);
            a2 += dot8(w2, i + 2u * LANES);
            a3 += dot8(w3, i + 3u * LANES);
        }
        for (; i < blocks; i += LANES) {
            a0 += dot8(W[base + i], i);
        }
    }
    finish_row(t, lane, r, (a0 + a1) + (a2 + a3));
}

// Blocks per row as a constant: a fixed trip count the driver can unroll.
@compute @workgroup_size(256)
fn kc(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let lane = t % LANES;
    let r = wg.x * 8u + t / LANES;
    var a0 = 0.0;
    var a1 = 0.0;
    if (r < P.rows) {
        let base = r * BK;
        for (var j = 0u; j < BK / (2u * LANES); j++) {
            let i = lane + j * 2u * LANES;
            let w0 = W[base + i];
            let w1 = W[base + i + LANES];
            a0 += dot8(w0, i);
            a1 += dot8(w1, i + LANES);
        }
        let i = lane + (BK / (2u * LANES)) * 2u * LANES;
        if (i < BK) {
            a0 += dot8(W[base + i], i);
        }
        if (i + LANES < BK) {
            a1 += dot8(W[base + i + LANES], i + LANES);
        }
    }
    let s = subgroupAdd(a0 + a1);
    if (lane == 0u && r < P.rows) {
        OUT[r] = s;
    }
}

// ---- w_pattern: does the MoE GEMM's weight access pattern cost bandwidth?
//
// The tensor-core MoE GEMM's tile (kernels/gemm_coop.wgsl, GROUPED: one
// warp, 64 weight rows, 16 of k a step) reads 32 bytes of each of 64 rows
// a step, rows 5.6 KB apart. This kernel reads exactly those bytes with
// nothing else to do: a 32-thread workgroup per block of 64 rows, PV vec4
// (8 weights each) of every row a step, either from the row-major weights
// (TILED 0) or from a copy laid out so that each step's 64 x PV vec4 are
// contiguous (TILED 1). Each lane XORs what it reads; OUT gets the lane's
// XOR folded to 16 bits (exact as f32), so the host checks that both
// layouts read every word of the block once.
override PV: u32 = 2u;
override TILED: u32 = 0u;

@compute @workgroup_size(32)
fn w_pattern(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let kq = P.k / 8u;
    let rb = wg.x;
    let steps = kq / PV;
    var acc = vec4<u32>(0u);
    for (var s = 0u; s < steps; s++) {
        // The step's 64 x PV vec4, two lanes a row's 32 bytes at PV = 2.
        for (var u = 0u; u < 2u * PV; u++) {
            let e = t + 32u * u;
            var idx = ((rb * steps + s) * 64u) * PV + e;
            if (TILED == 0u) {
                idx = (rb * 64u + e / PV) * kq + s * PV + e % PV;
            }
            acc ^= W[idx];
        }
    }
    let v = acc.x ^ acc.y ^ acc.z ^ acc.w;
    OUT[rb * 32u + t] = f32((v ^ (v >> 16u)) & 0xffffu);
}
