//! Writes a Hugging Face Gemma 4 checkpoint (bf16 / f16 / f32) as an
//! MLX-layout affine-quantized checkpoint, the way mlx-lm's `convert`
//! (`quantize=True`) writes it: the same tensors (names, dtypes, shapes,
//! bytes), the same `config.json` and `model.safetensors.index.json`, the
//! same shard split (docs/mlx-quantization.md, sections 3-4).
//!
//! What mlx-lm does, step by step, and where it is mirrored here:
//! - `load_config`: config.json, with `generation_config.json`'s
//!   `eos_token_id` put over the config's (`mlx_config`);
//! - builds its Gemma 4 model from that config with its own defaults
//!   (`mlx_params`) and loads the sanitized weights strictly: experts
//!   split to `switch_glu`, the multimodal prefix moved, vision dropped
//!   (`sanitized_name`); a checkpoint that does not fit that model is
//!   refused here by name, as mlx-lm would refuse it;
//! - casts every float to `torch_dtype` / `text_config.dtype`;
//! - `quantize_model` with Gemma 4's predicate (router 8 bits group 64),
//!   skipping a module whose in-dim the default group does not divide;
//! - `save`: shards of at most 5 GiB in the model's parameter order, the
//!   index, config.json (top level sorted, 4-space indent), the tokenizer
//!   and generation files.
//!
//! The source is memory-mapped and read once, module by module; at most one
//! quantized module's output is held in memory.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use indicatif::ProgressBar;

use super::checkpoint::Checkpoint;
use super::tensor_ref::TensorRef;
use crate::dtype::{encode_f32, round_to, DType};
use crate::error::{Error, Result};
use crate::quant::{self, Affine, ScaleType};

mod python_json;
use python_json::Json;

/// mlx-lm's shard limit (`MAX_FILE_SIZE_GB` = 5, in GiB).
pub const MLX_SHARD_BYTES: u64 = 5 << 30;

/// Files beside the weights that are copied as they are: mlx-lm's `save`
/// copies `generation_config.json` and `*.py`, and writes the tokenizer
/// (transformers' `save_pretrained`, whose output for these files is the
/// source's content).
const COPIED: [&str; 8] = [
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
];

/// What one `--override` does to the modules it matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OverrideRule {
    /// Quantize with these bits; `group` None: the default group size.
    Quantize { bits: u32, group: Option<u32> },
    /// Leave in float (mlx-lm's predicate returning False).
    Float,
}

/// A per-module override: `PATTERN=BITS[:GROUP]` or `PATTERN=float`.
/// `PATTERN` is matched against a module's path, either in full
/// (`language_model.model.layers.0.mlp.up_proj`) or below the decoder
/// prefix (`layers.0.mlp.up_proj`, `embed_tokens`, `lm_head`); `*`
/// matches any run of characters, dots included (`layers.*.mlp.*`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Override {
    pub pattern: String,
    pub rule: OverrideRule,
}

fn bad_arg(detail: impl Into<String>) -> Error {
    Error::InvalidInput(detail.into())
}

impl FromStr for Override {
    type Err = Error;

    fn from_str(s: &str) -> Result<Override> {
        let shape = "expected PATTERN=BITS[:GROUP] or PATTERN=float";
        let Some((pattern, value)) = s.rsplit_once('=') else {
            return Err(bad_arg(format!("override `{s}`: {shape}")));
        };
        let (pattern, value) = (pattern.trim(), value.trim());
        if pattern.is_empty() {
            return Err(bad_arg(format!("override `{s}`: empty pattern ({shape})")));
        }
        let rule = if value.eq_ignore_ascii_case("float") {
            OverrideRule::Float
        } else {
            let (b, g) = match value.split_once(':') {
                Some((b, g)) => (b, Some(g)),
                None => (value, None),
            };
            let num = |t: &str, what: &str| {
                t.trim().parse::<u32>().map_err(|_| {
                    bad_arg(format!(
                        "override `{s}`: {what} `{t}` is not a number ({shape})"
                    ))
                })
            };
            let bits = num(b, "bits")?;
            let group = g.map(|g| num(g, "group")).transpose()?;
            Affine::new(bits, group.unwrap_or(64), ScaleType::BF16)
                .map_err(|e| bad_arg(format!("override `{s}`: {}", detail_of(e))))?;
            OverrideRule::Quantize { bits, group }
        };
        Ok(Override {
            pattern: pattern.to_string(),
            rule,
        })
    }
}

/// The message of a config-style error without its path.
fn detail_of(e: Error) -> String {
    match e {
        Error::Config { detail, .. } => detail,
        other => other.to_string(),
    }
}

/// How to quantize.
#[derive(Clone, Debug)]
pub struct QuantizeOptions {
    /// Default bits (mlx-lm's `--q-bits`, default 4).
    pub bits: u32,
    /// Default group size (mlx-lm's `--q-group-size`, default 64). Modules
    /// whose in-dim it does not divide stay in float, as in mlx-lm.
    pub group_size: u32,
    /// Per-module overrides; where several match a module, the last wins.
    pub overrides: Vec<Override>,
    /// Cast every float to this before quantizing (mlx-lm's `--dtype`);
    /// None: the config's `torch_dtype`, else `text_config.dtype`, as mlx-lm.
    pub dtype: Option<DType>,
    /// Write into a non-empty output directory (its old weight files are removed).
    pub force: bool,
    /// Largest shard (mlx-lm: 5 GiB).
    pub max_shard_bytes: u64,
    /// Draw a progress bar on a terminal.
    pub progress: bool,
}

impl Default for QuantizeOptions {
    fn default() -> Self {
        QuantizeOptions {
            bits: 4,
            group_size: 64,
            overrides: Vec::new(),
            dtype: None,
            force: false,
            max_shard_bytes: MLX_SHARD_BYTES,
            progress: false,
        }
    }
}

/// What was written.
#[derive(Clone, Debug, Default)]
pub struct QuantizeReport {
    /// Quantized modules (full path, bits, group) in the model's order.
    pub quantized: Vec<(String, u32, u32)>,
    /// Quantizable modules left in float because the default group does
    /// not divide their in-dim (mlx-lm's rule).
    pub skipped: Vec<String>,
    /// Quantizable modules an override kept in float.
    pub kept_float: Vec<String>,
    /// The dtype every float was cast to, when a cast applied.
    pub cast: Option<DType>,
    /// The safetensors files written.
    pub shards: Vec<String>,
    /// The other files copied from the source.
    pub copied: Vec<String>,
    /// Bytes of all tensors (the index's `total_size`).
    pub total_size: u64,
    /// The index's `total_parameters` (mlx-lm's count).
    pub total_parameters: u64,
}

impl QuantizeReport {
    /// mlx-lm's "bits per weight": tensor bits over parameters.
    pub fn bits_per_weight(&self) -> f64 {
        self.total_size as f64 * 8.0 / self.total_parameters.max(1) as f64
    }
}

/// Quantizes the checkpoint at `src` into `out` (see the module docs).
/// Nothing is written until the source and options have been checked.
pub fn quantize_checkpoint(
    src: &Path,
    out: &Path,
    opts: &QuantizeOptions,
) -> Result<QuantizeReport> {
    Affine::new(opts.bits, opts.group_size, ScaleType::BF16)?;
    if let Some(d) = opts.dtype {
        if !matches!(d, DType::BF16 | DType::F16 | DType::F32) {
            return Err(bad_arg(format!("dtype {d}: expected bf16, f16 or f32")));
        }
    }
    check_out_dir(src, out, opts.force)?;

    let ckpt = Checkpoint::open(src)?;
    let cfg = mlx_config(src)?;
    if ckpt.config().quantization.is_some() || ckpt.is_mlx_layout() {
        return Err(ckpt.err(
            "already in MLX's layout or quantized; quantize a Hugging Face float checkpoint".into(),
        ));
    }
    let params = mlx_params(&cfg)?;
    let cast = opts.dtype.or(cfg.cast);
    let mut report = QuantizeReport {
        cast,
        ..Default::default()
    };
    let plan = plan(&ckpt, &cfg, &params, cast, opts, &mut report)?;

    // Every tensor of the output in parameter order, then mlx-lm's shard split.
    let tensors: Vec<OutTensor> = plan
        .iter()
        .enumerate()
        .flat_map(|(i, m)| m.outputs(i))
        .collect();
    report.total_size = tensors.iter().map(|t| t.nbytes).sum();
    report.total_parameters = plan
        .iter()
        .filter(|m| m.leaf)
        .map(|m| m.numel() as u64)
        .sum();
    let shards = make_shards(&tensors, opts.max_shard_bytes);
    let count = shards.len();
    let shard_name = |i: usize| {
        if count > 1 {
            format!("model-{:05}-of-{count:05}.safetensors", i + 1)
        } else {
            "model.safetensors".to_string()
        }
    };

    prepare_out_dir(out, opts.force)?;
    let total_read: u64 = plan.iter().map(|m| m.src_bytes()).sum();
    let bar = if opts.progress {
        super::weights::progress_bar(total_read, "quantizing")
    } else {
        ProgressBar::hidden()
    };
    let mut producer = Producer {
        plan: &plan,
        cache: None,
        bar: &bar,
    };
    let mut weight_map: Vec<(String, String)> = Vec::new();
    for (i, shard) in shards.iter().enumerate() {
        let name = shard_name(i);
        let part: Vec<&OutTensor> = shard.iter().map(|&k| &tensors[k]).collect();
        write_shard(&out.join(&name), &part, &mut producer)?;
        weight_map.extend(part.iter().map(|t| (t.name.clone(), name.clone())));
        report.shards.push(name);
    }
    bar.finish_and_clear();

    weight_map.sort();
    let index = Json::Obj(vec![
        (
            "metadata".into(),
            Json::Obj(vec![
                ("total_size".into(), Json::int(report.total_size)),
                (
                    "total_parameters".into(),
                    Json::int(report.total_parameters),
                ),
            ]),
        ),
        (
            "weight_map".into(),
            Json::Obj(
                weight_map
                    .into_iter()
                    .map(|(k, f)| (k, Json::Str(f)))
                    .collect(),
            ),
        ),
    ]);
    write_file(
        &out.join("model.safetensors.index.json"),
        index.dump().as_bytes(),
    )?;

    for name in copied_files(src)? {
        let (from, to) = (src.join(&name), out.join(&name));
        std::fs::copy(&from, &to).map_err(|e| Error::io(from.display().to_string(), e))?;
        report.copied.push(name);
    }

    // config.json last: a directory without it is visibly incomplete.
    let config = output_config(cfg.root, &plan, opts);
    write_file(&out.join("config.json"), config.dump().as_bytes())?;
    Ok(report)
}

// ------------------------------------------------------------------------------------------------
// The output directory

fn check_out_dir(src: &Path, out: &Path, force: bool) -> Result<()> {
    let shown = out.display().to_string();
    let err = |detail: &str| Error::Checkpoint {
        path: shown.clone(),
        detail: detail.to_string(),
    };
    if !out.exists() {
        return Ok(());
    }
    if !out.is_dir() {
        return Err(err("the output exists and is not a directory"));
    }
    let same = match (src.canonicalize(), out.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if same {
        return Err(err("the output directory is the source checkpoint"));
    }
    let mut entries = std::fs::read_dir(out).map_err(|e| Error::io(&shown, e))?;
    if entries.next().is_some() && !force {
        return Err(err(
            "the output directory exists and is not empty (--force writes into it, replacing its weights)",
        ));
    }
    Ok(())
}

/// Creates `out`; with `force`, removes the `model*.safetensors` already
/// there: mlx-lm's loader reads every file so named, so a stale shard of an
/// earlier run would be loaded beside the new ones.
fn prepare_out_dir(out: &Path, force: bool) -> Result<()> {
    let shown = out.display().to_string();
    std::fs::create_dir_all(out).map_err(|e| Error::io(&shown, e))?;
    if force {
        for entry in std::fs::read_dir(out).map_err(|e| Error::io(&shown, e))? {
            let entry = entry.map_err(|e| Error::io(&shown, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let stale = name.starts_with("model") && name.ends_with(".safetensors");
            if stale && entry.path().is_file() {
                std::fs::remove_file(entry.path())
                    .map_err(|e| Error::io(entry.path().display().to_string(), e))?;
            }
        }
    }
    Ok(())
}

/// The non-weight files to copy: [`COPIED`] and `*.py`, those present.
fn copied_files(src: &Path) -> Result<Vec<String>> {
    let mut names: Vec<String> = COPIED
        .iter()
        .filter(|n| src.join(n).is_file())
        .map(|n| n.to_string())
        .collect();
    let shown = src.display().to_string();
    let mut py = Vec::new();
    for entry in std::fs::read_dir(src).map_err(|e| Error::io(&shown, e))? {
        let entry = entry.map_err(|e| Error::io(&shown, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".py") && !name.starts_with('.') && entry.path().is_file() {
            py.push(name);
        }
    }
    py.sort();
    names.extend(py);
    Ok(names)
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes).map_err(|e| Error::io(path.display().to_string(), e))
}

// ------------------------------------------------------------------------------------------------
// config.json as mlx-lm reads it

/// The source config as mlx-lm holds it after `load`.
struct MlxConfig {
    path: String,
    /// The whole config.json (ordered, as Python's dict keeps it).
    root: Json,
    /// `gemma4` (the multimodal wrapper, prefix `language_model.model.`)
    /// or `gemma4_text` (prefix `model.`).
    wrapper: bool,
    /// The dtype `convert` casts to, from the config.
    cast: Option<DType>,
}

impl MlxConfig {
    /// The object mlx-lm's gemma4_text `ModelArgs` is built from.
    fn text_args(&self) -> &Json {
        if self.wrapper {
            self.root.get("text_config").unwrap_or(&Json::Null)
        } else {
            &self.root
        }
    }

    fn err(&self, detail: impl Into<String>) -> Error {
        Error::Config {
            path: self.path.clone(),
            detail: detail.into(),
        }
    }
}

fn mlx_config(src: &Path) -> Result<MlxConfig> {
    let path = src.join("config.json");
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&shown, e))?;
    let config_err = |detail: String| Error::Config {
        path: shown.clone(),
        detail,
    };
    let mut root = Json::parse(&text).map_err(|e| config_err(format!("not valid JSON: {e}")))?;
    if !matches!(root, Json::Obj(_)) {
        return Err(config_err("expected a JSON object at the top level".into()));
    }
    let text_config_quantized = root
        .get("text_config")
        .is_some_and(|t| t.get("quantization_config").is_some());
    if root.get("quantization").is_some()
        || root.get("quantization_config").is_some()
        || text_config_quantized
    {
        return Err(config_err(
            "the checkpoint is already quantized (config.json has a quantization block)".into(),
        ));
    }

    // load_config: a truthy eos_token_id of generation_config.json replaces
    // the config's (an unreadable generation config is ignored, as there).
    let gen = src.join("generation_config.json");
    if let Ok(g) = std::fs::read_to_string(&gen) {
        if let Ok(g) = Json::parse(&g) {
            if let Some(eos) = g.get("eos_token_id").filter(|v| v.truthy()) {
                root.set("eos_token_id", eos.clone());
            }
        }
    }

    let known = "mlx-lm's Gemma 4 models are \"gemma4\" and \"gemma4_text\"";
    let wrapper = match root.get("model_type").and_then(Json::as_str) {
        Some("gemma4") => true,
        Some("gemma4_text") => false,
        Some(other) => return Err(config_err(format!("model_type \"{other}\": {known}"))),
        None => {
            return Err(config_err(format!(
                "no model_type, by which mlx-lm picks its model class ({known})"
            )))
        }
    };
    if wrapper {
        // gemma4.ModelArgs.__post_init__ writes into the very text_config
        // dict that is saved: the top-level vocab_size (default 262144) and
        // two head counts when absent.
        let vocab = root
            .get("vocab_size")
            .cloned()
            .unwrap_or_else(|| Json::int(262_144));
        let Some(t @ Json::Obj(_)) = root.get_mut("text_config") else {
            return Err(config_err(
                "model_type \"gemma4\" without a text_config object".into(),
            ));
        };
        t.set("vocab_size", vocab);
        for (k, d) in [("num_attention_heads", 8), ("num_key_value_heads", 1)] {
            if t.get(k).is_none() {
                t.set(k, Json::int(d));
            }
        }
    }

    // convert: torch_dtype, else text_config.dtype; only these three cast.
    let named = match root.get("torch_dtype") {
        Some(v) if !matches!(v, Json::Null) => Some(v),
        _ => root
            .get("text_config")
            .filter(|t| t.truthy())
            .and_then(|t| t.get("dtype")),
    };
    let cast = match named.and_then(Json::as_str) {
        Some("bfloat16") => Some(DType::BF16),
        Some("float16") => Some(DType::F16),
        Some("float32") => Some(DType::F32),
        _ => None,
    };
    Ok(MlxConfig {
        path: shown,
        root,
        wrapper,
        cast,
    })
}

/// What kind of parameter of mlx-lm's model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// The weight of a Linear, Embedding or SwitchLinear: quantizable.
    Quantizable,
    /// Any other float parameter (norms, router scales, layer_scalar).
    Float,
}

/// One parameter of mlx-lm's Gemma 4 model, in its parameter order.
struct Param {
    /// Full name (`model.layers.0.mlp.up_proj.weight`).
    name: String,
    shape: Vec<usize>,
    kind: Kind,
    /// Held by a leaf module (counted in `total_parameters`); the router's
    /// scales and `layer_scalar` belong to modules with children and are not.
    leaf: bool,
}

/// Python's truthiness of a JSON value.
fn arg_bool(t: &Json, key: &str, default: bool) -> bool {
    t.get(key).map_or(default, Json::truthy)
}

/// mlx-lm's gemma4_text model's parameters for this config, built with its
/// `ModelArgs` defaults (which differ from transformers' in places: a
/// config that leans on them gets a model that does not match the weights).
fn mlx_params(cfg: &MlxConfig) -> Result<Vec<Param>> {
    let t = cfg.text_args();
    let where_ = if cfg.wrapper { "text_config." } else { "" };
    // An int field: its default when absent; None for null.
    let int = |key: &str, default: Option<u64>| -> Result<Option<u64>> {
        match t.get(key) {
            None => Ok(default),
            Some(Json::Null) => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| {
                cfg.err(format!(
                    "{where_}{key}: {} is not a non-negative integer",
                    v.dump()
                ))
            }),
        }
    };
    let need = |key: &str, default: Option<u64>| -> Result<usize> {
        int(key, default)?.map(|v| v as usize).ok_or_else(|| {
            cfg.err(format!(
                "{where_}{key}: mlx-lm's Gemma 4 model needs a value"
            ))
        })
    };
    let h = need("hidden_size", Some(1536))?;
    let n = need("num_hidden_layers", Some(35))?;
    let inter = need("intermediate_size", Some(6144))?;
    let heads = need("num_attention_heads", Some(8))?;
    let head_dim = need("head_dim", Some(256))?;
    let global_head_dim = int("global_head_dim", Some(512))?.filter(|&d| d > 0);
    let vocab = need("vocab_size", Some(262_144))?;
    let kv_heads = need("num_key_value_heads", Some(1))?;
    let global_kv = int("num_global_key_value_heads", None)?;
    let shared = need("num_kv_shared_layers", Some(20))?;
    let ple = int("hidden_size_per_layer_input", Some(256))?.unwrap_or(0);
    let k_eq_v = arg_bool(t, "attention_k_eq_v", false);
    let double_wide = arg_bool(t, "use_double_wide_mlp", true);
    let moe = arg_bool(t, "enable_moe_block", false);
    let tie = arg_bool(t, "tie_word_embeddings", true);
    if ple > 0 {
        return Err(cfg.err(format!(
            "{where_}hidden_size_per_layer_input {ple} (mlx-lm's default 256 when absent): \
             per-layer inputs are not supported"
        )));
    }
    let layer_types: Vec<String> = match t.get("layer_types") {
        Some(Json::Arr(a)) => a
            .iter()
            .map(|v| v.as_str().unwrap_or_default().to_string())
            .collect(),
        _ => {
            let p = need("sliding_window_pattern", Some(5))?.max(1);
            (0..n)
                .map(|i| {
                    if i % p == p - 1 {
                        "full_attention".to_string()
                    } else {
                        "sliding_attention".to_string()
                    }
                })
                .collect()
        }
    };
    if layer_types.len() < n {
        return Err(cfg.err(format!(
            "{where_}layer_types: {} entries for {n} layers",
            layer_types.len()
        )));
    }
    let (experts, moe_inter) = if moe {
        (
            need("num_experts", None)?,
            need("moe_intermediate_size", None)?,
        )
    } else {
        (0, 0)
    };

    let top = if cfg.wrapper { "language_model." } else { "" };
    let p = format!("{top}model.");
    let mut ps = Params(Vec::new());
    ps.q(format!("{p}embed_tokens"), &[vocab, h]);
    let first_shared = n as i64 - shared as i64;
    for (i, ty) in layer_types.iter().take(n).enumerate() {
        let l = format!("{p}layers.{i}.");
        let sliding = ty == "sliding_attention";
        let hd = match global_head_dim {
            Some(g) if ty == "full_attention" => g as usize,
            _ => head_dim,
        };
        let kev = k_eq_v && !sliding;
        let nkv = match global_kv {
            Some(g) if kev => g as usize,
            _ => kv_heads,
        };
        let has_kv = (i as i64) < first_shared;
        let a = format!("{l}self_attn.");
        ps.q(format!("{a}q_proj"), &[heads * hd, h]);
        if has_kv {
            ps.q(format!("{a}k_proj"), &[nkv * hd, h]);
            if !kev {
                ps.q(format!("{a}v_proj"), &[nkv * hd, h]);
            }
        }
        ps.q(format!("{a}o_proj"), &[h, heads * hd]);
        ps.f(format!("{a}q_norm.weight"), &[hd], true);
        if has_kv {
            ps.f(format!("{a}k_norm.weight"), &[hd], true);
        }
        let kv_shared_layer = i as i64 >= first_shared && first_shared > 0;
        let im = inter * if double_wide && kv_shared_layer { 2 } else { 1 };
        ps.q(format!("{l}mlp.gate_proj"), &[im, h]);
        ps.q(format!("{l}mlp.down_proj"), &[h, im]);
        ps.q(format!("{l}mlp.up_proj"), &[im, h]);
        for norm in [
            "input",
            "post_attention",
            "pre_feedforward",
            "post_feedforward",
        ] {
            ps.f(format!("{l}{norm}_layernorm.weight"), &[h], true);
        }
        if moe {
            ps.q(format!("{l}router.proj"), &[experts, h]);
            ps.f(format!("{l}router.scale"), &[h], false);
            ps.f(format!("{l}router.per_expert_scale"), &[experts], false);
            let s = format!("{l}experts.switch_glu.");
            ps.q(format!("{s}gate_proj"), &[experts, moe_inter, h]);
            ps.q(format!("{s}up_proj"), &[experts, moe_inter, h]);
            ps.q(format!("{s}down_proj"), &[experts, h, moe_inter]);
            for norm in [
                "post_feedforward_layernorm_1",
                "post_feedforward_layernorm_2",
            ] {
                ps.f(format!("{l}{norm}.weight"), &[h], true);
            }
            ps.f(format!("{l}pre_feedforward_layernorm_2.weight"), &[h], true);
        }
        ps.f(format!("{l}layer_scalar"), &[1], false);
    }
    ps.f(format!("{p}norm.weight"), &[h], true);
    if !tie {
        ps.q(format!("{top}lm_head"), &[vocab, h]);
    }
    Ok(ps.0)
}

/// The parameter list being built, in order.
struct Params(Vec<Param>);

impl Params {
    /// The weight of the quantizable module `path`.
    fn q(&mut self, path: String, shape: &[usize]) {
        self.0.push(Param {
            name: format!("{path}.weight"),
            shape: shape.to_vec(),
            kind: Kind::Quantizable,
            leaf: true,
        });
    }

    /// A float parameter; `leaf`: its module has no children.
    fn f(&mut self, name: String, shape: &[usize], leaf: bool) {
        self.0.push(Param {
            name,
            shape: shape.to_vec(),
            kind: Kind::Float,
            leaf,
        });
    }
}

/// The fields whose mlx-lm defaults (when absent) shape its model, for the
/// message when the model does not match the weights.
fn defaults_used(cfg: &MlxConfig) -> String {
    let t = cfg.text_args();
    let d = [
        ("num_kv_shared_layers", "20"),
        ("global_head_dim", "512"),
        ("num_global_key_value_heads", "num_key_value_heads"),
        ("attention_k_eq_v", "false"),
        ("enable_moe_block", "false"),
        ("use_double_wide_mlp", "true"),
        ("tie_word_embeddings", "true"),
        ("layer_types", "4 sliding then 1 full"),
    ];
    let absent: Vec<String> = d
        .iter()
        .filter(|(k, _)| t.get(k).is_none())
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    if absent.is_empty() {
        String::new()
    } else {
        let where_ = if cfg.wrapper { " text_config" } else { "" };
        format!(
            " (absent from{where_}, so mlx-lm's defaults apply: {}; set them in config.json)",
            absent.join(", ")
        )
    }
}

/// A source tensor's name after mlx-lm's `sanitize` (gemma4 wrapper, then
/// gemma4_text), with the part of it the name takes; None: dropped.
fn sanitized_name(full: &str, wrapper: bool) -> Option<(String, Part)> {
    let mut k = full.to_string();
    if wrapper {
        let had_model = k.starts_with("model.");
        let rest = k.strip_prefix("model.").unwrap_or(&k).to_string();
        const DROPPED: [&str; 6] = [
            "vision_tower",
            "multi_modal_projector",
            "audio_tower",
            "embed_audio",
            "embed_vision",
            "vision_embedder",
        ];
        if DROPPED.iter().any(|d| rest.starts_with(d)) {
            return None;
        }
        k = if had_model && rest.starts_with("language_model") {
            rest.replace("language_model.", "language_model.model.")
        } else {
            rest
        };
    }
    const SKIPPED: [&str; 5] = [
        "self_attn.rotary_emb",
        "input_max",
        "input_min",
        "output_max",
        "output_min",
    ];
    if SKIPPED.iter().any(|s| k.contains(s)) {
        return None;
    }
    // mlx-lm also drops the k/v projections of the layers it takes for
    // KV-shared (num_kv_shared_layers, default 20); those stay here, so a
    // config that leans on that default is refused as a mismatch rather
    // than written without them.
    if let Some(base) = k.strip_suffix(".experts.gate_up_proj") {
        // Two parameters from one tensor: the caller asks for each half.
        return Some((
            format!("{base}.experts.switch_glu.gate_proj.weight"),
            Part::Gate,
        ));
    }
    if let Some(base) = k.strip_suffix(".experts.down_proj") {
        return Some((
            format!("{base}.experts.switch_glu.down_proj.weight"),
            Part::Whole,
        ));
    }
    Some((k, Part::Whole))
}

// ------------------------------------------------------------------------------------------------
// The plan: one entry per parameter of mlx-lm's model

/// Which rows of the source tensor a parameter takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    Whole,
    /// `experts.gate_up_proj[:, :Im, :]`
    Gate,
    /// `experts.gate_up_proj[:, Im:, :]`
    Up,
}

struct Module {
    /// The parameter's full name (`...q_proj.weight`).
    name: String,
    /// Its module's path (the name without `.weight`): the config key.
    path: String,
    src: TensorRef,
    part: Part,
    /// The parameter's (float) shape.
    shape: Vec<usize>,
    /// The float dtype after the cast: the stored dtype of a float
    /// parameter, of a quantized one's scales and biases.
    dtype: DType,
    quant: Option<Affine>,
    /// A config entry `{"group_size", "bits"}` (the predicate returned a dict).
    listed: bool,
    leaf: bool,
}

/// One tensor of the output.
struct OutTensor {
    name: String,
    dtype: &'static str,
    shape: Vec<usize>,
    nbytes: u64,
    module: usize,
    /// 0: weight (or the float parameter), 1: scales, 2: biases.
    part: usize,
}

fn st_dtype(d: DType) -> &'static str {
    match d {
        DType::BF16 => "BF16",
        DType::F16 => "F16",
        DType::F32 => "F32",
        _ => "U32",
    }
}

impl Module {
    fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    fn cols(&self) -> usize {
        self.shape.last().copied().unwrap_or(0)
    }

    /// Bytes of the source this parameter reads.
    fn src_bytes(&self) -> u64 {
        (self.numel() * self.src.dtype.size()) as u64
    }

    /// Source rows (start, count) in order.
    fn row_ranges(&self) -> Vec<(usize, usize)> {
        let cols = self.cols().max(1);
        match self.part {
            Part::Whole => vec![(0, self.numel() / cols)],
            Part::Gate | Part::Up => {
                let (e, rows) = (self.shape[0], self.shape[1]);
                let off = if self.part == Part::Up { rows } else { 0 };
                (0..e).map(|i| (i * 2 * rows + off, rows)).collect()
            }
        }
    }

    fn outputs(&self, module: usize) -> Vec<OutTensor> {
        let t = |name: String, dtype, shape: Vec<usize>, nbytes: usize, part| OutTensor {
            name,
            dtype,
            shape,
            nbytes: nbytes as u64,
            module,
            part,
        };
        let Some(a) = self.quant else {
            let nbytes = self.numel() * self.dtype.size();
            return vec![t(
                self.name.clone(),
                st_dtype(self.dtype),
                self.shape.clone(),
                nbytes,
                0,
            )];
        };
        let lead = &self.shape[..self.shape.len() - 1];
        let rows: usize = lead.iter().product();
        let cols = self.cols();
        let words = cols * a.bits as usize / 32;
        let groups = cols / a.group as usize;
        let with = |last: usize| [lead, &[last]].concat();
        let sd = st_dtype(self.dtype);
        let ss = groups * rows * self.dtype.size();
        vec![
            t(
                format!("{}.weight", self.path),
                "U32",
                with(words),
                rows * words * 4,
                0,
            ),
            t(format!("{}.scales", self.path), sd, with(groups), ss, 1),
            t(format!("{}.biases", self.path), sd, with(groups), ss, 2),
        ]
    }
}

/// Whole-string match with `*` standing for any run of characters.
fn glob(pattern: &str, s: &str) -> bool {
    let (p, s) = (pattern.as_bytes(), s.as_bytes());
    let (mut pi, mut si) = (0, 0);
    let mut back: Option<(usize, usize)> = None;
    while si < s.len() {
        if pi < p.len() && p[pi] == b'*' {
            back = Some((pi, si));
            pi += 1;
        } else if pi < p.len() && p[pi] == s[si] {
            pi += 1;
            si += 1;
        } else if let Some((bp, bs)) = back {
            pi = bp + 1;
            si = bs + 1;
            back = Some((bp, bs + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

fn plan(
    ckpt: &Checkpoint,
    cfg: &MlxConfig,
    params: &[Param],
    cast: Option<DType>,
    opts: &QuantizeOptions,
    report: &mut QuantizeReport,
) -> Result<Vec<Module>> {
    // Every language-model tensor of the file under its sanitized name.
    let names = RefCell::new(Vec::new());
    ckpt.has_tensor_where(|name| {
        names.borrow_mut().push(name.to_string());
        false
    });
    let mut names = names.into_inner();
    names.sort();
    let mut sources: HashMap<String, (String, Part)> = HashMap::new();
    for name in &names {
        let full = ckpt.full_name(name);
        let Some((s, part)) = sanitized_name(&full, cfg.wrapper) else {
            continue;
        };
        if part == Part::Gate {
            let up = s.replace(".switch_glu.gate_proj.", ".switch_glu.up_proj.");
            sources.insert(up, (name.clone(), Part::Up));
        }
        sources.insert(s, (name.clone(), part));
    }
    let wanted: HashSet<&str> = params.iter().map(|p| p.name.as_str()).collect();
    let mut extra: Vec<&String> = sources
        .keys()
        .filter(|k| !wanted.contains(k.as_str()))
        .collect();
    extra.sort();
    if let Some(x) = extra.first() {
        let from = &sources[*x].0;
        return Err(ckpt.err(format!(
            "tensor `{}` (`{x}` to mlx-lm) is not a parameter of mlx-lm's model for this config.json{}",
            ckpt.full_name(from),
            defaults_used(cfg)
        )));
    }

    let default = (opts.bits, opts.group_size);
    let prefix = if cfg.wrapper {
        "language_model.model."
    } else {
        "model."
    };
    let mut used = vec![false; opts.overrides.len()];
    let mut plan = Vec::with_capacity(params.len());
    for p in params {
        let Some((from, part)) = sources.get(&p.name) else {
            return Err(ckpt.err(format!(
                "mlx-lm's model for this config.json has `{}` {:?}, which no tensor of the checkpoint gives{}",
                p.name,
                p.shape,
                defaults_used(cfg)
            )));
        };
        let src = ckpt.tensor(from)?;
        let full = ckpt.full_name(from);
        if !src.dtype.is_float() || src.dtype.is_quantized() {
            return Err(ckpt.err(format!(
                "tensor `{full}`: dtype {}, expected bf16, f16 or f32",
                src.dtype
            )));
        }
        let mut shape = src.shape.clone();
        if *part != Part::Whole {
            if shape.len() != 3 || shape[1] % 2 != 0 {
                return Err(ckpt.err(format!(
                    "tensor `{full}`: shape {shape:?}, expected [experts, 2 * moe_intermediate_size, hidden]"
                )));
            }
            shape[1] /= 2;
        }
        if shape != p.shape {
            return Err(ckpt.err(format!(
                "tensor `{full}`: shape {:?} (as `{}`), but mlx-lm's model for this config.json has {:?}{}",
                shape,
                p.name,
                p.shape,
                defaults_used(cfg)
            )));
        }
        let dtype = cast.unwrap_or(src.dtype);
        let path = p
            .name
            .strip_suffix(".weight")
            .unwrap_or(&p.name)
            .to_string();
        let mut m = Module {
            name: p.name.clone(),
            path,
            src,
            part: *part,
            shape,
            dtype,
            quant: None,
            listed: false,
            leaf: p.leaf,
        };
        if p.kind == Kind::Quantizable {
            decide(&mut m, prefix, default, opts, &mut used, report)?;
        }
        plan.push(m);
    }
    if let Some(i) = used.iter().position(|u| !u) {
        return Err(bad_arg(format!(
            "override `{}` matches no quantizable module (paths look like `layers.0.self_attn.q_proj`, \
             `layers.*.mlp.*`, `embed_tokens`, or in full `{prefix}layers.0.router.proj`)",
            opts.overrides[i].pattern
        )));
    }
    Ok(plan)
}

/// mlx-lm's `wrapped_predicate` around Gemma 4's rule, with the overrides
/// in front of the rule: whether and how module `m` is quantized.
fn decide(
    m: &mut Module,
    prefix: &str,
    default: (u32, u32),
    opts: &QuantizeOptions,
    used: &mut [bool],
    report: &mut QuantizeReport,
) -> Result<()> {
    let short = m.path.strip_prefix(prefix).unwrap_or(&m.path);
    let mut rule = None;
    for (i, o) in opts.overrides.iter().enumerate() {
        if glob(&o.pattern, &m.path) || glob(&o.pattern, short) {
            used[i] = true;
            rule = Some(o.rule);
        }
    }
    let cols = m.cols();
    // mlx-lm checks the default group before asking the predicate.
    if cols % default.1 as usize != 0 {
        report.skipped.push(m.path.clone());
        return Ok(());
    }
    let (bits, group, listed) = match rule {
        Some(OverrideRule::Float) => {
            report.kept_float.push(m.path.clone());
            return Ok(());
        }
        Some(OverrideRule::Quantize { bits, group }) => (bits, group.unwrap_or(default.1), true),
        // gemma4_text.Model.quant_predicate
        None if m.path.ends_with("router.proj") => (8, 64, true),
        None => (default.0, default.1, false),
    };
    if cols % group as usize != 0 {
        return Err(bad_arg(format!(
            "`{}`: in-dim {cols} is not a multiple of group {group} (mx.quantize refuses it)",
            m.path
        )));
    }
    let scales = ScaleType::from_dtype(m.dtype).expect("a float dtype");
    m.quant = Some(Affine::new(bits, group, scales)?);
    m.listed = listed;
    report.quantized.push((m.path.clone(), bits, group));
    Ok(())
}

/// config.json as mlx-lm's `quantize_model` and `save_config` write it.
fn output_config(mut root: Json, plan: &[Module], opts: &QuantizeOptions) -> Json {
    let mut q = vec![
        ("group_size".to_string(), Json::int(opts.group_size as u64)),
        ("bits".to_string(), Json::int(opts.bits as u64)),
        ("mode".to_string(), Json::Str("affine".into())),
    ];
    for m in plan.iter().filter(|m| m.listed) {
        let a = m.quant.expect("listed modules are quantized");
        q.push((
            m.path.clone(),
            Json::Obj(vec![
                ("group_size".into(), Json::int(a.group as u64)),
                ("bits".into(), Json::int(a.bits as u64)),
            ]),
        ));
    }
    root.set("quantization", Json::Obj(q.clone()));
    root.remove("_name_or_path");
    root.remove("vision_config");
    root.set("quantization_config", Json::Obj(q));
    if let Json::Obj(fields) = &mut root {
        // Python's sorted() on str keys: code point order, which is byte order in UTF-8.
        fields.sort_by(|a, b| a.0.cmp(&b.0));
    }
    root
}

// ------------------------------------------------------------------------------------------------
// Shards and their bytes

/// mlx-lm's `make_shards`: tensors in order, a new shard when the next one
/// would pass `max` (so a first tensor over `max` leaves an empty shard).
fn make_shards(tensors: &[OutTensor], max: u64) -> Vec<Vec<usize>> {
    let mut shards = Vec::new();
    let (mut cur, mut size) = (Vec::new(), 0u64);
    for (i, t) in tensors.iter().enumerate() {
        if size + t.nbytes > max {
            shards.push(std::mem::take(&mut cur));
            size = 0;
        }
        cur.push(i);
        size += t.nbytes;
    }
    shards.push(cur);
    shards
}

/// Computes each tensor's bytes; the scales and biases of the module last
/// quantized wait here for their turn (they follow its weight).
struct Producer<'a> {
    plan: &'a [Module],
    cache: Option<(usize, [Vec<u8>; 3])>,
    bar: &'a ProgressBar,
}

impl Producer<'_> {
    fn write(&mut self, t: &OutTensor, w: &mut impl Write, path: &str) -> Result<()> {
        let io = |e| Error::io(path, e);
        let m = &self.plan[t.module];
        if m.quant.is_none() {
            return write_float(m, w, self.bar).map_err(io);
        }
        if self.cache.as_ref().is_none_or(|c| c.0 != t.module) {
            self.cache = Some((t.module, quantize_module(m, self.bar)));
        }
        let (_, parts) = self.cache.as_mut().expect("just filled");
        let bytes = std::mem::take(&mut parts[t.part]);
        if bytes.len() as u64 != t.nbytes {
            // Written once per part: a second request would be a bug here.
            return Err(Error::io(
                path,
                std::io::Error::other(format!(
                    "`{}`: computed size differs from the header",
                    t.name
                )),
            ));
        }
        w.write_all(&bytes).map_err(io)
    }
}

fn write_shard(path: &Path, tensors: &[&OutTensor], producer: &mut Producer<'_>) -> Result<()> {
    let shown = path.display().to_string();
    let mut sorted: Vec<&OutTensor> = tensors.to_vec();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let mut offsets = HashMap::new();
    let mut at = 0u64;
    for t in tensors {
        offsets.insert(t.name.as_str(), at);
        at += t.nbytes;
    }
    // mlx's header: compact JSON, keys sorted (metadata among them), each
    // entry's keys sorted too. Padded with spaces to 8 bytes, as the
    // safetensors format allows, so the data starts aligned.
    let mut entries: Vec<(String, String)> =
        vec![("__metadata__".into(), r#"{"format":"mlx"}"#.into())];
    for t in &sorted {
        let o = offsets[t.name.as_str()];
        let shape: Vec<String> = t.shape.iter().map(|d| d.to_string()).collect();
        entries.push((
            t.name.clone(),
            format!(
                r#"{{"data_offsets":[{o},{}],"dtype":"{}","shape":[{}]}}"#,
                o + t.nbytes,
                t.dtype,
                shape.join(",")
            ),
        ));
    }
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    let body: Vec<String> = entries
        .iter()
        .map(|(k, v)| format!("{}:{v}", Json::Str(k.clone()).dump()))
        .collect();
    let mut header = format!("{{{}}}", body.join(","));
    while header.len() % 8 != 0 {
        header.push(' ');
    }

    let partial = PathBuf::from(format!("{shown}.partial"));
    let partial_shown = partial.display().to_string();
    let file = File::create(&partial).map_err(|e| Error::io(&partial_shown, e))?;
    let mut w = BufWriter::with_capacity(1 << 22, file);
    let io = |e| Error::io(&partial_shown, e);
    w.write_all(&(header.len() as u64).to_le_bytes())
        .map_err(io)?;
    w.write_all(header.as_bytes()).map_err(io)?;
    for t in tensors {
        producer.write(t, &mut w, &partial_shown)?;
    }
    let file = w
        .into_inner()
        .map_err(|e| Error::io(&partial_shown, e.into_error()))?;
    file.sync_all().map_err(io)?;
    drop(file);
    std::fs::rename(&partial, path).map_err(|e| Error::io(&shown, e))
}

/// Rows per batch a worker decodes and quantizes at once (about 4 MB of f32).
const BATCH_ELEMS: usize = 1 << 20;

/// Decodes `rows` rows of `cols` from `bytes` (of `from`) at row `start`
/// into f32, rounded to `to` first when that differs (mlx-lm's cast).
fn decode_rows(
    bytes: &[u8],
    from: DType,
    to: DType,
    cols: usize,
    start: usize,
    rows: usize,
    out: &mut Vec<f32>,
) {
    let sz = from.size();
    let b = &bytes[start * cols * sz..(start + rows) * cols * sz];
    out.clear();
    match from {
        DType::BF16 => out.extend(
            b.chunks_exact(2)
                .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16)),
        ),
        DType::F16 => out.extend(
            b.chunks_exact(2)
                .map(|c| half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32()),
        ),
        _ => out.extend(
            b.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        ),
    }
    if to != from {
        for v in out.iter_mut() {
            *v = round_to(to, *v);
        }
    }
}

fn write_float(m: &Module, w: &mut impl Write, bar: &ProgressBar) -> std::io::Result<()> {
    let bytes = m.src.bytes.as_slice();
    let cols = m.cols().max(1);
    let sz = m.src.dtype.size();
    let mut vals = Vec::new();
    for (start, rows) in m.row_ranges() {
        if m.dtype == m.src.dtype {
            w.write_all(&bytes[start * cols * sz..(start + rows) * cols * sz])?;
            bar.inc((rows * cols * sz) as u64);
            continue;
        }
        let step = (BATCH_ELEMS / cols).max(1);
        let mut r = 0;
        while r < rows {
            let k = step.min(rows - r);
            decode_rows(bytes, m.src.dtype, m.dtype, cols, start + r, k, &mut vals);
            w.write_all(&encode_f32(m.dtype, &vals))?;
            bar.inc((k * cols * sz) as u64);
            r += k;
        }
    }
    Ok(())
}

/// A quantized module's (words, scales, biases) bytes. Rows are quantized
/// independently (a row is whole groups and whole words), so the rows are
/// split across threads and the parts joined in order.
fn quantize_module(m: &Module, bar: &ProgressBar) -> [Vec<u8>; 3] {
    let a = m.quant.expect("a quantized module");
    let cols = m.cols();
    let rows: Vec<usize> = m
        .row_ranges()
        .into_iter()
        .flat_map(|(s, n)| s..s + n)
        .collect();
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(rows.len().div_ceil((BATCH_ELEMS / cols.max(1)).max(1)))
        .max(1);
    let per = rows.len().div_ceil(threads).max(1);
    let bytes = m.src.bytes.as_slice();
    let (from, to) = (m.src.dtype, m.dtype);
    let work = |chunk: &[usize]| -> [Vec<u8>; 3] {
        let mut out: [Vec<u8>; 3] = Default::default();
        let mut vals = Vec::new();
        let mut batch = Vec::with_capacity(BATCH_ELEMS);
        let step = (BATCH_ELEMS / cols.max(1)).max(1);
        for rs in chunk.chunks(step) {
            batch.clear();
            // Consecutive source rows decode in one run.
            let mut i = 0;
            while i < rs.len() {
                let mut j = i + 1;
                while j < rs.len() && rs[j] == rs[j - 1] + 1 {
                    j += 1;
                }
                decode_rows(bytes, from, to, cols, rs[i], j - i, &mut vals);
                batch.extend_from_slice(&vals);
                i = j;
            }
            let q = quant::quantize(&batch, a.bits, a.group as usize);
            out[0].extend_from_slice(bytemuck::cast_slice(&q.words));
            out[1].extend(encode_f32(to, &q.scales));
            out[2].extend(encode_f32(to, &q.biases));
            bar.inc((rs.len() * cols * from.size()) as u64);
        }
        out
    };
    let work = &work;
    let parts: Vec<[Vec<u8>; 3]> = if threads == 1 {
        vec![work(&rows)]
    } else {
        std::thread::scope(|s| {
            let handles: Vec<_> = rows.chunks(per).map(|c| s.spawn(move || work(c))).collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
                .collect()
        })
    };
    let mut out: [Vec<u8>; 3] = Default::default();
    for p in parts {
        for (o, b) in out.iter_mut().zip(p) {
            o.extend_from_slice(&b);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_whole_paths() {
        assert!(glob("layers.*.mlp.*", "layers.10.mlp.up_proj"));
        assert!(glob("*router.proj", "model.layers.0.router.proj"));
        assert!(glob("embed_tokens", "embed_tokens"));
        assert!(!glob("embed_tokens", "embed_tokens_per_layer"));
        assert!(!glob("layers.1.*", "layers.10.mlp.up_proj") || glob("layers.1*", "layers.10"));
        assert!(glob("a*b*c", "aXbYbZc") && !glob("a*b*c", "aXbYbZ"));
    }

    #[test]
    fn overrides_parse_or_say_why_not() {
        let o: Override = "layers.*.mlp.*=8:64".parse().unwrap();
        assert_eq!(o.pattern, "layers.*.mlp.*");
        assert_eq!(
            o.rule,
            OverrideRule::Quantize {
                bits: 8,
                group: Some(64)
            }
        );
        let o: Override = "embed_tokens=6".parse().unwrap();
        assert_eq!(
            o.rule,
            OverrideRule::Quantize {
                bits: 6,
                group: None
            }
        );
        let o: Override = "lm_head=float".parse().unwrap();
        assert_eq!(o.rule, OverrideRule::Float);
        for bad in ["embed_tokens", "=4", "x=7", "x=4:48", "x=four", "x=4:"] {
            assert!(bad.parse::<Override>().is_err(), "{bad}");
        }
    }
}
