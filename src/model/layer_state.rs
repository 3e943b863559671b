//! Small per-layer values the decoder needs on the host, decoded once at open
//! (as the seed engine does) instead of on every token.

use crate::Result;

use super::config::ModelConfig;
use super::tensor_ref::TensorRef;

/// Host copies of one layer's scalars and short vectors, in f32.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerHostState {
    /// `router.scale * hidden^-1/2`, folded once (the router's
    /// `eff_scale` input); empty when the model has no MoE block. Kept in f32,
    /// not rounded back to the weight dtype.
    pub router_effective_scale: Vec<f32>,
    /// `router.per_expert_scale`; empty without MoE.
    pub per_expert_scale: Vec<f32>,
    /// `layer_scalar`: multiplies the layer's output.
    pub layer_scalar: f32,
}

/// Decodes every layer's state of a model of `cfg` from its checked
/// tensors, `tensor` giving each by name without prefix.
pub(crate) fn build(
    cfg: &ModelConfig,
    tensor: impl Fn(&str) -> Result<TensorRef>,
) -> Result<Vec<LayerHostState>> {
    let inv_sqrt_hidden = 1.0 / (cfg.hidden as f32).sqrt();
    (0..cfg.layers.len())
        .map(|i| {
            let layer_scalar = tensor(&format!("layers.{i}.layer_scalar"))?
                .to_f32()
                .first()
                .copied()
                .unwrap_or(1.0);
            let (router_effective_scale, per_expert_scale) = if cfg.enable_moe {
                let scale = tensor(&format!("layers.{i}.router.scale"))?.to_f32();
                (
                    scale.iter().map(|s| s * inv_sqrt_hidden).collect(),
                    tensor(&format!("layers.{i}.router.per_expert_scale"))?.to_f32(),
                )
            } else {
                (Vec::new(), Vec::new())
            };
            Ok(LayerHostState {
                router_effective_scale,
                per_expert_scale,
                layer_scalar,
            })
        })
        .collect()
}
