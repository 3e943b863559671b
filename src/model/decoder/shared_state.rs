//! What a drafter reads from its target ([`crate::model::drafter`]): the
//! embedding table, the final hidden state of the last pass, and a layer's
//! KV caches. Read-only views; the drafter never writes the target's state.

use super::{Model, Sequence};
use crate::backend::ComputeBackend;
use crate::error::{Error, Result};

/// One layer's caches of a sequence, `[kv_heads, capacity, head_dim]` each.
pub(crate) struct CacheView<'a, T> {
    pub k: &'a T,
    pub v: &'a T,
    pub capacity: usize,
}

impl<B: ComputeBackend> Model<B> {
    /// The tied embedding table `[vocab, hidden]` and the scale `embed`
    /// multiplies its rows by (sqrt(hidden), rounded to the table's dtype).
    pub(crate) fn embedding(&self) -> (&B::Buffer, f32) {
        (&self.weights.embed, self.embed_scale)
    }

    /// The final-normed hidden state of the last pass of `m` tokens
    /// (`[rows, hidden]`, its first `m` rows that pass's) and `rows`:
    /// what the LM head read. Valid until the next pass.
    pub(crate) fn final_hidden(&self, m: usize) -> Result<(&B::Buffer, usize)> {
        let s = self.scratch(m)?;
        Ok((&s.normed, s.rows))
    }

    /// Layer `li`'s KV caches in `seq`.
    pub(crate) fn cache_view<'a>(
        &self,
        seq: &'a Sequence<B>,
        li: usize,
    ) -> Result<CacheView<'a, B::Buffer>> {
        self.check_owned(seq)?;
        let c = seq
            .caches
            .get(li)
            .ok_or_else(|| Error::InvalidInput(format!("no layer {li} in the model")))?;
        Ok(CacheView {
            k: &c.k,
            v: &c.v,
            capacity: c.capacity,
        })
    }
}
