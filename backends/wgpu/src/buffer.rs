//! Device buffers. A weight may be split by rows across several wgpu buffers
//! when it is larger than one storage binding (the 1.48 GB tied LM head on
//! lavapipe's 128 MiB or a small Mac's binding limit).

use std::sync::{Arc, Mutex};

use turbospark::{DType, DeviceBuffer};

/// One wgpu buffer holding rows `row_start .. row_start + rows` of a tensor.
#[derive(Debug)]
pub struct Chunk {
    pub buffer: wgpu::Buffer,
    pub row_start: usize,
    pub rows: usize,
    /// Where the chunk reports its buffer when dropped, so the backend's
    /// bind-group cache lets go of it (a cached bind group keeps its
    /// buffers alive).
    pub(crate) reaper: Reaper,
}

/// Buffers whose last handle was dropped, waiting for the bind-group cache
/// to forget them.
pub(crate) type Reaper = Arc<Mutex<Vec<wgpu::Buffer>>>;

impl Drop for Chunk {
    fn drop(&mut self) {
        self.reaper
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(self.buffer.clone());
    }
}

/// A turbospark buffer on a wgpu device. Cheap to clone.
#[derive(Clone, Debug)]
pub struct WgpuBuffer {
    pub(crate) chunks: Arc<Vec<Chunk>>,
    pub(crate) dtype: DType,
    pub(crate) len: usize,
}

impl DeviceBuffer for WgpuBuffer {
    fn dtype(&self) -> DType {
        self.dtype
    }
    fn len(&self) -> usize {
        self.len
    }
    fn same_storage(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.chunks, &other.chunks)
    }
}

impl WgpuBuffer {
    /// The single wgpu buffer of an unsplit tensor.
    pub(crate) fn single(&self) -> Option<&wgpu::Buffer> {
        match self.chunks.as_slice() {
            [c] => Some(&c.buffer),
            _ => None,
        }
    }

    /// The wgpu buffers holding the tensor, in row order (one unless a
    /// weight was split across bindings): for tools and interop.
    pub fn wgpu_buffers(&self) -> impl Iterator<Item = &wgpu::Buffer> {
        self.chunks.iter().map(|c| &c.buffer)
    }

    /// Total bytes on the device (padded to 4-byte words).
    pub fn device_bytes(&self) -> u64 {
        self.chunks.iter().map(|c| c.buffer.size()).sum()
    }
}
