//! The elementwise and glue ops' contracts: add, scale, gelu_mul,
//! softcap, embed and argmax.

use super::roles::{Args, Role};
use super::{check_buf, check_weight, no_alias, nonzero, F32, U32};
use crate::device_buffer::DeviceBuffer;
use crate::error::Result;

/// `ComputeBackend::argmax` of a row with no candidate (every value NaN or
/// below [`ARGMAX_FLOOR`]): no token, which the decoder reports as
/// non-finite logits rather than emitting id 0.
pub const NO_ARGMAX: u32 = u32::MAX;

/// The smallest value argmax takes (kernels/argmax.wgsl's start value;
/// -inf and NaN are below it).
pub const ARGMAX_FLOOR: f32 = -3.402823e38;

/// Shapes, dtypes and aliasing of `op` (`add`) on `n` elements; its
/// arguments by role.
pub fn validate_binary<'a, B: DeviceBuffer>(
    op: &'static str,
    a: &'a B,
    b: &'a B,
    out: &'a B,
    n: usize,
) -> Result<Args<'a, B>> {
    nonzero(op, &[("n", n)])?;
    check_buf(op, "a", a, &F32, n)?;
    check_buf(op, "b", b, &F32, n)?;
    check_buf(op, "out", out, &F32, n)?;
    no_alias(op, out, &[Some(a), Some(b)])?;
    Ok(Args::new(op).plain("a", a).plain("b", b).plain("out", out))
}

/// Shapes, dtypes and aliasing of `op` (`scale`, `softcap`) on `n` elements;
/// its arguments by role.
pub fn validate_unary<'a, B: DeviceBuffer>(
    op: &'static str,
    x: &'a B,
    out: &'a B,
    n: usize,
) -> Result<Args<'a, B>> {
    nonzero(op, &[("n", n)])?;
    check_buf(op, "x", x, &F32, n)?;
    check_buf(op, "out", out, &F32, n)?;
    x_out(op, x, out)
}

/// A one-input op's `out` apart from its `x`; the two by role.
fn x_out<'a, B: DeviceBuffer>(op: &'static str, x: &'a B, out: &'a B) -> Result<Args<'a, B>> {
    no_alias(op, out, &[Some(x)])?;
    Ok(Args::new(op).plain("x", x).plain("out", out))
}

/// Shapes, dtypes and aliasing of a `gelu_mul` call; its arguments by role.
pub fn validate_gelu_mul<'a, B: DeviceBuffer>(
    x: &'a B,
    out: &'a B,
    rows: usize,
    n: usize,
) -> Result<Args<'a, B>> {
    const OP: &str = "gelu_mul";
    nonzero(OP, &[("rows", rows), ("n", n)])?;
    check_buf(OP, "x", x, &F32, rows * 2 * n)?;
    check_buf(OP, "out", out, &F32, rows * n)?;
    x_out(OP, x, out)
}

/// Shapes, dtypes and aliasing of an `argmax` call; its arguments by role.
pub fn validate_argmax<'a, B: DeviceBuffer>(
    x: &'a B,
    out: &'a B,
    rows: usize,
    n: usize,
) -> Result<Args<'a, B>> {
    const OP: &str = "argmax";
    nonzero(OP, &[("rows", rows), ("n", n)])?;
    check_buf(OP, "x", x, &F32, rows * n)?;
    check_buf(OP, "out", out, &U32, rows)?;
    x_out(OP, x, out)
}

/// gelu with the tanh approximation (`gelu_pytorch_tanh`), in f32.
#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)).tanh())
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Embed {
    pub m: usize,
    pub hidden: usize,
    pub vocab: usize,
    /// sqrt(hidden), rounded to the table's dtype (Gemma convention).
    pub scale: f32,
}

impl Embed {
    /// Shapes, dtypes and aliasing of an `embed` call; its arguments by
    /// role.
    pub fn validate<'a, B: DeviceBuffer>(
        &self,
        ids: &'a B,
        table: &'a B,
        out: &'a B,
    ) -> Result<Args<'a, B>> {
        const OP: &str = "embed";
        nonzero(
            OP,
            &[
                ("m", self.m),
                ("hidden", self.hidden),
                ("vocab", self.vocab),
            ],
        )?;
        check_buf(OP, "ids", ids, &U32, self.m)?;
        check_weight(OP, "table", table, self.vocab * self.hidden)?;
        check_buf(OP, "out", out, &F32, self.m * self.hidden)?;
        no_alias(OP, out, &[Some(ids), Some(table)])?;
        Ok(Args::new(OP)
            .plain("ids", ids)
            .with("table", table, Role::Weight)
            .plain("out", out))
    }
}
