//! What every backend's buffer handle answers: the op checks
//! (`crate::ops`) and the trait (`crate::backend`) both take it.

use crate::dtype::DType;

/// A device buffer handle: it knows its element type and length.
pub trait DeviceBuffer {
    fn dtype(&self) -> DType;
    /// Number of elements.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Whether both handles name the same device storage.
    fn same_storage(&self, other: &Self) -> bool;
}
