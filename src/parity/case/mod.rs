//! The parity cases, one struct per op family in the spirit of llama.cpp's
//! `test_case`: each holds its parameters and says how to draw its inputs,
//! record it on a backend, judge it (its NMSE limit, on a device too) and
//! what it does for the bench (bytes moved, FLOPs), behind [`Case`]. [`Op`]
//! holds a case of any family.

mod attention;
mod copy;
mod elementwise;
mod inputs;
mod kv_append;
mod matmul;
mod moe;
mod norm;
mod post_attention;
mod post_attention_slots;
mod post_ffn;
mod qkv_post;
mod rope;
mod rounding;
mod router;
mod slots;
mod vocab;

pub use attention::Attention;
pub use copy::CopyRange;
pub use elementwise::{Add, GeluMul, Scale, Softcap};
pub use kv_append::KvAppend;
pub use matmul::Matmul;
pub use moe::{MoeDown, MoeDownPair, MoeGateUp, MoeGateUpPair};
pub use norm::RmsNorm;
pub use post_attention::{PostAttention, PostAttentionGateUp, PostAttentionRouter};
pub use post_attention_slots::PostAttentionGateUpSlots;
pub use post_ffn::{MoeDownPairPostFfn, PostFfn};
pub use qkv_post::{QkvPost, QkvPostAttention, QkvPostAttentionRow};
pub use rope::Rope;
pub use rounding::{
    rounded_attention_nmse, AFFINE_F16_NMSE, AFFINE_SPLIT_NMSE, F16_INPUT_NMSE,
    F16_PROBABILITY_NMSE, PROBABILITY_FLIPS, SPLIT_INPUT_NMSE,
};
pub use router::Router;
pub use slots::SlotLookup;
pub use vocab::{Argmax, Embed};

use super::{compare, HostTensor, OutSpec, Verdict};
use crate::backend::ComputeBackend;
use crate::ops::OpKind;
use crate::rng::Rng;
use crate::{DType, Result};

/// One op case. Inputs come first in [`Case::inputs`]; [`Case::record`]
/// receives the uploaded inputs and the fresh output buffers in
/// [`Case::outputs`]' order.
pub trait Case {
    /// The op's name (`ComputeBackend`'s method).
    fn op_name(&self) -> &'static str;

    /// The family the case belongs to (one WGSL kernel family); cases
    /// whose weights are quantized form a family of their own per op
    /// (`matmul_quantized`, ...).
    fn family(&self) -> &'static str {
        self.op_name()
    }

    /// Printable, filterable name:
    /// `moe_down(e=128,k=8,hidden=2816,inter=704,m=1,w=bf16)`.
    fn name(&self) -> String;

    /// What the op is, for [`ComputeBackend::supports`].
    fn kind(&self) -> OpKind;

    /// NMSE limit. Both sides compute in f32 from identical inputs, so the
    /// only differences are summation order and transcendental precision:
    /// copies are exact, single-rounding ops sit near f32 epsilon squared,
    /// reductions over k terms grow like k * eps^2.
    fn limit(&self) -> f64;

    /// NMSE limit on a device: [`Case::limit`], except where the device
    /// runs the op from f16-rounded x ([`ComputeBackend::rounds_gemm_inputs`]:
    /// matmul and the MoE phases at prefill sizes on tensor cores) at
    /// `Precision::Fast`, where the rounding's own error sets it:
    /// [`F16_INPUT_NMSE`] per product, twice that through gate_up's two
    /// products; and prefill attention on tensor cores (alone, or after
    /// qkv_post), held to a reference that rounds alike
    /// (`CpuBackend::parity_reference_for`), where its probabilities'
    /// rounding sets it ([`rounded_attention_nmse`]). At `Precision::Exact`
    /// (split inputs) every op keeps [`Case::limit`]: a split product's
    /// error ([`SPLIT_INPUT_NMSE`]) is far under it, and a split
    /// probability that lands on the other side of a rounding boundary
    /// moves its term by 2^-22 of it, not 2^-11.
    fn limit_on<B: ComputeBackend + ?Sized>(&self, _device: &B) -> f64 {
        self.limit()
    }

    /// Fresh random inputs (never zeros) for this case.
    fn inputs(&self, rng: &mut Rng) -> Vec<HostTensor>;

    fn outputs(&self) -> Vec<OutSpec>;

    /// Record the op on `b` with uploaded inputs and fresh outputs.
    fn record<B: ComputeBackend>(&self, b: &B, i: &[B::Buffer], o: &[B::Buffer]) -> Result<()>;

    /// The verdict on outputs whose guards and finiteness
    /// [`judge`] has checked, against an NMSE `limit`: by default
    /// every output's NMSE ([`Case::f16_stored`] ones by f16 steps).
    fn judge(
        &self,
        limit: f64,
        _inputs: &[HostTensor],
        r: &[HostTensor],
        d: &[HostTensor],
    ) -> Verdict {
        judge_outputs(self, limit, r, d)
    }

    /// Whether output `j` is stored in f16 from values each side computes
    /// (qkv_post's appends to f16 caches): judged by f16 steps, not NMSE
    /// (`compare::judge_f16_stored`).
    fn f16_stored(&self, _j: usize) -> bool {
        false
    }

    /// An output to judge against the reference run on the device's own
    /// outputs rather than on the case's inputs: `(j, op, inputs)`, output
    /// `j` to be `op`'s first on the reference (see
    /// [`QkvPostAttention`]'s).
    fn on_device_outputs(
        &self,
        _inputs: &[HostTensor],
        _d: &[HostTensor],
    ) -> Option<(usize, Op, Vec<HostTensor>)> {
        None
    }

    /// Floating-point operations the op does (a multiply-add is two), where
    /// it is a product the bench's prefill cases are bound by: matmul,
    /// router logits, the MoE phases (per (token, expert) pair) and
    /// attention (scores and values over each row's keys). None for the
    /// rest.
    fn flops(&self) -> Option<u64> {
        None
    }

    /// Bytes the op must move at least (the bench's GB/s): by default every
    /// input read once and every output written once; only the selected
    /// experts count for MoE, and only the keys in the window for
    /// attention. Without inputs (a case no backend ran), MoE counts every
    /// slot as a distinct expert.
    fn bytes(&self, inputs: &[HostTensor]) -> u64 {
        every_byte(self, inputs)
    }
}

/// Every input read once and every output written once (an in-place one:
/// its whole span, at four bytes an element).
fn every_byte<C: Case + ?Sized>(c: &C, inputs: &[HostTensor]) -> u64 {
    let outs: u64 = c.outputs().iter().map(OutSpec::bytes).sum();
    inputs.iter().map(HostTensor::bytes).sum::<u64>() + outs
}

/// The bytes of `elems` weights of `dtype` as stored (a quantized one's
/// packed values, scales and biases).
fn weight_bytes(dtype: DType, elems: u64) -> u64 {
    dtype.bytes_for(elems as usize) as u64
}

/// The families, each a variant of [`Op`] named as its struct, and `Op`'s
/// [`Case`] passing each call to its family.
macro_rules! families {
    ($($family:ident),* $(,)?) => {
        /// A case of any family.
        #[derive(Clone, Debug)]
        pub enum Op {
            $($family($family),)*
        }

        $(impl From<$family> for Op {
            fn from(c: $family) -> Op {
                Op::$family(c)
            }
        })*

        impl Case for Op {
            fn op_name(&self) -> &'static str {
                match self { $(Op::$family(c) => c.op_name(),)* }
            }
            fn family(&self) -> &'static str {
                match self { $(Op::$family(c) => c.family(),)* }
            }
            fn name(&self) -> String {
                match self { $(Op::$family(c) => c.name(),)* }
            }
            fn kind(&self) -> OpKind {
                match self { $(Op::$family(c) => c.kind(),)* }
            }
            fn limit(&self) -> f64 {
                match self { $(Op::$family(c) => c.limit(),)* }
            }
            fn limit_on<B: ComputeBackend + ?Sized>(&self, device: &B) -> f64 {
                match self { $(Op::$family(c) => c.limit_on(device),)* }
            }
            fn inputs(&self, rng: &mut Rng) -> Vec<HostTensor> {
                match self { $(Op::$family(c) => c.inputs(rng),)* }
            }
            fn outputs(&self) -> Vec<OutSpec> {
                match self { $(Op::$family(c) => c.outputs(),)* }
            }
            fn record<B: ComputeBackend>(
                &self,
                b: &B,
                i: &[B::Buffer],
                o: &[B::Buffer],
            ) -> Result<()> {
                match self { $(Op::$family(c) => c.record(b, i, o),)* }
            }
            fn judge(
                &self,
                limit: f64,
                inputs: &[HostTensor],
                r: &[HostTensor],
                d: &[HostTensor],
            ) -> Verdict {
                match self { $(Op::$family(c) => c.judge(limit, inputs, r, d),)* }
            }
            fn f16_stored(&self, j: usize) -> bool {
                match self { $(Op::$family(c) => c.f16_stored(j),)* }
            }
            fn on_device_outputs(
                &self,
                inputs: &[HostTensor],
                d: &[HostTensor],
            ) -> Option<(usize, Op, Vec<HostTensor>)> {
                match self { $(Op::$family(c) => c.on_device_outputs(inputs, d),)* }
            }
            fn flops(&self) -> Option<u64> {
                match self { $(Op::$family(c) => c.flops(),)* }
            }
            fn bytes(&self, inputs: &[HostTensor]) -> u64 {
                match self { $(Op::$family(c) => c.bytes(inputs),)* }
            }
        }
    };
}

families!(
    RmsNorm,
    Matmul,
    Router,
    MoeGateUp,
    MoeDown,
    MoeGateUpPair,
    MoeDownPair,
    MoeDownPairPostFfn,
    Rope,
    KvAppend,
    Attention,
    Add,
    Scale,
    GeluMul,
    Softcap,
    Embed,
    Argmax,
    CopyRange,
    SlotLookup,
    PostAttention,
    PostAttentionRouter,
    PostAttentionGateUp,
    PostAttentionGateUpSlots,
    PostFfn,
    QkvPost,
    QkvPostAttention,
    QkvPostAttentionRow,
);

impl Op {
    /// [`Attention`] with the decoder's layout ([`Attention::new`]).
    pub fn attention(p: crate::ops::Attention, pos0: usize) -> Op {
        Op::Attention(Attention::new(p, pos0))
    }

    /// The same case with KV caches of `dtype` (ops without caches
    /// unchanged).
    pub fn with_kv(mut self, dtype: DType) -> Op {
        match &mut self {
            Op::KvAppend(KvAppend { kv, .. })
            | Op::Attention(Attention { kv, .. })
            | Op::QkvPost(QkvPost { kv, .. })
            | Op::QkvPostAttention(QkvPostAttention { kv, .. })
            | Op::QkvPostAttentionRow(QkvPostAttentionRow {
                c: QkvPostAttention { kv, .. },
                ..
            }) => *kv = dtype,
            _ => {}
        }
        self
    }

    /// The same case with its tensor-core products at `precision` (ops
    /// without such products unchanged).
    pub fn with_precision(mut self, precision: crate::Precision) -> Op {
        match &mut self {
            Op::Matmul(c) => c.p.precision = precision,
            Op::Attention(c) => c.p.precision = precision,
            Op::QkvPostAttention(c) => c.precision = precision,
            Op::QkvPostAttentionRow(r) => r.c.precision = precision,
            Op::MoeGateUp(MoeGateUp { p, .. }) | Op::MoeDown(MoeDown { p, .. }) => {
                p.precision = precision
            }
            Op::MoeGateUpPair(MoeGateUpPair { a, b, .. })
            | Op::MoeDownPair(MoeDownPair { a, b, .. })
            | Op::MoeDownPairPostFfn(MoeDownPairPostFfn { a, b, .. }) => {
                a.precision = precision;
                b.precision = precision;
            }
            _ => {}
        }
        self
    }
}

/// The verdict on one case against an NMSE `limit` (the op's on the device,
/// [`Case::limit_on`]): the worst NMSE, or the failure. Guards and
/// finiteness first, then the case's own verdict ([`Case::judge`]).
pub fn judge<C: Case + ?Sized>(
    c: &C,
    limit: f64,
    inputs: &[HostTensor],
    r: &[HostTensor],
    d: &[HostTensor],
) -> Verdict {
    compare::check_written(&c.outputs(), r, d).map_err(|m| (f64::INFINITY, m))?;
    c.judge(limit, inputs, r, d)
}

/// [`Case::judge`]'s default: every output's NMSE within `limit`, those
/// stored in f16 ([`Case::f16_stored`]) by [`compare::judge_f16_stored`].
pub(super) fn judge_outputs<C: Case + ?Sized>(
    c: &C,
    limit: f64,
    r: &[HostTensor],
    d: &[HostTensor],
) -> Verdict {
    let mut worst = 0f64;
    for (j, spec) in c.outputs().iter().enumerate() {
        let n = match spec {
            OutSpec::F32(n) | OutSpec::InPlace(_, n) => *n,
            OutSpec::U32(_) => continue,
        };
        let (rv, dv) = (&compare::f32s(&r[j])[..n], &compare::f32s(&d[j])[..n]);
        if c.f16_stored(j) {
            worst = worst.max(compare::judge_f16_stored(j, limit, rv, dv)?);
            continue;
        }
        worst = worst.max(compare::at_most(
            &format!("output {j}"),
            compare::nmse(rv, dv),
            limit,
        )?);
    }
    Ok(worst)
}
