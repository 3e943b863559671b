//! One stored tensor handed out by a weight source: its name, dtype, shape
//! and bytes, left where the source holds them (a checkpoint's memory map,
//! a synthetic generator's buffer).

use crate::backend::HostBytes;
use crate::dtype::{decode_f32, DType};

/// One tensor of the checkpoint: its bytes stay in the file's memory map.
#[derive(Clone)]
pub struct TensorRef {
    /// Name without the prefix (`layers.3.self_attn.q_proj.weight`).
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// `HostBytes::Mapped` over the file's `Arc<memmap2::Mmap>`.
    pub bytes: HostBytes<'static>,
}

impl TensorRef {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The elements decoded to f32 (for the small tensors read on the host).
    pub fn to_f32(&self) -> Vec<f32> {
        let bytes = self.bytes.as_slice();
        (0..self.numel())
            .map(|i| decode_f32(self.dtype, bytes, i))
            .collect()
    }
}

impl std::fmt::Debug for TensorRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorRef")
            .field("name", &self.name)
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .field("bytes", &self.bytes.as_slice().len())
            .finish()
    }
}
