//! A drafter's `config.json` (transformers' `Gemma4AssistantConfig`,
//! `model_type` `gemma4_assistant`), and whether it fits a target.

use std::path::Path;

use serde_json::Value;

use crate::error::Error;
use crate::model::config::{LayerKind, ModelConfig};
use crate::model::json::{config_err, Fields};
use crate::Result;

/// The centroid-masked head of `use_ordered_embeddings`: the vocabulary in
/// `centroids` clusters of `vocab / centroids` tokens, the `top_k` best
/// clusters' tokens scored, every other token given the lowest score less 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Centroids {
    pub centroids: usize,
    pub top_k: usize,
}

impl Centroids {
    /// Tokens a cluster holds.
    pub fn per_cluster(&self, vocab: usize) -> usize {
        vocab / self.centroids
    }

    /// Tokens one draft step scores.
    pub fn scored(&self, vocab: usize) -> usize {
        self.top_k * self.per_cluster(vocab)
    }
}

/// A Gemma 4 drafter: dense decoder layers whose attention reads the
/// target's keys and values, fed `[target embedding, target hidden]`
/// through `pre_projection`.
#[derive(Clone, Debug, PartialEq)]
pub struct DrafterConfig {
    /// The inner decoder (`text_config`); its layers own no keys or values.
    pub text: ModelConfig,
    /// `backbone_hidden_size`: the target's hidden size.
    pub backbone_hidden: usize,
    /// `use_ordered_embeddings`: the centroid-masked head, else the plain tied head.
    pub centroids: Option<Centroids>,
}

impl DrafterConfig {
    /// Reads `dir/config.json`.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&shown, e))?;
        Self::from_json(&text, &shown)
    }

    /// Parses a drafter's `config.json` text.
    pub fn from_json(text: &str, path: &str) -> Result<Self> {
        let root: Value = serde_json::from_str(text)
            .map_err(|e| config_err(path, format!("not valid JSON: {e}")))?;
        let Value::Object(map) = &root else {
            return Err(config_err(path, "not a JSON object"));
        };
        let f = Fields::new(map, path, "");
        match f.opt_str("model_type")? {
            Some("gemma4_assistant") => {}
            Some(other) => {
                return Err(f.err(
                    "model_type",
                    format!("\"{other}\" is not a Gemma 4 drafter (expected \"gemma4_assistant\")"),
                ))
            }
            None => return Err(f.err("model_type", "missing (expected \"gemma4_assistant\")")),
        }
        let Some(inner) = f.opt_object("text_config")? else {
            return Err(f.err(
                "text_config",
                "missing: the drafter's decoder is described there",
            ));
        };
        let inner_fields = f.nested("text_config", inner);
        let layers = inner_fields.req_usize("num_hidden_layers")?;
        if let Some(shared) = inner_fields.opt_usize("num_kv_shared_layers")? {
            if shared != 0 && shared != layers {
                return Err(inner_fields.err(
                    "num_kv_shared_layers",
                    format!(
                        "{shared}: every one of the {layers} layers must read the target's keys"
                    ),
                ));
            }
        }
        if let Some(v) = inner_fields.opt_bool("enable_moe_block")? {
            if v {
                return Err(
                    inner_fields.err("enable_moe_block", "true: a drafter's layers are dense")
                );
            }
        }
        // The decoder's own parser, without the sharing it rejects for a
        // target: here sharing every layer is the point.
        let mut inner = inner.clone();
        inner.insert("num_kv_shared_layers".into(), Value::from(0));
        for key in ["quantization", "quantization_config"] {
            inner.remove(key);
        }
        if inner
            .get("vocab_size_per_layer_input")
            .is_some_and(|v| v == 0)
        {
            inner.remove("vocab_size_per_layer_input");
        }
        let mut text = ModelConfig::from_json(&Value::Object(inner).to_string(), path).map_err(
            |e| match e {
                Error::Config { path, detail } => Error::Config {
                    path,
                    detail: format!("text_config: {detail}"),
                },
                other => other,
            },
        )?;
        // An MLX-quantized drafter's block sits at the top level, as a
        // target's does (mlx-lm's layout), named from there.
        text.quantization = crate::model::quantization::parse(&f)?;
        let backbone_hidden = f.req_usize("backbone_hidden_size")?;
        let centroids = if f.opt_bool("use_ordered_embeddings")?.unwrap_or(false) {
            let c = Centroids {
                centroids: f.opt_usize("num_centroids")?.unwrap_or(2048),
                top_k: f.opt_usize("centroid_intermediate_top_k")?.unwrap_or(32),
            };
            if c.centroids == 0 || text.vocab % c.centroids != 0 {
                return Err(f.err(
                    "num_centroids",
                    format!(
                        "{} does not divide the vocabulary of {}",
                        c.centroids, text.vocab
                    ),
                ));
            }
            if c.top_k == 0 || c.top_k > c.centroids {
                return Err(f.err(
                    "centroid_intermediate_top_k",
                    format!("{} is outside 1..={}", c.top_k, c.centroids),
                ));
            }
            Some(c)
        } else {
            None
        };
        if f.opt_bool("tie_word_embeddings")? == Some(false) {
            return Err(f.err("tie_word_embeddings", "false: the drafter's head is tied"));
        }
        Ok(DrafterConfig {
            text,
            backbone_hidden,
            centroids,
        })
    }

    /// Checks that this drafter reads `target`'s state as it was trained
    /// to: the target's hidden size and vocabulary, and for each of its
    /// layers a target layer of the same kind with the same key geometry.
    /// Returns, per drafter layer, the target layer whose caches it reads
    /// (the target's last layer of that kind).
    pub fn fit(&self, target: &ModelConfig) -> Result<Vec<usize>> {
        let bad = |detail: String| {
            Err(Error::InvalidInput(format!(
                "the drafter does not fit the model: {detail}"
            )))
        };
        if self.backbone_hidden != target.hidden {
            return bad(format!(
                "backbone_hidden_size {} is not the model's hidden size {}",
                self.backbone_hidden, target.hidden
            ));
        }
        if self.text.vocab != target.vocab {
            return bad(format!(
                "vocabulary {} is not the model's {}",
                self.text.vocab, target.vocab
            ));
        }
        if self.text.sliding_window > target.sliding_window
            && self
                .text
                .layers
                .iter()
                .any(|l| l.kind == LayerKind::Sliding)
        {
            return bad(format!(
                "sliding_window {} is wider than the model's {} (its caches keep no more)",
                self.text.sliding_window, target.sliding_window
            ));
        }
        let mut sources = Vec::with_capacity(self.text.layers.len());
        for (i, l) in self.text.layers.iter().enumerate() {
            let Some(src) = target.layers.iter().rposition(|t| t.kind == l.kind) else {
                return bad(format!(
                    "layer {i} is {} and the model has no such layer",
                    l.kind.name()
                ));
            };
            let t = &target.layers[src];
            if (t.head_dim, t.kv_heads) != (l.head_dim, l.kv_heads) {
                return bad(format!(
                    "layer {i} ({}) reads {} KV heads of {} from the model's layer {src}, which has {} of {}",
                    l.kind.name(),
                    l.kv_heads,
                    l.head_dim,
                    t.kv_heads,
                    t.head_dim
                ));
            }
            sources.push(src);
        }
        Ok(sources)
    }
}
