//! What `turbospark bench` needs from the device beyond the ops: per-op GPU
//! time from timestamp queries, and streaming kernels (`kernels/bench.wgsl`):
//! the bandwidth ceiling's, which reads a buffer larger than any cache, and
//! a second that reads single ops' sizes with all its loads at once.
//!
//! Timing writes timestamps at compute-pass boundaries only (all that Metal
//! supports): while [`WgpuBackend::time_ops`] runs, each sample's calls are
//! recorded in one pass of their own, and a call's time is the pass's span
//! over the calls in it.

use turbospark::{DeviceBuffer, Error, Result};

use crate::batch::Launch;
pub(crate) use crate::timing::Timing;
use crate::{WgpuBackend, WgpuBuffer};

/// Loads per thread of `stream_read_fixed` (kernels/bench.wgsl's `PER`).
const STREAM_FIXED_PER: u32 = 8;

impl WgpuBackend {
    /// Whether [`WgpuBackend::time_ops`] can time on the GPU (the adapter has
    /// `TIMESTAMP_QUERY`).
    pub fn has_timestamps(&self) -> bool {
        self.gpu.features.timestamps
    }

    /// GPU time per call, in seconds, of `f` called about `reps` times (call
    /// `i` gets `i < reps`), from timestamp queries at compute-pass
    /// boundaries (all that Metal supports). The calls are recorded in passes
    /// of `reps / 10` consecutive calls each (the remainder is not run), the
    /// way a decode step records its dispatches; one value per pass: its
    /// span over its calls, so the launch gap between
    /// dependent dispatches inside a pass is counted and the host's waits are
    /// not. Work recorded before is submitted first. `Ok(None)` when the
    /// adapter has no timestamps: time with the wall clock around
    /// [`ComputeBackend::sync`] instead.
    ///
    /// [`ComputeBackend::sync`]: turbospark::ComputeBackend::sync
    pub fn time_ops(
        &self,
        reps: usize,
        mut f: impl FnMut(usize) -> Result<()>,
    ) -> Result<Option<Vec<f64>>> {
        if !self.has_timestamps() {
            return Ok(None);
        }
        turbospark::ComputeBackend::flush(self)?;
        self.gpu.batch_lock().timing = Some(Timing::new(&self.gpu.device));
        let per = (reps / 10).max(1);
        let samples = (reps / per).max(1);
        let mut spans = Vec::with_capacity(samples);
        // Dispatches one call records (learnt from the first sample), so a
        // sample never straddles a submit forced by a full parameter arena.
        let mut per_call = 8u64;
        let run = (|| {
            for smp in 0..samples {
                let (queries_full, params_used) = {
                    let b = self.gpu.batch_lock();
                    (
                        b.timing.as_ref().is_some_and(Timing::full),
                        b.params_slots(),
                    )
                };
                if queries_full || params_used + per_call * per as u64 > crate::batch::PARAM_SLOTS {
                    turbospark::ComputeBackend::flush(self)?;
                }
                let (d0, _) = self.counters();
                let start = self.timing_position();
                for j in 0..per {
                    f(smp * per + j)?;
                }
                // End the sample's pass: its end timestamp closes the span.
                self.gpu.batch_lock().end_pass();
                let end = self.timing_position();
                let (d1, _) = self.counters();
                per_call = per_call.max((d1 - d0).div_ceil(per as u64));
                spans.push((start, end));
            }
            turbospark::ComputeBackend::flush(self)
        })();
        let timing = self.gpu.batch_lock().timing.take();
        run?;
        self.gpu.check_errors()?;
        let ticks = timing.map(|t| t.ticks).unwrap_or_default();
        let period_s = self.gpu.queue.get_timestamp_period() as f64 * 1e-9;
        spans
            .iter()
            .map(|&(s, e)| {
                if e <= s {
                    return Ok(0.0);
                }
                let (a, b) = match (ticks.get(s), ticks.get(e - 1)) {
                    (Some(a), Some(b)) => (*a, *b),
                    _ => return Err(Error::Gpu("missing timestamps".into())),
                };
                Ok(b.saturating_sub(a) as f64 * period_s / per as f64)
            })
            .collect::<Result<Vec<f64>>>()
            .map(Some)
    }

    /// Start a per-dispatch GPU profile: until [`WgpuBackend::profile_stop`],
    /// every dispatch runs in a compute pass of its own with timestamps at
    /// its boundaries. False (and nothing changes) without timestamp queries.
    pub fn profile_start(&self) -> Result<bool> {
        if !self.has_timestamps() {
            return Ok(false);
        }
        turbospark::ComputeBackend::flush(self)?;
        let mut t = Timing::new(&self.gpu.device);
        t.labels = Some(Vec::new());
        self.gpu.batch_lock().timing = Some(t);
        Ok(true)
    }

    /// End the profile: `(kernel entry point, seconds)` of every dispatch
    /// since [`WgpuBackend::profile_start`], in order. A pass per dispatch
    /// adds its own overhead, so read the figures as shares of a step.
    pub fn profile_stop(&self) -> Result<Vec<(&'static str, f64)>> {
        turbospark::ComputeBackend::flush(self)?;
        let Some(t) = self.gpu.batch_lock().timing.take() else {
            return Ok(Vec::new());
        };
        self.gpu.check_errors()?;
        let period_s = self.gpu.queue.get_timestamp_period() as f64 * 1e-9;
        Ok(t.labels
            .unwrap_or_default()
            .into_iter()
            .zip(t.ticks.chunks_exact(2))
            .map(|(l, w)| (l, w[1].saturating_sub(w[0]) as f64 * period_s))
            .collect())
    }

    /// Leave out every dispatch of these kernel entry points from now on
    /// (none: stop). A timing ablation for the bench: what a decode step
    /// costs without one kernel, its launches and barriers included, which a
    /// per-dispatch profile cannot show. While any is left out the results
    /// are wrong (the kernels after it read stale buffers): time with it,
    /// then reset the model.
    pub fn omit_dispatches(&self, entries: &[&str]) -> Result<()> {
        turbospark::ComputeBackend::flush(self)?;
        self.gpu.batch_lock().omitted = entries.iter().map(|e| e.to_string()).collect();
        Ok(())
    }

    /// Global index of the next timestamp query of the running timing.
    fn timing_position(&self) -> usize {
        self.gpu
            .batch_lock()
            .timing
            .as_ref()
            .map_or(0, Timing::position)
    }

    /// Record one pass of the bandwidth-ceiling kernel: every thread of a
    /// grid-stride loop reads `src` as `vec4<u32>` and folds it into a value
    /// written to `sink` only if it matches a sentinel (so the reads cannot be
    /// eliminated, and almost nothing is written). `src` must be a u32 buffer
    /// of a multiple of 4 elements; `sink` a u32 buffer of at least 256.
    pub fn stream_read(&self, src: &WgpuBuffer, sink: &WgpuBuffer) -> Result<()> {
        // Enough threads to fill any GPU, each with several loads in flight.
        self.stream("stream_read", &[], src, sink, |vec4s| {
            (vec4s / (256 * 8)).clamp(1, 16384)
        })
    }

    /// Record one pass of `stream_read_fixed`: `src` read once as
    /// `vec4<u32>` with every thread's 8 loads issued together (a constant
    /// trip count), the read a single op of `src`'s size could at best do.
    /// Buffers as [`Self::stream_read`]'s.
    pub fn stream_read_fixed(&self, src: &WgpuBuffer, sink: &WgpuBuffer) -> Result<()> {
        let per = [("PER", STREAM_FIXED_PER as i64)];
        self.stream("stream_read_fixed", &per, src, sink, |vec4s| {
            vec4s.div_ceil(STREAM_FIXED_PER).div_ceil(256)
        })
    }

    /// One launch of the streaming kernel `entry` over `src` (its checks,
    /// parameters and bindings shared), `groups` workgroups for its length
    /// in `vec4<u32>`.
    fn stream(
        &self,
        entry: &'static str,
        constants: &[(&'static str, i64)],
        src: &WgpuBuffer,
        sink: &WgpuBuffer,
        groups: impl Fn(u32) -> u32,
    ) -> Result<()> {
        let (Some(s), Some(k)) = (src.single(), sink.single()) else {
            return Err(Error::shape(entry, "buffers must be single"));
        };
        turbospark::ops::check_buf(entry, "src", src, &turbospark::ops::U32, 4)?;
        turbospark::ops::check_buf(entry, "sink", sink, &turbospark::ops::U32, 256)?;
        let vec4s = (src.len() / 4) as u32;
        let params: [u32; 4] = [vec4s, 0x9e37_79b9, 0, 0];
        self.gpu.launch(Launch {
            kernel: "bench",
            entry,
            constants,
            params: bytemuck::cast_slice(&params),
            buffers: &[(s, true), (k, false)],
            groups: self.gpu.grid(groups(vec4s)),
        })
    }

    /// Largest buffer `stream_read` / `stream_read_fixed` may read, in
    /// bytes: one binding.
    pub fn max_stream_bytes(&self) -> u64 {
        self.gpu.max_binding() & !15
    }
}

#[cfg(test)]
mod tests {
    use crate::tests::{backend, upload_f32};
    use turbospark::{ComputeBackend, DType};

    /// An omitted entry point records nothing and leaves its output as it
    /// was; after `omit_dispatches(&[])` it runs again.
    #[test]
    fn omitted_dispatches_do_not_run() {
        let Some(be) = backend() else { return };
        let (a, b) = (
            upload_f32(&be, &[1.0, 2.0, 3.0], "a"),
            upload_f32(&be, &[10.0, 20.0, 30.0], "b"),
        );
        let out = be.alloc(DType::F32, 3, "out").unwrap();
        be.omit_dispatches(&["add"]).unwrap();
        let before = be.counters().0;
        be.add(&a, &b, &out, 3).unwrap();
        be.flush().unwrap();
        assert_eq!(be.counters().0, before);
        assert_eq!(be.download_f32(&out).unwrap(), [0.0; 3]);
        be.omit_dispatches(&[]).unwrap();
        be.add(&a, &b, &out, 3).unwrap();
        assert_eq!(be.counters().0, before + 1);
        assert_eq!(be.download_f32(&out).unwrap(), [11.0, 22.0, 33.0]);
    }
}
