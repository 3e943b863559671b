enable f16;

// The tensor-core GEMM's input (kernels/gemm_coop.wgsl's header says what
// it computes and why): x to f16 by tile with a per-row power-of-two scale.
// Its own family because it needs only f16: it runs, and is tested against
// a host model of it, on devices without cooperative matrices (lavapipe).

// (as vec4: the launcher takes only k a multiple of 32, so every row
// starts on a 16-byte boundary)
@group(1) @binding(0) var<storage, read> PX: array<vec4<f32>>;
@group(1) @binding(1) var<storage, read_write> PX16: array<vec4<f16>>;
@group(1) @binding(2) var<storage, read_write> PXS: array<f32>;
@group(1) @binding(3) var<storage, read> ROUTE: array<u32>;

const DENSE: u32 = 0u;
const GATE_UP: u32 = 1u;
const DOWN: u32 = 2u;
// The GEMM's mode and its tile's warps along the rows (BM = 32 * WM).
override MODE: u32 = 0u;
override WM: u32 = 2u;
// 1: x split in two f16 parts (turbospark::Precision::Exact): hi =
// f16(x s) in X16's first half, lo = f16(x s - hi) in its second (rows
// mtiles * BM on), both on f16's grid with its subnormals (half_grid);
// 0: hi alone, rounded once (nearest_half, as before the split).
override SPLIT: u32 = 0u;
const PREP_WG: u32 = 256u;

var<workgroup> tile: vec4<u32>;
var<workgroup> red: array<f32, PREP_WG>;

fn bm() -> u32 {
    return 32u * WM;
}

// find_tile, stage_tile, Params and P: kernels/gemm_tiles.wgsl.

// nearest_half, nearest_half4, row_exponent, pow2: kernels/f16_round.wgsl.

// Vec4 of a row per lane per pass: the loads of a pass are issued together,
// so a warp waits on memory k / (4 * 32 * XV) times a row, not once per
// element.
const XV: u32 = 4u;

// Eight X16 rows per workgroup, a warp per row (all eight in one tile: BM
// is a multiple of 8), so the route list is searched once per eight rows.
@compute @workgroup_size(256)
fn gemm_prep(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let mode = MODE;
    let b_m = bm();
    let r0 = linear_group(wg, nwg) * 8u;
    if (r0 >= P.mtiles * b_m) {
        return;
    }
    let warp = lid / 32u;
    let lane = lid % 32u;
    let r = r0 + warp;
    let tm = r / b_m;
    let i = r % b_m;
    stage_tile(mode, tm, lid, 256u);
    let info = workgroupUniformLoad(&tile);
    // A tile past the route list's (cnt 0) is never read: gemm_coop skips
    // it before touching X16 (half the grouped rows are such padding).
    if (info.y == 0u) {
        return;
    }
    let on = i < info.y;
    var src = info.z + i;
    if (on && mode != DENSE) {
        let p = ROUTE[1u + 3u * P.experts + info.z + i];
        src = select(p, p / P.top_k, mode == GATE_UP);
    }
    let k4 = P.k / 4u;
    let xb = src * k4;
    var mx = 0.0;
    if (on) {
        for (var c0 = lane; c0 < k4; c0 += 32u * XV) {
            // (past the row: its last vec4 again, harmless to a max)
            var a: array<vec4<f32>, XV>;
            for (var u = 0u; u < XV; u++) {
                a[u] = abs(PX[xb + min(c0 + 32u * u, k4 - 1u)]);
            }
            for (var u = 0u; u < XV; u++) {
                mx = max(mx, max(max(a[u].x, a[u].y), max(a[u].z, a[u].w)));
            }
        }
    }
    // The warp's largest |x| (a tree over its 32 slots; every warp takes
    // every step, so the barriers are uniform).
    red[lid] = mx;
    for (var s = 16u; s > 0u; s >>= 1u) {
        workgroupBarrier();
        if (lane < s) {
            red[lid] = max(red[lid], red[lid + s]);
        }
    }
    workgroupBarrier();
    let amax = red[warp * 32u];
    // amax in [2^e, 2^(e + 1)): scale by 2^(14 - e). e >= -112 keeps both
    // powers of two normal f32; an inf or NaN row gives e = 128 and stays
    // inf or NaN, as in f32.
    let e = row_exponent(amax);
    let sc = pow2(14 - e);
    for (var c0 = lane; c0 < k4; c0 += 32u * XV) {
        var a: array<vec4<f32>, XV>;
        for (var u = 0u; u < XV; u++) {
            a[u] = vec4<f32>(0.0);
            if (on) {
                a[u] = PX[xb + min(c0 + 32u * u, k4 - 1u)];
            }
        }
        for (var u = 0u; u < XV; u++) {
            let c = c0 + 32u * u;
            if (c < k4) {
                let v = a[u] * sc;
                if (SPLIT == 1u) {
                    let hi = half_grid4(v);
                    PX16[r * k4 + c] = vec4<f16>(hi);
                    PX16[(P.mtiles * b_m + r) * k4 + c] = vec4<f16>(split_lo4(v, hi));
                } else {
                    PX16[r * k4 + c] = vec4<f16>(nearest_half4(v));
                }
            }
        }
    }
    if (lane == 0u) {
        PXS[r] = pow2(e - 14);
    }
}
