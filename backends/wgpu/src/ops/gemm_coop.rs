//! The prefill GEMM on cooperative matrices (`kernels/gemm_coop.wgsl`):
//! [`super::gemm`]'s three modes on tensor cores, where the device offers
//! them ([`crate::WgpuFeatures::tensor_core_gemm`]), the weight's
//! values all fit f16 and k is a multiple of 32. Each launch is two
//! dispatches: `gemm_prep` (x to f16 with a per-row power-of-two scale, laid
//! out by tile) and `gemm_coop`; a dense problem split over k adds
//! `gemm_ksum`.

use turbospark::ops::{Moe, OpKind};
use turbospark::{DType, Result};

use super::one;
use crate::batch::Launch;
use crate::coop_tiles::{CoopTile, NARROW_GROUPS};
use crate::gpu::Gpu;
use crate::WgpuBuffer;

/// The kernel's parameter block: [`super::gemm`]'s (the same struct in
/// both WGSL files), with one k split.
pub(crate) use super::gemm::Params;

/// k per step at two slices a step ([`CoopTile::slices`]), the most: k and
/// the split steps are whole multiples of it for every tile.
const BK: u32 = 32;
/// X16 rows per prep workgroup (a warp per row). A row per 256-thread
/// workgroup (its max by workgroup_max, one pass of loads kept in
/// registers) was slower on the H200: 15 -> 24 us a dispatch at 512 tokens
/// (2026-12-01 at f16691c, run 07), the route search and the reduction's
/// barriers repeated per row.
const PREP_ROWS: u32 = 8;

impl CoopTile {
    /// 16-wide slices of k a step (`SL`): one for the MoE phases on tiles
    /// that read x by the fragment loads (on the H200 at 512 tokens moe_down
    /// 620 -> 536 us, gate_up unchanged; the dense problems were slower,
    /// docs/decisions.md), else two.
    fn slices(self, mode: u32) -> u32 {
        if mode != DENSE_MODE && !self.stage_x {
            1
        } else {
            2
        }
    }
    /// `tiled`: the weights are an expert stack in tile order
    /// (expert_tiles.rs; the MoE modes only).
    fn constants(
        self,
        dtype: DType,
        mode: u32,
        tiled: bool,
        split: bool,
    ) -> [(&'static str, i64); 15] {
        let [wd, qbits, qgroup] = super::weight_constants(dtype);
        let wsplit = split && dtype.is_quantized();
        [
            wd,
            qbits,
            qgroup,
            ("MODE", mode as i64),
            ("TILED", tiled as i64),
            ("SPLIT", split as i64),
            ("WSPLIT", wsplit as i64),
            ("WM", self.wm as i64),
            ("WN", self.wn as i64),
            ("STAGE_X", self.stage_x as i64),
            ("WG", self.threads() as i64),
            (
                "WSN",
                ((1 + wsplit as u32) * self.bn() * Self::bkp(self.slices(mode))) as i64,
            ),
            ("XSN", self.xsn(split) as i64),
            ("CSN", (256 * self.wm * self.wn) as i64),
            ("SL", self.slices(mode) as i64),
        ]
    }
}

const DENSE_MODE: u32 = 0;
const GATE_UP: u32 = 1;
const DOWN: u32 = 2;

/// The rows of x a launch lays out in X16: a dense problem's `m`, or an MoE
/// phase's pairs by expert tile.
pub(crate) enum XRows<'a> {
    Dense(usize),
    Grouped(&'a Moe),
}

/// Whether the tensor-core GEMM takes a problem reducing over `k` with
/// weight `w`: the device has it, `w` was checked to fit f16, k is whole
/// steps, and the tiles that would run it fit the device, as does its X16.
/// Anything else stays on the f32 GEMM.
pub(crate) fn takes(
    gpu: &Gpu,
    w: &WgpuBuffer,
    k: usize,
    rows: XRows<'_>,
    precision: turbospark::Precision,
) -> bool {
    let t = gpu.coop_tiles;
    let quantized = w.dtype.is_quantized();
    if quantized && !affine_takes(gpu, precision) {
        return false;
    }
    let (tiles, x16_rows): (&[CoopTile], usize) = match rows {
        XRows::Dense(m) if quantized => (
            &[t.narrow],
            m.div_ceil(t.narrow.bm() as usize) * t.narrow.bm() as usize,
        ),
        XRows::Dense(m) => {
            let bm = t.dense.bm().max(t.narrow.bm()) as usize;
            (&[t.dense, t.narrow], m.div_ceil(bm) * bm)
        }
        XRows::Grouped(p) => (
            &[t.grouped],
            (super::gemm::grouped_tiles(p, t.grouped.bm()) * t.grouped.bm()) as usize,
        ),
    };
    // (hi and lo parts: the most, whatever the precision, so that which
    // GEMMs take the tensor cores does not depend on it)
    let x16_elems = 2 * (x16_rows * k) as u64;
    usable(gpu)
        && tiles_fit(gpu, tiles, quantized)
        && w.fits_f16
        && k.is_multiple_of(BK as usize)
        // X16 is indexed in 32 bits and bound whole.
        && x16_elems <= u32::MAX as u64
        && 2 * x16_elems <= gpu.max_binding()
}

/// Whether the tensor-core GEMMs run at all: the adapter has them and the
/// device grants every tile's workgroup (the part of [`takes`] that does
/// not depend on the op).
pub(crate) fn usable(gpu: &Gpu) -> bool {
    let t = gpu.coop_tiles;
    gpu.features.tensor_core_gemm && tiles_fit(gpu, &[t.dense, t.narrow, t.grouped], false)
}

fn tiles_fit(gpu: &Gpu, tiles: &[CoopTile], quantized: bool) -> bool {
    let l = &gpu.limits;
    tiles.iter().all(|t| {
        t.valid()
            && t.bytes_for(quantized) <= l.max_compute_workgroup_storage_size
            && t.threads() <= l.max_compute_invocations_per_workgroup
    })
}

/// Where the tensor-core GEMMs are [`usable`], whether an op of `m` rows
/// over `k` runs on them, from its kind alone (the weight's own range is
/// checked at upload, and the CPU reference checks it the same way): the
/// rule [`turbospark::ComputeBackend::gemm_rounding`] reports. It is
/// [`takes`] but for the f16 row scratch's size limit, which the rule
/// cannot see (the MoE phases' scratch depends on the expert count): a
/// scratch over the device's binding limit would send the op to the f32
/// GEMM and the rule would claim rounding the GPU did not do. The largest
/// a model submits, 4096 tokens (`MAX_PREFILL_BATCH`) at top-8 of 128
/// experts, makes 37K rows, 208 MB of halves at k = 2816: within the
/// H200's 2 GiB binding, not within WebGPU's 128 MiB floor, so a
/// tensor-core device granting only that would break the rule.
///
/// Attention has its own rule (attention_coop.rs's `rounds_inputs`); the
/// backend's `gemm_rounding` joins the two.
pub(crate) fn rounds_inputs(op: &OpKind, m: usize, k: usize) -> bool {
    let w = match op {
        OpKind::Matmul { w } | OpKind::MoeGateUp { w } | OpKind::MoeDown { w } => *w,
        _ => return false,
    };
    // (a quantized weight at `Precision::Exact` stays on the f32 GEMM,
    // `affine_takes`, which the rule cannot see: a reference rounding as
    // the rule says splits its x and w, 2^-44 of a product from f32)
    super::gemm::fits(m, k, w) && k.is_multiple_of(BK as usize)
}

/// Whether MLX affine weights take the tensor cores at `precision`
/// (kernels/gemm_coop.wgsl's header), where their values fit f16 (the
/// upload's bound, `crate::quant::fits_f16`): at `Precision::Fast`, one f16
/// each, which passed the quantized parity families on the H200
/// (2026-12-03). At `Precision::Exact` they stay on the f32 GEMM: the
/// split (`WSPLIT`) failed there with the round trip it took then (NMSE
/// 1e-8 to 4e-8 at 5-8 bits against the 1e-9 limit), and its form in f32
/// bits has not run on the device yet: it is taken only when asked
/// (`WgpuFeatures::affine_split`).
fn affine_takes(gpu: &Gpu, precision: turbospark::Precision) -> bool {
    precision == turbospark::Precision::Fast || gpu.features.affine_split
}

/// Whether the tensor-core GEMMs split x in two f16 parts
/// (`Precision::Exact`) rather than round it once: the op's own precision.
fn splits(precision: turbospark::Precision) -> bool {
    precision == turbospark::Precision::Exact
}

/// `gemm_prep`: `rows` source rows of x (`k` wide) to the tile-ordered f16
/// scratch (with `split`, the hi rows then the lo rows) and its inverse
/// scales; returns both.
fn prep(
    gpu: &Gpu,
    x: &wgpu::Buffer,
    route: &wgpu::Buffer,
    t: CoopTile,
    (mode, split): (u32, bool),
    params: &Params,
) -> Result<(WgpuBuffer, WgpuBuffer)> {
    let rows = (params.mtiles * t.bm()) as usize;
    let x16 = super::scratch_buffer(
        gpu,
        |s| &mut s.coop_x16,
        DType::F16,
        (1 + split as usize) * rows * params.k as usize,
        0,
        "tensor-core GEMM f16 rows",
    )?;
    let xs = super::scratch_buffer(
        gpu,
        |s| &mut s.coop_xs,
        DType::F32,
        rows,
        0,
        "tensor-core GEMM row scales",
    )?;
    gpu.launch(Launch {
        kernel: "gemm_prep",
        entry: "gemm_prep",
        constants: &[
            ("MODE", mode as i64),
            ("WM", t.wm as i64),
            ("SPLIT", split as i64),
        ],
        params: bytemuck::bytes_of(params),
        buffers: &[
            (x, true),
            (one(&x16), false),
            (one(&xs), false),
            (route, true),
        ],
        groups: gpu.grid(rows as u32 / PREP_ROWS),
    })?;
    Ok((x16, xs))
}

/// The GEMM proper over the prepped rows.
#[allow(clippy::too_many_arguments)]
fn launch(
    gpu: &Gpu,
    w: (&wgpu::Buffer, DType, bool),
    (x16, xs): &(WgpuBuffer, WgpuBuffer),
    out: &wgpu::Buffer,
    route: &wgpu::Buffer,
    wts: &wgpu::Buffer,
    t: CoopTile,
    (mode, split): (u32, bool),
    params: &Params,
) -> Result<()> {
    gpu.launch(Launch {
        kernel: "gemm_coop",
        entry: "gemm_coop",
        constants: &t.constants(w.1, mode, w.2, split),
        params: bytemuck::bytes_of(params),
        buffers: &[
            (w.0, true),
            (one(x16), true),
            (out, false),
            (route, true),
            (wts, true),
            (one(xs), true),
            (one(x16), true),
        ],
        groups: gpu.grid(params.ks * params.mtiles * params.nrb),
    })
}

/// Dense tensor-core problems with fewer output tiles than this split k
/// (each tile's k in `ks` whole-step parts, summed by gemm_ksum) into about
/// COOP_SPLIT_GROUPS workgroups. At 512 tokens o_proj and the dense down
/// have 176 tiles of 64 x 128, about one workgroup per compute unit of the
/// H200, each a long chain of k steps. Measured there (BENCHMARKS.md,
/// 2026-11-30 at 3038701): 3 splits took the dense down 140 -> 117 us and
/// o_proj full 537 -> 402 us; 2 or 6 splits were slower than 3, and
/// splitting the 256 or 264 tiles of q|k|v and gate|up slowed them (257 ->
/// 288, 177 -> 199 us).
const COOP_SPLIT_BELOW: u32 = 256;
const COOP_SPLIT_GROUPS: u32 = 512;
/// (The problems split take the narrow tile, whose x is read by the fragment
/// loads; a split with x staged is reached only through tile overrides.)
/// Fewest k steps a split takes.
const COOP_SPLIT_STEPS: u32 = 8;

/// `(splits, k per split)` for a dense problem of `groups` output tiles
/// over `k` (a multiple of BK) in `chunks` weight bindings (split only
/// when one: the planes are per output). Depends on the shape only, so
/// results are deterministic.
fn k_splits(k: u32, groups: u32, chunks: usize) -> (u32, u32) {
    if groups >= COOP_SPLIT_BELOW || chunks != 1 {
        return (1, k);
    }
    let want = COOP_SPLIT_GROUPS.div_ceil(groups);
    super::gemm::whole_step_splits(k, want, BK, COOP_SPLIT_STEPS)
}

/// `OUT = X W^T` (see [`super::gemm::dense`]), one launch per weight chunk
/// over one prep of x.
pub(crate) fn dense(
    gpu: &Gpu,
    w: &WgpuBuffer,
    xb: &wgpu::Buffer,
    ob: &wgpu::Buffer,
    p: turbospark::ops::Matmul,
) -> Result<()> {
    let tiles = gpu.coop_tiles;
    let split = splits(p.precision);
    // (tile rows, the prep for them)
    let mut prepped: Option<(u32, (WgpuBuffer, WgpuBuffer))> = None;
    for c in w.chunks.iter() {
        let (row0, rows) = super::chunk_rows(w, c, p.n);
        let wide =
            (p.m as u32).div_ceil(tiles.dense.bm()) * (rows as u32).div_ceil(tiles.dense.bn());
        // (a quantized weight's two W tiles leave the wide tile without
        // the workgroup memory of a 48 KB device)
        let t = if wide < NARROW_GROUPS || w.dtype.is_quantized() {
            tiles.narrow
        } else {
            tiles.dense
        };
        let mtiles = (p.m as u32).div_ceil(t.bm());
        let nrb = (rows as u32).div_ceil(t.bn());
        let (ks, kc) = k_splits(p.k as u32, mtiles * nrb, w.chunks.len());
        let params = super::gemm::dense_params(&p, (row0, rows), (mtiles, nrb), (ks, kc));
        // Split k: the partial planes go to scratch, then gemm_ksum.
        let partial = super::gemm::split_partials(gpu, ks, p.m * p.n)?;
        let out = partial.as_ref().map_or(ob, one);
        // One prep serves every chunk whose tile has as many rows.
        if prepped.as_ref().is_none_or(|(bm, _)| *bm != t.bm()) {
            prepped = Some((t.bm(), prep(gpu, xb, xb, t, (DENSE_MODE, split), &params)?));
        }
        let (_, xp) = prepped.as_ref().expect("prepped above");
        launch(
            gpu,
            (&c.buffer, w.dtype, false),
            xp,
            out,
            xb,
            xb,
            t,
            (DENSE_MODE, split),
            &params,
        )?;
        if let Some(part) = &partial {
            super::gemm::ksum(gpu, &params, one(part), ob)?;
        }
    }
    Ok(())
}

/// Parameters of a grouped launch (see [`super::gemm`]'s).
fn grouped(p: &Moe, t: CoopTile, (n, k): (usize, usize), per_block: u32) -> Params {
    let mtiles = super::gemm::grouped_tiles(p, t.bm());
    super::gemm::grouped_params(p, (n, k), mtiles, per_block)
}

/// MoE phase 1 over the route list (see [`super::gemm::gate_up`]).
pub(crate) fn gate_up(
    gpu: &Gpu,
    x: &wgpu::Buffer,
    gu: (&wgpu::Buffer, DType, bool),
    route: &wgpu::Buffer,
    act: &wgpu::Buffer,
    p: &Moe,
) -> Result<()> {
    let t = gpu.coop_tiles.grouped;
    let params = grouped(p, t, (p.inter, p.hidden), t.bn() / 2);
    let mode = (GATE_UP, splits(p.precision));
    let xp = prep(gpu, x, route, t, mode, &params)?;
    launch(gpu, gu, &xp, act, route, x, t, mode, &params)
}

/// MoE phase 2 over the route list (see [`super::gemm::down`]): the
/// per-pair rows on the tensor cores, then the same `moe_sum`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn down(
    gpu: &Gpu,
    act: &wgpu::Buffer,
    d: (&wgpu::Buffer, DType, bool),
    (route, ids): (&wgpu::Buffer, &wgpu::Buffer),
    wts: &wgpu::Buffer,
    out: &wgpu::Buffer,
    p: &Moe,
) -> Result<()> {
    let per_pair = super::gemm::pair_rows(gpu, p)?;
    let t = gpu.coop_tiles.grouped;
    let params = grouped(p, t, (p.hidden, p.inter), t.bn());
    let mode = (DOWN, splits(p.precision));
    let xp = prep(gpu, act, route, t, mode, &params)?;
    launch(gpu, d, &xp, one(&per_pair), route, wts, t, mode, &params)?;
    super::gemm::moe_sum(gpu, params, one(&per_pair), ids, out, p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coop_tiles::{CoopTiles, DENSE, DENSE_NARROW, GROUPED};
    use crate::tests::{backend, upload_f32, upload_u32};
    use crate::WgpuBackend;
    use turbospark::ComputeBackend;

    #[test]
    fn tiles_fit_the_kernel_and_a_48_kb_device() {
        for t in [DENSE, DENSE_NARROW, GROUPED] {
            assert!(t.bytes() <= 48 * 1024, "{t:?}: {} bytes", t.bytes());
            assert!(t.valid(), "{t:?}");
        }
        // x staged with 8 warps along the weight rows: 4 vec4 a row per
        // step do not divide among them.
        assert!(!CoopTile { wn: 8, ..DENSE }.valid());
        assert!(!CoopTile { wm: 3, ..GROUPED }.valid());
        assert_eq!((DENSE.bm(), DENSE.bn()), (64, 256));
        assert_eq!((GROUPED.bm(), GROUPED.bn()), (32, 64));
    }

    #[test]
    fn k_splits_take_whole_steps_and_cover_k() {
        // o_proj at 512 tokens: 176 tiles of 64 x 128 split k in 3.
        assert_eq!(k_splits(4096, 176, 1), (3, 1376));
        // enough tiles (q|k|v's 256), or a weight over several bindings:
        // no split
        assert_eq!(k_splits(2816, 256, 1), (1, 2816));
        assert_eq!(k_splits(4096, 6, 2), (1, 4096));
        // too little k for two splits of COOP_SPLIT_STEPS steps
        assert_eq!(k_splits(480, 1, 1), (1, 480));
        for (k, groups) in [(4000, 6), (2816, 1), (1024, 1), (8192, 176)] {
            let (ks, kc) = k_splits(k, groups, 1);
            assert_eq!(kc % BK, 0, "{k} {groups}");
            assert!(kc >= COOP_SPLIT_STEPS * BK);
            assert!(
                (ks - 1) * kc < k && ks * kc >= k,
                "{k} {groups}: {ks} x {kc}"
            );
        }
    }

    #[test]
    fn tile_overrides_parse_by_part() {
        let t = CoopTiles::parse(";2,4,0;", 48 * 1024, 1024).unwrap();
        assert_eq!(t.dense, DENSE);
        assert_eq!(
            t.narrow,
            CoopTile {
                wm: 2,
                wn: 4,
                stage_x: false
            }
        );
        assert_eq!(t.grouped, GROUPED);
        assert_eq!(
            CoopTiles::parse("", 48 * 1024, 1024).unwrap(),
            CoopTiles::default()
        );
        for bad in ["2,4", "2,4,2", "x", "2,4,32,0", ";;;", "2,8,1", "8,8,0"] {
            assert!(CoopTiles::parse(bad, 48 * 1024, 1024).is_err(), "{bad}");
        }
        assert!(CoopTiles::parse("4,3,0", 48 * 1024, 1024).is_ok());
        assert!(
            CoopTiles::parse("4,3,0", 48 * 1024, 256).is_err(),
            "384 threads"
        );
    }

    /// Host model of gemm_prep's row: the row at its f16 scale
    /// (`dtype::f16_row_scale`, the CPU reference's too) as f16, and
    /// 1 / scale.
    fn model_row(x: &[f32]) -> (Vec<half::f16>, f32) {
        let (s, inv) = turbospark::dtype::f16_row_scale(x);
        (x.iter().map(|v| half::f16::from_f32(v * s)).collect(), inv)
    }

    /// X16 row `r` against `want` and its scale, exactly (gemm_prep rounds
    /// to nearest even itself; only values below f16's normal range are
    /// left to the device's conversion, within one ulp).
    fn check_row(
        x16: &[half::f16],
        xs: &[f32],
        (r, k, seed): (usize, usize, u64),
        want: &(Vec<half::f16>, f32),
    ) {
        let row = &x16[r * k..(r + 1) * k];
        if want.0.iter().any(|w| w.is_nan()) {
            // WGSL leaves max() over a NaN to the device, so the row's scale
            // is not fixed; what must hold is that each NaN stays NaN (a
            // GEMM over the row is NaN whatever its scale).
            for (c, (g, w)) in row.iter().zip(&want.0).enumerate() {
                assert!(
                    !w.is_nan() || g.is_nan(),
                    "row {r} col {c}: {g} (seed {seed})"
                );
            }
            return;
        }
        assert_eq!(xs[r], want.1, "row {r}: scale (seed {seed})");
        for (c, (g, w)) in row.iter().zip(&want.0).enumerate() {
            let d = (g.to_bits() as i32 - w.to_bits() as i32).abs();
            let ulps = if w.is_normal() || *w == half::f16::ZERO {
                0
            } else {
                1
            };
            assert!(d <= ulps, "row {r} col {c}: {g} against {w} (seed {seed})");
        }
    }

    fn rows_of(be: &WgpuBackend, x16: &WgpuBuffer, xs: &WgpuBuffer) -> (Vec<half::f16>, Vec<f32>) {
        be.sync().unwrap();
        let h: Vec<half::f16> = bytemuck::pod_collect_to_vec(&be.gpu.download_bytes(x16).unwrap());
        (h, be.download_f32(xs).unwrap())
    }

    fn rows_with_range(rng: &mut turbospark::rng::Rng, m: usize, k: usize) -> Vec<f32> {
        let mut x = rng.vec_normal(m * k, 1.0);
        for (i, row) in x.chunks_mut(k).enumerate() {
            let s = 10f32.powi(i as i32 % 13 - 6);
            row.iter_mut().for_each(|v| *v *= s);
        }
        // a zero row, and a row whose largest |x| is a power of two
        x[2 * k..3 * k].iter_mut().for_each(|v| *v = 0.0);
        x[3 * k..4 * k]
            .iter_mut()
            .for_each(|v| *v = v.clamp(-0.9, 0.9));
        x[3 * k + 5] = -1024.0;
        // NaNs with a large and a small payload (the rounding's carry
        // must not reach them), and an inf
        x[4 * k + 1] = f32::from_bits(0x7fff_ffff);
        x[4 * k + 2] = f32::from_bits(0xff80_0001);
        x[5 * k + 3] = f32::INFINITY;
        x
    }

    /// `gemm_prep`'s parameters for `m` dense rows of `k` in tiles of `t`.
    fn dense_prep_params(m: usize, k: usize, t: CoopTile) -> super::super::gemm::Params {
        let moe = Moe {
            m,
            hidden: k,
            inter: 1,
            experts: 1,
            top_k: 1,
            precision: turbospark::Precision::Exact,
        };
        let mut p =
            super::super::gemm::grouped_params(&moe, (1, k), (m as u32).div_ceil(t.bm()), 1);
        p.m = m as u32;
        p
    }

    #[test]
    fn gemm_prep_scales_dense_rows_into_tiles() {
        // k under a pass of a warp's loads, then (4224 = 1056 vec4) over
        // several
        for (m, k) in [(70, 96), (7, 4224)] {
            prep_dense_rows(m, k);
        }
    }

    fn prep_dense_rows(m: usize, k: usize) {
        let Some(be) = backend() else { return };
        let seed = turbospark::parity::seed_from_env();
        let mut rng = turbospark::rng::Rng::new(seed);
        let x = rows_with_range(&mut rng, m, k);
        let xb = upload_f32(&be, &x, "x");
        let t = DENSE_NARROW;
        let p = dense_prep_params(m, k, t);
        let (x16, xs) = prep(&be.gpu, one(&xb), one(&xb), t, (DENSE_MODE, false), &p).unwrap();
        let (h, s) = rows_of(&be, &x16, &xs);
        for r in 0..m {
            check_row(&h, &s, (r, k, seed), &model_row(&x[r * k..(r + 1) * k]));
        }
        // The last tile's rows past m are zero.
        for r in m..(p.mtiles * t.bm()) as usize {
            let zero = h[r * k..(r + 1) * k].iter().all(|v| v.to_f32() == 0.0);
            assert!(zero, "row {r} past m (seed {seed})");
        }
    }

    /// With the split (`Precision::Exact`), X16's hi rows and lo rows are
    /// bit for bit the host's: hi = f16(x s), lo = f16(x s - hi), both to
    /// nearest even with f16's subnormals (the CPU reference's
    /// `split_half`), lo zero where hi is inf or NaN; the rows' scales are
    /// the single rounding's.
    #[test]
    fn gemm_prep_splits_rows_into_hi_and_lo() {
        let Some(be) = backend() else { return };
        let seed = turbospark::parity::seed_from_env();
        let mut rng = turbospark::rng::Rng::new(seed);
        let (m, k) = (70, 96);
        let x = rows_with_range(&mut rng, m, k);
        let xb = upload_f32(&be, &x, "x");
        let t = DENSE_NARROW;
        let p = dense_prep_params(m, k, t);
        let (x16, xs) = prep(&be.gpu, one(&xb), one(&xb), t, (DENSE_MODE, true), &p).unwrap();
        let (h, sc) = rows_of(&be, &x16, &xs);
        let lo_rows = (p.mtiles * t.bm()) as usize;
        assert_eq!(h.len(), 2 * lo_rows * k, "hi and lo rows (seed {seed})");
        for r in 0..m {
            let row = &x[r * k..(r + 1) * k];
            if row.iter().any(|v| v.is_nan()) {
                continue;
            }
            let (s, inv) = turbospark::dtype::f16_row_scale(row);
            assert_eq!(sc[r], inv, "row {r}: scale (seed {seed})");
            for (c, v) in row.iter().enumerate() {
                let v = v * s;
                let hi = half::f16::from_f32(v);
                let lo = if hi.is_finite() {
                    half::f16::from_f32(v - hi.to_f32())
                } else {
                    half::f16::ZERO
                };
                let (gh, gl) = (h[r * k + c], h[(lo_rows + r) * k + c]);
                assert_eq!(
                    gh.to_bits(),
                    hi.to_bits(),
                    "row {r} col {c}: hi of {v} (seed {seed})"
                );
                assert_eq!(
                    gl.to_f32(),
                    lo.to_f32(),
                    "row {r} col {c}: lo of {v}, hi {hi} (seed {seed})"
                );
            }
        }
    }

    #[test]
    fn gemm_prep_gathers_each_experts_rows_through_the_route_list() {
        let Some(be) = backend() else { return };
        let seed = turbospark::parity::seed_from_env();
        let mut rng = turbospark::rng::Rng::new(seed);
        let (m, top_k, experts, k) = (45, 3, 5, 64);
        let p = Moe {
            m,
            hidden: k,
            inter: k,
            experts,
            top_k,
            precision: turbospark::Precision::Exact,
        };
        // distinct experts per token, one expert with more pairs than a tile
        let ids: Vec<u32> = (0..m)
            .flat_map(|t| {
                let a = if t < 40 { 0 } else { 1 + rng.below(4) as u32 };
                let b = 1 + (a + 1 + rng.below(3) as u32) % 4;
                let c = (1..5).find(|e| *e != a && *e != b).unwrap_or(0);
                [a, b, c]
            })
            .collect();
        let idb = upload_u32(&be, &ids, "ids");
        let x = rows_with_range(&mut rng, m, k);
        let act = rows_with_range(&mut rng, m * top_k, k);
        let (xb, ab) = (upload_f32(&be, &x, "x"), upload_f32(&be, &act, "act"));
        let (_, route) = super::super::moe::route(&be.gpu, &idb, &p).unwrap();
        let t = GROUPED;
        let params = grouped(&p, t, (k, k), t.bn());
        for (mode, src) in [(GATE_UP, &xb), (DOWN, &ab)] {
            let (x16, xs) =
                prep(&be.gpu, one(src), one(&route), t, (mode, false), &params).unwrap();
            let (h, s) = rows_of(&be, &x16, &xs);
            let rl = be.download_u32(&route).unwrap();
            // find_tile on the host, over the route list as built
            let (ne, bm) = (experts, t.bm() as usize);
            let mut tm = 0;
            let mut seen = 0;
            for slot in 0..rl[0] as usize {
                let (cnt, start) = (rl[1 + ne + slot] as usize, rl[1 + 2 * ne + slot] as usize);
                for tile0 in (0..cnt).step_by(bm) {
                    for i in 0..bm.min(cnt - tile0) {
                        let pair = rl[1 + 3 * ne + start + tile0 + i] as usize;
                        let (v, row) = if mode == GATE_UP {
                            (&x, pair / top_k)
                        } else {
                            (&act, pair)
                        };
                        let r = tm * bm + i;
                        let want = model_row(&v[row * k..(row + 1) * k]);
                        check_row(&h, &s, (r, k, seed), &want);
                        seen += 1;
                    }
                    tm += 1;
                }
            }
            assert_eq!(
                seen,
                m * top_k,
                "mode {mode}: every pair's row (seed {seed})"
            );
        }
    }
}
