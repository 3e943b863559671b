//! A drafter of seeded random weights for any target (benchmarks): its
//! cost is a published drafter's of the same shape, its proposals are
//! noise (forced proposals set the acceptance).

use std::collections::HashMap;
use std::sync::Arc;

use super::{Centroids, DraftTensors, Drafter, DrafterConfig};
use crate::backend::ComputeBackend;
use crate::error::{Error, Result};
use crate::model::config::{LayerKind, ModelConfig};
use crate::model::decoder::Model;
use crate::model::quantization::{QuantParams, Quantization};
use crate::model::synthetic::SyntheticQuant;
use crate::quant::quantize;
use crate::rng::Rng;

/// transformers' defaults for the centroid head: used where they divide
/// the vocabulary (a published drafter's head), else the plain tied head.
const CENTROIDS: Centroids = Centroids {
    centroids: 2048,
    top_k: 32,
};

impl<B: ComputeBackend> Drafter<B> {
    /// A drafter for `target` of `layers` dense layers (the last full, the
    /// rest sliding, each with the target's key geometry for its kind),
    /// `hidden` wide with an MLP of `intermediate`, as many query heads as
    /// the target; random weights from `seed`, bf16, or quantized as `quant`
    /// says (every matrix a group divides, as mlx-lm converts one).
    pub fn synthetic(
        target: &Model<B>,
        layers: usize,
        (hidden, intermediate): (usize, usize),
        quant: Option<SyntheticQuant>,
        seed: u64,
    ) -> Result<Self> {
        let t = target.config();
        let spec = |kind: LayerKind| {
            t.layers
                .iter()
                .rev()
                .find(|l| l.kind == kind)
                .cloned()
                .ok_or_else(|| {
                    Error::InvalidInput(format!("the model has no {} layer", kind.name()))
                })
        };
        if layers == 0 || hidden == 0 || intermediate == 0 {
            return Err(Error::InvalidInput(
                "a synthetic drafter needs layers, hidden and intermediate sizes".into(),
            ));
        }
        let mut specs = vec![spec(LayerKind::Sliding)?; layers - 1];
        specs.push(spec(LayerKind::Full)?);
        let text = ModelConfig {
            hidden,
            layers: specs,
            intermediate,
            enable_moe: false,
            experts: 0,
            top_k: 0,
            moe_inter: 0,
            final_softcap: None,
            quantization: quant.map(|q| Quantization {
                default: QuantParams {
                    bits: q.bits as u32,
                    group: q.group as u32,
                },
                modules: HashMap::new(),
            }),
            ..t.clone()
        };
        let cfg = DrafterConfig {
            backbone_hidden: t.hidden,
            centroids: (t.vocab % CENTROIDS.centroids == 0).then_some(CENTROIDS),
            text,
        };
        let tensors = DraftTensors::random(&cfg, seed);
        Self::build(target, cfg, &tensors)
    }
}

impl DraftTensors {
    /// Every tensor a drafter of `cfg` reads: matrices N(0, 0.02) (with
    /// `cfg`'s quantization, those a group divides quantized by mlx's rule,
    /// but the centroids, as mlx-lm converts a drafter),
    /// norms and layer scalars 1, a seeded permutation as the token ordering.
    fn random(cfg: &DrafterConfig, seed: u64) -> DraftTensors {
        let quant = cfg.text.quantization.as_ref().map(|q| SyntheticQuant {
            bits: q.default.bits as u8,
            group: q.default.group as u16,
        });
        let c = &cfg.text;
        let (h, bh, v) = (c.hidden, cfg.backbone_hidden, c.vocab);
        let mut list: Vec<(String, Vec<usize>, bool)> = vec![
            ("pre_projection.weight".into(), vec![h, 2 * bh], false),
            ("post_projection.weight".into(), vec![bh, h], false),
            ("model.norm.weight".into(), vec![h], true),
            ("model.embed_tokens.weight".into(), vec![v, h], false),
        ];
        for (i, l) in c.layers.iter().enumerate() {
            let p = format!("model.layers.{i}.");
            let qd = c.heads * l.head_dim;
            let mut add =
                |n: &str, shape: Vec<usize>, one: bool| list.push((format!("{p}{n}"), shape, one));
            add("input_layernorm.weight", vec![h], true);
            add("self_attn.q_proj.weight", vec![qd, h], false);
            add("self_attn.q_norm.weight", vec![l.head_dim], true);
            add("self_attn.o_proj.weight", vec![h, qd], false);
            add("post_attention_layernorm.weight", vec![h], true);
            add("pre_feedforward_layernorm.weight", vec![h], true);
            add("mlp.gate_proj.weight", vec![c.intermediate, h], false);
            add("mlp.up_proj.weight", vec![c.intermediate, h], false);
            add("mlp.down_proj.weight", vec![h, c.intermediate], false);
            add("post_feedforward_layernorm.weight", vec![h], true);
            add("layer_scalar", vec![1], true);
        }
        if let Some(cc) = cfg.centroids {
            list.push((
                "masked_embedding.centroids.weight".into(),
                vec![cc.centroids, h],
                false,
            ));
        }
        let mut rng = Rng::new(seed);
        let mut bytes = Vec::new();
        let mut index = HashMap::new();
        let bf16 = |x: f32| ((x.to_bits() >> 16) as u16).to_le_bytes();
        let mut put = |bytes: &mut Vec<u8>, name: String, dt, shape: Vec<usize>, data: &[u8]| {
            let start = bytes.len();
            bytes.extend_from_slice(data);
            index.insert(name, (dt, shape, (start, bytes.len())));
        };
        for (name, shape, one) in list {
            let n: usize = shape.iter().product();
            let values: Vec<f32> = (0..n)
                .map(|_| if one { 1.0 } else { rng.normal(0.02) })
                .collect();
            let cols = *shape.last().unwrap_or(&1);
            let path = name.strip_suffix(".weight").map(str::to_string);
            // (mlx-lm's predicate keeps the centroids in float)
            let centroids = name.starts_with("masked_embedding.");
            let format = quant
                .filter(|q| !one && !centroids && shape.len() == 2 && cols % q.group as usize == 0);
            let (Some(q), Some(path)) = (format, path) else {
                let data: Vec<u8> = values.iter().flat_map(|&x| bf16(x)).collect();
                put(&mut bytes, name, safetensors::Dtype::BF16, shape, &data);
                continue;
            };
            // mlx-lm's conversion: the matrix quantized, bf16 scales and biases.
            let g = q.group as usize;
            let qz = quantize(&values, q.bits, g);
            let words: &[u8] = bytemuck::cast_slice(&qz.words);
            let wshape = vec![shape[0], cols * q.bits as usize / 32];
            put(&mut bytes, name, safetensors::Dtype::U32, wshape, words);
            for (part, v) in [("scales", &qz.scales), ("biases", &qz.biases)] {
                let data: Vec<u8> = v.iter().flat_map(|&x| bf16(x)).collect();
                let pshape = vec![shape[0], cols / g];
                put(
                    &mut bytes,
                    format!("{path}.{part}"),
                    safetensors::Dtype::BF16,
                    pshape,
                    &data,
                );
            }
        }
        if cfg.centroids.is_some() {
            let mut order: Vec<i64> = (0..v as i64).collect();
            for i in (1..v).rev() {
                order.swap(i, rng.below(i as u64 + 1) as usize);
            }
            let data: Vec<u8> = order.iter().flat_map(|id| id.to_le_bytes()).collect();
            let name = "masked_embedding.token_ordering".to_string();
            put(&mut bytes, name, safetensors::Dtype::I64, vec![v], &data);
        }
        DraftTensors {
            bytes: Arc::new(bytes),
            path: "synthetic drafter".into(),
            index,
        }
    }
}
