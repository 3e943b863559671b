//! The copy commands' contracts: copy_buffer and copy_range.

use super::{check_buf, no_alias};
use crate::device_buffer::DeviceBuffer;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// [`crate::ComputeBackend::copy_buffer`]'s arguments: one dtype of
/// [`CACHES`] or u32 (activations, caches and ids; weights are never
/// copied), one length, two storages.
pub fn check_copy<B: DeviceBuffer>(src: &B, dst: &B) -> Result<()> {
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
    no_alias("copy_buffer", dst, &[Some(src)])
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
    /// buffers, two storages.
    pub fn validate<B: DeviceBuffer>(&self, src: &B, dst: &B) -> Result<()> {
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
        no_alias("copy_range", dst, &[Some(src)])
    }
}
