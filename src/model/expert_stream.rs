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
//! A prefill batch whose experts do not all fit the slots runs in waves
//! (`waves`): each wave's tokens keep their routing weights, the others
//! get weight 0 (their rows come out exactly +0), and the waves' outputs are
//! summed, so each token's row is the one the resident run computes (x + 0 =
//! x), bit for bit.

use std::sync::Arc;
use std::time::Duration;

use crate::backend::{ComputeBackend, ExpertBytes, ExpertStack, HostBytes};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::model::expert_cache::{Counts, SlotCache};
use crate::model::shard::MappedFile;
use crate::model::tensor_ref::TensorRef;

/// One piece of a stored expert stack: `len` bytes of `bytes` from
/// `start`, whose `e`-th of `experts` equal parts belongs to expert `e`.
#[derive(Clone)]
struct Segment {
    bytes: HostBytes<'static>,
    start: usize,
    len: usize,
}

/// A layer's `[experts, rows, cols]` expert stack left where the
/// checkpoint holds it, read one expert at a time.
#[derive(Clone)]
pub struct StoredExperts {
    pub dtype: DType,
    pub experts: usize,
    /// Rows of one expert.
    pub rows: usize,
    pub cols: usize,
    /// The parts of [`ExpertBytes`], each as its segments in order.
    parts: [Vec<Segment>; 3],
    /// The files the segments map, checked before each read.
    files: Vec<Arc<MappedFile>>,
}

impl StoredExperts {
    /// A stack held whole as one tensor in the runtime's layout (a float
    /// stack, or an assembled affine one: `quant::Affine::layout`).
    pub fn whole(t: &TensorRef) -> Result<StoredExperts> {
        let [experts, rows, cols] = three(t)?;
        let len = experts * rows * cols;
        let seg = |start: usize, n: usize| Segment {
            bytes: t.bytes.clone(),
            start,
            len: n,
        };
        let parts = match t.dtype {
            DType::Affine(a) => {
                let l = a.layout(len);
                let sb = len / a.group as usize * a.scales.size();
                [
                    vec![seg(0, l.words * 4)],
                    vec![seg(l.scales, sb)],
                    vec![seg(l.biases, sb)],
                ]
            }
            d => [vec![seg(0, d.bytes_for(len))], vec![], vec![]],
        };
        StoredExperts::new(t.dtype, [experts, rows, cols], parts)
    }

    /// A stack from stored tensors, each `[experts, ..]`: `parts[i]` the
    /// tensors whose expert slices make part `i` of an expert, in order
    /// (MLX's gate and up stacks for a fused gate_up).
    pub(crate) fn from_parts(
        dtype: DType,
        shape: [usize; 3],
        parts: [Vec<HostBytes<'static>>; 3],
    ) -> Result<StoredExperts> {
        let parts = parts.map(|p| {
            p.into_iter()
                .map(|bytes| {
                    let len = bytes.as_slice().len();
                    Segment {
                        bytes,
                        start: 0,
                        len,
                    }
                })
                .collect()
        });
        StoredExperts::new(dtype, shape, parts)
    }

    fn new(
        dtype: DType,
        [experts, rows, cols]: [usize; 3],
        parts: [Vec<Segment>; 3],
    ) -> Result<StoredExperts> {
        let s = StoredExperts {
            dtype,
            experts,
            rows,
            cols,
            parts,
            files: Vec::new(),
        };
        let stack = ExpertStack {
            experts,
            gate_up: false,
        };
        let want = stack.part_ranges(dtype, (experts * rows, cols), 0)?;
        for (i, w) in want.iter().enumerate() {
            let segs = &s.parts[i];
            let have: usize = segs.iter().map(|g| g.len).sum();
            if have != w.len() * experts
                || segs
                    .iter()
                    .any(|g| g.len % experts != 0 || g.start + g.len > g.bytes.as_slice().len())
            {
                return Err(Error::Checkpoint {
                    path: format!("{experts} experts of {rows} x {cols} {dtype}"),
                    detail: format!(
                        "part {i} holds {have} bytes, expected {} per expert",
                        w.len()
                    ),
                });
            }
        }
        Ok(s)
    }

    /// The same, its reads checked against `files` changing on disk.
    pub(crate) fn mapping(mut self, files: Vec<Arc<MappedFile>>) -> StoredExperts {
        self.files = files;
        self
    }

    /// An error naming the file when a file this stack maps changed since
    /// it was opened (a read of a truncated file's map would kill the
    /// process): checked before the misses of each placement are read.
    pub fn check_unchanged(&self) -> Result<()> {
        self.files.iter().try_for_each(|f| f.check_unchanged())
    }

    /// Whether this stack's reads are checked against the same files as
    /// `other`'s (both from one checkpoint): one check serves both.
    fn maps_the_files_of(&self, other: &StoredExperts) -> bool {
        self.files.len() == other.files.len()
            && self
                .files
                .iter()
                .zip(&other.files)
                .all(|(a, b)| Arc::ptr_eq(a, b))
    }

    /// Expert `e`'s bytes, borrowed from the mapping.
    pub fn expert(&self, e: usize) -> ExpertBytes<'_> {
        fn cut(segs: &[Segment], experts: usize, e: usize) -> Vec<&[u8]> {
            segs.iter()
                .map(|g| {
                    let n = g.len / experts;
                    let at = g.start + e * n;
                    &g.bytes.as_slice()[at..at + n]
                })
                .collect()
        }
        let n = self.experts;
        ExpertBytes {
            parts: [
                cut(&self.parts[0], n, e),
                cut(&self.parts[1], n, e),
                cut(&self.parts[2], n, e),
            ],
        }
    }

    /// Bytes of one expert.
    pub fn expert_bytes(&self) -> usize {
        self.parts
            .iter()
            .flatten()
            .map(|g| g.len / self.experts)
            .sum()
    }
}

fn three(t: &TensorRef) -> Result<[usize; 3]> {
    <[usize; 3]>::try_from(t.shape.as_slice()).map_err(|_| Error::Checkpoint {
        path: t.name.clone(),
        detail: format!(
            "shape {:?}: an expert stack is [experts, rows, cols]",
            t.shape
        ),
    })
}

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
    /// Time the host spent between a layer's routing and its MoE launches:
    /// waiting for the ids, placing them, writing the misses.
    pub host_wait: Duration,
    /// Layer passes that ran in more than one wave (prefill).
    pub extra_waves: u64,
}

/// Every streamed layer's state (None for a layer without experts).
pub(crate) struct Streaming {
    pub slots: usize,
    pub layers: Vec<Option<StreamedLayer>>,
}

/// The slot stacks' device buffers a placement writes into.
pub(crate) struct SlotStacks<'a, B: ComputeBackend> {
    pub gate_up: &'a B::Buffer,
    pub down: &'a B::Buffer,
}

impl StreamedLayer {
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
            self.gate_up.check_unchanged()?;
            if !self.down.maps_the_files_of(&self.gate_up) {
                self.down.check_unchanged()?;
            }
        }
        let n = self.cache.slots();
        for (stored, buf, gate_up) in [
            (&self.gate_up, stacks.gate_up, true),
            (&self.down, stacks.down, false),
        ] {
            let writes: Vec<(usize, ExpertBytes<'_>)> = placed
                .loads
                .iter()
                .map(|&(e, slot)| (slot as usize, stored.expert(e as usize)))
                .collect();
            if writes.is_empty() {
                continue;
            }
            be.write_experts(
                buf,
                stored.dtype,
                ExpertStack {
                    experts: n,
                    gate_up,
                },
                (n * stored.rows, stored.cols),
                &writes,
            )?;
            stats.bytes += writes.iter().map(|w| w.1.len() as u64).sum::<u64>();
        }
        let after = self.cache.counts();
        stats.counts.hits += after.hits - before.hits;
        stats.counts.misses += after.misses - before.misses;
        Ok(placed.slots)
    }
}

/// The distinct experts of `ids`, in order of first use.
pub(crate) fn union(ids: &[u32]) -> Vec<u32> {
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
pub(crate) fn waves(ids: &[u32], top_k: usize, slots: usize) -> Vec<Vec<usize>> {
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

    #[test]
    fn an_expert_reads_its_slices_of_every_segment() {
        let gate: Vec<u8> = (0..12).collect();
        let up: Vec<u8> = (100..112).collect();
        let s = StoredExperts::from_parts(
            DType::BF16,
            [2, 2, 3],
            [
                vec![HostBytes::Owned(gate.into()), HostBytes::Owned(up.into())],
                vec![],
                vec![],
            ],
        )
        .unwrap();
        assert_eq!(s.expert_bytes(), 12);
        let e1 = s.expert(1);
        assert_eq!(
            e1.parts[0],
            vec![
                &[6u8, 7, 8, 9, 10, 11][..],
                &[106, 107, 108, 109, 110, 111][..]
            ]
        );
        assert!(e1.parts[1].is_empty());
    }

    #[test]
    fn a_stack_of_the_wrong_size_is_refused() {
        let r = StoredExperts::from_parts(
            DType::BF16,
            [2, 2, 3],
            [vec![HostBytes::Owned(vec![0u8; 10].into())], vec![], vec![]],
        );
        assert!(r.is_err());
    }
}
