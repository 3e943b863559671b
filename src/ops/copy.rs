//! The copy commands' contracts: copy_buffer and copy_range.

use super::roles::Args;
use super::{check_buf, no_alias};
use crate::device_buffer::DeviceBuffer;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// [`crate::ComputeBackend::copy_buffer`]'s arguments: one dtype of
/// [`CACHES`](super::CACHES) or u32 (activations, caches and ids; weights
/// are never copied), one length, two storages. The two by role.
pub fn check_copy<'a, B: DeviceBuffer>(src: &'a B, dst: &'a B) -> Result<Args<'a, B>> {
    const COPIED: [DType; 3] = [DType::F32, DType::F16, DType::U32];
    check_buf("copy_buffer", "src", src, &COPIED, 0)?;
    if (dst.dtype(), dst.len()) != (src.dtype(), src.len()) {
        return Err(Error::shape(
            "copy_buffer",
            format!(
                "`dst` is {} x {}, `src` {} x {}: a copy needs one dtype and length",
                dst.dtype(),
                dst.len(),
                src.dtype(),
                src.len()
            ),
        ));
    }
    two_storages("copy_buffer", src, dst)
}

/// A copy's `dst` apart from its `src`; the two by role.
fn two_storages<'a, B: DeviceBuffer>(
    op: &'static str,
    src: &'a B,
    dst: &'a B,
) -> Result<Args<'a, B>> {
    no_alias(op, dst, &[Some(src)])?;
    Ok(Args::new(op).plain("src", src).plain("dst", dst))
}

/// [`crate::ComputeBackend::copy_range`]'s parameters: `len` elements of
/// `src` from element `src_offset` into `dst` from element `dst_offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyRange {
    pub src_offset: usize,
    pub dst_offset: usize,
    pub len: usize,
}

impl CopyRange {
    /// One dtype, f32 or u32 on both sides (four-byte elements: every
    /// offset a GPU copy command may take), both ranges inside their
    /// buffers, two storages. The two by role.
    pub fn validate<'a, B: DeviceBuffer>(&self, src: &'a B, dst: &'a B) -> Result<Args<'a, B>> {
        const COPIED: [DType; 2] = [DType::F32, DType::U32];
        let end = |offset: usize, name: &str| {
            offset.checked_add(self.len).ok_or_else(|| {
                Error::shape(
                    "copy_range",
                    format!("`{name}` offset {offset} + {} overflows", self.len),
                )
            })
        };
        check_buf(
            "copy_range",
            "src",
            src,
            &COPIED,
            end(self.src_offset, "src")?,
        )?;
        check_buf(
            "copy_range",
            "dst",
            dst,
            &COPIED,
            end(self.dst_offset, "dst")?,
        )?;
        if dst.dtype() != src.dtype() {
            return Err(Error::shape(
                "copy_range",
                format!(
                    "`dst` is {}, `src` {}: a copy needs one dtype",
                    dst.dtype(),
                    src.dtype()
                ),
            ));
        }
        two_storages("copy_range", src, dst)
    }
}
