//! The fused step after o_proj: post_attention's norms and residual, alone,
//! with the router on its residual, and with both branches' gate_up after
//! that.

use super::inputs::norm_weight;
use super::moe::MoeGateUp;
use super::router::Router;
use super::{weight_bytes, Case};
use crate::backend::ComputeBackend;
use crate::ops::{self, GateUpArgs, Moe, OpKind, PostAttentionArgs, RouterArgs};
use crate::parity::{compare, HostTensor, OutSpec, Verdict};
use crate::rng::Rng;
use crate::{DType, Result};

/// `post_attention`: norm weights all of dtype `w`; `moe`: the third
/// pre-norm output too.
#[derive(Clone, Copy, Debug)]
pub struct PostAttention {
    pub p: ops::PostAttention,
    pub moe: bool,
    pub w: DType,
}

/// `post_attention_router`: post_attention with experts (norm weights of
/// dtype `w`), then the router on its residual (weight of dtype `pw`).
#[derive(Clone, Copy, Debug)]
pub struct PostAttentionRouter {
    pub p: ops::PostAttention,
    pub r: ops::Router,
    pub w: DType,
    pub pw: DType,
}

/// `post_attention_gate_up`: `PostAttentionRouter`'s case, then the
/// dense MLP (`inter`) and the routed experts (`moe_inter`) gate_up on
/// its outputs (weights of dtype `gw`).
#[derive(Clone, Copy, Debug)]
pub struct PostAttentionGateUp {
    pub p: ops::PostAttention,
    pub r: ops::Router,
    pub inter: usize,
    pub moe_inter: usize,
    pub w: DType,
    pub pw: DType,
    pub gw: DType,
}

impl Case for PostAttention {
    fn op_name(&self) -> &'static str {
        "post_attention"
    }

    fn name(&self) -> String {
        let (p, moe, w) = (&self.p, self.moe, self.w);
        format!(
            "{}(rows={},dim={},moe={moe},w={w})",
            self.family(),
            p.rows,
            p.dim
        )
    }

    fn kind(&self) -> OpKind {
        OpKind::PostAttention {
            dim: self.p.dim as u32,
        }
    }

    /// Chains of 2-4 RMSNorms over the same row.
    fn limit(&self) -> f64 {
        1e-11
    }

    fn inputs(&self, rng: &mut Rng) -> Vec<HostTensor> {
        let (p, w) = (&self.p, self.w);
        let n = p.rows * p.dim;
        let mut v = vec![
            HostTensor::F32(rng.vec_normal(n, 2.0)),
            HostTensor::F32(rng.vec_normal(n, 1.0)),
            norm_weight(rng, w, p.dim),
            norm_weight(rng, w, p.dim),
        ];
        if self.moe {
            v.push(norm_weight(rng, w, p.dim));
        }
        v
    }

    fn outputs(&self) -> Vec<OutSpec> {
        let n = self.p.rows * self.p.dim;
        let mut v = vec![OutSpec::F32(n), OutSpec::F32(n)];
        if self.moe {
            v.push(OutSpec::F32(n));
        }
        v
    }

    fn record<B: ComputeBackend>(&self, b: &B, i: &[B::Buffer], o: &[B::Buffer]) -> Result<()> {
        let m = self.moe.then(|| (&i[4], &o[2]));
        b.post_attention(&i[0], &i[1], &i[2], &i[3], &o[0], &o[1], m, self.p)
    }
}

impl PostAttentionRouter {
    /// Its post_attention (with experts) and its router, as their own
    /// families' cases.
    pub fn parts(&self) -> (PostAttention, Router) {
        (
            PostAttention {
                p: self.p,
                moe: true,
                w: self.w,
            },
            Router {
                p: self.r,
                w: self.pw,
            },
        )
    }
}

impl Case for PostAttentionRouter {
    fn op_name(&self) -> &'static str {
        "post_attention_router"
    }

    fn family(&self) -> &'static str {
        if self.pw.is_quantized() {
            "post_attention_router_quantized"
        } else {
            "post_attention_router"
        }
    }

    fn name(&self) -> String {
        let (p, r, w, pw) = (&self.p, &self.r, self.w, self.pw);
        format!(
            "{}(rows={},dim={},e={},k={},w={w},pw={pw})",
            self.family(),
            p.rows,
            p.dim,
            r.experts,
            r.top_k
        )
    }

    fn kind(&self) -> OpKind {
        OpKind::PostAttention {
            dim: self.p.dim as u32,
        }
    }

    /// Dot products of thousands of terms, reordered.
    fn limit(&self) -> f64 {
        1e-9
    }

    fn inputs(&self, rng: &mut Rng) -> Vec<HostTensor> {
        // post_attention's inputs with experts, then the router's
        // scale, weight and per-expert scale, as each family draws
        // them.
        let (pa, router) = self.parts();
        let mut v = pa.inputs(rng);
        v.extend(router.inputs(rng).into_iter().skip(1));
        v
    }

    fn outputs(&self) -> Vec<OutSpec> {
        let n = self.p.rows * self.p.dim;
        let k = self.r.m * self.r.top_k;
        vec![
            OutSpec::F32(n),
            OutSpec::F32(n),
            OutSpec::F32(n),
            OutSpec::U32(k),
            OutSpec::F32(k),
        ]
    }

    fn record<B: ComputeBackend>(&self, b: &B, i: &[B::Buffer], o: &[B::Buffer]) -> Result<()> {
        let (pa, router) = post_attention_router_args(i, o, self.p, self.r);
        b.post_attention_router(pa, router)
    }

    fn judge(
        &self,
        limit: f64,
        inputs: &[HostTensor],
        r: &[HostTensor],
        d: &[HostTensor],
    ) -> Verdict {
        judge_post_attention_router(self, limit, inputs, r, d)
    }
}

impl PostAttentionGateUp {
    /// Its first part: its `PostAttentionRouter` case (whose inputs and
    /// outputs lead its own).
    pub fn router_part(&self) -> PostAttentionRouter {
        PostAttentionRouter {
            p: self.p,
            r: self.r,
            w: self.w,
            pw: self.pw,
        }
    }

    /// Its two gate_up problems: the dense MLP (one expert) and the routed
    /// experts.
    pub fn gate_up_problems(&self) -> (Moe, Moe) {
        let (p, r) = (&self.p, &self.r);
        let moe = |inter, experts, top_k| Moe {
            m: p.rows,
            hidden: p.dim,
            inter,
            experts,
            top_k,
            precision: crate::Precision::Exact,
        };
        (
            moe(self.inter, 1, 1),
            moe(self.moe_inter, r.experts, r.top_k),
        )
    }
}

impl Case for PostAttentionGateUp {
    fn op_name(&self) -> &'static str {
        "post_attention_gate_up"
    }

    fn family(&self) -> &'static str {
        if self.pw.is_quantized() || self.gw.is_quantized() {
            "post_attention_gate_up_quantized"
        } else {
            "post_attention_gate_up"
        }
    }

    fn name(&self) -> String {
        let (p, r, inter, moe_inter) = (&self.p, &self.r, self.inter, self.moe_inter);
        let (w, pw, gw) = (self.w, self.pw, self.gw);
        format!(
            "{}(rows={},dim={},e={},k={},inter={inter},moe_inter={moe_inter},w={w},pw={pw},gw={gw})",
            self.family(),
            p.rows,
            p.dim,
            r.experts,
            r.top_k
        )
    }

    fn kind(&self) -> OpKind {
        OpKind::PostAttention {
            dim: self.p.dim as u32,
        }
    }

    /// Dot products of thousands of terms, reordered.
    fn limit(&self) -> f64 {
        1e-9
    }

    fn inputs(&self, rng: &mut Rng) -> Vec<HostTensor> {
        let mut v = self.router_part().inputs(rng);
        // Each gate_up's weight as moe_gate_up's family draws it,
        // and the dense one's ids (expert 0 for every token); the
        // routed one reads the router's.
        let (dense, routed) = self.gate_up_problems();
        let draw = |p, rng: &mut Rng| MoeGateUp { p, w: self.gw }.inputs(rng);
        v.extend(draw(dense, rng).into_iter().skip(1));
        v.push(draw(routed, rng).swap_remove(1));
        v
    }

    fn outputs(&self) -> Vec<OutSpec> {
        let (dense, routed) = self.gate_up_problems();
        let mut v = self.router_part().outputs();
        v.extend([
            OutSpec::F32(dense.m * dense.inter),
            OutSpec::F32(routed.m * routed.top_k * routed.inter),
        ]);
        v
    }

    fn record<B: ComputeBackend>(&self, b: &B, i: &[B::Buffer], o: &[B::Buffer]) -> Result<()> {
        let (dense, routed) = self.gate_up_problems();
        b.post_attention_gate_up(
            post_attention_router_args(i, o, self.p, self.r),
            GateUpArgs {
                x: &o[1],
                gate_up: &i[8],
                ids: &i[9],
                act: &o[5],
                p: dense,
            },
            GateUpArgs {
                x: &o[2],
                gate_up: &i[10],
                ids: &o[3],
                act: &o[6],
                p: routed,
            },
        )
    }

    fn judge(
        &self,
        limit: f64,
        inputs: &[HostTensor],
        r: &[HostTensor],
        d: &[HostTensor],
    ) -> Verdict {
        judge_post_attention_gate_up(self, limit, inputs, r, d)
    }

    /// Every input once and each output once, but of the routed experts'
    /// stack (the last input) only the top-k a token picks (the routing is
    /// computed in the call: counted as distinct).
    fn bytes(&self, inputs: &[HostTensor]) -> u64 {
        let (_, routed) = self.gate_up_problems();
        let outs: u64 = self.outputs().iter().map(OutSpec::bytes).sum();
        let (stack, rest) = inputs.split_last().map_or((0, 0), |(last, rest)| {
            (last.bytes(), rest.iter().map(HostTensor::bytes).sum())
        });
        let picked = (routed.m * routed.top_k).min(routed.experts) as u64
            * weight_bytes(self.gw, 2 * (routed.inter * routed.hidden) as u64);
        rest + stack.min(picked) + outs
    }
}

/// `PostAttentionRouter`'s arguments (and the first of
/// `PostAttentionGateUp`'s) from a case's inputs `i` and outputs `o`.
pub(super) fn post_attention_router_args<'a, B>(
    i: &'a [B],
    o: &'a [B],
    p: ops::PostAttention,
    r: ops::Router,
) -> (PostAttentionArgs<'a, B>, RouterArgs<'a, B>) {
    (
        PostAttentionArgs {
            o: &i[0],
            x: &i[1],
            w_post: &i[2],
            w_ff: &i[3],
            r: &o[0],
            ff: &o[1],
            moe: (&i[4], &o[2]),
            p,
        },
        RouterArgs {
            eff_scale: &i[5],
            proj: &i[6],
            per_expert_scale: &i[7],
            ids: &o[3],
            weights: &o[4],
            p: r,
        },
    )
}

/// post_attention's three rows at its own family's limit, then the router
/// as its family judges it, on the reference's residual (ties allowed),
/// its weights at `limit`.
fn judge_post_attention_router(
    c: &PostAttentionRouter,
    limit: f64,
    inputs: &[HostTensor],
    r: &[HostTensor],
    d: &[HostTensor],
) -> Verdict {
    let (pa, router) = c.parts();
    let pa_limit = pa.limit();
    let n = c.p.rows * c.p.dim;
    let mut worst = 0f64;
    for j in 0..3 {
        let e = compare::nmse(&compare::f32s(&r[j])[..n], &compare::f32s(&d[j])[..n]);
        worst = worst.max(compare::at_most(&format!("output {j}"), e, pa_limit)?);
    }
    let mut router_inputs = vec![HostTensor::F32(compare::f32s(&r[0])[..n].to_vec())];
    router_inputs.extend(inputs[5..8].iter().cloned());
    let e = compare::judge_router(&router.p, &router_inputs, &r[3..5], &d[3..5])?;
    Ok(worst.max(compare::at_most("router weights", e, limit)?))
}

/// `PostAttentionRouter`'s verdict on the first five outputs, then the
/// dense activations at `limit`, and each routed activation row against the
/// reference's row for the same expert (a tie at the k-th place, which the
/// router's verdict allows, leaves a row with no counterpart: skipped).
pub(super) fn judge_post_attention_gate_up(
    c: &PostAttentionGateUp,
    limit: f64,
    inputs: &[HostTensor],
    r: &[HostTensor],
    d: &[HostTensor],
) -> Verdict {
    let (dense, routed) = c.gate_up_problems();
    let par = c.router_part();
    let mut worst = judge_post_attention_router(&par, limit, &inputs[..8], &r[..5], &d[..5])?;
    let n = dense.m * dense.inter;
    let e = compare::nmse(&compare::f32s(&r[5])[..n], &compare::f32s(&d[5])[..n]);
    worst = worst.max(compare::at_most("dense activations", e, limit)?);
    let (ri, di) = (compare::u32s(&r[3]), compare::u32s(&d[3]));
    let (ra, da) = (compare::f32s(&r[6]), compare::f32s(&d[6]));
    let (k, inter) = (routed.top_k, routed.inter);
    let (mut want, mut got) = (Vec::new(), Vec::new());
    for t in 0..routed.m {
        for j in 0..k {
            let slot = t * k + j;
            let Some(rj) = (0..k).position(|q| ri[t * k + q] == di[slot]) else {
                continue;
            };
            let rs = t * k + rj;
            want.extend_from_slice(&ra[rs * inter..(rs + 1) * inter]);
            got.extend_from_slice(&da[slot * inter..(slot + 1) * inter]);
        }
    }
    // (the router's verdict allows ties at the k-th place only, so rows
    // are left to compare: none would be a comparison of nothing)
    if want.is_empty() {
        return Err((f64::INFINITY, "no routed activation row to compare".into()));
    }
    let e = compare::nmse(&want, &got);
    Ok(worst.max(compare::at_most("routed activations", e, limit)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::{PostAttention, Router as RouterP};

    /// The gate_up verdict matches routed rows by expert, not by slot, and
    /// fails on a wrong activation.
    #[test]
    fn gate_up_verdict_matches_routed_rows_by_expert() {
        let op = PostAttentionGateUp {
            p: PostAttention {
                rows: 1,
                dim: 4,
                eps: 1e-6,
            },
            r: RouterP {
                m: 1,
                hidden: 4,
                experts: 4,
                top_k: 2,
                eps: 1e-6,
            },
            inter: 2,
            moe_inter: 3,
            w: DType::F32,
            pw: DType::F32,
            gw: DType::F32,
        };
        let f = |v: &[f32]| HostTensor::F32(v.to_vec());
        let row = [1.0, -2.0, 3.0, 0.5];
        // (the router's inputs are read only for ties: unused here)
        let inputs = vec![f(&row); 8];
        let outs = |ids: [u32; 2], wts: [f32; 2], routed: &[f32]| {
            vec![
                f(&row),
                f(&row),
                f(&row),
                HostTensor::U32(ids.to_vec()),
                f(&wts),
                f(&[0.25, -0.75]),
                f(routed),
            ]
        };
        let r = outs([2, 0], [0.6, 0.4], &[1.0, 2.0, 3.0, -1.0, -2.0, -3.0]);
        // the same experts in the other order, rows with them
        let d = outs([0, 2], [0.4, 0.6], &[-1.0, -2.0, -3.0, 1.0, 2.0, 3.0]);
        assert_eq!(
            judge_post_attention_gate_up(&op, 1e-9, &inputs, &r, &d),
            Ok(0.0)
        );
        // a routed row off
        let bad = outs([0, 2], [0.4, 0.6], &[-1.0, -2.0, -3.0, 1.0, 2.5, 3.0]);
        let e = judge_post_attention_gate_up(&op, 1e-9, &inputs, &r, &bad).unwrap_err();
        assert!(e.1.contains("routed activations"), "{}", e.1);
        // the rows left in slot order: each sits against another expert's
        let swapped = outs([0, 2], [0.4, 0.6], &[1.0, 2.0, 3.0, -1.0, -2.0, -3.0]);
        assert!(judge_post_attention_gate_up(&op, 1e-9, &inputs, &r, &swapped).is_err());
    }
}
