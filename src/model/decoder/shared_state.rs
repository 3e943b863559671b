//! What a drafter reads from its target ([`crate::model::drafter`]): the
//! embedding table, the final hidden state of the last pass, and a layer's
//! KV caches. Read-only views; the drafter never writes the target's state.

use super::{head_batch, Model, Sequence, Tail};
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
        (&self.embed, self.embed_scale)
    }

    /// The final-normed hidden state of the last pass of `m` tokens
    /// (`[rows, hidden]`, its first `m` rows that pass's) and `rows`:
    /// what the LM head read. Valid until the next pass.
    pub(crate) fn final_hidden(&self, m: usize) -> Result<(&B::Buffer, usize)> {
        let s = self.scratch(m)?;
        Ok((&s.residual.normed, s.rows))
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

    /// [`Model::logits`] of `tokens` (one pass: at most the head's rows)
    /// reduced to each row's argmax on the device (first index on ties):
    /// a greedy verification reads back 4 bytes a row, not the vocabulary.
    pub fn greedy_rows(&self, seq: &mut Sequence<B>, tokens: &[u32]) -> Result<Vec<u32>> {
        self.check_owned(seq)?;
        self.check_request(seq, tokens, 0)?;
        let m = tokens.len();
        if m == 0 || m > head_batch(self.prefill_batch) {
            return Err(Error::InvalidInput(format!(
                "a verification pass of {m} tokens: 1 to {} fit one pass",
                head_batch(self.prefill_batch)
            )));
        }
        self.forward_chunk(seq, tokens, Tail::Head)?;
        let s = self.scratch(m)?;
        self.backend
            .argmax(self.final_logits(s), &s.ids_next, m, self.cfg.vocab)?;
        let ids = self.backend.download_u32(&s.ids_next)?;
        seq.advance(tokens);
        Ok(ids[..m].to_vec())
    }
}
