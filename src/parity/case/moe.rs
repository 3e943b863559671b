//! The MoE phases over the selected experts: gate_up (with the GELU
//! product) and down (weighted and summed per token), alone and as decode's
//! pairs (the dense MLP as a one-expert problem a beside the routed
//! experts b).

use super::inputs::{as_dense, expert_ids, experts};
use super::rounding::{rounded_nmse, rounds};
use super::{weight_bytes, Case};
use crate::backend::{ComputeBackend, ExpertStack};
use crate::ops::{DownArgs, GateUpArgs, Moe, OpKind};
use crate::parity::{HostTensor, OutSpec};
use crate::rng::Rng;
use crate::{DType, Result};

/// `moe_gate_up` with experts of dtype `w`.
#[derive(Clone, Copy, Debug)]
pub struct MoeGateUp {
    pub p: Moe,
    pub w: DType,
}

/// `moe_down` with experts of dtype `w`.
#[derive(Clone, Copy, Debug)]
pub struct MoeDown {
    pub p: Moe,
    pub w: DType,
}

/// `moe_gate_up_pair`: problems `a` and `b` (weights of dtype `w`).
#[derive(Clone, Copy, Debug)]
pub struct MoeGateUpPair {
    pub a: Moe,
    pub b: Moe,
    pub w: DType,
}

/// `moe_down_pair`.
#[derive(Clone, Copy, Debug)]
pub struct MoeDownPair {
    pub a: Moe,
    pub b: Moe,
    pub w: DType,
}

/// An MoE case's name after its family: `(e=..,k=..,hidden=..,inter=..,m=..,w=..)`.
fn moe_name(family: &str, p: &Moe, w: DType) -> String {
    format!(
        "{family}(e={},k={},hidden={},inter={},m={},w={w})",
        p.experts, p.top_k, p.hidden, p.inter, p.m
    )
}

/// A pair case's parameters in its name: both problems, then the weights.
pub(super) fn pair_params(a: &Moe, b: &Moe, w: DType) -> String {
    format!(
        "a=e{}k{}h{}i{}m{},b=e{}k{}h{}i{}m{},w={w}",
        a.experts, a.top_k, a.hidden, a.inter, a.m, b.experts, b.top_k, b.hidden, b.inter, b.m
    )
}

/// Distinct experts among the ids (each selected expert's weights are read once).
fn distinct_experts(ids: &[u32]) -> u64 {
    let mut v = ids.to_vec();
    v.sort_unstable();
    v.dedup();
    v.len() as u64
}

/// Experts a case with `inputs` reads: the distinct ids of input 2, or
/// without inputs every slot a distinct expert.
fn selected(p: &Moe, inputs: &[HostTensor]) -> u64 {
    match inputs.get(2) {
        Some(HostTensor::U32(ids)) => distinct_experts(ids),
        _ => (p.m * p.top_k).min(p.experts) as u64,
    }
}

impl Case for MoeGateUp {
    fn op_name(&self) -> &'static str {
        "moe_gate_up"
    }

    fn family(&self) -> &'static str {
        if self.w.is_quantized() {
            "moe_gate_up_quantized"
        } else {
            "moe_gate_up"
        }
    }

    fn name(&self) -> String {
        moe_name(self.family(), &self.p, self.w)
    }

    fn kind(&self) -> OpKind {
        OpKind::MoeGateUp { w: self.w }
    }

    /// Dot products of thousands of terms, reordered.
    fn limit(&self) -> f64 {
        1e-9
    }

    fn limit_on<B: ComputeBackend + ?Sized>(&self, device: &B) -> f64 {
        if rounds(
            device,
            self.p.precision,
            &self.kind(),
            (self.p.m, self.p.hidden),
        ) {
            self.limit().max(2.0 * rounded_nmse(self.w))
        } else {
            self.limit()
        }
    }

    fn inputs(&self, rng: &mut Rng) -> Vec<HostTensor> {
        let p = &self.p;
        vec![
            HostTensor::F32(rng.vec_normal(p.m * p.hidden, 1.0)),
            experts(
                rng,
                self.w,
                ExpertStack {
                    experts: p.experts,
                    gate_up: true,
                },
                (p.experts * 2 * p.inter, p.hidden),
                1.0 / (p.hidden as f32).sqrt(),
            ),
            HostTensor::U32(expert_ids(rng, p.m, p.top_k, p.experts)),
        ]
    }

    fn outputs(&self) -> Vec<OutSpec> {
        vec![OutSpec::F32(self.p.m * self.p.top_k * self.p.inter)]
    }

    fn record<B: ComputeBackend>(&self, b: &B, i: &[B::Buffer], o: &[B::Buffer]) -> Result<()> {
        b.moe_gate_up(&i[0], &i[1], &i[2], &o[0], self.p)
    }

    fn flops(&self) -> Option<u64> {
        let p = &self.p;
        Some(2 * (p.m * p.top_k * 2 * p.inter * p.hidden) as u64)
    }

    /// The selected experts' gate|up rows, x, the ids read; the
    /// activations written.
    fn bytes(&self, inputs: &[HostTensor]) -> u64 {
        let p = &self.p;
        let (m, h, i, k) = (p.m as u64, p.hidden as u64, p.inter as u64, p.top_k as u64);
        selected(p, inputs) * weight_bytes(self.w, 2 * i * h)
            + m * h * 4
            + m * k * 4
            + m * k * i * 4
    }
}

impl Case for MoeDown {
    fn op_name(&self) -> &'static str {
        "moe_down"
    }

    fn family(&self) -> &'static str {
        if self.w.is_quantized() {
            "moe_down_quantized"
        } else {
            "moe_down"
        }
    }

    fn name(&self) -> String {
        moe_name(self.family(), &self.p, self.w)
    }

    fn kind(&self) -> OpKind {
        OpKind::MoeDown { w: self.w }
    }

    /// Dot products of thousands of terms, reordered.
    fn limit(&self) -> f64 {
        1e-9
    }

    fn limit_on<B: ComputeBackend + ?Sized>(&self, device: &B) -> f64 {
        if rounds(
            device,
            self.p.precision,
            &self.kind(),
            (self.p.m, self.p.inter),
        ) {
            self.limit().max(rounded_nmse(self.w))
        } else {
            self.limit()
        }
    }

    fn inputs(&self, rng: &mut Rng) -> Vec<HostTensor> {
        let p = &self.p;
        vec![
            HostTensor::F32(rng.vec_normal(p.m * p.top_k * p.inter, 1.0)),
            experts(
                rng,
                self.w,
                ExpertStack {
                    experts: p.experts,
                    gate_up: false,
                },
                (p.experts * p.hidden, p.inter),
                1.0 / (p.inter as f32).sqrt(),
            ),
            HostTensor::U32(expert_ids(rng, p.m, p.top_k, p.experts)),
            HostTensor::F32(rng.vec_range(p.m * p.top_k, 0.05, 1.0)),
        ]
    }

    fn outputs(&self) -> Vec<OutSpec> {
        vec![OutSpec::F32(self.p.m * self.p.hidden)]
    }

    fn record<B: ComputeBackend>(&self, b: &B, i: &[B::Buffer], o: &[B::Buffer]) -> Result<()> {
        b.moe_down(&i[0], &i[1], &i[2], &i[3], &o[0], self.p)
    }

    fn flops(&self) -> Option<u64> {
        let p = &self.p;
        Some(2 * (p.m * p.top_k * p.hidden * p.inter) as u64)
    }

    /// The activations, the selected experts' down rows, the ids and
    /// weights read; the rows written.
    fn bytes(&self, inputs: &[HostTensor]) -> u64 {
        let p = &self.p;
        let (m, h, i, k) = (p.m as u64, p.hidden as u64, p.inter as u64, p.top_k as u64);
        m * k * i * 4
            + selected(p, inputs) * weight_bytes(self.w, h * i)
            + 2 * m * k * 4
            + m * h * 4
    }
}

impl MoeGateUpPair {
    fn problems(&self) -> (MoeGateUp, MoeGateUp) {
        let w = self.w;
        (MoeGateUp { p: self.a, w }, MoeGateUp { p: self.b, w })
    }
}

impl Case for MoeGateUpPair {
    fn op_name(&self) -> &'static str {
        "moe_gate_up_pair"
    }

    fn family(&self) -> &'static str {
        if self.w.is_quantized() {
            "moe_gate_up_pair_quantized"
        } else {
            "moe_gate_up_pair"
        }
    }

    fn name(&self) -> String {
        format!(
            "{}({})",
            self.family(),
            pair_params(&self.a, &self.b, self.w)
        )
    }

    fn kind(&self) -> OpKind {
        OpKind::MoeGateUp { w: self.w }
    }

    /// Dot products of thousands of terms, reordered.
    fn limit(&self) -> f64 {
        1e-9
    }

    fn inputs(&self, rng: &mut Rng) -> Vec<HostTensor> {
        let (a, b) = self.problems();
        let mut v = as_dense(a.inputs(rng));
        v.extend(b.inputs(rng));
        v
    }

    fn outputs(&self) -> Vec<OutSpec> {
        let (a, b) = (&self.a, &self.b);
        vec![
            OutSpec::F32(a.m * a.top_k * a.inter),
            OutSpec::F32(b.m * b.top_k * b.inter),
        ]
    }

    fn record<B: ComputeBackend>(&self, b: &B, i: &[B::Buffer], o: &[B::Buffer]) -> Result<()> {
        b.moe_gate_up_pair(
            GateUpArgs {
                x: &i[0],
                gate_up: &i[1],
                ids: &i[2],
                act: &o[0],
                p: self.a,
            },
            GateUpArgs {
                x: &i[3],
                gate_up: &i[4],
                ids: &i[5],
                act: &o[1],
                p: self.b,
            },
        )
    }

    /// Each problem's own count, over its own inputs.
    fn bytes(&self, inputs: &[HostTensor]) -> u64 {
        let (a, b) = self.problems();
        let split = inputs.len().min(3);
        a.bytes(&inputs[..split]) + b.bytes(&inputs[split..])
    }
}

impl MoeDownPair {
    fn problems(&self) -> (MoeDown, MoeDown) {
        let w = self.w;
        (MoeDown { p: self.a, w }, MoeDown { p: self.b, w })
    }
}

impl Case for MoeDownPair {
    fn op_name(&self) -> &'static str {
        "moe_down_pair"
    }

    fn family(&self) -> &'static str {
        if self.w.is_quantized() {
            "moe_down_pair_quantized"
        } else {
            "moe_down_pair"
        }
    }

    fn name(&self) -> String {
        format!(
            "{}({})",
            self.family(),
            pair_params(&self.a, &self.b, self.w)
        )
    }

    fn kind(&self) -> OpKind {
        OpKind::MoeDown { w: self.w }
    }

    /// Dot products of thousands of terms, reordered.
    fn limit(&self) -> f64 {
        1e-9
    }

    fn inputs(&self, rng: &mut Rng) -> Vec<HostTensor> {
        let (a, b) = self.problems();
        let mut v = as_dense(a.inputs(rng));
        v.extend(b.inputs(rng));
        v
    }

    fn outputs(&self) -> Vec<OutSpec> {
        vec![
            OutSpec::F32(self.a.m * self.a.hidden),
            OutSpec::F32(self.b.m * self.b.hidden),
        ]
    }

    fn record<B: ComputeBackend>(&self, b: &B, i: &[B::Buffer], o: &[B::Buffer]) -> Result<()> {
        let (dense, routed) = down_pair_args(i, o, self.a, self.b);
        b.moe_down_pair(dense, routed)
    }

    /// Each problem's own count, over its own inputs.
    fn bytes(&self, inputs: &[HostTensor]) -> u64 {
        let (a, b) = self.problems();
        let split = inputs.len().min(4);
        a.bytes(&inputs[..split]) + b.bytes(&inputs[split..])
    }
}

/// `MoeDownPair`'s two problems (and `MoeDownPairPostFfn`'s) from a case's
/// inputs `i` and outputs `o`.
pub(super) fn down_pair_args<'a, B>(
    i: &'a [B],
    o: &'a [B],
    a: Moe,
    b: Moe,
) -> (DownArgs<'a, B>, DownArgs<'a, B>) {
    (
        DownArgs {
            act: &i[0],
            down: &i[1],
            ids: &i[2],
            weights: &i[3],
            out: &o[0],
            p: a,
        },
        DownArgs {
            act: &i[4],
            down: &i[5],
            ids: &i[6],
            weights: &i[7],
            out: &o[1],
            p: b,
        },
    )
}
