//! INTERIM: a minimal copy of the loader branch's `config.rs` API, so the
//! decoder builds and its oracle tests run before that branch lands. The
//! loader's version (full validation, every spelling) replaces this file.

use std::path::Path;

use serde_json::Value;

use crate::dtype::DType;
use crate::error::{Error, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerKind {
    Sliding,
    Full,
}

#[derive(Clone, Debug, PartialEq)]
pub struct LayerSpec {
    pub kind: LayerKind,
    pub head_dim: usize,
    pub kv_heads: usize,
    pub rope_theta: f32,
    /// Rotated pairs.
    pub rot_pairs: usize,
    pub k_eq_v: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub hidden: usize,
    pub heads: usize,
    pub layers: Vec<LayerSpec>,
    pub intermediate: usize,
    pub enable_moe: bool,
    pub experts: usize,
    pub top_k: usize,
    pub moe_inter: usize,
    pub vocab: usize,
    pub sliding_window: usize,
    pub final_softcap: Option<f32>,
    pub eps: f32,
    pub tie_embeddings: bool,
}

fn err(path: &Path, detail: impl Into<String>) -> Error {
    Error::Config {
        path: path.display().to_string(),
        detail: detail.into(),
    }
}

fn get_usize(v: &Value, key: &str, path: &Path) -> Result<usize> {
    v.get(key)
        .and_then(Value::as_u64)
        .map(|x| x as usize)
        .ok_or_else(|| err(path, format!("missing or non-integer `{key}`")))
}

impl ModelConfig {
    pub fn from_file(path: &Path) -> Result<Self> {
        let text =
            std::fs::read_to_string(path).map_err(|e| Error::io(path.display().to_string(), e))?;
        let root: Value = serde_json::from_str(&text).map_err(|e| err(path, e.to_string()))?;
        let t = root.get("text_config").unwrap_or(&root);
        let n_layers = get_usize(t, "num_hidden_layers", path)?;
        let head_dim = get_usize(t, "head_dim", path)?;
        let kv_heads = get_usize(t, "num_key_value_heads", path)?;
        let types: Vec<String> = match t.get("layer_types").and_then(Value::as_array) {
            Some(a) => a
                .iter()
                .map(|s| s.as_str().unwrap_or("").to_string())
                .collect(),
            None => return Err(err(path, "missing `layer_types`")),
        };
        if types.len() != n_layers {
            return Err(err(
                path,
                "`layer_types` length differs from num_hidden_layers",
            ));
        }
        let rope = t.get("rope_parameters");
        let rope_f = |kind: &str, key: &str, default: f64| -> f64 {
            rope.and_then(|r| r.get(kind))
                .and_then(|r| r.get(key))
                .and_then(Value::as_f64)
                .unwrap_or(default)
        };
        let k_eq_v = t
            .get("attention_k_eq_v")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let mut layers = Vec::with_capacity(n_layers);
        for (i, ty) in types.iter().enumerate() {
            let spec = match ty.as_str() {
                "sliding_attention" => LayerSpec {
                    kind: LayerKind::Sliding,
                    head_dim,
                    kv_heads,
                    rope_theta: rope_f("sliding_attention", "rope_theta", 1e4) as f32,
                    rot_pairs: head_dim / 2,
                    k_eq_v: false,
                },
                "full_attention" => {
                    let over = t.get("per_layer_config").and_then(|p| p.get(i.to_string()));
                    let hd = over
                        .and_then(|o| o.get("head_dim"))
                        .or_else(|| t.get("global_head_dim"))
                        .and_then(Value::as_u64)
                        .map_or(head_dim, |x| x as usize);
                    let kvh = over
                        .and_then(|o| o.get("num_key_value_heads"))
                        .or_else(|| t.get("num_global_key_value_heads"))
                        .and_then(Value::as_u64)
                        .map_or(kv_heads, |x| x as usize);
                    let prf = rope_f("full_attention", "partial_rotary_factor", 1.0);
                    LayerSpec {
                        kind: LayerKind::Full,
                        head_dim: hd,
                        kv_heads: kvh,
                        rope_theta: rope_f("full_attention", "rope_theta", 1e6) as f32,
                        rot_pairs: ((hd / 2) as f64 * prf).round() as usize,
                        k_eq_v,
                    }
                }
                other => {
                    return Err(err(
                        path,
                        format!("unknown layer type {other:?} at layer {i}"),
                    ))
                }
            };
            layers.push(spec);
        }
        let cfg = ModelConfig {
            hidden: get_usize(t, "hidden_size", path)?,
            heads: get_usize(t, "num_attention_heads", path)?,
            layers,
            intermediate: get_usize(t, "intermediate_size", path)?,
            enable_moe: t
                .get("enable_moe_block")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            experts: t.get("num_experts").and_then(Value::as_u64).unwrap_or(0) as usize,
            top_k: t.get("top_k_experts").and_then(Value::as_u64).unwrap_or(0) as usize,
            moe_inter: t
                .get("moe_intermediate_size")
                .and_then(Value::as_u64)
                .unwrap_or(0) as usize,
            vocab: get_usize(t, "vocab_size", path)?,
            sliding_window: get_usize(t, "sliding_window", path)?,
            final_softcap: t
                .get("final_logit_softcapping")
                .and_then(Value::as_f64)
                .map(|x| x as f32),
            eps: t
                .get("rms_norm_eps")
                .and_then(Value::as_f64)
                .unwrap_or(1e-6) as f32,
            tie_embeddings: t
                .get("tie_word_embeddings")
                .or_else(|| root.get("tie_word_embeddings"))
                .and_then(Value::as_bool)
                .unwrap_or(true),
        };
        cfg.validate().map_err(|e| err(path, e.to_string()))?;
        Ok(cfg)
    }

    /// The flagship shape (see `shared/reference/gemma4.md`).
    pub fn gemma4_26b_a4b() -> Self {
        let layers = (0..30)
            .map(|i| {
                if i % 6 == 5 {
                    LayerSpec {
                        kind: LayerKind::Full,
                        head_dim: 512,
                        kv_heads: 2,
                        rope_theta: 1e6,
                        rot_pairs: 64,
                        k_eq_v: true,
                    }
                } else {
                    LayerSpec {
                        kind: LayerKind::Sliding,
                        head_dim: 256,
                        kv_heads: 8,
                        rope_theta: 1e4,
                        rot_pairs: 128,
                        k_eq_v: false,
                    }
                }
            })
            .collect();
        ModelConfig {
            hidden: 2816,
            heads: 16,
            layers,
            intermediate: 2112,
            enable_moe: true,
            experts: 128,
            top_k: 8,
            moe_inter: 704,
            vocab: 262144,
            sliding_window: 1024,
            final_softcap: Some(30.0),
            eps: 1e-6,
            tie_embeddings: true,
        }
    }

    pub fn validate(&self) -> Result<()> {
        let bad = |d: String| {
            Err(Error::Config {
                path: "<config>".into(),
                detail: d,
            })
        };
        if self.hidden == 0 || self.heads == 0 || self.vocab == 0 || self.layers.is_empty() {
            return bad("hidden, heads, vocab and layers must be positive".into());
        }
        for (i, l) in self.layers.iter().enumerate() {
            if l.kv_heads == 0 || self.heads % l.kv_heads != 0 || l.head_dim % 2 != 0 {
                return bad(format!("layer {i}: inconsistent heads/kv_heads/head_dim"));
            }
        }
        if self.enable_moe && (self.experts == 0 || self.top_k == 0 || self.top_k > self.experts) {
            return bad("MoE needs 0 < top_k <= experts".into());
        }
        Ok(())
    }

    pub fn parameter_count(&self) -> u64 {
        let h = self.hidden as u64;
        let mut n = self.vocab as u64 * h + h;
        for l in &self.layers {
            let (hd, kv) = (l.head_dim as u64, l.kv_heads as u64);
            let v = if l.k_eq_v { 0 } else { kv * hd * h };
            n += self.heads as u64 * hd * h * 2 + kv * hd * h + v + 2 * hd;
            n += 3 * self.intermediate as u64 * h + 7 * h + 1;
            if self.enable_moe {
                let (e, mi) = (self.experts as u64, self.moe_inter as u64);
                n += e * 3 * mi * h + e * h + h + e;
            }
        }
        n
    }

    pub fn bytes_per_token(&self, weight_dtype: DType) -> u64 {
        let h = self.hidden as u64;
        let mut n = self.vocab as u64 * h;
        for l in &self.layers {
            let (hd, kv) = (l.head_dim as u64, l.kv_heads as u64);
            let v = if l.k_eq_v { 0 } else { kv * hd * h };
            n += self.heads as u64 * hd * h * 2 + kv * hd * h + v;
            n += 3 * self.intermediate as u64 * h;
            if self.enable_moe {
                n += self.top_k as u64 * 3 * self.moe_inter as u64 * h + self.experts as u64 * h;
            }
        }
        n * weight_dtype.size() as u64
    }
}
