//! Readbacks: each takes a staging buffer from a small pool, copies into it
//! at the end of the submission that produced the data, and maps it only
//! when finished, waiting for that submission alone. `begin_read_u32` /
//! `finish_read_u32` split the two halves (decode keeps two in flight);
//! a download is both at once.

use std::sync::mpsc::{channel, Receiver};

use turbospark::{Error, ReadTicket, Result};

use crate::{WgpuBackend, WgpuBuffer};

/// Most readbacks in flight; beginning one more first finishes the oldest
/// and drops its data (its ticket then finds nothing: an error).
const SLOTS: usize = 4;

fn staging_buffer(device: &wgpu::Device, bytes: u64) -> wgpu::Buffer {
    device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("readback"),
        size: bytes.max(256),
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    })
}

struct InFlight {
    ticket: u64,
    submission: wgpu::SubmissionIndex,
    mapped: Receiver<std::result::Result<(), wgpu::BufferAsyncError>>,
    bytes: u64,
}

struct Slot {
    staging: wgpu::Buffer,
    busy: Option<InFlight>,
}

#[derive(Default)]
pub(crate) struct Reads {
    slots: Vec<Slot>,
    next: u64,
}

impl WgpuBackend {
    /// Start copying `buf` back (`op` names the caller in errors).
    pub(crate) fn begin_read(&self, buf: &WgpuBuffer, op: &'static str) -> Result<ReadTicket> {
        let src = buf
            .single()
            .ok_or_else(|| Error::shape(op, "a weight split across bindings"))?
            .clone();
        let bytes = src.size();
        let mut reads = self.reads.lock().unwrap_or_else(|p| p.into_inner());
        // A free slot big enough, else a new one, else the oldest reclaimed.
        let i = match reads
            .slots
            .iter()
            .position(|s| s.busy.is_none() && s.staging.size() >= bytes)
        {
            Some(i) => i,
            None if reads.slots.len() < SLOTS => {
                let staging = staging_buffer(&self.device, bytes);
                reads.slots.push(Slot {
                    staging,
                    busy: None,
                });
                reads.slots.len() - 1
            }
            None => {
                let oldest = (0..reads.slots.len())
                    .min_by_key(|&i| reads.slots[i].busy.as_ref().map_or(0, |b| b.ticket))
                    .expect("SLOTS > 0");
                if let Some(b) = reads.slots[oldest].busy.take() {
                    self.complete(&reads.slots[oldest].staging, b)?;
                }
                if reads.slots[oldest].staging.size() < bytes {
                    reads.slots[oldest].staging = staging_buffer(&self.device, bytes);
                }
                oldest
            }
        };
        let staging = reads.slots[i].staging.clone();
        let submission = self
            .batch
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .submit_with(self, |enc| {
                enc.copy_buffer_to_buffer(&src, 0, &staging, 0, bytes)
            });
        let (tx, rx) = channel();
        staging
            .slice(..bytes)
            .map_async(wgpu::MapMode::Read, move |r| {
                let _ = tx.send(r);
            });
        reads.next += 1;
        let ticket = reads.next;
        reads.slots[i].busy = Some(InFlight {
            ticket,
            submission,
            mapped: rx,
            bytes,
        });
        drop(reads);
        self.check_errors()?;
        Ok(ReadTicket(ticket))
    }

    /// The words of the buffer a ticket's readback copied (a u32 buffer's
    /// size is exactly its elements).
    pub(crate) fn finish_read(&self, ticket: ReadTicket) -> Result<Vec<u32>> {
        Ok(bytemuck::pod_collect_to_vec(
            &self.finish_read_bytes(ticket)?,
        ))
    }

    /// The bytes of the buffer a ticket's readback copied.
    pub(crate) fn finish_read_bytes(&self, ticket: ReadTicket) -> Result<Vec<u8>> {
        let mut reads = self.reads.lock().unwrap_or_else(|p| p.into_inner());
        let slot = reads
            .slots
            .iter_mut()
            .find(|s| s.busy.as_ref().is_some_and(|b| b.ticket == ticket.0))
            .ok_or_else(|| {
                Error::InvalidInput(format!("no readback in flight with ticket {}", ticket.0))
            })?;
        let busy = slot.busy.take().expect("found busy above");
        self.complete(&slot.staging, busy)
    }

    /// Wait for a readback's submission, copy its bytes out, unmap.
    fn complete(&self, staging: &wgpu::Buffer, b: InFlight) -> Result<Vec<u8>> {
        self.wait_for(Some(b.submission))?;
        b.mapped
            .recv()
            .map_err(|_| Error::Gpu("map callback never ran".into()))?
            .map_err(|e| Error::Gpu(format!("map_async: {e}")))?;
        // Unmapped whatever the range gives, so the slot can map again.
        let data = staging
            .slice(..b.bytes)
            .get_mapped_range()
            .map(|r| r.to_vec())
            .map_err(|e| Error::Gpu(format!("mapped range: {e}")));
        staging.unmap();
        let data = data?;
        self.check_errors()?;
        Ok(data)
    }
}
