//! The streamed experts' slot lookup: routed ids through a layer's slot
//! table into slot ids, each id logged (a miss flagged) at an offset of a
//! pass-wide log.

use super::Case;
use crate::backend::ComputeBackend;
use crate::ops::{self, OpKind};
use crate::parity::{compare, HostTensor, OutSpec, Verdict};
use crate::rng::Rng;
use crate::Result;

/// `slot_lookup` of `p.n` ids, some held in `p.slots` slots (the table
/// drawn afresh: about half the slots filled, some ids past the table).
/// The log's first `p.at` elements are written with `LOG_FILL` before
/// the op, which must leave them.
#[derive(Clone, Copy, Debug)]
pub struct SlotLookup {
    pub p: ops::SlotLookup,
}

/// What the log holds before the op writes at `at` (no id, flagged or not).
const LOG_FILL: u32 = 0x5a5a_5a5a;

impl Case for SlotLookup {
    fn op_name(&self) -> &'static str {
        "slot_lookup"
    }

    fn name(&self) -> String {
        let p = &self.p;
        format!(
            "{}(n={},experts={},slots={},at={})",
            self.family(),
            p.n,
            p.experts,
            p.slots,
            p.at
        )
    }

    fn kind(&self) -> OpKind {
        OpKind::SlotLookup
    }

    /// Ids and slots: exact.
    fn limit(&self) -> f64 {
        0.0
    }

    fn inputs(&self, rng: &mut Rng) -> Vec<HostTensor> {
        let p = &self.p;
        // Experts in a random order; the first `held` take the slots in
        // another random order, the rest hold none.
        let order = super::inputs::shuffled(rng, p.experts);
        let slots = super::inputs::shuffled(rng, p.slots);
        let held = p.slots.div_ceil(2);
        let mut table = vec![ops::NO_SLOT; p.experts];
        for (e, s) in order.iter().zip(&slots).take(held) {
            table[*e as usize] = *s;
        }
        // One entry past the slots: held by no slot of this stack.
        if let Some(&e) = order.get(held) {
            table[e as usize] = p.slots as u32;
        }
        // Ids mostly in the table, one in eight past it.
        let ids = (0..p.n)
            .map(|_| {
                if rng.below(8) == 0 {
                    (p.experts as u64 + rng.below(64)) as u32
                } else {
                    rng.below(p.experts as u64) as u32
                }
            })
            .collect();
        vec![HostTensor::U32(ids), HostTensor::U32(table)]
    }

    fn outputs(&self) -> Vec<OutSpec> {
        vec![OutSpec::U32(self.p.n), OutSpec::U32(self.p.at + self.p.n)]
    }

    fn record<B: ComputeBackend>(&self, b: &B, i: &[B::Buffer], o: &[B::Buffer]) -> Result<()> {
        if self.p.at > 0 {
            b.write_u32(&o[1], 0, &vec![LOG_FILL; self.p.at])?;
        }
        b.slot_lookup(&i[0], &i[1], &o[0], &o[1], self.p)
    }

    /// Every slot id and logged id as the reference's, and the log's
    /// first `at` untouched.
    fn judge(
        &self,
        _limit: f64,
        _inputs: &[HostTensor],
        r: &[HostTensor],
        d: &[HostTensor],
    ) -> Verdict {
        let p = &self.p;
        for (j, n) in [(0, p.n), (1, p.at + p.n)] {
            let (a, b) = (&compare::u32s(&r[j])[..n], &compare::u32s(&d[j])[..n]);
            if let Some(i) = (0..n).find(|&i| a[i] != b[i]) {
                return Err((
                    f64::INFINITY,
                    format!(
                        "output {j}, element {i}: {:#x}, reference {:#x}",
                        b[i], a[i]
                    ),
                ));
            }
        }
        if let Some(i) = compare::u32s(&r[1])[..p.at]
            .iter()
            .position(|&v| v != LOG_FILL)
        {
            return Err((
                f64::INFINITY,
                format!("the log before `at` changed at element {i}"),
            ));
        }
        Ok(0.0)
    }
}
