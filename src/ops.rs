//! Parameters of every op, and the argument checks every backend shares.
//!
//! Each op's check (`validate*` for the primitive ops, `check` for the
//! fused ones) covers its shapes, dtypes and aliasing. The trait's op methods
//! ([`crate::ComputeBackend`]) run it before they reach the backend, so a
//! bad call fails identically everywhere with an error that names the
//! argument, and no backend repeats it.

use crate::device_buffer::DeviceBuffer;

/// `ComputeBackend::argmax` of a row with no candidate (every value NaN or
/// below [`ARGMAX_FLOOR`]): no token, which the decoder reports as
/// non-finite logits rather than emitting id 0.
pub const NO_ARGMAX: u32 = u32::MAX;

/// The smallest value argmax takes (kernels/argmax.wgsl's start value;
/// -inf and NaN are below it).
pub const ARGMAX_FLOOR: f32 = -3.402823e38;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::precision::Precision;

/// An op case, for [`crate::ComputeBackend::supports`].
#[derive(Clone, Debug, PartialEq)]
pub enum OpKind {
    RmsNorm,
    Matmul {
        w: DType,
    },
    Router {
        w: DType,
    },
    MoeGateUp {
        w: DType,
    },
    MoeDown {
        w: DType,
    },
    Rope,
    KvAppend,
    Attention {
        head_dim: u32,
    },
    Add,
    Scale,
    GeluMul,
    Softcap,
    Embed {
        w: DType,
    },
    Argmax,
    SlotLookup,
    PostAttention {
        dim: u32,
    },
    PostFfn {
        dim: u32,
    },
    QkvPost {
        head_dim: u32,
    },
    /// Expert slots of this weight format: [`crate::ComputeBackend::write_experts`]
    /// into a stack from [`crate::ComputeBackend::alloc_experts`].
    ExpertSlots {
        w: DType,
    },
    /// KV caches of this element type (one of [`CACHES`]), which every op
    /// that reads or writes the caches takes.
    KvCache {
        dtype: DType,
    },
    /// [`crate::ComputeBackend::copy_range`]: a copy command, not a kernel.
    CopyRange,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RmsNorm {
    pub rows: usize,
    pub dim: usize,
    pub eps: f32,
    /// Multiplies the result after the residual add (`layer_scalar`); 1.0 otherwise.
    pub scale: f32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Matmul {
    /// Rows of x (tokens).
    pub m: usize,
    /// Output features (rows of w).
    pub n: usize,
    /// Input features (columns of w).
    pub k: usize,
    /// How the product runs where the backend takes it to f16 matrix units
    /// ([`crate::ComputeBackend::gemm_rounding`]); ignored elsewhere.
    pub precision: Precision,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Router {
    pub m: usize,
    pub hidden: usize,
    pub experts: usize,
    pub top_k: usize,
    pub eps: f32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Moe {
    pub m: usize,
    pub hidden: usize,
    /// moe_intermediate_size.
    pub inter: usize,
    pub experts: usize,
    pub top_k: usize,
    /// As [`Matmul::precision`], for the experts' GEMMs.
    pub precision: Precision,
}

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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvAppend {
    pub m: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Slots per KV head in the cache.
    pub capacity: usize,
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
    /// As [`Matmul::precision`], for the scores' and the output's products.
    pub precision: Precision,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Embed {
    pub m: usize,
    pub hidden: usize,
    pub vocab: usize,
    /// sqrt(hidden), rounded to the table's dtype (Gemma convention).
    pub scale: f32,
}

/// The slot lookup of streamed experts ([`crate::ComputeBackend::slot_lookup`]):
/// `n` routed ids through a layer's slot table of `experts` entries into
/// slot ids of a `slots`-expert stack, each id logged at `log[at + i]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotLookup {
    pub n: usize,
    pub experts: usize,
    pub slots: usize,
    pub at: usize,
}

/// A slot table's entry for an expert that holds no slot.
pub const NO_SLOT: u32 = u32::MAX;

/// The bit [`crate::ComputeBackend::slot_lookup`] sets on a logged id
/// whose expert held no slot (ids are below [`MAX_EXPERTS`]).
pub const SLOT_MISSED: u32 = 1 << 31;

impl SlotLookup {
    /// Shapes, dtypes and aliasing of a `slot_lookup` call.
    pub fn validate<B: DeviceBuffer>(
        &self,
        ids: &B,
        table: &B,
        slot_ids: &B,
        log: &B,
    ) -> Result<()> {
        const OP: &str = "slot_lookup";
        nonzero(
            OP,
            &[
                ("n", self.n),
                ("experts", self.experts),
                ("slots", self.slots),
            ],
        )?;
        if self.slots > self.experts || self.experts > MAX_EXPERTS {
            return Err(Error::shape(
                OP,
                format!(
                    "{} slots of {} experts unsupported",
                    self.slots, self.experts
                ),
            ));
        }
        check_buf(OP, "ids", ids, &U32, self.n)?;
        check_buf(OP, "table", table, &U32, self.experts)?;
        check_buf(OP, "slot_ids", slot_ids, &U32, self.n)?;
        check_buf(OP, "log", log, &U32, self.at + self.n)?;
        no_alias(OP, slot_ids, &[Some(ids), Some(table)])?;
        no_alias(OP, log, &[Some(ids), Some(table), Some(slot_ids)])
    }
}

/// [`crate::ComputeBackend::slot_lookup`] on host slices: each id's slot,
/// or slot 0 (any held expert's weights: finite, and the pass that reads
/// them is discarded) where it has none, and the ids with
/// [`SLOT_MISSED`] set on those. The CPU reference, and the trait's
/// default body on read-back buffers.
pub fn slot_lookup(ids: &[u32], table: &[u32], slots: usize) -> (Vec<u32>, Vec<u32>) {
    ids.iter()
        .map(|&e| match table.get(e as usize) {
            Some(&s) if (s as usize) < slots => (s, e),
            _ => (0, e | SLOT_MISSED),
        })
        .unzip()
}

/// The attention block's residual and the feed-forward branches' pre-norms,
/// per row of `dim` (one fused op between o_proj and the MLP / experts):
/// `r = x + rmsnorm(o) * w_post`, `ff = rmsnorm(r) * w_ff` and, when asked,
/// `moe = rmsnorm(r) * w_moe`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PostAttention {
    pub rows: usize,
    pub dim: usize,
    pub eps: f32,
}

/// The end of a decoder layer, per row of `dim` (one fused op):
/// `h = rmsnorm(dense) * w_dense`; with experts,
/// `h = rmsnorm(h + rmsnorm(moe) * w_moe) * w_sum`; then
/// `x = (r + h) * scale` and, when asked, `normed = rmsnorm(x) * w_next`
/// (the next layer's input norm, or the final norm before the LM head).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PostFfn {
    pub rows: usize,
    pub dim: usize,
    pub eps: f32,
    /// `layer_scalar`.
    pub scale: f32,
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

/// The argument checks of a fused op: each present input has one of its
/// dtypes and at least its elements, each present output is f32 with at
/// least its elements, no output aliases an input or an earlier output.
/// Returns every argument, inputs first (absent ones as `None`).
#[allow(clippy::type_complexity)]
fn check_args<'a, B: DeviceBuffer>(
    op: &'static str,
    ins: &[(&str, Option<&'a B>, &[DType], usize)],
    outs: &[(&str, Option<&'a B>, usize)],
) -> Result<Vec<Option<&'a B>>> {
    for (name, b, dtypes, need) in ins {
        if let Some(b) = b {
            check_buf(op, name, *b, dtypes, *need)?;
        }
    }
    for (name, b, need) in outs {
        if let Some(b) = b {
            check_buf(op, name, *b, &F32, *need)?;
        }
    }
    let all: Vec<Option<&B>> = ins
        .iter()
        .map(|a| a.1)
        .chain(outs.iter().map(|a| a.1))
        .collect();
    let (ins, outs) = all.split_at(ins.len());
    no_alias_all(op, outs, ins)?;
    Ok(all)
}

/// No output aliases an input or an earlier output.
pub fn no_alias_all<B: DeviceBuffer>(
    op: &'static str,
    outs: &[Option<&B>],
    ins: &[Option<&B>],
) -> Result<()> {
    for (i, out) in outs.iter().enumerate() {
        if let Some(o) = out {
            if aliases(*o, ins.iter().chain(&outs[..i]).flatten().copied()) {
                return Err(aliased(op));
            }
        }
    }
    Ok(())
}

/// Whether `out` shares storage with any of `others`.
fn aliases<'x, B: DeviceBuffer + 'x>(out: &B, mut others: impl Iterator<Item = &'x B>) -> bool {
    others.any(|b| b.same_storage(out))
}

fn aliased(op: &'static str) -> Error {
    Error::shape(op, "output buffer aliases an input")
}

impl PostAttention {
    /// The op's norms: rows of `dim`, its eps, no scale.
    pub fn norm(&self) -> RmsNorm {
        RmsNorm::unscaled(self.rows, self.dim, self.eps)
    }

    /// Shapes, dtypes and aliasing of a `post_attention` call (the trait
    /// method's arguments); returns every buffer argument, inputs first.
    #[allow(clippy::too_many_arguments)]
    pub fn check<'a, B: DeviceBuffer>(
        &self,
        o: &'a B,
        x: &'a B,
        w_post: &'a B,
        w_ff: &'a B,
        r: &'a B,
        ff: &'a B,
        moe: Option<(&'a B, &'a B)>,
    ) -> Result<Vec<Option<&'a B>>> {
        const OP: &str = "post_attention";
        nonzero(OP, &[("rows", self.rows), ("dim", self.dim)])?;
        let n = self.rows * self.dim;
        let (w_moe, moe_out) = (moe.map(|m| m.0), moe.map(|m| m.1));
        let d = self.dim;
        check_args(
            OP,
            &[
                ("o", Some(o), &F32, n),
                ("x", Some(x), &F32, n),
                ("w_post", Some(w_post), &FLOATS, d),
                ("w_ff", Some(w_ff), &FLOATS, d),
                ("w_moe", w_moe, &FLOATS, d),
            ],
            &[("r", Some(r), n), ("ff", Some(ff), n), ("moe", moe_out, n)],
        )
    }
}

impl PostFfn {
    /// The op's norms but the last: rows of `dim`, its eps, no scale.
    pub fn norm(&self) -> RmsNorm {
        RmsNorm::unscaled(self.rows, self.dim, self.eps)
    }

    /// Shapes, dtypes and aliasing of a `post_ffn` call (the trait method's
    /// arguments); returns every buffer argument, inputs first.
    #[allow(clippy::type_complexity)]
    pub fn check<'a, B: DeviceBuffer>(
        &self,
        dense: &'a B,
        w_dense: &'a B,
        moe: Option<(&'a B, &'a B, &'a B)>,
        r: &'a B,
        x: &'a B,
        next: Option<(&'a B, &'a B)>,
    ) -> Result<Vec<Option<&'a B>>> {
        const OP: &str = "post_ffn";
        nonzero(OP, &[("rows", self.rows), ("dim", self.dim)])?;
        let n = self.rows * self.dim;
        let (m_act, w_moe, w_sum) = (moe.map(|m| m.0), moe.map(|m| m.1), moe.map(|m| m.2));
        let (w_next, normed) = (next.map(|n| n.0), next.map(|n| n.1));
        let d = self.dim;
        check_args(
            OP,
            &[
                ("dense", Some(dense), &F32, n),
                ("moe", m_act, &F32, n),
                ("r", Some(r), &F32, n),
                ("w_dense", Some(w_dense), &FLOATS, d),
                ("w_moe", w_moe, &FLOATS, d),
                ("w_sum", w_sum, &FLOATS, d),
                ("w_next", w_next, &FLOATS, d),
            ],
            &[("x", Some(x), n), ("normed", normed, n)],
        )
    }
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
    /// arguments); returns every buffer argument, inputs first.
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
    ) -> Result<Vec<Option<&'a B>>> {
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
        let mut all = check_args(
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
        let q = all.pop().flatten();
        let outs = [q, Some(kc), Some(vc)];
        no_alias_all(OP, &outs, &all)?;
        all.extend(outs);
        Ok(all)
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

/// Checks one buffer argument: dtype in `dtypes`, at least `need` elements.
pub fn check_buf<B: DeviceBuffer>(
    op: &'static str,
    name: &str,
    b: &B,
    dtypes: &[DType],
    need: usize,
) -> Result<()> {
    if !dtypes.contains(&b.dtype()) {
        return Err(Error::shape(
            op,
            format!(
                "`{name}` has dtype {}, expected one of {:?}",
                b.dtype(),
                dtypes
            ),
        ));
    }
    if b.len() < need {
        return Err(Error::shape(
            op,
            format!("`{name}` holds {} elements, needs {need}", b.len()),
        ));
    }
    Ok(())
}

/// A range of elements `start..start + len` read from `b` (an f32 or f16
/// buffer, [`CACHES`]): inside it, with nothing past its end.
pub fn check_range<B: DeviceBuffer>(
    op: &'static str,
    b: &B,
    start: usize,
    len: usize,
) -> Result<()> {
    check_buf(op, "buf", b, &CACHES, 0)?;
    match start.checked_add(len) {
        Some(end) if end <= b.len() => Ok(()),
        _ => Err(Error::shape(
            op,
            format!(
                "elements {start}..{start}+{len} are past the buffer's {}",
                b.len()
            ),
        )),
    }
}

/// [`crate::ComputeBackend::copy_buffer`]'s arguments: one dtype of
/// [`CACHES`] or u32 (activations, caches and ids; weights are never
/// copied), one length, two storages.
pub fn check_copy<B: DeviceBuffer>(src: &B, dst: &B) -> Result<()> {
    const COPIED: [DType; 3] = [DType::F32, DType::F16, DType::U32];
    check_buf("copy_buffer", "src", src, &COPIED, 0)?;
    if (dst.dtype(), dst.len()) != (src.dtype(), src.len()) {
        return Err(Error::shape(
            "copy_buffer",
            format!(
                "`dst` is {} x {}, `src` {} x {}: a copy needs one dtype and length",
                dst.dtype(),
                dst.len(),
                src.dtype(),
                src.len()
            ),
        ));
    }
    no_alias("copy_buffer", dst, &[Some(src)])
}

/// [`crate::ComputeBackend::copy_range`]'s parameters: `len` elements of
/// `src` from element `src_offset` into `dst` from element `dst_offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyRange {
    pub src_offset: usize,
    pub dst_offset: usize,
    pub len: usize,
}

impl CopyRange {
    /// One dtype, f32 or u32 on both sides (four-byte elements: every
    /// offset a GPU copy command may take), both ranges inside their
    /// buffers, two storages.
    pub fn validate<B: DeviceBuffer>(&self, src: &B, dst: &B) -> Result<()> {
        const COPIED: [DType; 2] = [DType::F32, DType::U32];
        let end = |offset: usize, name: &str| {
            offset.checked_add(self.len).ok_or_else(|| {
                Error::shape(
                    "copy_range",
                    format!("`{name}` offset {offset} + {} overflows", self.len),
                )
            })
        };
        check_buf(
            "copy_range",
            "src",
            src,
            &COPIED,
            end(self.src_offset, "src")?,
        )?;
        check_buf(
            "copy_range",
            "dst",
            dst,
            &COPIED,
            end(self.dst_offset, "dst")?,
        )?;
        if dst.dtype() != src.dtype() {
            return Err(Error::shape(
                "copy_range",
                format!(
                    "`dst` is {}, `src` {}: a copy needs one dtype",
                    dst.dtype(),
                    src.dtype()
                ),
            ));
        }
        no_alias("copy_range", dst, &[Some(src)])
    }
}

/// Checks a weight argument: a float dtype, plain or quantized, and
/// exactly `need` elements.
pub fn check_weight<B: DeviceBuffer>(
    op: &'static str,
    name: &str,
    b: &B,
    need: usize,
) -> Result<()> {
    if !b.dtype().is_quantized() {
        check_buf(op, name, b, &FLOATS, need)?;
    }
    if b.len() != need {
        return Err(Error::shape(
            op,
            format!(
                "weight `{name}` holds {} elements, expected exactly {need}",
                b.len()
            ),
        ));
    }
    Ok(())
}

/// The pair ops' extra rule: neither problem's output aliases the other
/// problem's buffers (a GPU runs the two at once). `a` and `b` list each
/// problem's inputs then its output last.
pub fn pair_apart<B: DeviceBuffer>(op: &'static str, a: &[&B], b: &[&B]) -> Result<()> {
    let (Some(oa), Some(ob)) = (a.last(), b.last()) else {
        return Ok(());
    };
    if aliases(*oa, b.iter().copied()) || aliases(*ob, a.iter().copied()) {
        return Err(aliased(op));
    }
    Ok(())
}

/// Outputs must not alias inputs: a GPU cannot bind one buffer read-only
/// and read-write in one dispatch, so no backend accepts it.
pub fn no_alias<B: DeviceBuffer>(op: &'static str, out: &B, inputs: &[Option<&B>]) -> Result<()> {
    if aliases(out, inputs.iter().flatten().copied()) {
        return Err(aliased(op));
    }
    Ok(())
}

pub const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];
pub const F32: [DType; 1] = [DType::F32];
pub const U32: [DType; 1] = [DType::U32];
/// The KV caches' element types: f32 (the default) or f16, which halves
/// the caches' memory and what attention reads (`ModelOptions::kv_cache`).
pub const CACHES: [DType; 2] = [DType::F32, DType::F16];

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

pub fn nonzero(op: &'static str, what: &[(&str, usize)]) -> Result<()> {
    for (name, v) in what {
        if *v == 0 {
            return Err(Error::shape(op, format!("`{name}` must be positive")));
        }
    }
    Ok(())
}

impl RmsNorm {
    /// Rows of `dim` with `eps` and no scale: the norms the fused ops are
    /// made of.
    pub fn unscaled(rows: usize, dim: usize, eps: f32) -> RmsNorm {
        RmsNorm {
            rows,
            dim,
            eps,
            scale: 1.0,
        }
    }

    /// Shapes, dtypes and aliasing of an `rms_norm` call.
    pub fn validate<B: DeviceBuffer>(
        &self,
        x: &B,
        w: Option<&B>,
        res: Option<&B>,
        out: &B,
    ) -> Result<()> {
        const OP: &str = "rms_norm";
        nonzero(OP, &[("rows", self.rows), ("dim", self.dim)])?;
        let n = self.rows * self.dim;
        check_buf(OP, "x", x, &F32, n)?;
        if let Some(w) = w {
            check_buf(OP, "weight", w, &FLOATS, self.dim)?;
        }
        if let Some(r) = res {
            check_buf(OP, "residual", r, &F32, n)?;
        }
        check_buf(OP, "out", out, &F32, n)?;
        no_alias(OP, out, &[Some(x), w, res])
    }
}

impl Matmul {
    /// Shapes, dtypes and aliasing of a `matmul` call.
    pub fn validate<B: DeviceBuffer>(&self, w: &B, x: &B, out: &B) -> Result<()> {
        const OP: &str = "matmul";
        nonzero(OP, &[("m", self.m), ("n", self.n), ("k", self.k)])?;
        check_weight(OP, "w", w, self.n * self.k)?;
        check_buf(OP, "x", x, &F32, self.m * self.k)?;
        check_buf(OP, "out", out, &F32, self.m * self.n)?;
        no_alias(OP, out, &[Some(w), Some(x)])
    }
}

impl Router {
    /// Shapes, dtypes and aliasing of a `router` call.
    pub fn validate<B: DeviceBuffer>(
        &self,
        x: &B,
        scale: &B,
        proj: &B,
        pes: &B,
        ids: &B,
        weights: &B,
    ) -> Result<()> {
        const OP: &str = "router";
        nonzero(
            OP,
            &[
                ("m", self.m),
                ("hidden", self.hidden),
                ("experts", self.experts),
                ("top_k", self.top_k),
            ],
        )?;
        if self.top_k > self.experts || self.top_k > MAX_TOP_K || self.experts > MAX_EXPERTS {
            return Err(Error::shape(
                OP,
                format!(
                    "top_k {} of {} experts is outside the supported range (k <= {MAX_TOP_K}, E <= {MAX_EXPERTS}, k <= E)",
                    self.top_k, self.experts
                ),
            ));
        }
        check_buf(OP, "x", x, &F32, self.m * self.hidden)?;
        check_buf(OP, "eff_scale", scale, &F32, self.hidden)?;
        check_weight(OP, "proj", proj, self.experts * self.hidden)?;
        check_buf(OP, "per_expert_scale", pes, &F32, self.experts)?;
        check_buf(OP, "ids", ids, &U32, self.m * self.top_k)?;
        check_buf(OP, "weights", weights, &F32, self.m * self.top_k)?;
        no_alias(
            OP,
            ids,
            &[Some(x), Some(scale), Some(proj), Some(pes), Some(weights)],
        )?;
        no_alias(OP, weights, &[Some(x), Some(scale), Some(proj), Some(pes)])
    }
}

/// Largest expert count and top-k the router kernels handle.
pub const MAX_EXPERTS: usize = 256;
pub const MAX_TOP_K: usize = 8;

impl Moe {
    fn check_common(&self) -> Result<()> {
        const OP: &str = "moe";
        nonzero(
            OP,
            &[
                ("m", self.m),
                ("hidden", self.hidden),
                ("inter", self.inter),
                ("experts", self.experts),
                ("top_k", self.top_k),
            ],
        )?;
        if self.top_k > self.experts || self.top_k > MAX_TOP_K || self.experts > MAX_EXPERTS {
            return Err(Error::shape(
                OP,
                format!(
                    "top_k {} of {} experts unsupported",
                    self.top_k, self.experts
                ),
            ));
        }
        Ok(())
    }

    /// Shapes, dtypes and aliasing of a `moe_gate_up` call.
    pub fn validate_gate_up<B: DeviceBuffer>(
        &self,
        x: &B,
        gate_up: &B,
        ids: &B,
        act: &B,
    ) -> Result<()> {
        const OP: &str = "moe_gate_up";
        self.check_common()?;
        check_buf(OP, "x", x, &F32, self.m * self.hidden)?;
        check_weight(
            OP,
            "gate_up",
            gate_up,
            self.experts * 2 * self.inter * self.hidden,
        )?;
        check_buf(OP, "ids", ids, &U32, self.m * self.top_k)?;
        check_buf(OP, "act", act, &F32, self.m * self.top_k * self.inter)?;
        no_alias(OP, act, &[Some(x), Some(gate_up), Some(ids)])
    }

    /// Shapes, dtypes and aliasing of a `moe_down` call.
    pub fn validate_down<B: DeviceBuffer>(
        &self,
        act: &B,
        down: &B,
        ids: &B,
        weights: &B,
        out: &B,
    ) -> Result<()> {
        const OP: &str = "moe_down";
        self.check_common()?;
        check_buf(OP, "act", act, &F32, self.m * self.top_k * self.inter)?;
        check_weight(OP, "down", down, self.experts * self.hidden * self.inter)?;
        check_buf(OP, "ids", ids, &U32, self.m * self.top_k)?;
        check_buf(OP, "weights", weights, &F32, self.m * self.top_k)?;
        check_buf(OP, "out", out, &F32, self.m * self.hidden)?;
        no_alias(OP, out, &[Some(act), Some(down), Some(ids), Some(weights)])
    }
}

impl Rope {
    /// Shapes, dtypes and aliasing of a `rope` call (in place on `x`).
    pub fn validate<B: DeviceBuffer>(&self, x: &B, pos: &B) -> Result<()> {
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
        no_alias(OP, x, &[Some(pos)])
    }
}

impl KvAppend {
    /// Shapes, dtypes and aliasing of a `kv_append` call.
    pub fn validate<B: DeviceBuffer>(&self, k: &B, v: &B, kc: &B, vc: &B, pos: &B) -> Result<()> {
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
        no_alias(OP, vc, &[Some(k), Some(v), Some(pos)])
    }
}

/// Largest head_dim the attention kernels take.
pub const MAX_HEAD_DIM: usize = 512;

impl Attention {
    /// Shapes, dtypes and aliasing of an `attention` call.
    pub fn validate<B: DeviceBuffer>(&self, q: &B, kc: &B, vc: &B, pos: &B, out: &B) -> Result<()> {
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
        no_alias(OP, out, &[Some(q), Some(kc), Some(vc), Some(pos)])
    }
}

impl Embed {
    /// Shapes, dtypes and aliasing of an `embed` call.
    pub fn validate<B: DeviceBuffer>(&self, ids: &B, table: &B, out: &B) -> Result<()> {
        const OP: &str = "embed";
        nonzero(
            OP,
            &[
                ("m", self.m),
                ("hidden", self.hidden),
                ("vocab", self.vocab),
            ],
        )?;
        check_buf(OP, "ids", ids, &U32, self.m)?;
        check_weight(OP, "table", table, self.vocab * self.hidden)?;
        check_buf(OP, "out", out, &F32, self.m * self.hidden)?;
        no_alias(OP, out, &[Some(ids), Some(table)])
    }
}

/// Shapes, dtypes and aliasing of `op` (`add`) on `n` elements.
pub fn validate_binary<B: DeviceBuffer>(
    op: &'static str,
    a: &B,
    b: &B,
    out: &B,
    n: usize,
) -> Result<()> {
    nonzero(op, &[("n", n)])?;
    check_buf(op, "a", a, &F32, n)?;
    check_buf(op, "b", b, &F32, n)?;
    check_buf(op, "out", out, &F32, n)?;
    no_alias(op, out, &[Some(a), Some(b)])
}

/// Shapes, dtypes and aliasing of `op` (`scale`, `softcap`) on `n` elements.
pub fn validate_unary<B: DeviceBuffer>(op: &'static str, x: &B, out: &B, n: usize) -> Result<()> {
    nonzero(op, &[("n", n)])?;
    check_buf(op, "x", x, &F32, n)?;
    check_buf(op, "out", out, &F32, n)?;
    no_alias(op, out, &[Some(x)])
}

/// Shapes, dtypes and aliasing of a `gelu_mul` call.
pub fn validate_gelu_mul<B: DeviceBuffer>(x: &B, out: &B, rows: usize, n: usize) -> Result<()> {
    const OP: &str = "gelu_mul";
    nonzero(OP, &[("rows", rows), ("n", n)])?;
    check_buf(OP, "x", x, &F32, rows * 2 * n)?;
    check_buf(OP, "out", out, &F32, rows * n)?;
    no_alias(OP, out, &[Some(x)])
}

/// Shapes, dtypes and aliasing of an `argmax` call.
pub fn validate_argmax<B: DeviceBuffer>(x: &B, out: &B, rows: usize, n: usize) -> Result<()> {
    const OP: &str = "argmax";
    nonzero(OP, &[("rows", rows), ("n", n)])?;
    check_buf(OP, "x", x, &F32, rows * n)?;
    check_buf(OP, "out", out, &U32, rows)?;
    no_alias(OP, out, &[Some(x)])
}

/// gelu with the tanh approximation (`gelu_pytorch_tanh`), in f32.
#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)).tanh())
}

/// RoPE inverse frequencies `1 / theta^(2i / head_dim)` for the rotated pairs,
/// computed in f32 the way transformers does. Both backends use this one
/// table, so positions far into a long context turn by identical angles.
pub fn rope_inv_freq(theta: f32, head_dim: usize, rot_pairs: usize) -> Vec<f32> {
    (0..rot_pairs)
        .map(|i| 1.0 / theta.powf((2 * i) as f32 / head_dim as f32))
        .collect()
}
