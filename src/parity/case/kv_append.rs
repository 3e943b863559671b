//! Appending new key and value rows to the KV caches.

use super::inputs::{cache_tensor, kv_suffix};
use super::Case;
use crate::backend::ComputeBackend;
use crate::ops::{self, OpKind};
use crate::parity::{HostTensor, OutSpec};
use crate::rng::Rng;
use crate::{DType, Result};

/// `kv_append`: m entries at positions `pos0..pos0+m` into random caches of
/// `kv` (f32 or f16).
#[derive(Clone, Copy, Debug)]
pub struct KvAppend {
    pub p: ops::KvAppend,
    pub pos0: usize,
    pub kv: DType,
}

impl Case for KvAppend {
    fn op_name(&self) -> &'static str {
        "kv_append"
    }

    fn name(&self) -> String {
        let p = &self.p;
        format!(
            "{}(m={},kv_heads={},head_dim={},capacity={},pos0={}{})",
            self.family(),
            p.m,
            p.kv_heads,
            p.head_dim,
            p.capacity,
            self.pos0,
            kv_suffix(self.kv)
        )
    }

    fn kind(&self) -> OpKind {
        OpKind::KvAppend
    }

    /// Pure data movement: bit-exact.
    fn limit(&self) -> f64 {
        0.0
    }

    fn inputs(&self, rng: &mut Rng) -> Vec<HostTensor> {
        let (p, kv) = (&self.p, self.kv);
        let row = p.kv_heads * p.head_dim;
        // For f16 caches, the rounding rule's edges too: every
        // fifth value below f16's smallest normal (a signed zero),
        // every seventh past its largest (held at 65504).
        let mut new_rows = || {
            let mut v = rng.vec_normal(p.m * row, 1.0);
            if kv == DType::F16 {
                v.iter_mut().step_by(5).for_each(|x| *x *= 1e-6);
                v.iter_mut().skip(3).step_by(7).for_each(|x| *x *= 1e6);
            }
            v
        };
        let (k, v) = (new_rows(), new_rows());
        vec![
            HostTensor::F32(k),
            HostTensor::F32(v),
            cache_tensor(rng.vec_normal(p.capacity * row, 1.0), kv),
            cache_tensor(rng.vec_normal(p.capacity * row, 1.0), kv),
            HostTensor::U32((0..p.m).map(|i| (self.pos0 + i) as u32).collect()),
        ]
    }

    fn outputs(&self) -> Vec<OutSpec> {
        let n = self.p.capacity * self.p.kv_heads * self.p.head_dim;
        vec![OutSpec::InPlace(2, n), OutSpec::InPlace(3, n)]
    }

    fn record<B: ComputeBackend>(&self, b: &B, i: &[B::Buffer], _o: &[B::Buffer]) -> Result<()> {
        b.kv_append(&i[0], &i[1], &i[2], &i[3], &i[4], self.p)
    }
}
