//! The CPU reference backend.
//!
//! Plain, readable Rust with f32 accumulation: every GPU kernel is tested
//! against it, so it is written to be obviously right, not fast. Ops run
//! when they are recorded; `flush` and `sync` have nothing to wait for.
//! Each op is one function in [`ops`], on plain slices, named after its
//! WGSL twin in `kernels/`.

pub mod ops;

use std::borrow::Cow;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use turbospark::backend::{BackendInfo, Limits};
use turbospark::ops::{
    self as v, Attention, CopyRange, Embed, KvAppend, Matmul, Moe, OpKind, PostAttention, QkvPost,
    RmsNorm, Rope, Router, SlotLookup,
};
use turbospark::{
    ComputeBackend, DType, DeviceBuffer, DeviceType, Error, ExpertBytes, ExpertStack, GemmRounding,
    HostBytes, PostFfnArgs, Precision, ReadTicket, Result, SlotWrite, Support,
};

pub use ops::Weights;

enum Storage {
    /// Owned, 4-byte aligned so f32/u32 views need no copy.
    Owned(Vec<u32>),
    /// A range of a memory-mapped checkpoint, kept without copying.
    Mapped {
        map: Arc<memmap2::Mmap>,
        offset: usize,
        len: usize,
    },
}

/// A CPU buffer: shared, so handles are cheap to clone.
#[derive(Clone)]
pub struct CpuBuffer {
    storage: Arc<RwLock<Storage>>,
    dtype: DType,
    len: usize,
}

impl DeviceBuffer for CpuBuffer {
    fn dtype(&self) -> DType {
        self.dtype
    }
    fn len(&self) -> usize {
        self.len
    }
    fn same_storage(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.storage, &other.storage)
    }
}

struct Read<'a>(RwLockReadGuard<'a, Storage>, usize);
struct Write<'a>(RwLockWriteGuard<'a, Storage>, usize);

impl Read<'_> {
    fn bytes(&self) -> &[u8] {
        match &*self.0 {
            Storage::Owned(v) => &bytemuck::cast_slice(v)[..self.1],
            Storage::Mapped { map, offset, len } => &map[*offset..*offset + *len],
        }
    }
    fn f32(&self) -> &[f32] {
        match &*self.0 {
            Storage::Owned(v) => &bytemuck::cast_slice(v)[..self.1 / 4],
            Storage::Mapped { .. } => unreachable!("activations are never mapped"),
        }
    }
    fn u32(&self) -> &[u32] {
        match &*self.0 {
            Storage::Owned(v) => &v[..self.1 / 4],
            Storage::Mapped { .. } => unreachable!("ids are never mapped"),
        }
    }
    /// An f32 or f16 buffer's values as f32 (f16 widens exactly; borrowed
    /// when f32 and owned; a mapped weight's bytes are copied, as they
    /// need not be aligned).
    fn floats(&self, dtype: DType) -> Cow<'_, [f32]> {
        match (&*self.0, dtype) {
            (Storage::Owned(_), DType::F32) => Cow::Borrowed(self.f32()),
            (_, DType::F16) => Cow::Owned(
                self.bytes()
                    .chunks_exact(2)
                    .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                    .collect(),
            ),
            _ => Cow::Owned(
                self.bytes()
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect(),
            ),
        }
    }
}

impl Write<'_> {
    fn bytes(&mut self) -> &mut [u8] {
        match &mut *self.0 {
            Storage::Owned(v) => &mut bytemuck::cast_slice_mut(v)[..self.1],
            Storage::Mapped { .. } => unreachable!("outputs are never mapped"),
        }
    }
    fn f32(&mut self) -> &mut [f32] {
        match &mut *self.0 {
            Storage::Owned(v) => &mut bytemuck::cast_slice_mut(v)[..self.1 / 4],
            Storage::Mapped { .. } => unreachable!("outputs are never mapped"),
        }
    }
    fn u32(&mut self) -> &mut [u32] {
        match &mut *self.0 {
            Storage::Owned(v) => &mut v[..self.1 / 4],
            Storage::Mapped { .. } => unreachable!("outputs are never mapped"),
        }
    }
    fn f16(&mut self) -> &mut [half::f16] {
        match &mut *self.0 {
            Storage::Owned(v) => &mut bytemuck::cast_slice_mut(v)[..self.1 / 2],
            Storage::Mapped { .. } => unreachable!("outputs are never mapped"),
        }
    }
}

impl CpuBuffer {
    fn nbytes(&self) -> usize {
        self.dtype.bytes_for(self.len)
    }
    fn read(&self) -> Read<'_> {
        Read(
            self.storage.read().unwrap_or_else(|e| e.into_inner()),
            self.nbytes(),
        )
    }
    fn write(&self, op: &'static str) -> Result<Write<'_>> {
        let g = self.storage.write().unwrap_or_else(|e| e.into_inner());
        if matches!(*g, Storage::Mapped { .. }) {
            return Err(Error::shape(
                op,
                "output buffer is a read-only mapped weight",
            ));
        }
        Ok(Write(g, self.nbytes()))
    }
}

fn weights<'a>(r: &'a Read<'_>, dtype: DType) -> Weights<'a> {
    Weights::new(dtype, r.bytes())
}

/// The CPU reference backend.
pub struct CpuBackend {
    info: BackendInfo,
    /// Readbacks begun and not yet finished (ops run at once on the CPU, so
    /// a read is a copy taken when it begins).
    reads: std::sync::Mutex<(u64, std::collections::HashMap<u64, Vec<u32>>)>,
    /// The GEMMs run from f16-rounded inputs, as a tensor-core backend runs
    /// them (`rounding_gemm_inputs_as`); None: all in f32.
    gemm_rounding: Option<GemmRounding>,
}

impl Default for CpuBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuBackend {
    pub fn new() -> Self {
        CpuBackend {
            info: BackendInfo {
                backend: "cpu".into(),
                device_name: "CPU reference".into(),
                api: "native".into(),
                device_type: DeviceType::Cpu,
                driver: String::new(),
                capabilities: Vec::new(),
                limits: Limits {
                    max_binding_bytes: u64::MAX,
                    max_buffer_bytes: u64::MAX,
                    max_workgroups_per_dim: u32::MAX,
                },
            },
            reads: Default::default(),
            gemm_rounding: None,
        }
    }

    /// This reference with the GEMMs `rule` names run from f16-rounded
    /// inputs (`turbospark::GemmRounding` says how), so that a backend with
    /// tensor cores can be held to the reference doing its arithmetic at
    /// the limit of f32 reduction order, not to an allowance for rounding
    /// that a model compounds over its layers. Each such op also checks its
    /// weight's range (every value, every call: meant for tests), as the
    /// GPU does at upload.
    pub fn rounding_gemm_inputs_as(self, rule: GemmRounding) -> Self {
        CpuBackend {
            gemm_rounding: Some(rule),
            ..self
        }
    }

    /// The reference for op parity against `device`: f32 throughout but for
    /// the attention `device` runs from f16-rounded inputs (tensor cores),
    /// which it rounds alike, so that kernel is held to f32 reduction order.
    /// (A GEMM's rounding is held to its own limit against f32 instead,
    /// `turbospark::parity::F16_INPUT_NMSE`: its error is bounded per
    /// product, while attention's depends on its scores' size.)
    pub fn parity_reference_for<B: ComputeBackend + ?Sized>(device: &B) -> Self {
        match device.gemm_rounding() {
            Some(rule) => Self::new().rounding_gemm_inputs_as(Arc::new(move |op, m, k| {
                matches!(op, OpKind::Attention { .. }) && rule(op, m, k)
            })),
            None => Self::new(),
        }
    }

    /// How the activations of `op` (`m` rows over `k`) reach the products
    /// here: as they are, or rounded as the rule and the op's `precision`
    /// say.
    fn rounding(&self, op: &OpKind, m: usize, k: usize, precision: Precision) -> ops::Rounding {
        if !self
            .gemm_rounding
            .as_ref()
            .is_some_and(|rule| rule(op, m, k))
        {
            return ops::Rounding::F32;
        }
        match precision {
            Precision::Fast => ops::Rounding::Half,
            Precision::Exact => ops::Rounding::Split,
        }
    }

    /// [`Self::rounding`] for a GEMM over weight `w`, which must fit f16
    /// (else its product stays f32, as on the GPU).
    fn rounds(
        &self,
        op: OpKind,
        (m, k, precision): (usize, usize, Precision),
        w: &Weights<'_>,
    ) -> ops::Rounding {
        match self.rounding(&op, m, k, precision) {
            r if r.rounds() && w.fits_f16() => r,
            _ => ops::Rounding::F32,
        }
    }

    fn new_owned(&self, dtype: DType, len: usize, bytes: Option<&[u8]>) -> CpuBuffer {
        let nbytes = dtype.bytes_for(len);
        let mut words = vec![0u32; nbytes.div_ceil(4)];
        if let Some(b) = bytes {
            bytemuck::cast_slice_mut::<u32, u8>(&mut words)[..nbytes].copy_from_slice(b);
        }
        CpuBuffer {
            storage: Arc::new(RwLock::new(Storage::Owned(words))),
            dtype,
            len,
        }
    }
}

fn element_count(op: &'static str, dtype: DType, nbytes: usize) -> Result<usize> {
    dtype.elements_in(nbytes).ok_or_else(|| {
        Error::shape(
            op,
            format!("{nbytes} bytes is not a whole number of {dtype} elements"),
        )
    })
}

impl ComputeBackend for CpuBackend {
    type Buffer = CpuBuffer;

    fn info(&self) -> &BackendInfo {
        &self.info
    }

    fn supports(&self, _op: &OpKind) -> Support {
        Support::Yes
    }

    fn gemm_rounding(&self) -> Option<GemmRounding> {
        self.gemm_rounding.clone()
    }

    fn alloc(&self, dtype: DType, len: usize, _label: &str) -> Result<CpuBuffer> {
        Ok(self.new_owned(dtype, len, None))
    }

    fn upload(&self, dtype: DType, bytes: HostBytes<'_>, _label: &str) -> Result<CpuBuffer> {
        let len = element_count("upload", dtype, bytes.as_slice().len())?;
        Ok(match bytes {
            HostBytes::Slice(s) => self.new_owned(dtype, len, Some(s)),
            HostBytes::Owned(v) => self.new_owned(dtype, len, Some(&v)),
            HostBytes::Mapped {
                map,
                offset,
                len: nbytes,
            } => CpuBuffer {
                storage: Arc::new(RwLock::new(Storage::Mapped {
                    map,
                    offset,
                    len: nbytes,
                })),
                dtype,
                len,
            },
        })
    }

    fn upload_weight(
        &self,
        dtype: DType,
        rows: usize,
        cols: usize,
        bytes: HostBytes<'_>,
        label: &str,
    ) -> Result<CpuBuffer> {
        let whole_groups = match dtype {
            DType::Affine(a) => a.fits_cols(cols),
            _ => true,
        };
        if !whole_groups || bytes.as_slice().len() != dtype.bytes_for(rows * cols) {
            return Err(Error::shape(
                "upload_weight",
                format!(
                    "`{label}`: {} bytes for {rows} x {cols} {dtype}",
                    bytes.as_slice().len()
                ),
            ));
        }
        self.upload(dtype, bytes, label)
    }

    fn write_experts(
        &self,
        buf: &CpuBuffer,
        dtype: DType,
        stack: ExpertStack,
        shape: (usize, usize),
        writes: &[(usize, ExpertBytes<'_>)],
    ) -> Result<SlotWrite> {
        let ranges = stack.check_writes((buf.dtype, buf.len), dtype, shape, writes)?;
        let mut w = buf.write("write_experts")?;
        let out = w.bytes();
        for (rs, (_, bytes)) in ranges.into_iter().zip(writes) {
            for (r, part) in rs.into_iter().zip(&bytes.parts) {
                let mut at = r.start;
                for s in part {
                    out[at..at + s.len()].copy_from_slice(s);
                    at += s.len();
                }
            }
        }
        Ok(SlotWrite::Host)
    }

    fn write_f32(&self, buf: &CpuBuffer, offset: usize, data: &[f32]) -> Result<()> {
        v::check_buf("write_f32", "buf", buf, &v::F32, offset + data.len())?;
        buf.write("write_f32")?.f32()[offset..offset + data.len()].copy_from_slice(data);
        Ok(())
    }

    fn write_u32(&self, buf: &CpuBuffer, offset: usize, data: &[u32]) -> Result<()> {
        v::check_buf("write_u32", "buf", buf, &v::U32, offset + data.len())?;
        buf.write("write_u32")?.u32()[offset..offset + data.len()].copy_from_slice(data);
        Ok(())
    }

    fn record_copy_buffer(&self, src: &CpuBuffer, dst: &CpuBuffer) -> Result<()> {
        let from = src.read();
        dst.write("copy_buffer")?
            .bytes()
            .copy_from_slice(from.bytes());
        Ok(())
    }

    fn record_copy_range(&self, src: &CpuBuffer, dst: &CpuBuffer, p: CopyRange) -> Result<()> {
        // (f32 and u32 only: four bytes an element)
        let (s, d, n) = (p.src_offset * 4, p.dst_offset * 4, p.len * 4);
        let from = src.read();
        dst.write("copy_range")?.bytes()[d..d + n].copy_from_slice(&from.bytes()[s..s + n]);
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        Ok(())
    }

    fn sync(&self) -> Result<()> {
        Ok(())
    }

    fn download_f32(&self, buf: &CpuBuffer) -> Result<Vec<f32>> {
        v::check_buf("download_f32", "buf", buf, &v::CACHES, 0)?;
        Ok(buf.read().floats(buf.dtype()).into_owned())
    }

    fn download_f32_range(&self, buf: &CpuBuffer, start: usize, len: usize) -> Result<Vec<f32>> {
        v::check_range("download_f32_range", buf, start, len)?;
        Ok(buf.read().floats(buf.dtype())[start..start + len].to_vec())
    }

    fn download_u32(&self, buf: &CpuBuffer) -> Result<Vec<u32>> {
        v::check_buf("download_u32", "buf", buf, &v::U32, 0)?;
        Ok(buf.read().u32().to_vec())
    }

    fn begin_read_u32(&self, buf: &CpuBuffer) -> Result<ReadTicket> {
        let data = self.download_u32(buf)?;
        let mut r = self.reads.lock().unwrap_or_else(|p| p.into_inner());
        r.0 += 1;
        let id = r.0;
        r.1.insert(id, data);
        Ok(ReadTicket(id))
    }

    fn finish_read_u32(&self, ticket: ReadTicket) -> Result<Vec<u32>> {
        self.reads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .1
            .remove(&ticket.0)
            .ok_or_else(|| Error::InvalidInput(format!("no readback with ticket {}", ticket.0)))
    }

    fn record_rms_norm(
        &self,
        x: &CpuBuffer,
        w: Option<&CpuBuffer>,
        res: Option<&CpuBuffer>,
        out: &CpuBuffer,
        p: RmsNorm,
    ) -> Result<()> {
        let (xr, wr, rr) = (x.read(), w.map(|w| w.read()), res.map(|r| r.read()));
        let wv = wr.as_ref().zip(w).map(|(r, w)| weights(r, w.dtype()));
        ops::rms_norm(
            xr.f32(),
            wv.as_ref(),
            rr.as_ref().map(|r| r.f32()),
            out.write("rms_norm")?.f32(),
            p,
        );
        Ok(())
    }

    fn record_matmul(
        &self,
        w: &CpuBuffer,
        x: &CpuBuffer,
        out: &CpuBuffer,
        p: Matmul,
    ) -> Result<()> {
        let (wr, xr) = (w.read(), x.read());
        let wt = weights(&wr, w.dtype());
        let r = self.rounds(
            OpKind::Matmul { w: w.dtype() },
            (p.m, p.k, p.precision),
            &wt,
        );
        ops::matmul(
            &wt.rounded_as(r),
            &ops::f16_rows(xr.f32(), p.k, r),
            out.write("matmul")?.f32(),
            p,
        );
        Ok(())
    }

    fn record_router(
        &self,
        x: &CpuBuffer,
        scale: &CpuBuffer,
        proj: &CpuBuffer,
        pes: &CpuBuffer,
        ids: &CpuBuffer,
        wts: &CpuBuffer,
        p: Router,
    ) -> Result<()> {
        let (xr, sr, pr, er) = (x.read(), scale.read(), proj.read(), pes.read());
        ops::router(
            xr.f32(),
            sr.f32(),
            &weights(&pr, proj.dtype()),
            er.f32(),
            ids.write("router")?.u32(),
            wts.write("router")?.f32(),
            p,
        );
        Ok(())
    }

    fn record_moe_gate_up(
        &self,
        x: &CpuBuffer,
        gate_up: &CpuBuffer,
        ids: &CpuBuffer,
        act: &CpuBuffer,
        p: Moe,
    ) -> Result<()> {
        let (xr, gr, ir) = (x.read(), gate_up.read(), ids.read());
        let wt = weights(&gr, gate_up.dtype());
        let kind = OpKind::MoeGateUp { w: gate_up.dtype() };
        let r = self.rounds(kind, (p.m, p.hidden, p.precision), &wt);
        ops::moe_gate_up(
            &ops::f16_rows(xr.f32(), p.hidden, r),
            &wt.rounded_as(r),
            ir.u32(),
            act.write("moe_gate_up")?.f32(),
            p,
        )
    }

    fn record_moe_down(
        &self,
        act: &CpuBuffer,
        down: &CpuBuffer,
        ids: &CpuBuffer,
        wts: &CpuBuffer,
        out: &CpuBuffer,
        p: Moe,
    ) -> Result<()> {
        let (ar, dr, ir, wr) = (act.read(), down.read(), ids.read(), wts.read());
        let wt = weights(&dr, down.dtype());
        let r = self.rounds(
            OpKind::MoeDown { w: down.dtype() },
            (p.m, p.inter, p.precision),
            &wt,
        );
        ops::moe_down(
            &ops::f16_rows(ar.f32(), p.inter, r),
            &wt.rounded_as(r),
            ir.u32(),
            wr.f32(),
            out.write("moe_down")?.f32(),
            p,
        )
    }

    fn record_rope(&self, x: &CpuBuffer, positions: &CpuBuffer, p: Rope) -> Result<()> {
        let pr = positions.read();
        ops::rope(x.write("rope")?.f32(), pr.u32(), p);
        Ok(())
    }

    fn record_kv_append(
        &self,
        k: &CpuBuffer,
        v: &CpuBuffer,
        kc: &CpuBuffer,
        vc: &CpuBuffer,
        positions: &CpuBuffer,
        p: KvAppend,
    ) -> Result<()> {
        let (kr, vr, pr) = (k.read(), v.read(), positions.read());
        let (kr, vr, pr) = (kr.f32(), vr.f32(), pr.u32());
        let (mut kw, mut vw) = (kc.write("kv_append")?, vc.write("kv_append")?);
        if kc.dtype() == DType::F16 {
            ops::kv_append(kr, kw.f16(), pr, p);
            ops::kv_append(vr, vw.f16(), pr, p);
        } else {
            ops::kv_append(kr, kw.f32(), pr, p);
            ops::kv_append(vr, vw.f32(), pr, p);
        }
        Ok(())
    }

    fn record_attention(
        &self,
        q: &CpuBuffer,
        kc: &CpuBuffer,
        vc: &CpuBuffer,
        positions: &CpuBuffer,
        out: &CpuBuffer,
        p: Attention,
    ) -> Result<()> {
        let (qr, kr, vr, pr) = (q.read(), kc.read(), vc.read(), positions.read());
        // (attention rounds per row, with no weight to range-check)
        let kind = OpKind::Attention {
            head_dim: p.head_dim as u32,
        };
        let r = self.rounding(&kind, p.m, p.head_dim, p.precision);
        // (an f16 cache widens whole: plain, and the attention reads most of
        // it anyway)
        ops::attention(
            qr.f32(),
            &kr.floats(kc.dtype()),
            &vr.floats(vc.dtype()),
            pr.u32(),
            out.write("attention")?.f32(),
            p,
            r,
        )
    }

    fn record_add(&self, a: &CpuBuffer, b: &CpuBuffer, out: &CpuBuffer, n: usize) -> Result<()> {
        let (ar, br) = (a.read(), b.read());
        ops::add(
            &ar.f32()[..n],
            &br.f32()[..n],
            &mut out.write("add")?.f32()[..n],
        );
        Ok(())
    }

    fn record_scale(&self, x: &CpuBuffer, out: &CpuBuffer, n: usize, s: f32) -> Result<()> {
        let xr = x.read();
        ops::scale(&xr.f32()[..n], &mut out.write("scale")?.f32()[..n], s);
        Ok(())
    }

    fn record_gelu_mul(&self, x: &CpuBuffer, out: &CpuBuffer, rows: usize, n: usize) -> Result<()> {
        let xr = x.read();
        ops::gelu_mul(xr.f32(), out.write("gelu_mul")?.f32(), rows, n);
        Ok(())
    }

    fn record_softcap(&self, x: &CpuBuffer, out: &CpuBuffer, n: usize, cap: f32) -> Result<()> {
        let xr = x.read();
        ops::softcap(&xr.f32()[..n], &mut out.write("softcap")?.f32()[..n], cap);
        Ok(())
    }

    fn record_embed(
        &self,
        ids: &CpuBuffer,
        table: &CpuBuffer,
        out: &CpuBuffer,
        p: Embed,
    ) -> Result<()> {
        let (ir, tr) = (ids.read(), table.read());
        ops::embed(
            ir.u32(),
            &weights(&tr, table.dtype()),
            out.write("embed")?.f32(),
            p,
        )
    }

    fn record_argmax(&self, x: &CpuBuffer, out: &CpuBuffer, rows: usize, n: usize) -> Result<()> {
        let xr = x.read();
        ops::argmax(xr.f32(), out.write("argmax")?.u32(), rows, n);
        Ok(())
    }

    fn record_slot_lookup(
        &self,
        ids: &CpuBuffer,
        table: &CpuBuffer,
        slot_ids: &CpuBuffer,
        log: &CpuBuffer,
        p: SlotLookup,
    ) -> Result<()> {
        let (ir, tr) = (ids.read(), table.read());
        let (slots, logged) = v::slot_lookup(&ir.u32()[..p.n], &tr.u32()[..p.experts], p.slots);
        slot_ids.write("slot_lookup")?.u32()[..p.n].copy_from_slice(&slots);
        log.write("slot_lookup")?.u32()[p.at..p.at + p.n].copy_from_slice(&logged);
        Ok(())
    }

    fn record_post_attention(
        &self,
        o: &CpuBuffer,
        x: &CpuBuffer,
        w_post: &CpuBuffer,
        w_ff: &CpuBuffer,
        r: &CpuBuffer,
        ff: &CpuBuffer,
        moe: Option<(&CpuBuffer, &CpuBuffer)>,
        p: PostAttention,
    ) -> Result<()> {
        const OP: &str = "post_attention";
        let (w_moe, moe_out) = (moe.map(|m| m.0), moe.map(|m| m.1));
        let (or, xr, wpr, wfr) = (o.read(), x.read(), w_post.read(), w_ff.read());
        let wmr = w_moe.map(|w| w.read());
        let (mut rw, mut fw) = (r.write(OP)?, ff.write(OP)?);
        let mut mw = moe_out.map(|m| m.write(OP)).transpose()?;
        let wm = wmr.as_ref().zip(w_moe).map(|(g, w)| weights(g, w.dtype()));
        ops::post_attention(
            or.f32(),
            xr.f32(),
            &weights(&wpr, w_post.dtype()),
            &weights(&wfr, w_ff.dtype()),
            rw.f32(),
            fw.f32(),
            wm.as_ref().zip(mw.as_mut().map(|m| m.f32())),
            p,
        );
        Ok(())
    }

    fn record_post_ffn(&self, a: PostFfnArgs<'_, CpuBuffer>) -> Result<()> {
        let PostFfnArgs {
            dense,
            w_dense,
            moe,
            r,
            x,
            next,
            p,
        } = a;
        const OP: &str = "post_ffn";
        let (m_act, w_moe, w_sum) = (moe.map(|m| m.0), moe.map(|m| m.1), moe.map(|m| m.2));
        let (w_next, normed) = (next.map(|n| n.0), next.map(|n| n.1));
        let (dr, wdr, rr) = (dense.read(), w_dense.read(), r.read());
        let (mr, wmr, wsr, wnr) = (
            m_act.map(|b| b.read()),
            w_moe.map(|b| b.read()),
            w_sum.map(|b| b.read()),
            w_next.map(|b| b.read()),
        );
        let mut xw = x.write(OP)?;
        let mut nw = normed.map(|b| b.write(OP)).transpose()?;
        let wm = wmr.as_ref().zip(w_moe).map(|(g, w)| weights(g, w.dtype()));
        let ws = wsr.as_ref().zip(w_sum).map(|(g, w)| weights(g, w.dtype()));
        let wn = wnr.as_ref().zip(w_next).map(|(g, w)| weights(g, w.dtype()));
        let moe_args = match (&mr, &wm, &ws) {
            (Some(a), Some(wm), Some(ws)) => Some((a.f32(), wm, ws)),
            _ => None,
        };
        ops::post_ffn(
            dr.f32(),
            &weights(&wdr, w_dense.dtype()),
            moe_args,
            rr.f32(),
            xw.f32(),
            wn.as_ref().zip(nw.as_mut().map(|n| n.f32())),
            p,
        );
        Ok(())
    }

    fn record_qkv_post(
        &self,
        raw: &CpuBuffer,
        w_q: &CpuBuffer,
        w_k: &CpuBuffer,
        positions: &CpuBuffer,
        q: &CpuBuffer,
        k_cache: &CpuBuffer,
        v_cache: &CpuBuffer,
        p: QkvPost,
    ) -> Result<()> {
        const OP: &str = "qkv_post";
        let (rr, wqr, wkr, pr) = (raw.read(), w_q.read(), w_k.read(), positions.read());
        let (wq, wk) = (weights(&wqr, w_q.dtype()), weights(&wkr, w_k.dtype()));
        let mut qw = q.write(OP)?;
        let (rr, pr, qw) = (rr.f32(), pr.u32(), qw.f32());
        let (mut kw, mut vw) = (k_cache.write(OP)?, v_cache.write(OP)?);
        if k_cache.dtype() == DType::F16 {
            ops::qkv_post(rr, &wq, &wk, pr, qw, kw.f16(), vw.f16(), p);
        } else {
            ops::qkv_post(rr, &wq, &wk, pr, qw, kw.f32(), vw.f32(), p);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `download_f32` reads f32 and f16 buffers, owned or mapped from a
    /// file (a weight uploaded without a copy), f16 widened exactly; other
    /// dtypes are an error, not a panic.
    #[test]
    fn download_f32_reads_f32_and_f16_owned_or_mapped() {
        let b = CpuBackend::new();
        let vals = [1.5f32, -2.25, 0.125, 3.0];
        let f32_bytes: Vec<u8> = bytemuck::cast_slice(&vals).to_vec();
        let f16_bytes: Vec<u8> = vals
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
            .collect();
        // one file holding both, the f32 part at an odd offset
        let path = std::env::temp_dir().join(format!("turbospark-cpu-map-{}", std::process::id()));
        let mut file = vec![0u8];
        file.extend(&f32_bytes);
        file.extend(&f16_bytes);
        std::fs::write(&path, &file).unwrap();
        let map =
            Arc::new(unsafe { memmap2::Mmap::map(&std::fs::File::open(&path).unwrap()) }.unwrap());
        let mapped = |dtype, offset, len| {
            let bytes = HostBytes::Mapped {
                map: map.clone(),
                offset,
                len,
            };
            b.upload(dtype, bytes, "mapped").unwrap()
        };
        for buf in [
            b.upload(DType::F32, HostBytes::Slice(&f32_bytes), "owned")
                .unwrap(),
            b.upload(DType::F16, HostBytes::Slice(&f16_bytes), "owned")
                .unwrap(),
            mapped(DType::F32, 1, 16),
            mapped(DType::F16, 17, 8),
        ] {
            assert_eq!(b.download_f32(&buf).unwrap(), vals);
        }
        let ids = b
            .upload(DType::U32, HostBytes::Slice(&f32_bytes), "ids")
            .unwrap();
        assert!(b.download_f32(&ids).is_err());
        std::fs::remove_file(&path).unwrap();
    }
}
