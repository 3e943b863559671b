//! The prefill GEMM (`kernels/gemm.wgsl`): matmul, the router's logits and
//! the MoE phases from [`super::PREFILL_MIN_M`] rows of x, with 16-bit
//! weights and a reduced dimension that is a multiple of 8. Below that the
//! streaming kernels take them.

use bytemuck::{Pod, Zeroable};
use turbospark::ops::{Matmul, Moe};
use turbospark::{DType, Result};

use super::one;
use crate::batch::Launch;
use crate::gemm_tiles::{Tile, WG};
use crate::gpu::Gpu;
use crate::WgpuBuffer;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub(crate) struct Params {
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub rows: u32,
    pub row0: u32,
    pub experts: u32,
    pub top_k: u32,
    pub mtiles: u32,
    pub kc: u32,
    pub nrb: u32,
    pub ks: u32,
    pub _pad: u32,
}

impl Tile {
    /// `tiled`: the weights are an expert stack in tile order
    /// (expert_tiles.rs; the MoE modes only).
    fn constants(self, dtype: DType, tiled: bool) -> [(&'static str, i64); 10] {
        let (x, w) = self.arrays();
        let [wd, qbits, qgroup] = super::weight_constants(dtype);
        [
            wd,
            qbits,
            qgroup,
            ("TILED", tiled as i64),
            ("TM", self.tm as i64),
            ("TN4", self.tn4 as i64),
            ("WN", self.wn as i64),
            ("BK", self.bk as i64),
            ("XS4", x as i64),
            ("WS4", w as i64),
        ]
    }
}

/// Dense projections: 64 tokens x 128 weight rows per tile, 16 of k per
/// step (13.3 KB of workgroup memory: within WebGPU's 16 KB baseline).
pub(crate) const DENSE: Tile = Tile {
    tm: 4,
    tn4: 2,
    wn: 2,
    bk: 16,
};
/// Dense projections with few output rows for the batch (fewer than
/// [`NARROW_GROUPS`] workgroups of [`DENSE`]: o_proj, the dense down
/// projection and the router at 2816 or fewer rows): 64 x 64 tiles, twice
/// the workgroups. On the H200 at 512 tokens: o_proj (full) 979 -> 918 us,
/// dense down 257 -> 241 us, router 214 -> 165 us; the tall projections
/// lose with it (q|k|v 678 -> 834 us).
pub(crate) const DENSE_NARROW: Tile = Tile {
    tm: 4,
    tn4: 1,
    wn: 2,
    bk: 16,
};
/// Below this many workgroups of [`DENSE`] a problem takes [`DENSE_NARROW`]
/// (about two per compute unit of a large GPU).
const NARROW_GROUPS: u32 = 256;

/// MoE phases: an expert sees m * top_k / experts tokens (32 of a 512-token
/// batch of Gemma 4), so 32 tokens x 256 weight rows per tile, 16 of k per
/// step where the device has the workgroup memory (20.5 KB; on the H200
/// 5-6% faster than 8 per step), else [`GROUPED_SMALL`].
pub(crate) const GROUPED: Tile = Tile {
    tm: 4,
    tn4: 2,
    wn: 4,
    bk: 16,
};
/// [`GROUPED`] within WebGPU's 16 KB baseline: 8 of k per step.
pub(crate) const GROUPED_SMALL: Tile = Tile { bk: 8, ..GROUPED };

/// A matmul of at most 16 rows of x (`WgpuOptions::gemm_from_m`): one
/// 16-row tile of 256 weight rows, every warp along the weight rows, so
/// each weight element is read and decoded once for all the rows; 16 of k
/// a step where the device's workgroup memory holds it (19.5 KB), else 8.
pub(crate) const SMALL_M: Tile = Tile {
    tm: 4,
    tn4: 1,
    wn: 8,
    bk: 16,
};

/// The dense tile for an `m`-token batch over `rows` weight rows: [`DENSE`],
/// or [`DENSE_NARROW`] where DENSE would make few workgroups, or
/// [`SMALL_M`] for a small batch.
fn dense_tile(gpu: &Gpu, m: usize, rows: usize) -> Tile {
    if let Some(t) = gpu.gemm_tiles.0 {
        return t;
    }
    if m <= super::STREAM_MAX_M {
        return if SMALL_M.fits(smem(gpu)) {
            SMALL_M
        } else {
            Tile { bk: 8, ..SMALL_M }
        };
    }
    let groups = (m as u32).div_ceil(DENSE.bm()) * (rows as u32).div_ceil(DENSE.bn());
    if groups < NARROW_GROUPS {
        DENSE_NARROW
    } else {
        DENSE
    }
}

/// The MoE tile: [`GROUPED`] where the device's workgroup memory holds it,
/// else [`GROUPED_SMALL`].
fn grouped_tile(gpu: &Gpu) -> Tile {
    let default = if GROUPED.fits(smem(gpu)) {
        GROUPED
    } else {
        GROUPED_SMALL
    };
    gpu.gemm_tiles.1.unwrap_or(default)
}

/// The device's workgroup memory per workgroup.
fn smem(gpu: &Gpu) -> u32 {
    gpu.limits.max_compute_workgroup_storage_size
}

/// Whether an `m`-row problem reducing over `k` takes the GEMM.
pub(crate) fn fits(m: usize, k: usize, dtype: DType) -> bool {
    m >= super::PREFILL_MIN_M && takes_weight(k, dtype)
}

/// Whether a matmul of 2 ..= 16 rows takes the GEMM's [`SMALL_M`] tile
/// (from `gpu.gemm_from_m` rows) rather than the streaming GEMVs.
pub(crate) fn takes_small(gpu: &Gpu, m: usize, k: usize, dtype: DType) -> bool {
    (gpu.gemm_from_m..=super::STREAM_MAX_M).contains(&m) && takes_weight(k, dtype)
}

/// Whether the kernel reads a weight of `dtype` reducing over `k`.
fn takes_weight(k: usize, dtype: DType) -> bool {
    k.is_multiple_of(8) && matches!(dtype, DType::BF16 | DType::F16 | DType::Affine(_))
}

/// `OUT = X W^T` per weight binding (a weight split across bindings is one
/// dispatch per chunk, each writing its chunk's output columns) on the f32
/// units; the tensor-core twin (gemm_coop.rs's `dense`) is the caller's
/// choice.
pub(crate) fn dense(
    gpu: &Gpu,
    w: &WgpuBuffer,
    xb: &wgpu::Buffer,
    ob: &wgpu::Buffer,
    p: Matmul,
) -> Result<()> {
    for c in w.chunks.iter() {
        let (row0, rows) = super::chunk_rows(w, c, p.n);
        let t = dense_tile(gpu, p.m, rows);
        let mtiles = (p.m as u32).div_ceil(t.bm());
        let nrb = (rows as u32).div_ceil(t.bn());
        let (ks, kc) = k_splits(&p, mtiles * nrb, t.bk, w.chunks.len());
        let params = dense_params(&p, (row0, rows), (mtiles, nrb), (ks, kc));
        // Split k: the partial planes go to scratch, then gemm_ksum.
        let partial = split_partials(gpu, ks, p.m * p.n)?;
        let out = partial.as_ref().map_or(ob, one);
        gpu.launch(Launch {
            kernel: "gemm",
            entry: "gemm",
            constants: &t.constants(w.dtype, false),
            params: bytemuck::bytes_of(&params),
            // ROUTE and WTS are not read in dense mode: x stands in.
            buffers: &[
                (&c.buffer, true),
                (xb, true),
                (out, false),
                (xb, true),
                (xb, true),
            ],
            groups: gpu.grid(ks * mtiles * nrb),
        })?;
        if let Some(part) = &partial {
            ksum(gpu, &params, one(part), ob)?;
        }
    }
    Ok(())
}

/// The scratch for `ks` partial planes of `plane` floats each (a split-k
/// dense GEMM of either family), or `None` without a split.
pub(crate) fn split_partials(gpu: &Gpu, ks: u32, plane: usize) -> Result<Option<WgpuBuffer>> {
    if ks <= 1 {
        return Ok(None);
    }
    let part = super::scratch_buffer(
        gpu,
        |s| &mut s.gemm_partial,
        DType::F32,
        ks as usize * plane,
        0,
        "gemm split-k partials",
    )?;
    Ok(Some(part))
}

/// `OUT = sum of the params.ks partial planes` in `part` (`gemm_ksum`): the
/// second half of a split-k dense GEMM, for this family and the tensor-core
/// one.
pub(crate) fn ksum(
    gpu: &Gpu,
    params: &Params,
    part: &wgpu::Buffer,
    ob: &wgpu::Buffer,
) -> Result<()> {
    gpu.launch(Launch {
        kernel: "gemm",
        entry: "gemm_ksum",
        constants: &[],
        params: bytemuck::bytes_of(params),
        // gemm_ksum reads the planes as X; the weight slot is not read.
        buffers: &[(part, true), (part, true), (ob, false)],
        groups: gpu.grid((params.m * params.n).div_ceil(WG)),
    })
}

/// Split k over workgroups for a dense problem of `groups` output tiles:
/// `(splits, k per split)`. Only where the tiles alone are fewer than
/// [`NARROW_GROUPS`] (the router's 128 rows: 16 tiles at 512 tokens), each
/// split keeps at least 4 steps of `bk`, and the output is one binding. The
/// split count depends on the shape only, so results are deterministic.
fn k_splits(p: &Matmul, groups: u32, bk: u32, chunks: usize) -> (u32, u32) {
    let k = p.k as u32;
    if groups >= NARROW_GROUPS || chunks != 1 {
        return (1, k);
    }
    whole_step_splits(k, NARROW_GROUPS / groups, bk, 4)
}

/// `(splits, k per split)` for up to `want` splits of `k` in whole steps of
/// `bk`, each at least `min_steps` steps (one split, `(1, k)`, when that
/// leaves fewer than two): the arithmetic both dense GEMM families' split
/// rules share.
pub(crate) fn whole_step_splits(k: u32, want: u32, bk: u32, min_steps: u32) -> (u32, u32) {
    let want = want.min(k / (min_steps * bk));
    if want <= 1 {
        return (1, k);
    }
    let kc = k.div_ceil(want).div_ceil(bk) * bk;
    (k.div_ceil(kc), kc)
}

/// Parameters of a dense launch of `p` over the weight rows `row0 ..
/// row0 + rows` (one binding's chunk), in `mtiles` x `nrb` tiles, k split
/// `(ks, kc)`.
pub(crate) fn dense_params(
    p: &Matmul,
    (row0, rows): (usize, usize),
    (mtiles, nrb): (u32, u32),
    (ks, kc): (u32, u32),
) -> Params {
    Params {
        m: p.m as u32,
        n: p.n as u32,
        k: p.k as u32,
        rows: rows as u32,
        row0: row0 as u32,
        experts: 1,
        top_k: 1,
        mtiles,
        kc,
        nrb,
        ks,
        _pad: 0,
    }
}

/// Parameters of a grouped launch writing `n` features per row from `k`
/// (gate_up: inter from hidden; down: hidden from inter), `per_block`
/// features per row block, no k split.
pub(crate) fn grouped_params(
    p: &Moe,
    (n, k): (usize, usize),
    mtiles: u32,
    per_block: u32,
) -> Params {
    Params {
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
    }
}

/// Token tiles a grouped launch dispatches: every expert slot in use cuts
/// its pairs into tiles of `bm`, at most one of them partial.
pub(crate) fn grouped_tiles(p: &Moe, bm: u32) -> u32 {
    let pairs = (p.m * p.top_k) as u32;
    pairs.div_ceil(bm) + pairs.min(p.experts as u32)
}

/// Phase 1 over the route list `route` (built by `moe_route`):
/// `act[p] = gelu(gate_e x_t) * (up_e x_t)` on the f32 units (the
/// tensor-core twin: gemm_coop.rs's `gate_up`).
pub(crate) fn gate_up(
    gpu: &Gpu,
    x: &wgpu::Buffer,
    gu: (&wgpu::Buffer, DType, bool),
    route: &wgpu::Buffer,
    act: &wgpu::Buffer,
    p: &Moe,
) -> Result<()> {
    let t = grouped_tile(gpu);
    let mtiles = grouped_tiles(p, t.bm());
    let rows_per_block = t.bn() / 2;
    let params = grouped_params(p, (p.inter, p.hidden), mtiles, rows_per_block);
    gpu.launch(Launch {
        kernel: "gemm",
        entry: "gemm_gate_up",
        constants: &t.constants(gu.1, gu.2),
        params: bytemuck::bytes_of(&params),
        // phase 1 has no routing weights: x stands in, never read
        buffers: &[
            (gu.0, true),
            (x, true),
            (act, false),
            (route, true),
            (x, true),
        ],
        groups: gpu.grid(mtiles * params.nrb),
    })
}

/// Phase 2 over the route list: each pair's weighted down projection into
/// scratch on the f32 units, then each token's `top_k` rows summed in order
/// ([`moe_sum`]; the tensor-core twin: gemm_coop.rs's `down`).
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
    let per_pair = pair_rows(gpu, p)?;
    let t = grouped_tile(gpu);
    let mtiles = grouped_tiles(p, t.bm());
    let params = grouped_params(p, (p.hidden, p.inter), mtiles, t.bn());
    gpu.launch(Launch {
        kernel: "gemm",
        entry: "gemm_down",
        constants: &t.constants(d.1, d.2),
        params: bytemuck::bytes_of(&params),
        buffers: &[
            (d.0, true),
            (act, true),
            (one(&per_pair), false),
            (route, true),
            (wts, true),
        ],
        groups: gpu.grid(mtiles * params.nrb),
    })?;
    moe_sum(gpu, params, one(&per_pair), ids, out, p)
}

/// The scratch of per-pair rows phase 2 writes before [`moe_sum`].
pub(crate) fn pair_rows(gpu: &Gpu, p: &Moe) -> Result<WgpuBuffer> {
    super::scratch_buffer(
        gpu,
        |s| &mut s.moe_pairs,
        DType::F32,
        p.m * p.top_k * p.hidden,
        0,
        "moe per-pair rows",
    )
}

/// Each token's `top_k` per-pair rows (`per_pair`, as phase 2 wrote them
/// with `params`) summed in order into `out`.
pub(crate) fn moe_sum(
    gpu: &Gpu,
    mut params: Params,
    per_pair: &wgpu::Buffer,
    ids: &wgpu::Buffer,
    out: &wgpu::Buffer,
    p: &Moe,
) -> Result<()> {
    params.mtiles = 0;
    gpu.launch(Launch {
        kernel: "gemm",
        entry: "moe_sum",
        constants: &[],
        params: bytemuck::bytes_of(&params),
        // moe_sum reads the per-pair rows as X and the expert ids as ROUTE;
        // the weight slot is not read.
        buffers: &[
            (per_pair, true),
            (per_pair, true),
            (out, false),
            (ids, true),
        ],
        groups: gpu.grid(((p.m * p.hidden) as u32).div_ceil(WG)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm_tiles::Overrides;

    #[test]
    fn default_tiles_fit_the_kernel() {
        // WebGPU's baseline workgroup memory: the defaults run everywhere.
        for t in [DENSE, DENSE_NARROW, GROUPED_SMALL] {
            assert!(t.fits(16384), "{t:?}");
        }
        assert!(GROUPED.fits(32768), "{} bytes", GROUPED.bytes());
        assert_eq!((DENSE.bm(), DENSE.bn()), (64, 128));
        assert_eq!((GROUPED.bm(), GROUPED.bn()), (32, 256));
        let big = Tile { bk: 32, ..DENSE };
        assert!(!big.fits(16384) && big.fits(32768), "{} bytes", big.bytes());
        assert!(!Tile { bk: 32, ..GROUPED }.fits(1 << 20), "four W loads");
        assert!(
            !Tile { tm: 2, ..DENSE }.fits(16384),
            "token rows read as vec4"
        );
    }

    #[test]
    fn tile_overrides_parse_by_half() {
        let smem = 32768;
        let Overrides(d, g) = Overrides::parse("4,1,2,16", smem).unwrap();
        assert_eq!((d, g), (Some(DENSE_NARROW), None), "empty half");
        let Overrides(d, g) = Overrides::parse(" ; 4,2,4,8 ", smem).unwrap();
        assert_eq!((d, g), (None, Some(GROUPED_SMALL)));
        let e = Overrides::parse("4,2,x,16;", smem).unwrap_err().to_string();
        assert!(e.contains("\"4,2,x,16\" is not tm,tn4,wn,bk"), "{e}");
        let e = Overrides::parse("4,2,2,32", 16384).unwrap_err().to_string();
        assert!(e.contains("device's 16384 bytes"), "{e}");
        let e = Overrides::parse(";4,2,4,16", 16384)
            .unwrap_err()
            .to_string();
        assert!(e.contains("grouped GEMM tile"), "{e}");
    }

    #[test]
    fn k_splits_cover_k_in_whole_steps() {
        let mm = |m, n, k| Matmul {
            m,
            n,
            k,
            precision: turbospark::Precision::Exact,
        };
        // The router at 512 tokens: 16 tiles of 64 x 64.
        let (ks, kc) = k_splits(&mm(512, 128, 2816), 16, 16, 1);
        assert!(ks > 1 && kc % 16 == 0 && (ks - 1) * kc < 2816 && ks * kc >= 2816);
        assert_eq!(k_splits(&mm(512, 2816, 8192), 352, 16, 1), (1, 8192));
        assert_eq!(k_splits(&mm(512, 128, 2816), 16, 16, 2), (1, 2816));
        assert_eq!(k_splits(&mm(40, 64, 64), 1, 16, 1), (1, 64), "too little k");
    }
}

#[cfg(test)]
mod layout_tests {
    use super::*;
    use crate::ops::layout::{check, fields};

    /// The parameter blocks as the kernels read them (ops::layout).
    #[test]
    fn params_match_wgsl() {
        check(
            ("gemm", "Params"),
            std::mem::size_of::<Params>(),
            fields!(Params; m, n, k, rows, row0, experts, top_k, mtiles, kc, nrb, ks, _pad),
            &[],
        );
    }
}
