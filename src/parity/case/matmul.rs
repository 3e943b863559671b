//! The dense GEMM / GEMV.

use super::inputs::weight;
use super::rounding::{rounded_nmse, rounds};
use super::{weight_bytes, Case};
use crate::backend::ComputeBackend;
use crate::ops::{self, OpKind};
use crate::parity::{HostTensor, OutSpec};
use crate::rng::Rng;
use crate::{DType, Result};

/// `matmul` with a weight of dtype `w`.
#[derive(Clone, Copy, Debug)]
pub struct Matmul {
    pub p: ops::Matmul,
    pub w: DType,
}

impl Case for Matmul {
    fn op_name(&self) -> &'static str {
        "matmul"
    }

    fn family(&self) -> &'static str {
        if self.w.is_quantized() {
            "matmul_quantized"
        } else {
            "matmul"
        }
    }

    fn name(&self) -> String {
        let (p, w) = (&self.p, self.w);
        format!("{}(m={},n={},k={},w={w})", self.family(), p.m, p.n, p.k)
    }

    fn kind(&self) -> OpKind {
        OpKind::Matmul { w: self.w }
    }

    /// Dot products of thousands of terms, reordered.
    fn limit(&self) -> f64 {
        1e-9
    }

    fn limit_on<B: ComputeBackend + ?Sized>(&self, device: &B) -> f64 {
        if rounds(device, self.p.precision, &self.kind(), (self.p.m, self.p.k)) {
            self.limit().max(rounded_nmse(self.w))
        } else {
            self.limit()
        }
    }

    fn inputs(&self, rng: &mut Rng) -> Vec<HostTensor> {
        let p = &self.p;
        vec![
            weight(rng, self.w, p.n, p.k, 1.0 / (p.k as f32).sqrt()),
            HostTensor::F32(rng.vec_normal(p.m * p.k, 1.0)),
        ]
    }

    fn outputs(&self) -> Vec<OutSpec> {
        vec![OutSpec::F32(self.p.m * self.p.n)]
    }

    fn record<B: ComputeBackend>(&self, b: &B, i: &[B::Buffer], o: &[B::Buffer]) -> Result<()> {
        b.matmul(&i[0], &i[1], &o[0], self.p)
    }

    fn flops(&self) -> Option<u64> {
        let p = &self.p;
        Some(2 * (p.m * p.n * p.k) as u64)
    }

    fn bytes(&self, _inputs: &[HostTensor]) -> u64 {
        let (m, n, k) = (self.p.m as u64, self.p.n as u64, self.p.k as u64);
        weight_bytes(self.w, n * k) + m * k * 4 + m * n * 4
    }
}
