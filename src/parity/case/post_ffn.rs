//! The fused step after the MLPs: post_ffn's norms, branch sum and
//! residual (and the next layer's norm), alone and after decode's down
//! pair.

use super::inputs::norm_weight;
use super::moe::{down_pair_args, pair_params, MoeDownPair};
use super::Case;
use crate::backend::ComputeBackend;
use crate::ops::{self, Moe, OpKind, PostFfnArgs};
use crate::parity::{HostTensor, OutSpec};
use crate::rng::Rng;
use crate::{DType, Result};

/// `post_ffn`: `moe`, the experts branch; `next`, the next layer's normed
/// input (norm weights of dtype `w`).
#[derive(Clone, Copy, Debug)]
pub struct PostFfn {
    pub p: ops::PostFfn,
    pub moe: bool,
    pub next: bool,
    pub w: DType,
}

/// `moe_down_pair_post_ffn`: `MoeDownPair`'s problems (a the dense
/// MLP, b the experts), then `PostFfn` with the experts branch on their
/// outputs (norm weights of dtype `nw`).
#[derive(Clone, Copy, Debug)]
pub struct MoeDownPairPostFfn {
    pub a: Moe,
    pub b: Moe,
    pub w: DType,
    pub p: ops::PostFfn,
    pub next: bool,
    pub nw: DType,
}

impl Case for PostFfn {
    fn op_name(&self) -> &'static str {
        "post_ffn"
    }

    fn name(&self) -> String {
        let (p, moe, next, w) = (&self.p, self.moe, self.next, self.w);
        format!(
            "{}(rows={},dim={},moe={moe},next={next},scale={},w={w})",
            self.family(),
            p.rows,
            p.dim,
            p.scale
        )
    }

    fn kind(&self) -> OpKind {
        OpKind::PostFfn {
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
        ];
        if self.moe {
            v.push(HostTensor::F32(rng.vec_normal(n, 0.5)));
            v.push(norm_weight(rng, w, p.dim));
            v.push(norm_weight(rng, w, p.dim));
        }
        if self.next {
            v.push(norm_weight(rng, w, p.dim));
        }
        v
    }

    fn outputs(&self) -> Vec<OutSpec> {
        let n = self.p.rows * self.p.dim;
        let mut v = vec![OutSpec::F32(n)];
        if self.next {
            v.push(OutSpec::F32(n));
        }
        v
    }

    fn record<B: ComputeBackend>(&self, b: &B, i: &[B::Buffer], o: &[B::Buffer]) -> Result<()> {
        let m = self.moe.then(|| (&i[3], &i[4], &i[5]));
        let wn = if self.moe { 6 } else { 3 };
        let n = self.next.then(|| (&i[wn], &o[1]));
        b.post_ffn(PostFfnArgs {
            dense: &i[0],
            w_dense: &i[2],
            moe: m,
            r: &i[1],
            x: &o[0],
            next: n,
            p: self.p,
        })
    }
}

impl MoeDownPairPostFfn {
    fn pair(&self) -> MoeDownPair {
        MoeDownPair {
            a: self.a,
            b: self.b,
            w: self.w,
        }
    }
}

impl Case for MoeDownPairPostFfn {
    fn op_name(&self) -> &'static str {
        "moe_down_pair_post_ffn"
    }

    fn family(&self) -> &'static str {
        if self.w.is_quantized() {
            "moe_down_pair_post_ffn_quantized"
        } else {
            "moe_down_pair_post_ffn"
        }
    }

    fn name(&self) -> String {
        let (next, nw) = (self.next, self.nw);
        format!(
            "{}({},next={next},scale={},nw={nw})",
            self.family(),
            pair_params(&self.a, &self.b, self.w),
            self.p.scale
        )
    }

    fn kind(&self) -> OpKind {
        OpKind::MoeDown { w: self.w }
    }

    /// Dot products of thousands of terms, reordered.
    fn limit(&self) -> f64 {
        1e-9
    }

    fn inputs(&self, rng: &mut Rng) -> Vec<HostTensor> {
        // The pair's inputs, then PostFfn's but its two branches
        // (the pair's outputs): r and the norm weights.
        let mut v = self.pair().inputs(rng);
        let post = PostFfn {
            p: self.p,
            moe: true,
            next: self.next,
            w: self.nw,
        }
        .inputs(rng);
        v.push(post[1].clone());
        v.push(post[2].clone());
        v.extend(post[4..].iter().cloned());
        v
    }

    fn outputs(&self) -> Vec<OutSpec> {
        let (a, b, p) = (&self.a, &self.b, &self.p);
        let n = p.rows * p.dim;
        let mut v = vec![
            OutSpec::F32(a.m * a.hidden),
            OutSpec::F32(b.m * b.hidden),
            OutSpec::F32(n),
        ];
        if self.next {
            v.push(OutSpec::F32(n));
        }
        v
    }

    fn record<B: ComputeBackend>(&self, b: &B, i: &[B::Buffer], o: &[B::Buffer]) -> Result<()> {
        let (dense, routed) = down_pair_args(i, o, self.a, self.b);
        b.moe_down_pair_post_ffn(
            dense,
            routed,
            PostFfnArgs {
                dense: &o[0],
                w_dense: &i[9],
                moe: Some((&o[1], &i[10], &i[11])),
                r: &i[8],
                x: &o[2],
                next: self.next.then(|| (&i[12], &o[3])),
                p: self.p,
            },
        )
    }

    /// The pair's count, then post_ffn's other inputs (the residual and
    /// the norm weights) read and its outputs written; the pair's two
    /// rows are written once and read back once.
    fn bytes(&self, inputs: &[HostTensor]) -> u64 {
        let split = inputs.len().min(8);
        let post = inputs[split..].iter().map(HostTensor::bytes).sum::<u64>();
        let rows = (self.p.rows * self.p.dim) as u64 * 4;
        self.pair().bytes(&inputs[..split]) + post + 2 * rows + rows * (1 + self.next as u64)
    }
}
