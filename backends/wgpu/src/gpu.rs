//! The device context the launchers record into: the device and queue,
//! the compiled kernels, the parameter arena, the batch being recorded, the
//! ops' scratch and the readbacks in flight, with the calls every launcher
//! makes (`launch`, `grid`, buffers, readbacks). The launchers
//! (`crate::ops`) take it rather than the whole backend, so the dependency
//! runs one way: the backend (lib.rs) -> the launchers -> this context.

use std::sync::mpsc::channel;
use std::sync::{Arc, Mutex, MutexGuard};

use turbospark::{BackendInfo, DType, Error, ReadTicket, Result};

use crate::batch::{Batch, Launch, Submit, PARAM_SLOT, PARAM_SLOTS};
use crate::buffer::{self, Chunk, WgpuBuffer};
use crate::coop_tiles::CoopTiles;
use crate::device::{self, WgpuOptions};
use crate::features::WgpuFeatures;
use crate::gemm_tiles::Overrides;
use crate::kernels::{self, PipelineKey};
use crate::readback::{self, InFlight, Slot};
use crate::scratch::Scratch;
use crate::timing::Timing;
use crate::{quant, wait};

/// The device and what recording for it holds.
pub(crate) struct Gpu {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    pub(crate) info: BackendInfo,
    pub(crate) features: WgpuFeatures,
    pub(crate) limits: wgpu::Limits,
    pub(crate) cache: kernels::Cache,
    pub(crate) binds: kernels::BindCache,
    /// Storage bytes held (`WgpuBackend::memory`).
    pub(crate) memory: Arc<buffer::MemoryUse>,
    pub(crate) params_layout: wgpu::BindGroupLayout,
    pub(crate) params_buffer: wgpu::Buffer,
    /// One bind group per parameter slot of the arena (static offsets rather
    /// than one bind group with a dynamic offset; docs/decisions.md).
    pub(crate) params_groups: Vec<wgpu::BindGroup>,
    pub(crate) batch: Mutex<Batch>,
    /// Errors wgpu reported outside an error scope (validation, OOM, loss).
    pub(crate) errors: Arc<Mutex<Vec<String>>>,
    /// Scratch kept across calls, created on first use (e.g. attention split-K).
    pub(crate) scratch: Mutex<Scratch>,
    /// Readbacks in flight (`begin_read_u32`, downloads), their staging pool.
    pub(crate) reads: Mutex<readback::Reads>,
    /// The prefill GEMM's tile overrides (`WgpuOptions::gemm_tiles`).
    pub(crate) gemm_tiles: Overrides,
    /// The tensor-core GEMM's tiles (`WgpuOptions::coop_tiles`).
    pub(crate) coop_tiles: CoopTiles,
    /// Rows of x from which a small matmul takes the tiled GEMM
    /// (`WgpuOptions::gemm_from_m`).
    pub(crate) gemm_from_m: usize,
}

impl Gpu {
    /// Open the preferred adapter (see [`WgpuOptions`]).
    pub(crate) fn open(opts: &WgpuOptions) -> Result<Self> {
        let tiles = |opt, var| device::option_or_env(opt, var).unwrap_or_default();
        let o = device::open(opts)?;
        let gemm_tiles = Overrides::parse(
            &tiles(&opts.gemm_tiles, "TURBOSPARK_GEMM_TILES"),
            o.limits.max_compute_workgroup_storage_size,
        )?;
        let coop_tiles = CoopTiles::parse(
            &tiles(&opts.coop_tiles, "TURBOSPARK_COOP_TILES"),
            o.limits.max_compute_workgroup_storage_size,
            o.limits.max_compute_invocations_per_workgroup,
        )?;
        let gemm_from_m = crate::gemm_tiles::gemm_from_m(opts.gemm_from_m)?;
        let errors: Arc<Mutex<Vec<String>>> = Arc::default();
        let sink = errors.clone();
        o.device
            .on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
                sink.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(e.to_string());
            }));
        let lost = errors.clone();
        o.device.set_device_lost_callback(move |reason, msg| {
            lost.lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(format!("device lost ({reason:?}): {msg}"));
        });
        let params_layout = o
            .device
            .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: Some("params"),
                entries: &[wgpu::BindGroupLayoutEntry {
                    binding: 0,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Uniform,
                        has_dynamic_offset: false,
                        min_binding_size: None,
                    },
                    count: None,
                }],
            });
        let params_buffer = o.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("params arena"),
            size: PARAM_SLOT * PARAM_SLOTS,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let params_groups = (0..PARAM_SLOTS)
            .map(|slot| {
                o.device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: Some("params"),
                    layout: &params_layout,
                    entries: &[wgpu::BindGroupEntry {
                        binding: 0,
                        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                            buffer: &params_buffer,
                            offset: slot * PARAM_SLOT,
                            size: wgpu::BufferSize::new(PARAM_SLOT),
                        }),
                    }],
                })
            })
            .collect();
        let subgroups = o.features.subgroups;
        let coherent = o.features.coherent_storage;
        Ok(Gpu {
            device: o.device,
            queue: o.queue,
            info: o.info,
            features: o.features,
            limits: o.limits,
            cache: kernels::Cache::new(subgroups, coherent),
            binds: kernels::BindCache::default(),
            memory: Default::default(),
            params_layout,
            params_buffer,
            params_groups,
            batch: Mutex::new(Batch::default()),
            errors,
            scratch: Mutex::default(),
            reads: Mutex::default(),
            gemm_tiles,
            coop_tiles,
            gemm_from_m,
        })
    }

    /// Turn errors wgpu reported asynchronously into a `Result`.
    pub(crate) fn check_errors(&self) -> Result<()> {
        let mut errs = self.errors.lock().unwrap_or_else(|p| p.into_inner());
        if errs.is_empty() {
            return Ok(());
        }
        let all = std::mem::take(&mut *errs).join("; ");
        Err(if all.contains("device lost") {
            Error::DeviceLost(all)
        } else if all.to_lowercase().contains("out of memory") {
            Error::OutOfMemory(all)
        } else {
            Error::Gpu(all)
        })
    }

    pub(crate) fn create_buffer(
        &self,
        bytes: u64,
        label: &str,
        max_bytes: u64,
        limit_name: &'static str,
    ) -> Result<wgpu::Buffer> {
        self.create_buffer_with(
            bytes,
            label,
            (max_bytes, limit_name),
            wgpu::BufferUsages::empty(),
        )
    }

    /// A storage buffer with `extra` usages beside the usual (`MAP_WRITE`
    /// for mapped expert slots).
    pub(crate) fn create_buffer_with(
        &self,
        bytes: u64,
        label: &str,
        (max_bytes, limit_name): (u64, &'static str),
        extra: wgpu::BufferUsages,
    ) -> Result<wgpu::Buffer> {
        if bytes > max_bytes {
            return Err(Error::DeviceLimit {
                what: format!("buffer `{label}`"),
                bytes,
                limit: max_bytes,
                limit_name,
            });
        }
        // Memory of dropped buffers still held by cached bind groups goes first.
        self.binds.purge();
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let b = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            // wgpu wants sizes in whole words; tensors of odd 16-bit counts are padded.
            size: bytes.div_ceil(4).max(1) * 4,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST
                | extra,
            mapped_at_creation: false,
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(Error::OutOfMemory(format!(
                "buffer `{label}` of {bytes} bytes: {e}"
            )));
        }
        Ok(b)
    }

    pub(crate) fn max_binding(&self) -> u64 {
        self.limits
            .max_storage_buffer_binding_size
            .min(self.limits.max_buffer_size)
    }

    /// `WgpuBuffer::fits_f16` for host bytes being uploaded: scanned only on
    /// a device with the tensor-core GEMM (the only reader).
    pub(crate) fn scan_fits_f16(&self, dtype: DType, bytes: &[u8]) -> bool {
        self.features.tensor_core_gemm && buffer::fits_f16(dtype, bytes)
    }

    /// A storage buffer as rows `start .. start + rows` of a tensor,
    /// counted in [`crate::WgpuBackend::memory`] while it lives.
    pub(crate) fn chunk(&self, buffer: wgpu::Buffer, rows: (usize, usize)) -> Chunk {
        Chunk::new(buffer, rows, self.binds.reaper(), self.memory.clone())
    }

    /// Quantized data is a weight's alone (`upload_weight`,
    /// `upload_experts`): an activation, cache or plain upload of it is
    /// refused by name.
    pub(crate) fn plain(&self, dtype: DType, label: &str) -> Result<()> {
        if dtype.is_quantized() {
            return Err(Error::Unsupported {
                backend: "wgpu".into(),
                op: format!("buffer `{label}`"),
                reason: format!("{dtype} is a weight format: upload it with upload_weight"),
            });
        }
        Ok(())
    }

    /// A quantized weight, split by rows where one binding cannot hold it,
    /// each chunk its rows' own buffer (`quant::chunk`) with `extra` usages;
    /// without bytes `s`, only each chunk's header is written (the rest is
    /// wgpu's zeros until written).
    pub(crate) fn upload_affine(
        &self,
        a: turbospark::quant::Affine,
        (rows, cols): (usize, usize),
        s: Option<&[u8]>,
        (label, extra): (&str, wgpu::BufferUsages),
    ) -> Result<WgpuBuffer> {
        let dtype = DType::Affine(a);
        let len_ok = s.is_none_or(|s| s.len() == dtype.bytes_for(rows * cols));
        if rows == 0 || !a.fits_cols(cols) || !len_ok {
            return Err(Error::shape(
                "upload_weight",
                format!(
                    "`{label}`: {} bytes for {rows} x {cols} {dtype}",
                    s.map_or(0, <[u8]>::len)
                ),
            ));
        }
        let max = self.max_binding() as usize;
        let per = (1..=rows)
            .rev()
            .find(|&n| quant::device_bytes(a, n, cols) <= max)
            .map(|n| {
                if n < rows {
                    rows.div_ceil(rows.div_ceil(n))
                } else {
                    n
                }
            });
        let Some(per) = per else {
            return Err(Error::DeviceLimit {
                what: format!("one row of weight `{label}`"),
                bytes: quant::device_bytes(a, 1, cols) as u64,
                limit: self.max_binding(),
                limit_name: "max_storage_buffer_binding_size",
            });
        };
        let mut chunks = Vec::new();
        for r in (0..rows).step_by(per) {
            let n = per.min(rows - r);
            let name = if n == rows {
                label.to_string()
            } else {
                format!("{label}[rows {r}..{}]", r + n)
            };
            let bytes = s.map(|s| quant::chunk(a, s, (rows, cols), r, n));
            let buffer = self.create_buffer_with(
                quant::device_bytes(a, n, cols) as u64,
                &name,
                (self.max_binding(), "max_storage_buffer_binding_size"),
                extra,
            )?;
            match &bytes {
                Some(b) => self.write_bytes(&buffer, 0, b),
                None => {
                    self.write_bytes(&buffer, 0, bytemuck::cast_slice(&quant::head(a, n * cols)))
                }
            }
            chunks.push(self.chunk(buffer, (r, n)));
        }
        Ok(WgpuBuffer {
            chunks: Arc::new(chunks),
            dtype,
            len: rows * cols,
            fits_f16: self.features.tensor_core_gemm
                && s.is_some_and(|s| quant::fits_f16(a, s, rows * cols)),
            tiles: None,
            host: None,
        })
    }

    pub(crate) fn single_buffer(
        &self,
        dtype: DType,
        len: usize,
        label: &str,
    ) -> Result<WgpuBuffer> {
        self.plain(dtype, label)?;
        let bytes = (len * dtype.size()) as u64;
        let buffer = self.create_buffer(
            bytes,
            label,
            self.max_binding(),
            "max_storage_buffer_binding_size",
        )?;
        Ok(WgpuBuffer {
            chunks: Arc::new(vec![self.chunk(buffer, (0, 1))]),
            dtype,
            len,
            fits_f16: false,
            tiles: None,
            host: None,
        })
    }

    pub(crate) fn write_bytes(&self, buf: &wgpu::Buffer, offset: u64, bytes: &[u8]) {
        // queue.write_buffer wants whole words; pad the tail.
        if bytes.len().is_multiple_of(4) {
            self.queue.write_buffer(buf, offset, bytes);
        } else {
            let mut v = bytes.to_vec();
            v.resize(bytes.len().div_ceil(4) * 4, 0);
            self.queue.write_buffer(buf, offset, &v);
        }
    }

    /// A buffer's bytes: a readback begun and finished at once (the copy
    /// rides in the same submission as the recorded ops).
    pub(crate) fn download_bytes(&self, buf: &WgpuBuffer) -> Result<Vec<u8>> {
        let ticket = self.begin_read(buf, "download")?;
        let mut data = self.finish_read_bytes(ticket)?;
        data.truncate(buf.len * buf.dtype.size());
        Ok(data)
    }

    /// Bytes `at..at + bytes` of a buffer (both multiples of 4, inside it),
    /// read back: only they cross to the host.
    pub(crate) fn download_bytes_range(
        &self,
        buf: &WgpuBuffer,
        at: usize,
        bytes: usize,
        op: &'static str,
    ) -> Result<Vec<u8>> {
        let ticket = self.begin_read_range(buf, (at as u64, bytes as u64), op)?;
        self.finish_read_bytes(ticket)
    }

    pub(crate) fn wait(&self) -> Result<()> {
        self.wait_for(None)?;
        self.check_errors()
    }

    /// Wait until the device has finished `submission` (None: all it was
    /// given), for at most GPU_WAIT: every wait on the device goes through
    /// here, so none is unbounded.
    pub(crate) fn wait_for(&self, submission: Option<wgpu::SubmissionIndex>) -> Result<()> {
        wait::wait_for(&self.device, submission)
    }

    /// What the batch needs of the device to record and submit.
    pub(crate) fn submit(&self) -> Submit<'_> {
        Submit {
            device: &self.device,
            queue: &self.queue,
            params: &self.params_buffer,
            errors: &self.errors,
        }
    }

    pub(crate) fn batch_lock(&self) -> MutexGuard<'_, Batch> {
        self.batch.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Submit what was recorded; errors wgpu reported so far.
    pub(crate) fn flush(&self) -> Result<()> {
        let mut b = self.batch_lock();
        b.submit(&self.submit());
        drop(b);
        self.check_errors()
    }

    /// Submit and wait for the device to finish.
    pub(crate) fn sync(&self) -> Result<()> {
        self.flush()?;
        self.wait()
    }

    /// The compiled pipeline the backend uses for a kernel entry point, for
    /// tools that time a kernel outside the backend (examples/kernel_lab).
    pub(crate) fn pipeline(
        &self,
        kernel: &'static str,
        entry: &'static str,
        constants: &[(&'static str, i64)],
        read_only: &[bool],
    ) -> Result<wgpu::ComputePipeline> {
        let key = kernels::PipelineKey::new(kernel, entry, constants, read_only.iter().copied());
        Ok(self
            .cache
            .get(&self.device, &self.params_layout, &key)?
            .pipeline
            .clone())
    }

    /// Record one dispatch into the current batch.
    pub(crate) fn launch(&self, l: Launch<'_>) -> Result<()> {
        self.launch_ranged(l, &[])
    }

    /// [`Gpu::launch`] with some bindings over a byte range of their buffer
    /// (`(binding, offset, size)`: the offset a multiple of the device's
    /// `min_storage_buffer_offset_alignment`, the range inside the buffer;
    /// the caller checks both), the rest over the whole buffer: a kernel
    /// that reads or writes row 0 then reads or writes the range's row.
    pub(crate) fn launch_ranged(&self, l: Launch<'_>, ranges: &[(u32, u64, u64)]) -> Result<()> {
        debug_assert!(l.params.len() as u64 <= PARAM_SLOT);
        let key = PipelineKey::new(
            l.kernel,
            l.entry,
            l.constants,
            l.buffers.iter().map(|(_, ro)| *ro),
        );
        let pipe = self.cache.get(&self.device, &self.params_layout, &key)?;
        let bind = self
            .binds
            .get(&self.device, &pipe, l.entry, l.buffers, ranges);
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
            b.submit(&self.submit());
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
    pub(crate) fn counters(&self) -> (u64, u64) {
        let b = self.batch.lock().unwrap_or_else(|p| p.into_inner());
        (b.dispatches, b.submits)
    }

    /// Buffer copies recorded into batches so far.
    pub(crate) fn copies(&self) -> u64 {
        self.batch.lock().unwrap_or_else(|p| p.into_inner()).copies
    }

    /// Start copying `buf` back (`op` names the caller in errors).
    pub(crate) fn begin_read(&self, buf: &WgpuBuffer, op: &'static str) -> Result<ReadTicket> {
        let size = buf
            .single()
            .ok_or_else(|| Error::shape(op, "a weight split across bindings"))?
            .size();
        self.begin_read_range(buf, (0, size), op)
    }

    /// [`Gpu::begin_read`] of bytes `at..at + bytes` of the buffer (both
    /// multiples of 4, inside it).
    pub(crate) fn begin_read_range(
        &self,
        buf: &WgpuBuffer,
        (at, bytes): (u64, u64),
        op: &'static str,
    ) -> Result<ReadTicket> {
        let src = buf
            .single()
            .ok_or_else(|| Error::shape(op, "a weight split across bindings"))?
            .clone();
        if at % 4 != 0 || bytes % 4 != 0 || bytes == 0 || at + bytes > src.size() {
            return Err(Error::shape(
                op,
                format!(
                    "bytes {at}..{} of a {}-byte buffer: a readback takes whole words inside it",
                    at + bytes,
                    src.size()
                ),
            ));
        }
        let mut reads = self.reads.lock().unwrap_or_else(|p| p.into_inner());
        // A free slot big enough, else a new one, else the oldest reclaimed.
        let i = match reads
            .slots
            .iter()
            .position(|s| s.busy.is_none() && s.staging.size() >= bytes)
        {
            Some(i) => i,
            None if reads.slots.len() < readback::SLOTS => {
                let staging = readback::staging_buffer(&self.device, bytes);
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
                    reads.slots[oldest].staging = readback::staging_buffer(&self.device, bytes);
                }
                oldest
            }
        };
        let staging = reads.slots[i].staging.clone();
        let submission = self
            .batch
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .submit_with(&self.submit(), |enc| {
                enc.copy_buffer_to_buffer(&src, at, &staging, 0, bytes)
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
