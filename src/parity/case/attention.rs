//! Attention over the KV caches.

use super::inputs::{cache_tensor, kv_suffix};
use super::rounding::{rounded_attention_nmse, rounds};
use super::Case;
use crate::backend::ComputeBackend;
use crate::ops::{self, OpKind};
use crate::parity::{HostTensor, OutSpec};
use crate::rng::Rng;
use crate::{DType, Result};

/// `attention`: m queries at positions `pos0 + t * stride` over random full
/// caches (stride 1: consecutive, as the decoder's; wider, rows whose keys
/// span more than the cache, sharing its slots).
/// `large_values`: every seventh value row is scaled by 2^17, past f16's
/// range (the tensor-core attention scales such rows down and their
/// probabilities up, `turbospark::GemmRounding`).
/// `kv`: the caches' element type (f32 or f16).
#[derive(Clone, Copy, Debug)]
pub struct Attention {
    pub p: ops::Attention,
    pub pos0: usize,
    pub stride: usize,
    pub large_values: bool,
    pub kv: DType,
}

impl Attention {
    /// The decoder's layout: consecutive positions from `pos0`, values in
    /// f16's range, f32 caches.
    pub fn new(p: ops::Attention, pos0: usize) -> Attention {
        Attention {
            p,
            pos0,
            stride: 1,
            large_values: false,
            kv: DType::F32,
        }
    }
}

impl Case for Attention {
    fn op_name(&self) -> &'static str {
        "attention"
    }

    fn name(&self) -> String {
        let p = &self.p;
        let stride = self.stride;
        format!(
            "{}(m={},heads={},kv_heads={},head_dim={},capacity={},window={},pos0={}{}{}{})",
            self.family(),
            p.m,
            p.heads,
            p.kv_heads,
            p.head_dim,
            p.capacity,
            p.window,
            self.pos0,
            if stride == 1 {
                String::new()
            } else {
                format!(",stride={stride}")
            },
            if self.large_values {
                ",large_values"
            } else {
                ""
            },
            kv_suffix(self.kv)
        )
    }

    fn kind(&self) -> OpKind {
        OpKind::Attention {
            head_dim: self.p.head_dim as u32,
        }
    }

    /// Softmax over up to thousands of keys, split and recombined.
    fn limit(&self) -> f64 {
        1e-9
    }

    /// (against a reference that rounds alike:
    /// `CpuBackend::parity_reference_for`)
    fn limit_on<B: ComputeBackend + ?Sized>(&self, device: &B) -> f64 {
        let p = &self.p;
        if rounds(device, p.precision, &self.kind(), (p.m, p.head_dim)) {
            self.limit().max(rounded_attention_nmse(p.m * p.heads))
        } else {
            self.limit()
        }
    }

    fn inputs(&self, rng: &mut Rng) -> Vec<HostTensor> {
        let p = &self.p;
        let cache = p.capacity * p.kv_heads * p.head_dim;
        let mut v = rng.vec_normal(cache, 1.0);
        if self.large_values {
            for row in v.chunks_mut(p.head_dim).step_by(7) {
                row.iter_mut().for_each(|x| *x *= 131072.0);
            }
        }
        vec![
            HostTensor::F32(rng.vec_normal(p.m * p.heads * p.head_dim, 0.25)),
            cache_tensor(rng.vec_normal(cache, 0.25), self.kv),
            cache_tensor(v, self.kv),
            HostTensor::U32(
                (0..p.m)
                    .map(|i| (self.pos0 + i * self.stride) as u32)
                    .collect(),
            ),
        ]
    }

    fn outputs(&self) -> Vec<OutSpec> {
        vec![OutSpec::F32(self.p.m * self.p.heads * self.p.head_dim)]
    }

    fn record<B: ComputeBackend>(&self, b: &B, i: &[B::Buffer], o: &[B::Buffer]) -> Result<()> {
        b.attention(&i[0], &i[1], &i[2], &i[3], &o[0], self.p)
    }

    /// Scores and values over each row's keys (consecutive rows from
    /// `pos0`, as the bench's cases are).
    fn flops(&self) -> Option<u64> {
        let p = &self.p;
        let keys: usize = (0..p.m)
            .map(|t| {
                let pos = self.pos0 + t;
                let window = if p.window > 0 { p.window } else { usize::MAX };
                (pos + 1).min(window).min(p.capacity)
            })
            .sum();
        Some(2 * (2 * keys * p.heads * p.head_dim) as u64)
    }

    /// q read and the rows written, the keys and values in the window (of
    /// consecutive rows from `pos0`) read once, the positions.
    fn bytes(&self, _inputs: &[HostTensor]) -> u64 {
        let (p, pos0) = (&self.p, self.pos0);
        let last = pos0 + p.m - 1;
        let lo = if p.window > 0 {
            (pos0 + 1).saturating_sub(p.window)
        } else {
            0
        };
        let keys = ((last - lo + 1).min(p.capacity)) as u64;
        let q = (p.m * p.heads * p.head_dim) as u64 * 4;
        2 * q + 2 * keys * (p.kv_heads * p.head_dim) as u64 * self.kv.size() as u64 + p.m as u64 * 4
    }
}
