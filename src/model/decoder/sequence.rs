//! A sequence: one conversation's state on a loaded [`Model`], apart from
//! the model so that any number of them share its weights.
//!
//! A [`Sequence`] owns its KV caches, its position, the tokens whose keys
//! and values those caches hold, and its counters (tokens computed, routing
//! trace, streamed experts' stats). The model holds only what every
//! sequence shares: weights, settings, activation scratch and the streamed
//! experts' slots (a cache of weights). Passes of different sequences may
//! interleave freely: each pass writes its ids and positions before it runs
//! and reads nothing a previous pass of another sequence left behind.
//!
//! Truncating a sequence to position p and forking one from another's
//! prefix keep the caches as they are (the entries past p are dead:
//! attention reads only positions before the query's own) as long as every
//! sliding-window ring still holds the window that position p attends to
//! ([`Model::window_holds`]); otherwise the prefix is recomputed from its
//! tokens. Either way decoding from p gives exactly what a fresh run to p
//! gives.

use std::sync::atomic::{AtomicU64, Ordering};

use super::{Model, Tail};
use crate::backend::ComputeBackend;
use crate::error::{Error, Result};
use crate::model::config::LayerKind;
use crate::model::experts::streaming::StreamStats;
use crate::model::experts::trace::Trace;

/// Per-layer KV cache, `[kv_heads, capacity, head_dim]` for K and for V, of
/// `ModelOptions::kv_cache` (f32 or f16).
pub(super) struct KvCache<B: ComputeBackend> {
    pub k: B::Buffer,
    pub v: B::Buffer,
    pub capacity: usize,
}

/// Tells models apart, so that a sequence is never run on a model whose
/// caches it was not made for.
pub(super) fn next_model_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Tells sequences apart (a batched step run ahead knows its rows by it).
fn next_sequence_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// One conversation on a [`Model`]: made by [`Model::new_sequence`] or
/// [`Model::fork`], dropped to free its caches.
pub struct Sequence<B: ComputeBackend> {
    /// The model it belongs to ([`Model`]'s id).
    pub(super) model: u64,
    /// This sequence's own id.
    pub(super) id: u64,
    pub(super) caches: Vec<KvCache<B>>,
    /// Tokens in the caches (the next token's position). While greedy
    /// steps are in flight it runs ahead of `tokens`, whose ids the host
    /// learns later; between calls the two agree.
    pub(super) pos: usize,
    /// The tokens whose keys and values the caches hold, in order.
    pub(super) tokens: Vec<u32>,
    /// One past the highest position any pass wrote keys for since the
    /// caches last started from 0, dead entries included (a pipelined
    /// step dropped at a stop wrote one past `pos`): the sliding rings'
    /// slots they overwrote decide what a truncation keeps.
    pub(super) written: usize,
    /// Token positions this sequence ran through the layers (prefill rows,
    /// decode steps, recomputed prefixes); a fork's copied prefix is not.
    pub(super) computed: u64,
    /// Each pass's tokens' expert ids per MoE layer, while a routing trace
    /// is recorded ([`Sequence::record_routing`]).
    pub(super) routing: Option<Vec<Vec<Vec<u32>>>>,
    experts: usize,
    /// Streamed experts' counters for this sequence's passes.
    pub(super) stream: StreamStats,
    /// A trace whose ids replace the router's choice ([`Model::route_by`]),
    /// and its row the next token takes.
    pub(super) route_by: Option<(Trace, usize)>,
}

impl<B: ComputeBackend> Sequence<B> {
    /// Tokens in the context: the next token's position.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// The tokens in the context, in order: what the caches hold (a
    /// generation's last token is not yet among them).
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Token positions this sequence has run through the model's layers
    /// since it was made: a fork's shared prefix is not among them, a
    /// prefix recomputed after a truncation is.
    pub fn computed_tokens(&self) -> u64 {
        self.computed
    }

    /// Record, from now on, every token's routed experts per MoE layer
    /// (`on`), or stop. Each layer's ids are read back as the layer is
    /// recorded, a wait per layer: for traces (sizing expert slots with
    /// `bench --replay-trace`), not for timing. A token decoded ahead and
    /// dropped at a stop (the pipelined decode's last) is recorded too: the
    /// device routed it.
    pub fn record_routing(&mut self, on: bool) {
        self.routing = on.then(Vec::new);
    }

    /// The routing recorded since [`Sequence::record_routing`] (which goes on).
    pub fn take_routing(&mut self) -> Option<Trace> {
        let tokens = std::mem::take(self.routing.as_mut()?);
        Some(Trace {
            experts: self.experts,
            tokens,
        })
    }

    /// The streamed experts' counters of this sequence's passes since the
    /// last call, which start again from zero (all zero when the model's
    /// experts are resident).
    pub fn take_stream_stats(&mut self) -> StreamStats {
        std::mem::take(&mut self.stream)
    }

    /// Forget the context: the next pass starts at position 0 (a
    /// truncation to 0, which never needs a recomputation).
    pub fn clear(&mut self) {
        self.pos = 0;
        self.tokens.clear();
        // (every later write comes after everything the rings hold now)
        self.written = 0;
    }

    /// `chunk`, just run through the layers at the current position, is in
    /// the caches now.
    pub(super) fn advance(&mut self, chunk: &[u32]) {
        debug_assert_eq!(self.pos, self.tokens.len());
        self.pos += chunk.len();
        self.tokens.extend_from_slice(chunk);
    }
}

impl<B: ComputeBackend> Model<B> {
    /// A new, empty sequence: its own KV caches, sized for the model's
    /// `max_context`.
    pub fn new_sequence(&self) -> Result<Sequence<B>> {
        let be = &self.backend;
        let mut caches = Vec::with_capacity(self.cfg.layers.len());
        for (i, l) in self.cfg.layers.iter().enumerate() {
            let capacity = self.cache_capacity(l.kind);
            let n = l.kv_heads * capacity * l.head_dim;
            caches.push(KvCache {
                k: be.alloc(self.kv_cache, n, &format!("layers.{i}.k_cache"))?,
                v: be.alloc(self.kv_cache, n, &format!("layers.{i}.v_cache"))?,
                capacity,
            });
        }
        Ok(Sequence {
            model: self.id,
            id: next_sequence_id(),
            caches,
            pos: 0,
            tokens: Vec::new(),
            written: 0,
            computed: 0,
            routing: None,
            experts: self.cfg.experts,
            stream: StreamStats::default(),
            route_by: None,
        })
    }

    /// Cut `seq` back to its first `p` tokens: decoding from there gives
    /// exactly what a fresh run of those tokens gives. Free while the
    /// sliding-window rings still hold what position p attends to
    /// ([`Model::window_holds`]); past that the `p` tokens are run again.
    pub fn truncate(&self, seq: &mut Sequence<B>, p: usize) -> Result<()> {
        self.check_owned(seq)?;
        if p > seq.pos {
            return Err(Error::InvalidInput(format!(
                "truncate to position {p}: the sequence holds only {} tokens",
                seq.pos
            )));
        }
        if self.window_holds(seq.written, p) {
            seq.pos = p;
            seq.tokens.truncate(p);
            return Ok(());
        }
        let prefix = seq.tokens[..p].to_vec();
        seq.clear();
        self.prefill(seq, &prefix)
    }

    /// A new sequence holding the first `p` tokens of `src`, its caches
    /// copied from `src`'s (a prompt cache: the prefix is not run again),
    /// or, where `src`'s sliding-window rings no longer hold what position
    /// p attends to, the prefix run afresh. `src` is left as it was.
    pub fn fork(&self, src: &Sequence<B>, p: usize) -> Result<Sequence<B>> {
        self.check_owned(src)?;
        if p > src.pos {
            return Err(Error::InvalidInput(format!(
                "fork at position {p}: the sequence holds only {} tokens",
                src.pos
            )));
        }
        let mut seq = self.new_sequence()?;
        if self.window_holds(src.written, p) {
            for (from, to) in src.caches.iter().zip(&seq.caches) {
                self.backend.copy_buffer(&from.k, &to.k)?;
                self.backend.copy_buffer(&from.v, &to.v)?;
            }
            seq.pos = p;
            seq.written = src.written;
            seq.tokens = src.tokens[..p].to_vec();
        } else {
            self.prefill(&mut seq, &src.tokens[..p])?;
        }
        Ok(seq)
    }

    /// Whether caches written up to position `held` (exclusive; the
    /// sequence's last write, dead entries past its position included)
    /// still hold everything a query at position `p <= held` reads: every sliding layer's ring
    /// (`capacity` slots, position q in slot q % capacity) still has the
    /// `sliding_window` positions before p, none overwritten by a later
    /// one. Full layers keep every position.
    pub fn window_holds(&self, held: usize, p: usize) -> bool {
        self.cfg.layers.iter().all(|l| {
            let capacity = self.cache_capacity(l.kind);
            l.kind == LayerKind::Full
                || capacity >= self.max_context
                || p.saturating_sub(self.cfg.sliding_window) >= held.saturating_sub(capacity)
        })
    }

    /// Route `seq`'s tokens by `trace` from now on (None: by the router
    /// again): each token's expert ids per MoE layer are the trace's next
    /// row (from its first again after its last), the router's weights
    /// kept. For measuring streamed experts on routing of a known locality
    /// (a real model's recorded trace, a generated one): the slots then
    /// miss, evict and upload as that routing makes them. Only with streamed
    /// experts, whose ids the host reads; the trace must fit the model
    /// (experts, MoE layers, top_k distinct ids a layer).
    pub fn route_by(&self, seq: &mut Sequence<B>, trace: Option<Trace>) -> Result<()> {
        self.check_owned(seq)?;
        let Some(trace) = trace else {
            seq.route_by = None;
            return Ok(());
        };
        if self.expert_slots.is_none() {
            return Err(Error::InvalidInput(
                "routing by a trace needs streamed experts (--expert-slots): resident \
                 experts read the router's ids on the device"
                    .into(),
            ));
        }
        let bad = |detail: String| Err(Error::InvalidInput(format!("routing trace: {detail}")));
        if trace.experts != self.cfg.experts {
            return bad(format!(
                "{} experts, the model has {}",
                trace.experts, self.cfg.experts
            ));
        }
        if trace.tokens.is_empty() {
            return bad("no tokens".into());
        }
        for (t, row) in trace.tokens.iter().enumerate() {
            if row.len() != self.cfg.layers.len() {
                return bad(format!(
                    "token {t} has {} MoE layers, the model {}",
                    row.len(),
                    self.cfg.layers.len()
                ));
            }
            for (l, ids) in row.iter().enumerate() {
                let distinct = ids.iter().all(|&e| (e as usize) < self.cfg.experts)
                    && (1..ids.len()).all(|i| !ids[..i].contains(&ids[i]));
                if ids.len() != self.cfg.top_k || !distinct {
                    return bad(format!(
                        "token {t}, layer {l}: {ids:?} is not {} distinct experts below {}",
                        self.cfg.top_k, self.cfg.experts
                    ));
                }
            }
        }
        seq.route_by = Some((trace, 0));
        Ok(())
    }

    /// A sequence made by this model, whose caches fit it.
    pub(super) fn check_owned(&self, seq: &Sequence<B>) -> Result<()> {
        if seq.model != self.id {
            return Err(Error::InvalidInput(
                "the sequence belongs to another model: its caches were sized for that one".into(),
            ));
        }
        Ok(())
    }

    /// Run `tokens` through every layer (no LM head), in batches, appended
    /// to `seq`.
    pub fn prefill(&self, seq: &mut Sequence<B>, tokens: &[u32]) -> Result<()> {
        self.check_owned(seq)?;
        self.check_request(seq, tokens, 0)?;
        for chunk in tokens.chunks(self.prefill_batch) {
            self.forward_chunk(seq, chunk, Tail::Layers)?;
            // (a chunk of several tokens went a layer at a time and left
            // nothing recorded; this submits a one-token chunk)
            self.backend.flush()?;
            seq.advance(chunk);
        }
        Ok(())
    }
}
