//! The fused step after the q|k|v projection: q/k/v norms, RoPE and the
//! append to the caches, alone and with the attention after it.

use super::attention::Attention;
use super::inputs::{cache_tensor, kv_suffix, norm_weight};
use super::rounding::{rounded_attention_nmse, rounds};
use super::{Case, Op};
use crate::backend::ComputeBackend;
use crate::ops::{self, OpKind};
use crate::parity::{HostTensor, OutSpec};
use crate::rng::Rng;
use crate::{DType, Result};

/// `qkv_post`: m tokens at positions `pos0..pos0+m` into random caches of
/// `kv` (norm weights of dtype `w`).
#[derive(Clone, Copy, Debug)]
pub struct QkvPost {
    pub p: ops::QkvPost,
    pub pos0: usize,
    pub w: DType,
    pub kv: DType,
}

/// `qkv_post_attention`: `QkvPost`'s case, then attention over its
/// outputs (`window`: the layer's; same rows, heads and caches).
#[derive(Clone, Copy, Debug)]
pub struct QkvPostAttention {
    pub p: ops::QkvPost,
    pub window: usize,
    pub pos0: usize,
    pub w: DType,
    pub kv: DType,
    /// The attention's (prefill sizes: tensor cores where the device has them).
    pub precision: crate::Precision,
}

/// `qkv_post_attention_row`: `c`'s one-row case (its `p.m` 1) as row `row`
/// of a pass of `rows` rows whose rows attend on caches of their own: the
/// raw rows and the heads' rows of all `rows`, the other rows of the heads
/// left as they were (an in-place output), through two one-row scratch
/// buffers the op may use.
#[derive(Clone, Copy, Debug)]
pub struct QkvPostAttentionRow {
    pub c: QkvPostAttention,
    pub row: usize,
    pub rows: usize,
}

/// Both families' inputs: the raw rows, two norm weights, the positions
/// and the two caches.
fn qkv_inputs(
    p: &ops::QkvPost,
    pos0: usize,
    w: DType,
    kv: DType,
    rng: &mut Rng,
) -> Vec<HostTensor> {
    let cache = p.capacity * p.kv_heads * p.head_dim;
    vec![
        HostTensor::F32(rng.vec_normal(p.m * p.raw_row(), 1.0)),
        norm_weight(rng, w, p.head_dim),
        norm_weight(rng, w, p.head_dim),
        HostTensor::U32((0..p.m).map(|i| (pos0 + i) as u32).collect()),
        cache_tensor(rng.vec_normal(cache, 1.0), kv),
        cache_tensor(rng.vec_normal(cache, 1.0), kv),
    ]
}

/// Whether output `j` of either family is a cache appended in f16.
fn f16_cache(kv: DType, j: usize) -> bool {
    kv == DType::F16 && (j == 1 || j == 2)
}

/// An f16 cache read back widened (exactly) to f32, as the f16 cache it is.
fn as_f16(t: &HostTensor) -> Option<HostTensor> {
    match t {
        HostTensor::F32(v) => Some(HostTensor::F16(
            v.iter().map(|&x| half::f16::from_f32(x)).collect(),
        )),
        _ => None,
    }
}

impl Case for QkvPost {
    fn op_name(&self) -> &'static str {
        "qkv_post"
    }

    fn name(&self) -> String {
        let p = &self.p;
        format!(
            "{}(m={},heads={},kv_heads={},head_dim={},rot_pairs={},capacity={},v_from_k={},pos0={},w={}{})",
            self.family(),
            p.m,
            p.heads,
            p.kv_heads,
            p.head_dim,
            p.rot_pairs,
            p.capacity,
            p.v_from_k,
            self.pos0,
            self.w,
            kv_suffix(self.kv)
        )
    }

    fn kind(&self) -> OpKind {
        OpKind::QkvPost {
            head_dim: self.p.head_dim as u32,
        }
    }

    /// Norms, then RoPE at positions up to ~3e4 (as `Rope`).
    fn limit(&self) -> f64 {
        1e-9
    }

    fn inputs(&self, rng: &mut Rng) -> Vec<HostTensor> {
        qkv_inputs(&self.p, self.pos0, self.w, self.kv, rng)
    }

    fn outputs(&self) -> Vec<OutSpec> {
        let p = &self.p;
        let cache = p.capacity * p.kv_heads * p.head_dim;
        vec![
            OutSpec::F32(p.m * p.heads * p.head_dim),
            OutSpec::InPlace(4, cache),
            OutSpec::InPlace(5, cache),
        ]
    }

    fn record<B: ComputeBackend>(&self, b: &B, i: &[B::Buffer], o: &[B::Buffer]) -> Result<()> {
        b.qkv_post(&i[0], &i[1], &i[2], &i[3], &o[0], &i[4], &i[5], self.p)
    }

    fn f16_stored(&self, j: usize) -> bool {
        f16_cache(self.kv, j)
    }

    /// The raw rows, two norm weights and the positions in; q out, and
    /// only the new cache entries (not the whole caches).
    fn bytes(&self, _inputs: &[HostTensor]) -> u64 {
        let p = &self.p;
        let (m, hd) = (p.m as u64, p.head_dim as u64);
        let kv = m * p.kv_heads as u64 * hd * self.kv.size() as u64;
        m * p.raw_row() as u64 * 4
            + 2 * hd * self.w.size() as u64
            + m * 4
            + m * p.heads as u64 * hd * 4
            + 2 * kv
    }
}

impl QkvPostAttention {
    /// Its first part as its own case.
    pub fn qkv_post(&self) -> QkvPost {
        QkvPost {
            p: self.p,
            pos0: self.pos0,
            w: self.w,
            kv: self.kv,
        }
    }

    /// Its attention as its own case (the decoder's layout, on its caches).
    pub fn attention(&self) -> Attention {
        Attention {
            kv: self.kv,
            ..Attention::new(
                self.p.attention(self.window, 1.0, self.precision),
                self.pos0,
            )
        }
    }
}

impl Case for QkvPostAttention {
    fn op_name(&self) -> &'static str {
        "qkv_post_attention"
    }

    fn name(&self) -> String {
        let p = &self.p;
        format!(
            "{}(m={},heads={},kv_heads={},head_dim={},rot_pairs={},capacity={},v_from_k={},window={},pos0={},w={}{})",
            self.family(),
            p.m,
            p.heads,
            p.kv_heads,
            p.head_dim,
            p.rot_pairs,
            p.capacity,
            p.v_from_k,
            self.window,
            self.pos0,
            self.w,
            kv_suffix(self.kv)
        )
    }

    fn kind(&self) -> OpKind {
        OpKind::QkvPost {
            head_dim: self.p.head_dim as u32,
        }
    }

    /// Softmax over up to thousands of keys, split and recombined, after
    /// qkv_post's norms and RoPE.
    fn limit(&self) -> f64 {
        1e-9
    }

    /// (its attention, the half that may round: as [`Attention`]'s)
    fn limit_on<B: ComputeBackend + ?Sized>(&self, device: &B) -> f64 {
        let p = &self.p;
        let attention = OpKind::Attention {
            head_dim: p.head_dim as u32,
        };
        if rounds(device, self.precision, &attention, (p.m, p.head_dim)) {
            self.limit().max(rounded_attention_nmse(p.m * p.heads))
        } else {
            self.limit()
        }
    }

    fn inputs(&self, rng: &mut Rng) -> Vec<HostTensor> {
        qkv_inputs(&self.p, self.pos0, self.w, self.kv, rng)
    }

    fn outputs(&self) -> Vec<OutSpec> {
        let p = &self.p;
        let cache = p.capacity * p.kv_heads * p.head_dim;
        let rows = p.m * p.heads * p.head_dim;
        vec![
            OutSpec::F32(rows),
            OutSpec::InPlace(4, cache),
            OutSpec::InPlace(5, cache),
            OutSpec::F32(rows),
        ]
    }

    fn record<B: ComputeBackend>(&self, b: &B, i: &[B::Buffer], o: &[B::Buffer]) -> Result<()> {
        let p = self.p;
        b.qkv_post_attention(
            &i[0],
            &i[1],
            &i[2],
            &i[3],
            &o[0],
            &i[4],
            &i[5],
            &o[1],
            p,
            p.attention(self.window, 1.0, self.precision),
        )
    }

    fn f16_stored(&self, j: usize) -> bool {
        f16_cache(self.kv, j)
    }

    /// On f16 caches, the attention output (3) judged on the device's q
    /// and caches: its new key and value rows are stored in f16 from
    /// values each side computes (RoPE at positions up to ~3e4 leaves them
    /// ~1e-6 apart), so where one straddles a rounding boundary the caches
    /// differ by an f16 step ([`Case::f16_stored`] allows it) and the
    /// attention reading them carries that step into its output (lavapipe,
    /// 2026-12-02: 9e-9 on one seed in a few hundred). Attention over the
    /// device's q and caches on the reference holds the output to
    /// attention's own limit.
    fn on_device_outputs(
        &self,
        inputs: &[HostTensor],
        d: &[HostTensor],
    ) -> Option<(usize, Op, Vec<HostTensor>)> {
        if self.kv != DType::F16 {
            return None;
        }
        Some((
            3,
            Op::Attention(self.attention()),
            vec![
                d[0].clone(),
                as_f16(&d[1])?,
                as_f16(&d[2])?,
                inputs[3].clone(),
            ],
        ))
    }

    fn flops(&self) -> Option<u64> {
        self.attention().flops()
    }

    /// qkv_post's bytes, then the attention's keys and values read and
    /// its rows written (its queries never leave the launch).
    fn bytes(&self, inputs: &[HostTensor]) -> u64 {
        let p = &self.p;
        let q = (p.m * p.heads * p.head_dim) as u64 * 4;
        self.qkv_post().bytes(inputs) + self.attention().bytes(&[]) - q
    }
}

impl Case for QkvPostAttentionRow {
    fn op_name(&self) -> &'static str {
        "qkv_post_attention_row"
    }

    fn name(&self) -> String {
        format!(
            "{}(row={},rows={}) of {}",
            self.family(),
            self.row,
            self.rows,
            self.c.name()
        )
    }

    fn kind(&self) -> OpKind {
        self.c.kind()
    }

    /// The one-row op's (its arithmetic, in place or through the scratch).
    fn limit(&self) -> f64 {
        self.c.limit()
    }

    fn limit_on<B: ComputeBackend + ?Sized>(&self, device: &B) -> f64 {
        self.c.limit_on(device)
    }

    /// The one-row op's inputs with `rows` raw rows, then the heads' rows
    /// as they were and the two scratch rows (random: the op overwrites
    /// what it uses of them).
    fn inputs(&self, rng: &mut Rng) -> Vec<HostTensor> {
        let p = &self.c.p;
        let hn = p.heads * p.head_dim;
        let mut v = self.c.inputs(rng);
        v[0] = HostTensor::F32(rng.vec_normal(self.rows * p.raw_row(), 1.0));
        v.push(HostTensor::F32(rng.vec_normal(self.rows * hn, 1.0)));
        v.push(HostTensor::F32(rng.vec_normal(p.raw_row(), 1.0)));
        v.push(HostTensor::F32(rng.vec_normal(hn, 1.0)));
        v
    }

    fn outputs(&self) -> Vec<OutSpec> {
        let p = &self.c.p;
        let cache = p.capacity * p.kv_heads * p.head_dim;
        let hn = p.heads * p.head_dim;
        vec![
            OutSpec::F32(hn),
            OutSpec::InPlace(4, cache),
            OutSpec::InPlace(5, cache),
            OutSpec::InPlace(6, self.rows * hn),
        ]
    }

    fn record<B: ComputeBackend>(&self, b: &B, i: &[B::Buffer], o: &[B::Buffer]) -> Result<()> {
        let p = self.c.p;
        b.qkv_post_attention_row(
            self.row,
            &i[0],
            &i[1],
            &i[2],
            &i[3],
            &o[0],
            &i[4],
            &i[5],
            &i[6],
            (&i[7], &i[8]),
            p,
            p.attention(self.c.window, 1.0, self.c.precision),
        )
    }

    fn f16_stored(&self, j: usize) -> bool {
        f16_cache(self.c.kv, j)
    }

    fn flops(&self) -> Option<u64> {
        self.c.flops()
    }

    fn bytes(&self, inputs: &[HostTensor]) -> u64 {
        self.c.bytes(inputs)
    }
}
