//! The fused decoder steps' contracts: post_attention and post_ffn, and
//! the argument structs of the ops that fuse them with their neighbours.

use super::moe::{DownArgs, GateUpArgs, Router};
use super::norm::RmsNorm;
use super::roles::Args;
use super::{check_buf, no_alias, no_alias_all, nonzero, F32, FLOATS};
use crate::backend::ComputeBackend;
use crate::device_buffer::DeviceBuffer;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// The argument checks of a fused op: each present input has one of its
/// dtypes and at least its elements, each present output is f32 with at
/// least its elements, no output aliases an input or an earlier output.
/// Returns every present argument, inputs first, each
/// [`Role::Plain`](super::Role::Plain).
#[allow(clippy::type_complexity)]
pub(super) fn check_args<'a, B: DeviceBuffer>(
    op: &'static str,
    ins: &[(&'static str, Option<&'a B>, &[DType], usize)],
    outs: &[(&'static str, Option<&'a B>, usize)],
) -> Result<Args<'a, B>> {
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
    let in_bufs: Vec<Option<&B>> = ins.iter().map(|a| a.1).collect();
    let out_bufs: Vec<Option<&B>> = outs.iter().map(|a| a.1).collect();
    no_alias_all(op, &out_bufs, &in_bufs)?;
    let named = ins
        .iter()
        .map(|a| (a.0, a.1))
        .chain(outs.iter().map(|a| (a.0, a.1)));
    Ok(named.fold(Args::new(op), |args, (name, b)| args.maybe(name, b)))
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

impl PostAttention {
    /// The op's norms: rows of `dim`, its eps, no scale.
    pub fn norm(&self) -> RmsNorm {
        RmsNorm::unscaled(self.rows, self.dim, self.eps)
    }

    /// Shapes, dtypes and aliasing of a `post_attention` call (the trait
    /// method's arguments); its arguments by role, inputs first.
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
    ) -> Result<Args<'a, B>> {
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

impl PostFfn {
    /// The op's norms but the last: rows of `dim`, its eps, no scale.
    pub fn norm(&self) -> RmsNorm {
        RmsNorm::unscaled(self.rows, self.dim, self.eps)
    }

    /// Shapes, dtypes and aliasing of a `post_ffn` call (the trait method's
    /// arguments); its arguments by role, inputs first.
    #[allow(clippy::type_complexity)]
    pub fn check<'a, B: DeviceBuffer>(
        &self,
        dense: &'a B,
        w_dense: &'a B,
        moe: Option<(&'a B, &'a B, &'a B)>,
        r: &'a B,
        x: &'a B,
        next: Option<(&'a B, &'a B)>,
    ) -> Result<Args<'a, B>> {
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

/// The arguments of one [`ComputeBackend::post_ffn`], for
/// [`ComputeBackend::moe_down_pair_post_ffn`].
pub struct PostFfnArgs<'a, B> {
    pub dense: &'a B,
    pub w_dense: &'a B,
    /// `(moe_out, w_moe, w_sum)`: the experts branch.
    pub moe: Option<(&'a B, &'a B, &'a B)>,
    pub r: &'a B,
    pub x: &'a B,
    /// `(w_next, normed)`: the next layer's normed input.
    pub next: Option<(&'a B, &'a B)>,
    pub p: PostFfn,
}

impl<'a, B: DeviceBuffer> PostFfnArgs<'a, B> {
    /// This one call: `be.post_ffn(..)`.
    pub fn run<E: ComputeBackend<Buffer = B> + ?Sized>(&self, be: &E) -> Result<()> {
        be.post_ffn(self.reborrow())
    }

    /// This call's checks ([`PostFfn::check`]); its arguments by role.
    pub fn check(&self) -> Result<Args<'a, B>> {
        self.p.check(
            self.dense,
            self.w_dense,
            self.moe,
            self.r,
            self.x,
            self.next,
        )
    }

    /// The same arguments, borrowed again (the struct holds only shared
    /// references).
    pub fn reborrow(&self) -> PostFfnArgs<'_, B> {
        PostFfnArgs {
            dense: self.dense,
            w_dense: self.w_dense,
            moe: self.moe,
            r: self.r,
            x: self.x,
            next: self.next,
            p: self.p,
        }
    }

    /// The rule of [`ComputeBackend::moe_down_pair_post_ffn`]: this post_ffn
    /// reads the pair's outputs, `dense.out` as its dense branch and
    /// `routed.out` as its experts branch.
    pub fn check_reads(&self, dense: &DownArgs<'_, B>, routed: &DownArgs<'_, B>) -> Result<()> {
        let reads = self.dense.same_storage(dense.out)
            && self.moe.is_some_and(|m| m.0.same_storage(routed.out));
        if reads {
            Ok(())
        } else {
            Err(Error::shape(
                "moe_down_pair_post_ffn",
                "post_ffn must read the pair's outputs: `dense` = the dense problem's `out`, \
                 the experts branch = the routed problem's `out`",
            ))
        }
    }
}

/// The arguments of one [`ComputeBackend::post_attention`] with experts,
/// for [`ComputeBackend::post_attention_router`].
pub struct PostAttentionArgs<'a, B> {
    pub o: &'a B,
    pub x: &'a B,
    pub w_post: &'a B,
    pub w_ff: &'a B,
    pub r: &'a B,
    pub ff: &'a B,
    /// `(w_moe, out)`: the routed branch's pre-norm of r.
    pub moe: (&'a B, &'a B),
    pub p: PostAttention,
}

/// The arguments of one [`ComputeBackend::router`] but its input, for
/// [`ComputeBackend::post_attention_router`] (which routes the residual).
pub struct RouterArgs<'a, B> {
    pub eff_scale: &'a B,
    pub proj: &'a B,
    pub per_expert_scale: &'a B,
    pub ids: &'a B,
    pub weights: &'a B,
    pub p: Router,
}

impl<'a, B: DeviceBuffer> PostAttentionArgs<'a, B> {
    /// This one call: `be.post_attention(..)` with the experts branch.
    pub fn run<E: ComputeBackend<Buffer = B> + ?Sized>(&self, be: &E) -> Result<()> {
        let (o, x, w_post, w_ff, r, ff) = (self.o, self.x, self.w_post, self.w_ff, self.r, self.ff);
        be.post_attention(o, x, w_post, w_ff, r, ff, Some(self.moe), self.p)
    }

    /// This call's checks ([`PostAttention::check`]); its arguments by
    /// role.
    pub fn check(&self) -> Result<Args<'a, B>> {
        let (o, x, w_post, w_ff, r, ff) = (self.o, self.x, self.w_post, self.w_ff, self.r, self.ff);
        self.p.check(o, x, w_post, w_ff, r, ff, Some(self.moe))
    }
}

impl<'a, B: DeviceBuffer> RouterArgs<'a, B> {
    /// This router on input `x`: `be.router(x, ..)`.
    pub fn run_on<E: ComputeBackend<Buffer = B> + ?Sized>(&self, be: &E, x: &B) -> Result<()> {
        let (s, proj, pes) = (self.eff_scale, self.proj, self.per_expert_scale);
        be.router(x, s, proj, pes, self.ids, self.weights, self.p)
    }

    /// The router's checks on input `x` ([`Router::validate`]); its
    /// arguments by role.
    pub fn check_on(&self, x: &'a B) -> Result<Args<'a, B>> {
        let (s, proj, pes) = (self.eff_scale, self.proj, self.per_expert_scale);
        self.p.validate(x, s, proj, pes, self.ids, self.weights)
    }

    /// The checks of [`ComputeBackend::post_attention_router`]:
    /// post_attention's on `pa`, the router's outputs apart from its
    /// buffers, and the router's on the residual `pa.r`. Each op's
    /// arguments by role, post_attention's first.
    pub fn check_after(&self, pa: &PostAttentionArgs<'a, B>) -> Result<[Args<'a, B>; 2]> {
        let post = pa.check()?;
        self.check_apart_from(pa)?;
        Ok([post, self.check_on(pa.r)?])
    }

    /// That the router's outputs alias none of `pa`'s buffers (the fused
    /// op's own rule, on top of each op's checks).
    pub fn check_apart_from(&self, pa: &PostAttentionArgs<'_, B>) -> Result<()> {
        let pa_bufs = [
            pa.o, pa.x, pa.w_post, pa.w_ff, pa.r, pa.ff, pa.moe.0, pa.moe.1,
        ];
        for out in [self.ids, self.weights] {
            no_alias("post_attention_router", out, &pa_bufs.map(Some))?;
        }
        Ok(())
    }

    /// The rules of [`ComputeBackend::post_attention_gate_up_slots`]: the
    /// lookup reads this router's ids (`p.n` = tokens x top-k, `p.experts`
    /// the router's) into `routed.ids`, `routed` is the router's problem
    /// on the `p.slots`-expert slot stack, and the router's outputs, the
    /// slots and the log alias no other buffer of the pair (a GPU writes
    /// them in the pair's launch). The lookup's own checks are
    /// [`SlotLookup::validate`](super::SlotLookup::validate)'s.
    pub fn check_slot_routes(
        &self,
        dense: &GateUpArgs<'_, B>,
        routed: &GateUpArgs<'_, B>,
        lookup: &super::SlotArgs<'_, B>,
    ) -> Result<()> {
        const OP: &str = "post_attention_gate_up_slots";
        written_apart(
            OP,
            &[self.ids, self.weights, routed.ids, lookup.log],
            dense,
            routed,
        )?;
        no_alias(OP, routed.ids, &[Some(self.ids), Some(self.weights)])?;
        no_alias(OP, lookup.log, &[Some(self.ids), Some(self.weights)])?;
        let (r, p, l) = (self.p, routed.p, lookup.p);
        if (r.m, r.top_k) != (p.m, p.top_k) || l.n != r.m * r.top_k {
            return Err(Error::shape(
                OP,
                format!(
                    "router (m {}, top-{}), lookup of {} ids, gate_up (m {}, top-{}): one \
                     token's top-k each",
                    r.m, r.top_k, l.n, p.m, p.top_k
                ),
            ));
        }
        if (l.experts, l.slots) != (r.experts, p.experts) {
            return Err(Error::shape(
                OP,
                format!(
                    "the lookup maps {} experts to {} slots; the router ranks {} and the \
                     slot stack holds {}",
                    l.experts, l.slots, r.experts, p.experts
                ),
            ));
        }
        Ok(())
    }

    /// The rules of [`ComputeBackend::post_attention_gate_up`]: `routed`
    /// reads this router's ids, its problem is the router's (tokens,
    /// experts, top-k), and the router's outputs alias no other buffer of
    /// the pair (a GPU writes them in the pair's launch).
    pub fn check_routes(
        &self,
        dense: &GateUpArgs<'_, B>,
        routed: &GateUpArgs<'_, B>,
    ) -> Result<()> {
        const OP: &str = "post_attention_gate_up";
        written_apart(OP, &[self.ids, self.weights], dense, routed)?;
        if !routed.ids.same_storage(self.ids) {
            return Err(Error::shape(
                OP,
                "the routed gate_up must read the router's ids",
            ));
        }
        let (r, p) = (self.p, routed.p);
        if (r.m, r.experts, r.top_k) != (p.m, p.experts, p.top_k) {
            return Err(Error::shape(
                OP,
                format!(
                    "router (m {}, {} experts, top-{}) against gate_up (m {}, {} experts, top-{})",
                    r.m, r.experts, r.top_k, p.m, p.experts, p.top_k
                ),
            ));
        }
        Ok(())
    }
}

/// That the buffers a routed gate_up's launch writes besides the pair's
/// activations (`outs`: the routing, and streamed experts' slots and log)
/// alias none of the pair's other buffers.
fn written_apart<B: DeviceBuffer>(
    op: &'static str,
    outs: &[&B],
    dense: &GateUpArgs<'_, B>,
    routed: &GateUpArgs<'_, B>,
) -> Result<()> {
    let pair = [
        dense.x,
        dense.gate_up,
        dense.ids,
        dense.act,
        routed.x,
        routed.gate_up,
        routed.act,
    ];
    for &out in outs {
        no_alias(op, out, &pair.map(Some))?;
    }
    Ok(())
}
