//! RMSNorm.

use super::inputs::norm_weight;
use super::Case;
use crate::backend::ComputeBackend;
use crate::ops::{self, OpKind};
use crate::parity::{HostTensor, OutSpec};
use crate::rng::Rng;
use crate::{DType, Result};

/// `rms_norm`: with a norm weight of dtype `weight` (or none), and a
/// residual input where `residual`.
#[derive(Clone, Copy, Debug)]
pub struct RmsNorm {
    pub p: ops::RmsNorm,
    pub weight: Option<DType>,
    pub residual: bool,
}

impl Case for RmsNorm {
    fn op_name(&self) -> &'static str {
        "rms_norm"
    }

    fn name(&self) -> String {
        let p = &self.p;
        format!(
            "{}(rows={},dim={},w={},residual={},scale={})",
            self.family(),
            p.rows,
            p.dim,
            self.weight
                .map(|d| d.name())
                .unwrap_or_else(|| "none".into()),
            self.residual,
            p.scale
        )
    }

    fn kind(&self) -> OpKind {
        OpKind::RmsNorm
    }

    /// One RMSNorm over a row.
    fn limit(&self) -> f64 {
        1e-11
    }

    fn inputs(&self, rng: &mut Rng) -> Vec<HostTensor> {
        let p = &self.p;
        let n = p.rows * p.dim;
        let mut v = vec![HostTensor::F32(rng.vec_normal(n, 1.5))];
        if let Some(d) = self.weight {
            v.push(norm_weight(rng, d, p.dim));
        }
        if self.residual {
            v.push(HostTensor::F32(rng.vec_normal(n, 1.0)));
        }
        v
    }

    fn outputs(&self) -> Vec<OutSpec> {
        vec![OutSpec::F32(self.p.rows * self.p.dim)]
    }

    fn record<B: ComputeBackend>(&self, b: &B, i: &[B::Buffer], o: &[B::Buffer]) -> Result<()> {
        let w = self.weight.map(|_| &i[1]);
        let r = self
            .residual
            .then(|| &i[if self.weight.is_some() { 2 } else { 1 }]);
        b.rms_norm(&i[0], w, r, &o[0], self.p)
    }

    /// The row (and the residual) read, the row written, the weight read.
    fn bytes(&self, _inputs: &[HostTensor]) -> u64 {
        let p = &self.p;
        let n = (p.rows * p.dim) as u64;
        n * 4 * (2 + self.residual as u64)
            + self.weight.map_or(0, |d| p.dim as u64 * d.size() as u64)
    }
}
