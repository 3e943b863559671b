//! A layer's expert stack left where the checkpoint holds it (memory-mapped),
//! read one expert at a time into a streamed layer's slots.

use std::sync::Arc;

use crate::backend::{ExpertBytes, ExpertStack, HostBytes};
use crate::dtype::DType;
use crate::error::{Error, Result};
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
    pub(super) fn maps_the_files_of(&self, other: &StoredExperts) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;

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
