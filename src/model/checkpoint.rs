//! A Hugging Face Gemma 4 checkpoint directory, memory-mapped and checked
//! against its config before anything is uploaded.
//!
//! `open` reads `config.json` (and `generation_config.json`'s end tokens
//! where present), maps `model.safetensors` (or every shard the
//! `model.safetensors.index.json` names for a language-model tensor), and
//! checks each tensor [`expected_tensors`] lists for presence, dtype and shape.
//! Nothing is read from the maps at open beyond the headers, so opening a
//! multi-GB checkpoint is instant; the bytes are paged in at upload.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;

use super::config::ModelConfig;
use super::experts::stored::StoredExperts;
use super::layer_state::{self, LayerHostState};
use super::shard::{ckpt_err, RawTensor, Shard};
use super::tensors::WeightBytes;
use crate::backend::HostBytes;
use crate::dtype::DType;
use crate::{Error, Result};

pub use super::shard::MappedFile;
pub use super::tensor_ref::TensorRef;
pub use super::tensors::expected_tensors;

/// Prefix of the decoder tensors in multimodal (`Gemma4ForConditionalGeneration`) files.
const MULTIMODAL_PREFIX: &str = "model.language_model.";
/// The same in mlx-lm's conversions of the multimodal model.
const MLX_MULTIMODAL_PREFIX: &str = "language_model.model.";
/// Prefix of the decoder tensors in text-only (`Gemma4ForCausalLM`) files.
const TEXT_PREFIX: &str = "model.";
/// The untied LM head, stored outside the decoder prefix in both spellings.
const LM_HEAD: &str = "lm_head.weight";

/// Where a language-model tensor lives: which shard, under which full name.
struct Entry {
    shard: usize,
    full_name: String,
    raw: RawTensor,
}

/// An opened, checked checkpoint.
pub struct Checkpoint {
    dir: PathBuf,
    config: ModelConfig,
    shards: Vec<Shard>,
    /// Language-model tensors by name without prefix.
    tensors: HashMap<String, Entry>,
    prefix: &'static str,
    footprint: WeightBytes,
    /// Per-layer host values, decoded once at open.
    layer_state: Vec<LayerHostState>,
    /// Stored in MLX's layout (`mlx_layout`).
    mlx: bool,
}

impl std::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpoint")
            .field("dir", &self.dir)
            .field("shards", &self.shards.len())
            .field("tensors", &self.tensors.len())
            .field("prefix", &self.prefix)
            .field("total_bytes", &self.footprint.total)
            .finish()
    }
}

impl Checkpoint {
    /// Opens DIR: config.json + model.safetensors or model.safetensors.index.json shards; memory-maps, parses headers, checks every needed tensor's presence, dtype (bf16/f16/f32) and shape against the config before returning; ignores vision/audio tensors.
    pub fn open(dir: &Path) -> Result<Checkpoint> {
        check_directory(dir)?;
        let config_path = dir.join("config.json");
        match file_kind(&config_path)? {
            Some(Kind::File) => {}
            None => return Err(ckpt_err(dir, "no config.json in the checkpoint directory")),
            Some(other) => return Err(ckpt_err(&config_path, other.describe())),
        }
        let mut config = ModelConfig::from_file(&config_path)?;
        let generation_path = dir.join("generation_config.json");
        if generation_path.is_file() {
            let shown = generation_path.display().to_string();
            let text =
                std::fs::read_to_string(&generation_path).map_err(|e| Error::io(&shown, e))?;
            config.add_generation_config(&text, &shown)?;
        }
        let index_path = dir.join("model.safetensors.index.json");
        let single_path = dir.join("model.safetensors");
        // (a directory or FIFO under either name is named as such, not
        // taken for a missing file)
        let (shards, tensors, prefix) = match (file_kind(&index_path)?, file_kind(&single_path)?) {
            (Some(Kind::File), _) => open_sharded(dir, &index_path)?,
            (Some(other), _) => return Err(ckpt_err(&index_path, other.describe())),
            (None, Some(Kind::File)) => open_single(&single_path)?,
            (None, Some(other)) => return Err(ckpt_err(&single_path, other.describe())),
            (None, None) => {
                return Err(ckpt_err(
                    dir,
                    "neither model.safetensors nor model.safetensors.index.json found",
                ))
            }
        };
        let mut ckpt = Checkpoint {
            dir: dir.to_path_buf(),
            config,
            shards,
            tensors,
            prefix,
            footprint: WeightBytes::default(),
            layer_state: Vec::new(),
            mlx: false,
        };
        ckpt.mlx = ckpt.is_mlx_layout();
        ckpt.footprint = ckpt.check_against_config(&index_path)?;
        ckpt.layer_state = layer_state::build(&ckpt.config, |name| ckpt.tensor(name))?;
        Ok(ckpt)
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `name` WITHOUT the prefix: e.g. "embed_tokens.weight", "norm.weight", "layers.3.self_attn.q_proj.weight", "layers.3.experts.gate_up_proj", "layers.3.router.scale", "layers.3.layer_scalar".
    pub fn tensor(&self, name: &str) -> Result<TensorRef> {
        if self.mlx {
            if let Some(t) = self.resolve_mlx(name)? {
                return Ok(t.tensor(name));
            }
        }
        self.raw_tensor(name)
    }

    /// Expert stack `name` (`layers.N.experts.gate_up_proj` or
    /// `.down_proj`) left in the mapping, read one expert at a time by
    /// streamed experts; nothing is assembled or copied.
    pub fn stored_experts(&self, name: &str) -> Result<StoredExperts> {
        let stored = match self.mlx {
            true => match self.resolve_mlx(name)? {
                Some(t) => t.stored_experts(name)?,
                None => StoredExperts::whole(&self.raw_tensor(name)?)?,
            },
            false => StoredExperts::whole(&self.raw_tensor(name)?)?,
        };
        Ok(stored.mapping(self.mapped_files()))
    }

    /// Tensor `name`'s dtype as [`Checkpoint::tensor`] would give it, from
    /// the headers alone (an MLX module is not assembled to tell it).
    pub fn dtype_of(&self, name: &str) -> Result<DType> {
        if self.mlx {
            if let Some(t) = self.resolve_mlx(name)? {
                return Ok(t.dtype());
            }
        }
        Ok(self.raw_tensor(name)?.dtype)
    }

    /// The tensor stored as `name` (without prefix), of any dtype
    /// safetensors and this runtime share (packed U32 included).
    pub(crate) fn raw_tensor(&self, name: &str) -> Result<TensorRef> {
        let entry = self.tensors.get(name).ok_or_else(|| {
            ckpt_err(
                &self.dir,
                format!("no tensor `{name}` (looked for `{}`)", self.full_name(name)),
            )
        })?;
        let shard = &self.shards[entry.shard];
        let dtype = DType::from_safetensors(entry.raw.dtype).ok_or_else(|| {
            ckpt_err(
                &shard.path,
                format!(
                    "tensor `{}`: dtype {:?}, expected bf16, f16 or f32 (or packed U32 beside `.scales`)",
                    entry.full_name, entry.raw.dtype
                ),
            )
        })?;
        Ok(TensorRef {
            name: name.to_string(),
            dtype,
            shape: entry.raw.shape.clone(),
            bytes: HostBytes::Mapped {
                map: shard.map.clone(),
                offset: entry.raw.offset,
                len: entry.raw.len,
            },
        })
    }

    /// Whether a tensor is stored as `name` (without prefix).
    pub(crate) fn has_raw(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Whether any stored tensor's name (without prefix) satisfies `f`.
    pub(crate) fn has_tensor_where(&self, f: impl Fn(&str) -> bool) -> bool {
        self.tensors.keys().any(|n| f(n))
    }

    /// A checkpoint error naming the directory.
    pub(crate) fn err(&self, detail: String) -> Error {
        ckpt_err(&self.dir, detail)
    }

    /// Language-model tensors stored but not read under config.json (names
    /// without prefix, sorted): expert stacks of a config with the MoE block
    /// off, a v_proj on a layer whose values are its keys, leftovers of a
    /// conversion. Not an error (the model runs without them), but worth a
    /// warning: a config that does not match its weights runs a different
    /// model than the one trained.
    pub fn unused_tensors(&self) -> Vec<String> {
        let expected = expected_tensors(&self.config);
        // A module's parts (MLX's .scales and .biases beside .weight), and
        // for an expert stack every tensor of the layer's experts
        // (switch_glu's per-projection names in MLX's layout).
        let owners: Vec<String> = expected
            .iter()
            .map(|(n, _)| {
                if let Some(m) = n.strip_suffix(".weight") {
                    format!("{m}.")
                } else if let Some(i) = n.find(".experts.") {
                    n[..i + ".experts.".len()].to_string()
                } else {
                    n.clone()
                }
            })
            .collect();
        let mut unused: Vec<String> = self
            .tensors
            .keys()
            // (the decoder's own names: towers of other modalities beside
            // it are ignored by design)
            .filter(|name| {
                ["layers.", "embed_tokens.", "norm.", "lm_head."]
                    .iter()
                    .any(|p| name.starts_with(p))
            })
            .filter(|name| {
                !owners.iter().any(|o| {
                    name.as_str() == o || (o.ends_with('.') && name.starts_with(o.as_str()))
                })
            })
            .cloned()
            .collect();
        unused.sort();
        unused
    }

    /// Total bytes of the language-model tensors.
    pub fn total_bytes(&self) -> u64 {
        self.footprint.total
    }

    /// Weight bytes the device holds, as stored, with the routed experts
    /// streamed through `slots` slots a layer (None: all resident).
    pub fn device_weight_bytes(&self, slots: Option<usize>) -> u64 {
        self.footprint.with_slots(&self.config, slots)
    }

    /// Weight bytes a decoded token reads, as stored (plain or quantized):
    /// every tensor but the routed experts, of which a token's top-k, plus
    /// the embedding's row (the tied LM head reads the whole table).
    pub fn bytes_per_token(&self) -> u64 {
        self.footprint.per_token(&self.config)
    }

    /// Per-layer host state (folded router scale, `per_expert_scale`,
    /// `layer_scalar`), decoded once at open; one entry per layer.
    pub fn layer_state(&self) -> &[LayerHostState] {
        &self.layer_state
    }

    /// The tensor-name prefix this checkpoint uses (`model.` or `model.language_model.`).
    pub fn prefix(&self) -> &str {
        self.prefix
    }

    /// The files mapped (shards holding language-model tensors).
    pub fn files(&self) -> Vec<&Path> {
        self.shards.iter().map(|s| s.path.as_path()).collect()
    }

    /// The mapped files with what they were at open, for a caller that
    /// outlives the checkpoint (the maps live on in a backend that keeps
    /// weights mapped, as the CPU backend does) or that names the file a
    /// fault came from.
    pub fn mapped_files(&self) -> Vec<Arc<MappedFile>> {
        self.shards.iter().map(|s| s.file.clone()).collect()
    }

    /// An error naming the first mapped file whose size or modification
    /// time changed since open ([`MappedFile::check_unchanged`]): reading
    /// its map could fault (truncated) or give other weights (rewritten).
    pub fn check_unchanged(&self) -> Result<()> {
        self.shards
            .iter()
            .try_for_each(|s| s.file.check_unchanged())
    }

    /// The name as stored in the file (also the quantization block's key
    /// for a module).
    pub(crate) fn full_name(&self, name: &str) -> String {
        if name == LM_HEAD {
            name.to_string()
        } else {
            format!("{}{name}", self.prefix)
        }
    }

    /// Checks every expected tensor's presence, dtype and shape; returns their
    /// total size in bytes.
    fn check_against_config(&self, index_path: &Path) -> Result<WeightBytes> {
        let mut f = WeightBytes::default();
        for (name, want) in expected_tensors(&self.config) {
            if self.mlx {
                if let Some(t) = self.resolve_mlx(&name)? {
                    let shape = t.shape();
                    if shape != want {
                        return Err(self.err(format!(
                            "`{}`: shape {shape:?}, expected {want:?} from config.json",
                            self.full_name(&name),
                        )));
                    }
                    f.add(&name, t.dtype().bytes_for(shape.iter().product()) as u64);
                    continue;
                }
            }
            let Some(entry) = self.tensors.get(&name) else {
                let file = if self.shards.len() == 1 && !index_path.is_file() {
                    self.shards[0].path.clone()
                } else {
                    index_path.to_path_buf()
                };
                return Err(ckpt_err(
                    &file,
                    format!(
                        "missing tensor `{}` (expected shape {want:?}, bf16/f16/f32)",
                        self.full_name(&name)
                    ),
                ));
            };
            let path = &self.shards[entry.shard].path;
            if weight_dtype(entry.raw.dtype).is_none_or(|d| !d.is_float()) {
                return Err(ckpt_err(
                    path,
                    format!(
                        "tensor `{}`: dtype {:?}, expected bf16, f16 or f32",
                        entry.full_name, entry.raw.dtype
                    ),
                ));
            }
            if entry.raw.shape != want {
                return Err(ckpt_err(
                    path,
                    format!(
                        "tensor `{}`: shape {:?}, expected {want:?} from config.json",
                        entry.full_name, entry.raw.shape
                    ),
                ));
            }
            f.add(&name, entry.raw.len as u64);
        }
        Ok(f)
    }
}

/// The float weight dtypes this runtime reads; `U32` and the rest are not weights.
fn weight_dtype(d: safetensors::Dtype) -> Option<DType> {
    DType::from_safetensors(d).filter(|t| t.is_float())
}

/// The decoder prefix of a checkpoint: multimodal if any tensor uses it.
fn detect_prefix<'a>(names: impl IntoIterator<Item = &'a str>) -> &'static str {
    let mut prefix = TEXT_PREFIX;
    for n in names {
        if n.starts_with(MULTIMODAL_PREFIX) {
            return MULTIMODAL_PREFIX;
        }
        if n.starts_with(MLX_MULTIMODAL_PREFIX) {
            prefix = MLX_MULTIMODAL_PREFIX;
        }
    }
    prefix
}

/// The name without prefix of a language-model tensor; `None` for
/// vision/audio and anything else outside the decoder.
fn lm_name<'a>(full: &'a str, prefix: &str) -> Option<&'a str> {
    if full == LM_HEAD {
        return Some(full);
    }
    full.strip_prefix(prefix)
}

type Opened = (Vec<Shard>, HashMap<String, Entry>, &'static str);

fn open_single(path: &Path) -> Result<Opened> {
    let shard = Shard::open(path)?;
    let prefix = detect_prefix(shard.tensors.keys().map(String::as_str));
    let tensors = shard
        .tensors
        .iter()
        .filter_map(|(full, raw)| {
            lm_name(full, prefix).map(|n| {
                (
                    n.to_string(),
                    Entry {
                        shard: 0,
                        full_name: full.clone(),
                        raw: raw.clone(),
                    },
                )
            })
        })
        .collect();
    Ok((vec![shard], tensors, prefix))
}

fn open_sharded(dir: &Path, index_path: &Path) -> Result<Opened> {
    let text = std::fs::read_to_string(index_path)
        .map_err(|e| ckpt_err(index_path, format!("cannot read: {e}")))?;
    let index: Value = serde_json::from_str(&text)
        .map_err(|e| ckpt_err(index_path, format!("not valid JSON: {e}")))?;
    let weight_map = index
        .get("weight_map")
        .and_then(Value::as_object)
        .ok_or_else(|| ckpt_err(index_path, "no `weight_map` object"))?;
    let prefix = detect_prefix(weight_map.keys().map(String::as_str));

    // Only shards that hold a decoder tensor are mapped: vision/audio-only
    // shards are never touched.
    let mut files: Vec<String> = Vec::new();
    let mut wanted: Vec<(String, &str, usize)> = Vec::new();
    for (full, file) in weight_map {
        let Some(name) = lm_name(full, prefix) else {
            continue;
        };
        let file = file.as_str().ok_or_else(|| {
            ckpt_err(
                index_path,
                format!("weight_map[`{full}`]: expected a file name, found {file}"),
            )
        })?;
        if !is_plain_file_name(file) {
            return Err(ckpt_err(
                index_path,
                format!("weight_map[`{full}`]: `{file}` is not a file name inside the checkpoint directory"),
            ));
        }
        let idx = match files.iter().position(|f| f == file) {
            Some(i) => i,
            None => {
                files.push(file.to_string());
                files.len() - 1
            }
        };
        wanted.push((name.to_string(), full, idx));
    }
    let shards = files
        .iter()
        .map(|f| Shard::open(&dir.join(f)))
        .collect::<Result<Vec<_>>>()?;
    let mut tensors = HashMap::with_capacity(wanted.len());
    for (name, full, idx) in wanted {
        let shard = &shards[idx];
        let raw = shard.tensors.get(full).ok_or_else(|| {
            ckpt_err(
                &shard.path,
                format!(
                    "tensor `{full}`: listed in model.safetensors.index.json for this file, but not in its header"
                ),
            )
        })?;
        tensors.insert(
            name,
            Entry {
                shard: idx,
                full_name: full.to_string(),
                raw: raw.clone(),
            },
        );
    }
    Ok((shards, tensors, prefix))
}

/// Whether `f` names a file directly inside the checkpoint directory (no
/// directories, no `..`, not absolute): an index must not point elsewhere.
fn is_plain_file_name(f: &str) -> bool {
    let mut comps = Path::new(f).components();
    matches!(comps.next(), Some(Component::Normal(_))) && comps.next().is_none()
}

/// What a path in the checkpoint is, for messages that say what is wrong
/// with it rather than that it is missing.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    File,
    Dir,
    Other,
}

impl Kind {
    fn describe(self) -> &'static str {
        match self {
            Kind::File => "a regular file",
            Kind::Dir => "a directory, expected a regular file",
            Kind::Other => "not a regular file (a FIFO, socket or device)",
        }
    }
}

/// What `path` is (through links), `None` when nothing is there; an error
/// naming it when it cannot be told (no permission to look).
fn file_kind(path: &Path) -> Result<Option<Kind>> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => Ok(Some(Kind::File)),
        Ok(m) if m.is_dir() => Ok(Some(Kind::Dir)),
        Ok(_) => Ok(Some(Kind::Other)),
        // (a dangling link: there, but naming nothing)
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if std::fs::symlink_metadata(path).is_ok() {
                Err(ckpt_err(path, "a symbolic link to nothing"))
            } else {
                Ok(None)
            }
        }
        Err(e) => Err(ckpt_err(path, format!("cannot stat: {e}"))),
    }
}

/// An error saying what `dir` is when it is not a checkpoint directory:
/// missing, a file, a device.
fn check_directory(dir: &Path) -> Result<()> {
    match file_kind(dir)? {
        Some(Kind::Dir) => Ok(()),
        None => Err(ckpt_err(dir, "no such file or directory")),
        Some(Kind::File) => Err(ckpt_err(
            dir,
            "a file, not a checkpoint directory (the directory holding config.json and \
             the safetensors files)",
        )),
        Some(Kind::Other) => Err(ckpt_err(
            dir,
            "not a directory (a FIFO, socket or device), expected a checkpoint directory",
        )),
    }
}
