//! The Gemma 4 text-decoder configuration, read from every `config.json`
//! spelling real checkpoints use, and checked before anything is sized from it.
//!
//! Defaults follow transformers' `configuration_gemma4.py` (`Gemma4TextConfig`)
//! so a field a checkpoint leaves out means what it means there. The core sizes
//! (`hidden_size`, `num_hidden_layers`, `num_attention_heads`,
//! `num_key_value_heads`, `head_dim`, `intermediate_size`, `vocab_size`) are
//! required anyway: a config without them is almost certainly not the model its
//! weights belong to.

use std::path::Path;

use serde_json::Value;

use super::json::{config_err, show, Fields};
use crate::dtype::DType;
use crate::error::Error;
use crate::Result;

/// Attention kind of one layer (`layer_types`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerKind {
    /// `sliding_attention`: attends to the last `sliding_window` positions.
    Sliding,
    /// `full_attention`: attends causally to everything.
    Full,
}

impl LayerKind {
    /// The `layer_types` / `rope_parameters` spelling.
    pub fn name(self) -> &'static str {
        match self {
            LayerKind::Sliding => "sliding_attention",
            LayerKind::Full => "full_attention",
        }
    }
}

/// Attention geometry of one layer, resolved from the global fields and the
/// full-attention override.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerSpec {
    pub kind: LayerKind,
    pub head_dim: usize,
    pub kv_heads: usize,
    pub rope_theta: f32,
    /// rotated pairs: head_dim/2 for default rope; for "proportional" rope (partial_rotary_factor f) head_dim/2 * f (Gemma 4 full layers: 512/2*0.25 = 64)
    pub rot_pairs: usize,
    /// V comes from the raw k_proj output (no v_proj tensor) — attention_k_eq_v on full layers
    pub k_eq_v: bool,
}

impl LayerSpec {
    /// Rows of the stacked q|k|v projection (`heads` query heads; no v rows
    /// when V is the raw K).
    pub fn qkv_rows(&self, heads: usize) -> usize {
        (heads + self.kv_heads * if self.k_eq_v { 1 } else { 2 }) * self.head_dim
    }
}

/// Everything the decoder needs to size buffers and run the Gemma 4 MoE text
/// model. When `enable_moe` is false, `experts`, `top_k` and `moe_inter` are 0.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub hidden: usize,
    /// num_attention_heads
    pub heads: usize,
    pub layers: Vec<LayerSpec>,
    /// dense MLP intermediate_size
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
    /// `eos_token_id` (one id or a list; empty when absent), with those of
    /// a `generation_config.json` beside it ([`Self::add_generation_config`],
    /// which `Checkpoint::open` applies): the tokens generation stops at
    /// when asked to.
    pub eos_token_ids: Vec<u32>,
    /// An MLX checkpoint's `quantization` block; None for float weights.
    pub quantization: Option<super::quantization::Quantization>,
}

/// Upper bounds that keep every size product far from overflow and reject
/// garbage early; each is well above any published Gemma 4 shape.
const MAX_HIDDEN: usize = 1 << 16;
const MAX_HEADS: usize = 1 << 10;
const MAX_INTER: usize = 1 << 20;
const MAX_VOCAB: usize = 1 << 24;
const MAX_LAYERS: usize = 1 << 10;
const MAX_HEAD_DIM: usize = 512;
const MAX_EXPERTS: usize = 256;
const MAX_TOP_K: usize = 8;
/// `max_position_embeddings` past this is garbage, not a model: 64 times
/// Gemma 4's 262,144, and far inside the runtime's u32 positions.
pub const MAX_POSITIONS: usize = 1 << 24;

impl ModelConfig {
    /// Reads and validates `config.json` at `path`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(&shown, e))?;
        Self::from_json(&text, &shown)
    }

    /// `eos_token_id` of a `generation_config.json` text (transformers'
    /// `generate` stops at those: an instruction-tuned checkpoint may list
    /// its end-of-turn token there only) added to the ids already held,
    /// then validated like the config's own.
    pub fn add_generation_config(&mut self, text: &str, path_for_errors: &str) -> Result<()> {
        let path = path_for_errors;
        let root = json_object(text, path)?;
        for id in parse_token_ids(&Fields::new(&root, path, ""), "eos_token_id")? {
            if !self.eos_token_ids.contains(&id) {
                self.eos_token_ids.push(id);
            }
        }
        self.validate_in(path)
    }

    /// [`Self::validate`], its errors naming the file `path`.
    fn validate_in(&self, path: &str) -> Result<()> {
        self.validate().map_err(|e| match e {
            Error::Config { detail, .. } => config_err(path, detail),
            other => other,
        })
    }

    /// Parses and validates a `config.json` text, text-only (fields at the top
    /// level) or multimodal (fields under `text_config`).
    pub fn from_json(text: &str, path_for_errors: &str) -> Result<Self> {
        let path = path_for_errors;
        let root = json_object(text, path)?;
        let root_fields = Fields::new(&root, path, "");
        let text_fields = select_text_config(&root_fields)?;
        let cfg = parse_text_config(&text_fields, &root_fields)?;
        cfg.validate_in(path)?;
        Ok(cfg)
    }

    /// `max_position_embeddings` of a `config.json` text (beside the other
    /// decoder fields: the top level, or `text_config`), validated as
    /// [`Self::from_json`] validates it; None when the config leaves it out.
    /// (Not a field of `ModelConfig`: only the CLI's context cap uses it.)
    pub fn max_position_embeddings(text: &str, path_for_errors: &str) -> Result<Option<usize>> {
        let path = path_for_errors;
        let root = json_object(text, path)?;
        let root_fields = Fields::new(&root, path, "");
        parse_max_positions(&select_text_config(&root_fields)?)
    }

    /// [`Self::max_position_embeddings`] of the `config.json` at `path`.
    pub fn max_position_embeddings_in(path: &Path) -> Result<Option<usize>> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(&shown, e))?;
        Self::max_position_embeddings(&text, &shown)
    }

    /// The flagship shape, for synthetic benchmarks (docs/gemma4.md).
    pub fn gemma4_26b_a4b() -> Self {
        let layers = (0..30)
            .map(|i| {
                if (i + 1) % 6 == 0 {
                    LayerSpec {
                        kind: LayerKind::Full,
                        head_dim: 512,
                        kv_heads: 2,
                        rope_theta: 1_000_000.0,
                        rot_pairs: 64,
                        k_eq_v: true,
                    }
                } else {
                    LayerSpec {
                        kind: LayerKind::Sliding,
                        head_dim: 256,
                        kv_heads: 8,
                        rope_theta: 10_000.0,
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
            vocab: 262_144,
            sliding_window: 1024,
            final_softcap: Some(30.0),
            eps: 1e-6,
            tie_embeddings: true,
            // Gemma 4: <eos> and <end_of_turn>.
            eos_token_ids: vec![1, 106],
            quantization: None,
        }
    }

    /// Check internal consistency (sizes positive, top_k <= experts <= 256, top_k <= 8, head_dim even and <= 512, heads % kv_heads == 0, ...): errors name the field.
    ///
    /// Also bounds every size so that shape products cannot overflow: a config
    /// that passes can be sized from without checked arithmetic.
    pub fn validate(&self) -> Result<()> {
        let bad = |field: &str, detail: String| -> Result<()> {
            Err(config_err(
                "model config",
                format!("field `{field}`: {detail}"),
            ))
        };
        let in_range = |field: &str, v: usize, max: usize| -> Result<()> {
            if v == 0 || v > max {
                bad(field, format!("{v} is outside 1..={max}"))
            } else {
                Ok(())
            }
        };
        in_range("hidden_size", self.hidden, MAX_HIDDEN)?;
        in_range("num_attention_heads", self.heads, MAX_HEADS)?;
        in_range("num_hidden_layers", self.layers.len(), MAX_LAYERS)?;
        in_range("intermediate_size", self.intermediate, MAX_INTER)?;
        in_range("vocab_size", self.vocab, MAX_VOCAB)?;
        if let Some(&id) = self
            .eos_token_ids
            .iter()
            .find(|&&id| id as usize >= self.vocab)
        {
            bad(
                "eos_token_id",
                format!("{id} is past the vocabulary ({} tokens)", self.vocab),
            )?;
        }
        if self.sliding_window == 0 {
            return bad("sliding_window", "must be positive".into());
        }
        if !(self.eps.is_finite() && self.eps > 0.0) {
            return bad(
                "rms_norm_eps",
                format!("{} is not a positive number", self.eps),
            );
        }
        if let Some(cap) = self.final_softcap {
            if !(cap.is_finite() && cap > 0.0) {
                return bad(
                    "final_logit_softcapping",
                    format!("{cap} is not a positive number (use null for none)"),
                );
            }
        }
        if self.enable_moe {
            in_range("num_experts", self.experts, MAX_EXPERTS)?;
            in_range("top_k_experts", self.top_k, MAX_TOP_K)?;
            in_range("moe_intermediate_size", self.moe_inter, MAX_INTER)?;
            if self.top_k > self.experts {
                return bad(
                    "top_k_experts",
                    format!("{} exceeds num_experts ({})", self.top_k, self.experts),
                );
            }
        }
        for (i, l) in self.layers.iter().enumerate() {
            let field = |f: &str| format!("{f} (layer {i}, {})", l.kind.name());
            if l.head_dim == 0 || l.head_dim % 2 != 0 || l.head_dim > MAX_HEAD_DIM {
                return bad(
                    &field("head_dim"),
                    format!("{} must be even and in 2..={MAX_HEAD_DIM}", l.head_dim),
                );
            }
            if l.kv_heads == 0 || l.kv_heads > self.heads || self.heads % l.kv_heads != 0 {
                return bad(
                    &field("num_key_value_heads"),
                    format!(
                        "{} must divide num_attention_heads ({})",
                        l.kv_heads, self.heads
                    ),
                );
            }
            if l.rot_pairs > l.head_dim / 2 {
                return bad(
                    &field("rope_parameters.partial_rotary_factor"),
                    format!(
                        "{} rotated pairs exceed head_dim/2 ({})",
                        l.rot_pairs,
                        l.head_dim / 2
                    ),
                );
            }
            if !(l.rope_theta.is_finite() && l.rope_theta > 0.0) {
                return bad(
                    &field("rope_parameters.rope_theta"),
                    format!("{} is not a positive number", l.rope_theta),
                );
            }
        }
        Ok(())
    }

    /// Bytes of weights read per decoded token at the stored dtype (attention + dense MLP + top_k experts + router + norms per layer, + LM head).
    ///
    /// The embedding contributes the one row it reads; the LM head reads the
    /// whole `[vocab, hidden]` table (the embedding itself when tied).
    pub fn bytes_per_token(&self, weight_dtype: DType) -> u64 {
        let h = self.hidden as u64;
        let mut elems: u64 = 0;
        for l in &self.layers {
            let q = (self.heads * l.head_dim) as u64;
            elems += h * l.qkv_rows(self.heads) as u64 + q * h + 2 * l.head_dim as u64;
            elems += 3 * self.intermediate as u64 * h;
            elems += 4 * h + 1; // input, post-attention, pre-ff, post-ff norms; layer_scalar
            if self.enable_moe {
                let e = self.experts as u64;
                let mi = self.moe_inter as u64;
                elems += 3 * h; // the MoE branch's three norms
                elems += e * h + h + e; // router proj, scale, per_expert_scale
                elems += self.top_k as u64 * 3 * mi * h;
            }
        }
        elems += h; // final norm
        elems += h; // the embedding row
        elems += self.vocab as u64 * h; // LM head
        elems * weight_dtype.size() as u64
    }

    /// Bytes of the KV caches a decoded token's attention reads at position
    /// `pos` (keys `0..=pos` seen, the sliding layers' last
    /// `sliding_window` of them): each seen key's K and V rows of every kv
    /// head, in caches of `kv_cache`. With [`Self::bytes_per_token`] the
    /// whole read of a decode step at a long context.
    pub fn kv_bytes_per_token(&self, pos: usize, kv_cache: DType) -> u64 {
        let seen = pos + 1;
        self.layers
            .iter()
            .map(|l| {
                let keys = match l.kind {
                    LayerKind::Full => seen,
                    LayerKind::Sliding => seen.min(self.sliding_window),
                };
                (keys * l.kv_heads * l.head_dim * 2 * kv_cache.size()) as u64
            })
            .sum()
    }

    /// Number of layers.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }
}

/// The object holding the text-decoder fields: the root for `gemma4_text`,
/// `text_config` for the multimodal `gemma4`.
fn select_text_config<'a>(root: &Fields<'a>) -> Result<Fields<'a>> {
    let model_type = root.opt_str("model_type")?;
    let is_causal_lm = root
        .opt_array("architectures")?
        .is_some_and(|a| a.iter().any(|v| v.as_str() == Some("Gemma4ForCausalLM")));
    if let Some(text) = root.opt_object("text_config")? {
        if let Some(mt) = model_type {
            if mt != "gemma4" {
                return Err(root.err(
                    "model_type",
                    format!(
                        "\"{mt}\" is not a Gemma 4 model (expected \"gemma4\" with text_config)"
                    ),
                ));
            }
        }
        let fields = root.nested("text_config", text);
        if let Some(mt) = fields.opt_str("model_type")? {
            if mt != "gemma4_text" {
                return Err(fields.err(
                    "model_type",
                    format!("\"{mt}\" is not a Gemma 4 text decoder (expected \"gemma4_text\")"),
                ));
            }
        }
        return Ok(fields);
    }
    match model_type {
        Some("gemma4_text") => Ok(Fields::new(root.map, root.path, "")),
        Some("gemma4") => Err(root.err(
            "text_config",
            "missing: a multimodal \"gemma4\" config keeps the decoder fields there",
        )),
        Some(mt) => Err(root.err(
            "model_type",
            format!("\"{mt}\" is not a supported model (expected \"gemma4_text\" or \"gemma4\")"),
        )),
        None if is_causal_lm => Ok(Fields::new(root.map, root.path, "")),
        None => Err(root.err(
            "model_type",
            "missing, and `architectures` does not name Gemma4ForCausalLM: not a Gemma 4 config",
        )),
    }
}

/// Rejects the transformers features this runtime does not implement, each
/// with the field that switches it on.
fn reject_unsupported(f: &Fields<'_>) -> Result<()> {
    // transformers defaults this to 256 (per-layer embeddings, the small Gemma 4 models).
    let ple = f.opt_usize("hidden_size_per_layer_input")?.unwrap_or(256);
    if ple > 0 {
        return Err(f.err(
            "hidden_size_per_layer_input",
            format!(
                "{ple}{}: per-layer inputs are not supported (only 0)",
                if f.get("hidden_size_per_layer_input").is_none() {
                    " (transformers' default when absent)"
                } else {
                    ""
                }
            ),
        ));
    }
    if let Some(n) = f.opt_usize("num_kv_shared_layers")? {
        if n > 0 {
            return Err(f.err(
                "num_kv_shared_layers",
                format!("{n}: KV sharing across layers is not supported (only 0)"),
            ));
        }
    }
    if f.opt_bool("attention_bias")? == Some(true) {
        return Err(f.err("attention_bias", "true: attention biases are not supported"));
    }
    if let Some(act) = f.opt_str("hidden_activation")? {
        if act != "gelu_pytorch_tanh" {
            return Err(f.err(
                "hidden_activation",
                format!("\"{act}\" is not supported (only \"gelu_pytorch_tanh\")"),
            ));
        }
    }
    if f.opt_str("use_bidirectional_attention")? == Some("all") {
        return Err(f.err(
            "use_bidirectional_attention",
            "\"all\": bidirectional attention is not supported",
        ));
    }
    Ok(())
}

fn parse_text_config(f: &Fields<'_>, root: &Fields<'_>) -> Result<ModelConfig> {
    reject_unsupported(f)?;
    // (validated here so a checkpoint with a garbage value does not open)
    parse_max_positions(f)?;
    let hidden = f.req_usize("hidden_size")?;
    let n_layers = f.req_usize("num_hidden_layers")?;
    let heads = f.req_usize("num_attention_heads")?;
    let kv_heads = f.req_usize("num_key_value_heads")?;
    let head_dim = f.req_usize("head_dim")?;
    let intermediate = f.req_usize("intermediate_size")?;
    let vocab = f.req_usize("vocab_size")?;
    if n_layers == 0 || n_layers > MAX_LAYERS {
        return Err(f.err(
            "num_hidden_layers",
            format!("{n_layers} is outside 1..={MAX_LAYERS}"),
        ));
    }

    let enable_moe = f.opt_bool("enable_moe_block")?.unwrap_or(false);
    let (experts, top_k, moe_inter) = if enable_moe {
        (
            f.req_usize("num_experts")?,
            f.req_usize("top_k_experts")?,
            f.req_usize("moe_intermediate_size")?,
        )
    } else {
        (0, 0, 0)
    };

    let kinds = parse_layer_types(f, n_layers)?;
    let k_eq_v = f.opt_bool("attention_k_eq_v")?.unwrap_or(false);
    let dims = resolve_attention_dims(f, &kinds, head_dim, kv_heads, k_eq_v)?;
    let rope = parse_rope(f)?;

    let mut layers = Vec::with_capacity(n_layers);
    for (i, (&kind, (head_dim, kv_heads, head_dim_key))) in kinds.iter().zip(dims).enumerate() {
        // (before the rotary pairs are derived from it: a bad head_dim is
        // blamed on the field that set it, not on partial_rotary_factor)
        if head_dim == 0 || head_dim % 2 != 0 || head_dim > MAX_HEAD_DIM {
            return Err(f.err(
                &head_dim_key,
                format!("{head_dim} (layer {i}) must be even and in 2..={MAX_HEAD_DIM}"),
            ));
        }
        let r = match kind {
            LayerKind::Sliding => &rope[0],
            LayerKind::Full => &rope[1],
        };
        let rot_pairs = if r.proportional {
            // transformers: int(partial_rotary_factor * head_dim // 2)
            ((r.partial_factor * head_dim as f64) / 2.0).floor() as usize
        } else {
            head_dim / 2
        };
        if r.proportional && rot_pairs == 0 {
            return Err(f.err(
                &format!("rope_parameters.{}.partial_rotary_factor", kind.name()),
                format!(
                    "{} leaves no rotated pairs on layer {i} (head_dim {head_dim})",
                    r.partial_factor
                ),
            ));
        }
        layers.push(LayerSpec {
            kind,
            head_dim,
            kv_heads,
            rope_theta: r.theta as f32,
            rot_pairs,
            k_eq_v: k_eq_v && kind == LayerKind::Full,
        });
    }

    let eps = f.opt_f64("rms_norm_eps")?.unwrap_or(1e-6) as f32;
    let sliding_window = f.opt_usize("sliding_window")?.unwrap_or(512);
    let final_softcap = f.opt_f64("final_logit_softcapping")?.map(|c| c as f32);
    // The model class reads tie_word_embeddings from the top-level config:
    // Gemma4ForConditionalGeneration ties by `Gemma4Config`, not `text_config`.
    let tie_embeddings = root.opt_bool("tie_word_embeddings")?.unwrap_or(true);
    let eos_token_ids = match root.get("eos_token_id") {
        Some(_) => parse_token_ids(root, "eos_token_id")?,
        None => parse_token_ids(f, "eos_token_id")?,
    };

    Ok(ModelConfig {
        hidden,
        heads,
        layers,
        intermediate,
        enable_moe,
        experts,
        top_k,
        moe_inter,
        vocab,
        sliding_window,
        final_softcap,
        eps,
        tie_embeddings,
        eos_token_ids,
        quantization: super::quantization::parse(root)?,
    })
}

/// `max_position_embeddings`: a positive integer up to [`MAX_POSITIONS`].
fn parse_max_positions(f: &Fields<'_>) -> Result<Option<usize>> {
    let key = "max_position_embeddings";
    match f.opt_usize(key)? {
        Some(n) if n == 0 || n > MAX_POSITIONS => {
            Err(f.err(key, format!("{n} is outside 1..={MAX_POSITIONS}")))
        }
        n => Ok(n),
    }
}

/// A token id field that may be one id or a list of ids (absent or null: none).
fn parse_token_ids(f: &Fields<'_>, key: &str) -> Result<Vec<u32>> {
    let one = |v: &serde_json::Value| -> Result<u32> {
        v.as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| f.err(key, format!("{v} is not a token id")))
    };
    match f.get(key) {
        None | Some(serde_json::Value::Null) => Ok(Vec::new()),
        Some(serde_json::Value::Array(a)) => a.iter().map(one).collect(),
        Some(v) => Ok(vec![one(v)?]),
    }
}

/// A JSON text's top-level object; errors name the file `path`.
fn json_object(text: &str, path: &str) -> Result<serde_json::Map<String, Value>> {
    match serde_json::from_str(text) {
        Ok(Value::Object(root)) => Ok(root),
        Ok(_) => Err(config_err(path, "expected a JSON object at the top level")),
        Err(e) => Err(config_err(path, format!("not valid JSON: {e}"))),
    }
}

/// `layer_types`, or transformers' default (5 sliding then 1 full). As in
/// transformers, a last layer that is not full is forced to full.
fn parse_layer_types(f: &Fields<'_>, n_layers: usize) -> Result<Vec<LayerKind>> {
    let mut kinds = match f.opt_array("layer_types")? {
        None => (0..n_layers)
            .map(|i| {
                if (i + 1) % 6 == 0 {
                    LayerKind::Full
                } else {
                    LayerKind::Sliding
                }
            })
            .collect::<Vec<_>>(),
        Some(list) => {
            if list.len() != n_layers {
                return Err(f.err(
                    "layer_types",
                    format!(
                        "{} entries, but num_hidden_layers is {n_layers}",
                        list.len()
                    ),
                ));
            }
            list.iter()
                .enumerate()
                .map(|(i, v)| match v.as_str() {
                    Some("sliding_attention") => Ok(LayerKind::Sliding),
                    Some("full_attention") => Ok(LayerKind::Full),
                    _ => Err(f.err(
                        &format!("layer_types[{i}]"),
                        format!(
                            "{} is not \"sliding_attention\" or \"full_attention\"",
                            show(v)
                        ),
                    )),
                })
                .collect::<Result<Vec<_>>>()?
        }
    };
    if let Some(last) = kinds.last_mut() {
        *last = LayerKind::Full;
    }
    Ok(kinds)
}

/// Per-layer `(head_dim, kv_heads, the field head_dim came from)`: the
/// global values, overridden either by
/// `per_layer_config` (sparse, keyed by layer index) or, when that is absent,
/// on every full layer by `global_head_dim` (default 512) and, with
/// `attention_k_eq_v`, `num_global_key_value_heads` (transformers' rule).
fn resolve_attention_dims(
    f: &Fields<'_>,
    kinds: &[LayerKind],
    head_dim: usize,
    kv_heads: usize,
    k_eq_v: bool,
) -> Result<Vec<(usize, usize, String)>> {
    let mut dims = vec![(head_dim, kv_heads, "head_dim".to_string()); kinds.len()];
    if let Some(per_layer) = f.opt_object("per_layer_config")? {
        let plc = f.nested("per_layer_config", per_layer);
        for (key, value) in per_layer {
            let idx = key
                .parse::<usize>()
                .ok()
                .filter(|&i| i < kinds.len())
                .ok_or_else(|| {
                    plc.err(
                        key,
                        format!(
                            "not a layer index below num_hidden_layers ({})",
                            kinds.len()
                        ),
                    )
                })?;
            let obj = value.as_object().ok_or_else(|| {
                plc.err(key, format!("expected an object, found {}", show(value)))
            })?;
            let o = plc.nested(key, obj);
            for k in obj.keys() {
                if k != "head_dim" && k != "num_key_value_heads" {
                    return Err(o.err(
                        k,
                        "override not supported (only head_dim, num_key_value_heads)",
                    ));
                }
            }
            if let Some(d) = o.opt_usize("head_dim")? {
                dims[idx].0 = d;
                dims[idx].2 = format!("per_layer_config.{key}.head_dim");
            }
            if let Some(k) = o.opt_usize("num_key_value_heads")? {
                dims[idx].1 = k;
            }
        }
    } else {
        let global_head_dim = f.opt_usize("global_head_dim")?.unwrap_or(512);
        let global_kv = f.opt_usize("num_global_key_value_heads")?;
        for (d, &kind) in dims.iter_mut().zip(kinds) {
            if kind == LayerKind::Full {
                d.0 = global_head_dim;
                d.2 = "global_head_dim".into();
                if k_eq_v {
                    if let Some(k) = global_kv {
                        d.1 = k;
                    }
                }
            }
        }
    }
    Ok(dims)
}

/// One `rope_parameters` entry.
struct Rope {
    theta: f64,
    proportional: bool,
    partial_factor: f64,
}

/// `[sliding, full]` RoPE settings from `rope_parameters`, or transformers'
/// defaults (theta 1e4 default; theta 1e6 proportional with factor 0.25).
fn parse_rope(f: &Fields<'_>) -> Result<[Rope; 2]> {
    let Some(params) = f.opt_object("rope_parameters")? else {
        return Ok([
            Rope {
                theta: 10_000.0,
                proportional: false,
                partial_factor: 1.0,
            },
            Rope {
                theta: 1_000_000.0,
                proportional: true,
                partial_factor: 0.25,
            },
        ]);
    };
    let rp = f.nested("rope_parameters", params);
    let one = |kind: LayerKind| -> Result<Rope> {
        let obj = rp
            .opt_object(kind.name())?
            .ok_or_else(|| rp.err(kind.name(), "missing"))?;
        parse_rope_entry(&rp.nested(kind.name(), obj))
    };
    Ok([one(LayerKind::Sliding)?, one(LayerKind::Full)?])
}

fn parse_rope_entry(e: &Fields<'_>) -> Result<Rope> {
    let rope_type = e.opt_str("rope_type")?.unwrap_or("default");
    let proportional = match rope_type {
        "default" => false,
        "proportional" => true,
        other => {
            return Err(e.err(
                "rope_type",
                format!("\"{other}\" is not supported (only \"default\", \"proportional\")"),
            ))
        }
    };
    let theta = e
        .opt_f64("rope_theta")?
        .ok_or_else(|| e.err("rope_theta", "missing"))?;
    if !(theta > 0.0 && theta <= f32::MAX as f64) {
        return Err(e.err("rope_theta", format!("{theta} is not a positive f32")));
    }
    let partial_factor = e.opt_f64("partial_rotary_factor")?.unwrap_or(1.0);
    if !(partial_factor > 0.0 && partial_factor <= 1.0) {
        return Err(e.err(
            "partial_rotary_factor",
            format!("{partial_factor} is outside (0, 1]"),
        ));
    }
    if let Some(factor) = e.opt_f64("factor")? {
        if factor != 1.0 {
            return Err(e.err(
                "factor",
                format!("{factor}: scaled RoPE is not supported (only 1.0)"),
            ));
        }
    }
    Ok(Rope {
        theta,
        proportional,
        partial_factor,
    })
}
