//! A layer's feed-forward block ([`FeedForward`]) on the attention's
//! output: `r = x + post_attention_layernorm(o)`, the dense MLP on
//! `pre_feedforward_layernorm(r)` and, with experts, the routed experts on
//! `pre_feedforward_layernorm_2(r)` ([`MoeBlock`]), then `x = (r +
//! post_feedforward_layernorm(..)) * layer_scalar` and the next norm of x.
//! Which launches run the two branches (fused pairs in decode, GEMMs in
//! prefill, slots for streamed experts) is decided here.

use super::pass::Pass;
use crate::backend::ComputeBackend;
use crate::error::Result;
use crate::model::config::ModelConfig;
use crate::model::experts::routed::{MoeBlock, Placed};
use crate::model::experts::streaming::StreamPass;
use crate::model::scratch::{ExpertScratch, FfnScratch, Residual};
use crate::model::weights::Loader;
use crate::ops::{
    DownArgs, GateUpArgs, Matmul, Moe, PostAttentionArgs, PostFfn, PostFfnArgs, Router,
};

/// The feed-forward half of a layer: its norms, the dense MLP and, on a
/// model with experts, the routed experts beside it.
pub(super) struct FeedForward<B: ComputeBackend> {
    post_attn_norm: B::Buffer,
    pre_ff_norm: B::Buffer,
    /// `[2 * intermediate, hidden]`: gate rows, then up rows.
    mlp_gate_up: B::Buffer,
    mlp_down: B::Buffer,
    post_ff_norm: B::Buffer,
    /// Multiplies the layer's output (a parameter of post_ffn, not a buffer).
    layer_scalar: f32,
    /// The dense MLP's intermediate width.
    inter: usize,
    experts: Option<MoeBlock<B>>,
}

/// The dense MLP as a one-expert MoE (gate_up, down).
type OneExpert<'s, T> = (GateUpArgs<'s, T>, DownArgs<'s, T>);

impl<B: ComputeBackend> FeedForward<B> {
    /// Layer `i`'s feed-forward weights from `ld`, with its `experts`
    /// (loaded first) and `layer_scalar`.
    pub fn load(
        ld: &Loader<'_, B>,
        cfg: &ModelConfig,
        i: usize,
        experts: Option<MoeBlock<B>>,
        layer_scalar: f32,
    ) -> Result<Self> {
        let (p, h) = (format!("layers.{i}."), cfg.hidden);
        Ok(FeedForward {
            post_attn_norm: ld.norm(&format!("{p}post_attention_layernorm.weight"), h)?,
            pre_ff_norm: ld.norm(&format!("{p}pre_feedforward_layernorm.weight"), h)?,
            mlp_gate_up: ld.stacked(
                &[
                    (format!("{p}mlp.gate_proj.weight"), cfg.intermediate),
                    (format!("{p}mlp.up_proj.weight"), cfg.intermediate),
                ],
                h,
                &format!("{p}mlp.gate_up"),
            )?,
            mlp_down: ld.weight(&format!("{p}mlp.down_proj.weight"), h, cfg.intermediate)?,
            post_ff_norm: ld.norm(&format!("{p}post_feedforward_layernorm.weight"), h)?,
            layer_scalar,
            inter: cfg.intermediate,
            experts,
        })
    }

    /// The layer's routed experts, where it has them.
    pub fn experts(&self) -> Option<&MoeBlock<B>> {
        self.experts.as_ref()
    }

    /// The block on the attention's output `o`: reads the residual stream
    /// `input.x`, leaves the new one in `res.x` and the norm `next` of it
    /// (the next layer's input norm, or the final norm) in `res.normed`
    /// (`res` may be `input`).
    #[allow(clippy::too_many_arguments)]
    pub fn record(
        &self,
        p: &Pass<'_, B>,
        (input, res): (&Residual<B::Buffer>, &Residual<B::Buffer>),
        next: Option<&B::Buffer>,
        o: &B::Buffer,
        s: &FfnScratch<B::Buffer>,
        e: &ExpertScratch<B::Buffer>,
        sp: &mut StreamPass<'_>,
    ) -> Result<()> {
        let post_ffn = PostFfnArgs {
            dense: &s.dense,
            w_dense: &self.post_ff_norm,
            moe: None,
            r: &s.r,
            x: &res.x,
            next: next.map(|w| (w, &res.normed)),
            p: PostFfn {
                rows: p.m,
                dim: p.hidden,
                eps: p.eps,
                scale: self.layer_scalar,
            },
        };
        let dense = self.one_expert_mlp(p, s);
        match &self.experts {
            Some(moe) => self.record_with_experts(p, &input.x, o, s, e, sp, dense, post_ffn, moe),
            None => self.record_dense(p, &input.x, o, s, dense, post_ffn),
        }
    }

    /// The block without experts:
    /// `x = (r + post_feedforward_layernorm(mlp(pre_ff(r)))) * layer_scalar`.
    fn record_dense(
        &self,
        p: &Pass<'_, B>,
        x: &B::Buffer,
        o: &B::Buffer,
        s: &FfnScratch<B::Buffer>,
        (gate_up, down): OneExpert<'_, B::Buffer>,
        post_ffn: PostFfnArgs<'_, B::Buffer>,
    ) -> Result<()> {
        let be = p.be;
        be.post_attention(
            o,
            x,
            &self.post_attn_norm,
            &self.pre_ff_norm,
            &s.r,
            &s.ff_in,
            None,
            p.post_attention(),
        )?;
        if p.m == 1 {
            gate_up.run(be)?;
            down.run(be)?;
        } else {
            self.dense_mlp(p, s)?;
        }
        post_ffn.run(be)
    }

    /// The block with experts: the router on r, the dense MLP and the
    /// routed experts beside it, `x = (r + post_ff(post_ff_1(dense) +
    /// post_ff_2(experts))) * layer_scalar`. In decode the phases of both
    /// branches run as pairs; streamed experts place the routed ones in
    /// their slots first ([`MoeBlock::place`]).
    #[allow(clippy::too_many_arguments)]
    fn record_with_experts(
        &self,
        p: &Pass<'_, B>,
        x: &B::Buffer,
        o: &B::Buffer,
        s: &FfnScratch<B::Buffer>,
        e: &ExpertScratch<B::Buffer>,
        sp: &mut StreamPass<'_>,
        (dense_gate_up, dense_down): OneExpert<'_, B::Buffer>,
        post_ffn: PostFfnArgs<'_, B::Buffer>,
        moe: &MoeBlock<B>,
    ) -> Result<()> {
        let (be, m) = (p.be, p.m);
        // r and both branches' pre-norms of it
        let pa_args = PostAttentionArgs {
            o,
            x,
            w_post: &self.post_attn_norm,
            w_ff: &self.pre_ff_norm,
            r: &s.r,
            ff: &s.ff_in,
            moe: (&moe.pre_norm, &e.x),
            p: p.post_attention(),
        };
        // (the router reads r, not a pre-norm, in the same call)
        let router = moe.router(
            e,
            Router {
                m,
                hidden: p.hidden,
                experts: moe.experts,
                top_k: moe.top_k,
                eps: p.eps,
            },
        );
        let mp = Moe {
            m,
            hidden: p.hidden,
            inter: moe.inter,
            experts: moe.experts,
            top_k: moe.top_k,
            precision: p.precision,
        };
        let routed_gate_up = moe.gate_up(e, mp);
        let routed_down = moe.down(e, mp);
        let post = PostFfnArgs {
            w_dense: &moe.dense_post_norm,
            moe: Some((&e.out, &moe.post_norm, &self.post_ff_norm)),
            ..post_ffn
        };
        if moe.streamed.is_some() && sp.optimistic && m == 1 {
            // Slots looked up on the device: no wait; the pass's log tells
            // the host afterwards whether it stands.
            let ((slot_gate_up, slot_down), lookup) =
                moe.lookup(e, &routed_gate_up, &routed_down)?;
            be.post_attention_gate_up_slots(
                (pa_args, router),
                dense_gate_up,
                slot_gate_up,
                lookup,
            )?;
            be.moe_down_pair_post_ffn(dense_down, slot_down, post)
        } else if moe.streamed.is_some() {
            be.post_attention_router(pa_args, router)?;
            if m == 1 {
                dense_gate_up.run(be)?;
            } else {
                self.dense_mlp(p, s)?;
            }
            match moe.place(be, sp, e, &routed_gate_up, &routed_down)? {
                // one wave: its gate_up ran, its down runs as resident
                Placed::OneWave(slot_down) if m == 1 => {
                    be.moe_down_pair_post_ffn(dense_down, slot_down, post)
                }
                Placed::OneWave(slot_down) => {
                    slot_down.run(be)?;
                    post.run(be)
                }
                Placed::Waves(sum) => {
                    if m == 1 {
                        dense_down.run(be)?;
                    }
                    PostFfnArgs {
                        moe: Some((sum, &moe.post_norm, &self.post_ff_norm)),
                        ..post
                    }
                    .run(be)
                }
            }
        } else if m == 1 {
            be.post_attention_gate_up((pa_args, router), dense_gate_up, routed_gate_up)?;
            be.moe_down_pair_post_ffn(dense_down, routed_down, post)
        } else {
            be.post_attention_router(pa_args, router)?;
            self.dense_mlp(p, s)?;
            routed_gate_up.run(be)?;
            routed_down.run(be)?;
            post.run(be)
        }
    }

    /// The dense MLP of `m > 1` rows (prefill): gate|up GEMM, activation,
    /// down GEMM, into `s.dense`.
    fn dense_mlp(&self, p: &Pass<'_, B>, s: &FfnScratch<B::Buffer>) -> Result<()> {
        let (be, m, h, inter) = (p.be, p.m, p.hidden, self.inter);
        be.matmul(
            &self.mlp_gate_up,
            &s.ff_in,
            &s.gate_up,
            Matmul {
                m,
                n: 2 * inter,
                k: h,
                precision: p.precision,
            },
        )?;
        be.gelu_mul(&s.gate_up, &s.act, m, inter)?;
        be.matmul(
            &self.mlp_down,
            &s.act,
            &s.dense,
            Matmul {
                m,
                n: h,
                k: inter,
                precision: p.precision,
            },
        )
    }

    /// The dense MLP as a one-expert MoE: in decode the MoE kernels read
    /// expert 0's rows and apply the activation themselves (one dispatch
    /// instead of a GEMV and gelu_mul), and with experts both branches run
    /// as one launch per phase (`moe_*_pair`).
    fn one_expert_mlp<'s>(
        &'s self,
        p: &Pass<'_, B>,
        s: &'s FfnScratch<B::Buffer>,
    ) -> OneExpert<'s, B::Buffer> {
        let one_expert = Moe {
            m: p.m,
            hidden: p.hidden,
            inter: self.inter,
            experts: 1,
            top_k: 1,
            precision: p.precision,
        };
        (
            GateUpArgs {
                x: &s.ff_in,
                gate_up: &self.mlp_gate_up,
                ids: &s.zero_ids,
                act: &s.act,
                p: one_expert,
            },
            DownArgs {
                act: &s.act,
                down: &self.mlp_down,
                ids: &s.zero_ids,
                weights: &s.one_w,
                out: &s.dense,
                p: one_expert,
            },
        )
    }
}
