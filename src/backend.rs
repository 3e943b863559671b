//! `ComputeBackend`: the one seam between the model and a device.
//!
//! A backend plays two roles (as in candle's `BackendDevice`/`BackendStorage`
//! and ggml's device/buffer split): it owns device buffers (allocate, upload,
//! download) and it records operations on them. Operations are *recorded*
//! into a batch and submitted together by [`ComputeBackend::flush`] (a decode
//! step is one submit, not one per op); a download flushes and waits.
//!
//! Conventions every op follows:
//! - activations are f32, ids and positions u32; weights are `BF16`, `F16` or
//!   `F32` and are decoded to f32 in the kernel; accumulation is f32;
//! - an output never aliases an input of the same op (in-place ops name the
//!   buffer once);
//! - every op checks its arguments (shapes, dtypes, aliasing: its contract
//!   in [`crate::ops`]) in the trait itself, then calls the backend's
//!   `record_*` hook for it: a backend implements the hooks, never the checks,
//!   so every backend rejects the same bad calls with the same error before
//!   any of its own code runs (as candle's `Tensor` checks before it calls a
//!   backend's storage, and ggml's graph builder before its backends); the
//!   contract names the arguments by role, so that a backend's rule on how
//!   it holds buffers ([`ComputeBackend::check_held`]) is one function;
//! - a case a backend does not implement returns [`Error::Unsupported`](crate::Error::Unsupported)
//!   (see [`ComputeBackend::supports`]), never a silent fallback.

use std::sync::Arc;

use crate::dtype::DType;
use crate::error::Result;
use crate::ops::*;
use crate::precision::Precision;

/// Which GEMMs run from inputs rounded to f16: true for an op (`Matmul`,
/// `MoeGateUp`, `MoeDown`) of `m` rows reducing over `k` that does. The
/// rounding, wherever it is applied: each row of x is scaled by the power
/// of two that puts its largest |x| in [2^14, 2^15), rounded to f16 (to
/// nearest) and scaled back; weights are rounded to f16 (exact for f16
/// weights, and for bf16 ones within f16's normal range). A weight with a
/// value past f16's range (65504) is not rounded, and its product stays f32.
///
/// `Attention` (`k` = head_dim) of `m` query rows may be named too: then
/// its queries and keys are rounded by row (one head's head_dim values) as
/// x is above, its values are rounded to f16 as they are (a row whose
/// largest |v| reaches 2^15 first scaled down by the power of two that puts
/// it in [2^14, 2^15), the probabilities that multiply it scaled up by the
/// same), and each probability (softmax in f32, times that factor) is
/// rounded to f16 before it multiplies; sums stay f32.
///
/// "Rounded to f16" is one rounding under [`Precision::Fast`]; under
/// [`Precision::Exact`] (each op's `precision`: [`crate::ops::Matmul`],
/// [`crate::ops::Moe`], [`crate::ops::Attention`]) each such value is
/// split after the same scale into `hi = f16(v)` and `lo = f16(v - hi)`
/// (`lo` zero below f16's smallest normal, 2^-14) and computed as `hi + lo`.
pub type GemmRounding = Arc<dyn Fn(&OpKind, usize, usize) -> bool + Send + Sync>;

/// What kind of device a backend runs on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceType {
    Cpu,
    DiscreteGpu,
    IntegratedGpu,
    VirtualGpu,
    /// A GPU API implemented on the CPU (Mesa lavapipe, WARP).
    SoftwareGpu,
    Other,
}

/// Name, capabilities and limits of the device behind a backend.
#[derive(Clone, Debug)]
pub struct BackendInfo {
    /// Backend family: `"cpu"` or `"wgpu"`.
    pub backend: String,
    /// Adapter name (`"NVIDIA H200"`, `"llvmpipe (LLVM 15.0.6, 256 bits)"`).
    pub device_name: String,
    /// Graphics API under wgpu (`"Vulkan"`, `"Metal"`, `"Dx12"`), or `"native"`.
    pub api: String,
    pub device_type: DeviceType,
    /// Driver name and version where the API reports them.
    pub driver: String,
    /// What the device offers that the backend uses, in the backend's own
    /// terms, as `(name, value)` pairs for display (`turbospark info`, bench
    /// reports), e.g. `("shader_f16", "yes")`; a backend's own type holds
    /// them for its code (the wgpu backend's `WgpuFeatures`). Nothing outside
    /// a backend decides on them: what the model and the tests need to know
    /// goes through the trait ([`ComputeBackend::supports`],
    /// [`ComputeBackend::gemm_rounding`]).
    pub capabilities: Vec<(String, String)>,
    pub limits: Limits,
}

#[derive(Clone, Debug)]
pub struct Limits {
    /// Largest single storage binding, in bytes.
    pub max_binding_bytes: u64,
    /// Largest single buffer, in bytes.
    pub max_buffer_bytes: u64,
    pub max_workgroups_per_dim: u32,
}

/// What [`ComputeBackend::upload_experts`] is told about a stack of expert
/// matrices: how many, and whether each is a gate_up matrix (its gate rows,
/// then the up rows of the same features) or a down one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpertStack {
    pub experts: usize,
    pub gate_up: bool,
}

/// One expert of a stack, as [`ComputeBackend::write_experts`] takes it:
/// the bytes [`ComputeBackend::upload_experts`] takes for a stack of this
/// expert alone, in up to three parts. A float expert is one part, its rows;
/// an affine one three (packed words, scales, biases: the regions
/// [`crate::quant::Affine::split`] names), each part given as slices laid
/// end to end (a gate_up expert stored as separate gate and up tensors is its
/// gate slice, then its up slice).
#[derive(Clone, Debug, Default)]
pub struct ExpertBytes<'a> {
    pub parts: [Vec<&'a [u8]>; 3],
}

impl ExpertBytes<'_> {
    /// Bytes of part `i`.
    pub fn part_len(&self, i: usize) -> usize {
        self.parts[i].iter().map(|s| s.len()).sum()
    }

    /// Bytes of every part.
    pub fn len(&self) -> usize {
        (0..3).map(|i| self.part_len(i)).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Part `i` gathered into `out` (cleared first).
    pub fn gather(&self, i: usize, out: &mut Vec<u8>) {
        out.clear();
        for s in &self.parts[i] {
            out.extend_from_slice(s);
        }
    }
}

/// How a backend's [`ComputeBackend::write_experts`] moved a miss's bytes
/// into its slot (`StreamStats::write_path`, `bench --stream-slots`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotWrite {
    /// The slot is host memory: one copy from the mapping into it (CPU).
    Host,
    /// Into staging memory, which the device then copies into the slot:
    /// one host copy and one device copy.
    Staged,
    /// Into the slot itself, mapped into the host's address space (unified
    /// memory): one host copy, no staging and no device copy.
    Mapped,
    /// By the device from a copy of every expert in host memory it reads
    /// ([`ComputeBackend::host_experts`]): no host copy a miss.
    Device,
}

impl SlotWrite {
    pub fn name(self) -> &'static str {
        match self {
            SlotWrite::Host => "host",
            SlotWrite::Staged => "staged",
            SlotWrite::Mapped => "mapped",
            SlotWrite::Device => "device",
        }
    }
}

impl ExpertStack {
    /// Byte ranges of expert `slot`'s parts (see [`ExpertBytes`]) in a
    /// stack of this many experts laid out as `upload_experts` takes it:
    /// `dtype` elements, `rows` rows of `cols` for the whole stack. Empty
    /// ranges for the parts a float expert lacks.
    pub fn part_ranges(
        &self,
        dtype: DType,
        (rows, cols): (usize, usize),
        slot: usize,
    ) -> Result<[std::ops::Range<usize>; 3]> {
        if self.experts == 0 || rows % self.experts != 0 || slot >= self.experts {
            return Err(crate::Error::shape(
                "write_experts",
                format!(
                    "slot {slot} of a {}-expert stack of {rows} rows",
                    self.experts
                ),
            ));
        }
        let per = rows / self.experts * cols;
        Ok(match dtype {
            DType::Affine(a) => {
                let (one, all) = (a.layout(per), a.layout(per * self.experts));
                let part = |at: usize, n: usize| at + slot * n..at + (slot + 1) * n;
                let sb = per / a.group as usize * a.scales.size();
                [
                    part(0, one.words * 4),
                    part(all.scales, sb),
                    part(all.biases, sb),
                ]
            }
            d => {
                let n = d.bytes_for(per);
                [slot * n..(slot + 1) * n, 0..0, 0..0]
            }
        })
    }

    /// What every backend's `write_experts` checks first: the buffer
    /// (`buf_dtype`, `buf_len` elements) is a `dtype` stack of this shape,
    /// each write's parts are its slot's sizes, and no slot is written
    /// twice. The byte ranges of each write's parts
    /// ([`ExpertStack::part_ranges`]).
    pub fn check_writes(
        &self,
        (buf_dtype, buf_len): (DType, usize),
        dtype: DType,
        (rows, cols): (usize, usize),
        writes: &[(usize, ExpertBytes<'_>)],
    ) -> Result<Vec<[std::ops::Range<usize>; 3]>> {
        if buf_dtype != dtype || buf_len != rows * cols {
            return Err(crate::Error::shape(
                "write_experts",
                format!(
                    "a {buf_dtype} buffer of {buf_len} elements is not a {dtype} stack of {} \
                     experts, {rows} x {cols}",
                    self.experts
                ),
            ));
        }
        // (a slot written twice in one call would be ambiguous)
        if let Some((i, (slot, _))) = writes
            .iter()
            .enumerate()
            .find(|(i, (slot, _))| writes[..*i].iter().any(|w| w.0 == *slot))
        {
            return Err(crate::Error::shape(
                "write_experts",
                format!("write {i} is to slot {slot} again"),
            ));
        }
        writes
            .iter()
            .map(|(slot, bytes)| {
                let ranges = self.part_ranges(dtype, (rows, cols), *slot)?;
                for (i, r) in ranges.iter().enumerate() {
                    if bytes.part_len(i) != r.len() {
                        return Err(crate::Error::shape(
                            "write_experts",
                            format!(
                                "part {i} of slot {slot}: {} bytes for {}",
                                bytes.part_len(i),
                                r.len()
                            ),
                        ));
                    }
                }
                Ok(ranges)
            })
            .collect()
    }
}

/// Host bytes to upload: a borrowed slice, or a range of a memory map that a
/// backend may keep without copying (the CPU backend does).
#[derive(Clone)]
pub enum HostBytes<'a> {
    Slice(&'a [u8]),
    /// Bytes made on the host (a quantized weight assembled from its
    /// checkpoint tensors).
    Owned(Arc<Vec<u8>>),
    Mapped {
        map: Arc<memmap2::Mmap>,
        offset: usize,
        len: usize,
    },
}

impl HostBytes<'_> {
    pub fn as_slice(&self) -> &[u8] {
        match self {
            HostBytes::Slice(s) => s,
            HostBytes::Owned(v) => v,
            HostBytes::Mapped { map, offset, len } => &map[*offset..*offset + *len],
        }
    }
}

pub use crate::device_buffer::DeviceBuffer;

/// A readback begun by [`ComputeBackend::begin_read_u32`].
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct ReadTicket(pub u64);

/// Whether a backend implements an op case.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Support {
    Yes,
    No(String),
}

/// The operations a Gemma 4 MoE decoder needs, recorded on device buffers.
///
/// Shapes are row-major; `[m, n]` means m rows of n contiguous elements.
pub trait ComputeBackend {
    type Buffer: DeviceBuffer;

    fn info(&self) -> &BackendInfo;

    /// Whether `op` is implemented for these types/sizes on this device.
    fn supports(&self, op: &OpKind) -> Support;

    /// The rule naming the GEMMs this backend runs from inputs rounded to
    /// f16 (on tensor cores, say); None when it runs none. Each such product
    /// differs from f32 arithmetic by that rounding (at most
    /// [`crate::parity::F16_INPUT_NMSE`] of NMSE); a model's output
    /// compounds it over its layers, so model-level tests compare such a
    /// backend with a CPU reference given the same rule
    /// (`CpuBackend::rounding_gemm_inputs_as`) rather than allow for it.
    fn gemm_rounding(&self) -> Option<GemmRounding> {
        None
    }

    /// Whether `precision` computes at the f32 floor here: exact always;
    /// fast too where no product runs on f16 matrix units
    /// ([`ComputeBackend::gemm_rounding`] is None).
    fn is_exact(&self, precision: Precision) -> bool {
        precision == Precision::Exact || self.gemm_rounding().is_none()
    }

    /// Whether the backend runs `op` (an `m`-row problem reducing over `k`)
    /// from f16-rounded inputs: [`ComputeBackend::gemm_rounding`]'s answer.
    fn rounds_gemm_inputs(&self, op: &OpKind, m: usize, k: usize) -> bool {
        self.gemm_rounding().is_some_and(|rule| rule(op, m, k))
    }

    // ---- buffers -------------------------------------------------------

    /// A buffer of `len` elements whose contents are unspecified until written.
    fn alloc(&self, dtype: DType, len: usize, label: &str) -> Result<Self::Buffer>;

    /// A buffer initialised from host bytes (`bytes.len() == len * dtype.size()`).
    fn upload(&self, dtype: DType, bytes: HostBytes<'_>, label: &str) -> Result<Self::Buffer>;

    /// A weight matrix of `rows x cols` (3-D expert tensors pass `E * rows`).
    /// Unlike [`ComputeBackend::upload`] it may exceed one binding: a backend
    /// may split it by rows across bindings (a large vocabulary's LM head
    /// may not fit one).
    fn upload_weight(
        &self,
        dtype: DType,
        rows: usize,
        cols: usize,
        bytes: HostBytes<'_>,
        label: &str,
    ) -> Result<Self::Buffer>;

    /// A layer's expert matrices stacked by rows (`stack.experts` of `rows /
    /// stack.experts` rows each; gate_up: each expert's gate rows then its
    /// up rows), read only by the MoE ops. A backend may store them in an
    /// order of its own that its MoE kernels read (the wgpu backend's tile
    /// order, docs/decisions.md); by default they
    /// are a weight like any other.
    fn upload_experts(
        &self,
        dtype: DType,
        stack: ExpertStack,
        (rows, cols): (usize, usize),
        bytes: HostBytes<'_>,
        label: &str,
    ) -> Result<Self::Buffer> {
        let _ = stack;
        self.upload_weight(dtype, rows, cols, bytes, label)
    }

    /// A stack of `stack.experts` expert slots, each to be filled by
    /// [`ComputeBackend::write_experts`] (the streamed experts' device
    /// slots); `rows` counts every slot's rows. Contents until written are
    /// finite but unspecified. By default: [`ComputeBackend::upload_experts`]
    /// of zeros.
    fn alloc_experts(
        &self,
        dtype: DType,
        stack: ExpertStack,
        (rows, cols): (usize, usize),
        label: &str,
    ) -> Result<Self::Buffer> {
        let zeros = vec![0u8; dtype.bytes_for(rows * cols)];
        self.upload_experts(dtype, stack, (rows, cols), HostBytes::Slice(&zeros), label)
    }

    /// Overwrite each `(slot, expert)` of `writes` (a layer's misses) in a
    /// stack made by [`ComputeBackend::alloc_experts`] (or
    /// `upload_experts`) with the same `dtype`, `stack` and whole-stack
    /// shape `(rows, cols)`, from the experts' bytes ([`ExpertStack::check_writes`]
    /// checks them). Ordered like [`ComputeBackend::write_f32`]. Returns
    /// the path the bytes took. A backend that cannot says so for
    /// [`OpKind::ExpertSlots`] and here.
    fn write_experts(
        &self,
        buf: &Self::Buffer,
        dtype: DType,
        stack: ExpertStack,
        shape: (usize, usize),
        writes: &[(usize, ExpertBytes<'_>)],
    ) -> Result<SlotWrite> {
        let _ = (buf, stack, shape, writes);
        Err(crate::Error::Unsupported {
            backend: self.info().backend.clone(),
            op: format!("write_experts ({dtype})"),
            reason: "the backend does not stream experts into slots".into(),
        })
    }

    /// Every expert of a layer's stack (`experts[e]` is expert e, of
    /// `(rows, cols)` each, in `dtype`) copied once into host memory the
    /// device reads, for [`ComputeBackend::copy_experts`] to move misses
    /// into slots with the device's own copies, no host copy a miss. None
    /// where the backend has no such memory or no gain from it (the
    /// default; the CPU reference's slots are host memory already, and a
    /// stack the host maps is written straight from the file).
    fn host_experts(
        &self,
        dtype: DType,
        stack: ExpertStack,
        expert: (usize, usize),
        experts: &[ExpertBytes<'_>],
        label: &str,
    ) -> Result<Option<Self::Buffer>> {
        let _ = (dtype, stack, expert, experts, label);
        Ok(None)
    }

    /// Copy each `(slot, expert)` of `copies` from `store` (made by
    /// [`ComputeBackend::host_experts`]) into its slot of `buf` (made by
    /// [`ComputeBackend::alloc_experts`] with the same `dtype`, `stack`
    /// and whole-stack shape `(rows, cols)`), recorded like an op: after the
    /// ops recorded before it (which read the slots' old experts), before
    /// those after it.
    fn copy_experts(
        &self,
        store: &Self::Buffer,
        buf: &Self::Buffer,
        dtype: DType,
        stack: ExpertStack,
        shape: (usize, usize),
        copies: &[(usize, usize)],
    ) -> Result<()> {
        let _ = (store, buf, stack, shape, copies);
        Err(crate::Error::Unsupported {
            backend: self.info().backend.clone(),
            op: format!("copy_experts ({dtype})"),
            reason: "the backend keeps no experts in host memory".into(),
        })
    }

    /// Overwrite `data.len()` f32 elements from element `offset`. Ordered after
    /// every op recorded before it and before every op recorded after it.
    fn write_f32(&self, buf: &Self::Buffer, offset: usize, data: &[f32]) -> Result<()>;
    /// As [`ComputeBackend::write_f32`] for u32 buffers.
    fn write_u32(&self, buf: &Self::Buffer, offset: usize, data: &[u32]) -> Result<()>;

    /// Copy every element of `src` into `dst` (same dtype and length, not
    /// the same storage): a sequence forked from another's prefix takes its
    /// KV caches this way. Ordered like [`ComputeBackend::write_f32`]. The
    /// checks run here, then [`ComputeBackend::record_copy_buffer`].
    fn copy_buffer(&self, src: &Self::Buffer, dst: &Self::Buffer) -> Result<()> {
        self.check_held(&crate::ops::check_copy(src, dst)?)?;
        self.record_copy_buffer(src, dst)
    }
    /// [`ComputeBackend::copy_buffer`] after its checks.
    fn record_copy_buffer(&self, src: &Self::Buffer, dst: &Self::Buffer) -> Result<()>;

    /// Copy `p.len` elements of `src` from element `p.src_offset` into `dst`
    /// from element `p.dst_offset` (f32 or u32, one dtype, not the same
    /// storage), recorded like an op: after the ops recorded before it,
    /// before those after it. A batched decode step moves each sequence's
    /// row of q|k|v to its attention and the result back this way.
    fn copy_range(&self, src: &Self::Buffer, dst: &Self::Buffer, p: CopyRange) -> Result<()> {
        self.check_held(&p.validate(src, dst)?)?;
        self.record_copy_range(src, dst, p)
    }
    /// [`ComputeBackend::copy_range`] after its checks.
    fn record_copy_range(&self, src: &Self::Buffer, dst: &Self::Buffer, p: CopyRange)
        -> Result<()>;

    /// Submit the recorded batch without waiting for it.
    fn flush(&self) -> Result<()>;
    /// Submit the recorded batch and wait until the device is idle.
    fn sync(&self) -> Result<()>;

    /// Read back an f32 buffer, or an f16 one (a KV cache) widened exactly
    /// (flushes and waits).
    fn download_f32(&self, buf: &Self::Buffer) -> Result<Vec<f32>>;
    /// Elements `start..start + len` of an f32 or f16 buffer, read back as
    /// [`ComputeBackend::download_f32`] reads the whole (flushes and waits):
    /// a sampled step reads its rows of the logits, not the batch's. The
    /// default reads the whole buffer and keeps the range; a backend whose
    /// readback costs its bytes overrides it.
    fn download_f32_range(&self, buf: &Self::Buffer, start: usize, len: usize) -> Result<Vec<f32>> {
        crate::ops::check_range("download_f32_range", buf, start, len)?;
        let all = self.download_f32(buf)?;
        Ok(all[start..start + len].to_vec())
    }
    /// Read back a u32 buffer (flushes and waits).
    fn download_u32(&self, buf: &Self::Buffer) -> Result<Vec<u32>>;

    /// Start reading a u32 buffer back without waiting for it: the copy rides
    /// in the submission of everything recorded so far (which this submits),
    /// so the host can record more work before
    /// [`ComputeBackend::finish_read_u32`] waits for this copy alone. Greedy
    /// decode records token n + 1 while the device computes token n. A
    /// backend may bound the reads in flight (wgpu: 4, shared with
    /// downloads): one begun past the bound finishes the oldest and drops
    /// its data, and that ticket's `finish_read_u32` is then an error.
    fn begin_read_u32(&self, buf: &Self::Buffer) -> Result<ReadTicket>;
    /// The contents `buf` had when [`ComputeBackend::begin_read_u32`] gave
    /// `ticket` (waits for that submission only).
    fn finish_read_u32(&self, ticket: ReadTicket) -> Result<Vec<u32>>;

    // ---- the ops ---------------------------------------------------------
    //
    // Each op checks its arguments against its contract (shapes, dtypes,
    // aliasing: the op's `validate` / `check` in `crate::ops`), which names
    // them by role; hands those to `check_held`; and then calls its
    // `record_*` hook below. Callers use the ops; a backend implements the
    // hooks and leaves the ops as they are, so that every backend rejects
    // the same bad calls with the same error before any of its own code runs.

    /// The backend's own rule on how it holds an op's buffer arguments,
    /// given each checked op's arguments by role ([`crate::ops::Args`]):
    /// the wgpu backend's one binding per argument but a split weight where
    /// the role allows one, and its tile-ordered expert stacks only in the
    /// role that takes that stack. Runs after the op's contract, before its
    /// hook. By default, none.
    fn check_held(&self, args: &Args<'_, Self::Buffer>) -> Result<()> {
        let _ = args;
        Ok(())
    }

    // ---- normalisation -------------------------------------------------

    /// `out[r] = (residual[r] + rmsnorm(x[r]) * weight) * p.scale` for each of
    /// `p.rows` rows of `p.dim` (weight and residual optional). Per-head q/k/v
    /// norms are the same op with rows = tokens * heads and dim = head_dim.
    fn rms_norm(
        &self,
        x: &Self::Buffer,
        weight: Option<&Self::Buffer>,
        residual: Option<&Self::Buffer>,
        out: &Self::Buffer,
        p: RmsNorm,
    ) -> Result<()> {
        self.check_held(&p.validate(x, weight, residual, out)?)?;
        self.record_rms_norm(x, weight, residual, out, p)
    }

    // ---- dense projections ---------------------------------------------

    /// `out[i, r] = sum_c w[r, c] * x[i, c]`: x `[m, k]`, w `[n, k]`, out `[m, n]`.
    fn matmul(
        &self,
        w: &Self::Buffer,
        x: &Self::Buffer,
        out: &Self::Buffer,
        p: Matmul,
    ) -> Result<()> {
        self.check_held(&p.validate(w, x, out)?)?;
        self.record_matmul(w, x, out, p)
    }

    // ---- mixture of experts ----------------------------------------------

    /// Gemma 4 router for `p.m` tokens: no-weight RMSNorm of `x`, times
    /// `eff_scale` (router.scale / sqrt(hidden), folded on the host), `proj`
    /// GEMV to E logits, softmax, top-k, renormalise, times
    /// `per_expert_scale[e]`. Writes `ids [m, k]` (u32) and `weights [m, k]`
    /// (f32), each row ordered by descending weight.
    #[allow(clippy::too_many_arguments)]
    fn router(
        &self,
        x: &Self::Buffer,
        eff_scale: &Self::Buffer,
        proj: &Self::Buffer,
        per_expert_scale: &Self::Buffer,
        ids: &Self::Buffer,
        weights: &Self::Buffer,
        p: Router,
    ) -> Result<()> {
        self.check_held(&p.validate(x, eff_scale, proj, per_expert_scale, ids, weights)?)?;
        self.record_router(x, eff_scale, proj, per_expert_scale, ids, weights, p)
    }

    /// MoE phase 1: for each token t and slot j with e = ids[t, j],
    /// `act[t, j, :] = gelu_tanh(gate_e x_t) * (up_e x_t)`, gate and up being
    /// rows `0..inter` and `inter..2*inter` of `gate_up[e]` (`[E, 2*inter, hidden]`).
    fn moe_gate_up(
        &self,
        x: &Self::Buffer,
        gate_up: &Self::Buffer,
        ids: &Self::Buffer,
        act: &Self::Buffer,
        p: Moe,
    ) -> Result<()> {
        self.check_held(&p.validate_gate_up(x, gate_up, ids, act)?)?;
        self.record_moe_gate_up(x, gate_up, ids, act, p)
    }

    /// MoE phase 2: `out[t] = sum_j weights[t, j] * down_e act[t, j]` with
    /// `down` `[E, hidden, inter]`.
    fn moe_down(
        &self,
        act: &Self::Buffer,
        down: &Self::Buffer,
        ids: &Self::Buffer,
        weights: &Self::Buffer,
        out: &Self::Buffer,
        p: Moe,
    ) -> Result<()> {
        self.check_held(&p.validate_down(act, down, ids, weights, out)?)?;
        self.record_moe_down(act, down, ids, weights, out, p)
    }

    /// Two independent MoE phase-1 problems: [`ComputeBackend::moe_gate_up`]
    /// on `a`, then on `b`. Decode runs the dense MLP (a one-expert MoE)
    /// beside the routed experts this way, so that a backend may run both at
    /// once. Neither output may alias the other or any input.
    fn moe_gate_up_pair(
        &self,
        a: GateUpArgs<'_, Self::Buffer>,
        b: GateUpArgs<'_, Self::Buffer>,
    ) -> Result<()> {
        for args in GateUpArgs::check_pair(&a, &b)? {
            self.check_held(&args)?;
        }
        self.record_moe_gate_up_pair(a, b)
    }

    /// Two independent MoE phase-2 problems: [`ComputeBackend::moe_down`] on
    /// `a`, then on `b` (the dense MLP's down projection as a one-expert MoE
    /// with weight 1, beside the routed experts). Neither output may alias
    /// the other or any input.
    fn moe_down_pair(
        &self,
        a: DownArgs<'_, Self::Buffer>,
        b: DownArgs<'_, Self::Buffer>,
    ) -> Result<()> {
        for args in DownArgs::check_pair(&a, &b)? {
            self.check_held(&args)?;
        }
        self.record_moe_down_pair(a, b)
    }

    /// [`ComputeBackend::moe_down_pair`] on `(dense, routed)`, then
    /// [`ComputeBackend::post_ffn`] on their outputs (`post` reads
    /// `dense.out` and `routed.out`: [`PostFfnArgs::check_reads`]): a decode
    /// layer's work from both branches' activations to the next layer's
    /// input, as one call so that a backend may run post_ffn in the pair's
    /// own work.
    fn moe_down_pair_post_ffn(
        &self,
        dense: DownArgs<'_, Self::Buffer>,
        routed: DownArgs<'_, Self::Buffer>,
        post: PostFfnArgs<'_, Self::Buffer>,
    ) -> Result<()> {
        post.check_reads(&dense, &routed)?;
        let [a, b] = DownArgs::check_pair(&dense, &routed)?;
        // (every contract before any backend's rule: a bad call gets the
        // contract's error on every backend)
        for args in [a, b, post.check()?] {
            self.check_held(&args)?;
        }
        self.record_moe_down_pair_post_ffn(dense, routed, post)
    }

    // ---- attention -------------------------------------------------------

    /// NeoX RoPE in place on `x [m, heads * head_dim]`, row i at `positions[i]`:
    /// dim d < head_dim/2 pairs with d + head_dim/2 and turns by
    /// `pos * theta^(-2d/head_dim)` for d < `rot_pairs`; other dims pass through.
    fn rope(&self, x: &Self::Buffer, positions: &Self::Buffer, p: Rope) -> Result<()> {
        self.check_held(&p.validate(x, positions)?)?;
        self.record_rope(x, positions, p)
    }

    /// Write the `m` new keys/values (`[m, kv_heads * head_dim]`) into caches
    /// laid out `[kv_heads, capacity, head_dim]`, position `pos` at slot
    /// `pos % capacity` (a ring on sliding layers, linear on full layers).
    /// The caches are f32 or f16 ([`crate::ops::CACHES`], both alike); an
    /// f16 cache stores each value as [`crate::dtype::kv_half`] rounds it,
    /// as do `qkv_post`'s appends, and attention reads it widened.
    #[allow(clippy::too_many_arguments)]
    fn kv_append(
        &self,
        k: &Self::Buffer,
        v: &Self::Buffer,
        k_cache: &Self::Buffer,
        v_cache: &Self::Buffer,
        positions: &Self::Buffer,
        p: KvAppend,
    ) -> Result<()> {
        self.check_held(&p.validate(k, v, k_cache, v_cache, positions)?)?;
        self.record_kv_append(k, v, k_cache, v_cache, positions, p)
    }

    /// Attention of `m` queries (`q [m, heads * head_dim]`, query i at
    /// `positions[i]`) over the cached keys at positions `lo..=pos`, where
    /// `lo = pos + 1 - window` on sliding layers (window > 0) and 0 on full
    /// layers; scores scaled by `p.scale`, GQA head h reads KV head
    /// `h / (heads / kv_heads)`. Causal within a micro-batch follows from the
    /// positions. Writes `out [m, heads * head_dim]`.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        q: &Self::Buffer,
        k_cache: &Self::Buffer,
        v_cache: &Self::Buffer,
        positions: &Self::Buffer,
        out: &Self::Buffer,
        p: Attention,
    ) -> Result<()> {
        self.check_held(&p.validate(q, k_cache, v_cache, positions, out)?)?;
        self.record_attention(q, k_cache, v_cache, positions, out, p)
    }

    // ---- elementwise and glue --------------------------------------------

    /// `out = a + b` over `n` elements.
    fn add(&self, a: &Self::Buffer, b: &Self::Buffer, out: &Self::Buffer, n: usize) -> Result<()> {
        self.check_held(&crate::ops::validate_binary("add", a, b, out, n)?)?;
        self.record_add(a, b, out, n)
    }
    /// `out = x * s` over `n` elements.
    fn scale(&self, x: &Self::Buffer, out: &Self::Buffer, n: usize, s: f32) -> Result<()> {
        self.check_held(&crate::ops::validate_unary("scale", x, out, n)?)?;
        self.record_scale(x, out, n, s)
    }
    /// `out[r, i] = gelu_tanh(x[r, i]) * x[r, n + i]` for x `[rows, 2n]` (gate | up).
    fn gelu_mul(&self, x: &Self::Buffer, out: &Self::Buffer, rows: usize, n: usize) -> Result<()> {
        self.check_held(&crate::ops::validate_gelu_mul(x, out, rows, n)?)?;
        self.record_gelu_mul(x, out, rows, n)
    }
    /// `out = cap * tanh(x / cap)` over `n` elements.
    fn softcap(&self, x: &Self::Buffer, out: &Self::Buffer, n: usize, cap: f32) -> Result<()> {
        self.check_held(&crate::ops::validate_unary("softcap", x, out, n)?)?;
        self.record_softcap(x, out, n, cap)
    }
    /// `out[i] = table[ids[i]] * p.scale`; ids past the vocabulary are an error
    /// caught on the host before upload (the kernel clamps to stay in bounds).
    fn embed(
        &self,
        ids: &Self::Buffer,
        table: &Self::Buffer,
        out: &Self::Buffer,
        p: Embed,
    ) -> Result<()> {
        self.check_held(&p.validate(ids, table, out)?)?;
        self.record_embed(ids, table, out, p)
    }
    /// `out[r] = argmax(x[r, :])` (u32, first index on ties) for x `[rows, n]`;
    /// NaN never wins, nor a value below [`crate::ops::ARGMAX_FLOOR`] (-inf),
    /// and a row with no other value gives [`crate::ops::NO_ARGMAX`].
    fn argmax(&self, x: &Self::Buffer, out: &Self::Buffer, rows: usize, n: usize) -> Result<()> {
        self.check_held(&crate::ops::validate_argmax(x, out, rows, n)?)?;
        self.record_argmax(x, out, rows, n)
    }

    /// A streamed layer's slot lookup: for each of the `p.n` routed ids,
    /// `slot_ids[i] = table[ids[i]]` (the slot of a `p.slots`-expert stack
    /// holding that expert) and `log[p.at + i] = ids[i]`; where the table
    /// holds no slot for it ([`crate::ops::NO_SLOT`], an entry of `p.slots`
    /// or more, an id past the table), `slot_ids[i] = 0` and the logged id
    /// has [`crate::ops::SLOT_MISSED`] set. The MoE ops then run on the slot
    /// stack with no host round trip; the host reads the log to learn
    /// whether the pass may stand ([`crate::ops::slot_lookup`] is the
    /// reference).
    fn slot_lookup(
        &self,
        ids: &Self::Buffer,
        table: &Self::Buffer,
        slot_ids: &Self::Buffer,
        log: &Self::Buffer,
        p: SlotLookup,
    ) -> Result<()> {
        self.check_held(&p.validate(ids, table, slot_ids, log)?)?;
        self.record_slot_lookup(ids, table, slot_ids, log, p)
    }

    // ---- fused decoder steps (primitive ops as one call) ------------------

    /// [`PostAttention`]: `r = x + rmsnorm(o) * w_post`,
    /// `ff = rmsnorm(r) * w_ff` and, with `moe = Some((w_moe, out))`,
    /// `out = rmsnorm(r) * w_moe`.
    #[allow(clippy::too_many_arguments)]
    fn post_attention(
        &self,
        o: &Self::Buffer,
        x: &Self::Buffer,
        w_post: &Self::Buffer,
        w_ff: &Self::Buffer,
        r: &Self::Buffer,
        ff: &Self::Buffer,
        moe: Option<(&Self::Buffer, &Self::Buffer)>,
        p: PostAttention,
    ) -> Result<()> {
        self.check_held(&p.check(o, x, w_post, w_ff, r, ff, moe)?)?;
        self.record_post_attention(o, x, w_post, w_ff, r, ff, moe, p)
    }

    /// [`ComputeBackend::post_attention`] on `pa`, then
    /// [`ComputeBackend::router`] on its residual `pa.r`: the two calls
    /// between o_proj and the MoE phases of a layer with experts, as one so
    /// that a backend may compute the router's logits in post_attention's
    /// own work. The router's outputs may not alias any of post_attention's
    /// buffers.
    fn post_attention_router(
        &self,
        pa: PostAttentionArgs<'_, Self::Buffer>,
        router: RouterArgs<'_, Self::Buffer>,
    ) -> Result<()> {
        for args in router.check_after(&pa)? {
            self.check_held(&args)?;
        }
        self.record_post_attention_router(pa, router)
    }

    /// [`ComputeBackend::post_attention_router`], then
    /// [`ComputeBackend::moe_gate_up_pair`] on `(dense, routed)`, where
    /// `routed` reads the router's ids (`routed.ids` is `router.ids`): a
    /// decode layer's work from o_proj's output to both branches'
    /// activations, as one call so that a backend may pick the token's
    /// experts in the gate_up's own work.
    fn post_attention_gate_up(
        &self,
        (pa, router): (
            PostAttentionArgs<'_, Self::Buffer>,
            RouterArgs<'_, Self::Buffer>,
        ),
        dense: GateUpArgs<'_, Self::Buffer>,
        routed: GateUpArgs<'_, Self::Buffer>,
    ) -> Result<()> {
        router.check_routes(&dense, &routed)?;
        let [post, route] = router.check_after(&pa)?;
        let [a, b] = GateUpArgs::check_pair(&dense, &routed)?;
        for args in [post, route, a, b] {
            self.check_held(&args)?;
        }
        self.record_post_attention_gate_up((pa, router), dense, routed)
    }

    /// [`ComputeBackend::post_attention_gate_up`] with the routed experts
    /// in a slot stack (streamed experts):
    /// [`ComputeBackend::post_attention_router`], then
    /// [`ComputeBackend::slot_lookup`] of the router's ids through
    /// `lookup.table` into `routed.ids` (the slots `routed` reads: its
    /// `p.experts` is the stack's `lookup.p.slots`), each id logged in
    /// `lookup.log` from `lookup.p.at`, then
    /// [`ComputeBackend::moe_gate_up_pair`]. One call, so that a backend
    /// may pick and look up the experts in the gate_up's own work.
    fn post_attention_gate_up_slots(
        &self,
        (pa, router): (
            PostAttentionArgs<'_, Self::Buffer>,
            RouterArgs<'_, Self::Buffer>,
        ),
        dense: GateUpArgs<'_, Self::Buffer>,
        routed: GateUpArgs<'_, Self::Buffer>,
        lookup: SlotArgs<'_, Self::Buffer>,
    ) -> Result<()> {
        router.check_slot_routes(&dense, &routed, &lookup)?;
        let [post, route] = router.check_after(&pa)?;
        let look = lookup
            .p
            .validate(router.ids, lookup.table, routed.ids, lookup.log)?;
        let [a, b] = GateUpArgs::check_pair(&dense, &routed)?;
        for args in [post, route, look, a, b] {
            self.check_held(&args)?;
        }
        self.record_post_attention_gate_up_slots((pa, router), dense, routed, lookup)
    }

    /// [`PostFfn`]: `h = rmsnorm(dense) * w_dense`; with
    /// `moe = Some((moe_out, w_moe, w_sum))`,
    /// `h = rmsnorm(h + rmsnorm(moe_out) * w_moe) * w_sum`; `x = (r + h) *
    /// scale`; with `next = Some((w_next, normed))`, `normed = rmsnorm(x) *
    /// w_next`.
    fn post_ffn(&self, a: PostFfnArgs<'_, Self::Buffer>) -> Result<()> {
        self.check_held(&a.check()?)?;
        self.record_post_ffn(a)
    }

    /// [`QkvPost`]: per-head q/k/v norms, RoPE on q and k, and the cache
    /// append of k and v, from the fused projection's raw rows.
    #[allow(clippy::too_many_arguments)]
    fn qkv_post(
        &self,
        raw: &Self::Buffer,
        w_q: &Self::Buffer,
        w_k: &Self::Buffer,
        positions: &Self::Buffer,
        q: &Self::Buffer,
        k_cache: &Self::Buffer,
        v_cache: &Self::Buffer,
        p: QkvPost,
    ) -> Result<()> {
        self.check_held(&p.check(raw, w_q, w_k, positions, q, k_cache, v_cache)?)?;
        self.record_qkv_post(raw, w_q, w_k, positions, q, k_cache, v_cache, p)
    }

    /// [`qkv_post`](Self::qkv_post), then [`attention`](Self::attention)
    /// of the queries it wrote to `q` over the caches it appended to, into
    /// `out`: a layer's attention between the q|k|v projection and o_proj.
    /// The two ops' shapes must agree ([`crate::ops::check_qkv_attention`]),
    /// and each op's own checks hold. The results are the two ops'.
    #[allow(clippy::too_many_arguments)]
    fn qkv_post_attention(
        &self,
        raw: &Self::Buffer,
        w_q: &Self::Buffer,
        w_k: &Self::Buffer,
        positions: &Self::Buffer,
        q: &Self::Buffer,
        k_cache: &Self::Buffer,
        v_cache: &Self::Buffer,
        out: &Self::Buffer,
        qp: QkvPost,
        ap: Attention,
    ) -> Result<()> {
        crate::ops::check_qkv_attention(&qp, &ap)?;
        let qkv = qp.check(raw, w_q, w_k, positions, q, k_cache, v_cache)?;
        let attention = ap.validate(q, k_cache, v_cache, positions, out)?;
        for args in [qkv, attention] {
            self.check_held(&args)?;
        }
        self.record_qkv_post_attention(raw, w_q, w_k, positions, q, k_cache, v_cache, out, qp, ap)
    }

    /// [`qkv_post_attention`](Self::qkv_post_attention) of one row of an
    /// m-row pass whose rows attend on caches of their own (a batched decode
    /// step, a row a sequence): row `row` of `raw` ([m, raw_row]) in, row
    /// `row` of `out` ([m, heads * head_dim]) written and no other, the
    /// one-row `q`, `positions` and caches as the one-row op takes them.
    /// `row_raw` and `row_out` are one-row scratch the op may use (the
    /// default body copies the row through them; a backend that addresses
    /// the row in place leaves them be). `qp` and `ap` describe one row.
    #[allow(clippy::too_many_arguments)]
    fn qkv_post_attention_row(
        &self,
        row: usize,
        raw: &Self::Buffer,
        w_q: &Self::Buffer,
        w_k: &Self::Buffer,
        positions: &Self::Buffer,
        q: &Self::Buffer,
        k_cache: &Self::Buffer,
        v_cache: &Self::Buffer,
        out: &Self::Buffer,
        scratch: (&Self::Buffer, &Self::Buffer),
        qp: QkvPost,
        ap: Attention,
    ) -> Result<()> {
        crate::ops::check_qkv_attention(&qp, &ap)?;
        let rows = crate::ops::check_qkv_attention_row(
            row,
            &qp,
            (raw, out),
            scratch,
            ([w_q, w_k, positions], [q, k_cache, v_cache]),
        )?;
        let qkv = qp.check(scratch.0, w_q, w_k, positions, q, k_cache, v_cache)?;
        let attention = ap.validate(q, k_cache, v_cache, positions, scratch.1)?;
        for args in [rows, qkv, attention] {
            self.check_held(&args)?;
        }
        self.record_qkv_post_attention_row(
            row, raw, w_q, w_k, positions, q, k_cache, v_cache, out, scratch, qp, ap,
        )
    }

    // ---- hooks: what a backend implements ----------------------------------
    //
    // Each `record_*` hook is its op's work on arguments that have passed
    // the op's checks: a hook may assume the shapes, dtypes and aliasing
    // rules hold, and checks only what is its own (a device limit, a
    // buffer layout of its own, an unsupported case). The primitive ops'
    // hooks are required. The fused ops' hooks have default bodies made of
    // the primitive ops (through the checked ops, so a fused op costs a new
    // backend nothing); a backend overrides one to run it in fewer launches.

    /// [`ComputeBackend::rms_norm`] on checked arguments.
    fn record_rms_norm(
        &self,
        x: &Self::Buffer,
        weight: Option<&Self::Buffer>,
        residual: Option<&Self::Buffer>,
        out: &Self::Buffer,
        p: RmsNorm,
    ) -> Result<()>;

    /// [`ComputeBackend::matmul`] on checked arguments.
    fn record_matmul(
        &self,
        w: &Self::Buffer,
        x: &Self::Buffer,
        out: &Self::Buffer,
        p: Matmul,
    ) -> Result<()>;

    /// [`ComputeBackend::router`] on checked arguments.
    #[allow(clippy::too_many_arguments)]
    fn record_router(
        &self,
        x: &Self::Buffer,
        eff_scale: &Self::Buffer,
        proj: &Self::Buffer,
        per_expert_scale: &Self::Buffer,
        ids: &Self::Buffer,
        weights: &Self::Buffer,
        p: Router,
    ) -> Result<()>;

    /// [`ComputeBackend::moe_gate_up`] on checked arguments.
    fn record_moe_gate_up(
        &self,
        x: &Self::Buffer,
        gate_up: &Self::Buffer,
        ids: &Self::Buffer,
        act: &Self::Buffer,
        p: Moe,
    ) -> Result<()>;

    /// [`ComputeBackend::moe_down`] on checked arguments.
    fn record_moe_down(
        &self,
        act: &Self::Buffer,
        down: &Self::Buffer,
        ids: &Self::Buffer,
        weights: &Self::Buffer,
        out: &Self::Buffer,
        p: Moe,
    ) -> Result<()>;

    /// [`ComputeBackend::rope`] on checked arguments.
    fn record_rope(&self, x: &Self::Buffer, positions: &Self::Buffer, p: Rope) -> Result<()>;

    /// [`ComputeBackend::kv_append`] on checked arguments.
    #[allow(clippy::too_many_arguments)]
    fn record_kv_append(
        &self,
        k: &Self::Buffer,
        v: &Self::Buffer,
        k_cache: &Self::Buffer,
        v_cache: &Self::Buffer,
        positions: &Self::Buffer,
        p: KvAppend,
    ) -> Result<()>;

    /// [`ComputeBackend::attention`] on checked arguments.
    #[allow(clippy::too_many_arguments)]
    fn record_attention(
        &self,
        q: &Self::Buffer,
        k_cache: &Self::Buffer,
        v_cache: &Self::Buffer,
        positions: &Self::Buffer,
        out: &Self::Buffer,
        p: Attention,
    ) -> Result<()>;

    /// [`ComputeBackend::add`] on checked arguments.
    fn record_add(
        &self,
        a: &Self::Buffer,
        b: &Self::Buffer,
        out: &Self::Buffer,
        n: usize,
    ) -> Result<()>;
    /// [`ComputeBackend::scale`] on checked arguments.
    fn record_scale(&self, x: &Self::Buffer, out: &Self::Buffer, n: usize, s: f32) -> Result<()>;
    /// [`ComputeBackend::gelu_mul`] on checked arguments.
    fn record_gelu_mul(
        &self,
        x: &Self::Buffer,
        out: &Self::Buffer,
        rows: usize,
        n: usize,
    ) -> Result<()>;
    /// [`ComputeBackend::softcap`] on checked arguments.
    fn record_softcap(
        &self,
        x: &Self::Buffer,
        out: &Self::Buffer,
        n: usize,
        cap: f32,
    ) -> Result<()>;
    /// [`ComputeBackend::embed`] on checked arguments.
    fn record_embed(
        &self,
        ids: &Self::Buffer,
        table: &Self::Buffer,
        out: &Self::Buffer,
        p: Embed,
    ) -> Result<()>;
    /// [`ComputeBackend::argmax`] on checked arguments.
    fn record_argmax(
        &self,
        x: &Self::Buffer,
        out: &Self::Buffer,
        rows: usize,
        n: usize,
    ) -> Result<()>;

    /// [`ComputeBackend::slot_lookup`] on checked arguments. By default on
    /// the host: the ids and the table read back (a wait, as the per-layer
    /// path's own), [`crate::ops::slot_lookup`], the results written.
    fn record_slot_lookup(
        &self,
        ids: &Self::Buffer,
        table: &Self::Buffer,
        slot_ids: &Self::Buffer,
        log: &Self::Buffer,
        p: SlotLookup,
    ) -> Result<()> {
        let (ids_h, table_h) = (self.download_u32(ids)?, self.download_u32(table)?);
        let (slots, logged) =
            crate::ops::slot_lookup(&ids_h[..p.n], &table_h[..p.experts], p.slots);
        self.write_u32(slot_ids, 0, &slots)?;
        self.write_u32(log, p.at, &logged)
    }

    /// [`ComputeBackend::moe_gate_up_pair`] on checked arguments. By
    /// default, [`ComputeBackend::moe_gate_up`] on `a`, then on `b`.
    fn record_moe_gate_up_pair(
        &self,
        a: GateUpArgs<'_, Self::Buffer>,
        b: GateUpArgs<'_, Self::Buffer>,
    ) -> Result<()> {
        a.run(self)?;
        b.run(self)
    }

    /// [`ComputeBackend::moe_down_pair`] on checked arguments. By default,
    /// [`ComputeBackend::moe_down`] on `a`, then on `b`.
    fn record_moe_down_pair(
        &self,
        a: DownArgs<'_, Self::Buffer>,
        b: DownArgs<'_, Self::Buffer>,
    ) -> Result<()> {
        a.run(self)?;
        b.run(self)
    }

    /// [`ComputeBackend::moe_down_pair_post_ffn`] on checked arguments. By
    /// default, [`ComputeBackend::moe_down_pair`], then
    /// [`ComputeBackend::post_ffn`].
    fn record_moe_down_pair_post_ffn(
        &self,
        dense: DownArgs<'_, Self::Buffer>,
        routed: DownArgs<'_, Self::Buffer>,
        post: PostFfnArgs<'_, Self::Buffer>,
    ) -> Result<()> {
        self.moe_down_pair(dense, routed)?;
        post.run(self)
    }

    /// [`ComputeBackend::post_attention`] on checked arguments. By default,
    /// its three [`ComputeBackend::rms_norm`]s.
    #[allow(clippy::too_many_arguments)]
    fn record_post_attention(
        &self,
        o: &Self::Buffer,
        x: &Self::Buffer,
        w_post: &Self::Buffer,
        w_ff: &Self::Buffer,
        r: &Self::Buffer,
        ff: &Self::Buffer,
        moe: Option<(&Self::Buffer, &Self::Buffer)>,
        p: PostAttention,
    ) -> Result<()> {
        let n = p.norm();
        self.rms_norm(o, Some(w_post), Some(x), r, n)?;
        self.rms_norm(r, Some(w_ff), None, ff, n)?;
        if let Some((w_moe, out)) = moe {
            self.rms_norm(r, Some(w_moe), None, out, n)?;
        }
        Ok(())
    }

    /// [`ComputeBackend::post_attention_router`] on checked arguments. By
    /// default, [`ComputeBackend::post_attention`], then
    /// [`ComputeBackend::router`].
    fn record_post_attention_router(
        &self,
        pa: PostAttentionArgs<'_, Self::Buffer>,
        router: RouterArgs<'_, Self::Buffer>,
    ) -> Result<()> {
        pa.run(self)?;
        router.run_on(self, pa.r)
    }

    /// [`ComputeBackend::post_attention_gate_up`] on checked arguments. By
    /// default, [`ComputeBackend::post_attention_router`], then
    /// [`ComputeBackend::moe_gate_up_pair`].
    fn record_post_attention_gate_up(
        &self,
        (pa, router): (
            PostAttentionArgs<'_, Self::Buffer>,
            RouterArgs<'_, Self::Buffer>,
        ),
        dense: GateUpArgs<'_, Self::Buffer>,
        routed: GateUpArgs<'_, Self::Buffer>,
    ) -> Result<()> {
        self.post_attention_router(pa, router)?;
        self.moe_gate_up_pair(dense, routed)
    }

    /// [`ComputeBackend::post_attention_gate_up_slots`] on checked
    /// arguments. By default its three ops in turn.
    fn record_post_attention_gate_up_slots(
        &self,
        (pa, router): (
            PostAttentionArgs<'_, Self::Buffer>,
            RouterArgs<'_, Self::Buffer>,
        ),
        dense: GateUpArgs<'_, Self::Buffer>,
        routed: GateUpArgs<'_, Self::Buffer>,
        lookup: SlotArgs<'_, Self::Buffer>,
    ) -> Result<()> {
        let ids = router.ids;
        self.post_attention_router(pa, router)?;
        let l = lookup;
        self.slot_lookup(ids, l.table, routed.ids, l.log, l.p)?;
        self.moe_gate_up_pair(dense, routed)
    }

    /// [`ComputeBackend::post_ffn`] on checked arguments. By default, its
    /// [`ComputeBackend::rms_norm`]s (the residual and the scale folded into
    /// the last norm of the branch, as the op's own arithmetic does), through
    /// two scratch buffers when there are experts.
    fn record_post_ffn(&self, a: PostFfnArgs<'_, Self::Buffer>) -> Result<()> {
        let p = a.p;
        let n = p.norm();
        let last = RmsNorm {
            scale: p.scale,
            ..n
        };
        match a.moe {
            Some((moe_out, w_moe, w_sum)) => {
                let len = p.rows * p.dim;
                let h = self.alloc(DType::F32, len, "post_ffn.h")?;
                let sum = self.alloc(DType::F32, len, "post_ffn.sum")?;
                self.rms_norm(a.dense, Some(a.w_dense), None, &h, n)?;
                self.rms_norm(moe_out, Some(w_moe), Some(&h), &sum, n)?;
                self.rms_norm(&sum, Some(w_sum), Some(a.r), a.x, last)?;
            }
            None => self.rms_norm(a.dense, Some(a.w_dense), Some(a.r), a.x, last)?,
        }
        if let Some((w_next, normed)) = a.next {
            self.rms_norm(a.x, Some(w_next), None, normed, n)?;
        }
        Ok(())
    }

    /// [`ComputeBackend::qkv_post`] on checked arguments. By default: each
    /// part's heads gathered out of the raw rows by
    /// [`ComputeBackend::embed`] (the raw rows as a table of head_dim-wide
    /// rows, scale 1: an exact copy), then [`ComputeBackend::rms_norm`],
    /// [`ComputeBackend::rope`] and [`ComputeBackend::kv_append`].
    #[allow(clippy::too_many_arguments)]
    fn record_qkv_post(
        &self,
        raw: &Self::Buffer,
        w_q: &Self::Buffer,
        w_k: &Self::Buffer,
        positions: &Self::Buffer,
        q: &Self::Buffer,
        k_cache: &Self::Buffer,
        v_cache: &Self::Buffer,
        p: QkvPost,
    ) -> Result<()> {
        let d = p.head_dim;
        let per_token = p.raw_row() / d;
        // The whole buffer as the table (a scratch buffer may hold more
        // rows than this call's); `check` saw it hold the call's rows.
        let table = Embed {
            m: 0,
            hidden: d,
            vocab: raw.len() / d,
            scale: 1.0,
        };
        // The raw rows' heads `first..first + heads` of every token, as one
        // [m * heads, d] buffer.
        let gather = |first: usize, heads: usize, label: &str| -> Result<Self::Buffer> {
            let ids: Vec<u32> = (0..p.m)
                .flat_map(|t| (0..heads).map(move |h| (t * per_token + first + h) as u32))
                .collect();
            let id_buf = self.alloc(DType::U32, ids.len(), label)?;
            self.write_u32(&id_buf, 0, &ids)?;
            let out = self.alloc(DType::F32, ids.len() * d, label)?;
            let e = Embed {
                m: ids.len(),
                ..table
            };
            self.embed(&id_buf, raw, &out, e)?;
            Ok(out)
        };
        let norm = |rows: usize| RmsNorm::unscaled(rows, d, p.eps);
        let rope = |heads: usize| Rope {
            m: p.m,
            heads,
            head_dim: d,
            rot_pairs: p.rot_pairs,
            theta: p.theta,
        };
        let q_raw = gather(0, p.heads, "qkv_post.q_raw")?;
        self.rms_norm(&q_raw, Some(w_q), None, q, norm(p.m * p.heads))?;
        self.rope(q, positions, rope(p.heads))?;
        let k_raw = gather(p.heads, p.kv_heads, "qkv_post.k_raw")?;
        let kv_len = p.m * p.kv_heads * d;
        let k = self.alloc(DType::F32, kv_len, "qkv_post.k")?;
        self.rms_norm(&k_raw, Some(w_k), None, &k, norm(p.m * p.kv_heads))?;
        self.rope(&k, positions, rope(p.kv_heads))?;
        let v_raw = if p.v_from_k {
            k_raw
        } else {
            gather(p.heads + p.kv_heads, p.kv_heads, "qkv_post.v_raw")?
        };
        let v = self.alloc(DType::F32, kv_len, "qkv_post.v")?;
        self.rms_norm(&v_raw, None, None, &v, norm(p.m * p.kv_heads))?;
        let append = KvAppend {
            m: p.m,
            kv_heads: p.kv_heads,
            head_dim: d,
            capacity: p.capacity,
        };
        self.kv_append(&k, &v, k_cache, v_cache, positions, append)
    }

    /// [`ComputeBackend::qkv_post_attention`] on checked arguments. By
    /// default, [`ComputeBackend::qkv_post`], then
    /// [`ComputeBackend::attention`]; a backend may do both in fewer
    /// launches.
    #[allow(clippy::too_many_arguments)]
    fn record_qkv_post_attention(
        &self,
        raw: &Self::Buffer,
        w_q: &Self::Buffer,
        w_k: &Self::Buffer,
        positions: &Self::Buffer,
        q: &Self::Buffer,
        k_cache: &Self::Buffer,
        v_cache: &Self::Buffer,
        out: &Self::Buffer,
        qp: QkvPost,
        ap: Attention,
    ) -> Result<()> {
        self.qkv_post(raw, w_q, w_k, positions, q, k_cache, v_cache, qp)?;
        self.attention(q, k_cache, v_cache, positions, out, ap)
    }

    /// [`ComputeBackend::qkv_post_attention_row`] after its checks; by
    /// default [`qkv_post_attention_row_by_copies`].
    #[allow(clippy::too_many_arguments)]
    fn record_qkv_post_attention_row(
        &self,
        row: usize,
        raw: &Self::Buffer,
        w_q: &Self::Buffer,
        w_k: &Self::Buffer,
        positions: &Self::Buffer,
        q: &Self::Buffer,
        k_cache: &Self::Buffer,
        v_cache: &Self::Buffer,
        out: &Self::Buffer,
        scratch: (&Self::Buffer, &Self::Buffer),
        qp: QkvPost,
        ap: Attention,
    ) -> Result<()> {
        qkv_post_attention_row_by_copies(
            self, row, raw, w_q, w_k, positions, q, k_cache, v_cache, out, scratch, qp, ap,
        )
    }
}

/// [`ComputeBackend::qkv_post_attention_row`] of the one-row op: row `row`
/// of `raw` copied into the scratch's first buffer, the one-row
/// `qkv_post_attention` into its second, that copied into row `row` of
/// `out`. The trait's default body, and a backend's where its own way does
/// not take the shapes.
#[allow(clippy::too_many_arguments)]
pub fn qkv_post_attention_row_by_copies<B: ComputeBackend + ?Sized>(
    be: &B,
    row: usize,
    raw: &B::Buffer,
    w_q: &B::Buffer,
    w_k: &B::Buffer,
    positions: &B::Buffer,
    q: &B::Buffer,
    k_cache: &B::Buffer,
    v_cache: &B::Buffer,
    out: &B::Buffer,
    (row_raw, row_out): (&B::Buffer, &B::Buffer),
    qp: QkvPost,
    ap: Attention,
) -> Result<()> {
    let (rr, hn) = (qp.raw_row(), qp.heads * qp.head_dim);
    let copy = |src_offset, dst_offset, len| crate::ops::CopyRange {
        src_offset,
        dst_offset,
        len,
    };
    be.copy_range(raw, row_raw, copy(row * rr, 0, rr))?;
    be.qkv_post_attention(
        row_raw, w_q, w_k, positions, q, k_cache, v_cache, row_out, qp, ap,
    )?;
    be.copy_range(row_out, out, copy(0, row * hn, hn))
}
