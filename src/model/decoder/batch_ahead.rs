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
//! its ids serve them. Where sequences joined after them, their own steps
//! run alone (one-row passes, cheaper than the batched step they would
//! otherwise cost again) and the next step takes everyone. Where the call
//! is otherwise (a sequence was truncated, sampled, or run elsewhere
//! between the calls, or those that stayed come in another order) the
//! step ahead is dropped: its keys and
//! values were written one position past each sequence's, entries that are
//! dead (`Sequence::written` keeps what they overwrote in the sliding
//! rings), and the step is recorded again from the caller's tokens. So the
//! tokens are what `decode_batch` gives, whatever the caller does.

use super::{Model, Sequence};
use crate::backend::{ComputeBackend, ReadTicket};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::model::sampling::Sampler;
use crate::ops::CopyRange;

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
    /// those that stayed (others left, others joined after them); and steps
    /// run ahead that no call asked for (dropped: a sequence changed
    /// between calls, or those that stayed came in another order).
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
    /// asks for this step or part of it: the first sequences its rows, in
    /// the same order, untouched since, each stepping the id this step
    /// embedded for it (rows missing: sequences that left); the rest, if
    /// any, none of its rows (sequences that joined). Their count beside.
    fn rows_of<B: ComputeBackend>(
        &self,
        seqs: &[&mut Sequence<B>],
        tokens: &[u32],
    ) -> Option<(Vec<usize>, usize)> {
        let mut at = Vec::with_capacity(seqs.len());
        let mut next = 0;
        for (k, (s, &t)) in seqs.iter().zip(tokens).enumerate() {
            let Some(j) = self.rows[next..].iter().position(|&(id, ..)| id == s.id) else {
                let joined = &seqs[k..];
                let known = |q: &&mut Sequence<B>| self.rows.iter().any(|r| r.0 == q.id);
                return (!joined.iter().any(known)).then_some((at, joined.len()));
            };
            let i = next + j;
            let (_, pos, computed) = self.rows[i];
            if s.pos != pos || s.computed != computed || self.embedded[i] != t {
                return None;
            }
            at.push(i);
            next = i + 1;
        }
        Some((at, 0))
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
    /// same sequences (or some of them in the same order, new ones after
    /// them) and those ids finds it done or running. Otherwise
    /// this is `decode_batch`. The step ahead writes each sequence's keys
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
            (Some(f), Some((rows, 0))) if rows.len() == f.rows.len() => {
                ahead.used += 1;
                f
            }
            (Some(f), Some((rows, _))) => {
                // Rows left or joined since: the step ran for those that
                // stayed, whatever the rest.
                ahead.used += 1;
                return self.step_ahead_reshaped(ahead, seqs, tokens, f, rows);
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
                self.record_ahead(ahead, seqs, 1)?
            }
        };
        for (seq, &t) in seqs.iter_mut().zip(tokens) {
            seq.advance(&[t]);
        }
        // The next step, on the ids this one's argmax writes, while the
        // device runs this one.
        let next = self.record_ahead(ahead, seqs, current.out)?;
        self.settle_step(ahead, (current.ticket, current.out), next, m)
    }

    /// This step's `m` ids, from the readback `current` (its ticket, and
    /// which id buffer it reads), with the step `next` recorded on them
    /// kept in flight (its readback let go where this one fails or gives a
    /// row no token).
    fn settle_step(
        &self,
        ahead: &mut BatchAhead<B>,
        current: (ReadTicket, usize),
        next: Flight,
        m: usize,
    ) -> Result<Vec<u32>> {
        let ids = self.read_ids(ahead, current).and_then(|mut ids| {
            ids.truncate(m);
            no_argmax_in(&ids).map(|()| ids)
        });
        match ids {
            Ok(ids) => {
                ahead.flight = Some(Flight {
                    embedded: ids.clone(),
                    ..next
                });
                Ok(ids)
            }
            Err(e) => {
                self.backend.finish_read_u32(next.ticket).ok();
                Err(e)
            }
        }
    }

    /// A call whose first sequences are some or all of the step ahead's
    /// `f` rows (at `rows` among them), the rest joining. The rows that
    /// stayed keep the step's ids, on the device where none left, else read
    /// back and written in their new order; each joining sequence's step
    /// runs alone (a one-row pass), its id copied after theirs on the
    /// device; the next step of them all is recorded on those ids.
    fn step_ahead_reshaped(
        &self,
        ahead: &mut BatchAhead<B>,
        seqs: &mut [&mut Sequence<B>],
        tokens: &[u32],
        f: Flight,
        rows: Vec<usize>,
    ) -> Result<Vec<u32>> {
        let (be, r, out) = (&self.backend, rows.len(), f.out);
        let mut unread = None;
        if r < f.rows.len() {
            let all = self.read_ids(ahead, (f.ticket, out))?;
            let ids: Vec<u32> = rows.iter().map(|&i| all[i]).collect();
            no_argmax_in(&ids)?;
            be.write_u32(&ahead.ids[out], 0, &ids)?;
        } else {
            unread = Some(f.ticket);
        }
        let s = &self.single;
        for (j, (seq, &t)) in seqs[r..].iter_mut().zip(&tokens[r..]).enumerate() {
            be.write_u32(&s.ids, 0, &[t])?;
            self.record_rows(std::slice::from_mut(seq), &s.ids, 1)?;
            be.argmax(self.final_logits(s), &s.ids_next, 1, self.cfg.vocab)?;
            let to = CopyRange {
                src_offset: 0,
                dst_offset: r + j,
                len: 1,
            };
            be.copy_range(&s.ids_next, &ahead.ids[out], to)?;
        }
        // (one readback of them all begins now, submitting the new rows'
        // passes, and the next step is recorded while the device runs them)
        let all = (be.begin_read_u32(&ahead.ids[out])?, out);
        for (seq, &t) in seqs.iter_mut().zip(tokens) {
            seq.advance(&[t]);
        }
        let next = self.record_ahead(ahead, seqs, out);
        if let Some(t) = unread {
            be.finish_read_u32(t).ok();
        }
        self.settle_step(ahead, all, next?, seqs.len())
    }

    /// A step's ids: its readback, or where the backend let that go, its
    /// buffer, which nothing has written since (the step after it writes
    /// the other one).
    fn read_ids(
        &self,
        ahead: &BatchAhead<B>,
        (ticket, out): (ReadTicket, usize),
    ) -> Result<Vec<u32>> {
        self.backend
            .finish_read_u32(ticket)
            .or_else(|_| self.backend.download_u32(&ahead.ids[out]))
    }

    /// Record one step of `seqs` embedding the ids in `ahead.ids[input]`,
    /// its argmax into the other buffer, whose readback it begins.
    fn record_ahead(
        &self,
        ahead: &BatchAhead<B>,
        seqs: &mut [&mut Sequence<B>],
        input: usize,
    ) -> Result<Flight> {
        let m = seqs.len();
        let out = 1 - input;
        let s = self.record_rows(seqs, &ahead.ids[input], m)?;
        let be = &self.backend;
        be.argmax(self.final_logits(s), &ahead.ids[out], m, self.cfg.vocab)?;
        Ok(Flight {
            rows: seqs.iter().map(|s| (s.id, s.pos, s.computed)).collect(),
            // (the ids it embeds, set once the host has read them)
            embedded: Vec::new(),
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
