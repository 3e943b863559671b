//! Batched decode: one step of several sequences in one forward pass
//! ([`Model::decode_batch`]). Every op that reads weights (q|k|v, o_proj,
//! the dense MLP and the experts, the LM head) runs once over m rows, one
//! a sequence, so a step reads the weights once for all of them; attention
//! runs a row at a time on that row's own sequence's caches at its own
//! position ([`Kv::Rows`]). A server's continuous batching runs its active
//! requests' steps through it.

use super::pass::Pass;
use super::{head_batch, Kv, Model, Sequence, Tail};
use crate::backend::ComputeBackend;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::model::experts::streaming::{StreamPass, StreamPrefill};
use crate::model::sampling::Sampler;
use crate::model::scratch::Scratch;

impl<B: ComputeBackend> Model<B> {
    /// Most sequences one batched pass carries: the batch scratch's LM
    /// head rows ([`crate::model::LOGITS_BATCH`], or `prefill_batch` where
    /// that is smaller). [`Model::decode_batch`] runs more as several
    /// passes.
    pub fn max_decode_batch(&self) -> usize {
        head_batch(self.prefill_batch)
    }

    /// A generation's start, apart from its decode steps: `prompt`
    /// appended to `seq` (prefill batches, the LM head for its last token
    /// only) and the first new token picked by `sampler`, as
    /// [`Model::generate`] starts one (the sampler has `observe`d the
    /// prompt; the token is not yet in the context). Room for
    /// `max_new_tokens` is checked first. The steps that follow may run
    /// batched with other sequences' ([`Model::decode_batch`]), the same
    /// sampler picking each.
    pub fn prefill_next(
        &self,
        seq: &mut Sequence<B>,
        prompt: &[u32],
        sampler: &mut Sampler,
        max_new_tokens: usize,
    ) -> Result<u32> {
        if prompt.is_empty() {
            return Err(Error::InvalidInput("empty prompt".into()));
        }
        self.check_owned(seq)?;
        self.check_request(seq, prompt, max_new_tokens.saturating_sub(1))?;
        self.prefill_with_head(seq, prompt)?;
        Ok(self.pick(&self.single, &mut [sampler])?[0])
    }

    /// One decode step of every sequence in `seqs` at once: `tokens[i]`
    /// appended to `seqs[i]` at its own position, and its next token
    /// picked by `samplers[i]`: a greedy sampler's on the device (the
    /// argmax, as [`Model::generate`] picks it), any other's on the host
    /// from the row's logits read back, each with its own seed and
    /// history. Gives what each sequence's own decode step gives (the
    /// tokens exactly; the logits bit for bit where the backend's m-row
    /// products add in the one-row order, as the CPU reference's do).
    ///
    /// Up to [`Model::max_decode_batch`] sequences go in one pass, more in
    /// several. A batch of one runs the one-sequence decode step itself. A
    /// pass of several sequences refuses one that records or replays a
    /// routing trace (a tool for one sequence), and counts its streamed
    /// experts' misses on its first sequence.
    pub fn decode_batch(
        &self,
        seqs: &mut [&mut Sequence<B>],
        tokens: &[u32],
        samplers: &mut [&mut Sampler],
    ) -> Result<Vec<u32>> {
        self.check_sampled_batch("decode_batch", seqs, tokens, samplers.len())?;
        let n = self.max_decode_batch();
        let mut next = Vec::with_capacity(seqs.len());
        for ((seqs, tokens), samplers) in seqs
            .chunks_mut(n)
            .zip(tokens.chunks(n))
            .zip(samplers.chunks_mut(n))
        {
            let s = self.record_step(seqs, tokens)?;
            next.extend(self.pick(s, samplers)?);
        }
        Ok(next)
    }

    /// [`Model::decode_batch`] returning each sequence's row of final
    /// (softcapped) logits instead of a token.
    pub fn decode_batch_logits(
        &self,
        seqs: &mut [&mut Sequence<B>],
        tokens: &[u32],
    ) -> Result<Vec<Vec<f32>>> {
        self.check_batch(seqs, tokens)?;
        let n = self.max_decode_batch();
        let mut rows = Vec::with_capacity(seqs.len());
        for (seqs, tokens) in seqs.chunks_mut(n).zip(tokens.chunks(n)) {
            let s = self.record_step(seqs, tokens)?;
            rows.extend(self.read_logits(s, tokens.len())?);
        }
        Ok(rows)
    }

    /// [`Self::check_batch`], and one sampler a sequence (`what`: the call
    /// the error names).
    pub(super) fn check_sampled_batch(
        &self,
        what: &str,
        seqs: &[&mut Sequence<B>],
        tokens: &[u32],
        samplers: usize,
    ) -> Result<()> {
        if samplers != seqs.len() {
            return Err(Error::InvalidInput(format!(
                "{what}: {samplers} samplers for {} sequences",
                seqs.len()
            )));
        }
        self.check_batch(seqs, tokens)
    }

    /// Checks on the host before anything is recorded: one token a
    /// sequence, each sequence this model's, each token in the vocabulary
    /// and its position in the context, no routing trace in a pass of
    /// several.
    fn check_batch(&self, seqs: &[&mut Sequence<B>], tokens: &[u32]) -> Result<()> {
        if seqs.is_empty() || tokens.len() != seqs.len() {
            return Err(Error::InvalidInput(format!(
                "decode_batch: {} tokens for {} sequences (one each, at least one)",
                tokens.len(),
                seqs.len()
            )));
        }
        for (i, (seq, &t)) in seqs.iter().zip(tokens).enumerate() {
            self.check_owned(seq)
                .and_then(|()| self.check_request(seq, &[t], 0))
                .map_err(|e| Error::InvalidInput(format!("decode_batch, sequence {i}: {e}")))?;
            if seqs.len() > 1 && (seq.routing.is_some() || seq.route_by.is_some()) {
                return Err(Error::InvalidInput(format!(
                    "decode_batch, sequence {i}: a sequence that records or replays a routing \
                     trace runs alone"
                )));
            }
        }
        Ok(())
    }

    /// Record and submit one pass of `tokens` (at most
    /// [`Model::max_decode_batch`], checked), each on its sequence, ending
    /// with the head; every sequence advanced past its token. The scratch
    /// holding the logits.
    fn record_step(
        &self,
        seqs: &mut [&mut Sequence<B>],
        tokens: &[u32],
    ) -> Result<&Scratch<B::Buffer>> {
        let s = if tokens.len() == 1 {
            &self.single
        } else {
            self.batch_scratch()?
        };
        self.backend.write_u32(&s.ids, 0, tokens)?;
        let s = self.record_rows(seqs, &s.ids, tokens.len())?;
        for (seq, &t) in seqs.iter_mut().zip(tokens) {
            seq.advance(&[t]);
        }
        Ok(s)
    }

    /// Record one pass of the `m` token ids in `ids` (device side: the
    /// host may not know them yet), row i on `seqs[i]` at its position,
    /// ending with the head. Each sequence has the pass counted (computed,
    /// written) but is not advanced: its caller knows the tokens. The
    /// scratch holding the logits; a pass of several rows is submitted.
    pub(super) fn record_rows(
        &self,
        seqs: &mut [&mut Sequence<B>],
        ids: &B::Buffer,
        m: usize,
    ) -> Result<&Scratch<B::Buffer>> {
        if m == 1 {
            // (the one-sequence step, launches and all)
            let (seq, s) = (&mut *seqs[0], &self.single);
            self.backend.write_u32(&s.pos, 0, &[seq.pos as u32])?;
            self.record_forward(seq, s, ids, 1, Tail::Head)?;
            return Ok(s);
        }
        let s = self.batch_scratch()?;
        let positions = self.row_positions()?;
        for (seq, at) in seqs.iter().zip(positions) {
            self.backend.write_u32(at, 0, &[seq.pos as u32])?;
        }
        let cfg = &self.cfg;
        let p = Pass {
            be: &self.backend,
            m,
            hidden: cfg.hidden,
            eps: cfg.eps,
            precision: self.precision,
        };
        let res = &s.residual;
        self.record_embedding(&p, res, ids)?;
        // (a batched pass's streamed-expert counters go to its first
        // sequence: the slots are the model's, shared by all of them)
        let mut stats = std::mem::take(&mut seqs[0].stream);
        let mut recorded = Ok(());
        for (li, layer) in self.layers.iter().enumerate() {
            let caches: Vec<_> = seqs.iter().map(|q| &q.caches[li]).collect();
            let kv = Kv::Rows {
                caches: &caches,
                positions: &positions[..m],
                row: &self.single.attention,
            };
            let mut sp = StreamPass {
                stats: &mut stats,
                trace: None,
                optimistic: false,
                placed: Vec::new(),
                // (decode rows keep the slots' hits: a step whose rows
                // route past the slots runs in waves of rows, never a
                // whole layer's experts copied a step)
                prefill: StreamPrefill::TokenWaves,
            };
            let next = self.norm_after(li, Tail::Head);
            recorded = layer.record(&p, res, res, next, s, &kv, &mut sp);
            if recorded.is_err() {
                break;
            }
        }
        seqs[0].stream = stats;
        recorded?;
        self.record_head(s, &res.normed, m)?;
        self.backend.flush()?;
        for seq in seqs.iter_mut() {
            seq.computed += 1;
            seq.written = seq.written.max(seq.pos + 1);
        }
        Ok(s)
    }

    /// The one-element position buffers of a batched step's rows, made on
    /// first use.
    fn row_positions(&self) -> Result<&[B::Buffer]> {
        if self.row_positions.get().is_none() {
            let bufs = (0..self.max_decode_batch())
                .map(|_| self.backend.alloc(DType::U32, 1, "row_position"))
                .collect::<Result<Vec<_>>>()?;
            // (set just above when empty: the cell is never full here)
            let _ = self.row_positions.set(bufs);
        }
        Ok(self.row_positions.get().map_or(&[], Vec::as_slice))
    }

    /// Each row's next token from the logits in `s`: the argmax on the
    /// device for all rows (their ids read back), and the rows of any
    /// sampler that is not greedy read back and sampled on the host.
    fn pick(&self, s: &Scratch<B::Buffer>, samplers: &mut [&mut Sampler]) -> Result<Vec<u32>> {
        let (m, vocab) = (samplers.len(), self.cfg.vocab);
        let logits = self.final_logits(s);
        self.backend.argmax(logits, &s.ids_next, m, vocab)?;
        let mut ids = self.backend.download_u32(&s.ids_next)?;
        ids.truncate(m);
        let rows = if samplers.iter().all(|x| x.is_greedy()) {
            None
        } else {
            Some(self.read_logits(s, m)?)
        };
        for (i, (id, sampler)) in ids.iter_mut().zip(samplers.iter_mut()).enumerate() {
            match &rows {
                Some(rows) if !sampler.is_greedy() => {
                    *id = sampler.sample(&rows[i])?;
                }
                _ if *id == crate::ops::NO_ARGMAX => {
                    return Err(Error::NonFinite(format!(
                        "every logit of sequence {i}'s next token is NaN or -inf"
                    )));
                }
                _ => {}
            }
        }
        Ok(ids)
    }
}
