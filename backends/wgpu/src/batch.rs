//! Recording dispatches into one compute pass and submitting them together.

use std::sync::Mutex;

use crate::timing::Timing;

/// Size of one parameter slot in the per-batch arena. Every op's parameter
/// block fits; it is also a multiple of every adapter's uniform offset alignment.
pub(crate) const PARAM_SLOT: u64 = 256;
/// Slots per batch: a batch that would exceed it is flushed first.
pub(crate) const PARAM_SLOTS: u64 = 4096;

/// What recording and submitting a batch needs of the device
/// (`Gpu::submit`).
pub(crate) struct Submit<'a> {
    pub device: &'a wgpu::Device,
    pub queue: &'a wgpu::Queue,
    /// The parameter arena the batch's blocks are written to at submit.
    pub params: &'a wgpu::Buffer,
    /// Where a timed batch's failed readback is reported.
    pub errors: &'a Mutex<Vec<String>>,
}

/// The batch being recorded: one encoder, one open compute pass, and the
/// parameter blocks of its dispatches (written to the arena at submit).
#[derive(Default)]
pub(crate) struct Batch {
    /// The open pass, its encoder and the dispatches' parameter blocks, which
    /// `Gpu::launch` records into.
    pub pass: Option<wgpu::ComputePass<'static>>,
    pub encoder: Option<wgpu::CommandEncoder>,
    pub params: Vec<u8>,
    /// Dispatches recorded, buffer copies recorded (each ends the pass it
    /// follows) and submits made since the backend opened.
    pub dispatches: u64,
    pub copies: u64,
    pub submits: u64,
    /// Set while `WgpuBackend::time_ops` runs: each sample's dispatches get
    /// a pass of their own with timestamps at its boundaries.
    pub timing: Option<Timing>,
    /// Entry points whose dispatches are left out (a timing ablation,
    /// `WgpuBackend::omit_dispatches`).
    pub omitted: Vec<String>,
}

impl Batch {
    /// End the open compute pass (the next dispatch begins a new one).
    pub fn end_pass(&mut self) {
        drop(self.pass.take());
    }

    /// Parameter slots used by the batch being recorded.
    pub fn params_slots(&self) -> u64 {
        self.params.len() as u64 / PARAM_SLOT
    }

    /// End the pass and submit what was recorded (nothing if empty).
    pub fn submit(&mut self, dev: &Submit<'_>) {
        if self.encoder.is_some() {
            self.submit_with(dev, |_| {});
        }
    }

    /// Record a copy of `bytes` from `s` at byte `from` to `d` at byte `to`
    /// into the batch's encoder, after everything recorded so far (the pass
    /// ends; the next dispatch begins one); it runs with the next submit.
    pub fn copy(
        &mut self,
        dev: &Submit<'_>,
        (s, d): (&wgpu::Buffer, &wgpu::Buffer),
        (from, to, bytes): (u64, u64, u64),
    ) {
        drop(self.pass.take());
        let enc = self.encoder.get_or_insert_with(|| {
            dev.device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("turbospark batch"),
                })
        });
        enc.copy_buffer_to_buffer(s, from, d, to, bytes);
        self.copies += 1;
    }

    /// End the pass, let `extra` record after it (a readback copy), and
    /// submit everything as one submission; returns its index.
    pub fn submit_with(
        &mut self,
        dev: &Submit<'_>,
        extra: impl FnOnce(&mut wgpu::CommandEncoder),
    ) -> wgpu::SubmissionIndex {
        // The pass must end before its encoder can finish.
        drop(self.pass.take());
        let mut enc = self.encoder.take().unwrap_or_else(|| {
            dev.device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("turbospark batch"),
                })
        });
        if !self.params.is_empty() {
            dev.queue.write_buffer(dev.params, 0, &self.params);
            self.params.clear();
        }
        let timed = self.timing.as_ref().is_some_and(|t| t.resolve(&mut enc));
        extra(&mut enc);
        let index = dev.queue.submit([enc.finish()]);
        self.submits += 1;
        if timed {
            if let Some(t) = self.timing.as_mut() {
                t.collect(dev.device, dev.errors);
            }
        }
        index
    }
}

/// One dispatch of a kernel entry point.
pub(crate) struct Launch<'a> {
    pub kernel: &'static str,
    pub entry: &'static str,
    /// Override constants (e.g. `WDTYPE`).
    pub constants: &'a [(&'static str, i64)],
    /// The uniform parameter block (`@group(0) @binding(0)`), at most 256 bytes.
    pub params: &'a [u8],
    /// `@group(1)` storage bindings in order, with read-only flags (the
    /// pipeline layout's).
    pub buffers: &'a [(&'a wgpu::Buffer, bool)],
    pub groups: [u32; 3],
}
