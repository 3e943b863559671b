//! The language-model tensors a config implies: names (without the
//! `model.` / `model.language_model.` prefix) and shapes.
//!
//! One list serves three users: the checkpoint loader checks a file against
//! it, the synthetic-weights generator fills it, and the parameter count sums
//! it. Shapes are `[out, in]` as stored by transformers.

use super::config::ModelConfig;

/// The tensor names and shapes a config requires (used by open() to check, and by a synthetic-weights generator for benchmarks): (name without prefix, shape).
///
/// `lm_head.weight` (present only when embeddings are untied) is the one name
/// that has no prefix in the file either.
pub fn expected_tensors(cfg: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let h = cfg.hidden;
    let mut out = vec![
        ("embed_tokens.weight".to_string(), vec![cfg.vocab, h]),
        ("norm.weight".to_string(), vec![h]),
    ];
    if !cfg.tie_embeddings {
        out.push(("lm_head.weight".to_string(), vec![cfg.vocab, h]));
    }
    for (i, l) in cfg.layers.iter().enumerate() {
        let mut t = |name: &str, shape: Vec<usize>| out.push((format!("layers.{i}.{name}"), shape));
        let q = cfg.heads.saturating_mul(l.head_dim);
        let kv = l.kv_heads.saturating_mul(l.head_dim);
        for norm in [
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        ] {
            t(&format!("{norm}.weight"), vec![h]);
        }
        t("self_attn.q_proj.weight", vec![q, h]);
        t("self_attn.k_proj.weight", vec![kv, h]);
        if !l.k_eq_v {
            t("self_attn.v_proj.weight", vec![kv, h]);
        }
        t("self_attn.o_proj.weight", vec![h, q]);
        t("self_attn.q_norm.weight", vec![l.head_dim]);
        t("self_attn.k_norm.weight", vec![l.head_dim]);
        t("mlp.gate_proj.weight", vec![cfg.intermediate, h]);
        t("mlp.up_proj.weight", vec![cfg.intermediate, h]);
        t("mlp.down_proj.weight", vec![h, cfg.intermediate]);
        if cfg.enable_moe {
            for norm in [
                "pre_feedforward_layernorm_2",
                "post_feedforward_layernorm_1",
                "post_feedforward_layernorm_2",
            ] {
                t(&format!("{norm}.weight"), vec![h]);
            }
            t("router.proj.weight", vec![cfg.experts, h]);
            t("router.scale", vec![h]);
            t("router.per_expert_scale", vec![cfg.experts]);
            t(
                "experts.gate_up_proj",
                vec![cfg.experts, cfg.moe_inter.saturating_mul(2), h],
            );
            t("experts.down_proj", vec![cfg.experts, h, cfg.moe_inter]);
        }
        t("layer_scalar", vec![1]);
    }
    out
}

impl ModelConfig {
    /// Parameter count of the language model (the tensors
    /// [`expected_tensors`] lists; tied embeddings counted once).
    pub fn parameter_count(&self) -> u64 {
        expected_tensors(self)
            .iter()
            .map(|(_, shape)| shape.iter().map(|&d| d as u64).product::<u64>())
            .sum()
    }
}

/// Bytes of a model's language-model tensors as stored: all of them, the
/// routed experts', the embedding's. One rule for the bytes a decoded token
/// reads, whatever the format (the checkpoint's and the synthetic model's).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct WeightBytes {
    pub total: u64,
    pub experts: u64,
    pub embed: u64,
}

impl WeightBytes {
    /// Count tensor `name` (without prefix) of `bytes`.
    pub fn add(&mut self, name: &str, bytes: u64) {
        self.total += bytes;
        if name.contains(".experts.") {
            self.experts += bytes;
        } else if name == "embed_tokens.weight" {
            self.embed += bytes;
        }
    }

    /// Weight bytes on the device with the routed experts streamed through
    /// `slots` slots a layer (None: all resident): every tensor but the
    /// experts, `slots` of each layer's experts, and each layer's slot
    /// table (a u32 an expert).
    pub fn with_slots(&self, c: &ModelConfig, slots: Option<usize>) -> u64 {
        match slots {
            Some(n) if c.enable_moe && c.experts > 0 => {
                let tables = (c.layers.len() * c.experts * 4) as u64;
                self.total - self.experts + self.experts / c.experts as u64 * n as u64 + tables
            }
            _ => self.total,
        }
    }

    /// Weight bytes a decoded token reads: every tensor but the routed
    /// experts, of which a token's top-k, plus the embedding's row (the
    /// tied LM head reads the whole table).
    pub fn per_token(&self, c: &ModelConfig) -> u64 {
        let experts = if c.enable_moe && c.experts > 0 {
            self.experts / c.experts as u64 * c.top_k as u64
        } else {
            self.experts
        };
        self.total - self.experts + experts + self.embed / c.vocab.max(1) as u64
    }
}
