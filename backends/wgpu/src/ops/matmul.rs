use bytemuck::{Pod, Zeroable};
use turbospark::ops::Matmul;
use turbospark::{DType, Result};

use super::one;
use crate::batch::Launch;
use crate::gpu::Gpu;
use crate::WgpuBuffer;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    m: u32,
    n: u32,
    k: u32,
    rows: u32,
    row0: u32,
    i0: u32,
    _pad: [u32; 2],
}

/// Threads per workgroup (`WG` in kernels/matmul.wgsl).
const WG: u32 = 256;

/// `(MB, RT, KL)` for `m` rows of x: the x-row bucket compiled in, weight
/// rows per thread and lanes along k per row group. RT rows per thread reuse
/// each x value from workgroup memory RT times and keep RT loads in flight.
fn config(m: usize) -> (u32, u32, u32) {
    match m {
        1 => (1, 4, 128),
        2 => (2, 4, 128),
        3..=4 => (4, 4, 64),
        5..=8 => (8, 4, 64),
        _ => (16, 4, 64),
    }
}

/// One dispatch per weight binding (a weight larger than one binding is split
/// by rows), each writing its chunk's output columns.
pub(crate) fn matmul(
    gpu: &Gpu,
    w: &WgpuBuffer,
    x: &WgpuBuffer,
    out: &WgpuBuffer,
    p: Matmul,
) -> Result<()> {
    if super::gemm::takes_small(gpu, p.m, p.k, w.dtype) {
        return super::gemm::dense(gpu, w, one(x), one(out), p);
    }
    if super::affine::takes(w, p.m) {
        return super::affine::gemv(gpu, w, x, out, p);
    }
    let xb = one(x);
    let ob = one(out);
    if p.m <= super::STREAM_MAX_M
        && p.k.is_multiple_of(8)
        && matches!(w.dtype, DType::BF16 | DType::F16)
    {
        return gemv(gpu, w, xb, ob, p);
    }
    if super::gemm::fits(p.m, p.k, w.dtype) {
        if super::gemm_coop::takes(
            gpu,
            w,
            p.k,
            super::gemm_coop::XRows::Dense(p.m),
            p.precision,
        ) {
            return super::gemm_coop::dense(gpu, w, xb, ob, p);
        }
        return super::gemm::dense(gpu, w, xb, ob, p);
    }
    // The kernel computes up to 16 rows of x; larger m runs in blocks of 16.
    let (mb, rt, kl) = config(p.m.min(16));
    let per_group = rt * (WG / kl);
    // A 16-bit weight with odd k has rows that start mid-word (f32 has no
    // pairs to split, but the pair loop still needs k even).
    let aligned = p.k.is_multiple_of(2);
    let [wd, qbits, qgroup] = super::weight_constants(w.dtype);
    let constants = [
        wd,
        qbits,
        qgroup,
        ("MB", mb as i64),
        ("RT", rt as i64),
        ("KL", kl as i64),
        ("ALIGNED", aligned as i64),
    ];
    for (c, i0) in w
        .chunks
        .iter()
        .flat_map(|c| (0..p.m).step_by(16).map(move |i0| (c, i0)))
    {
        let (row0, rows) = super::chunk_rows(w, c, p.n);
        let params = Params {
            m: (p.m - i0).min(16) as u32,
            n: p.n as u32,
            k: p.k as u32,
            rows: rows as u32,
            row0: row0 as u32,
            i0: i0 as u32,
            _pad: [0; 2],
        };
        gpu.launch(Launch {
            kernel: "matmul",
            entry: "matmul",
            constants: &constants,
            params: bytemuck::bytes_of(&params),
            buffers: &[(&c.buffer, true), (xb, true), (ob, false)],
            groups: gpu.grid((rows as u32).div_ceil(per_group)),
        })?;
    }
    Ok(())
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct GemvParams {
    n: u32,
    k: u32,
    rows: u32,
    row0: u32,
}

/// Weight rows from which `gemv_rows` takes four rows per lane group.
const GEMV_ROWS_FOUR_MIN: usize = 2048;
/// Weight rows up to which `gemv_rows` gives a lane group 64 lanes.
const GEMV_ROWS_64_LANES_MAX: usize = 2048;

/// `gemv_rows`' lanes per lane group (its `GL`) and weight rows per lane
/// group (its `RPL`: each x load serves that many weight rows) for a
/// weight of `rows` rows. On the H200 at 16 rows of x (BENCHMARKS.md,
/// 2026-12-01 at 77c77c3, runs 03-04; against one row a group of 32 lanes):
/// four rows a group took q_proj sliding (4096 rows) 49.7 -> 31.8 us, the
/// dense down and o_proj (2816) 35.0 -> 26.8 and 60.1 -> 40.6, the LM head
/// 1.97 -> 1.55 ms; 64 lanes took k_proj sliding (2048) 30.7 -> 25.7 with
/// four rows, k_proj full (1024) 26.1 -> 18.8 with one (four: 30.2),
/// while 2816+ rows lost with 64 (dense down 41.6, LM head 2.57 ms).
fn gemv_rows_shape(rows: usize) -> (u32, u32) {
    let lanes = if rows <= GEMV_ROWS_64_LANES_MAX {
        64
    } else {
        32
    };
    let rpl = if rows >= GEMV_ROWS_FOUR_MIN { 4 } else { 1 };
    (lanes, rpl)
}

/// Weight rows up to which `gemv` gives a row 64 lanes (`gemv_lanes`).
const GEMV_SHORT_ROWS: usize = 4096;
/// Weight rows up to which `gemv` compiles in the blocks per row (its
/// `GBK`: a constant trip count). On the H200 (2026-12-01 at ff0b6d1, run 03):
/// o_proj sliding / full (2816 rows) 9.9 / 15.8 -> 9.5 / 15.5 us and k_proj
/// (2048) 7.2 -> 6.7 with it, q_proj sliding (4096, also 64 lanes) 9.3 ->
/// 10.6 and q_proj full (8192, 32 lanes) 14.7 -> 17.2.
const GEMV_FIXED_ROWS: usize = 2816;

/// Threads per weight row of `gemv` (its `RL`): 64 for short weights, whose
/// few workgroups cannot hide a lane's chain of round trips, 32 for the
/// rest. On the H200 (BENCHMARKS.md, 2026-12-01 at 4968426): o_proj sliding and
/// full (2816 rows) 11.9 / 19.9 -> 9.9 / 15.8 us with 64, k_proj 8.9 -> 7.2;
/// q_proj full (8192 rows) 14.7 -> 15.8 with 64, 128 and 256 lanes slower
/// still for all but the full o_proj (17.6 with 256).
fn gemv_lanes(rows: usize) -> u32 {
    if rows <= GEMV_SHORT_ROWS {
        64
    } else {
        32
    }
}

/// `gemv`'s override constants for a weight of `rows` x `k` (one row of
/// x): its lanes a row (`RL`, `gemv_lanes`) and, for short weights only,
/// its blocks a row compiled in (`GBK`, a constant trip count; 0 keeps the
/// runtime loop). Public for the kernel lab, which times the backend's
/// gemv as the backend launches it.
pub fn gemv_constants(rows: usize, k: usize) -> [(&'static str, i64); 2] {
    let gbk = if rows <= GEMV_FIXED_ROWS { k / 8 } else { 0 };
    [("RL", gemv_lanes(rows) as i64), ("GBK", gbk as i64)]
}

/// The decode and prefill fast path (kernels/gemv.wgsl): up to 16 rows of x,
/// 16-bit weights read 16 bytes per load, each weight row read once. Rows of a multiple-of-8 k start on 16-byte
/// boundaries, so the weight binds as `array<vec4<u32>>`.
fn gemv(gpu: &Gpu, w: &WgpuBuffer, xb: &wgpu::Buffer, ob: &wgpu::Buffer, p: Matmul) -> Result<()> {
    for c in w.chunks.iter() {
        let (row0, rows) = super::chunk_rows(w, c, p.n);
        let params = GemvParams {
            n: p.n as u32,
            k: p.k as u32,
            rows: rows as u32,
            row0: row0 as u32,
        };
        // One row of x: `gemv`; a few (prefill): `gemv_rows` with MT = m.
        let [rl, gbk] = gemv_constants(rows, p.k);
        let (gl, rpl) = gemv_rows_shape(rows);
        let one = [super::wdtype(w.dtype)[0], rl, gbk];
        let all = [
            super::wdtype(w.dtype)[0],
            ("MT", p.m as i64),
            ("RPL", rpl as i64),
            ("GL", gl as i64),
        ];
        let (entry, constants, per_group) = if p.m == 1 {
            ("gemv", &one[..], 256 / gemv_lanes(rows))
        } else {
            ("gemv_rows", &all[..], 256 / gl * rpl)
        };
        gpu.launch(Launch {
            kernel: "gemv",
            entry,
            constants,
            params: bytemuck::bytes_of(&params),
            buffers: &[(&c.buffer, true), (xb, true), (ob, false)],
            groups: gpu.grid((rows as u32).div_ceil(per_group)),
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The short decode projections of Gemma 4 26B-A4B take 64 lanes a
    /// row, q|k|v and the LM head 32; both reach the kernel's bounds.
    #[test]
    fn gemv_lanes_by_rows() {
        assert_eq!(gemv_lanes(262144), 32);
        assert_eq!(gemv_lanes(8192 + 2 * 2048), 32);
        assert_eq!(gemv_lanes(2816), 64);
        assert_eq!(gemv_lanes(1), 64);
        for rows in [1, GEMV_SHORT_ROWS, GEMV_SHORT_ROWS + 1] {
            let l = gemv_lanes(rows);
            assert!(
                l.is_power_of_two() && (32..=256).contains(&l),
                "{rows}: {l}"
            );
        }
    }

    /// `gemv_rows` at Gemma 4 26B-A4B's weights takes the shapes measured
    /// for them (BENCHMARKS.md, 2026-12-01 at 77c77c3): k_proj full 1024 rows,
    /// k_proj sliding 2048, o_proj and the dense down 2816, q_proj 4096 and
    /// 8192, the LM head.
    #[test]
    fn gemv_rows_shape_by_rows() {
        assert_eq!(gemv_rows_shape(1024), (64, 1));
        assert_eq!(gemv_rows_shape(2048), (64, 4));
        assert_eq!(gemv_rows_shape(2816), (32, 4));
        assert_eq!(gemv_rows_shape(4096), (32, 4));
        assert_eq!(gemv_rows_shape(8192), (32, 4));
        assert_eq!(gemv_rows_shape(262144), (32, 4));
    }

    #[test]
    fn configs_fit_the_kernel() {
        for m in 1..=16 {
            let (mb, rt, kl) = config(m);
            assert!(mb as usize >= m && mb <= 16);
            assert!(rt <= 8 && rt * mb <= 64, "accumulators for m={m}");
            assert!(kl.is_power_of_two() && WG.is_multiple_of(kl));
        }
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
            ("matmul", "Params"),
            std::mem::size_of::<Params>(),
            fields!(Params; m, n, k, rows, row0, i0, _pad),
            &[],
        );
        check(
            ("gemv", "Params"),
            std::mem::size_of::<GemvParams>(),
            fields!(GemvParams; n, k, rows, row0),
            &[],
        );
    }
}
