//! The prefill GEMM on cooperative matrices (`kernels/gemm_coop.wgsl`):
//! [`super::gemm`]'s three modes on tensor cores, where the device offers
//! them ([`turbospark::backend::Features::tensor_core_gemm`]), the weight's
//! values all fit f16 and k is a multiple of 32. Each launch is two
//! dispatches: `gemm_prep` (x to f16 with a per-row power-of-two scale, laid
//! out by tile) and `gemm_coop`.

use turbospark::ops::Moe;
use turbospark::{DType, Error, Result};

use super::one;
use crate::batch::Launch;
use crate::{WgpuBackend, WgpuBuffer};

/// The kernel's parameter block: [`super::gemm`]'s (the same struct in
/// both WGSL files), with one k split.
pub(crate) use super::gemm::Params;

/// Warps along the tile rows (32 each) and along the weight rows (64 each).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct CoopTile {
    pub wm: u32,
    pub wn: u32,
}

/// The staged W row's stride in f16 (`BKP`) and the k per step (`BK`).
const BKP: u32 = 40;
const BK: usize = 32;
/// Threads of the prep kernel (one workgroup per X16 row).
const PREP_WG: u32 = 256;

impl CoopTile {
    pub fn bm(self) -> u32 {
        32 * self.wm
    }
    pub fn bn(self) -> u32 {
        64 * self.wn
    }
    fn threads(self) -> u32 {
        32 * self.wm * self.wn
    }
    /// Workgroup memory: the staged W tile (f16), a 512-float staging area
    /// per warp, the row maps, the tile record and the prep's reduction.
    pub fn bytes(self) -> u32 {
        2 * self.bn() * BKP + 4 * 512 * self.wm * self.wn + 8 * 128 + 16 + 4 * PREP_WG
    }
    fn constants(self, dtype: DType, mode: u32) -> [(&'static str, i64); 6] {
        [
            super::wdtype(dtype)[0],
            ("MODE", mode as i64),
            ("WM", self.wm as i64),
            ("WN", self.wn as i64),
            ("WG", self.threads() as i64),
            ("WSN", (self.bn() * BKP) as i64),
        ]
    }
    fn all_constants(self, dtype: DType, mode: u32) -> Vec<(&'static str, i64)> {
        let mut c = self.constants(dtype, mode).to_vec();
        c.push(("CSN", (512 * self.wm * self.wn) as i64));
        c
    }
}

/// Dense projections: 64 tokens x 256 weight rows, 8 warps.
pub(crate) const DENSE: CoopTile = CoopTile { wm: 2, wn: 4 };
/// Dense projections with fewer than [`NARROW_GROUPS`] tiles of [`DENSE`]:
/// 64 x 128, 4 warps.
pub(crate) const DENSE_NARROW: CoopTile = CoopTile { wm: 2, wn: 2 };
/// MoE phases (an expert sees 32 of a 512-token batch's pairs on average):
/// 32 pairs x 256 weight rows, 4 warps.
pub(crate) const GROUPED: CoopTile = CoopTile { wm: 1, wn: 4 };
const NARROW_GROUPS: u32 = 256;

const DENSE_MODE: u32 = 0;
const GATE_UP: u32 = 1;
const DOWN: u32 = 2;

/// Whether the tensor-core GEMM takes a problem reducing over `k` with
/// weight `w`: the device has it, `w` was checked to fit f16, k is whole
/// steps, and every tile fits the device's workgroup memory.
pub(crate) fn takes(be: &WgpuBackend, w: &WgpuBuffer, k: usize) -> bool {
    be.info.features.tensor_core_gemm
        && w.fits_f16
        && k.is_multiple_of(BK)
        && [DENSE, DENSE_NARROW, GROUPED]
            .iter()
            .all(|t| t.bytes() <= be.limits.max_compute_workgroup_storage_size)
}

/// `gemm_prep`: `rows` source rows of x (`k` wide) to the tile-ordered f16
/// scratch and its inverse scales; returns both.
fn prep(
    be: &WgpuBackend,
    x: &wgpu::Buffer,
    route: &wgpu::Buffer,
    t: CoopTile,
    mode: u32,
    params: &Params,
) -> Result<(WgpuBuffer, WgpuBuffer)> {
    let rows = (params.mtiles * t.bm()) as usize;
    let x16 = super::scratch_buffer(
        be,
        |s| &mut s.coop_x16,
        DType::F16,
        rows * params.k as usize,
        0,
        "tensor-core GEMM f16 rows",
    )?;
    let xs = super::scratch_buffer(
        be,
        |s| &mut s.coop_xs,
        DType::F32,
        rows,
        0,
        "tensor-core GEMM row scales",
    )?;
    be.launch(Launch {
        kernel: "gemm_coop",
        entry: "gemm_prep",
        constants: &[("MODE", mode as i64), ("WM", t.wm as i64)],
        params: bytemuck::bytes_of(params),
        buffers: &[
            (x, true),
            (one(&x16), false),
            (one(&xs), false),
            (route, true),
        ],
        groups: be.grid(rows as u32),
    })?;
    Ok((x16, xs))
}

/// The GEMM proper over the prepped rows.
#[allow(clippy::too_many_arguments)]
fn launch(
    be: &WgpuBackend,
    w: (&wgpu::Buffer, DType),
    (x16, xs): &(WgpuBuffer, WgpuBuffer),
    out: &wgpu::Buffer,
    route: &wgpu::Buffer,
    wts: &wgpu::Buffer,
    t: CoopTile,
    mode: u32,
    params: &Params,
) -> Result<()> {
    be.launch(Launch {
        kernel: "gemm_coop",
        entry: "gemm_coop",
        constants: &t.all_constants(w.1, mode),
        params: bytemuck::bytes_of(params),
        buffers: &[
            (w.0, true),
            (one(x16), true),
            (out, false),
            (route, true),
            (wts, true),
            (one(xs), true),
        ],
        groups: be.grid(params.mtiles * params.nrb),
    })
}

/// `OUT = X W^T` (see [`super::gemm::dense`]), one launch per weight chunk
/// over one prep of x.
pub(crate) fn dense(
    be: &WgpuBackend,
    w: &WgpuBuffer,
    xb: &wgpu::Buffer,
    ob: &wgpu::Buffer,
    p: turbospark::ops::Matmul,
) -> Result<()> {
    let mut prepped = None;
    for c in w.chunks.iter() {
        let (row0, rows) = super::chunk_rows(w, c, p.n);
        let mtiles = (p.m as u32).div_ceil(DENSE.bm());
        let t = if mtiles * (rows as u32).div_ceil(DENSE.bn()) < NARROW_GROUPS {
            DENSE_NARROW
        } else {
            DENSE
        };
        let params = Params {
            m: p.m as u32,
            n: p.n as u32,
            k: p.k as u32,
            rows: rows as u32,
            row0: row0 as u32,
            experts: 1,
            top_k: 1,
            mtiles,
            kc: p.k as u32,
            nrb: (rows as u32).div_ceil(t.bn()),
            ks: 1,
            _pad: 0,
        };
        // Both tiles are 64 rows tall, so one prep serves every chunk.
        if prepped.is_none() {
            prepped = Some(prep(be, xb, xb, t, DENSE_MODE, &params)?);
        }
        let xp = prepped.as_ref().expect("prepped above");
        launch(
            be,
            (&c.buffer, w.dtype),
            xp,
            ob,
            xb,
            xb,
            t,
            DENSE_MODE,
            &params,
        )?;
    }
    Ok(())
}

/// Parameters of a grouped launch (see [`super::gemm`]'s).
fn grouped(p: &Moe, (n, k): (usize, usize), per_block: u32) -> Result<Params> {
    let pairs = (p.m * p.top_k) as u32;
    let mtiles = pairs.div_ceil(GROUPED.bm()) + pairs.min(p.experts as u32);
    if (mtiles * GROUPED.bm()) as usize * k > u32::MAX as usize {
        return Err(Error::shape(
            "moe (tensor cores)",
            format!("{pairs} pairs of {k} overflow the kernel's 32-bit indices"),
        ));
    }
    Ok(Params {
        m: p.m as u32,
        n: n as u32,
        k: k as u32,
        rows: n as u32,
        row0: 0,
        experts: p.experts as u32,
        top_k: p.top_k as u32,
        mtiles,
        kc: k as u32,
        nrb: (n as u32).div_ceil(per_block),
        ks: 1,
        _pad: 0,
    })
}

/// MoE phase 1 over the route list (see [`super::gemm::gate_up`]).
pub(crate) fn gate_up(
    be: &WgpuBackend,
    x: &wgpu::Buffer,
    gu: (&wgpu::Buffer, DType),
    route: &wgpu::Buffer,
    act: &wgpu::Buffer,
    p: &Moe,
) -> Result<()> {
    let params = grouped(p, (p.inter, p.hidden), GROUPED.bn() / 2)?;
    let xp = prep(be, x, route, GROUPED, GATE_UP, &params)?;
    launch(be, gu, &xp, act, route, x, GROUPED, GATE_UP, &params)
}

/// MoE phase 2's per-pair rows over the route list into `per_pair` (see
/// [`super::gemm::down`], which sums them).
pub(crate) fn down(
    be: &WgpuBackend,
    act: &wgpu::Buffer,
    d: (&wgpu::Buffer, DType),
    route: &wgpu::Buffer,
    wts: &wgpu::Buffer,
    per_pair: &wgpu::Buffer,
    p: &Moe,
) -> Result<Params> {
    let params = grouped(p, (p.hidden, p.inter), GROUPED.bn())?;
    let xp = prep(be, act, route, GROUPED, DOWN, &params)?;
    launch(be, d, &xp, per_pair, route, wts, GROUPED, DOWN, &params)?;
    Ok(params)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_fit_a_48_kb_device() {
        for t in [DENSE, DENSE_NARROW, GROUPED] {
            assert!(t.bytes() <= 48 * 1024, "{t:?}: {} bytes", t.bytes());
            // A step's W tile is BN rows x 4 vec4, at most 8 per thread.
            assert!(t.bn() * 4 <= 8 * t.threads(), "{t:?}");
        }
        assert_eq!((DENSE.bm(), DENSE.bn()), (64, 256));
        assert_eq!((GROUPED.bm(), GROUPED.bn()), (32, 256));
    }
}
