//! Batched decode kept a step ahead on the device
//! ([`Model::decode_batch_ahead`]): what [`Model::decode_batch`] gives, but
//! while the host waits for a step's ids the device already runs the next
//! one, which embeds those ids from the device (greedy rows: the argmax
//! writes them there). A step's recording and readback then overlap the
//! GPU's work instead of adding to it, as `generate`'s pipelined decode does
//! for one sequence.
//!
//! The step run ahead is a guess that the caller comes back with the same
//! sequences, unchanged, and the ids it was just given. Where some of them
//! have left (a generation ended), the step ran for the rest all the same:
//! its ids serve them, and only their next step's recording is not hidden.
//! Where the call is otherwise (a sequence joined, one was truncated,
//! sampled, or run elsewhere between the calls) the step ahead is dropped: its keys and
//! values were written one position past each sequence's, entries that are
//! dead (`Sequence::written` keeps what they overwrote in the sliding
//! rings), and the step is recorded again from the caller's tokens. So the
//! tokens are what `decode_batch` gives, whatever the caller does.

use super::{Model, Sequence};
use crate::backend::{ComputeBackend, ReadTicket};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::model::sampling::Sampler;

/// The state of a [`Model::decode_batch_ahead`] run: two id buffers (a
/// step embeds one and its argmax writes the other) and the step in
/// flight. Made by [`Model::batch_ahead`] for one model.
pub struct BatchAhead<B: ComputeBackend> {
    model: u64,
    ids: [B::Buffer; 2],
    flight: Option<Flight>,
    /// Steps found run ahead, and steps run ahead then dropped.
    used: u64,
    dropped: u64,
}

impl<B: ComputeBackend> BatchAhead<B> {
    /// Steps a call found already run ahead, for all its sequences or for
    /// those that stayed of a wider step, and steps run ahead that no call
    /// asked for (dropped: a sequence joined, or changed between calls).
    pub fn counts(&self) -> (u64, u64) {
        (self.used, self.dropped)
    }
}

/// A step recorded ahead: the rows it ran (each sequence's id, position
/// and computed count when it was recorded), the ids it embedded (the
/// previous call's answer) and where its own ids land.
struct Flight {
    rows: Vec<(u64, usize, u64)>,
    embedded: Vec<u32>,
    /// Which of the two id buffers its argmax writes.
    out: usize,
    ticket: ReadTicket,
}

impl Flight {
    /// Where each of `seqs` is among this step's rows, where the caller
    /// asks for this step or part of it: each sequence one of its rows, in
    /// the same order, untouched since, stepping the id this step embedded
    /// for it (rows missing: sequences that left).
    fn rows_of<B: ComputeBackend>(
        &self,
        seqs: &[&mut Sequence<B>],
        tokens: &[u32],
    ) -> Option<Vec<usize>> {
        let mut at = Vec::with_capacity(seqs.len());
        let mut next = 0;
        for (s, &t) in seqs.iter().zip(tokens) {
            let i = next + self.rows[next..].iter().position(|&(id, ..)| id == s.id)?;
            let (_, pos, computed) = self.rows[i];
            if s.pos != pos || s.computed != computed || self.embedded[i] != t {
                return None;
            }
            at.push(i);
            next = i + 1;
        }
        Some(at)
    }
}

impl<B: ComputeBackend> Model<B> {
    /// A fresh [`BatchAhead`] for [`Model::decode_batch_ahead`] on this
    /// model: two id buffers of [`Model::max_decode_batch`] rows, no step
    /// in flight.
    pub fn batch_ahead(&self) -> Result<BatchAhead<B>> {
        let n = self.max_decode_batch();
        let be = &self.backend;
        Ok(BatchAhead {
            model: self.id,
            ids: [
                be.alloc(DType::U32, n, "batch_ahead.ids_a")?,
                be.alloc(DType::U32, n, "batch_ahead.ids_b")?,
            ],
            flight: None,
            used: 0,
            dropped: 0,
        })
    }

    /// [`Model::decode_batch`]'s step, the tokens the same, with the next
    /// step recorded before this one's ids are read back: where every row
    /// is greedy, the rows fit one pass and no expert is streamed (a
    /// streamed layer places its experts from the host between its router
    /// and its experts), the device runs the step after this one while the
    /// host waits for this one's ids, and a call that comes back with the
    /// same sequences (or some of them, in the same order) and those ids
    /// finds it done or running. Otherwise this is `decode_batch`. The step ahead writes each sequence's keys
    /// one position past its own (dead entries until the next call makes
    /// them its own) and counts as a computed position.
    pub fn decode_batch_ahead(
        &self,
        ahead: &mut BatchAhead<B>,
        seqs: &mut [&mut Sequence<B>],
        tokens: &[u32],
        samplers: &mut [&mut Sampler],
    ) -> Result<Vec<u32>> {
        if ahead.model != self.id {
            return Err(Error::InvalidInput(
                "decode_batch_ahead: the batch state belongs to another model".into(),
            ));
        }
        self.check_sampled_batch("decode_batch_ahead", seqs, tokens, samplers.len())?;
        let m = seqs.len();
        let ahead_ok = m <= self.max_decode_batch()
            && self.expert_slots.is_none()
            && samplers.iter().all(|s| s.is_greedy());
        let flight = ahead.flight.take();
        let rows = flight
            .as_ref()
            .filter(|_| ahead_ok)
            .and_then(|f| f.rows_of(seqs, tokens));
        let current = match (flight, rows) {
            (Some(f), Some(rows)) if rows.len() == f.rows.len() => {
                ahead.used += 1;
                f
            }
            (Some(f), Some(rows)) => {
                // Rows left since: the step ran for the rest, whose next
                // is recorded from the ids read back (the host's
                // recording not hidden this once, the step not run again).
                ahead.used += 1;
                let out = f.out;
                let all = self.read_ids(ahead, f)?;
                let ids: Vec<u32> = rows.iter().map(|&i| all[i]).collect();
                return self.step_ahead_from(ahead, seqs, tokens, ids, out);
            }
            (stale, _) => {
                if let Some(f) = stale {
                    // Not what is asked for: dead entries, its ids unread
                    // (a readback the backend has already let go of, as it
                    // may when the caller read more between the calls than
                    // it keeps in flight, is no loss).
                    ahead.dropped += 1;
                    self.backend.finish_read_u32(f.ticket).ok();
                }
                if !ahead_ok {
                    return self.decode_batch(seqs, tokens, samplers);
                }
                self.backend.write_u32(&ahead.ids[1], 0, tokens)?;
                self.record_ahead(ahead, seqs, 1, tokens.to_vec())?
            }
        };
        for (seq, &t) in seqs.iter_mut().zip(tokens) {
            seq.advance(&[t]);
        }
        // The next step, on the ids this one's argmax writes, while the
        // device runs this one. (Its `embedded` is set once they are read.)
        let next = self.record_ahead(ahead, seqs, current.out, Vec::new())?;
        let ids = match self.read_ids(ahead, current) {
            Ok(mut ids) => {
                ids.truncate(m);
                ids
            }
            Err(e) => {
                self.backend.finish_read_u32(next.ticket).ok();
                return Err(e);
            }
        };
        if let Err(e) = no_argmax_in(&ids) {
            self.backend.finish_read_u32(next.ticket).ok();
            return Err(e);
        }
        ahead.flight = Some(Flight {
            embedded: ids.clone(),
            ..next
        });
        Ok(ids)
    }

    /// The rest of a call whose step ran as part of a wider one: `tokens`
    /// in the caches, `ids` (this step's, read back) written into
    /// `ahead.ids[into]` and the next step recorded on them.
    fn step_ahead_from(
        &self,
        ahead: &mut BatchAhead<B>,
        seqs: &mut [&mut Sequence<B>],
        tokens: &[u32],
        ids: Vec<u32>,
        into: usize,
    ) -> Result<Vec<u32>> {
        no_argmax_in(&ids)?;
        for (seq, &t) in seqs.iter_mut().zip(tokens) {
            seq.advance(&[t]);
        }
        self.backend.write_u32(&ahead.ids[into], 0, &ids)?;
        ahead.flight = Some(self.record_ahead(ahead, seqs, into, ids.clone())?);
        Ok(ids)
    }

    /// A step's ids: its readback, or where the backend let that go, its
    /// buffer, which nothing has written since (the step after it writes
    /// the other one).
    fn read_ids(&self, ahead: &BatchAhead<B>, f: Flight) -> Result<Vec<u32>> {
        self.backend
            .finish_read_u32(f.ticket)
            .or_else(|_| self.backend.download_u32(&ahead.ids[f.out]))
    }

    /// Record one step of `seqs` embedding the ids in `ahead.ids[input]`,
    /// its argmax into the other buffer, whose readback it begins.
    fn record_ahead(
        &self,
        ahead: &BatchAhead<B>,
        seqs: &mut [&mut Sequence<B>],
        input: usize,
        embedded: Vec<u32>,
    ) -> Result<Flight> {
        let m = seqs.len();
        let out = 1 - input;
        let s = self.record_rows(seqs, &ahead.ids[input], m)?;
        let be = &self.backend;
        be.argmax(self.final_logits(s), &ahead.ids[out], m, self.cfg.vocab)?;
        Ok(Flight {
            rows: seqs.iter().map(|s| (s.id, s.pos, s.computed)).collect(),
            embedded,
            out,
            ticket: be.begin_read_u32(&ahead.ids[out])?,
        })
    }
}

/// The error for a row whose logits gave no token (all NaN or -inf).
fn no_argmax_in(ids: &[u32]) -> Result<()> {
    match ids.iter().position(|&t| t == crate::ops::NO_ARGMAX) {
        Some(i) => Err(Error::NonFinite(format!(
            "every logit of sequence {i}'s next token is NaN or -inf"
        ))),
        None => Ok(()),
    }
}
