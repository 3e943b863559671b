//! Every op's contract: its parameters, the argument structs of the ops
//! that take several problems at once, and the checks every backend shares,
//! one file per op family beside the ops' parameters.
//!
//! Each op's check (`validate*` for the primitive ops, `check` for the
//! fused ones) covers its shapes, dtypes and aliasing, and returns the op's
//! buffer arguments named by role ([`Args`]). The trait's op methods
//! ([`crate::ComputeBackend`]) run it before they reach the backend, so a
//! bad call fails identically everywhere with an error that names the
//! argument, and no backend repeats it; they hand the arguments by role to
//! the backend's one rule on how it holds buffers
//! ([`crate::ComputeBackend::check_held`]). This file holds what the
//! families share: [`OpKind`], the buffer checks and the dtype sets.

mod attention;
mod copy;
mod elementwise;
mod fused;
mod matmul;
mod moe;
mod norm;
mod roles;
mod slots;

pub use attention::*;
pub use copy::*;
pub use elementwise::*;
pub use fused::*;
pub use matmul::*;
pub use moe::*;
pub use norm::*;
pub use roles::*;
pub use slots::*;

use crate::device_buffer::DeviceBuffer;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// An op case, for [`crate::ComputeBackend::supports`].
#[derive(Clone, Debug, PartialEq)]
pub enum OpKind {
    RmsNorm,
    Matmul {
        w: DType,
    },
    Router {
        w: DType,
    },
    MoeGateUp {
        w: DType,
    },
    MoeDown {
        w: DType,
    },
    Rope,
    KvAppend,
    Attention {
        head_dim: u32,
    },
    Add,
    Scale,
    GeluMul,
    Softcap,
    Embed {
        w: DType,
    },
    Argmax,
    SlotLookup,
    PostAttention {
        dim: u32,
    },
    PostFfn {
        dim: u32,
    },
    QkvPost {
        head_dim: u32,
    },
    /// Expert slots of this weight format: [`crate::ComputeBackend::write_experts`]
    /// into a stack from [`crate::ComputeBackend::alloc_experts`].
    ExpertSlots {
        w: DType,
    },
    /// KV caches of this element type (one of [`CACHES`]), which every op
    /// that reads or writes the caches takes.
    KvCache {
        dtype: DType,
    },
    /// [`crate::ComputeBackend::copy_range`]: a copy command, not a kernel.
    CopyRange,
}

/// Checks one buffer argument: dtype in `dtypes`, at least `need` elements.
pub fn check_buf<B: DeviceBuffer>(
    op: &'static str,
    name: &str,
    b: &B,
    dtypes: &[DType],
    need: usize,
) -> Result<()> {
    if !dtypes.contains(&b.dtype()) {
        return Err(Error::shape(
            op,
            format!(
                "`{name}` has dtype {}, expected one of {:?}",
                b.dtype(),
                dtypes
            ),
        ));
    }
    if b.len() < need {
        return Err(Error::shape(
            op,
            format!("`{name}` holds {} elements, needs {need}", b.len()),
        ));
    }
    Ok(())
}

/// A range of elements `start..start + len` read from `b` (an f32 or f16
/// buffer, [`CACHES`]): inside it, with nothing past its end.
pub fn check_range<B: DeviceBuffer>(
    op: &'static str,
    b: &B,
    start: usize,
    len: usize,
) -> Result<()> {
    check_buf(op, "buf", b, &CACHES, 0)?;
    match start.checked_add(len) {
        Some(end) if end <= b.len() => Ok(()),
        _ => Err(Error::shape(
            op,
            format!(
                "elements {start}..{start}+{len} are past the buffer's {}",
                b.len()
            ),
        )),
    }
}

/// Checks a weight argument: a float dtype, plain or quantized, and
/// exactly `need` elements.
pub fn check_weight<B: DeviceBuffer>(
    op: &'static str,
    name: &str,
    b: &B,
    need: usize,
) -> Result<()> {
    if !b.dtype().is_quantized() {
        check_buf(op, name, b, &FLOATS, need)?;
    }
    if b.len() != need {
        return Err(Error::shape(
            op,
            format!(
                "weight `{name}` holds {} elements, expected exactly {need}",
                b.len()
            ),
        ));
    }
    Ok(())
}

/// No output aliases an input or an earlier output.
pub fn no_alias_all<B: DeviceBuffer>(
    op: &'static str,
    outs: &[Option<&B>],
    ins: &[Option<&B>],
) -> Result<()> {
    for (i, out) in outs.iter().enumerate() {
        if let Some(o) = out {
            if aliases(*o, ins.iter().chain(&outs[..i]).flatten().copied()) {
                return Err(aliased(op));
            }
        }
    }
    Ok(())
}

/// Outputs must not alias inputs: a GPU cannot bind one buffer read-only
/// and read-write in one dispatch, so no backend accepts it.
pub fn no_alias<B: DeviceBuffer>(op: &'static str, out: &B, inputs: &[Option<&B>]) -> Result<()> {
    if aliases(out, inputs.iter().flatten().copied()) {
        return Err(aliased(op));
    }
    Ok(())
}

/// The pair ops' extra rule: neither problem's output aliases the other
/// problem's buffers (a GPU runs the two at once). `a` and `b` list each
/// problem's inputs then its output last.
pub fn pair_apart<B: DeviceBuffer>(op: &'static str, a: &[&B], b: &[&B]) -> Result<()> {
    let (Some(oa), Some(ob)) = (a.last(), b.last()) else {
        return Ok(());
    };
    if aliases(*oa, b.iter().copied()) || aliases(*ob, a.iter().copied()) {
        return Err(aliased(op));
    }
    Ok(())
}

/// Whether `out` shares storage with any of `others`.
fn aliases<'x, B: DeviceBuffer + 'x>(out: &B, mut others: impl Iterator<Item = &'x B>) -> bool {
    others.any(|b| b.same_storage(out))
}

fn aliased(op: &'static str) -> Error {
    Error::shape(op, "output buffer aliases an input")
}

pub fn nonzero(op: &'static str, what: &[(&str, usize)]) -> Result<()> {
    for (name, v) in what {
        if *v == 0 {
            return Err(Error::shape(op, format!("`{name}` must be positive")));
        }
    }
    Ok(())
}

pub const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];
pub const F32: [DType; 1] = [DType::F32];
pub const U32: [DType; 1] = [DType::U32];

/// The KV caches' element types: f32 (the default) or f16, which halves
/// the caches' memory and what attention reads (`ModelOptions::kv_cache`).
pub const CACHES: [DType; 2] = [DType::F32, DType::F16];

/// Largest expert count and top-k the router kernels handle.
pub const MAX_EXPERTS: usize = 256;
pub const MAX_TOP_K: usize = 8;
