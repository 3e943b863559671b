//! RoPE in place.

use super::Case;
use crate::backend::ComputeBackend;
use crate::ops::{self, OpKind};
use crate::parity::{HostTensor, OutSpec};
use crate::rng::Rng;
use crate::Result;

/// `rope` on m rows at random positions below 40000.
#[derive(Clone, Copy, Debug)]
pub struct Rope {
    pub p: ops::Rope,
}

impl Case for Rope {
    fn op_name(&self) -> &'static str {
        "rope"
    }

    fn name(&self) -> String {
        let p = &self.p;
        format!(
            "{}(m={},heads={},head_dim={},rot_pairs={},theta={})",
            self.family(),
            p.m,
            p.heads,
            p.head_dim,
            p.rot_pairs,
            p.theta
        )
    }

    fn kind(&self) -> OpKind {
        OpKind::Rope
    }

    /// sin/cos of angles up to ~1e5 rad after range reduction.
    fn limit(&self) -> f64 {
        1e-9
    }

    fn inputs(&self, rng: &mut Rng) -> Vec<HostTensor> {
        let p = &self.p;
        vec![
            HostTensor::F32(rng.vec_normal(p.m * p.heads * p.head_dim, 1.0)),
            HostTensor::U32((0..p.m).map(|_| rng.below(40_000) as u32).collect()),
        ]
    }

    fn outputs(&self) -> Vec<OutSpec> {
        vec![OutSpec::InPlace(
            0,
            self.p.m * self.p.heads * self.p.head_dim,
        )]
    }

    fn record<B: ComputeBackend>(&self, b: &B, i: &[B::Buffer], _o: &[B::Buffer]) -> Result<()> {
        b.rope(&i[0], &i[1], self.p)
    }
}
