//! One decoder layer ([`Layer`]): its input norm, its attention block and
//! its feed-forward block, each owning its weights, run on the residual
//! stream.

use super::attention::{AttentionBlock, Kv};
use super::feed_forward::FeedForward;
use super::pass::Pass;
use crate::backend::ComputeBackend;
use crate::error::Result;
use crate::model::config::ModelConfig;
use crate::model::experts::routed::MoeBlock;
use crate::model::experts::slot_cache::Policy;
use crate::model::experts::streaming::{ExpertStore, StreamPass};
use crate::model::scratch::{Residual, Scratch};
use crate::model::weights::Loader;

/// A decoder layer's weights, in its two blocks.
pub(super) struct Layer<B: ComputeBackend> {
    /// `input_layernorm`: the previous layer's post_ffn applies it (layer
    /// 0's runs after the embedding).
    pub input_norm: B::Buffer,
    attention: AttentionBlock<B>,
    feed_forward: FeedForward<B>,
}

impl<B: ComputeBackend> Layer<B> {
    /// Layer `i` from `ld`; with `streamed`, its experts get that many
    /// device slots of that policy and stay in the source.
    pub fn load(
        ld: &Loader<'_, B>,
        cfg: &ModelConfig,
        i: usize,
        streamed: Option<(usize, Policy, ExpertStore)>,
    ) -> Result<Self> {
        let p = format!("layers.{i}.");
        let experts = if cfg.enable_moe {
            Some(MoeBlock::load(ld, cfg, i, streamed)?)
        } else {
            None
        };
        let layer_scalar = ld
            .host_f32(&format!("{p}layer_scalar"), &[1])?
            .first()
            .copied()
            .unwrap_or(1.0);
        Ok(Layer {
            input_norm: ld.norm(&format!("{p}input_layernorm.weight"), cfg.hidden)?,
            attention: AttentionBlock::load(ld, cfg, i)?,
            feed_forward: FeedForward::load(ld, cfg, i, experts, layer_scalar)?,
        })
    }

    /// The layer for the pass's tokens: reads the residual stream
    /// `input.x` and this layer's normed input `input.normed`, leaves the
    /// new residual in `res.x` and its norm `next` (the next layer's input
    /// norm, or the final norm; none after the last layer of a pass without
    /// a head) in `res.normed` (`res` may be `input`). Attention keeps its
    /// keys and values in `kv`.
    #[allow(clippy::too_many_arguments)]
    pub fn record(
        &self,
        p: &Pass<'_, B>,
        input: &Residual<B::Buffer>,
        res: &Residual<B::Buffer>,
        next: Option<&B::Buffer>,
        s: &Scratch<B::Buffer>,
        kv: &Kv<'_, B>,
        sp: &mut StreamPass<'_>,
    ) -> Result<()> {
        self.attention
            .record(p, &input.normed, &s.pos, &s.attention, kv)?;
        self.feed_forward.record(
            p,
            (input, res),
            next,
            &s.attention.out,
            &s.ffn,
            &s.experts,
            sp,
        )
    }

    /// The layer's routed experts, where it has them.
    pub fn experts(&self) -> Option<&MoeBlock<B>> {
        self.feed_forward.experts()
    }
}
