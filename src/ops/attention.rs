//! The attention ops' contracts: RoPE, the cache append, attention, the
//! fused qkv_post and what qkv_post_attention asks of its two ops.

use super::fused::check_args;
use super::roles::Args;
use super::{check_buf, no_alias, no_alias_all, nonzero, CACHES, F32, FLOATS, U32};
use crate::device_buffer::DeviceBuffer;
use crate::error::{Error, Result};
use crate::precision::Precision;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rope {
    pub m: usize,
    pub heads: usize,
    pub head_dim: usize,
    /// Number of rotated pairs (head_dim/2 for full rotation; Gemma 4's
    /// proportional RoPE on full layers: head_dim/2 * partial_rotary_factor).
    pub rot_pairs: usize,
    pub theta: f32,
}

impl Rope {
    /// Shapes, dtypes and aliasing of a `rope` call (in place on `x`); its
    /// arguments by role.
    pub fn validate<'a, B: DeviceBuffer>(&self, x: &'a B, pos: &'a B) -> Result<Args<'a, B>> {
        const OP: &str = "rope";
        nonzero(
            OP,
            &[
                ("m", self.m),
                ("heads", self.heads),
                ("head_dim", self.head_dim),
            ],
        )?;
        rope_dims(OP, self.head_dim, self.rot_pairs)?;
        check_buf(OP, "x", x, &F32, self.m * self.heads * self.head_dim)?;
        check_buf(OP, "positions", pos, &U32, self.m)?;
        no_alias(OP, x, &[Some(pos)])?;
        Ok(Args::new(OP).plain("x", x).plain("positions", pos))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvAppend {
    pub m: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Slots per KV head in the cache.
    pub capacity: usize,
}

impl KvAppend {
    /// Shapes, dtypes and aliasing of a `kv_append` call; its arguments by
    /// role.
    pub fn validate<'a, B: DeviceBuffer>(
        &self,
        k: &'a B,
        v: &'a B,
        kc: &'a B,
        vc: &'a B,
        pos: &'a B,
    ) -> Result<Args<'a, B>> {
        const OP: &str = "kv_append";
        nonzero(
            OP,
            &[
                ("m", self.m),
                ("kv_heads", self.kv_heads),
                ("head_dim", self.head_dim),
                ("capacity", self.capacity),
            ],
        )?;
        fits_cache(OP, self.m, self.capacity)?;
        let row = self.kv_heads * self.head_dim;
        check_buf(OP, "k", k, &F32, self.m * row)?;
        check_buf(OP, "v", v, &F32, self.m * row)?;
        check_caches(OP, kc, vc, self.capacity * row)?;
        check_buf(OP, "positions", pos, &U32, self.m)?;
        no_alias(OP, kc, &[Some(k), Some(v), Some(vc), Some(pos)])?;
        no_alias(OP, vc, &[Some(k), Some(v), Some(pos)])?;
        Ok(Args::new(OP)
            .plain("k", k)
            .plain("v", v)
            .plain("k_cache", kc)
            .plain("v_cache", vc)
            .plain("positions", pos))
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Attention {
    pub m: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub capacity: usize,
    /// Sliding window (keys `pos+1-window ..= pos`); 0 for full attention.
    pub window: usize,
    pub scale: f32,
    /// As [`Matmul::precision`](super::Matmul::precision), for the scores'
    /// and the output's products.
    pub precision: Precision,
}

/// Largest head_dim the attention kernels take.
pub const MAX_HEAD_DIM: usize = 512;

impl Attention {
    /// Shapes, dtypes and aliasing of an `attention` call; its arguments by
    /// role.
    pub fn validate<'a, B: DeviceBuffer>(
        &self,
        q: &'a B,
        kc: &'a B,
        vc: &'a B,
        pos: &'a B,
        out: &'a B,
    ) -> Result<Args<'a, B>> {
        const OP: &str = "attention";
        nonzero(
            OP,
            &[
                ("m", self.m),
                ("heads", self.heads),
                ("kv_heads", self.kv_heads),
                ("head_dim", self.head_dim),
                ("capacity", self.capacity),
            ],
        )?;
        if self.heads % self.kv_heads != 0 {
            return Err(Error::shape(
                OP,
                format!(
                    "heads {} not a multiple of kv_heads {}",
                    self.heads, self.kv_heads
                ),
            ));
        }
        if self.head_dim > MAX_HEAD_DIM {
            return Err(Error::shape(
                OP,
                format!(
                    "head_dim {} over the supported {MAX_HEAD_DIM}",
                    self.head_dim
                ),
            ));
        }
        let qn = self.m * self.heads * self.head_dim;
        check_buf(OP, "q", q, &F32, qn)?;
        check_caches(OP, kc, vc, self.capacity * self.kv_heads * self.head_dim)?;
        check_buf(OP, "positions", pos, &U32, self.m)?;
        check_buf(OP, "out", out, &F32, qn)?;
        no_alias(OP, out, &[Some(q), Some(kc), Some(vc), Some(pos)])?;
        Ok(Args::new(OP)
            .plain("q", q)
            .plain("k_cache", kc)
            .plain("v_cache", vc)
            .plain("positions", pos)
            .plain("out", out))
    }
}

/// After the fused q|k|v projection, per token and head (one fused op):
/// `q = rope(rmsnorm(q) * w_q)` to `q_out`; `k = rope(rmsnorm(k) * w_k)` and
/// `v = rmsnorm(v)` (no weight) into the caches at slot `pos % capacity`.
/// A raw row is `[q (heads * head_dim) | k (kv_heads * head_dim) | v]`; with
/// `v_from_k` (attention_k_eq_v) there is no v part and V is the raw k.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QkvPost {
    pub m: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub rot_pairs: usize,
    pub theta: f32,
    pub eps: f32,
    pub capacity: usize,
    pub v_from_k: bool,
}

impl QkvPost {
    /// The attention over what this qkv_post writes: its rows, heads and
    /// caches, with the layer's `window` (0: full), score `scale` and
    /// `precision`.
    pub fn attention(&self, window: usize, scale: f32, precision: Precision) -> Attention {
        Attention {
            m: self.m,
            heads: self.heads,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            capacity: self.capacity,
            window,
            scale,
            precision,
        }
    }

    /// Elements of one raw q|k|v row.
    pub fn raw_row(&self) -> usize {
        (self.heads + self.kv_heads * if self.v_from_k { 1 } else { 2 }) * self.head_dim
    }

    /// Shapes, dtypes and aliasing of a `qkv_post` call (the trait method's
    /// arguments); its arguments by role, inputs first.
    #[allow(clippy::too_many_arguments)]
    pub fn check<'a, B: DeviceBuffer>(
        &self,
        raw: &'a B,
        wq: &'a B,
        wk: &'a B,
        pos: &'a B,
        q: &'a B,
        kc: &'a B,
        vc: &'a B,
    ) -> Result<Args<'a, B>> {
        const OP: &str = "qkv_post";
        nonzero(
            OP,
            &[
                ("m", self.m),
                ("heads", self.heads),
                ("kv_heads", self.kv_heads),
                ("head_dim", self.head_dim),
                ("capacity", self.capacity),
            ],
        )?;
        rope_dims(OP, self.head_dim, self.rot_pairs)?;
        fits_cache(OP, self.m, self.capacity)?;
        let (kv, hd) = (self.capacity * self.kv_heads * self.head_dim, self.head_dim);
        check_caches(OP, kc, vc, kv)?;
        let args = check_args(
            OP,
            &[
                ("raw", Some(raw), &F32, self.m * self.raw_row()),
                ("w_q", Some(wq), &FLOATS, hd),
                ("w_k", Some(wk), &FLOATS, hd),
                ("positions", Some(pos), &U32, self.m),
                ("q", Some(q), &F32, self.m * self.heads * hd),
            ],
            &[],
        )?;
        // q and the caches are outputs: none may alias an input or another.
        let ins = [raw, wq, wk, pos].map(Some);
        no_alias_all(OP, &[Some(q), Some(kc), Some(vc)], &ins)?;
        Ok(args.plain("k_cache", kc).plain("v_cache", vc))
    }
}

/// `qkv_post_attention`'s two ops must describe the same rows, heads and
/// caches: the attention reads what qkv_post wrote.
pub fn check_qkv_attention(qp: &QkvPost, ap: &Attention) -> Result<()> {
    let pairs = [
        ("m", qp.m, ap.m),
        ("heads", qp.heads, ap.heads),
        ("kv_heads", qp.kv_heads, ap.kv_heads),
        ("head_dim", qp.head_dim, ap.head_dim),
        ("capacity", qp.capacity, ap.capacity),
    ];
    for (name, a, b) in pairs {
        if a != b {
            return Err(Error::shape(
                "qkv_post_attention",
                format!("qkv_post has {name} {a}, attention {b}"),
            ));
        }
    }
    Ok(())
}

/// `qkv_post_attention_row`'s own arguments, beside the one-row op's: row
/// `row` of the m-row `raw` ([m, raw_row]) in, row `row` of `out` ([m,
/// heads * head_dim]) written, through the one-row scratch `row_raw` and
/// `row_out` (a backend that cannot address a row in place copies it
/// there). The one-row op is `qp` and `ap`, both of one row; `ins` its
/// other inputs (w_q, w_k, positions) and `outs` its other outputs (q and
/// the caches), none of which the rows' buffers may alias. The rows'
/// buffers by role.
pub fn check_qkv_attention_row<'a, B: DeviceBuffer>(
    row: usize,
    qp: &QkvPost,
    (raw, out): (&'a B, &'a B),
    (row_raw, row_out): (&'a B, &'a B),
    (ins, outs): ([&B; 3], [&B; 3]),
) -> Result<Args<'a, B>> {
    const OP: &str = "qkv_post_attention_row";
    if qp.m != 1 {
        return Err(Error::shape(
            OP,
            format!("the one-row op has m = {}, not 1", qp.m),
        ));
    }
    let (rr, hn) = (qp.raw_row(), qp.heads * qp.head_dim);
    let past = |n: usize| {
        row.checked_add(1)
            .and_then(|r| r.checked_mul(n))
            .ok_or_else(|| Error::shape(OP, format!("row {row} overflows")))
    };
    check_buf(OP, "raw", raw, &F32, past(rr)?)?;
    check_buf(OP, "out", out, &F32, past(hn)?)?;
    check_buf(OP, "row_raw", row_raw, &F32, rr)?;
    check_buf(OP, "row_out", row_out, &F32, hn)?;
    let [w_q, w_k, pos] = ins;
    let [q, kc, vc] = outs;
    no_alias_all(
        OP,
        &[q, kc, vc, out, row_raw, row_out].map(Some),
        &[raw, w_q, w_k, pos].map(Some),
    )?;
    Ok(Args::new(OP)
        .plain("raw", raw)
        .plain("row_raw", row_raw)
        .plain("row_out", row_out)
        .plain("out", out))
}

/// A layer's K and V caches: each one of [`CACHES`], both the same, each at
/// least `need` elements.
pub fn check_caches<B: DeviceBuffer>(op: &'static str, kc: &B, vc: &B, need: usize) -> Result<()> {
    check_buf(op, "k_cache", kc, &CACHES, need)?;
    check_buf(op, "v_cache", vc, &CACHES, need)?;
    if kc.dtype() != vc.dtype() {
        return Err(Error::shape(
            op,
            format!(
                "`k_cache` is {} but `v_cache` is {}: a layer's caches share one dtype",
                kc.dtype(),
                vc.dtype()
            ),
        ));
    }
    Ok(())
}

/// RoPE turns pairs (d, d + head_dim / 2): head_dim even, at most half of
/// it rotated.
fn rope_dims(op: &'static str, head_dim: usize, rot_pairs: usize) -> Result<()> {
    if head_dim % 2 != 0 || rot_pairs > head_dim / 2 {
        return Err(Error::shape(
            op,
            format!("head_dim {head_dim} must be even and rot_pairs {rot_pairs} <= head_dim/2"),
        ));
    }
    Ok(())
}

/// `m` new cache entries at once need `m` distinct slots.
fn fits_cache(op: &'static str, m: usize, capacity: usize) -> Result<()> {
    if m > capacity {
        return Err(Error::shape(
            op,
            format!("{m} new entries do not fit a cache of {capacity} slots"),
        ));
    }
    Ok(())
}

/// RoPE inverse frequencies `1 / theta^(2i / head_dim)` for the rotated pairs,
/// computed in f32 the way transformers does. Both backends use this one
/// table, so positions far into a long context turn by identical angles.
pub fn rope_inv_freq(theta: f32, head_dim: usize, rot_pairs: usize) -> Vec<f32> {
    (0..rot_pairs)
        .map(|i| 1.0 / theta.powf((2 * i) as f32 / head_dim as f32))
        .collect()
}
