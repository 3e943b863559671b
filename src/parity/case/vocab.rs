//! The ops over the vocabulary: the embedding lookup and the argmax of the
//! logits.

use super::inputs::weight;
use super::Case;
use crate::backend::ComputeBackend;
use crate::ops::{self, OpKind};
use crate::parity::{compare, HostTensor, OutSpec, Verdict};
use crate::rng::Rng;
use crate::{DType, Result};

/// `embed` from a table of dtype `w`.
#[derive(Clone, Copy, Debug)]
pub struct Embed {
    pub p: ops::Embed,
    pub w: DType,
}

/// `argmax` of each of `rows` rows of n. Judged by the reference's choice,
/// or another of the same value.
#[derive(Clone, Copy, Debug)]
pub struct Argmax {
    pub rows: usize,
    pub n: usize,
}

impl Case for Embed {
    fn op_name(&self) -> &'static str {
        "embed"
    }

    fn family(&self) -> &'static str {
        if self.w.is_quantized() {
            "embed_quantized"
        } else {
            "embed"
        }
    }

    fn name(&self) -> String {
        let (p, w) = (&self.p, self.w);
        format!(
            "{}(m={},hidden={},vocab={},w={w})",
            self.family(),
            p.m,
            p.hidden,
            p.vocab
        )
    }

    fn kind(&self) -> OpKind {
        OpKind::Embed { w: self.w }
    }

    /// A copy (a dequantised one exact in f32) and one multiply: bit-exact.
    fn limit(&self) -> f64 {
        0.0
    }

    fn inputs(&self, rng: &mut Rng) -> Vec<HostTensor> {
        let p = &self.p;
        vec![
            HostTensor::U32((0..p.m).map(|_| rng.below(p.vocab as u64) as u32).collect()),
            weight(rng, self.w, p.vocab, p.hidden, 1.0),
        ]
    }

    fn outputs(&self) -> Vec<OutSpec> {
        vec![OutSpec::F32(self.p.m * self.p.hidden)]
    }

    fn record<B: ComputeBackend>(&self, b: &B, i: &[B::Buffer], o: &[B::Buffer]) -> Result<()> {
        b.embed(&i[0], &i[1], &o[0], self.p)
    }
}

impl Case for Argmax {
    fn op_name(&self) -> &'static str {
        "argmax"
    }

    fn name(&self) -> String {
        format!("{}(rows={},n={})", self.family(), self.rows, self.n)
    }

    fn kind(&self) -> OpKind {
        OpKind::Argmax
    }

    /// A choice: exact.
    fn limit(&self) -> f64 {
        0.0
    }

    fn inputs(&self, rng: &mut Rng) -> Vec<HostTensor> {
        vec![HostTensor::F32(rng.vec_normal(self.rows * self.n, 3.0))]
    }

    fn outputs(&self) -> Vec<OutSpec> {
        vec![OutSpec::U32(self.rows)]
    }

    fn record<B: ComputeBackend>(&self, b: &B, i: &[B::Buffer], o: &[B::Buffer]) -> Result<()> {
        b.argmax(&i[0], &o[0], self.rows, self.n)
    }

    fn judge(
        &self,
        _limit: f64,
        inputs: &[HostTensor],
        r: &[HostTensor],
        d: &[HostTensor],
    ) -> Verdict {
        compare::judge_argmax(self.rows, self.n, inputs, r, d)
    }

    /// The logits read, one id a row written.
    fn bytes(&self, _inputs: &[HostTensor]) -> u64 {
        (self.rows * self.n) as u64 * 4 + self.rows as u64 * 4
    }
}
