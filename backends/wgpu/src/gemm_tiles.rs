//! The prefill GEMM's tile shapes (`kernels/gemm.wgsl`) and their
//! overrides (`WgpuOptions::gemm_tiles`): a leaf, so the device context that
//! holds the overrides (`crate::gpu`) needs nothing of the launchers
//! (`crate::ops::gemm`) that read them.

use turbospark::{Error, Result};

/// A tile shape: token rows per thread (4 or 8), weight-row groups of 4 per
/// thread, 32-lane warps along the weight rows, k per step (the kernel's
/// overrides; its workgroup arrays are sized from them).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Tile {
    pub tm: u32,
    pub tn4: u32,
    pub wn: u32,
    pub bk: u32,
}

/// Threads per workgroup, and the kernel's fixed limits (`WG`, `MAX_TN4`,
/// `MAX_BM`; a step loads at most two vec4 of X and of W per thread).
pub(crate) const WG: u32 = 256;
const MAX_TN4: u32 = 4;
const MAX_BM: u32 = 128;
const MAX_LOADS: u32 = 2;

impl Tile {
    /// Token rows per tile.
    pub fn bm(self) -> u32 {
        self.tm * (WG / (8 * self.wn))
    }
    /// Weight rows per tile.
    pub fn bn(self) -> u32 {
        4 * self.tn4 * 8 * self.wn
    }
    /// The X and W tiles in vec4 (`XS4`, `WS4`).
    pub(crate) fn arrays(self) -> (u32, u32) {
        (self.bm() * self.bk / 4, self.bn() * self.bk / 4)
    }
    /// Workgroup memory the kernel takes with this tile: both tiles, the
    /// row maps, the route slots' tile counts (kernels/gemm_tiles.wgsl)
    /// and the tile record.
    pub fn bytes(self) -> u32 {
        let (x, w) = self.arrays();
        16 * (x + w) + 8 * MAX_BM + 4 * 256 + 16
    }
    /// Whether the kernel takes the tile within `smem` bytes of workgroup
    /// memory.
    pub fn fits(self, smem: u32) -> bool {
        matches!(self.tm, 4 | 8)
            && (1..=MAX_TN4).contains(&self.tn4)
            && matches!(self.wn, 1 | 2 | 4 | 8)
            && matches!(self.bk, 8 | 16 | 32)
            && self.bm() <= MAX_BM
            && self.bm() * self.bk / 4 <= MAX_LOADS * WG
            && self.bn() * self.bk / 8 <= MAX_LOADS * WG
            && self.bytes() <= smem
    }
}

/// The prefill GEMM's tile overrides (`WgpuOptions::gemm_tiles`): dense and
/// grouped, None keeping the default. Checked when the backend opens, as
/// the tensor-core tiles are, so a tile the device cannot hold is refused
/// there, never at a launch.
#[derive(Clone, Debug, Default)]
pub(crate) struct Overrides(pub Option<Tile>, pub Option<Tile>);

impl Overrides {
    /// `"tm,tn4,wn,bk;tm,tn4,wn,bk"` (dense; grouped): an empty or absent
    /// half keeps the default; each tile checked against the kernel and the
    /// device's `smem` bytes of workgroup memory.
    pub fn parse(s: &str, smem: u32) -> Result<Self> {
        let half = |kind: &str, s: &str| -> Result<Option<Tile>> {
            let s = s.trim();
            if s.is_empty() {
                return Ok(None);
            }
            let v: Option<Vec<u32>> = s.split(',').map(|x| x.trim().parse().ok()).collect();
            let Some(&[tm, tn4, wn, bk]) = v.as_deref() else {
                return Err(Error::InvalidInput(format!(
                    "GEMM tile overrides (TURBOSPARK_GEMM_TILES): the {kind} tile {s:?} \
                     is not tm,tn4,wn,bk"
                )));
            };
            let t = Tile { tm, tn4, wn, bk };
            if !t.fits(smem) {
                return Err(Error::InvalidInput(format!(
                    "{kind} GEMM tile {t:?} ({} bytes of workgroup memory) does not fit \
                     kernels/gemm.wgsl or the device's {smem} bytes",
                    t.bytes()
                )));
            }
            Ok(Some(t))
        };
        let (d, g) = s.split_once(';').unwrap_or((s, ""));
        Ok(Overrides(half("dense", d)?, half("grouped", g)?))
    }
}

/// Most rows of x the streaming kernels take (`ops::STREAM_MAX_M`, kept
/// here, a leaf, so that the device context reads it without the launchers).
pub(crate) const STREAM_MAX_M: usize = 16;

/// Rows of x from which a small matmul takes the GEMM by default: on the
/// H100 (2026-12-07, 4b7afca) the streaming GEMVs were faster at 4 rows
/// (4-bit q|k|v 41.0 against 46.8 us, the bf16 LM head 563 against
/// 1020 us) and the GEMM at 16 (4-bit q|k|v 138.3 against 51.0 us, o_proj
/// 206.2 against 62.3, dense down 75.1 against 23.0; the bf16 LM head 1.54
/// against 1.03 ms); between them nothing was timed, and 9 keeps the GEMM
/// to the batches nearer the one it won at (docs/decisions.md).
pub(crate) const GEMM_FROM_M: usize = 9;

/// `WgpuOptions::gemm_from_m`, else `TURBOSPARK_GEMM_FROM_M`, else
/// [`GEMM_FROM_M`]; past 2 ..= 17 (17: no small batch takes the GEMM) an
/// error naming the value.
pub(crate) fn gemm_from_m(opt: Option<usize>) -> Result<usize> {
    const VAR: &str = "TURBOSPARK_GEMM_FROM_M";
    let off = STREAM_MAX_M + 1;
    let (m, from) = match opt {
        Some(m) => (m, "WgpuOptions::gemm_from_m".to_string()),
        None => match std::env::var(VAR).as_deref() {
            Err(_) | Ok("") => return Ok(GEMM_FROM_M),
            Ok(v) => (
                v.parse().map_err(|_| {
                    Error::InvalidInput(format!("{VAR}={v:?}: expected a row count, 2 to {off}"))
                })?,
                VAR.to_string(),
            ),
        },
    };
    if !(2..=off).contains(&m) {
        return Err(Error::InvalidInput(format!(
            "{from} = {m}: the small-batch GEMM takes from 2 to {off} rows of x"
        )));
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The option's range: 2 rows to 17 (none), anything else named.
    #[test]
    fn gemm_from_m_takes_2_to_17_rows() {
        assert_eq!(gemm_from_m(Some(2)).unwrap(), 2);
        assert_eq!(gemm_from_m(Some(STREAM_MAX_M + 1)).unwrap(), 17);
        for bad in [0, 1, 18] {
            let e = gemm_from_m(Some(bad)).unwrap_err().to_string();
            assert!(e.contains("gemm_from_m = ") && e.contains("2 to 17"), "{e}");
        }
    }
}
