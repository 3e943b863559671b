//! A model's routed experts: where they are stored, which of them sit in a
//! streamed layer's device slots, and how a layer runs them.
//!
//! - `routed`: a layer's experts (`MoeBlock`: the router, the expert
//!   stacks and their norms) and the MoE ops' arguments over them;
//! - [`stored`]: an expert stack left in the memory-mapped checkpoint
//!   ([`StoredExperts`]), read one expert at a time;
//! - [`slot_cache`]: the replacement policy of a streamed layer's slots
//!   ([`SlotCache`], [`Policy`]);
//! - [`streaming`]: placing a layer's routed experts in its slots, the
//!   waves of a prefill batch whose experts exceed them, and the slot
//!   mapping the MoE ops then read ([`StreamStats`]);
//! - [`trace`]: routing traces, replayed on the policies without a device.

pub(crate) mod routed;
pub mod slot_cache;
pub mod stored;
pub mod streaming;
pub mod trace;

pub use slot_cache::{Counts, Placement, Policy, SlotCache};
pub use stored::StoredExperts;
pub use streaming::{ExpertStore, Optimism, StreamPrefill, StreamStats, ROUTES_AN_EXPERT};
pub use trace::{optimal, replay, Trace, TraceShape};
