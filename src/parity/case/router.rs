//! The MoE router: logits, top-k and the weights of the chosen experts.

use super::inputs::weight;
use super::{weight_bytes, Case};
use crate::backend::ComputeBackend;
use crate::ops::{self, OpKind};
use crate::parity::{compare, HostTensor, OutSpec, Verdict};
use crate::rng::Rng;
use crate::{DType, Result};

/// `router` with a projection of dtype `w`. Judged as expert sets (ties at
/// the k-th place allowed), then the NMSE of the sorted weights.
#[derive(Clone, Copy, Debug)]
pub struct Router {
    pub p: ops::Router,
    pub w: DType,
}

impl Case for Router {
    fn op_name(&self) -> &'static str {
        "router"
    }

    fn family(&self) -> &'static str {
        if self.w.is_quantized() {
            "router_quantized"
        } else {
            "router"
        }
    }

    fn name(&self) -> String {
        let (p, w) = (&self.p, self.w);
        format!(
            "{}(e={},k={},hidden={},m={},w={w})",
            self.family(),
            p.experts,
            p.top_k,
            p.hidden,
            p.m
        )
    }

    fn kind(&self) -> OpKind {
        OpKind::Router { w: self.w }
    }

    /// Dot products of thousands of terms, reordered.
    fn limit(&self) -> f64 {
        1e-9
    }

    fn inputs(&self, rng: &mut Rng) -> Vec<HostTensor> {
        let p = &self.p;
        vec![
            HostTensor::F32(rng.vec_normal(p.m * p.hidden, 2.0)),
            HostTensor::F32(
                rng.vec_range(p.hidden, 0.5, 1.5)
                    .iter()
                    .map(|s| s / (p.hidden as f32).sqrt())
                    .collect(),
            ),
            weight(rng, self.w, p.experts, p.hidden, 1.0),
            HostTensor::F32(rng.vec_range(p.experts, 0.5, 1.5)),
        ]
    }

    fn outputs(&self) -> Vec<OutSpec> {
        let k = self.p.m * self.p.top_k;
        vec![OutSpec::U32(k), OutSpec::F32(k)]
    }

    fn record<B: ComputeBackend>(&self, b: &B, i: &[B::Buffer], o: &[B::Buffer]) -> Result<()> {
        b.router(&i[0], &i[1], &i[2], &i[3], &o[0], &o[1], self.p)
    }

    fn judge(
        &self,
        limit: f64,
        inputs: &[HostTensor],
        r: &[HostTensor],
        d: &[HostTensor],
    ) -> Verdict {
        let e = compare::judge_router(&self.p, inputs, r, d)?;
        compare::at_most("weights", e, limit)
    }

    fn flops(&self) -> Option<u64> {
        let p = &self.p;
        Some(2 * (p.m * p.experts * p.hidden) as u64)
    }

    /// x, its scale, the projection and the per-expert scale read; ids and
    /// weights written.
    fn bytes(&self, _inputs: &[HostTensor]) -> u64 {
        let p = &self.p;
        let (m, h, e, k) = (
            p.m as u64,
            p.hidden as u64,
            p.experts as u64,
            p.top_k as u64,
        );
        m * h * 4 + h * 4 + weight_bytes(self.w, e * h) + e * 4 + 2 * m * k * 4
    }
}
