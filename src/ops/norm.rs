//! RMSNorm's contract.

use super::roles::Args;
use super::{check_buf, no_alias, nonzero, F32, FLOATS};
use crate::device_buffer::DeviceBuffer;
use crate::error::Result;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RmsNorm {
    pub rows: usize,
    pub dim: usize,
    pub eps: f32,
    /// Multiplies the result after the residual add (`layer_scalar`); 1.0 otherwise.
    pub scale: f32,
}

impl RmsNorm {
    /// Rows of `dim` with `eps` and no scale: the norms the fused ops are
    /// made of.
    pub fn unscaled(rows: usize, dim: usize, eps: f32) -> RmsNorm {
        RmsNorm {
            rows,
            dim,
            eps,
            scale: 1.0,
        }
    }

    /// Shapes, dtypes and aliasing of an `rms_norm` call; its arguments
    /// by role.
    pub fn validate<'a, B: DeviceBuffer>(
        &self,
        x: &'a B,
        w: Option<&'a B>,
        res: Option<&'a B>,
        out: &'a B,
    ) -> Result<Args<'a, B>> {
        const OP: &str = "rms_norm";
        nonzero(OP, &[("rows", self.rows), ("dim", self.dim)])?;
        let n = self.rows * self.dim;
        check_buf(OP, "x", x, &F32, n)?;
        if let Some(w) = w {
            check_buf(OP, "weight", w, &FLOATS, self.dim)?;
        }
        if let Some(r) = res {
            check_buf(OP, "residual", r, &F32, n)?;
        }
        check_buf(OP, "out", out, &F32, n)?;
        no_alias(OP, out, &[Some(x), w, res])?;
        Ok(Args::new(OP)
            .plain("x", x)
            .maybe("weight", w)
            .maybe("residual", res)
            .plain("out", out))
    }
}
