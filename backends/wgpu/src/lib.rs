//! turbospark's wgpu backend: the WGSL kernels of `kernels/` on Metal,
//! Vulkan, DX12 (and Mesa's lavapipe in CI).
//!
//! Ops are recorded as dispatches into one open compute pass; `flush` ends the
//! pass and submits, so a decode step is a single submit. Each op's uniform
//! parameters go into a per-batch arena (one uniform buffer, a bind group
//! per 256-byte slot), so recording allocates no GPU memory.

mod batch;
mod bench;
mod bindings;
mod buffer;
mod coop_tiles;
mod device;
mod expert_slots;
mod expert_tiles;
mod features;
mod gemm_tiles;
mod gpu;
mod host_experts;
pub mod kernels;
mod limits;
mod ops;
mod quant;
mod readback;
mod scratch;
mod timing;
mod wait;

use std::sync::Arc;

use turbospark::ops::{
    self as v, Args, Attention, CopyRange, Embed, KvAppend, Matmul, Moe, OpKind, PostAttention,
    QkvPost, RmsNorm, Rope, Router, SlotLookup,
};
use turbospark::{
    BackendInfo, ComputeBackend, DType, DownArgs, Error, ExpertBytes, ExpertStack, GateUpArgs,
    HostBytes, PostAttentionArgs, PostFfnArgs, ReadTicket, Result, RouterArgs, SlotArgs, SlotWrite,
    Support,
};

pub use buffer::WgpuBuffer;
pub use device::{list_adapters, AdapterSummary, WgpuOptions};
pub use features::WgpuFeatures;
pub use limits::LimitsProfile;
pub use ops::matmul::gemv_constants;
pub use ops::PREFILL_MIN_M;

use gpu::Gpu;

/// A wgpu device with turbospark's kernels.
pub struct WgpuBackend {
    /// The device context the launchers take (`gpu.rs`).
    gpu: Gpu,
}

impl WgpuBackend {
    /// Open the preferred adapter (see [`WgpuOptions`]).
    pub fn new(opts: &WgpuOptions) -> Result<Self> {
        Ok(WgpuBackend {
            gpu: Gpu::open(opts)?,
        })
    }

    /// What the adapter offers that the kernels use (shown to callers of
    /// the trait as `BackendInfo::capabilities`).
    pub fn features(&self) -> &WgpuFeatures {
        &self.gpu.features
    }

    pub fn device(&self) -> &wgpu::Device {
        &self.gpu.device
    }

    pub fn queue(&self) -> &wgpu::Queue {
        &self.gpu.queue
    }

    /// Device bytes held in storage buffers (tensors and the backend's
    /// scratch; not the small uniform and readback buffers): `(now, peak)`,
    /// the peak since the backend opened or [`WgpuBackend::reset_peak_memory`].
    /// A dropped buffer counts as given back at once; wgpu frees it when no
    /// recorded work and no cached bind group holds it any more.
    pub fn memory(&self) -> (u64, u64) {
        self.gpu.memory.get()
    }

    /// Start [`WgpuBackend::memory`]'s peak again from what is held now.
    pub fn reset_peak_memory(&self) {
        self.gpu.memory.reset_peak()
    }

    /// Let go of the ops' scratch buffers (each is made again, as large as
    /// its next use needs): for tools that measure what a model alone holds
    /// after other work on the same backend, whose scratch would otherwise
    /// be held already and left out of the model's peak.
    pub fn release_scratch(&self) {
        *self.gpu.scratch.lock().unwrap_or_else(|e| e.into_inner()) = Default::default();
    }

    /// The limits the device was opened with: the adapter's, or the smaller
    /// of them and a limits profile's (for tools).
    pub fn wgpu_limits(&self) -> &wgpu::Limits {
        &self.gpu.limits
    }

    /// Dispatches recorded and submits made so far (for tools and tests that
    /// check a decode step is one submit).
    pub fn counters(&self) -> (u64, u64) {
        self.gpu.counters()
    }

    /// Buffer copies recorded so far (`copy_range`, `copy_buffer`: each ends
    /// a compute pass), for tests that check a path records none.
    pub fn copies(&self) -> u64 {
        self.gpu.copies()
    }
}

impl WgpuBackend {
    /// The compiled pipeline the backend uses for a kernel entry point, for
    /// tools that time a kernel outside the backend (examples/kernel_lab).
    pub fn pipeline(
        &self,
        kernel: &'static str,
        entry: &'static str,
        constants: &[(&'static str, i64)],
        read_only: &[bool],
    ) -> Result<wgpu::ComputePipeline> {
        self.gpu.pipeline(kernel, entry, constants, read_only)
    }

    /// The device support a qkv_post call needs (its caches' dtype, its
    /// head_dim), alone and inside qkv_post_attention.
    fn require_qkv_post(&self, p: &QkvPost, k_cache: &WgpuBuffer) -> Result<()> {
        const OP: &str = "qkv_post";
        self.require(
            OP,
            OpKind::KvCache {
                dtype: k_cache.dtype,
            },
        )?;
        self.require(
            OP,
            OpKind::QkvPost {
                head_dim: p.head_dim as u32,
            },
        )
    }

    /// `Unsupported` naming the reason when `supports(kind)` says no.
    fn require(&self, op: &'static str, kind: OpKind) -> Result<()> {
        match ComputeBackend::supports(self, &kind) {
            Support::Yes => Ok(()),
            Support::No(reason) => Err(Error::Unsupported {
                backend: self.gpu.info.backend.clone(),
                op: op.into(),
                reason,
            }),
        }
    }

    /// The device support a post_attention call needs (its row), alone and
    /// inside the ops fused with it.
    fn require_post_attention(&self, p: &PostAttention) -> Result<()> {
        let dim = p.dim as u32;
        self.require("post_attention", OpKind::PostAttention { dim })
    }

    /// post_attention_router on checked arguments: fused where it fits,
    /// else the two ops' launches in turn.
    fn run_post_attention_router(
        &self,
        pa: &PostAttentionArgs<'_, WgpuBuffer>,
        r: &RouterArgs<'_, WgpuBuffer>,
    ) -> Result<()> {
        if ops::fused::post_attention_router(&self.gpu, pa, r)? {
            return Ok(());
        }
        let moe = Some(pa.moe);
        ops::fused::post_attention(
            &self.gpu, pa.o, pa.x, pa.w_post, pa.w_ff, pa.r, pa.ff, moe, pa.p,
        )?;
        let (s, proj, pes) = (r.eff_scale, r.proj, r.per_expert_scale);
        ops::moe::router(&self.gpu, pa.r, s, proj, pes, r.ids, r.weights, r.p)
    }
}

impl WgpuBackend {
    /// `upload_weight` of host bytes, its buffers with `extra` usages.
    fn weight(
        &self,
        dtype: DType,
        (rows, cols): (usize, usize),
        s: Option<&[u8]>,
        (label, extra): (&str, wgpu::BufferUsages),
    ) -> Result<WgpuBuffer> {
        if let DType::Affine(a) = dtype {
            return self.gpu.upload_affine(a, (rows, cols), s, (label, extra));
        }
        let row_bytes = cols * dtype.size();
        let len_ok = s.is_none_or(|s| s.len() == rows * row_bytes);
        if !len_ok || rows == 0 || cols == 0 {
            return Err(Error::shape(
                "upload_weight",
                format!(
                    "`{label}`: {} bytes for {rows} x {cols} {dtype}",
                    s.map_or(0, <[u8]>::len)
                ),
            ));
        }
        // Rows per chunk: as many as one binding holds, kept even so every
        // chunk starts on a whole 32-bit word for 16-bit weights.
        let per = ((self.gpu.max_binding() as usize / row_bytes) & !1)
            .max(1)
            .min(rows);
        if (per * row_bytes) as u64 > self.gpu.max_binding() {
            return Err(Error::DeviceLimit {
                what: format!("one row of weight `{label}`"),
                bytes: row_bytes as u64,
                limit: self.gpu.max_binding(),
                limit_name: "max_storage_buffer_binding_size",
            });
        }
        let mut chunks = Vec::new();
        let mut r = 0;
        while r < rows {
            let n = per.min(rows - r);
            let name = if n == rows {
                label.to_string()
            } else {
                format!("{label}[rows {r}..{}]", r + n)
            };
            let buffer = self.gpu.create_buffer_with(
                (n * row_bytes) as u64,
                &name,
                (self.gpu.max_binding(), "max_storage_buffer_binding_size"),
                extra,
            )?;
            if let Some(s) = s {
                self.gpu
                    .write_bytes(&buffer, 0, &s[r * row_bytes..(r + n) * row_bytes]);
            }
            chunks.push(self.gpu.chunk(buffer, (r, n)));
            r += n;
        }
        Ok(WgpuBuffer {
            chunks: Arc::new(chunks),
            dtype,
            len: rows * cols,
            fits_f16: s.is_some_and(|s| self.gpu.scan_fits_f16(dtype, s)),
            tiles: None,
            host: None,
        })
    }

    /// Whether a stack of this shape is held in tile order
    /// (`expert_tiles.rs`): 16-bit experts where `WgpuFeatures::expert_tiles`
    /// is on and the stack fits one binding in whole blocks and chunks.
    fn tiles_stack(&self, dtype: DType, stack: ExpertStack, (rows, cols): (usize, usize)) -> bool {
        !dtype.is_quantized()
            && self.gpu.features.expert_tiles
            && expert_tiles::fits(dtype, stack, rows, cols)
            && (rows * cols * dtype.size()) as u64 <= self.gpu.max_binding()
    }

    /// Tile order (`expert_tiles.rs`) where `WgpuFeatures::expert_tiles` is
    /// on and the stack fits one binding in whole blocks and chunks; else a
    /// row-major weight.
    fn experts(
        &self,
        dtype: DType,
        stack: ExpertStack,
        (rows, cols): (usize, usize),
        s: Option<&[u8]>,
        (label, extra): (&str, wgpu::BufferUsages),
    ) -> Result<WgpuBuffer> {
        let bytes = rows * cols * dtype.size();
        if !self.tiles_stack(dtype, stack, (rows, cols)) || s.is_some_and(|s| s.len() != bytes) {
            return self.weight(dtype, (rows, cols), s, (label, extra));
        }
        let tiled = s.map(|s| expert_tiles::tile_order(s, stack, rows, cols));
        let mut b = self.weight(dtype, (rows, cols), tiled.as_deref(), (label, extra))?;
        b.tiles = Some(stack);
        Ok(b)
    }
}

impl ComputeBackend for WgpuBackend {
    type Buffer = WgpuBuffer;

    fn info(&self) -> &BackendInfo {
        &self.gpu.info
    }

    fn supports(&self, op: &OpKind) -> Support {
        ops::supports(&self.gpu, op)
    }

    fn gemm_rounding(&self) -> Option<turbospark::GemmRounding> {
        // (the GEMMs' rule and attention's, which runs where they are usable)
        let rule: turbospark::GemmRounding = Arc::new(|op: &OpKind, m, k| match op {
            OpKind::Attention { head_dim } => {
                ops::attention_coop::rounds_inputs(m, *head_dim as usize)
            }
            _ => ops::gemm_coop::rounds_inputs(op, m, k),
        });
        ops::gemm_coop::usable(&self.gpu).then_some(rule)
    }

    fn alloc(&self, dtype: DType, len: usize, label: &str) -> Result<WgpuBuffer> {
        self.gpu.single_buffer(dtype, len, label)
    }

    fn upload(&self, dtype: DType, bytes: HostBytes<'_>, label: &str) -> Result<WgpuBuffer> {
        self.gpu.plain(dtype, label)?;
        let s = bytes.as_slice();
        if !s.len().is_multiple_of(dtype.size()) {
            return Err(Error::shape(
                "upload",
                format!(
                    "`{label}`: {} bytes is not a whole number of {dtype}",
                    s.len()
                ),
            ));
        }
        let mut b = self
            .gpu
            .single_buffer(dtype, s.len() / dtype.size(), label)?;
        self.gpu.write_bytes(&b.chunks[0].buffer, 0, s);
        b.fits_f16 = self.gpu.scan_fits_f16(dtype, s);
        Ok(b)
    }

    fn upload_weight(
        &self,
        dtype: DType,
        rows: usize,
        cols: usize,
        bytes: HostBytes<'_>,
        label: &str,
    ) -> Result<WgpuBuffer> {
        let none = wgpu::BufferUsages::empty();
        self.weight(dtype, (rows, cols), Some(bytes.as_slice()), (label, none))
    }

    fn upload_experts(
        &self,
        dtype: DType,
        stack: ExpertStack,
        shape: (usize, usize),
        bytes: HostBytes<'_>,
        label: &str,
    ) -> Result<WgpuBuffer> {
        let none = wgpu::BufferUsages::empty();
        self.experts(dtype, stack, shape, Some(bytes.as_slice()), (label, none))
    }

    /// A stack of zeros, none uploaded (wgpu zeroes a buffer before its
    /// first use; a quantized one's chunk headers are written), in tile
    /// order where `upload_experts` would tile it (a slot's expert is tiled
    /// as it is written), taken by no
    /// tensor-core GEMM: the experts it will hold are not scanned for f16
    /// range. Mappable by the host where `WgpuFeatures::mapped_slots` is
    /// on (`expert_slots.rs` writes misses straight into it).
    fn alloc_experts(
        &self,
        dtype: DType,
        stack: ExpertStack,
        (rows, cols): (usize, usize),
        label: &str,
    ) -> Result<WgpuBuffer> {
        let extra = if self.gpu.features.mapped_slots {
            wgpu::BufferUsages::MAP_WRITE
        } else {
            wgpu::BufferUsages::empty()
        };
        let mut b = self.experts(dtype, stack, (rows, cols), None, (label, extra))?;
        b.fits_f16 = false;
        Ok(b)
    }

    fn write_experts(
        &self,
        buf: &WgpuBuffer,
        dtype: DType,
        stack: ExpertStack,
        shape: (usize, usize),
        writes: &[(usize, ExpertBytes<'_>)],
    ) -> Result<SlotWrite> {
        expert_slots::write_experts(&self.gpu, buf, dtype, stack, shape, writes)
    }

    /// A host store where the slots are not mapped by the host (there a
    /// miss is one copy from the file already) and the device grants the
    /// mappable buffers it takes (`WgpuFeatures::host_store`).
    fn host_experts(
        &self,
        dtype: DType,
        stack: ExpertStack,
        (rows, cols): (usize, usize),
        experts: &[ExpertBytes<'_>],
        label: &str,
    ) -> Result<Option<WgpuBuffer>> {
        if !self.gpu.features.host_store {
            return Ok(None);
        }
        let tiled = self.tiles_stack(dtype, stack, (stack.experts * rows, cols));
        host_experts::host_experts(
            &self.gpu,
            dtype,
            (stack, tiled),
            (rows, cols),
            experts,
            label,
        )
        .map(Some)
    }

    fn copy_experts(
        &self,
        store: &WgpuBuffer,
        buf: &WgpuBuffer,
        dtype: DType,
        stack: ExpertStack,
        shape: (usize, usize),
        copies: &[(usize, usize)],
    ) -> Result<()> {
        host_experts::copy_experts(&self.gpu, store, buf, dtype, stack, shape, copies)
    }

    fn write_f32(&self, buf: &WgpuBuffer, offset: usize, data: &[f32]) -> Result<()> {
        v::check_buf("write_f32", "buf", buf, &v::F32, offset + data.len())?;
        bindings::check(&Args::new("write_f32").plain("buf", buf))?;
        // Ops recorded earlier must see the old contents: submit them first.
        self.gpu.flush()?;
        self.gpu.write_bytes(
            buf.single().expect("activations are one buffer"),
            (offset * 4) as u64,
            bytemuck::cast_slice(data),
        );
        Ok(())
    }

    fn write_u32(&self, buf: &WgpuBuffer, offset: usize, data: &[u32]) -> Result<()> {
        v::check_buf("write_u32", "buf", buf, &v::U32, offset + data.len())?;
        bindings::check(&Args::new("write_u32").plain("buf", buf))?;
        self.gpu.flush()?;
        self.gpu.write_bytes(
            buf.single().expect("id buffers are one buffer"),
            (offset * 4) as u64,
            bytemuck::cast_slice(data),
        );
        Ok(())
    }

    fn record_copy_buffer(&self, src: &WgpuBuffer, dst: &WgpuBuffer) -> Result<()> {
        let (s, d) = (
            src.single().expect("checked whole"),
            dst.single().expect("checked whole"),
        );
        // (one dtype and length: the same padded size, a multiple of 4)
        let bytes = s.size().min(d.size());
        // (no submit of its own: a fork's caches, two buffers a layer, go
        // with the next one)
        self.gpu
            .batch_lock()
            .copy(&self.gpu.submit(), (s, d), (0, 0, bytes));
        Ok(())
    }

    fn record_copy_range(&self, src: &WgpuBuffer, dst: &WgpuBuffer, p: CopyRange) -> Result<()> {
        let (s, d) = (
            src.single().expect("checked whole"),
            dst.single().expect("checked whole"),
        );
        // (four-byte elements: every offset and size is a multiple of
        // COPY_BUFFER_ALIGNMENT)
        let at = |elements: usize| (elements * 4) as u64;
        self.gpu.batch_lock().copy(
            &self.gpu.submit(),
            (s, d),
            (at(p.src_offset), at(p.dst_offset), at(p.len)),
        );
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        self.gpu.flush()
    }

    fn sync(&self) -> Result<()> {
        self.gpu.sync()
    }

    fn download_f32(&self, buf: &WgpuBuffer) -> Result<Vec<f32>> {
        v::check_buf("download_f32", "buf", buf, &v::CACHES, 0)?;
        let bytes = self.gpu.download_bytes(buf)?;
        Ok(match buf.dtype {
            DType::F16 => bytes
                .chunks_exact(2)
                .map(|h| half::f16::from_le_bytes([h[0], h[1]]).to_f32())
                .collect(),
            _ => bytemuck::pod_collect_to_vec(&bytes),
        })
    }

    fn download_f32_range(&self, buf: &WgpuBuffer, start: usize, len: usize) -> Result<Vec<f32>> {
        const OP: &str = "download_f32_range";
        v::check_range(OP, buf, start, len)?;
        if len == 0 {
            return Ok(Vec::new());
        }
        // Copies take whole 4-byte words: an f16 range is widened to them
        // and its first element skipped where it starts mid-word.
        let size = buf.dtype.size();
        let (lo, hi) = (start * size, (start + len) * size);
        let (lo4, hi4) = (lo & !3, hi.next_multiple_of(4));
        let bytes = self.gpu.download_bytes_range(buf, lo4, hi4 - lo4, OP)?;
        let bytes = &bytes[lo - lo4..hi - lo4];
        Ok(match buf.dtype {
            DType::F16 => bytes
                .chunks_exact(2)
                .map(|h| half::f16::from_le_bytes([h[0], h[1]]).to_f32())
                .collect(),
            _ => bytemuck::pod_collect_to_vec(bytes),
        })
    }

    fn download_u32(&self, buf: &WgpuBuffer) -> Result<Vec<u32>> {
        v::check_buf("download_u32", "buf", buf, &v::U32, 0)?;
        Ok(bytemuck::pod_collect_to_vec(&self.gpu.download_bytes(buf)?))
    }

    fn begin_read_u32(&self, buf: &WgpuBuffer) -> Result<ReadTicket> {
        v::check_buf("begin_read_u32", "buf", buf, &v::U32, 0)?;
        self.gpu.begin_read(buf, "begin_read_u32")
    }

    fn finish_read_u32(&self, ticket: ReadTicket) -> Result<Vec<u32>> {
        self.gpu.finish_read(ticket)
    }

    fn check_held(&self, args: &Args<'_, WgpuBuffer>) -> Result<()> {
        bindings::check(args)
    }

    fn record_rms_norm(
        &self,
        x: &WgpuBuffer,
        w: Option<&WgpuBuffer>,
        res: Option<&WgpuBuffer>,
        out: &WgpuBuffer,
        p: RmsNorm,
    ) -> Result<()> {
        ops::norm::rms_norm(&self.gpu, x, w, res, out, p)
    }

    fn record_matmul(
        &self,
        w: &WgpuBuffer,
        x: &WgpuBuffer,
        out: &WgpuBuffer,
        p: Matmul,
    ) -> Result<()> {
        ops::matmul::matmul(&self.gpu, w, x, out, p)
    }

    fn record_router(
        &self,
        x: &WgpuBuffer,
        scale: &WgpuBuffer,
        proj: &WgpuBuffer,
        pes: &WgpuBuffer,
        ids: &WgpuBuffer,
        wts: &WgpuBuffer,
        p: Router,
    ) -> Result<()> {
        ops::moe::router(&self.gpu, x, scale, proj, pes, ids, wts, p)
    }

    fn record_moe_gate_up(
        &self,
        x: &WgpuBuffer,
        gate_up: &WgpuBuffer,
        ids: &WgpuBuffer,
        act: &WgpuBuffer,
        p: Moe,
    ) -> Result<()> {
        ops::moe::moe_gate_up(&self.gpu, x, gate_up, ids, act, p)
    }

    fn record_moe_down(
        &self,
        act: &WgpuBuffer,
        down: &WgpuBuffer,
        ids: &WgpuBuffer,
        wts: &WgpuBuffer,
        out: &WgpuBuffer,
        p: Moe,
    ) -> Result<()> {
        ops::moe::moe_down(&self.gpu, act, down, ids, wts, out, p)
    }

    fn record_moe_gate_up_pair(
        &self,
        a: GateUpArgs<'_, WgpuBuffer>,
        b: GateUpArgs<'_, WgpuBuffer>,
    ) -> Result<()> {
        ops::moe::moe_gate_up_pair(&self.gpu, &a, &b)
    }

    fn record_moe_down_pair(
        &self,
        a: DownArgs<'_, WgpuBuffer>,
        b: DownArgs<'_, WgpuBuffer>,
    ) -> Result<()> {
        ops::moe::moe_down_pair(&self.gpu, &a, &b)
    }

    fn record_rope(&self, x: &WgpuBuffer, positions: &WgpuBuffer, p: Rope) -> Result<()> {
        ops::attention::rope(&self.gpu, x, positions, p)
    }

    fn record_kv_append(
        &self,
        k: &WgpuBuffer,
        vb: &WgpuBuffer,
        kc: &WgpuBuffer,
        vc: &WgpuBuffer,
        positions: &WgpuBuffer,
        p: KvAppend,
    ) -> Result<()> {
        self.require("kv_append", OpKind::KvCache { dtype: kc.dtype })?;
        ops::attention::kv_append(&self.gpu, k, vb, kc, vc, positions, p)
    }

    fn record_attention(
        &self,
        q: &WgpuBuffer,
        kc: &WgpuBuffer,
        vc: &WgpuBuffer,
        positions: &WgpuBuffer,
        out: &WgpuBuffer,
        p: Attention,
    ) -> Result<()> {
        self.require("attention", OpKind::KvCache { dtype: kc.dtype })?;
        ops::attention::attention(&self.gpu, q, kc, vc, positions, out, p)
    }

    fn record_add(&self, a: &WgpuBuffer, b: &WgpuBuffer, out: &WgpuBuffer, n: usize) -> Result<()> {
        ops::elementwise::add(&self.gpu, a, b, out, n)
    }

    fn record_scale(&self, x: &WgpuBuffer, out: &WgpuBuffer, n: usize, s: f32) -> Result<()> {
        ops::elementwise::scale(&self.gpu, x, out, n, s)
    }

    fn record_gelu_mul(
        &self,
        x: &WgpuBuffer,
        out: &WgpuBuffer,
        rows: usize,
        n: usize,
    ) -> Result<()> {
        ops::elementwise::gelu_mul(&self.gpu, x, out, rows, n)
    }

    fn record_softcap(&self, x: &WgpuBuffer, out: &WgpuBuffer, n: usize, cap: f32) -> Result<()> {
        ops::elementwise::softcap(&self.gpu, x, out, n, cap)
    }

    fn record_embed(
        &self,
        ids: &WgpuBuffer,
        table: &WgpuBuffer,
        out: &WgpuBuffer,
        p: Embed,
    ) -> Result<()> {
        ops::elementwise::embed(&self.gpu, ids, table, out, p)
    }

    fn record_argmax(&self, x: &WgpuBuffer, out: &WgpuBuffer, rows: usize, n: usize) -> Result<()> {
        ops::elementwise::argmax(&self.gpu, x, out, rows, n)
    }

    fn record_slot_lookup(
        &self,
        ids: &WgpuBuffer,
        table: &WgpuBuffer,
        slot_ids: &WgpuBuffer,
        log: &WgpuBuffer,
        p: SlotLookup,
    ) -> Result<()> {
        ops::elementwise::slot_lookup(&self.gpu, ids, table, slot_ids, log, p)
    }

    fn record_post_attention(
        &self,
        o: &WgpuBuffer,
        x: &WgpuBuffer,
        w_post: &WgpuBuffer,
        w_ff: &WgpuBuffer,
        r: &WgpuBuffer,
        ff: &WgpuBuffer,
        moe: Option<(&WgpuBuffer, &WgpuBuffer)>,
        p: PostAttention,
    ) -> Result<()> {
        self.require_post_attention(&p)?;
        ops::fused::post_attention(&self.gpu, o, x, w_post, w_ff, r, ff, moe, p)
    }

    fn record_post_attention_router(
        &self,
        pa: PostAttentionArgs<'_, WgpuBuffer>,
        router: RouterArgs<'_, WgpuBuffer>,
    ) -> Result<()> {
        self.require_post_attention(&pa.p)?;
        self.run_post_attention_router(&pa, &router)
    }

    fn record_post_attention_gate_up(
        &self,
        (pa, router): (
            PostAttentionArgs<'_, WgpuBuffer>,
            RouterArgs<'_, WgpuBuffer>,
        ),
        dense: GateUpArgs<'_, WgpuBuffer>,
        routed: GateUpArgs<'_, WgpuBuffer>,
    ) -> Result<()> {
        self.require_post_attention(&pa.p)?;
        if ops::fused::post_attention_gate_up(&self.gpu, (&pa, &router), &dense, &routed)? {
            return Ok(());
        }
        self.run_post_attention_router(&pa, &router)?;
        ops::moe::moe_gate_up_pair(&self.gpu, &dense, &routed)
    }

    fn record_post_attention_gate_up_slots(
        &self,
        (pa, router): (
            PostAttentionArgs<'_, WgpuBuffer>,
            RouterArgs<'_, WgpuBuffer>,
        ),
        dense: GateUpArgs<'_, WgpuBuffer>,
        routed: GateUpArgs<'_, WgpuBuffer>,
        lookup: SlotArgs<'_, WgpuBuffer>,
    ) -> Result<()> {
        self.require_post_attention(&pa.p)?;
        let route = ops::SlotRoute {
            table: lookup.table,
            log: lookup.log,
            slot_ids: routed.ids,
            ranked: lookup.p.experts,
            log_at: lookup.p.at,
        };
        let gpu = &self.gpu;
        if ops::fused::post_attention_gate_up_slotted(gpu, (&pa, &router), &dense, &routed, &route)?
        {
            return Ok(());
        }
        self.run_post_attention_router(&pa, &router)?;
        let l = lookup;
        ops::elementwise::slot_lookup(gpu, router.ids, l.table, routed.ids, l.log, l.p)?;
        ops::moe::moe_gate_up_pair(gpu, &dense, &routed)
    }

    fn record_post_ffn(&self, a: PostFfnArgs<'_, WgpuBuffer>) -> Result<()> {
        let dim = a.p.dim as u32;
        self.require("post_ffn", OpKind::PostFfn { dim })?;
        ops::fused::post_ffn(&self.gpu, &a)
    }

    fn record_qkv_post(
        &self,
        raw: &WgpuBuffer,
        w_q: &WgpuBuffer,
        w_k: &WgpuBuffer,
        positions: &WgpuBuffer,
        q: &WgpuBuffer,
        k_cache: &WgpuBuffer,
        v_cache: &WgpuBuffer,
        p: QkvPost,
    ) -> Result<()> {
        self.require_qkv_post(&p, k_cache)?;
        ops::attention::qkv_post(&self.gpu, raw, w_q, w_k, positions, q, k_cache, v_cache, p)
    }

    fn record_qkv_post_attention(
        &self,
        raw: &WgpuBuffer,
        w_q: &WgpuBuffer,
        w_k: &WgpuBuffer,
        positions: &WgpuBuffer,
        q: &WgpuBuffer,
        k_cache: &WgpuBuffer,
        v_cache: &WgpuBuffer,
        out: &WgpuBuffer,
        qp: QkvPost,
        ap: Attention,
    ) -> Result<()> {
        // (attention's own support is the caches', which qkv_post's covers)
        self.require_qkv_post(&qp, k_cache)?;
        let d = ops::attention::DecodeStep {
            raw,
            w: (w_q, w_k),
            pos: positions,
            q,
            kv: (k_cache, v_cache),
            out,
            qp,
            p: ap,
        };
        ops::attention::qkv_attention(&self.gpu, &d)
    }

    fn record_qkv_post_attention_row(
        &self,
        row: usize,
        raw: &WgpuBuffer,
        w_q: &WgpuBuffer,
        w_k: &WgpuBuffer,
        positions: &WgpuBuffer,
        q: &WgpuBuffer,
        k_cache: &WgpuBuffer,
        v_cache: &WgpuBuffer,
        out: &WgpuBuffer,
        scratch: (&WgpuBuffer, &WgpuBuffer),
        qp: QkvPost,
        ap: Attention,
    ) -> Result<()> {
        self.require_qkv_post(&qp, k_cache)?;
        let d = ops::attention::DecodeStep {
            raw,
            w: (w_q, w_k),
            pos: positions,
            q,
            kv: (k_cache, v_cache),
            out,
            qp,
            p: ap,
        };
        if ops::attention::qkv_attention_row(&self.gpu, row, &d)? {
            return Ok(());
        }
        turbospark::backend::qkv_post_attention_row_by_copies(
            self, row, raw, w_q, w_k, positions, q, k_cache, v_cache, out, scratch, qp, ap,
        )
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// `v` uploaded as a u32 buffer.
    pub(crate) fn upload_u32(be: &WgpuBackend, v: &[u32], label: &str) -> WgpuBuffer {
        be.upload(DType::U32, HostBytes::Slice(bytemuck::cast_slice(v)), label)
            .unwrap()
    }

    /// `v` uploaded as an f32 buffer.
    pub(crate) fn upload_f32(be: &WgpuBackend, v: &[f32], label: &str) -> WgpuBuffer {
        be.upload(DType::F32, HostBytes::Slice(bytemuck::cast_slice(v)), label)
            .unwrap()
    }

    /// The backend on the default adapter for the crate's own tests; None
    /// (skip) without one, except under `CI=true`, where that fails. An
    /// adapter that cannot open as asked (e.g. `TURBOSPARK_TENSOR_CORES=1`
    /// without tensor cores) fails everywhere.
    pub(crate) fn backend() -> Option<WgpuBackend> {
        backend_with(&WgpuOptions::default())
    }

    /// [`backend`] with options (the same skip / CI rule).
    pub(crate) fn backend_with(opts: &WgpuOptions) -> Option<WgpuBackend> {
        match WgpuBackend::new(opts) {
            Ok(b) => Some(b),
            Err(e @ Error::NoAdapter(_)) if std::env::var("CI").is_ok_and(|v| v == "true") => {
                panic!("CI=true but no wgpu adapter: {e}")
            }
            Err(e @ Error::NoAdapter(_)) => {
                eprintln!("skipping: {e}");
                None
            }
            Err(e) => panic!("the wgpu backend does not open as asked: {e}"),
        }
    }

    /// The storage byte count follows allocations and drops; its peak stays
    /// until reset.
    #[test]
    fn memory_counts_storage_buffers() {
        let Some(be) = backend() else { return };
        let (live0, _) = be.memory();
        let a = be.alloc(DType::F32, 1000, "a").unwrap();
        let b = be.alloc(DType::BF16, 3, "b").unwrap();
        // (sizes round up to whole words)
        assert_eq!(be.memory(), (live0 + 4000 + 8, live0 + 4000 + 8));
        drop(a);
        assert_eq!(be.memory(), (live0 + 8, live0 + 4008));
        be.reset_peak_memory();
        assert_eq!(be.memory(), (live0 + 8, live0 + 8));
        drop(b);
        assert_eq!(be.memory().0, live0);
    }

    /// Released scratch leaves the byte count, and is made again on use.
    #[test]
    fn released_scratch_leaves_the_count() {
        let Some(be) = backend() else { return };
        let (live0, _) = be.memory();
        let get =
            || ops::scratch_buffer(&be.gpu, |s| &mut s.router, DType::F32, 1000, 0, "t").unwrap();
        drop(get());
        assert_eq!(be.memory().0, live0 + 4000, "the scratch stays held");
        be.release_scratch();
        assert_eq!(be.memory().0, live0);
        drop(get());
        assert_eq!(be.memory().0, live0 + 4000);
    }

    /// The bind-group cache reuses a group for the same buffers and lets go
    /// of a dropped buffer's groups before the next allocation.
    #[test]
    fn bind_groups_are_reused_and_released() {
        let Some(be) = backend() else { return };
        let a = be.alloc(DType::F32, 64, "a").unwrap();
        let b = be.alloc(DType::F32, 64, "b").unwrap();
        let out = be.alloc(DType::F32, 64, "out").unwrap();
        be.add(&a, &b, &out, 64).unwrap();
        be.add(&a, &b, &out, 64).unwrap();
        be.sync().unwrap();
        assert_eq!(
            be.gpu.binds.len(),
            1,
            "the same buffers share one bind group"
        );
        drop(a);
        let _c = be.alloc(DType::F32, 64, "c").unwrap();
        assert_eq!(
            be.gpu.binds.len(),
            0,
            "a dropped buffer's bind group is released"
        );
    }
}
