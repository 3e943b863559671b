//! Speculative decoding: the drafter proposes k tokens, the target checks
//! them in one pass over k + 1 positions, the agreeing prefix is kept and
//! the target's sequence truncated to it.
//!
//! Greedy: a drafted token is kept while it is the target's argmax, and the
//! target's argmax at the first disagreement (or after the last draft) is
//! the round's own token, so the output is token for token the target's
//! greedy output. Sampling: the standard speculative-sampling rule (drafts
//! drawn from the drafter's distribution q, each kept with probability
//! min(1, p/q), the first rejected replaced by a draw from max(0, p - q)
//! renormalised, a bonus draw from p after k kept), which leaves the output
//! distributed exactly as the target's own sampling.

use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use super::{DraftInput, Drafter};
use crate::backend::ComputeBackend;
use crate::error::{Error, Result};
use crate::model::decoder::{GenerateOptions, Generation, Model, Sequence, LOGITS_BATCH};
use crate::model::sampling::Sampler;

/// Drafted tokens a round when none are asked for (`--draft-tokens`).
pub const DEFAULT_DRAFT_TOKENS: usize = 4;

/// How to draft.
#[derive(Clone, Debug)]
pub struct SpeculativeOptions {
    /// Tokens drafted a round (k >= 1); the target checks k + 1 positions.
    pub draft_tokens: usize,
    /// Replace the drafter's proposal for new token i by `forced[i]` where
    /// it has one (the drafter still runs). For tests and benchmarks: the
    /// target's own output makes every proposal right; a seeded corruption
    /// of it sets the acceptance rate.
    pub forced: Option<Vec<u32>>,
}

impl Default for SpeculativeOptions {
    fn default() -> Self {
        SpeculativeOptions {
            draft_tokens: DEFAULT_DRAFT_TOKENS,
            forced: None,
        }
    }
}

/// What a speculative generation did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SpeculativeStats {
    /// Draft-and-verify rounds.
    pub rounds: usize,
    /// Tokens drafted, and of those kept.
    pub drafted: usize,
    pub accepted: usize,
    /// Target passes after the prompt's (one a round).
    pub verify_passes: usize,
    /// New tokens those passes gave (the first token, the prompt's, not counted).
    pub verified_tokens: usize,
    pub draft_time: Duration,
    pub verify_time: Duration,
}

impl SpeculativeStats {
    /// Kept drafts over drafted ones (0 with none drafted).
    pub fn acceptance_rate(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }

    /// New tokens a target pass gave, after the prompt's.
    pub fn tokens_per_pass(&self) -> f64 {
        if self.verify_passes == 0 {
            0.0
        } else {
            self.verified_tokens as f64 / self.verify_passes as f64
        }
    }
}

impl<B: ComputeBackend> Drafter<B> {
    /// [`Model::generate_streaming`] with this drafter proposing
    /// `spec.draft_tokens` tokens a round: the same tokens for greedy
    /// settings, the same distribution for sampling. As there, the last new
    /// token is not yet in `seq`'s context.
    pub fn generate(
        &self,
        target: &Model<B>,
        seq: &mut Sequence<B>,
        prompt: &[u32],
        opts: &GenerateOptions,
        spec: &SpeculativeOptions,
        mut on_token: impl FnMut(u32) -> ControlFlow<()>,
    ) -> Result<(Generation, SpeculativeStats)> {
        let k = spec.draft_tokens;
        // (a verification pass is one batch and its logits one head pass)
        if !(1..LOGITS_BATCH).contains(&k) {
            return Err(Error::InvalidInput(format!(
                "{k} draft tokens: 1 to {} (one pass checks k + 1 tokens)",
                LOGITS_BATCH - 1
            )));
        }
        if prompt.is_empty() {
            return Err(Error::InvalidInput("empty prompt".into()));
        }
        // The verification pass is one batch, and the truncation after it
        // must leave the sliding rings holding the drafter's window (one
        // position more than the target's) without running the prefix again.
        if target.prefill_batch() < k + 2 && target.prefill_batch() < target.max_context() {
            return Err(Error::InvalidInput(format!(
                "{k} draft tokens need a prefill batch of at least {} (it is {})",
                k + 2,
                target.prefill_batch()
            )));
        }
        let base = seq.position() + prompt.len();
        if base + opts.max_new_tokens > target.max_context() {
            return Err(Error::InvalidInput(format!(
                "{} context tokens + {} new + {} to generate exceeds the maximum context of {} \
                 (raise --max-context)",
                seq.position(),
                prompt.len(),
                opts.max_new_tokens,
                target.max_context()
            )));
        }
        let mut sampler = Sampler::new(&opts.sampling)?;
        sampler.observe(prompt);
        let greedy = opts.sampling.is_greedy();
        let stop = if opts.stop_at_eos {
            target.config().eos_token_ids.clone()
        } else {
            Vec::new()
        };
        let mut stats = SpeculativeStats::default();
        let t0 = Instant::now();
        let (head, last) = prompt.split_at(prompt.len() - 1);
        if opts.max_new_tokens == 0 {
            target.prefill(seq, prompt)?;
            target.backend().sync()?;
            return Ok((
                Generation {
                    tokens: Vec::new(),
                    prefill_tok_s: rate(prompt.len(), t0),
                    decode_tok_s: 0.0,
                },
                stats,
            ));
        }
        target.prefill(seq, head)?;
        let mut tok = if greedy {
            target.greedy_rows(seq, last)?[0]
        } else {
            sampler.sample(&target.logits(seq, last)?[0])?
        };
        let prefill_tok_s = rate(prompt.len(), t0);
        let t1 = Instant::now();
        let mut tokens = vec![tok];
        let mut done = on_token(tok).is_break() || stop.contains(&tok);
        let mut hidden = DraftInput::Target { m: 1, row: 0 };
        while !done && tokens.len() < opts.max_new_tokens {
            let p = seq.position();
            let kk = k.min(opts.max_new_tokens - tokens.len() - 1);
            let td = Instant::now();
            let mut drafts = Vec::with_capacity(kk);
            let mut q_rows = Vec::with_capacity(kk);
            let mut cur = tok;
            for j in 0..kk {
                let input = if j == 0 { hidden } else { DraftInput::Previous };
                let forced = spec
                    .forced
                    .as_ref()
                    .and_then(|f| f.get(tokens.len() + j).copied());
                let d = if greedy {
                    let d = self.step_greedy(target, seq, p, cur, input)?;
                    forced.unwrap_or(d)
                } else {
                    let logits = self.step(target, seq, p, cur, input)?;
                    let q = sampler.distribution(&logits, &drafts)?;
                    let d = match forced {
                        Some(f) => f,
                        None => sampler.draw(&q),
                    };
                    q_rows.push(q);
                    d
                };
                drafts.push(d);
                cur = d;
            }
            stats.draft_time += td.elapsed();
            let tv = Instant::now();
            let mut batch = Vec::with_capacity(kk + 1);
            batch.push(tok);
            batch.extend_from_slice(&drafts);
            let (n, next) = if greedy {
                let best = target.greedy_rows(seq, &batch)?;
                let n = (0..kk).take_while(|&i| drafts[i] == best[i]).count();
                (n, best[n])
            } else {
                let rows = target.logits(seq, &batch)?;
                self.accept_sampled(&mut sampler, &rows, &q_rows, &drafts, spec.forced.is_some())?
            };
            target.truncate(seq, p + n + 1)?;
            stats.verify_time += tv.elapsed();
            stats.rounds += 1;
            stats.verify_passes += 1;
            stats.drafted += kk;
            stats.accepted += n;
            stats.verified_tokens += n + 1;
            hidden = DraftInput::Target { m: kk + 1, row: n };
            for &t in drafts[..n].iter().chain(std::iter::once(&next)) {
                if !greedy {
                    sampler.mark_seen(t);
                }
                tokens.push(t);
                if on_token(t).is_break() || stop.contains(&t) {
                    done = true;
                    break;
                }
            }
            tok = next;
        }
        // A stop inside a round's kept tokens: the context ends before the
        // last returned token, as a plain generation leaves it.
        let end = base + tokens.len() - 1;
        if seq.position() > end {
            target.truncate(seq, end)?;
        }
        target.backend().sync()?;
        let decode_tok_s = if tokens.len() > 1 {
            rate(tokens.len() - 1, t1)
        } else {
            0.0
        };
        Ok((
            Generation {
                tokens,
                prefill_tok_s,
                decode_tok_s,
            },
            stats,
        ))
    }

    /// The speculative-sampling rule over a verification's `rows` (the
    /// target's logits after the round's token and each draft) and the
    /// drafter's distributions `q_rows`: how many drafts are kept, and the
    /// token that follows them. Forced proposals were not drawn from q:
    /// there a proposal is kept exactly when the target's own draw from p
    /// gives it (the output is still the target's).
    fn accept_sampled(
        &self,
        sampler: &mut Sampler,
        rows: &[Vec<f32>],
        q_rows: &[Vec<f32>],
        drafts: &[u32],
        forced: bool,
    ) -> Result<(usize, u32)> {
        let p = (0..rows.len())
            .map(|i| sampler.distribution(&rows[i], &drafts[..i.min(drafts.len())]))
            .collect::<Result<Vec<_>>>()?;
        if !forced {
            return Ok(accept_rule(sampler, &p, q_rows, drafts));
        }
        for (i, &d) in drafts.iter().enumerate() {
            let t = sampler.draw(&p[i]);
            if t != d {
                return Ok((i, t));
            }
        }
        Ok((drafts.len(), sampler.draw(&p[drafts.len()])))
    }
}

fn rate(n: usize, since: Instant) -> f64 {
    let s = since.elapsed().as_secs_f64();
    if s > 0.0 {
        n as f64 / s
    } else {
        0.0
    }
}

/// The speculative-sampling rule on given distributions, for tests: `p`
/// the target's (k + 1 rows), `q` the drafter's (k rows), `drafts` drawn
/// from `q`. Returns the kept count and the next token.
#[doc(hidden)]
pub fn accept_rule(
    sampler: &mut Sampler,
    p: &[Vec<f32>],
    q: &[Vec<f32>],
    drafts: &[u32],
) -> (usize, u32) {
    for (i, &d) in drafts.iter().enumerate() {
        let (pd, qd) = (p[i][d as usize], q[i][d as usize]);
        if qd > 0.0 && sampler.uniform() < (pd / qd).min(1.0) {
            continue;
        }
        let residual: Vec<f32> = p[i]
            .iter()
            .zip(&q[i])
            .map(|(a, b)| (a - b).max(0.0))
            .collect();
        let t = if residual.iter().any(|&r| r > 0.0) {
            sampler.draw(&residual)
        } else {
            sampler.draw(&p[i])
        };
        return (i, t);
    }
    (drafts.len(), sampler.draw(&p[drafts.len()]))
}
