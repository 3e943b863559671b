enable f16;
enable wgpu_cooperative_matrix;

// The prefill GEMM on cooperative matrices (tensor cores): the same three
// modes and route list as kernels/gemm.wgsl (read its header first), for
// devices whose wgpu adapter offers 16x16x16 f16 x f16 -> f32 matrices.
//
// Inputs go to the matrix units as f16 with f32 accumulation:
//
//   gemm_prep     (kernels/gemm_prep.wgsl, f16 only, so it runs and is
//                 tested where cooperative matrices are absent)
//                 X16[r, :] = f16(x_r * s_r), XS[r] = 1 / s_r, a row per
//                 warp, where x_r is the source row of tile row r (the
//                 dense rows in order; grouped: the pairs of each expert
//                 tile, gathered through the route list) and s_r the power
//                 of two that puts the row's largest |x| in [2^14, 2^15): no
//                 row overflows f16 whatever its range, each element keeps
//                 11 significant bits (unless it is 2^28 below the row's
//                 largest), and the scale comes back off exactly. Rows of a
//                 tile past its count are zero.
//                 With SPLIT (turbospark::Precision::Exact) each element is
//                 two f16 parts, hi = f16(x_r s_r) and lo = f16(x_r s_r -
//                 hi), lo's rows after all of hi's: 22 significant bits.
//   gemm_coop     OUT = (X16 W16^T) * XS per row, W decoded to f16 as it is
//                 staged (exact for bf16 weights within f16's normal range;
//                 the launcher only takes weights it checked at upload not
//                 to pass 65504, and those below 2^-14 keep an absolute
//                 error under 2^-25). With SPLIT, OUT = (HI W16^T + LO
//                 W16^T) * XS, both products into the same f32
//                 accumulators: each partial product is exact in f32 (11
//                 by at most 11 bits), so the sum is x's 22 bits times W
//                 to f32 accumulation (src/parity/op.rs, SPLIT_INPUT_NMSE).
//
//   quantized     W an MLX affine weight (kernels/affine.wgsl), each value
//                 w = scale * q + bias decoded in f32 as it is staged
//                 (the CPU reference's value). w is not in general exact in
//                 one f16, so with SPLIT (WSPLIT) it is staged as two parts
//                 too, hi = f16(w) and lo = f16(w - hi) (w - hi exact in
//                 f32; both rounded to nearest even in f32 bits, stage_w8),
//                 lo's tile after hi's, and OUT = (HI W16^T + HI
//                 WLO^T + LO W16^T) * XS, three products into the same f32
//                 accumulators, each exact in f32. hi + lo is within 2^-22
//                 |w| of w, or 2^-25 absolute where lo is below f16's
//                 normal range; the product left out, LO WLO^T, is under
//                 2^-22 of a term: the sum is x's 22 bits times w's 22 to
//                 f32 accumulation, under the f32 GEMM's limit
//                 (src/parity/case/rounding.rs, AFFINE_SPLIT_NMSE).
//                 Without SPLIT (turbospark::Precision::Fast) w is one
//                 f16, x one (AFFINE_F16_NMSE).
//
// X16 is laid out by tile (tile tm's rows are tm * BM ..), so a tile's
// rows are contiguous. A step takes BK of k (SL slices of 16): the W tile
// (BN rows) is staged in workgroup memory, decoded to f16 on the way, the
// next step's loaded into registers while this one multiplies; the X16
// tile (BM rows) is either staged the same way or read by the fragment
// loads a step ahead (STAGE_X, per tile). A workgroup is WM x WN warps; each warp owns 32 tile
// rows x 64 weight rows, 2 x 4 fragments of 16 x 16. In gate_up mode a
// warp's fragments 0..3 are (gate f, up f, gate f + 16, up f + 16) for
// f = its first feature, so the activation pairs fragment 0 with 1 and 2
// with 3. Results leave through a 16 x 16 f32 staging area per warp, with
// the row's 1 / s, the down mode's routing weight and the bounds applied.
// That staging area is one fragment a warp and the row maps are BM long, so
// the tiles fit devices with little workgroup memory (on the H200 halving
// them did not change the time: docs/decisions.md).

// Params and P: kernels/gemm_tiles.wgsl.

// gemm_coop
@group(1) @binding(0) var<storage, read> W: array<vec4<u32>>;
@group(1) @binding(1) var<storage, read> X16: array<f16>;
@group(1) @binding(2) var<storage, read_write> OUT: array<f32>;
@group(1) @binding(3) var<storage, read> ROUTE: array<u32>;
@group(1) @binding(4) var<storage, read> WTS: array<f32>;
@group(1) @binding(5) var<storage, read> XS: array<f32>;
// X16 again (the same buffer), read 4 halves at a time where the tile
// stages it.
@group(1) @binding(6) var<storage, read> X16V: array<vec4<f16>>;

const DENSE: u32 = 0u;
const GATE_UP: u32 = 1u;
const DOWN: u32 = 2u;
// Which of the three.
override MODE: u32 = 0u;
// 1: the MoE modes' weights are in tile order (common.wgsl's expert_row).
override TILED: u32 = 0u;
// 1: X16 holds the split's hi rows then its lo rows (gemm_prep's SPLIT):
// every A fragment is multiplied twice, hi then lo, into one accumulator.
override SPLIT: u32 = 0u;
// 1: a quantized W staged as hi and lo parts (with SPLIT, header above):
// every A fragment of x's hi part is multiplied by both.
override WSPLIT: u32 = 0u;

// The tile (backends/wgpu/src/ops/gemm_coop.rs sets every one): warps
// along the tile rows and along the weight rows, whether X16 is staged in
// workgroup memory (1) or read by the fragment loads straight from memory,
// one step ahead (0); WG = 32 * WM * WN, WSN = BN * BKP (twice that with
// WSPLIT, lo's tile after hi's), XSN = BM * BKP (8
// when not staged; twice that with SPLIT, lo's tile after hi's), CSN =
// 256 * WM * WN.
override WM: u32 = 2u;
override WN: u32 = 4u;
override STAGE_X: u32 = 1u;
override WG: u32 = 256u;
override WSN: u32 = 10240u;
override XSN: u32 = 2560u;
override CSN: u32 = 4096u;

// 16-wide fragment slices of k a step (2, or 1 for the MoE phases' tiles
// that read x by the fragment loads: gemm_coop.rs's CoopTile::slices has
// the measurements; 64 of k a step was slower on the H200 for every tile
// tried), k per step, the staged rows' stride in f16 (8 of padding: every
// fragment starts 16-byte aligned, and rows fall on different banks), and
// a step's vec4 per row.
override SL: u32 = 2u;
override BK: u32 = 16u * SL;
override BKP: u32 = BK + 8u;
override QW: u32 = BK / 8u;
// W vec4 loads per thread per step: BN * QW / WG = 2 * QW / WM; X16 ones
// (staged, so two slices): BM * QW / WG = 4 / WN.
const MAX_LD: u32 = 8u;
const MAX_LDA: u32 = 2u;

var<workgroup> ws: array<f16, WSN>;
var<workgroup> xa: array<f16, XSN>;
var<workgroup> cs: array<f32, CSN>;
override BMX: u32 = 32u * WM;
var<workgroup> dst_row: array<u32, BMX>;
var<workgroup> xinv: array<f32, BMX>;
var<workgroup> tile: vec4<u32>;

fn bm() -> u32 {
    return 32u * WM;
}
fn bn() -> u32 {
    return 64u * WN;
}
// Where the W tile's lo parts start (WSPLIT).
fn wlo() -> u32 {
    return bn() * BKP;
}

// Word i of the weight (kernels/affine.wgsl).
fn wword(i: u32) -> u32 {
    return W[i >> 2u][i & 3u];
}

// find_tile, stage_tile: kernels/gemm_tiles.wgsl.

// The first vec4 of the weight row (within the binding) of tile row `jl`
// of row block `nb` (common.wgsl's expert_row), and whether it exists.
// gate_up: each 32 tile rows are 16 gate rows then the 16 up rows of the
// same features.
fn weight_row(mode: u32, jl: u32, nb: u32, expert: u32) -> vec2<u32> {
    let kq = P.k / 8u;
    let tiled = TILED == 1u && mode != DENSE;
    if (mode == GATE_UP) {
        let f = nb * (bn() / 2u) + 16u * (jl / 32u) + jl % 16u;
        let up = select(0u, P.rows, (jl % 32u) >= 16u);
        let eb = expert * 2u * P.rows * kq;
        return vec2<u32>(expert_row(eb, up + f, kq, tiled, true, P.rows), u32(f < P.rows));
    }
    let r = nb * bn() + jl;
    return vec2<u32>(expert_row(expert * P.rows * kq, r, kq, tiled, false, 0u), u32(r < P.rows));
}

// ---- gemm_coop ----

// W vec4 (8 weights) `q` of the k step at k0 of the weight row whose first
// vec4 is `row`; zero past k_hi (the end of k, or of this workgroup's
// split of it). A quantized weight (never tiled; `row` counts the 16-bit
// layout's vec4, so element 8 row) gives the eight values' words and their
// group's scale and bias words (affine_load8), `qo` the header's offsets.
fn load_w(on: bool, row: u32, k0: u32, q: u32, k_hi: u32, qo: vec2<u32>) -> vec4<u32> {
    let kc = k0 + 8u * q;
    if (!on || kc >= k_hi) {
        return vec4<u32>(0u);
    }
    if (QBITS != 0u) {
        return affine_load8(8u * row + kc, qo);
    }
    return W[row + expert_step(kc / 8u, TILED == 1u && MODE != DENSE)];
}

// Two weights of a word as f16, through f32: exact for f16 weights, and
// for bf16 ones within f16's range.
fn pair16(word: u32) -> vec2<f16> {
    return vec2<f16>(decode_pair(word));
}

// Load `e` of the step (`v` as load_w gave it; `el` its first element when
// quantized) to the W tile as f16.
fn stage_w(e: u32, v: vec4<u32>, el: u32) {
    let o = (e / QW) * BKP + 8u * (e % QW);
    if (QBITS != 0u) {
        let sb = affine_sb8(v, el);
        stage_w8(o, affine_pair8(v, el, sb, 0u), affine_pair8(v, el, sb, 1u),
                 affine_pair8(v, el, sb, 2u), affine_pair8(v, el, sb, 3u));
        return;
    }
    let a = pair16(v.x);
    let b = pair16(v.y);
    let c = pair16(v.z);
    let d = pair16(v.w);
    ws[o] = a.x;
    ws[o + 1u] = a.y;
    ws[o + 2u] = b.x;
    ws[o + 3u] = b.y;
    ws[o + 4u] = c.x;
    ws[o + 5u] = c.y;
    ws[o + 6u] = d.x;
    ws[o + 7u] = d.y;
}

// Eight decoded weights (pairs a..d) to the W tile at o: one f16 each, or
// with WSPLIT hi there and lo wlo() on, both rounded in f32 bits
// (kernels/f16_round.wgsl, as gemm_prep splits x), so the halves are the
// CPU reference's (`split_half`) bit for bit. Taking lo as f16(w -
// f32(f16(w))) instead, the H200 read one f16 rounding's error (NMSE 1e-8
// to 4e-8 where w is not exact in f16: 5-8 bits, f16 scales), as if a
// compiler had folded the round trip away.
fn stage_w8(o: u32, a: vec2<f32>, b: vec2<f32>, c: vec2<f32>, d: vec2<f32>) {
    if (WSPLIT == 1u) {
        let v0 = vec4<f32>(a, b);
        let v1 = vec4<f32>(c, d);
        let h0 = half_grid4(v0);
        let h1 = half_grid4(v1);
        stage_w4(o, vec4<f16>(h0), vec4<f16>(h1));
        stage_w4(o + wlo(), vec4<f16>(split_lo4(v0, h0)), vec4<f16>(split_lo4(v1, h1)));
        return;
    }
    let ha = vec2<f16>(a);
    let hb = vec2<f16>(b);
    let hc = vec2<f16>(c);
    let hd = vec2<f16>(d);
    ws[o] = ha.x;
    ws[o + 1u] = ha.y;
    ws[o + 2u] = hb.x;
    ws[o + 3u] = hb.y;
    ws[o + 4u] = hc.x;
    ws[o + 5u] = hc.y;
    ws[o + 6u] = hd.x;
    ws[o + 7u] = hd.y;
}

// Eight halves to the W tile at o.
fn stage_w4(o: u32, p: vec4<f16>, q: vec4<f16>) {
    ws[o] = p.x;
    ws[o + 1u] = p.y;
    ws[o + 2u] = p.z;
    ws[o + 3u] = p.w;
    ws[o + 4u] = q.x;
    ws[o + 5u] = q.y;
    ws[o + 6u] = q.z;
    ws[o + 7u] = q.w;
}

// X16's 8 halves `e` of the step (tile row e / QW, eighth e % QW), as
// loaded: no decode.
fn stage_x(e: u32, base: u32, lo: vec4<f16>, hi: vec4<f16>) {
    let o = base + (e / QW) * BKP + 8u * (e % QW);
    xa[o] = lo.x;
    xa[o + 1u] = lo.y;
    xa[o + 2u] = lo.z;
    xa[o + 3u] = lo.w;
    xa[o + 4u] = hi.x;
    xa[o + 5u] = hi.y;
    xa[o + 6u] = hi.z;
    xa[o + 7u] = hi.w;
}

// One fragment's results (already in cs at `cb`, row-major 16 x 16) to OUT:
// tile rows r0.., output columns c0.. (dense and down modes).
fn emit(mode: u32, cb: u32, lane: u32, r0: u32, c0: u32, cnt: u32, plane: u32) {
    for (var t = 0u; t < 8u; t++) {
        let idx = lane + 32u * t;
        let r = r0 + idx / 16u;
        let c = c0 + idx % 16u;
        if (r < cnt && c < P.rows) {
            let d = dst_row[r];
            var v = cs[cb + idx] * xinv[r];
            if (mode == DOWN) {
                v *= WTS[d];
            }
            OUT[plane + d * P.n + select(0u, P.row0, mode == DENSE) + c] = v;
        }
    }
}

// This lane's 8 values of the fragment staged at cb (elements lane + 32 t).
fn lane_values(cb: u32, lane: u32) -> array<f32, 8> {
    return array<f32, 8>(cs[cb + lane], cs[cb + lane + 32u], cs[cb + lane + 64u], cs[cb + lane + 96u],
                         cs[cb + lane + 128u], cs[cb + lane + 160u], cs[cb + lane + 192u], cs[cb + lane + 224u]);
}

// A gate fragment's values (`gate`, from lane_values) and its up fragment
// (cs at cb) to OUT as gelu(gate) * up, features f0...
fn emit_gate_up(gate: array<f32, 8>, cb: u32, lane: u32, r0: u32, f0: u32, cnt: u32) {
    let up = lane_values(cb, lane);
    for (var t = 0u; t < 8u; t++) {
        let idx = lane + 32u * t;
        let r = r0 + idx / 16u;
        let f = f0 + idx % 16u;
        if (r < cnt && f < P.rows) {
            let inv = xinv[r];
            OUT[dst_row[r] * P.n + f] = gelu_tanh(gate[t] * inv) * (up[t] * inv);
        }
    }
}

// Workgroup g's output tile. Every branch around a cooperative operation
// is on a uniform value (naga checks: an override, the parameters, a
// workgroup id, a workgroupUniformLoad), hence one entry point with the mode
// as an override and the body inline.
@compute @workgroup_size(WG)
fn gemm_coop(@builtin(workgroup_id) wgid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let mode = MODE;
    // (linear_group's arithmetic inline: naga takes a function's result as
    // non-uniform, and g decides the early returns before cooperative ops)
    let gid = wgid.x + wgid.y * nwg.x;
    let per = P.mtiles * P.nrb;
    // Past the grid (WgpuBackend::grid pads a large one to a rectangle).
    if (gid >= per * P.ks) {
        return;
    }
    // Dense problems with too few tiles to fill the GPU split k (P.ks
    // splits of P.kc, whole steps): split `ks_i` sums k_lo .. k_hi into
    // its own output plane, gemm_ksum adds the planes. Else ks = 1, kc = k.
    let ks_i = gid / per;
    let g = gid % per;
    let k_lo = ks_i * P.kc;
    let k_hi = min(P.k, k_lo + P.kc);
    let plane = ks_i * P.m * P.n;
    // Dense: the token tiles of a row block run together (its weight rows
    // stay in cache across them). Grouped (MoE): the row blocks of a token
    // tile (one expert's pairs) run together, so its X16 rows stay in L2
    // across its row blocks while the experts' weights stream past.
    var tm = g % P.mtiles;
    var nb = g / P.mtiles;
    if (mode != DENSE) {
        tm = g / P.nrb;
        nb = g % P.nrb;
    }
    stage_tile(mode, tm, lid, WG);
    let info = workgroupUniformLoad(&tile);
    let cnt = info.y;
    if (cnt == 0u) {
        return;
    }
    let b_m = bm();
    for (var i = lid; i < b_m; i += WG) {
        var d = info.z + i;
        if (mode != DENSE && i < cnt) {
            d = ROUTE[1u + 3u * P.experts + info.z + i];
        }
        dst_row[i] = d;
        xinv[i] = XS[tm * b_m + i];
    }

    let warp = lid / 32u;
    let lane = lid % 32u;
    let wm = warp / WN;
    let wn = warp % WN;
    let k = P.k;
    let nld = 2u * QW / WM;
    var w_row: array<u32, MAX_LD>;
    var w_on: array<bool, MAX_LD>;
    var wv: array<vec4<u32>, MAX_LD>;
    // A quantized weight's header, read once a thread.
    var qo = vec2<u32>(0u);
    if (QBITS != 0u) {
        qo = affine_offsets();
    }
    for (var u = 0u; u < nld; u++) {
        let e = lid + WG * u;
        let r = weight_row(mode, e / QW, nb, info.x);
        w_row[u] = r.x;
        w_on[u] = r.y == 1u;
        wv[u] = load_w(w_on[u], w_row[u], k_lo, e % QW, k_hi, qo);
    }
    // The X16 tile: tile rows tm * BM .. (staged: QW vec4 of a row a step).
    let nla = select(0u, QW / WN, STAGE_X == 1u);
    let xrow0 = tm * b_m;
    // (with SPLIT: the lo part's rows start lo_rows on, its tile's halves
    // in ylo / yhi, staged lo_st after hi's)
    let lo_rows = P.mtiles * b_m;
    let lo_v = 2u * lo_rows * (k / 8u);
    let lo_st = b_m * BKP;
    var xlo: array<vec4<f16>, MAX_LDA>;
    var xhi: array<vec4<f16>, MAX_LDA>;
    var ylo: array<vec4<f16>, MAX_LDA>;
    var yhi: array<vec4<f16>, MAX_LDA>;
    for (var u = 0u; u < nla; u++) {
        let e = lid + WG * u;
        let i = 2u * ((xrow0 + e / QW) * (k / 8u) + k_lo / 8u + e % QW);
        xlo[u] = X16V[i];
        xhi[u] = X16V[i + 1u];
        if (SPLIT == 1u) {
            ylo[u] = X16V[lo_v + i];
            yhi[u] = X16V[lo_v + i + 1u];
        }
    }
    var c00 = coop_mat16x16<f32, C>();
    var c01 = coop_mat16x16<f32, C>();
    var c02 = coop_mat16x16<f32, C>();
    var c03 = coop_mat16x16<f32, C>();
    var c10 = coop_mat16x16<f32, C>();
    var c11 = coop_mat16x16<f32, C>();
    var c12 = coop_mat16x16<f32, C>();
    var c13 = coop_mat16x16<f32, C>();
    // This warp's first staged X row (or X16 row) and staged W row.
    let xb = wm * 32u * BKP;
    let xg = (xrow0 + wm * 32u) * k;
    let wb = wn * 64u * BKP;
    let s16 = 16u;
    // Unstaged x: the A fragments of a step (slice h, rows r: ahr), loaded
    // a step ahead so the loop does not wait on memory for them.
    var a00: coop_mat16x16<f16, A>;
    var a01: coop_mat16x16<f16, A>;
    var a10: coop_mat16x16<f16, A>;
    var a11: coop_mat16x16<f16, A>;
    // (SPLIT: the lo part's fragments, the same places lo_x on)
    var l00: coop_mat16x16<f16, A>;
    var l01: coop_mat16x16<f16, A>;
    var l10: coop_mat16x16<f16, A>;
    var l11: coop_mat16x16<f16, A>;
    let lo_x = lo_rows * k;
    if (STAGE_X == 0u) {
        let i00 = xg + k_lo;
        let i01 = i00 + s16 * k;
        let i10 = i00 + s16;
        let i11 = i01 + s16;
        a00 = coopLoadT<coop_mat16x16<f16, A>>(&X16[i00], k);
        a01 = coopLoadT<coop_mat16x16<f16, A>>(&X16[i01], k);
        if (SL == 2u) {
            a10 = coopLoadT<coop_mat16x16<f16, A>>(&X16[i10], k);
            a11 = coopLoadT<coop_mat16x16<f16, A>>(&X16[i11], k);
        }
        if (SPLIT == 1u) {
            let j00 = lo_x + i00;
            let j01 = lo_x + i01;
            l00 = coopLoadT<coop_mat16x16<f16, A>>(&X16[j00], k);
            l01 = coopLoadT<coop_mat16x16<f16, A>>(&X16[j01], k);
            if (SL == 2u) {
                let j10 = lo_x + i10;
                let j11 = lo_x + i11;
                l10 = coopLoadT<coop_mat16x16<f16, A>>(&X16[j10], k);
                l11 = coopLoadT<coop_mat16x16<f16, A>>(&X16[j11], k);
            }
        }
    }
    for (var k0 = k_lo; k0 < k_hi; k0 += BK) {
        workgroupBarrier();
        for (var u = 0u; u < nld; u++) {
            let e = lid + WG * u;
            stage_w(e, wv[u], 8u * w_row[u] + k0 + 8u * (e % QW));
        }
        for (var u = 0u; u < nla; u++) {
            stage_x(lid + WG * u, 0u, xlo[u], xhi[u]);
            if (SPLIT == 1u) {
                stage_x(lid + WG * u, lo_st, ylo[u], yhi[u]);
            }
        }
        workgroupBarrier();
        // The next step's tiles, loaded while this one multiplies.
        let k1 = k0 + BK;
        for (var u = 0u; u < nld; u++) {
            wv[u] = load_w(w_on[u], w_row[u], k1, (lid + WG * u) % QW, k_hi, qo);
        }
        if (k1 < k_hi) {
            for (var u = 0u; u < nla; u++) {
                let e = lid + WG * u;
                let i = 2u * ((xrow0 + e / QW) * (k / 8u) + (k1 / 8u) + e % QW);
                xlo[u] = X16V[i];
                xhi[u] = X16V[i + 1u];
                if (SPLIT == 1u) {
                    ylo[u] = X16V[lo_v + i];
                    yhi[u] = X16V[lo_v + i + 1u];
                }
            }
        }
        var x00 = a00;
        var x01 = a01;
        var x10 = a10;
        var x11 = a11;
        var y00 = l00;
        var y01 = l01;
        var y10 = l10;
        var y11 = l11;
        if (STAGE_X == 1u) {
            let j00 = xb;
            let j01 = xb + s16 * BKP;
            let j10 = xb + s16;
            let j11 = j01 + s16;
            x00 = coopLoadT<coop_mat16x16<f16, A>>(&xa[j00], BKP);
            x01 = coopLoadT<coop_mat16x16<f16, A>>(&xa[j01], BKP);
            x10 = coopLoadT<coop_mat16x16<f16, A>>(&xa[j10], BKP);
            x11 = coopLoadT<coop_mat16x16<f16, A>>(&xa[j11], BKP);
            if (SPLIT == 1u) {
                let m00 = lo_st + j00;
                let m01 = lo_st + j01;
                let m10 = lo_st + j10;
                let m11 = lo_st + j11;
                y00 = coopLoadT<coop_mat16x16<f16, A>>(&xa[m00], BKP);
                y01 = coopLoadT<coop_mat16x16<f16, A>>(&xa[m01], BKP);
                y10 = coopLoadT<coop_mat16x16<f16, A>>(&xa[m10], BKP);
                y11 = coopLoadT<coop_mat16x16<f16, A>>(&xa[m11], BKP);
            }
        } else {
            // (the last step reloads its own fragments: k1 is past k_hi)
            let kn = min(k1, k_hi - BK);
            let i00 = xg + kn;
            let i01 = i00 + s16 * k;
            let i10 = i00 + s16;
            let i11 = i01 + s16;
            a00 = coopLoadT<coop_mat16x16<f16, A>>(&X16[i00], k);
            a01 = coopLoadT<coop_mat16x16<f16, A>>(&X16[i01], k);
            if (SL == 2u) {
                a10 = coopLoadT<coop_mat16x16<f16, A>>(&X16[i10], k);
                a11 = coopLoadT<coop_mat16x16<f16, A>>(&X16[i11], k);
            }
            if (SPLIT == 1u) {
                let j00 = lo_x + i00;
                let j01 = lo_x + i01;
                l00 = coopLoadT<coop_mat16x16<f16, A>>(&X16[j00], k);
                l01 = coopLoadT<coop_mat16x16<f16, A>>(&X16[j01], k);
                if (SL == 2u) {
                    let j10 = lo_x + i10;
                    let j11 = lo_x + i11;
                    l10 = coopLoadT<coop_mat16x16<f16, A>>(&X16[j10], k);
                    l11 = coopLoadT<coop_mat16x16<f16, A>>(&X16[j11], k);
                }
            }
        }
        // Slice 0, then (SL = 2) slice 1, 16 of k each.
        let ib0 = wb;
        let ib1 = ib0 + s16 * BKP;
        let ib2 = ib0 + 2u * s16 * BKP;
        let ib3 = ib0 + 3u * s16 * BKP;
        let b0 = coopLoad<coop_mat16x16<f16, B>>(&ws[ib0], BKP);
        let b1 = coopLoad<coop_mat16x16<f16, B>>(&ws[ib1], BKP);
        let b2 = coopLoad<coop_mat16x16<f16, B>>(&ws[ib2], BKP);
        let b3 = coopLoad<coop_mat16x16<f16, B>>(&ws[ib3], BKP);
        c00 = coopMultiplyAdd(x00, b0, c00);
        c01 = coopMultiplyAdd(x00, b1, c01);
        c02 = coopMultiplyAdd(x00, b2, c02);
        c03 = coopMultiplyAdd(x00, b3, c03);
        c10 = coopMultiplyAdd(x01, b0, c10);
        c11 = coopMultiplyAdd(x01, b1, c11);
        c12 = coopMultiplyAdd(x01, b2, c12);
        c13 = coopMultiplyAdd(x01, b3, c13);
        if (WSPLIT == 1u) {
            let jb0 = wlo() + ib0;
            let jb1 = wlo() + ib1;
            let jb2 = wlo() + ib2;
            let jb3 = wlo() + ib3;
            let e0 = coopLoad<coop_mat16x16<f16, B>>(&ws[jb0], BKP);
            let e1 = coopLoad<coop_mat16x16<f16, B>>(&ws[jb1], BKP);
            let e2 = coopLoad<coop_mat16x16<f16, B>>(&ws[jb2], BKP);
            let e3 = coopLoad<coop_mat16x16<f16, B>>(&ws[jb3], BKP);
            c00 = coopMultiplyAdd(x00, e0, c00);
            c01 = coopMultiplyAdd(x00, e1, c01);
            c02 = coopMultiplyAdd(x00, e2, c02);
            c03 = coopMultiplyAdd(x00, e3, c03);
            c10 = coopMultiplyAdd(x01, e0, c10);
            c11 = coopMultiplyAdd(x01, e1, c11);
            c12 = coopMultiplyAdd(x01, e2, c12);
            c13 = coopMultiplyAdd(x01, e3, c13);
        }
        if (SPLIT == 1u) {
            c00 = coopMultiplyAdd(y00, b0, c00);
            c01 = coopMultiplyAdd(y00, b1, c01);
            c02 = coopMultiplyAdd(y00, b2, c02);
            c03 = coopMultiplyAdd(y00, b3, c03);
            c10 = coopMultiplyAdd(y01, b0, c10);
            c11 = coopMultiplyAdd(y01, b1, c11);
            c12 = coopMultiplyAdd(y01, b2, c12);
            c13 = coopMultiplyAdd(y01, b3, c13);
        }
        if (SL == 2u) {
            let id0 = wb + s16;
            let id1 = id0 + s16 * BKP;
            let id2 = id0 + 2u * s16 * BKP;
            let id3 = id0 + 3u * s16 * BKP;
            let d0 = coopLoad<coop_mat16x16<f16, B>>(&ws[id0], BKP);
            let d1 = coopLoad<coop_mat16x16<f16, B>>(&ws[id1], BKP);
            let d2 = coopLoad<coop_mat16x16<f16, B>>(&ws[id2], BKP);
            let d3 = coopLoad<coop_mat16x16<f16, B>>(&ws[id3], BKP);
            c00 = coopMultiplyAdd(x10, d0, c00);
            c01 = coopMultiplyAdd(x10, d1, c01);
            c02 = coopMultiplyAdd(x10, d2, c02);
            c03 = coopMultiplyAdd(x10, d3, c03);
            c10 = coopMultiplyAdd(x11, d0, c10);
            c11 = coopMultiplyAdd(x11, d1, c11);
            c12 = coopMultiplyAdd(x11, d2, c12);
            c13 = coopMultiplyAdd(x11, d3, c13);
            if (WSPLIT == 1u) {
                let jd0 = wlo() + id0;
                let jd1 = wlo() + id1;
                let jd2 = wlo() + id2;
                let jd3 = wlo() + id3;
                let f0 = coopLoad<coop_mat16x16<f16, B>>(&ws[jd0], BKP);
                let f1 = coopLoad<coop_mat16x16<f16, B>>(&ws[jd1], BKP);
                let f2 = coopLoad<coop_mat16x16<f16, B>>(&ws[jd2], BKP);
                let f3 = coopLoad<coop_mat16x16<f16, B>>(&ws[jd3], BKP);
                c00 = coopMultiplyAdd(x10, f0, c00);
                c01 = coopMultiplyAdd(x10, f1, c01);
                c02 = coopMultiplyAdd(x10, f2, c02);
                c03 = coopMultiplyAdd(x10, f3, c03);
                c10 = coopMultiplyAdd(x11, f0, c10);
                c11 = coopMultiplyAdd(x11, f1, c11);
                c12 = coopMultiplyAdd(x11, f2, c12);
                c13 = coopMultiplyAdd(x11, f3, c13);
            }
            if (SPLIT == 1u) {
                c00 = coopMultiplyAdd(y10, d0, c00);
                c01 = coopMultiplyAdd(y10, d1, c01);
                c02 = coopMultiplyAdd(y10, d2, c02);
                c03 = coopMultiplyAdd(y10, d3, c03);
                c10 = coopMultiplyAdd(y11, d0, c10);
                c11 = coopMultiplyAdd(y11, d1, c11);
                c12 = coopMultiplyAdd(y11, d2, c12);
                c13 = coopMultiplyAdd(y11, d3, c13);
            }
        }
    }

    // Out through this warp's staging area, a fragment at a time (gate_up:
    // the gate's values to registers, then its up fragment's).
    // (every pointer's index a `let` of its own: naga's SPIR-V writer needs
    // the index emitted before a cooperative load or store takes it)
    let cb = warp * 256u;
    let r0 = wm * 32u;
    if (mode == GATE_UP) {
        let f0 = nb * (bn() / 2u) + wn * 32u;
        workgroupBarrier();
        coopStoreT(c00, &cs[cb], s16);
        workgroupBarrier();
        let g0 = lane_values(cb, lane);
        workgroupBarrier();
        coopStoreT(c01, &cs[cb], s16);
        workgroupBarrier();
        emit_gate_up(g0, cb, lane, r0, f0, cnt);
        workgroupBarrier();
        coopStoreT(c02, &cs[cb], s16);
        workgroupBarrier();
        let g1 = lane_values(cb, lane);
        workgroupBarrier();
        coopStoreT(c03, &cs[cb], s16);
        workgroupBarrier();
        emit_gate_up(g1, cb, lane, r0, f0 + 16u, cnt);
        workgroupBarrier();
        coopStoreT(c10, &cs[cb], s16);
        workgroupBarrier();
        let g2 = lane_values(cb, lane);
        workgroupBarrier();
        coopStoreT(c11, &cs[cb], s16);
        workgroupBarrier();
        emit_gate_up(g2, cb, lane, r0 + 16u, f0, cnt);
        workgroupBarrier();
        coopStoreT(c12, &cs[cb], s16);
        workgroupBarrier();
        let g3 = lane_values(cb, lane);
        workgroupBarrier();
        coopStoreT(c13, &cs[cb], s16);
        workgroupBarrier();
        emit_gate_up(g3, cb, lane, r0 + 16u, f0 + 16u, cnt);
        return;
    }
    let c0 = nb * bn() + wn * 64u;
    workgroupBarrier();
    coopStoreT(c00, &cs[cb], s16);
    workgroupBarrier();
    emit(mode, cb, lane, r0, c0, cnt, plane);
    workgroupBarrier();
    coopStoreT(c01, &cs[cb], s16);
    workgroupBarrier();
    emit(mode, cb, lane, r0, c0 + 16u, cnt, plane);
    workgroupBarrier();
    coopStoreT(c02, &cs[cb], s16);
    workgroupBarrier();
    emit(mode, cb, lane, r0, c0 + 32u, cnt, plane);
    workgroupBarrier();
    coopStoreT(c03, &cs[cb], s16);
    workgroupBarrier();
    emit(mode, cb, lane, r0, c0 + 48u, cnt, plane);
    workgroupBarrier();
    coopStoreT(c10, &cs[cb], s16);
    workgroupBarrier();
    emit(mode, cb, lane, r0 + 16u, c0, cnt, plane);
    workgroupBarrier();
    coopStoreT(c11, &cs[cb], s16);
    workgroupBarrier();
    emit(mode, cb, lane, r0 + 16u, c0 + 16u, cnt, plane);
    workgroupBarrier();
    coopStoreT(c12, &cs[cb], s16);
    workgroupBarrier();
    emit(mode, cb, lane, r0 + 16u, c0 + 32u, cnt, plane);
    workgroupBarrier();
    coopStoreT(c13, &cs[cb], s16);
    workgroupBarrier();
    emit(mode, cb, lane, r0 + 16u, c0 + 48u, cnt, plane);
}
