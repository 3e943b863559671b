//! The dense projection's contract.

use super::roles::{Args, Role};
use super::{check_buf, check_weight, no_alias, nonzero, F32};
use crate::device_buffer::DeviceBuffer;
use crate::error::Result;
use crate::precision::Precision;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Matmul {
    /// Rows of x (tokens).
    pub m: usize,
    /// Output features (rows of w).
    pub n: usize,
    /// Input features (columns of w).
    pub k: usize,
    /// How the product runs where the backend takes it to f16 matrix units
    /// ([`crate::ComputeBackend::gemm_rounding`]); ignored elsewhere.
    pub precision: Precision,
}

impl Matmul {
    /// Shapes, dtypes and aliasing of a `matmul` call; its arguments by
    /// role.
    pub fn validate<'a, B: DeviceBuffer>(
        &self,
        w: &'a B,
        x: &'a B,
        out: &'a B,
    ) -> Result<Args<'a, B>> {
        const OP: &str = "matmul";
        nonzero(OP, &[("m", self.m), ("n", self.n), ("k", self.k)])?;
        check_weight(OP, "w", w, self.n * self.k)?;
        check_buf(OP, "x", x, &F32, self.m * self.k)?;
        check_buf(OP, "out", out, &F32, self.m * self.n)?;
        no_alias(OP, out, &[Some(w), Some(x)])?;
        Ok(Args::new(OP)
            .with("w", w, Role::Weight)
            .plain("x", x)
            .plain("out", out))
    }
}
