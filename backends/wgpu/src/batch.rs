//! Recording dispatches into one compute pass and submitting them together.

use turbospark::Result;

use crate::kernels::PipelineKey;
use crate::timing::Timing;
use crate::{WgpuBackend, PARAM_SLOT, PARAM_SLOTS};

/// The batch being recorded: one encoder, one open compute pass, and the
/// parameter blocks of its dispatches (written to the arena at submit).
#[derive(Default)]
pub(crate) struct Batch {
    pass: Option<wgpu::ComputePass<'static>>,
    encoder: Option<wgpu::CommandEncoder>,
    params: Vec<u8>,
    /// Dispatches recorded and submits made since the backend opened.
    pub dispatches: u64,
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
    pub fn submit(&mut self, be: &WgpuBackend) {
        if self.encoder.is_some() {
            self.submit_with(be, |_| {});
        }
    }

    /// Record a copy of `bytes` from `s` at byte `from` to `d` at byte `to`
    /// into the batch's encoder, after everything recorded so far (the pass
    /// ends; the next dispatch begins one); it runs with the next submit.
    pub fn copy(
        &mut self,
        be: &WgpuBackend,
        (s, d): (&wgpu::Buffer, &wgpu::Buffer),
        (from, to, bytes): (u64, u64, u64),
    ) {
        drop(self.pass.take());
        let enc = self.encoder.get_or_insert_with(|| {
            be.device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("turbospark batch"),
                })
        });
        enc.copy_buffer_to_buffer(s, from, d, to, bytes);
    }

    /// End the pass, let `extra` record after it (a readback copy), and
    /// submit everything as one submission; returns its index.
    pub fn submit_with(
        &mut self,
        be: &WgpuBackend,
        extra: impl FnOnce(&mut wgpu::CommandEncoder),
    ) -> wgpu::SubmissionIndex {
        // The pass must end before its encoder can finish.
        drop(self.pass.take());
        let mut enc = self.encoder.take().unwrap_or_else(|| {
            be.device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("turbospark batch"),
                })
        });
        if !self.params.is_empty() {
            be.queue.write_buffer(&be.params_buffer, 0, &self.params);
            self.params.clear();
        }
        let timed = self.timing.as_ref().is_some_and(|t| t.resolve(&mut enc));
        extra(&mut enc);
        let index = be.queue.submit([enc.finish()]);
        self.submits += 1;
        if timed {
            if let Some(t) = self.timing.as_mut() {
                t.collect(be);
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

impl WgpuBackend {
    /// Record one dispatch into the current batch.
    pub(crate) fn launch(&self, l: Launch<'_>) -> Result<()> {
        debug_assert!(l.params.len() as u64 <= PARAM_SLOT);
        let key = PipelineKey::new(
            l.kernel,
            l.entry,
            l.constants,
            l.buffers.iter().map(|(_, ro)| *ro),
        );
        let pipe = self.cache.get(&self.device, &self.params_layout, &key)?;
        let bind = self.binds.get(&self.device, &pipe, l.entry, l.buffers);
        let mut guard = self.batch.lock().unwrap_or_else(|p| p.into_inner());
        let b = &mut *guard;
        if b.omitted.iter().any(|e| e == l.entry) {
            return Ok(());
        }
        // Queries are taken when a pass begins (every dispatch when
        // profiling), so only then can they run out.
        let profiling = b.timing.as_ref().is_some_and(|t| t.labels.is_some());
        let new_pass = b.pass.is_none() || profiling;
        if b.params.len() as u64 + PARAM_SLOT > PARAM_SLOT * PARAM_SLOTS
            || (new_pass && b.timing.as_ref().is_some_and(Timing::full))
        {
            b.submit(self);
        }
        // Profiling: this dispatch gets a pass of its own, its entry noted.
        if let Some(labels) = b.timing.as_mut().and_then(|t| t.labels.as_mut()) {
            labels.push(l.entry);
            drop(b.pass.take());
        }
        let offset = b.params.len() as u32;
        b.params.extend_from_slice(l.params);
        b.params.resize(offset as usize + PARAM_SLOT as usize, 0);
        if b.encoder.is_none() {
            b.encoder = Some(
                self.device
                    .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                        label: Some("turbospark batch"),
                    }),
            );
        }
        if b.pass.is_none() {
            let timestamp_writes = b.timing.as_mut().map(Timing::next_pass);
            let pass = b
                .encoder
                .as_mut()
                .expect("encoder created above")
                .begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some("turbospark ops"),
                    timestamp_writes,
                })
                .forget_lifetime();
            b.pass = Some(pass);
        }
        let pass = b.pass.as_mut().expect("pass begun above");
        pass.set_pipeline(&pipe.pipeline);
        pass.set_bind_group(
            0,
            &self.params_groups[offset as usize / PARAM_SLOT as usize],
            &[],
        );
        pass.set_bind_group(1, &bind, &[]);
        pass.dispatch_workgroups(l.groups[0], l.groups[1], l.groups[2]);
        b.dispatches += 1;
        Ok(())
    }

    /// Spread `n` workgroups over x and y so no dimension passes the device
    /// limit; kernels recover the linear id with `linear_group(wg, nwg)`.
    pub(crate) fn grid(&self, n: u32) -> [u32; 3] {
        let max = self.limits.max_compute_workgroups_per_dimension.max(1);
        if n <= max {
            [n.max(1), 1, 1]
        } else {
            [max, n.div_ceil(max), 1]
        }
    }

    /// Dispatches recorded and submits made so far (for tools and tests that
    /// check a decode step is one submit).
    pub fn counters(&self) -> (u64, u64) {
        let b = self.batch.lock().unwrap_or_else(|p| p.into_inner());
        (b.dispatches, b.submits)
    }
}
