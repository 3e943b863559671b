//! Routed experts streamed from the checkpoint into a bounded number of
//! device slots per layer (`ModelOptions::expert_slots`).
//!
//! A streamed layer's experts stay in the memory-mapped checkpoint
//! ([`StoredExperts`]); the device holds `slots` of them per layer, in a
//! stack of the checkpoint's format ([`crate::ComputeBackend::alloc_experts`]).
//! After a layer's router runs, its expert ids are read back (one readback a
//! layer), the layer's [`SlotCache`] places them (hits stay, misses evict the
//! policy's victims), each miss is written from the mapping into its slot
//! ([`crate::ComputeBackend::write_experts`]), and the MoE ops run on the slot
//! stack with the ids replaced by slot indices. The slot table thus lives on
//! the host and the MoE kernels see an `slots`-expert stack: every backend's
//! MoE ops (and its fusions of them) serve streaming unchanged.
//!
//! A prefill batch whose experts do not all fit the slots runs through
//! full-layer stacks ([`StreamPrefill::FullLayer`], the default): stacks
//! of every expert, made for the pass and let go at its end, into which
//! each such layer writes the experts its batch routes to (each once), then
//! runs the resident layer's ops with the router's own ids, so its rows are
//! the resident run's by construction (a batch with four routes an expert
//! writes them all without reading its ids back). A 512-token batch
//! at top-8 of 128 routes to nearly every expert of a layer: one pass over
//! them, where waves of whole tokens ([`StreamPrefill::TokenWaves`], no
//! extra memory) fit one or two tokens in 16 slots and run hundreds of MoE
//! passes a layer.
//! In token waves each wave's tokens keep their routing weights, the
//! others get weight 0 (their rows come out exactly +0), and the waves'
//! outputs are summed, so each token's row is the one the resident run
//! computes (x + 0 = x), bit for bit.

use std::time::{Duration, Instant};

use super::slot_cache::{Counts, SlotCache};
use super::stored::StoredExperts;
use super::trace::Trace;
use crate::backend::{ComputeBackend, ExpertBytes, ExpertStack, SlotWrite};
use crate::error::Result;
use crate::model::scratch::{ExpertScratch, FullLayer, WaveScratch};
use crate::ops::{DownArgs, GateUpArgs, Moe};

/// The device side of one streamed layer: its two slot stacks' shapes and
/// the stored experts they are filled from.
pub(crate) struct StreamedLayer {
    pub gate_up: StoredExperts,
    pub down: StoredExperts,
    pub cache: SlotCache,
}

/// Counters of the streamed experts since the model was opened (or since
/// [`crate::model::Sequence::take_stream_stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StreamStats {
    /// Expert lookups that found their expert in a slot, and that did not.
    pub counts: Counts,
    /// Bytes written into slots.
    pub bytes: u64,
    /// Host time in [`ComputeBackend::write_experts`] for those bytes: the
    /// copies out of the mapping, and (wgpu) the submit of the work
    /// recorded before them; the device's own transfer follows at the next
    /// submit.
    pub write_time: Duration,
    /// The path the last miss's bytes took into its slot (staged through
    /// wgpu's staging memory, or straight into a mapped slot); None before
    /// the first miss.
    pub write_path: Option<SlotWrite>,
    /// Time the host spent between a layer's routing and its MoE launches:
    /// waiting for the ids, placing them, writing the misses; and waiting
    /// for an optimistic pass's log.
    pub host_wait: Duration,
    /// Readbacks the streamed experts waited on: a layer's ids, an
    /// optimistic pass's log, a batch's weights for its waves.
    pub waits: u64,
    /// Layer passes that ran in more than one wave (prefill).
    pub extra_waves: u64,
    /// Layer passes that ran through the full-layer stacks (prefill).
    pub full_layer_passes: u64,
    /// Decode passes recorded optimistically ([`Optimism`]: slots looked up
    /// on the device, every layer's ids read back once at the end), and
    /// those of them in which every expert hit, which stood as recorded.
    pub optimistic: u64,
    pub stood: u64,
    /// Layers of optimistic passes rerun on the per-layer path (from the
    /// first layer that missed), and those of them, past that first one,
    /// whose experts on the rerun differ from the optimistic pass's.
    pub rerun_layers: u64,
    pub rerouted_layers: u64,
}

/// Where a streamed layer's misses are copied from into their slots.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ExpertStore {
    /// The checkpoint's mapping, by the host, a miss at a time (into wgpu's
    /// staging memory, or straight into a slot the host maps).
    #[default]
    Mapping,
    /// A copy of every expert in host memory the device reads, made at
    /// load ([`ComputeBackend::host_experts`]): a miss is then the device's
    /// own copy, no host copy, for the host memory of every expert. Where
    /// the backend offers no such memory (the CPU reference, a GPU whose
    /// slots the host maps), as `Mapping`.
    Host,
}

impl ExpertStore {
    pub fn name(self) -> &'static str {
        match self {
            ExpertStore::Mapping => "mapping",
            ExpertStore::Host => "host",
        }
    }

    pub fn parse(s: &str) -> Result<ExpertStore> {
        match s {
            "mapping" => Ok(ExpertStore::Mapping),
            "host" => Ok(ExpertStore::Host),
            _ => Err(crate::Error::InvalidInput(format!(
                "expert store {s:?}: mapping or host"
            ))),
        }
    }
}

/// How a prefill batch whose routed experts exceed a layer's slots runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StreamPrefill {
    /// Through stacks of every expert of a layer, made for the pass (the
    /// layer's experts in the checkpoint's format: about 0.4 GiB at q4 for
    /// Gemma 4 26B-A4B) and let go at its end; each such layer's routed
    /// experts written into them once, then the resident layer's ops.
    #[default]
    FullLayer,
    /// In waves of whole tokens through the slots, no memory past them:
    /// one MoE pass over the batch a wave.
    TokenWaves,
}

impl StreamPrefill {
    pub fn name(self) -> &'static str {
        match self {
            StreamPrefill::FullLayer => "full-layer",
            StreamPrefill::TokenWaves => "token-waves",
        }
    }

    pub fn parse(s: &str) -> Result<StreamPrefill> {
        match s {
            "full-layer" => Ok(StreamPrefill::FullLayer),
            "token-waves" => Ok(StreamPrefill::TokenWaves),
            _ => Err(crate::Error::InvalidInput(format!(
                "stream prefill {s:?}: full-layer or token-waves"
            ))),
        }
    }
}

/// When a decode pass of streamed experts is recorded optimistically: each
/// layer's ids translated to slots on the device
/// ([`ComputeBackend::slot_lookup`]) against the slot table as it stands,
/// the whole pass submitted at once, its log of ids read back at the end.
/// A pass in which every expert hit stands (no wait a layer); one that
/// missed reruns from its first layer that missed on the per-layer path
/// (the ids read back a layer, the misses written), whose input the
/// optimistic pass left intact. The logits are the same either way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Optimism {
    /// Always the per-layer path.
    Never,
    /// Optimistic after a decode pass in which every expert hit (the
    /// default): a run that keeps missing pays no discarded passes.
    #[default]
    AfterHit,
    /// Every decode pass optimistic.
    Always,
}

impl Optimism {
    pub fn name(self) -> &'static str {
        match self {
            Optimism::Never => "never",
            Optimism::AfterHit => "after-hit",
            Optimism::Always => "always",
        }
    }

    pub fn parse(s: &str) -> Result<Optimism> {
        match s {
            "never" => Ok(Optimism::Never),
            "after-hit" => Ok(Optimism::AfterHit),
            "always" => Ok(Optimism::Always),
            other => Err(crate::Error::InvalidInput(format!(
                "optimism {other:?}: never, after-hit or always"
            ))),
        }
    }
}

/// What a pass's streamed experts take from its sequence: its counters,
/// and the trace whose ids replace the router's where it routes by one
/// (with the row of the pass's first token); whether the layer is recorded
/// optimistically, and the ids the per-layer path placed (one wave).
pub(crate) struct StreamPass<'a> {
    pub stats: &'a mut StreamStats,
    pub trace: Option<(&'a Trace, usize)>,
    pub optimistic: bool,
    pub placed: Vec<u32>,
    /// How a batch that exceeds the slots runs.
    pub prefill: StreamPrefill,
}

/// A layer's host stores of its (gate_up, down) experts, where made.
pub(crate) type HostStores<'a, T> = Option<[&'a T; 2]>;

/// The slot stacks' device buffers a placement writes into, and the slot
/// table the device looks ids up in.
pub(crate) struct SlotStacks<'a, B: ComputeBackend> {
    pub gate_up: &'a B::Buffer,
    pub down: &'a B::Buffer,
    pub table: &'a B::Buffer,
    /// The layer's host stores (gate_up, down), misses' source where made
    /// ([`ExpertStore::Host`]).
    pub store: HostStores<'a, B::Buffer>,
}

impl StreamedLayer {
    /// The mapped files the experts are read from, checked unchanged
    /// before a read (Hostile input: a file cut short under a run).
    fn check_files(&self) -> Result<()> {
        self.gate_up.check_unchanged()?;
        if !self.down.maps_the_files_of(&self.gate_up) {
            self.down.check_unchanged()?;
        }
        Ok(())
    }

    /// Place `experts` (distinct) in the slots, writing each miss from the
    /// mapping into its slot; the slot of each, in order.
    pub fn place<B: ComputeBackend>(
        &mut self,
        be: &B,
        stacks: &SlotStacks<'_, B>,
        experts: &[u32],
        stats: &mut StreamStats,
    ) -> Result<Vec<u32>> {
        let before = self.cache.counts();
        let placed = self.cache.place(experts)?;
        if !placed.loads.is_empty() {
            let bufs = [stacks.gate_up, stacks.down];
            self.write_stacks(
                be,
                (bufs, self.cache.slots()),
                &placed.loads,
                stacks.store,
                stats,
            )?;
            // (ordered after the passes that read the old table)
            be.write_u32(stacks.table, 0, &self.cache.table())?;
        }
        let after = self.cache.counts();
        stats.counts.hits += after.hits - before.hits;
        stats.counts.misses += after.misses - before.misses;
        Ok(placed.slots)
    }

    /// `loads` (`(expert, slot)`) into both stacks `bufs` (gate_up, down)
    /// of `experts` each, from the mapped files (checked first) or, where
    /// given and it serves them, `store`; their time, path and bytes into
    /// `stats`.
    fn write_stacks<B: ComputeBackend>(
        &self,
        be: &B,
        (bufs, experts): ([&B::Buffer; 2], usize),
        loads: &[(u32, u32)],
        store: HostStores<'_, B::Buffer>,
        stats: &mut StreamStats,
    ) -> Result<()> {
        self.check_files()?;
        for (i, (stored, gate_up)) in [(&self.gate_up, true), (&self.down, false)]
            .into_iter()
            .enumerate()
        {
            let stack = ExpertStack { experts, gate_up };
            let shape = (experts * stored.rows, stored.cols);
            let t0 = Instant::now();
            let from = store.map(|s| s[i]);
            let path = write_or_copy(be, (stored, bufs[i], from), (stack, shape), loads, stats)?;
            stats.write_time += t0.elapsed();
            stats.write_path = Some(path);
        }
        Ok(())
    }
}

/// A prefill layer through the full-layer stacks (made if the pass has none
/// of this layer's formats yet): with `ids` (the host's), the experts they
/// route to written and the ids copied to the device; without, every
/// expert written and the router's ids read where they are. Then the
/// resident layer's two ops; their output, `s.out`.
fn full_layer<'s, B: ComputeBackend>(
    be: &B,
    layer: &StreamedLayer,
    stats: &mut StreamStats,
    (s, ws): (&'s ExpertScratch<B::Buffer>, &'s WaveScratch<B::Buffer>),
    (gate_up, slot_down): (&GateUpArgs<'_, B::Buffer>, &DownArgs<'_, B::Buffer>),
    (ids, store): (Option<&[u32]>, HostStores<'_, B::Buffer>),
    t0: Instant,
) -> Result<&'s B::Buffer> {
    let mut full = ws.full_layer.borrow_mut();
    let dtypes = [layer.gate_up.dtype, layer.down.dtype];
    if full.as_ref().is_none_or(|f| f.dtypes != dtypes) {
        // (the old stacks let go before the new are made)
        *full = None;
        *full = Some(FullLayer {
            gate_up: alloc_full(be, &layer.gate_up, true)?,
            down: alloc_full(be, &layer.down, false)?,
            dtypes,
        });
    }
    let f = full.as_ref().expect("made above");
    let experts: Vec<u32> = match ids {
        Some(ids) => union(ids),
        None => (0..layer.gate_up.experts as u32).collect(),
    };
    let loads: Vec<(u32, u32)> = experts.iter().map(|&e| (e, e)).collect();
    let bufs = [&f.gate_up, &f.down];
    layer.write_stacks(be, (bufs, layer.gate_up.experts), &loads, store, stats)?;
    // (an expert's place in the full stacks is its id: the router's own
    // ids, or the host's, which a trace may have given instead)
    let route = match ids {
        Some(ids) => {
            be.write_u32(&ws.slot_ids, 0, ids)?;
            &ws.slot_ids
        }
        None => gate_up.ids,
    };
    stats.host_wait += t0.elapsed();
    stats.full_layer_passes += 1;
    let p = Moe {
        experts: layer.gate_up.experts,
        ..slot_down.p
    };
    GateUpArgs {
        gate_up: &f.gate_up,
        ids: route,
        p,
        ..*gate_up
    }
    .run(be)?;
    DownArgs {
        down: &f.down,
        ids: route,
        p,
        ..*slot_down
    }
    .run(be)?;
    Ok(&s.out)
}

/// `loads` (`(expert, slot)`) into their slots of `buf`, a stack of
/// `stored`'s experts shaped `stack`, whole-stack `shape`: copied by the
/// device from `store` where given and it takes them, else written from
/// the mapping. Counts the bytes; returns the path they took.
fn write_or_copy<B: ComputeBackend>(
    be: &B,
    (stored, buf, store): (&StoredExperts, &B::Buffer, Option<&B::Buffer>),
    (stack, shape): (ExpertStack, (usize, usize)),
    loads: &[(u32, u32)],
    stats: &mut StreamStats,
) -> Result<SlotWrite> {
    let copies: Vec<(usize, usize)> = loads
        .iter()
        .map(|&(e, slot)| (slot as usize, e as usize))
        .collect();
    // A store the copy cannot take (laid out for the slots where a
    // full-layer stack is held otherwise, in tile order; a part off whole
    // words) is refused before anything is recorded: then the mapping.
    let copied = store.map(|s| be.copy_experts(s, buf, stored.dtype, stack, shape, &copies));
    let path = match copied {
        Some(Ok(())) => SlotWrite::Device,
        _ => {
            let writes: Vec<(usize, ExpertBytes<'_>)> = loads
                .iter()
                .map(|&(e, slot)| (slot as usize, stored.expert(e as usize)))
                .collect();
            be.write_experts(buf, stored.dtype, stack, shape, &writes)?
        }
    };
    stats.bytes += loads
        .iter()
        .map(|&(e, _)| stored.expert(e as usize).len() as u64)
        .sum::<u64>();
    Ok(path)
}

/// Routes an expert from which a prefill batch writes every expert of a
/// layer without reading its ids back.
pub const ROUTES_AN_EXPERT: usize = 4;

/// A stack of every expert of `stored` in the slot stacks' format.
fn alloc_full<B: ComputeBackend>(
    be: &B,
    stored: &StoredExperts,
    gate_up: bool,
) -> Result<B::Buffer> {
    let stack = ExpertStack {
        experts: stored.experts,
        gate_up,
    };
    let part = if gate_up { "gate_up" } else { "down" };
    be.alloc_experts(
        stored.dtype,
        stack,
        (stored.experts * stored.rows, stored.cols),
        &format!("full-layer {part} stack (prefill)"),
    )
}

/// Layer `li`'s routed experts for the `m` tokens of `s`, after its
/// router ran: the ids read back, placed in the layer's slots (the misses
/// written), the slot ids written. With one wave (always in decode) the
/// gate_up phase runs and None is returned: the caller runs `slot_down`,
/// as the resident layer runs its down phase. A batch whose experts exceed
/// the slots runs both phases, as `sp.prefill` says (through the
/// full-layer stacks, or per wave with weights masked to the wave's
/// tokens), and returns the buffer holding its output.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run<'s, B: ComputeBackend>(
    be: &B,
    layer: &mut StreamedLayer,
    li: usize,
    sp: &mut StreamPass<'_>,
    stacks: SlotStacks<'_, B>,
    s: &'s ExpertScratch<B::Buffer>,
    ws: &'s WaveScratch<B::Buffer>,
    gate_up: &GateUpArgs<'_, B::Buffer>,
    slot_down: &DownArgs<'_, B::Buffer>,
) -> Result<Option<&'s B::Buffer>> {
    let (m, k) = (gate_up.p.m, gate_up.p.top_k);
    let t0 = Instant::now();
    // A batch with at least four routes an expert, past the slots: every
    // expert of the layer into the full-layer stacks at once, not waiting
    // for the router's ids (uniform routing leaves e^-4, 2%, of them
    // unused at four routes an expert; 14% at two).
    let experts = layer.gate_up.experts;
    if sp.prefill == StreamPrefill::FullLayer
        && sp.trace.is_none()
        && layer.cache.slots() < experts
        && m * k >= ROUTES_AN_EXPERT * experts
    {
        let from = (None, stacks.store);
        return full_layer(be, layer, sp.stats, (s, ws), (gate_up, slot_down), from, t0).map(Some);
    }
    // A trace's ids are the host's already: no wait for the router's.
    let ids: Vec<u32> = match sp.trace {
        Some((t, row)) => (0..m)
            .flat_map(|i| t.tokens[(row + i) % t.tokens.len()][li].iter().copied())
            .collect(),
        None => {
            sp.stats.waits += 1;
            let mut routed = be.download_u32(&s.ids)?;
            routed.truncate(m * k);
            routed
        }
    };
    let ids = &ids[..];
    let stats = &mut *sp.stats;
    let slot_gate_up = GateUpArgs {
        gate_up: stacks.gate_up,
        ids: &ws.slot_ids,
        p: slot_down.p,
        ..*gate_up
    };
    let waves = waves(ids, k, layer.cache.slots());
    if waves.len() == 1 {
        let union = union(ids);
        let at = layer.place(be, &stacks, &union, stats)?;
        let slot_ids: Vec<u32> = ids.iter().map(|&e| slot_of(&union, &at, e)).collect();
        be.write_u32(&ws.slot_ids, 0, &slot_ids)?;
        stats.host_wait += t0.elapsed();
        sp.placed = ids.to_vec();
        slot_gate_up.run(be)?;
        return Ok(None);
    }
    if sp.prefill == StreamPrefill::FullLayer {
        return full_layer(
            be,
            layer,
            stats,
            (s, ws),
            (gate_up, slot_down),
            (Some(ids), stacks.store),
            t0,
        )
        .map(Some);
    }
    stats.extra_waves += 1;
    stats.waits += 1;
    let weights = be.download_f32(&s.weights)?;
    let (mut sum, mut other): (&B::Buffer, &B::Buffer) = (&s.out, &ws.sum);
    let hidden = slot_down.p.hidden;
    // (the first wave's wait includes the two readbacks)
    let mut since = t0;
    for (i, tokens) in waves.iter().enumerate() {
        if i > 0 {
            since = Instant::now();
        }
        let mine: Vec<u32> = tokens
            .iter()
            .flat_map(|&t| ids[t * k..(t + 1) * k].iter().copied())
            .collect();
        let union = union(&mine);
        let at = layer.place(be, &stacks, &union, stats)?;
        // Tokens outside the wave read slot at[0] with weight 0: their
        // rows come out +0 and add nothing to the sum.
        let (mut slot_ids, mut wave_w) = (vec![at[0]; m * k], vec![0f32; m * k]);
        for &t in tokens {
            for j in t * k..(t + 1) * k {
                slot_ids[j] = slot_of(&union, &at, ids[j]);
                wave_w[j] = weights[j];
            }
        }
        be.write_u32(&ws.slot_ids, 0, &slot_ids)?;
        be.write_f32(&ws.weights, 0, &wave_w)?;
        stats.host_wait += since.elapsed();
        slot_gate_up.run(be)?;
        let out = if i == 0 { sum } else { &ws.out };
        DownArgs {
            weights: &ws.weights,
            out,
            ..*slot_down
        }
        .run(be)?;
        if i > 0 {
            be.add(sum, &ws.out, other, m * hidden)?;
            std::mem::swap(&mut sum, &mut other);
        }
    }
    Ok(Some(sum))
}

impl StreamedLayer {
    /// Place the experts an optimistic pass logged for this layer (a
    /// token's top_k, each of which hit: the device found it in its slot),
    /// as the per-layer path places them, so the policy sees every use.
    pub fn place_hits<B: ComputeBackend>(
        &mut self,
        be: &B,
        stacks: &SlotStacks<'_, B>,
        ids: &[u32],
        stats: &mut StreamStats,
    ) -> Result<()> {
        let before = stats.counts.misses;
        self.place(be, stacks, &union(ids), stats)?;
        if stats.counts.misses != before {
            return Err(crate::Error::Gpu(
                "an expert the device found in its slot was not in the host's slot table".into(),
            ));
        }
        Ok(())
    }
}

/// The slot `at` gives expert `e` of `union` (the experts a placement was
/// asked for, in order).
fn slot_of(union: &[u32], at: &[u32], e: u32) -> u32 {
    at[union
        .iter()
        .position(|&u| u == e)
        .expect("every routed expert is in the union")]
}

/// The distinct experts of `ids`, in order of first use.
fn union(ids: &[u32]) -> Vec<u32> {
    let mut out: Vec<u32> = Vec::new();
    for &e in ids {
        if !out.contains(&e) {
            out.push(e);
        }
    }
    out
}

/// The tokens of a batch (`ids`: `top_k` experts per token) split into
/// waves whose experts fit `slots`: each token joins the first wave its
/// experts fit, in token order. One wave when the batch's union fits.
fn waves(ids: &[u32], top_k: usize, slots: usize) -> Vec<Vec<usize>> {
    let mut waves: Vec<(Vec<usize>, Vec<u32>)> = Vec::new();
    for (t, row) in ids.chunks(top_k).enumerate() {
        let joined = |u: &[u32]| union(&[u, row].concat());
        match waves
            .iter_mut()
            .map(|(tokens, u)| (joined(u), tokens, u))
            .find(|(j, ..)| j.len() <= slots)
        {
            Some((j, tokens, u)) => {
                tokens.push(t);
                *u = j;
            }
            None => waves.push((vec![t], union(row))),
        }
    }
    waves.into_iter().map(|(t, _)| t).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waves_fit_the_slots_and_cover_every_token_once() {
        // 4 tokens, top 2, 3 slots.
        let ids = [0, 1, 2, 3, 0, 2, 1, 0];
        let w = waves(&ids, 2, 3);
        let mut seen: Vec<usize> = w.iter().flatten().copied().collect();
        seen.sort();
        assert_eq!(seen, vec![0, 1, 2, 3]);
        for wave in &w {
            let ex: Vec<u32> = wave
                .iter()
                .flat_map(|&t| ids[2 * t..2 * t + 2].to_vec())
                .collect();
            assert!(union(&ex).len() <= 3, "{wave:?}");
        }
        assert_eq!(w, vec![vec![0, 2, 3], vec![1]]);
        assert_eq!(waves(&ids, 2, 4), vec![vec![0, 1, 2, 3]]);
    }
}
