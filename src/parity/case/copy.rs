//! `copy_range`: a range of one buffer into a range of another (a copy
//! command on a GPU, no kernel), as a batched decode step moves each
//! sequence's rows between the batch's activations and its attention.

use super::Case;
use crate::backend::ComputeBackend;
use crate::ops::{self, OpKind};
use crate::parity::{HostTensor, OutSpec};
use crate::rng::Rng;
use crate::Result;

/// `copy_range` from a source of `src_len` f32 into a destination of
/// `dst_len`, whose other elements must stay as they were.
#[derive(Clone, Copy, Debug)]
pub struct CopyRange {
    pub p: ops::CopyRange,
    pub src_len: usize,
    pub dst_len: usize,
}

impl Case for CopyRange {
    fn op_name(&self) -> &'static str {
        "copy_range"
    }

    fn name(&self) -> String {
        let p = &self.p;
        format!(
            "{}(src={}@{},dst={}@{},len={})",
            self.family(),
            self.src_len,
            p.src_offset,
            self.dst_len,
            p.dst_offset,
            p.len
        )
    }

    fn kind(&self) -> OpKind {
        OpKind::CopyRange
    }

    /// A copy: bit-exact, the rest of the destination and its guard
    /// untouched.
    fn limit(&self) -> f64 {
        0.0
    }

    fn inputs(&self, rng: &mut Rng) -> Vec<HostTensor> {
        vec![
            HostTensor::F32(rng.vec_normal(self.src_len, 1.0)),
            HostTensor::F32(rng.vec_normal(self.dst_len, 1.0)),
        ]
    }

    /// The destination, written in place.
    fn outputs(&self) -> Vec<OutSpec> {
        vec![OutSpec::InPlace(1, self.dst_len)]
    }

    fn record<B: ComputeBackend>(&self, b: &B, i: &[B::Buffer], _o: &[B::Buffer]) -> Result<()> {
        b.copy_range(&i[0], &i[1], self.p)
    }
}
