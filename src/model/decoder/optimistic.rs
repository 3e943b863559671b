//! Optimistic decode passes of streamed experts ([`Optimism`]): every
//! layer recorded at once with its slots looked up on the device
//! (`ComputeBackend::slot_lookup`), each layer's input kept in a chain of
//! residuals, the pass's log of ids read back once and settled: the
//! layers before the first that missed placed on the host as the
//! per-layer path places them (every one a hit), and from that layer on the
//! pass recorded again on the per-layer path. Pipelined greedy decode
//! settles a pass after the next is recorded (`Unsettled`), so a pass
//! that hits everywhere costs the host no wait at all.

use std::time::Instant;

use super::pass::Pass;
use super::{Kv, Model, Sequence, Tail};
use crate::backend::{ComputeBackend, ReadTicket};
use crate::error::{Error, Result};
use crate::model::config::LayerKind;
use crate::model::experts::streaming::{Optimism, StreamPass};
use crate::model::scratch::{Residual, Scratch, WaveScratch};
use crate::ops::SLOT_MISSED;

/// An optimistic decode pass recorded with its head and not yet settled:
/// its log's readback, the half of the chain its layers' inputs are in,
/// and its position.
pub(super) struct Unsettled {
    pub log: ReadTicket,
    half: usize,
    pos: usize,
}

impl<B: ComputeBackend> Model<B> {
    /// Whether a pass of `m` rows of `seq` is recorded optimistically: one
    /// decode row of streamed experts routed by the router (a trace's ids
    /// are the host's already; a routing trace reads each layer back), as
    /// the model's [`Optimism`] says.
    pub(super) fn optimistic_for(&self, seq: &Sequence<B>, m: usize) -> bool {
        m == 1
            && seq.routing.is_none()
            && seq.route_by.is_none()
            && self.expert_slots.is_some()
            && match self.expert_optimism {
                Optimism::Never => false,
                Optimism::AfterHit => self.hit_last.get(),
                Optimism::Always => true,
            }
    }

    /// Whether a decode step may be recorded before the one ahead of it is
    /// settled: a step dropped after its predecessor missed has appended its
    /// keys one position on, which must not overwrite a key the rerun's
    /// query reads (a sliding ring of just the window would).
    pub(super) fn can_run_ahead(&self) -> bool {
        let ring = self.cache_capacity(LayerKind::Sliding);
        ring > self.cfg.sliding_window || ring >= self.max_context
    }

    /// Half `half` of the one-row scratch's chain (one residual a layer).
    pub(super) fn chain<'s>(
        &self,
        s: &'s Scratch<B::Buffer>,
        half: usize,
    ) -> Option<&'s [Residual<B::Buffer>]> {
        let n = self.layers.len();
        let w = s.experts.waves.as_ref()?;
        w.chain.get(half * n..(half + 1) * n)
    }

    /// The streamed experts' scratch of `s`.
    pub(super) fn waves(s: &Scratch<B::Buffer>) -> Result<&WaveScratch<B::Buffer>> {
        s.experts
            .waves
            .as_ref()
            .ok_or_else(|| Error::InvalidInput("streamed experts without wave scratch".into()))
    }

    /// Record layer `li` of the pass; with a `chain` (an optimistic decode
    /// pass, or its rerun) it reads its input from `chain[li]` and writes
    /// the next layer's there, the last layer the scratch's residual.
    pub(super) fn record_layer(
        &self,
        seq: &mut Sequence<B>,
        s: &Scratch<B::Buffer>,
        p: &Pass<'_, B>,
        li: usize,
        (chain, tail): (Option<&[Residual<B::Buffer>]>, Tail),
        optimistic: bool,
    ) -> Result<Vec<u32>> {
        let layer = &self.layers[li];
        let next = match self.layers.get(li + 1) {
            Some(next) => Some(&next.input_norm),
            None if tail != Tail::Layers => Some(&self.final_norm),
            None => None,
        };
        let (input, output) = match chain {
            Some(c) => (&c[li], c.get(li + 1).unwrap_or(&s.residual)),
            None => (&s.residual, &s.residual),
        };
        let mut sp = StreamPass {
            stats: &mut seq.stream,
            trace: seq.route_by.as_ref().map(|(t, row)| (t, *row)),
            optimistic,
            placed: Vec::new(),
            prefill: self.stream_prefill,
        };
        layer.record(
            p,
            input,
            output,
            next,
            s,
            &Kv::One(&seq.caches[li]),
            &mut sp,
        )?;
        Ok(sp.placed)
    }

    /// A pass's end, from its `log`: the layers before the first that
    /// missed placed on the host as the per-layer path places them (hits
    /// all), and from that layer on the pass recorded again on the
    /// per-layer path, from its input in the `chain` (every layer before it
    /// hit, so the input is the true one). Whether it stood.
    pub(super) fn settle(
        &self,
        seq: &mut Sequence<B>,
        s: &Scratch<B::Buffer>,
        chain: &[Residual<B::Buffer>],
        tail: Tail,
        log: &[u32],
    ) -> Result<bool> {
        let (be, k, n) = (&self.backend, self.cfg.top_k, self.layers.len());
        let p = Pass {
            be,
            m: 1,
            hidden: self.cfg.hidden,
            eps: self.cfg.eps,
            precision: self.precision,
        };
        seq.stream.optimistic += 1;
        let ids = |li: usize| &log[li * k..(li + 1) * k];
        let first = (0..n).find(|&li| ids(li).iter().any(|&v| v & SLOT_MISSED != 0));
        for li in 0..first.unwrap_or(n) {
            if let Some(moe) = self.layers[li].experts() {
                if let Some(layer) = &moe.streamed {
                    layer
                        .borrow_mut()
                        .place_hits(be, &moe.stacks()?, ids(li), &mut seq.stream)?;
                }
            }
        }
        let Some(first) = first else {
            seq.stream.stood += 1;
            return Ok(true);
        };
        for li in first..n {
            let placed = self.record_layer(seq, s, &p, li, (Some(chain), tail), false)?;
            seq.stream.rerun_layers += 1;
            let logged: Vec<u32> = ids(li).iter().map(|&v| v & !SLOT_MISSED).collect();
            if li > first && placed != logged {
                seq.stream.rerouted_layers += 1;
            }
        }
        Ok(false)
    }

    /// An optimistic pass of half `half` recorded: its log's readback
    /// begun (it rides in the pass's submission; the host waits for it with
    /// the pass's token).
    pub(super) fn unsettled(
        &self,
        seq: &Sequence<B>,
        s: &Scratch<B::Buffer>,
        half: usize,
    ) -> Result<Unsettled> {
        Ok(Unsettled {
            log: self.backend.begin_read_u32(&Self::waves(s)?.log)?,
            half,
            pos: seq.pos,
        })
    }

    /// Settle a pipelined decode pass of the one-row scratch once its
    /// token is read back ([`Self::settle`]; the passes recorded after it
    /// dropped by the caller): whether it stood. Where it missed, `seq` is
    /// left just past the pass, whose rerun left its final norm in the
    /// scratch's residual for the head.
    pub(super) fn settle_unsettled(&self, seq: &mut Sequence<B>, u: Unsettled) -> Result<bool> {
        let (be, s) = (&self.backend, &self.single);
        let log = be.finish_read_u32(u.log)?;
        let misses = seq.stream.counts.misses;
        let chain = self
            .chain(s, u.half)
            .ok_or_else(|| Error::InvalidInput("no chain for an optimistic pass".into()))?;
        let t0 = Instant::now();
        if log.iter().any(|&v| v & SLOT_MISSED != 0) {
            // (the rerun's attention reads the pass's own position, which
            // the passes after it overwrote)
            be.write_u32(&s.pos, 0, &[u.pos as u32])?;
        }
        let stood = self.settle(seq, s, chain, Tail::Head, &log)?;
        self.hit_last.set(seq.stream.counts.misses == misses);
        if !stood {
            seq.pos = u.pos + 1;
            seq.stream.host_wait += t0.elapsed();
        }
        Ok(stood)
    }
}
