//! Readbacks: each takes a staging buffer from a small pool, copies into it
//! at the end of the submission that produced the data, and maps it only
//! when finished, waiting for that submission alone. `begin_read_u32` /
//! `finish_read_u32` split the two halves (decode keeps two in flight);
//! a download is both at once. The pool's types; `Gpu::begin_read` and
//! `Gpu::finish_read` use them.

use std::sync::mpsc::Receiver;

/// Most readbacks in flight; beginning one more first finishes the oldest
/// and drops its data (its ticket then finds nothing: an error).
pub(crate) const SLOTS: usize = 4;

pub(crate) fn staging_buffer(device: &wgpu::Device, bytes: u64) -> wgpu::Buffer {
    device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("readback"),
        size: bytes.max(256),
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    })
}

pub(crate) struct InFlight {
    pub ticket: u64,
    pub submission: wgpu::SubmissionIndex,
    pub mapped: Receiver<std::result::Result<(), wgpu::BufferAsyncError>>,
    pub bytes: u64,
}

pub(crate) struct Slot {
    pub staging: wgpu::Buffer,
    pub busy: Option<InFlight>,
}

#[derive(Default)]
pub(crate) struct Reads {
    pub slots: Vec<Slot>,
    pub next: u64,
}
