//! Fused decoder steps (`kernels/fused.wgsl`): one workgroup per row.

use bytemuck::{Pod, Zeroable};
use turbospark::ops::{PostAttention, PostFfn};
use turbospark::{DType, Result};

use super::one;
use crate::batch::Launch;
use crate::kernels::wdtype_code;
use crate::{WgpuBackend, WgpuBuffer};

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    rows: u32,
    dim: u32,
    eps: f32,
    scale: f32,
    flags: u32,
    _pad: [u32; 3],
}

/// A one-element buffer bound where an optional output is absent (the
/// kernel's flags keep it from being touched); looked up only then. An
/// absent input binds one of the op's own read-only inputs instead, as
/// rms_norm does.
fn unused_out(be: &WgpuBackend) -> Result<WgpuBuffer> {
    super::scratch_buffer(be, |s| &mut s.unused_out, DType::F32, 1, 1, "unused output")
}

/// Threads per row (the kernels' `WG`): 1024 where the device allows it
/// (a one-workgroup kernel is latency-bound: fewer columns per thread, fewer
/// loads waited on in turn), else 256. A thread keeps up to `MAXPER` = 32
/// columns in registers.
fn threads(be: &WgpuBackend) -> usize {
    if be.wgpu_limits().max_compute_invocations_per_workgroup >= 1024 {
        1024
    } else {
        256
    }
}

const MAXPER: usize = 32;

/// Widest row the fused kernels take on this device.
pub(crate) fn max_dim(be: &WgpuBackend) -> usize {
    threads(be) * MAXPER
}

/// Pipeline constants: `WDn` dtype codes of up to four norm weights (absent
/// ones: f32), `WG` threads per row and `PER` columns per thread.
fn constants(
    be: &WgpuBackend,
    ws: [Option<&WgpuBuffer>; 4],
    dim: usize,
) -> [(&'static str, i64); 6] {
    let code = |w: Option<&WgpuBuffer>| w.map_or(0, |w| wdtype_code(w.dtype) as i64);
    let wg = threads(be);
    [
        ("WD0", code(ws[0])),
        ("WD1", code(ws[1])),
        ("WD2", code(ws[2])),
        ("WD3", code(ws[3])),
        ("WG", wg as i64),
        ("PER", dim.div_ceil(wg) as i64),
    ]
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn post_attention(
    be: &WgpuBackend,
    o: &WgpuBuffer,
    x: &WgpuBuffer,
    w_post: &WgpuBuffer,
    w_ff: &WgpuBuffer,
    r: &WgpuBuffer,
    ff: &WgpuBuffer,
    moe: Option<(&WgpuBuffer, &WgpuBuffer)>,
    p: PostAttention,
) -> Result<()> {
    let pad;
    let (w_moe, moe_out) = match moe {
        Some(m) => m,
        None => {
            pad = unused_out(be)?;
            (o, &pad)
        }
    };
    let params = Params {
        rows: p.rows as u32,
        dim: p.dim as u32,
        eps: p.eps,
        scale: 1.0,
        flags: moe.is_some() as u32,
        _pad: [0; 3],
    };
    be.launch(Launch {
        kernel: "fused",
        entry: "post_attention",
        constants: &constants(
            be,
            [Some(w_post), Some(w_ff), moe.map(|m| m.0), None],
            p.dim,
        ),
        params: bytemuck::bytes_of(&params),
        buffers: &[
            (one(o), true),
            (one(x), true),
            (one(w_post), true),
            (one(w_ff), true),
            (one(w_moe), true),
            (one(r), false),
            (one(ff), false),
            (one(moe_out), false),
        ],
        groups: be.grid(p.rows as u32),
    })
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn post_ffn(
    be: &WgpuBackend,
    dense: &WgpuBuffer,
    w_dense: &WgpuBuffer,
    moe: Option<(&WgpuBuffer, &WgpuBuffer, &WgpuBuffer)>,
    r: &WgpuBuffer,
    x: &WgpuBuffer,
    next: Option<(&WgpuBuffer, &WgpuBuffer)>,
    p: PostFfn,
) -> Result<()> {
    let (e, w_moe, w_sum) = moe.unwrap_or((dense, dense, dense));
    let pad;
    let (w_next, normed) = match next {
        Some(n) => n,
        None => {
            pad = unused_out(be)?;
            (dense, &pad)
        }
    };
    let params = Params {
        rows: p.rows as u32,
        dim: p.dim as u32,
        eps: p.eps,
        scale: p.scale,
        flags: moe.is_some() as u32 | (next.is_some() as u32) << 1,
        _pad: [0; 3],
    };
    be.launch(Launch {
        kernel: "fused",
        entry: "post_ffn",
        constants: &constants(
            be,
            [
                Some(w_dense),
                moe.map(|m| m.1),
                moe.map(|m| m.2),
                next.map(|n| n.0),
            ],
            p.dim,
        ),
        params: bytemuck::bytes_of(&params),
        buffers: &[
            (one(dense), true),
            (one(e), true),
            (one(r), true),
            (one(w_dense), true),
            (one(w_moe), true),
            (one(w_sum), true),
            (one(w_next), true),
            (one(x), false),
            (one(normed), false),
        ],
        groups: be.grid(p.rows as u32),
    })
}
