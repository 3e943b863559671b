// Tiled GEMM for prefill batches (more than 16 rows of x) with 16-bit or
// MLX affine (kernels/affine.wgsl) weights and k a multiple of 8. Three
// entry points over one body (its `mode`), all with the same bindings:
//
//   gemm          OUT[i, row0 + r] = W[r, :] . X[i, :]      (a matmul chunk)
//   gemm_gate_up  OUT[p, f] = gelu_tanh(gate_e[f] . x_t) * (up_e[f] . x_t)
//                 for every routed pair p = t * top_k + j with e = IDS[p]
//   gemm_down     OUT[p, r] = WTS[p] * (down_e[r] . X[p, :])   (per pair;
//                 moe_sum then adds each token's top_k rows in order)
//
// Dense problems with few output tiles (the router's 128 rows at a 512-token
// batch; any narrow projection at a small batch) split k over
// P.ks workgroups per tile: split s writes its partial sums to plane s of
// OUT (scratch), and gemm_ksum adds the planes in order.
//
// Grouped modes read the ROUTE list moe_route (kernels/moe.wgsl) built: the
// pairs grouped by expert, so one tile of BM pairs shares one expert's
// weights. Workgroup (token tile, row block): token tiles run fastest, so the
// tiles that read one weight block run side by side and share it in cache.
//
// A workgroup of 256 threads computes a BM x BN output tile (BM token rows,
// BN weight rows), stepping over k BK at a time: the X tile (f32) and the
// decoded W tile go to workgroup memory, then each thread accumulates TM
// consecutive token rows (TM a multiple of 4: vec4 reads) x TN4 groups of 4
// weight rows in registers. Within a 32-lane warp the lanes form 4 token
// groups x 8 weight-row groups, so every workgroup-memory read of a warp is
// a few broadcasts or one contiguous 128-byte line. The next step's X and W
// are loaded into registers while this step computes. Every weight element
// is read once per token tile; accumulation is f32. In gate_up mode a group
// of 4 tile rows is (gate f, gate f + 1, up f, up f + 1), so the activation
// is computed from registers. ROUTE/WTS are bound in every mode (the dense
// launcher binds x in their place) so all entry points share one layout.

// Params and P: kernels/gemm_tiles.wgsl.
@group(1) @binding(0) var<storage, read> W: array<vec4<u32>>;
@group(1) @binding(1) var<storage, read> X: array<vec4<f32>>;
@group(1) @binding(2) var<storage, read_write> OUT: array<f32>;
@group(1) @binding(3) var<storage, read> ROUTE: array<u32>;
@group(1) @binding(4) var<storage, read> WTS: array<f32>;

const DENSE: u32 = 0u;
const GATE_UP: u32 = 1u;
const DOWN: u32 = 2u;
// 1: the MoE modes' weights are in tile order (common.wgsl's expert_row).
override TILED: u32 = 0u;

// Whether `mode` reads its weights in tile order (a dense weight never is).
fn w_tiled(mode: u32) -> bool {
    return TILED == 1u && mode != DENSE;
}
// Token rows per thread, weight-row groups (of 4) per thread, warps along
// the weight rows, k per step (8, 16 or 32), and the workgroup arrays' sizes
// in vec4 (XS4 = BM * BK / 4, WS4 = BN * BK / 4: the launcher sizes them
// for the tile and checks the device's workgroup memory holds them, and
// that BM <= MAX_BM and a step is at most two loads of each per thread).
override TM: u32 = 4u;
override TN4: u32 = 2u;
override WN: u32 = 2u;
override BK: u32 = 16u;

override XS4: u32 = 256u;
override WS4: u32 = 512u;

const WG: u32 = 256u;
const MAX_TM: u32 = 8u;
const MAX_TN4: u32 = 4u;
const MAX_BM: u32 = 128u;

var<workgroup> xs: array<vec4<f32>, XS4>;
var<workgroup> ws: array<vec4<f32>, WS4>;
// Row of X each tile row reads, row of OUT it writes.
var<workgroup> src_row: array<u32, MAX_BM>;
var<workgroup> dst_row: array<u32, MAX_BM>;
// (expert, rows in this tile, first pair-list index or row, unused)
var<workgroup> tile: vec4<u32>;

// Threads along the weight rows and along the tokens; the tile's size.
fn wgn() -> u32 {
    return 8u * WN;
}
fn wgt() -> u32 {
    return WG / wgn();
}
fn bm() -> u32 {
    return TM * wgt();
}
fn bn() -> u32 {
    return 4u * TN4 * wgn();
}

// find_tile, stage_tile: kernels/gemm_tiles.wgsl.

// Word i of the weight (kernels/affine.wgsl).
fn wword(i: u32) -> u32 {
    return W[i >> 2u][i & 3u];
}

// The first vec4 of the weight row (within the binding) of tile row `jl`
// of row block `nb` (common.wgsl's expert_row), and whether it exists.
fn weight_row(mode: u32, jl: u32, nb: u32, expert: u32) -> vec2<u32> {
    let kq = P.k / 8u;
    let tiled = w_tiled(mode);
    if (mode == GATE_UP) {
        let f = nb * (bn() / 2u) + 2u * (jl / 4u) + (jl % 2u);
        let up = select(0u, P.rows, (jl % 4u) >= 2u);
        let eb = expert * 2u * P.rows * kq;
        return vec2<u32>(expert_row(eb, up + f, kq, tiled, true, P.rows), u32(f < P.rows));
    }
    let r = nb * bn() + jl;
    return vec2<u32>(expert_row(expert * P.rows * kq, r, kq, tiled, false, 0u), u32(r < P.rows));
}

@compute @workgroup_size(256)
fn gemm(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    gemm_tile(DENSE, linear_group(wg, nwg), lid);
}

@compute @workgroup_size(256)
fn gemm_gate_up(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    gemm_tile(GATE_UP, linear_group(wg, nwg), lid);
}

@compute @workgroup_size(256)
fn gemm_down(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    gemm_tile(DOWN, linear_group(wg, nwg), lid);
}

// X entry (row, quarter q of the step's k) at step k0; zero from `ke` (the
// split's end) or off.
fn load_x(on: bool, row: u32, k0: u32, q: u32, ke: u32) -> vec4<f32> {
    let kc = k0 + 4u * q;
    if (!on || kc >= ke) {
        return vec4<f32>(0.0);
    }
    return X[(row * P.k + kc) / 4u];
}

// W entry (eighth q of the step's k) at step k0 of the weight row whose
// first vec4 is `row` (tiled: in tile order). A quantized weight (never
// tiled; `row` counts the 16-bit layout's vec4, so element 8 row) gives
// its eight values' words and their group's scale and bias words
// (affine_load8): the loads go out a step ahead, as a 16-bit weight's
// do, and decode where the tile is stored. `qo`: the header's offsets.
fn load_w(on: bool, row: u32, k0: u32, q: u32, ke: u32, tiled: bool, qo: vec2<u32>) -> vec4<u32> {
    let kc = k0 + 8u * q;
    if (!on || kc >= ke) {
        return vec4<u32>(0u);
    }
    if (QBITS != 0u) {
        return affine_load8(8u * row + kc, qo);
    }
    return W[row + expert_step(kc / 8u, tiled)];
}

// Workgroup `g`'s output tile (`mode` is a constant at every call).
fn gemm_tile(mode: u32, g: u32, lid: u32) {
    let per = P.mtiles * P.nrb;
    // Past the grid (WgpuBackend::grid pads a large one to a rectangle).
    if (g >= P.ks * per) {
        return;
    }
    let split = g / per;
    let tiled = w_tiled(mode);
    // Token tiles fastest for dense problems (a row block's weight rows
    // stay in cache across them), row blocks fastest for the MoE phases (a
    // token tile's x rows stay in cache across its expert's row blocks), as
    // kernels/gemm_coop.wgsl.
    var tm = (g % per) % P.mtiles;
    var nb = (g % per) / P.mtiles;
    if (mode != DENSE) {
        tm = (g % per) / P.nrb;
        nb = (g % per) % P.nrb;
    }
    let kb = split * P.kc;
    let ke = min(kb + P.kc, P.k);
    stage_tile(mode, tm, lid, 256u);
    let info = workgroupUniformLoad(&tile);
    let cnt = info.y;
    if (cnt == 0u) {
        return;
    }
    let b_m = bm();
    let b_n4 = bn() / 4u;
    for (var i = lid; i < cnt; i += WG) {
        var s = info.z + i;
        var d = s;
        if (mode != DENSE) {
            d = ROUTE[1u + 3u * P.experts + s];
            s = select(d, d / P.top_k, mode == GATE_UP);
        }
        src_row[i] = s;
        dst_row[i] = d;
    }
    workgroupBarrier();

    let lane = lid % 32u;
    let warp = lid / 32u;
    let tn = lane % 8u + 8u * (warp % WN);
    let tt = lane / 8u + 4u * (warp / WN);
    // The launcher's tile check makes each step at most two X vec4 and two
    // W vec4 per thread: thread lid loads entries lid and lid + 256.
    let xq = BK / 4u;
    let wq = BK / 8u;
    let xn = b_m * xq;
    let wn = 4u * b_n4 * wq;
    var xe: array<vec2<u32>, 2>;
    var x_row: array<u32, 2>;
    var x_on: array<bool, 2>;
    var we: array<vec2<u32>, 2>;
    var w_row: array<vec2<u32>, 2>;
    var xv4: array<vec4<f32>, 2>;
    var wv4: array<vec4<u32>, 2>;
    // A quantized weight's header, read once a thread.
    var qo = vec2<u32>(0u);
    if (QBITS != 0u) {
        qo = affine_offsets();
    }
    for (var u = 0u; u < 2u; u++) {
        let e = lid + WG * u;
        xe[u] = vec2<u32>(e / xq, e % xq);
        x_on[u] = e < xn && xe[u].x < cnt;
        x_row[u] = src_row[min(xe[u].x, cnt - 1u)];
        we[u] = vec2<u32>(e / wq, e % wq);
        w_row[u] = weight_row(mode, we[u].x, nb, info.x);
        w_row[u].y = select(0u, w_row[u].y, e < wn);
        // The first step's tile.
        xv4[u] = load_x(x_on[u], x_row[u], kb, xe[u].y, ke);
        wv4[u] = load_w(w_row[u].y == 1u, w_row[u].x, kb, we[u].y, ke, tiled, qo);
    }
    var acc: array<vec4<f32>, MAX_TM * MAX_TN4>;
    let b_m4 = b_m / 4u;
    for (var k0 = kb; k0 < ke; k0 += BK) {
        workgroupBarrier();
        for (var u = 0u; u < 2u; u++) {
            if (lid + WG * u < xn) {
                // xs[kk][token] as vec4s of 4 tokens (b_m is a multiple of 4).
                let o = xe[u].y * b_m + xe[u].x / 4u;
                let cc = xe[u].x % 4u;
                xs[o][cc] = xv4[u].x;
                xs[o + b_m4][cc] = xv4[u].y;
                xs[o + 2u * b_m4][cc] = xv4[u].z;
                xs[o + 3u * b_m4][cc] = xv4[u].w;
            }
            if (lid + WG * u < wn) {
                var a: vec2<f32>;
                var b: vec2<f32>;
                var c: vec2<f32>;
                var d: vec2<f32>;
                if (QBITS == 0u) {
                    a = decode_pair(wv4[u].x);
                    b = decode_pair(wv4[u].y);
                    c = decode_pair(wv4[u].z);
                    d = decode_pair(wv4[u].w);
                } else {
                    // The eight values at k0 + 8q (zero words where off).
                    let e = 8u * w_row[u].x + k0 + 8u * we[u].y;
                    let sb = affine_sb8(wv4[u], e);
                    a = affine_pair8(wv4[u], e, sb, 0u);
                    b = affine_pair8(wv4[u], e, sb, 1u);
                    c = affine_pair8(wv4[u], e, sb, 2u);
                    d = affine_pair8(wv4[u], e, sb, 3u);
                }
                let o = 8u * we[u].y * b_n4 + we[u].x / 4u;
                let cc = we[u].x % 4u;
                ws[o][cc] = a.x;
                ws[o + b_n4][cc] = a.y;
                ws[o + 2u * b_n4][cc] = b.x;
                ws[o + 3u * b_n4][cc] = b.y;
                ws[o + 4u * b_n4][cc] = c.x;
                ws[o + 5u * b_n4][cc] = c.y;
                ws[o + 6u * b_n4][cc] = d.x;
                ws[o + 7u * b_n4][cc] = d.y;
            }
        }
        workgroupBarrier();
        // The next step's tile, loaded into registers while this one computes.
        for (var u = 0u; u < 2u; u++) {
            xv4[u] = load_x(x_on[u], x_row[u], k0 + BK, xe[u].y, ke);
            wv4[u] = load_w(w_row[u].y == 1u, w_row[u].x, k0 + BK, we[u].y, ke, tiled, qo);
        }
        for (var kk = 0u; kk < BK; kk++) {
            // This thread's TM tokens are tt * TM .. + TM: TM / 4 vec4 reads.
            var xv: array<vec4<f32>, 2>;
            for (var i4 = 0u; i4 < TM / 4u; i4++) {
                xv[i4] = xs[kk * b_m4 + tt * (TM / 4u) + i4];
            }
            for (var j = 0u; j < TN4; j++) {
                let wv = ws[kk * b_n4 + tn + wgn() * j];
                for (var i = 0u; i < TM; i++) {
                    let x = xv[i / 4u][i % 4u];
                    acc[j * MAX_TM + i] = fma(wv, vec4<f32>(x), acc[j * MAX_TM + i]);
                }
            }
        }
    }

    for (var j = 0u; j < TN4; j++) {
        let grp = tn + wgn() * j;
        for (var i = 0u; i < TM; i++) {
            let li = tt * TM + i;
            if (li >= cnt) {
                continue;
            }
            let a = acc[j * MAX_TM + i];
            // (a split's partials go to plane `split` of OUT)
            let d = dst_row[li] + split * P.m;
            if (mode == GATE_UP) {
                let f = nb * (2u * b_n4) + 2u * grp;
                if (f < P.rows) {
                    OUT[d * P.n + f] = gelu_tanh(a.x) * a.z;
                }
                if (f + 1u < P.rows) {
                    OUT[d * P.n + f + 1u] = gelu_tanh(a.y) * a.w;
                }
                continue;
            }
            var scale = 1.0;
            if (mode == DOWN) {
                scale = WTS[d];
            }
            let r0 = nb * 4u * b_n4 + 4u * grp;
            let col0 = select(0u, P.row0, mode == DENSE);
            for (var c = 0u; c < 4u; c++) {
                if (r0 + c < P.rows) {
                    OUT[d * P.n + col0 + r0 + c] = scale * a[c];
                }
            }
        }
    }
}

// Element `e` of X read as floats (the sum kernels below take any size).
fn x_at(e: u32) -> f32 {
    return X[e / 4u][e % 4u];
}

// OUT[i] = sum_s X[s * m * n + i] (the split-k planes, in order), one
// thread per element.
@compute @workgroup_size(256)
fn gemm_ksum(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let idx = linear_group(wg, nwg) * WG + lid;
    let plane = P.m * P.n;
    if (idx >= plane) {
        return;
    }
    var s = 0.0;
    for (var k = 0u; k < P.ks; k++) {
        s += x_at(k * plane + idx);
    }
    OUT[idx] = s;
}

// OUT[t, c] = sum_j X[t * top_k + j, c] (X: the down mode's per-pair rows),
// in order of j, one thread per element. ROUTE is bound to the expert ids
// here: a pair whose id is past the experts was left out of the route list
// (its row never written) and adds nothing, as in the route-list kernels.
@compute @workgroup_size(256)
fn moe_sum(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
    let idx = linear_group(wg, nwg) * WG + lid;
    let h = P.n;
    if (idx >= P.m * h) {
        return;
    }
    let t = idx / h;
    let c = idx % h;
    var s = 0.0;
    for (var j = 0u; j < P.top_k; j++) {
        let p = t * P.top_k + j;
        if (ROUTE[p] < P.experts) {
            s += x_at(p * h + c);
        }
    }
    OUT[idx] = s;
}
