//! INTERIM: a minimal copy of the loader branch's `checkpoint.rs` API (single
//! and sharded safetensors, `model.` / `model.language_model.` prefixes), so
//! the decoder's oracle tests run before that branch lands. The loader's
//! version (full checks against the config, progress) replaces this file.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::backend::HostBytes;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::model::config::ModelConfig;

/// One tensor of the checkpoint: a range of a memory map.
#[derive(Clone)]
pub struct TensorRef {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub bytes: HostBytes<'static>,
}

struct Entry {
    file: usize,
    dtype: DType,
    shape: Vec<usize>,
    offset: usize,
    len: usize,
}

pub struct Checkpoint {
    dir: PathBuf,
    config: ModelConfig,
    maps: Vec<Arc<memmap2::Mmap>>,
    entries: HashMap<String, Entry>,
}

const PREFIXES: [&str; 2] = ["model.language_model.", "model."];

impl Checkpoint {
    pub fn open(dir: &Path) -> Result<Checkpoint> {
        let config = ModelConfig::from_file(&dir.join("config.json"))?;
        let ck_err = |p: &Path, d: String| Error::Checkpoint {
            path: p.display().to_string(),
            detail: d,
        };
        let index = dir.join("model.safetensors.index.json");
        let files: Vec<PathBuf> = if index.exists() {
            let text = std::fs::read_to_string(&index)
                .map_err(|e| Error::io(index.display().to_string(), e))?;
            let v: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| ck_err(&index, e.to_string()))?;
            let mut names: Vec<String> = v
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| ck_err(&index, "no weight_map".into()))?
                .values()
                .filter_map(|f| f.as_str().map(str::to_string))
                .collect();
            names.sort();
            names.dedup();
            names.iter().map(|n| dir.join(n)).collect()
        } else {
            vec![dir.join("model.safetensors")]
        };
        let mut maps = Vec::new();
        let mut entries = HashMap::new();
        for (fi, path) in files.iter().enumerate() {
            let f =
                std::fs::File::open(path).map_err(|e| Error::io(path.display().to_string(), e))?;
            // SAFETY: the checkpoint is read-only input; a file changed under
            // us while mapped is outside what we can defend against.
            let map = unsafe { memmap2::Mmap::map(&f) }
                .map_err(|e| Error::io(path.display().to_string(), e))?;
            let st = safetensors::SafeTensors::deserialize(&map)
                .map_err(|e| ck_err(path, e.to_string()))?;
            let base = map.as_ptr() as usize;
            for (name, view) in st.tensors() {
                let Some(short) = PREFIXES.iter().find_map(|p| name.strip_prefix(p)) else {
                    continue;
                };
                let Some(dtype) = DType::from_safetensors(view.dtype()) else {
                    continue;
                };
                entries.insert(
                    short.to_string(),
                    Entry {
                        file: fi,
                        dtype,
                        shape: view.shape().to_vec(),
                        offset: view.data().as_ptr() as usize - base,
                        len: view.data().len(),
                    },
                );
            }
            maps.push(Arc::new(map));
        }
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            config,
            maps,
            entries,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn tensor(&self, name: &str) -> Result<TensorRef> {
        let e = self.entries.get(name).ok_or_else(|| Error::Checkpoint {
            path: self.dir.display().to_string(),
            detail: format!("tensor `{name}` is missing"),
        })?;
        Ok(TensorRef {
            name: name.to_string(),
            dtype: e.dtype,
            shape: e.shape.clone(),
            bytes: HostBytes::Mapped {
                map: self.maps[e.file].clone(),
                offset: e.offset,
                len: e.len,
            },
        })
    }

    pub fn total_bytes(&self) -> u64 {
        self.entries.values().map(|e| e.len as u64).sum()
    }
}
