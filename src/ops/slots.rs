//! The streamed experts' slot lookup: its contract and its host reference.

use super::roles::Args;
use super::{check_buf, no_alias, nonzero, MAX_EXPERTS, U32};
use crate::device_buffer::DeviceBuffer;
use crate::error::{Error, Result};

/// The slot lookup of streamed experts ([`crate::ComputeBackend::slot_lookup`]):
/// `n` routed ids through a layer's slot table of `experts` entries into
/// slot ids of a `slots`-expert stack, each id logged at `log[at + i]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotLookup {
    pub n: usize,
    pub experts: usize,
    pub slots: usize,
    pub at: usize,
}

/// A streamed layer's slot lookup inside
/// [`crate::ComputeBackend::post_attention_gate_up_slots`]: the layer's slot
/// table, the pass's log, and the lookup's shape (`p.n` the router's ids,
/// `p.experts` the router's experts, `p.slots` the slot stack's).
pub struct SlotArgs<'a, B> {
    pub table: &'a B,
    pub log: &'a B,
    pub p: SlotLookup,
}

// (by hand: the derives would ask B itself to be Copy)
impl<B> Clone for SlotArgs<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B> Copy for SlotArgs<'_, B> {}

/// A slot table's entry for an expert that holds no slot.
pub const NO_SLOT: u32 = u32::MAX;

/// The bit [`crate::ComputeBackend::slot_lookup`] sets on a logged id
/// whose expert held no slot (ids are below [`MAX_EXPERTS`]).
pub const SLOT_MISSED: u32 = 1 << 31;

impl SlotLookup {
    /// Shapes, dtypes and aliasing of a `slot_lookup` call; its arguments
    /// by role.
    pub fn validate<'a, B: DeviceBuffer>(
        &self,
        ids: &'a B,
        table: &'a B,
        slot_ids: &'a B,
        log: &'a B,
    ) -> Result<Args<'a, B>> {
        const OP: &str = "slot_lookup";
        nonzero(
            OP,
            &[
                ("n", self.n),
                ("experts", self.experts),
                ("slots", self.slots),
            ],
        )?;
        if self.slots > self.experts || self.experts > MAX_EXPERTS {
            return Err(Error::shape(
                OP,
                format!(
                    "{} slots of {} experts unsupported",
                    self.slots, self.experts
                ),
            ));
        }
        check_buf(OP, "ids", ids, &U32, self.n)?;
        check_buf(OP, "table", table, &U32, self.experts)?;
        check_buf(OP, "slot_ids", slot_ids, &U32, self.n)?;
        check_buf(OP, "log", log, &U32, self.at + self.n)?;
        no_alias(OP, slot_ids, &[Some(ids), Some(table)])?;
        no_alias(OP, log, &[Some(ids), Some(table), Some(slot_ids)])?;
        Ok(Args::new(OP)
            .plain("ids", ids)
            .plain("table", table)
            .plain("slot_ids", slot_ids)
            .plain("log", log))
    }
}

/// [`crate::ComputeBackend::slot_lookup`] on host slices: each id's slot,
/// or slot 0 (any held expert's weights: finite, and the pass that reads
/// them is discarded) where it has none, and the ids with
/// [`SLOT_MISSED`] set on those. The CPU reference, and the trait's
/// default body on read-back buffers.
pub fn slot_lookup(ids: &[u32], table: &[u32], slots: usize) -> (Vec<u32>, Vec<u32>) {
    ids.iter()
        .map(|&e| match table.get(e as usize) {
            Some(&s) if (s as usize) < slots => (s, e),
            _ => (0, e | SLOT_MISSED),
        })
        .unzip()
}
