//! Device buffers. A weight may be split by rows across several wgpu buffers
//! when it is larger than one storage binding (the 1.48 GB tied LM head on
//! lavapipe's 128 MiB or a small Mac's binding limit).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use turbospark::{DType, DeviceBuffer, ExpertStack};

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
    /// The backend's count of storage bytes held, given back on drop.
    pub(crate) memory: Arc<MemoryUse>,
}

impl Chunk {
    /// A chunk over `buffer`, counted in `memory` until it drops.
    pub(crate) fn new(
        buffer: wgpu::Buffer,
        (row_start, rows): (usize, usize),
        reaper: Reaper,
        memory: Arc<MemoryUse>,
    ) -> Self {
        memory.hold(buffer.size());
        Chunk {
            buffer,
            row_start,
            rows,
            reaper,
            memory,
        }
    }
}

/// Device bytes held in storage buffers (tensors and the backends' scratch),
/// now and at the most since the count began or was last reset.
#[derive(Debug, Default)]
pub(crate) struct MemoryUse {
    live: AtomicU64,
    peak: AtomicU64,
}

impl MemoryUse {
    fn hold(&self, bytes: u64) {
        let live = self.live.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak.fetch_max(live, Ordering::Relaxed);
    }
    fn release(&self, bytes: u64) {
        self.live.fetch_sub(bytes, Ordering::Relaxed);
    }
    /// `(live, peak)` bytes.
    pub(crate) fn get(&self) -> (u64, u64) {
        (
            self.live.load(Ordering::Relaxed),
            self.peak.load(Ordering::Relaxed),
        )
    }
    /// Start the peak again from what is held now.
    pub(crate) fn reset_peak(&self) {
        self.peak
            .store(self.live.load(Ordering::Relaxed), Ordering::Relaxed);
    }
}

/// Buffers whose last handle was dropped, waiting for the bind-group cache
/// to forget them.
pub(crate) type Reaper = Arc<Mutex<Vec<wgpu::Buffer>>>;

impl Drop for Chunk {
    fn drop(&mut self) {
        self.memory.release(self.buffer.size());
        self.reaper
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(self.buffer.clone());
    }
}

/// How a host store of experts (`host_experts.rs`) lays them out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct HostStore {
    pub experts: usize,
    /// One expert's rows and columns.
    pub expert: (usize, usize),
    pub gate_up: bool,
    /// Its experts in tile order (for a tile-ordered slot stack).
    pub tiled: bool,
    /// Bytes an expert takes, and where each of its parts starts in them.
    pub expert_bytes: usize,
    pub part_at: [usize; 3],
    /// Experts a buffer (chunk) holds.
    pub per_chunk: usize,
}

/// A turbospark buffer on a wgpu device. Cheap to clone.
#[derive(Clone, Debug)]
pub struct WgpuBuffer {
    pub(crate) chunks: Arc<Vec<Chunk>>,
    pub(crate) dtype: DType,
    pub(crate) len: usize,
    /// Every element converts to f16 without overflow (checked when
    /// uploaded from the host on a device with the tensor-core GEMM; false
    /// elsewhere and for buffers the device wrote): that GEMM takes only
    /// such weights. It holds: a 16-bit buffer has no host writes after its
    /// upload (`write_f32` / `write_u32` take f32 and u32 buffers).
    pub(crate) fits_f16: bool,
    /// The expert stack this buffer holds in tile order (`upload_experts`,
    /// `expert_tiles.rs`), else None: only the MoE op that takes this stack
    /// reads such a buffer (`bindings::check` holds every op to it).
    pub(crate) tiles: Option<ExpertStack>,
    /// A copy of every expert of a stack in host memory
    /// (`ComputeBackend::host_experts`), read only by `copy_experts`.
    pub(crate) host: Option<HostStore>,
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
    /// Whether the buffer is an expert stack in tile order.
    pub(crate) fn tiled(&self) -> bool {
        self.tiles.is_some()
    }

    /// Whether the host writes the buffer by mapping it (a mapped expert
    /// slot stack, `WgpuFeatures::mapped_slots`).
    pub(crate) fn mappable(&self) -> bool {
        self.chunks
            .iter()
            .all(|c| c.buffer.usage().contains(wgpu::BufferUsages::MAP_WRITE))
    }

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

/// Whether every element of `bytes` (of `dtype`) converts to f16 without
/// overflowing: f16 always; bf16 when no magnitude passes 65504 (bf16
/// 0x477f is 65280, the next one 65536) and none is inf or NaN. Four
/// halves per u64 (a lane's magnitude + 0x3880 reaches bit 15 exactly from
/// 0x4780, and never carries into the next lane): 14 GB/s on one core, so
/// 4 s of a 52 GB load.
pub(crate) fn fits_f16(dtype: DType, bytes: &[u8]) -> bool {
    const MAG: u64 = 0x7fff_7fff_7fff_7fff;
    const TO_TOP: u64 = 0x3880_3880_3880_3880;
    const TOP: u64 = 0x8000_8000_8000_8000;
    match dtype {
        DType::F16 => true,
        DType::BF16 => {
            let mut over = 0u64;
            let mut words = bytes.chunks_exact(8);
            for w in &mut words {
                let w = u64::from_le_bytes(w.try_into().expect("8 bytes"));
                over |= (w & MAG) + TO_TOP;
            }
            let tail = words
                .remainder()
                .chunks_exact(2)
                .any(|b| u16::from_le_bytes([b[0], b[1]]) & 0x7fff > 0x477f);
            over & TOP == 0 && !tail
        }
        DType::F32 | DType::U32 | DType::Affine(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fits_f16_finds_any_bf16_past_f16s_range() {
        let bf = |v: &[f32]| -> Vec<u8> {
            v.iter()
                .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
                .collect()
        };
        let ok = [1.0, -65280.0, 3e-9, 0.0, -0.5, 65280.0, 2.0, 1.0, 7.0];
        assert!(fits_f16(DType::BF16, &bf(&ok)));
        // Past 65504 (the next bf16 is 65536), inf and NaN, in each lane
        // of a word and in the tail.
        for bad in [65536.0, -65536.0, f32::INFINITY, f32::NAN, 1e30] {
            for at in 0..ok.len() {
                let mut v = ok;
                v[at] = bad;
                assert!(!fits_f16(DType::BF16, &bf(&v)), "{bad} at {at}");
            }
        }
        assert!(fits_f16(DType::F16, &[0xff, 0x7b]));
        assert!(!fits_f16(DType::F32, &[0; 4]));
    }
}
