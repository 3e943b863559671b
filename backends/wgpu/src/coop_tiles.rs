//! The tensor-core GEMM's tile shapes (`kernels/gemm_coop.wgsl`) and their
//! overrides (`WgpuOptions::coop_tiles`): a leaf, so the device context that
//! holds the tiles in use (`crate::gpu`) needs nothing of the launchers
//! (`crate::ops::gemm_coop`) that read them.

use turbospark::{Error, Result};

/// Warps along the tile rows (32 each) and along the weight rows (64
/// each), and whether x's tile is staged in workgroup memory (else the
/// fragment loads read it from memory, a step ahead). k is 32 a step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct CoopTile {
    pub wm: u32,
    pub wn: u32,
    pub stage_x: bool,
}

impl CoopTile {
    pub fn bm(self) -> u32 {
        32 * self.wm
    }
    pub fn bn(self) -> u32 {
        64 * self.wn
    }
    pub fn threads(self) -> u32 {
        32 * self.wm * self.wn
    }
    /// The staged X tile in f16 (`XSN`; 8 when x is not staged), twice
    /// over with `split` (its hi and lo parts).
    pub(crate) fn xsn(self, split: bool) -> u32 {
        if self.stage_x {
            // (x is staged only at two slices a step)
            (1 + split as u32) * self.bm() * Self::bkp(2)
        } else {
            8
        }
    }
    /// The staged rows' stride in f16 for `slices` (`BKP`: 16 per slice
    /// and 8 of padding).
    pub(crate) fn bkp(slices: u32) -> u32 {
        16 * slices + 8
    }
    /// Workgroup memory at two slices a step and split inputs (the most of
    /// any mode and precision, so that whether a tile fits does not depend
    /// on the precision): the staged W and X tiles (f16), a 256-float
    /// staging area per warp, the row maps (BM each), the route slots' tile
    /// counts and the tile record.
    pub fn bytes(self) -> u32 {
        self.bytes_for(false)
    }
    /// [`Self::bytes`] for a weight that is `quantized` (its W tile twice
    /// over at `Precision::Exact`, hi and lo parts: `WSPLIT`).
    pub fn bytes_for(self, quantized: bool) -> u32 {
        2 * ((1 + quantized as u32) * self.bn() * Self::bkp(2) + self.xsn(true))
            + 4 * 256 * self.wm * self.wn
            + 8 * self.bm()
            + 4 * 256
            + 16
    }
    /// Whether the kernel takes the tile: its loads per thread divide
    /// evenly within the kernel's register arrays (`MAX_LD`: 8 / WM W vec4
    /// at two slices a step, 4 / WM at one; `MAX_LDA`: 4 / WN X16 vec4
    /// when staged).
    pub(crate) fn valid(self) -> bool {
        self.bm() <= 128
            && matches!(self.wm, 1 | 2 | 4 | 8)
            && (1..=8).contains(&self.wn)
            && (!self.stage_x || matches!(self.wn, 2 | 4))
    }
}

/// Dense projections: 64 tokens x 256 weight rows, 8 warps, x staged (on
/// the H200 at 512 tokens q|k|v sliding 378 -> 292 us against fragment
/// loads from memory, runs 2 and 4; 255 us with both slices unrolled, run
/// 12).
pub(crate) const DENSE: CoopTile = CoopTile {
    wm: 2,
    wn: 4,
    stage_x: true,
};
/// Dense projections with fewer than [`NARROW_GROUPS`] tiles of [`DENSE`]:
/// 64 x 128, 4 warps, x read by the fragment loads. On the H200 at 512
/// tokens (dense gate|up, dense down, o_proj full): 174 / 140 / 529 us,
/// against 246 / 120 / 460 with [`DENSE`]'s tile, 190 / 144 / 558 for
/// 128 x 128 with x staged, 319 / 238 / 911 for this tile with x staged,
/// 224 / 173 / 645 and 376 / 204 / 760 for 64 of k a step at 64 x 128 and
/// 32 x 256 (runs 4-7).
pub(crate) const DENSE_NARROW: CoopTile = CoopTile {
    wm: 2,
    wn: 2,
    stage_x: false,
};
/// MoE phases (an expert sees 32 of a 512-token batch's pairs on average):
/// 32 pairs x 64 weight rows, 1 warp, x read by the fragment loads, 16 of k
/// a step ([`CoopTile::slices`]). On the H200 at 512 tokens (gate_up /
/// down, 2026-12-01 at fbd7c5d, run 05): 869 / 519 us, against
/// 1.01 ms / 523 us for 32 x 128 (2 warps) at 16 of k and 1.00 ms / 620 us
/// for 32 x 128 at 32 of k, the tile before. Earlier sweeps at 32 and 64
/// of k (at 986ba22 and fbd7c5d): 32 x 256, 64 x 128, 64 x 256 and x
/// staged were all slower than 32 x 128.
pub(crate) const GROUPED: CoopTile = CoopTile {
    wm: 1,
    wn: 1,
    stage_x: false,
};
pub(crate) const NARROW_GROUPS: u32 = 256;

/// The tiles in use: [`DENSE`], [`DENSE_NARROW`] and [`GROUPED`] unless
/// overridden (`WgpuOptions::coop_tiles`, for sweeps on a device).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct CoopTiles {
    pub dense: CoopTile,
    pub narrow: CoopTile,
    pub grouped: CoopTile,
}

impl Default for CoopTiles {
    fn default() -> Self {
        CoopTiles {
            dense: DENSE,
            narrow: DENSE_NARROW,
            grouped: GROUPED,
        }
    }
}

impl CoopTiles {
    /// `"wm,wn,stage_x;...;..."` (dense; narrow; grouped; an empty part
    /// keeps its default), each tile checked against the kernel, the
    /// device's `smem` bytes of workgroup memory and its `threads` per
    /// workgroup.
    pub fn parse(text: &str, smem: u32, threads: u32) -> Result<Self> {
        let mut t = CoopTiles::default();
        let slots = [&mut t.dense, &mut t.narrow, &mut t.grouped];
        let parts: Vec<&str> = text.split(';').collect();
        if parts.len() > 3 {
            return Err(Error::InvalidInput(format!(
                "tensor-core GEMM tiles {text:?}: at most three parts (dense; narrow; grouped)"
            )));
        }
        for (slot, part) in slots.into_iter().zip(parts) {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            let v: Option<Vec<u32>> = part.split(',').map(|x| x.trim().parse().ok()).collect();
            let tile = match v.as_deref() {
                Some(&[wm, wn, sx]) if sx <= 1 => CoopTile {
                    wm,
                    wn,
                    stage_x: sx == 1,
                },
                _ => {
                    return Err(Error::InvalidInput(format!(
                        "tensor-core GEMM tile {part:?} is not wm,wn,stage_x (stage_x 0 or 1)"
                    )))
                }
            };
            if !tile.valid() || tile.bytes() > smem || tile.threads() > threads {
                return Err(Error::InvalidInput(format!(
                    "tensor-core GEMM tile {tile:?} ({} bytes of workgroup memory, {} \
                     threads) does not fit kernels/gemm_coop.wgsl or the device's {smem} \
                     bytes and {threads} threads",
                    tile.bytes(),
                    tile.threads()
                )));
            }
            *slot = tile;
        }
        Ok(t)
    }
}
