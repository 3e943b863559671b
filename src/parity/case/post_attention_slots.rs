//! post_attention_gate_up on streamed experts: the router's experts looked
//! up in a slot table on the way into the routed gate_up, which reads a
//! slot stack.

use super::moe::MoeGateUp;
use super::post_attention::{judge_post_attention_gate_up, post_attention_router_args};
use super::{weight_bytes, Case, PostAttentionGateUp};
use crate::backend::ComputeBackend;
use crate::ops::{self, GateUpArgs, Moe, OpKind, SlotArgs};
use crate::parity::{compare, HostTensor, OutSpec, Verdict};
use crate::rng::Rng;
use crate::Result;

/// `post_attention_gate_up_slots`: `g`'s case with its routed experts'
/// weights a stack of `slots` slots, a slot table drawn afresh (about half
/// the slots hold an expert, in random order; the rest of the experts
/// miss), and the lookup logged from `at` of a log whose first `at`
/// elements hold `LOG_FILL`, which the op must leave.
#[derive(Clone, Copy, Debug)]
pub struct PostAttentionGateUpSlots {
    pub g: PostAttentionGateUp,
    pub slots: usize,
    pub at: usize,
}

/// What the log holds before the op writes at `at`.
const LOG_FILL: u32 = 0x5a5a_5a5a;

impl PostAttentionGateUpSlots {
    /// The routed gate_up problem on the slot stack.
    fn routed(&self) -> Moe {
        Moe {
            experts: self.slots,
            ..self.g.gate_up_problems().1
        }
    }

    fn lookup(&self) -> ops::SlotLookup {
        let r = &self.g.r;
        ops::SlotLookup {
            n: r.m * r.top_k,
            experts: r.experts,
            slots: self.slots,
            at: self.at,
        }
    }
}

impl Case for PostAttentionGateUpSlots {
    fn op_name(&self) -> &'static str {
        "post_attention_gate_up_slots"
    }

    fn family(&self) -> &'static str {
        if self.g.pw.is_quantized() || self.g.gw.is_quantized() {
            "post_attention_gate_up_slots_quantized"
        } else {
            "post_attention_gate_up_slots"
        }
    }

    fn name(&self) -> String {
        let g = &self.g;
        format!(
            "{}(rows={},dim={},e={},k={},slots={},at={},inter={},moe_inter={},w={},pw={},gw={})",
            self.family(),
            g.p.rows,
            g.p.dim,
            g.r.experts,
            g.r.top_k,
            self.slots,
            self.at,
            g.inter,
            g.moe_inter,
            g.w,
            g.pw,
            g.gw
        )
    }

    fn kind(&self) -> OpKind {
        self.g.kind()
    }

    fn limit(&self) -> f64 {
        self.g.limit()
    }

    fn inputs(&self, rng: &mut Rng) -> Vec<HostTensor> {
        let mut v = self.g.router_part().inputs(rng);
        let (dense, _) = self.g.gate_up_problems();
        let draw = |p, rng: &mut Rng| MoeGateUp { p, w: self.g.gw }.inputs(rng);
        v.extend(draw(dense, rng).into_iter().skip(1));
        v.push(draw(self.routed(), rng).swap_remove(1));
        // Experts in a random order; the first `held` take slots in
        // another random order, the rest hold none.
        let experts = self.g.r.experts;
        let order = super::inputs::shuffled(rng, experts);
        let slots = super::inputs::shuffled(rng, self.slots);
        let mut table = vec![ops::NO_SLOT; experts];
        for (e, s) in order.iter().zip(&slots).take(self.slots.div_ceil(2)) {
            table[*e as usize] = *s;
        }
        v.push(HostTensor::U32(table));
        v
    }

    fn outputs(&self) -> Vec<OutSpec> {
        let l = self.lookup();
        let mut v = self.g.outputs();
        v.extend([OutSpec::U32(l.n), OutSpec::U32(l.at + l.n)]);
        v
    }

    fn record<B: ComputeBackend>(&self, b: &B, i: &[B::Buffer], o: &[B::Buffer]) -> Result<()> {
        let (dense, _) = self.g.gate_up_problems();
        if self.at > 0 {
            b.write_u32(&o[8], 0, &vec![LOG_FILL; self.at])?;
        }
        b.post_attention_gate_up_slots(
            post_attention_router_args(i, o, self.g.p, self.g.r),
            GateUpArgs {
                x: &o[1],
                gate_up: &i[8],
                ids: &i[9],
                act: &o[5],
                p: dense,
            },
            GateUpArgs {
                x: &o[2],
                gate_up: &i[10],
                ids: &o[7],
                act: &o[6],
                p: self.routed(),
            },
            SlotArgs {
                table: &i[11],
                log: &o[8],
                p: self.lookup(),
            },
        )
    }

    /// On each side, its logged ids its router's, and its slots and miss
    /// flags exactly its table's for them; the log before `at` untouched;
    /// then post_attention_gate_up's verdict.
    fn judge(
        &self,
        limit: f64,
        inputs: &[HostTensor],
        r: &[HostTensor],
        d: &[HostTensor],
    ) -> Verdict {
        let table = compare::u32s(&inputs[11]);
        let l = self.lookup();
        for (side, out) in [("reference", r), ("device", d)] {
            let log = compare::u32s(&out[8]);
            if let Some(i) = log[..l.at].iter().position(|&v| v != LOG_FILL) {
                return Err((
                    f64::INFINITY,
                    format!("{side}: the log before `at` changed at element {i}"),
                ));
            }
            let slots = compare::u32s(&out[7]);
            let mut ids = Vec::with_capacity(l.n);
            for i in 0..l.n {
                let (v, s) = (log[l.at + i], slots[i]);
                let e = v & !ops::SLOT_MISSED;
                let (want_slot, want_log) = ops::slot_lookup(&[e], table, l.slots);
                if (s, v) != (want_slot[0], want_log[0]) {
                    return Err((
                        f64::INFINITY,
                        format!(
                            "{side}: id {i} logged {v:#x} with slot {s}; its table gives \
                             {:#x} with slot {}",
                            want_log[0], want_slot[0]
                        ),
                    ));
                }
                ids.push(e);
            }
            if let Some(i) = (0..l.n).find(|&i| compare::u32s(&out[3])[i] != ids[i]) {
                return Err((
                    f64::INFINITY,
                    format!("{side}: router id {i} is not the one logged"),
                ));
            }
        }
        judge_post_attention_gate_up(&self.g, limit, &inputs[..11], &r[..7], &d[..7])
    }

    /// As post_attention_gate_up's, with the slot stack for the experts'
    /// and the table, slots and log besides.
    fn bytes(&self, inputs: &[HostTensor]) -> u64 {
        let routed = self.routed();
        let outs: u64 = self.outputs().iter().map(OutSpec::bytes).sum();
        let stack = inputs.get(10).map_or(0, HostTensor::bytes);
        let rest: u64 = inputs
            .iter()
            .enumerate()
            .filter(|&(j, _)| j != 10)
            .map(|(_, t)| t.bytes())
            .sum();
        let picked = (routed.m * routed.top_k).min(routed.experts) as u64
            * weight_bytes(self.g.gw, 2 * (routed.inter * routed.hidden) as u64);
        rest + stack.min(picked) + outs
    }
}
