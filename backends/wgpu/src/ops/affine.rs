//! Launchers of kernels/affine_gemv.wgsl: decode and micro-batch products
//! with MLX affine-quantized weights (up to [`super::STREAM_MAX_M`] rows of
//! x or tokens). Larger batches take the matmul and route-list kernels,
//! which read quantized weights through kernels/affine.wgsl too.

use bytemuck::{Pod, Zeroable};
use turbospark::ops::{Matmul, Moe};
use turbospark::{DType, Result};

use super::one;
use crate::batch::Launch;
use crate::{WgpuBackend, WgpuBuffer};

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    m: u32,
    n: u32,
    k: u32,
    rows: u32,
    row0: u32,
    top_k: u32,
    experts: u32,
    nrb: u32,
    so: u32,
    bo: u32,
    _p0: u32,
    _p1: u32,
}

/// Weight rows a workgroup of `affine_gemv` computes (`TEAMS * RPT`).
const ROWS: usize = 32;

/// Weight rows a team of the one-row entries holds (`RPT1`) for a weight
/// of `rows` rows: 4 (x read once for four rows, the decode's arithmetic
/// shared), 1 for small weights (k_proj full, 1024 rows: 12.3 -> 7.3 us on
/// the H200 at 096aeae; o_proj full, 2816 rows, was slower at 2).
fn rpt(rows: usize) -> usize {
    if rows >= 2048 {
        4
    } else {
        1
    }
}

/// Lanes a team of the one-row entries (`LPR`, a workgroup holding 256 /
/// LPR teams) for `teams` teams each over `span` units: enough that the
/// problem runs about 2^17 lanes (some thirty warps an SM of an H200), so
/// few rows still fill the GPU and each lane's serial work stays short,
/// between 32 and 256 and no more than the span needs.
fn lanes(teams: usize, span: usize) -> usize {
    const WANT: usize = 1 << 17;
    let by_size = (WANT / teams.max(1)).max(1);
    // the largest power of two not above by_size
    let by_size = 1 << (usize::BITS - 1 - by_size.leading_zeros());
    by_size.min(span.next_power_of_two()).clamp(32, 256)
}

/// The scales' and biases' word offsets in a binding of `len` elements of
/// `dtype` (an affine one).
fn offsets(dtype: DType, len: usize) -> [u32; 2] {
    match dtype {
        DType::Affine(a) => crate::quant::offsets(a, len),
        _ => [0, 0],
    }
}

/// The units (32 values) of a row of `k`, compiled into the one-row
/// entries.
fn units(k: usize) -> (&'static str, i64) {
    ("KU", (k / 32) as i64)
}

/// Whether these kernels take a product over `m` rows of x with weight `w`.
pub(crate) fn takes(w: &WgpuBuffer, m: usize) -> bool {
    matches!(w.dtype, DType::Affine(_)) && m <= super::STREAM_MAX_M
}

pub(crate) fn gemv(
    be: &WgpuBackend,
    w: &WgpuBuffer,
    x: &WgpuBuffer,
    out: &WgpuBuffer,
    p: Matmul,
) -> Result<()> {
    let [wd, qbits, qgroup] = super::weight_constants(w.dtype);
    // one row of x: the one-row entry (its loop's trip count compiled in)
    let r = rpt(p.n);
    let l = lanes(p.n.div_ceil(r), p.k / 32);
    let (entry, per_group, constants) = if p.m == 1 {
        let c = [
            wd,
            qbits,
            qgroup,
            units(p.k),
            ("RPT1", r as i64),
            ("LPR", l as i64),
        ];
        ("affine_gemv1", 256 / l * r, c)
    } else {
        // (KU, RPT1 and LPR are the one-row entries')
        let c = [
            wd,
            qbits,
            qgroup,
            ("MT", p.m as i64),
            ("RPT1", 4),
            ("LPR", 32),
        ];
        ("affine_gemv", ROWS, c)
    };
    let (xb, ob) = (one(x), one(out));
    for c in w.chunks.iter() {
        let (row0, rows) = super::chunk_rows(w, c, p.n);
        let [so, bo] = offsets(w.dtype, rows * p.k);
        let params = Params {
            m: p.m as u32,
            n: p.n as u32,
            k: p.k as u32,
            rows: rows as u32,
            row0: row0 as u32,
            top_k: 0,
            experts: 0,
            nrb: 0,
            so,
            bo,
            _p0: 0,
            _p1: 0,
        };
        be.launch(Launch {
            kernel: "affine_gemv",
            entry,
            constants: &constants,
            params: bytemuck::bytes_of(&params),
            buffers: &[
                (&c.buffer, true),
                (xb, true),
                (xb, true),
                (xb, true),
                (ob, false),
            ],
            groups: be.grid(rows.div_ceil(per_group) as u32),
        })?;
    }
    Ok(())
}

/// `len`: the elements of the expert stack's binding (its slots', where
/// experts are streamed).
fn moe_params(p: &Moe, k: usize, nrb: usize, (dtype, len): (DType, usize)) -> Params {
    let [so, bo] = offsets(dtype, len);
    Params {
        m: p.m as u32,
        n: p.inter as u32,
        k: k as u32,
        rows: p.hidden as u32,
        row0: 0,
        top_k: p.top_k as u32,
        experts: p.experts as u32,
        nrb: nrb as u32,
        so,
        bo,
        _p0: 0,
        _p1: 0,
    }
}

/// MoE phase 1, every (token, slot) pair on its own.
pub(crate) fn gate_up(
    be: &WgpuBackend,
    (x, gu, ids, act): (&WgpuBuffer, &wgpu::Buffer, &WgpuBuffer, &WgpuBuffer),
    (dtype, len): (DType, usize),
    p: &Moe,
) -> Result<()> {
    // (a team holds a feature's gate and up rows at the least)
    let r = rpt(2 * p.m * p.top_k * p.inter).max(2);
    let l = lanes(p.m * p.top_k * p.inter.div_ceil(r / 2), p.hidden / 32);
    let nrb = p.inter.div_ceil(256 / l * r / 2);
    let params = moe_params(p, p.hidden, nrb, (dtype, len));
    let xb = one(x);
    let [wd, qbits, qgroup] = super::weight_constants(dtype);
    be.launch(Launch {
        kernel: "affine_gemv",
        entry: "affine_gate_up",
        constants: &[
            wd,
            qbits,
            qgroup,
            units(p.hidden),
            ("RPT1", r as i64),
            ("LPR", l as i64),
        ],
        params: bytemuck::bytes_of(&params),
        buffers: &[
            (gu, true),
            (xb, true),
            (one(ids), true),
            // phase 1 has no routing weights: x stands in, never read
            (xb, true),
            (one(act), false),
        ],
        groups: be.grid((p.m * p.top_k * nrb) as u32),
    })
}

/// MoE phase 2, a token's sum over its experts inside the workgroup that
/// owns its output rows.
pub(crate) fn down(
    be: &WgpuBackend,
    (act, d, ids, wts, out): (
        &WgpuBuffer,
        &wgpu::Buffer,
        &WgpuBuffer,
        &WgpuBuffer,
        &WgpuBuffer,
    ),
    (dtype, len): (DType, usize),
    p: &Moe,
) -> Result<()> {
    let r = rpt(p.m * p.hidden);
    let l = lanes(p.m * p.hidden.div_ceil(r), p.top_k * p.inter / 32);
    let nrb = p.hidden.div_ceil(256 / l * r);
    let params = moe_params(p, p.inter, nrb, (dtype, len));
    let [wd, qbits, qgroup] = super::weight_constants(dtype);
    be.launch(Launch {
        kernel: "affine_gemv",
        entry: "affine_down",
        constants: &[wd, qbits, qgroup, units(p.inter), ("TOPK", p.top_k as i64)],
        params: bytemuck::bytes_of(&params),
        buffers: &[
            (d, true),
            (one(act), true),
            (one(ids), true),
            (one(wts), true),
            (one(out), false),
        ],
        groups: be.grid((p.m * nrb) as u32),
    })
}

#[cfg(test)]
mod plan_tests {
    use super::*;

    /// The lanes a team at the 26B-A4B's decode shapes, and their bounds.
    #[test]
    fn lanes_fill_the_gpu_within_bounds() {
        // LM head: 65536 teams of four rows
        assert_eq!(lanes(65536, 88), 32);
        // q_proj sliding, 1024 teams: a lane a unit
        assert_eq!(lanes(1024, 88), 128);
        // the down phase, 704 teams over 8 experts' 22 units
        assert_eq!(lanes(704, 176), 128);
        // few units a row: no more lanes than units
        assert_eq!(lanes(16, 3), 32);
        assert_eq!(lanes(1, 10_000), 256);
        assert_eq!(lanes(0, 0), 32);
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
            ("affine_gemv", "Params"),
            std::mem::size_of::<Params>(),
            fields!(Params; m, n, k, rows, row0, top_k, experts, nrb, so, bo, _p0, _p1),
            &[],
        );
    }
}
