//! Generation: a prompt's prefill, then one decode step a new token until
//! `max_new_tokens` or a stop. Greedy steps are pipelined (the argmax on
//! the device feeds the next step's embedding); other sampling reads back
//! each step's logits row and samples it on the host.

use std::collections::VecDeque;
use std::ops::ControlFlow;
use std::time::Instant;

use super::optimistic::Unsettled;
use super::{Model, Sequence, Tail};
use crate::backend::{ComputeBackend, ReadTicket};
use crate::error::{Error, Result};
use crate::model::sampling::{Sampler, Sampling};

/// How to generate.
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    pub max_new_tokens: usize,
    pub sampling: Sampling,
    /// Stop after a token of the config's `eos_token_id` (it is the last
    /// token returned). Off by default, so a run has a fixed length.
    pub stop_at_eos: bool,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_new_tokens: 32,
            sampling: Sampling::Greedy,
            stop_at_eos: false,
        }
    }
}

/// The result of [`Model::generate`].
#[derive(Clone, Debug)]
pub struct Generation {
    /// The new tokens (the prompt not included).
    pub tokens: Vec<u32>,
    /// Prompt tokens per second, up to and including the first new token.
    pub prefill_tok_s: f64,
    /// New tokens per second after the first (0 when fewer than two).
    pub decode_tok_s: f64,
}

impl Generation {
    /// `tokens`, the prefill rate, and the decode rate of every token after
    /// the first, which came at `first_token_at`.
    fn timed(tokens: Vec<u32>, prefill_tok_s: f64, first_token_at: Instant) -> Self {
        let decode_tok_s = if tokens.len() > 1 {
            rate(tokens.len() - 1, first_token_at)
        } else {
            0.0
        };
        Generation {
            tokens,
            prefill_tok_s,
            decode_tok_s,
        }
    }
}

impl<B: ComputeBackend> Model<B> {
    /// Append `prompt` to the context and generate up to `max_new_tokens`.
    ///
    /// The prompt goes through prefill batches, the LM head only for its
    /// last token (the first new token's logits; a prompt of one token, or
    /// whose last batch is that token, takes the decode path for it), so the
    /// head runs once per new token. Each later token is a decode step:
    /// one submit and
    /// one small readback: with greedy sampling the argmax runs on the device
    /// and writes straight into the id buffer the next step embeds, so only
    /// 4 bytes come back and the next step is recorded before they do
    /// (pipelined); other sampling reads back the logits row. With
    /// `opts.stop_at_eos`, generation ends after an `eos_token_id` token.
    ///
    /// The last new token is not yet in the context: a following call
    /// starts its prompt with it.
    pub fn generate(
        &self,
        seq: &mut Sequence<B>,
        prompt: &[u32],
        opts: &GenerateOptions,
    ) -> Result<Generation> {
        self.generate_streaming(seq, prompt, opts, |_| ControlFlow::Continue(()))
    }

    /// [`Self::generate`], handing each new token to `on_token` as soon as
    /// the host has it (a chat shows the text as it comes). A
    /// `ControlFlow::Break` stops generation after that token, which is
    /// the last one returned; the context is left as an end-of-sequence
    /// token leaves it (greedy steps recorded past it are taken back).
    pub fn generate_streaming(
        &self,
        seq: &mut Sequence<B>,
        prompt: &[u32],
        opts: &GenerateOptions,
        mut on_token: impl FnMut(u32) -> ControlFlow<()>,
    ) -> Result<Generation> {
        if prompt.is_empty() {
            return Err(Error::InvalidInput("empty prompt".into()));
        }
        self.check_owned(seq)?;
        self.check_request(seq, prompt, opts.max_new_tokens.saturating_sub(1))?;
        let mut sampler = Sampler::new(&opts.sampling)?;
        sampler.observe(prompt);
        let greedy = opts.sampling.is_greedy();
        let t0 = Instant::now();
        if opts.max_new_tokens == 0 {
            self.prefill(seq, prompt)?;
            self.backend.sync()?;
            return Ok(Generation {
                tokens: Vec::new(),
                prefill_tok_s: rate(prompt.len(), t0),
                decode_tok_s: 0.0,
            });
        }
        let stop = if opts.stop_at_eos {
            self.cfg.eos_token_ids.clone()
        } else {
            Vec::new()
        };
        // Whether generation ends after token `t`.
        let mut ends = |t: u32| on_token(t).is_break() || stop.contains(&t);
        if greedy {
            let mut tokens = Vec::with_capacity(opts.max_new_tokens);
            let base = seq.pos + prompt.len();
            let run =
                self.generate_greedy(seq, prompt, opts.max_new_tokens, &mut ends, t0, &mut tokens);
            // The steps ran ahead of the ids the host had: the context's
            // tokens are the generated ones its positions embedded.
            let got = run.as_ref().map_or(&tokens, |g| &g.tokens);
            if seq.pos >= base && seq.tokens.len() == base {
                let embedded = (seq.pos - base).min(got.len());
                seq.tokens.extend_from_slice(&got[..embedded]);
                seq.pos = seq.tokens.len();
            }
            return run;
        }
        let mut tokens = Vec::with_capacity(opts.max_new_tokens);
        self.prefill_with_head(seq, prompt)?;
        let mut tok = self.sample_single(&mut sampler)?;
        let prefill_tok_s = rate(prompt.len(), t0);
        tokens.push(tok);
        let t1 = Instant::now();
        while !ends(tok) && tokens.len() < opts.max_new_tokens {
            tok = self.decode_step(seq, tok, &mut sampler)?;
            tokens.push(tok);
        }
        Ok(Generation::timed(tokens, prefill_tok_s, t1))
    }

    /// Greedy decode of `n` (> 0) tokens after `prompt`, pipelined: the
    /// argmax runs on the device and writes the id the next step embeds, so
    /// step k + 1 is recorded and submitted before step k's 4-byte readback
    /// is waited for, and the device never idles while the host records a
    /// step. The first token comes from the prompt's prefill
    /// ([`Self::prefill_with_head`]); each later one is a decode step, one
    /// submit per token. A step of streamed experts recorded optimistically
    /// is settled when its token comes back (`decoder::optimistic`): one
    /// that missed reruns and the steps behind it are recorded again.
    fn generate_greedy(
        &self,
        seq: &mut Sequence<B>,
        prompt: &[u32],
        n: usize,
        ends: &mut dyn FnMut(u32) -> bool,
        t0: Instant,
        tokens: &mut Vec<u32>,
    ) -> Result<Generation> {
        /// Steps recorded ahead of the token the host waits for.
        const AHEAD: usize = 2;
        let prompt_len = prompt.len();
        let mut in_flight: VecDeque<Step> = VecDeque::with_capacity(AHEAD);
        // The first token into `single.ids`, which the first step embeds.
        self.prefill_with_head(seq, prompt)?;
        let s = &self.single;
        self.backend
            .argmax(self.final_logits(s), &s.ids, 1, self.cfg.vocab)?;
        in_flight.push_back(Step {
            id: self.backend.begin_read_u32(&self.single.ids)?,
            unsettled: None,
        });
        let (mut recorded, mut flip) = (1, false);
        let (mut prefill_tok_s, mut t1) = (0.0, Instant::now());
        let ahead = self.can_run_ahead();
        while tokens.len() < n {
            while recorded < n && in_flight.len() < AHEAD {
                // A step not settled yet holds back any step that would
                // place experts on the host before it is settled.
                if in_flight.iter().any(|f| f.unsettled.is_some())
                    && !(ahead && self.optimistic_for(seq, 1))
                {
                    break;
                }
                let s = &self.single;
                let (cur, next) = if flip {
                    (&s.ids_next, &s.ids)
                } else {
                    (&s.ids, &s.ids_next)
                };
                self.backend.write_u32(&s.pos, 0, &[seq.pos as u32])?;
                let half = ahead.then_some(usize::from(flip));
                let unsettled = match self.record_pass(seq, s, cur, 1, Tail::Head, half) {
                    Ok(u) => u,
                    // A step embeds the token before the host reads it: a
                    // backend that checks ids refuses NO_ARGMAX here first.
                    Err(e) => {
                        return Err(self
                            .no_token_in_flight(&mut in_flight, tokens.len())?
                            .unwrap_or(e))
                    }
                };
                self.backend
                    .argmax(self.final_logits(s), next, 1, self.cfg.vocab)?;
                in_flight.push_back(Step {
                    id: self.backend.begin_read_u32(next)?,
                    unsettled,
                });
                seq.pos += 1;
                recorded += 1;
                flip = !flip;
            }
            let step = in_flight
                .pop_front()
                .ok_or_else(|| Error::Gpu("no decode step in flight".into()))?;
            let ids = self.backend.finish_read_u32(step.id)?;
            let mut tok = *ids
                .first()
                .ok_or_else(|| Error::Gpu("empty readback of the sampled id".into()))?;
            if let Some(u) = step.unsettled {
                // (the data is there: it came with the token)
                let behind = in_flight.len();
                let stood = self.settle_unsettled(seq, u)?;
                if !stood {
                    // The steps behind read a wrong token's pass: dropped
                    // unsettled, and recorded again after the rerun's token.
                    for f in in_flight.drain(..) {
                        self.backend.finish_read_u32(f.id)?;
                        if let Some(u) = f.unsettled {
                            self.backend.finish_read_u32(u.log)?;
                        }
                    }
                    let s = &self.single;
                    self.record_head(s, &s.residual.normed, 1)?;
                    self.backend
                        .argmax(self.final_logits(s), &s.ids, 1, self.cfg.vocab)?;
                    let ids = self.backend.download_u32(&s.ids)?;
                    seq.stream.waits += 1;
                    tok = *ids
                        .first()
                        .ok_or_else(|| Error::Gpu("empty readback of the sampled id".into()))?;
                    recorded -= behind;
                    // (the next step embeds `ids`, which holds the token)
                    flip = false;
                }
            }
            if tok == crate::ops::NO_ARGMAX {
                // (the steps in flight behind it read the same broken model)
                seq.pos -= in_flight.len();
                self.no_token_in_flight(&mut in_flight, 0)?;
                return Err(Error::NonFinite(format!(
                    "every logit of generated token {} is NaN or -inf",
                    tokens.len() + 1
                )));
            }
            tokens.push(tok);
            if tokens.len() == 1 {
                prefill_tok_s = rate(prompt_len, t0);
                t1 = Instant::now();
            }
            if ends(tok) {
                // Steps recorded past the stop token never happened: their
                // positions taken back (their cache entries are overwritten
                // by whatever comes next), each settled as it ran, so the
                // slots see what the per-layer path would have placed.
                self.drop_in_flight(seq, &mut in_flight)?;
                break;
            }
        }
        Ok(Generation::timed(std::mem::take(tokens), prefill_tok_s, t1))
    }

    /// The steps in flight read back and their positions taken back; each
    /// optimistic one settled (its experts placed, a miss rerun) as the
    /// per-layer path would have placed them when it was recorded.
    fn drop_in_flight(&self, seq: &mut Sequence<B>, in_flight: &mut VecDeque<Step>) -> Result<()> {
        let back = seq.pos - in_flight.len();
        while let Some(f) = in_flight.pop_front() {
            self.backend.finish_read_u32(f.id)?;
            if let Some(u) = f.unsettled {
                if !self.settle_unsettled(seq, u)? {
                    // (a step behind a rerun read a wrong token's pass)
                    for f in in_flight.drain(..) {
                        self.backend.finish_read_u32(f.id)?;
                        if let Some(u) = f.unsettled {
                            self.backend.finish_read_u32(u.log)?;
                        }
                    }
                }
            }
        }
        seq.pos = back;
        Ok(())
    }

    /// The steps in flight read back; the non-finite-logits error of the first that found no token
    /// (`ops::NO_ARGMAX`), if one did. `done` tokens were generated before
    /// them.
    fn no_token_in_flight(
        &self,
        in_flight: &mut VecDeque<Step>,
        done: usize,
    ) -> Result<Option<Error>> {
        let mut found = None;
        for (i, f) in in_flight.drain(..).enumerate() {
            let ids = self.backend.finish_read_u32(f.id)?;
            if let Some(u) = f.unsettled {
                self.backend.finish_read_u32(u.log)?;
            }
            if found.is_none() && ids.first() == Some(&crate::ops::NO_ARGMAX) {
                found = Some(Error::NonFinite(format!(
                    "every logit of generated token {} is NaN or -inf",
                    done + i + 1
                )));
            }
        }
        Ok(found)
    }

    /// One sampled (not greedy) decode step of `tok`: the logits row comes
    /// back and the host samples the next token.
    fn decode_step(&self, seq: &mut Sequence<B>, tok: u32, sampler: &mut Sampler) -> Result<u32> {
        let s = &self.single;
        self.backend.write_u32(&s.ids, 0, &[tok])?;
        self.backend.write_u32(&s.pos, 0, &[seq.pos as u32])?;
        self.record_forward(seq, s, &s.ids, 1, Tail::Head)?;
        seq.advance(&[tok]);
        self.sample_single(sampler)
    }

    /// `single`'s logits row read back and sampled on the host.
    fn sample_single(&self, sampler: &mut Sampler) -> Result<u32> {
        let row = (self.backend).download_f32_range(
            self.final_logits(&self.single),
            0,
            self.cfg.vocab,
        )?;
        sampler.sample(&row)
    }
}

/// A greedy decode step in flight: its token's readback and, recorded
/// optimistically, the pass to settle when the token comes.
struct Step {
    id: ReadTicket,
    unsettled: Option<Unsettled>,
}

fn rate(n: usize, since: Instant) -> f64 {
    let s = since.elapsed().as_secs_f64();
    if s > 0.0 {
        n as f64 / s
    } else {
        0.0
    }
}
