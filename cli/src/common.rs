//! What the subcommands share: backend choice, opening a checkpoint, token
//! parsing, the tokenizer, and error reporting.

use std::error::Error as StdError;
use std::path::{Path, PathBuf};

use clap::ValueEnum;
use turbospark::model::Checkpoint;
use turbospark_wgpu::{WgpuBackend, WgpuOptions};

/// Every CLI failure: a library error, a tokenizer error, or I/O, with its chain.
pub type CliError = Box<dyn StdError + Send + Sync>;
pub type CliResult<T = ()> = Result<T, CliError>;

/// Which backend runs the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BackendKind {
    /// The CPU reference backend (plain Rust, slow, the ground truth).
    Cpu,
    /// The best (or the named) GPU adapter through wgpu.
    Wgpu,
}

/// The KV caches' element type (`--kv-cache`; `ModelOptions::kv_cache`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum KvCache {
    /// f32: exact (the default).
    F32,
    /// f16: half the caches' memory and the attention's reads; each key and
    /// value rounded to 11 significant bits.
    F16,
}

impl KvCache {
    pub fn dtype(self) -> turbospark::DType {
        match self {
            KvCache::F32 => turbospark::DType::F32,
            KvCache::F16 => turbospark::DType::F16,
        }
    }
}

/// A synthetic model's weight format (`bench --quant`): mlx-community's
/// layouts, 4 or 8 bits with groups of 64 and bf16 scales, the router at 8
/// bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Quant {
    /// 4-bit, group 64 (mlx-community's `-4bit` checkpoints).
    Q4,
    /// 8-bit, group 64 (`-8bit`).
    Q8,
}

impl Quant {
    pub fn synthetic(self) -> turbospark::model::synthetic::SyntheticQuant {
        let bits = match self {
            Quant::Q4 => 4,
            Quant::Q8 => 8,
        };
        turbospark::model::synthetic::SyntheticQuant { bits, group: 64 }
    }

    pub fn affine(self) -> turbospark::quant::Affine {
        let q = self.synthetic();
        turbospark::quant::Affine {
            bits: q.bits,
            group: q.group,
            scales: turbospark::quant::ScaleType::BF16,
        }
    }
}

/// Print an error and every cause under it (never a panic, never a backtrace).
pub fn print_error_chain(e: &(dyn StdError + 'static)) {
    eprintln!("error: {e}");
    let mut cause = e.source();
    while let Some(c) = cause {
        eprintln!("  caused by: {c}");
        cause = c.source();
    }
}

pub fn open_wgpu(adapter: Option<String>) -> CliResult<WgpuBackend> {
    Ok(WgpuBackend::new(&WgpuOptions {
        adapter,
        ..Default::default()
    })?)
}

pub fn open_checkpoint(dir: &Path) -> CliResult<Checkpoint> {
    Ok(Checkpoint::open(dir)?)
}

/// `"5,17, 42"` to ids; anything else is an error naming the bad item.
pub fn parse_tokens(s: &str) -> CliResult<Vec<u32>> {
    let ids: Result<Vec<u32>, CliError> = s
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|t| {
            t.parse::<u32>()
                .map_err(|e| format!("bad token id {t:?} in --tokens: {e}").into())
        })
        .collect();
    let ids = ids?;
    if ids.is_empty() {
        return Err("--tokens holds no token ids".into());
    }
    Ok(ids)
}

/// The checkpoint's `tokenizer.json`, when it has one.
pub fn tokenizer(dir: &Path) -> CliResult<Option<tokenizers::Tokenizer>> {
    let path: PathBuf = dir.join("tokenizer.json");
    if !path.exists() {
        return Ok(None);
    }
    tokenizers::Tokenizer::from_file(&path)
        .map(Some)
        .map_err(|e| format!("{}: {e}", path.display()).into())
}

pub fn encode(tok: &tokenizers::Tokenizer, text: &str) -> CliResult<Vec<u32>> {
    encode_with(tok, text, true)
}

/// `text`'s tokens; `special`: with the tokenizer's own additions (a
/// sequence's BOS), which only a context's first text takes.
pub fn encode_with(tok: &tokenizers::Tokenizer, text: &str, special: bool) -> CliResult<Vec<u32>> {
    let enc = tok
        .encode(text, special)
        .map_err(|e| format!("tokenizing the prompt: {e}"))?;
    Ok(enc.get_ids().to_vec())
}

pub fn decode(tok: &tokenizers::Tokenizer, ids: &[u32]) -> CliResult<String> {
    Ok(tok
        .decode(ids, true)
        .map_err(|e| format!("detokenizing: {e}"))?)
}

/// Bytes in a human unit.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_lists() {
        assert_eq!(parse_tokens("5,17, 42").unwrap(), vec![5, 17, 42]);
        assert!(parse_tokens("5,x").is_err());
        assert!(parse_tokens("-1").is_err());
        assert!(parse_tokens(",").is_err());
    }
}
