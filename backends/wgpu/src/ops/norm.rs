use bytemuck::{Pod, Zeroable};
use turbospark::ops::RmsNorm;
use turbospark::Result;

use super::one;
use crate::batch::Launch;
use crate::gpu::Gpu;
use crate::WgpuBuffer;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    rows: u32,
    dim: u32,
    eps: f32,
    scale: f32,
    has_weight: u32,
    has_residual: u32,
}

/// One workgroup per row. Absent weight/residual bind `x` in their place
/// (read-only, never read) so the entry point has one layout.
pub(crate) fn rms_norm(
    gpu: &Gpu,
    x: &WgpuBuffer,
    w: Option<&WgpuBuffer>,
    res: Option<&WgpuBuffer>,
    out: &WgpuBuffer,
    p: RmsNorm,
) -> Result<()> {
    let xb = one(x);
    let wb = w.map(one).unwrap_or(xb);
    let rb = res.map(one).unwrap_or(xb);
    let params = Params {
        rows: p.rows as u32,
        dim: p.dim as u32,
        eps: p.eps,
        scale: p.scale,
        has_weight: w.is_some() as u32,
        has_residual: res.is_some() as u32,
    };
    let wd = w.map(|w| w.dtype).unwrap_or(turbospark::DType::F32);
    gpu.launch(Launch {
        kernel: "rmsnorm",
        entry: "rms_norm",
        constants: &super::wdtype(wd),
        params: bytemuck::bytes_of(&params),
        buffers: &[(xb, true), (wb, true), (rb, true), (one(out), false)],
        groups: gpu.grid(p.rows as u32),
    })
}

#[cfg(test)]
mod layout_tests {
    use super::*;
    use crate::ops::layout::{check, fields};

    /// The parameter blocks as the kernels read them (ops::layout).
    #[test]
    fn params_match_wgsl() {
        check(
            ("rmsnorm", "Params"),
            std::mem::size_of::<Params>(),
            fields!(Params; rows, dim, eps, scale, has_weight, has_residual),
            &[],
        );
    }
}
