//! The element-wise ops: add, scale, the GELU product and the softcap.

use super::Case;
use crate::backend::ComputeBackend;
use crate::ops::OpKind;
use crate::parity::{HostTensor, OutSpec};
use crate::rng::Rng;
use crate::Result;

/// `add` of two vectors of n.
#[derive(Clone, Copy, Debug)]
pub struct Add {
    pub n: usize,
}

/// `scale` of a vector of n by s.
#[derive(Clone, Copy, Debug)]
pub struct Scale {
    pub n: usize,
    pub s: f32,
}

/// `gelu_mul`: rows of gate|up (2n) to rows of n.
#[derive(Clone, Copy, Debug)]
pub struct GeluMul {
    pub rows: usize,
    pub n: usize,
}

/// `softcap` of a vector of n at cap.
#[derive(Clone, Copy, Debug)]
pub struct Softcap {
    pub n: usize,
    pub cap: f32,
}

impl Case for Add {
    fn op_name(&self) -> &'static str {
        "add"
    }

    fn name(&self) -> String {
        format!("{}(n={})", self.family(), self.n)
    }

    fn kind(&self) -> OpKind {
        OpKind::Add
    }

    /// One rounding, the same on both sides: bit-exact.
    fn limit(&self) -> f64 {
        0.0
    }

    fn inputs(&self, rng: &mut Rng) -> Vec<HostTensor> {
        vec![
            HostTensor::F32(rng.vec_normal(self.n, 1.0)),
            HostTensor::F32(rng.vec_normal(self.n, 1.0)),
        ]
    }

    fn outputs(&self) -> Vec<OutSpec> {
        vec![OutSpec::F32(self.n)]
    }

    fn record<B: ComputeBackend>(&self, b: &B, i: &[B::Buffer], o: &[B::Buffer]) -> Result<()> {
        b.add(&i[0], &i[1], &o[0], self.n)
    }
}

impl Case for Scale {
    fn op_name(&self) -> &'static str {
        "scale"
    }

    fn name(&self) -> String {
        format!("{}(n={},s={})", self.family(), self.n, self.s)
    }

    fn kind(&self) -> OpKind {
        OpKind::Scale
    }

    /// One multiply: bit-exact.
    fn limit(&self) -> f64 {
        0.0
    }

    fn inputs(&self, rng: &mut Rng) -> Vec<HostTensor> {
        vec![HostTensor::F32(rng.vec_normal(self.n, 1.0))]
    }

    fn outputs(&self) -> Vec<OutSpec> {
        vec![OutSpec::F32(self.n)]
    }

    fn record<B: ComputeBackend>(&self, b: &B, i: &[B::Buffer], o: &[B::Buffer]) -> Result<()> {
        b.scale(&i[0], &o[0], self.n, self.s)
    }
}

impl Case for GeluMul {
    fn op_name(&self) -> &'static str {
        "gelu_mul"
    }

    fn name(&self) -> String {
        format!("{}(rows={},n={})", self.family(), self.rows, self.n)
    }

    fn kind(&self) -> OpKind {
        OpKind::GeluMul
    }

    /// One tanh (a few ulp on GPUs) per element.
    fn limit(&self) -> f64 {
        1e-11
    }

    fn inputs(&self, rng: &mut Rng) -> Vec<HostTensor> {
        vec![HostTensor::F32(rng.vec_normal(self.rows * 2 * self.n, 2.0))]
    }

    fn outputs(&self) -> Vec<OutSpec> {
        vec![OutSpec::F32(self.rows * self.n)]
    }

    fn record<B: ComputeBackend>(&self, b: &B, i: &[B::Buffer], o: &[B::Buffer]) -> Result<()> {
        b.gelu_mul(&i[0], &o[0], self.rows, self.n)
    }

    /// gate|up read (two rows of n), one row of n written.
    fn bytes(&self, _inputs: &[HostTensor]) -> u64 {
        (self.rows * self.n) as u64 * 4 * 3
    }
}

impl Case for Softcap {
    fn op_name(&self) -> &'static str {
        "softcap"
    }

    fn name(&self) -> String {
        format!("{}(n={},cap={})", self.family(), self.n, self.cap)
    }

    fn kind(&self) -> OpKind {
        OpKind::Softcap
    }

    /// One tanh (a few ulp on GPUs) per element.
    fn limit(&self) -> f64 {
        1e-11
    }

    fn inputs(&self, rng: &mut Rng) -> Vec<HostTensor> {
        vec![HostTensor::F32(rng.vec_normal(self.n, 2.0 * self.cap))]
    }

    fn outputs(&self) -> Vec<OutSpec> {
        vec![OutSpec::F32(self.n)]
    }

    fn record<B: ComputeBackend>(&self, b: &B, i: &[B::Buffer], o: &[B::Buffer]) -> Result<()> {
        b.softcap(&i[0], &o[0], self.n, self.cap)
    }
}
