//! Small per-layer values the decoder needs on the host, decoded once at open
//! (as the seed engine does) instead of on every token.

use crate::dtype::decode_f32;
use crate::Result;

use super::checkpoint::{Checkpoint, TensorRef};

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

impl TensorRef {
    /// The elements decoded to f32 (for the small tensors read on the host).
    pub fn to_f32(&self) -> Vec<f32> {
        let bytes = self.bytes.as_slice();
        (0..self.numel())
            .map(|i| decode_f32(self.dtype, bytes, i))
            .collect()
    }
}

/// Decodes every layer's state from a checked checkpoint.
pub(crate) fn build(ckpt: &Checkpoint) -> Result<Vec<LayerHostState>> {
    let cfg = ckpt.config();
    let inv_sqrt_hidden = 1.0 / (cfg.hidden as f32).sqrt();
    (0..cfg.layers.len())
        .map(|i| {
            let layer_scalar = ckpt
                .tensor(&format!("layers.{i}.layer_scalar"))?
                .to_f32()
                .first()
                .copied()
                .unwrap_or(1.0);
            let (router_effective_scale, per_expert_scale) = if cfg.enable_moe {
                let scale = ckpt.tensor(&format!("layers.{i}.router.scale"))?.to_f32();
                (
                    scale.iter().map(|s| s * inv_sqrt_hidden).collect(),
                    ckpt.tensor(&format!("layers.{i}.router.per_expert_scale"))?
                        .to_f32(),
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
