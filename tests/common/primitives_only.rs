//! A backend that implements only the trait's primitive ops (buffers,
//! rms_norm, matmul, router, the MoE phases, rope, kv_append, attention, the
//! elementwise ops, embed, argmax), each forwarded to the CPU reference, and
//! takes every fused op's default body. It is what a new backend starts as:
//! if the model runs correctly on it, the fused ops are a backend's business.
//! Its hooks check nothing (the CPU reference's hooks take the arguments as
//! they come) and log each call, so a test can see that the trait's checks
//! reject a bad call before any hook runs.

use std::sync::Mutex;

use turbospark::backend::BackendInfo;
use turbospark::ops::{
    Attention, CopyRange, Embed, KvAppend, Matmul, Moe, OpKind, RmsNorm, Rope, Router,
};
use turbospark::{
    ComputeBackend, DType, ExpertBytes, ExpertStack, HostBytes, ReadTicket, Result, SlotWrite,
    Support,
};
use turbospark_cpu::{CpuBackend, CpuBuffer};

pub struct PrimitivesOnly {
    cpu: CpuBackend,
    info: BackendInfo,
    /// The hooks called, in order, since the last `take_calls`.
    calls: Mutex<Vec<&'static str>>,
}

impl PrimitivesOnly {
    pub fn new() -> Self {
        let cpu = CpuBackend::new();
        let mut info = cpu.info().clone();
        info.backend = "primitives-only".into();
        info.device_name = "CPU reference, primitive ops only".into();
        Self {
            cpu,
            info,
            calls: Mutex::default(),
        }
    }

    /// The ops whose hooks ran since the last call, in order.
    #[allow(dead_code)] // (tests/backend_errors.rs reads it; tests/oracle.rs does not)
    pub fn take_calls(&self) -> Vec<&'static str> {
        std::mem::take(&mut *self.calls.lock().unwrap())
    }

    fn called(&self, op: &'static str) {
        self.calls.lock().unwrap().push(op);
    }
}

impl ComputeBackend for PrimitivesOnly {
    type Buffer = CpuBuffer;

    fn info(&self) -> &BackendInfo {
        &self.info
    }
    fn supports(&self, op: &OpKind) -> Support {
        self.cpu.supports(op)
    }
    fn alloc(&self, dtype: DType, len: usize, label: &str) -> Result<CpuBuffer> {
        self.cpu.alloc(dtype, len, label)
    }
    fn upload(&self, dtype: DType, bytes: HostBytes<'_>, label: &str) -> Result<CpuBuffer> {
        self.cpu.upload(dtype, bytes, label)
    }
    fn upload_weight(
        &self,
        dtype: DType,
        rows: usize,
        cols: usize,
        bytes: HostBytes<'_>,
        label: &str,
    ) -> Result<CpuBuffer> {
        self.cpu.upload_weight(dtype, rows, cols, bytes, label)
    }
    fn write_experts(
        &self,
        buf: &CpuBuffer,
        dtype: DType,
        stack: ExpertStack,
        shape: (usize, usize),
        writes: &[(usize, ExpertBytes<'_>)],
    ) -> Result<SlotWrite> {
        self.cpu.write_experts(buf, dtype, stack, shape, writes)
    }
    fn write_f32(&self, buf: &CpuBuffer, offset: usize, data: &[f32]) -> Result<()> {
        self.cpu.write_f32(buf, offset, data)
    }
    fn write_u32(&self, buf: &CpuBuffer, offset: usize, data: &[u32]) -> Result<()> {
        self.cpu.write_u32(buf, offset, data)
    }
    fn record_copy_buffer(&self, src: &CpuBuffer, dst: &CpuBuffer) -> Result<()> {
        self.cpu.record_copy_buffer(src, dst)
    }
    fn record_copy_range(&self, src: &CpuBuffer, dst: &CpuBuffer, p: CopyRange) -> Result<()> {
        self.cpu.record_copy_range(src, dst, p)
    }
    fn flush(&self) -> Result<()> {
        self.cpu.flush()
    }
    fn sync(&self) -> Result<()> {
        self.cpu.sync()
    }
    fn download_f32(&self, buf: &CpuBuffer) -> Result<Vec<f32>> {
        self.cpu.download_f32(buf)
    }
    fn download_u32(&self, buf: &CpuBuffer) -> Result<Vec<u32>> {
        self.cpu.download_u32(buf)
    }
    fn begin_read_u32(&self, buf: &CpuBuffer) -> Result<ReadTicket> {
        self.cpu.begin_read_u32(buf)
    }
    fn finish_read_u32(&self, ticket: ReadTicket) -> Result<Vec<u32>> {
        self.cpu.finish_read_u32(ticket)
    }
    fn record_rms_norm(
        &self,
        x: &CpuBuffer,
        weight: Option<&CpuBuffer>,
        residual: Option<&CpuBuffer>,
        out: &CpuBuffer,
        p: RmsNorm,
    ) -> Result<()> {
        self.called("rms_norm");
        self.cpu.record_rms_norm(x, weight, residual, out, p)
    }
    fn record_matmul(
        &self,
        w: &CpuBuffer,
        x: &CpuBuffer,
        out: &CpuBuffer,
        p: Matmul,
    ) -> Result<()> {
        self.called("matmul");
        self.cpu.record_matmul(w, x, out, p)
    }
    fn record_router(
        &self,
        x: &CpuBuffer,
        eff_scale: &CpuBuffer,
        proj: &CpuBuffer,
        per_expert_scale: &CpuBuffer,
        ids: &CpuBuffer,
        weights: &CpuBuffer,
        p: Router,
    ) -> Result<()> {
        self.called("router");
        self.cpu
            .record_router(x, eff_scale, proj, per_expert_scale, ids, weights, p)
    }
    fn record_moe_gate_up(
        &self,
        x: &CpuBuffer,
        gate_up: &CpuBuffer,
        ids: &CpuBuffer,
        act: &CpuBuffer,
        p: Moe,
    ) -> Result<()> {
        self.called("moe_gate_up");
        self.cpu.record_moe_gate_up(x, gate_up, ids, act, p)
    }
    fn record_moe_down(
        &self,
        act: &CpuBuffer,
        down: &CpuBuffer,
        ids: &CpuBuffer,
        weights: &CpuBuffer,
        out: &CpuBuffer,
        p: Moe,
    ) -> Result<()> {
        self.called("moe_down");
        self.cpu.record_moe_down(act, down, ids, weights, out, p)
    }
    fn record_rope(&self, x: &CpuBuffer, positions: &CpuBuffer, p: Rope) -> Result<()> {
        self.called("rope");
        self.cpu.record_rope(x, positions, p)
    }
    fn record_kv_append(
        &self,
        k: &CpuBuffer,
        v: &CpuBuffer,
        k_cache: &CpuBuffer,
        v_cache: &CpuBuffer,
        positions: &CpuBuffer,
        p: KvAppend,
    ) -> Result<()> {
        self.called("kv_append");
        self.cpu
            .record_kv_append(k, v, k_cache, v_cache, positions, p)
    }
    fn record_attention(
        &self,
        q: &CpuBuffer,
        k_cache: &CpuBuffer,
        v_cache: &CpuBuffer,
        positions: &CpuBuffer,
        out: &CpuBuffer,
        p: Attention,
    ) -> Result<()> {
        self.called("attention");
        self.cpu
            .record_attention(q, k_cache, v_cache, positions, out, p)
    }
    fn record_add(&self, a: &CpuBuffer, b: &CpuBuffer, out: &CpuBuffer, n: usize) -> Result<()> {
        self.called("add");
        self.cpu.record_add(a, b, out, n)
    }
    fn record_scale(&self, x: &CpuBuffer, out: &CpuBuffer, n: usize, s: f32) -> Result<()> {
        self.called("scale");
        self.cpu.record_scale(x, out, n, s)
    }
    fn record_gelu_mul(&self, x: &CpuBuffer, out: &CpuBuffer, rows: usize, n: usize) -> Result<()> {
        self.called("gelu_mul");
        self.cpu.record_gelu_mul(x, out, rows, n)
    }
    fn record_softcap(&self, x: &CpuBuffer, out: &CpuBuffer, n: usize, cap: f32) -> Result<()> {
        self.called("softcap");
        self.cpu.record_softcap(x, out, n, cap)
    }
    fn record_embed(
        &self,
        ids: &CpuBuffer,
        table: &CpuBuffer,
        out: &CpuBuffer,
        p: Embed,
    ) -> Result<()> {
        self.called("embed");
        self.cpu.record_embed(ids, table, out, p)
    }
    fn record_argmax(&self, x: &CpuBuffer, out: &CpuBuffer, rows: usize, n: usize) -> Result<()> {
        self.called("argmax");
        self.cpu.record_argmax(x, out, rows, n)
    }
}
