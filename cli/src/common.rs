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

/// The tensor-core products' arithmetic (`--precision`;
/// `ModelOptions::precision`, `turbospark::Precision`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PrecisionArg {
    /// Activations split into two f16 parts: the f32 floor, the same
    /// tokens and experts as token-by-token decode (the default).
    Exact,
    /// Activations rounded once to f16: fewer tensor-core products, and a
    /// token whose router logits are that close may get other experts.
    Fast,
}

impl PrecisionArg {
    pub fn get(self) -> turbospark::Precision {
        match self {
            PrecisionArg::Exact => turbospark::Precision::Exact,
            PrecisionArg::Fast => turbospark::Precision::Fast,
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
    let ck = Checkpoint::open(dir)?;
    crate::mapped::watch(&ck);
    let unused = ck.unused_tensors();
    if !unused.is_empty() {
        let shown: Vec<&str> = unused.iter().take(4).map(String::as_str).collect();
        eprintln!(
            "warning: {} of {}'s tensors are not used under its config.json ({}{})",
            unused.len(),
            dir.display(),
            shown.join(", "),
            if unused.len() > shown.len() {
                ", ..."
            } else {
                ""
            }
        );
    }
    Ok(ck)
}

/// `"5,17, 42"` to ids; anything else is an error naming the bad item: an
/// empty entry (`1,,2`, a trailing comma) or one that is not plain decimal
/// digits (`+5`, `-1`, `0x10`), which `u32::from_str` would partly accept.
pub fn parse_tokens(s: &str) -> CliResult<Vec<u32>> {
    if s.trim().is_empty() {
        return Err("--tokens holds no token ids".into());
    }
    s.split(',')
        .enumerate()
        .map(|(i, raw)| {
            let t = raw.trim();
            if t.is_empty() {
                return Err(format!("--tokens {s:?}: entry {} is empty", i + 1).into());
            }
            if !t.bytes().all(|b| b.is_ascii_digit()) {
                return Err(format!(
                    "bad token id {t:?} in --tokens (entry {}): not a decimal number",
                    i + 1
                )
                .into());
            }
            t.parse::<u32>().map_err(|e| {
                format!("bad token id {t:?} in --tokens (entry {}): {e}", i + 1).into()
            })
        })
        .collect()
}

/// Largest `tokenizer.json` read: Gemma's are tens of MiB.
pub const TOKENIZER_MAX_BYTES: u64 = 256 << 20;

/// The checkpoint's `tokenizer.json`, when it has one; one that is not a
/// regular file, or over [`TOKENIZER_MAX_BYTES`], is an error naming it.
pub fn tokenizer(dir: &Path) -> CliResult<Option<tokenizers::Tokenizer>> {
    let path: PathBuf = dir.join("tokenizer.json");
    // (symlink_metadata: a dangling link is there, and an error below)
    if std::fs::symlink_metadata(&path).is_err() {
        return Ok(None);
    }
    let text = read_text_file(
        &path,
        &path.display().to_string(),
        (TOKENIZER_MAX_BYTES, "the most a tokenizer.json is read for"),
    )?;
    text.parse::<tokenizers::Tokenizer>()
        .map(Some)
        .map_err(|e| match unsupported_model_type(&text) {
            Some(kind) => format!(
                "{}: the tokenizer's model type {kind} is not supported \
                 (supported: {})",
                path.display(),
                TOKENIZER_MODELS.join(", ")
            )
            .into(),
            None => format!("{}: {e}", path.display()).into(),
        })
}

/// The tokenizer models the `tokenizers` crate reads (`model.type`).
const TOKENIZER_MODELS: [&str; 4] = ["BPE", "Unigram", "WordLevel", "WordPiece"];

/// A tokenizer.json's `model.type` when it is not one the crate reads
/// (shown as JSON), for a message better than its untagged-enum mismatch.
fn unsupported_model_type(text: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    let kind = v.get("model")?.get("type")?;
    match kind.as_str() {
        Some(k) if TOKENIZER_MODELS.contains(&k) => None,
        _ => Some(kind.to_string()),
    }
}

/// A size limit and why it is that, for messages.
pub type Limit<'a> = (u64, &'a str);

/// The text of the regular file at `path`, at most `limit` bytes; `what`
/// names it in errors. A FIFO, a device or a directory is refused before
/// it is opened (reading one blocks or never ends).
pub fn read_text_file(path: &Path, what: &str, limit: Limit<'_>) -> CliResult<String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("{what}: {e}"))?;
    check_regular(&meta, what, limit)?;
    let file = std::fs::File::open(path).map_err(|e| format!("{what}: {e}"))?;
    // (again on the file opened: the path may have changed since)
    let meta = file.metadata().map_err(|e| format!("{what}: {e}"))?;
    check_regular(&meta, what, limit)?;
    read_text_bounded(file, what, limit)
}

fn check_regular(meta: &std::fs::Metadata, what: &str, (limit, why): Limit<'_>) -> CliResult {
    let ft = meta.file_type();
    if !ft.is_file() {
        let kind = if ft.is_dir() {
            "a directory"
        } else {
            "not a regular file (a FIFO, socket or device)"
        };
        return Err(format!("{what}: {kind}").into());
    }
    if meta.len() > limit {
        return Err(format!(
            "{what}: {} bytes ({}), over the limit of {limit} bytes ({}: {why})",
            meta.len(),
            human_bytes(meta.len()),
            human_bytes(limit)
        )
        .into());
    }
    Ok(())
}

/// At most `limit` bytes of UTF-8 text from `r` (standard input, a file);
/// more is an error naming `what` and the limit.
pub fn read_text_bounded(
    r: impl std::io::Read,
    what: &str,
    (limit, why): Limit<'_>,
) -> CliResult<String> {
    use std::io::Read;
    let mut bytes = Vec::new();
    r.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{what}: {e}"))?;
    if bytes.len() as u64 > limit {
        return Err(format!(
            "{what}: more than the limit of {limit} bytes ({}: {why})",
            human_bytes(limit)
        )
        .into());
    }
    String::from_utf8(bytes).map_err(|e| format!("{what}: not UTF-8 text: {e}").into())
}

/// Longest context when none is asked for (capped by the model's
/// `max_position_embeddings`).
pub const DEFAULT_MAX_CONTEXT: usize = 4096;

/// The context to size a run for: `asked` (the `--max-context` flag), with
/// a warning when it is past the checkpoint's `max_position_embeddings`,
/// or [`DEFAULT_MAX_CONTEXT`] capped by it.
pub fn resolve_context(dir: &Path, asked: Option<usize>) -> CliResult<usize> {
    let cap = max_positions(dir)?;
    Ok(match (asked, cap) {
        (None, Some(cap)) => DEFAULT_MAX_CONTEXT.min(cap),
        (None, None) => DEFAULT_MAX_CONTEXT,
        (Some(n), cap) => {
            warn_past_positions(n, cap, "--max-context", dir);
            n
        }
    })
}

/// The checkpoint's `max_position_embeddings` (None: no config.json there,
/// which opening the checkpoint reports, or no such field).
pub fn max_positions(dir: &Path) -> CliResult<Option<usize>> {
    let path = dir.join("config.json");
    if !path.is_file() {
        return Ok(None);
    }
    Ok(turbospark::model::ModelConfig::max_position_embeddings_in(
        &path,
    )?)
}

/// A warning on stderr when `n` positions (`what`) are past `cap`, the
/// model's `max_position_embeddings`: the model was not trained there.
pub fn warn_past_positions(n: usize, cap: Option<usize>, what: &str, dir: &Path) {
    if let Some(cap) = cap.filter(|&c| n > c) {
        eprintln!(
            "warning: {what} {n} is past the model's max_position_embeddings ({cap}, {}): \
             positions past it were not trained",
            dir.join("config.json").display()
        );
    }
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

/// Standard output is open. A closed one (`>&-`) would make a run exit 0
/// having written nothing: Rust's runtime reopens a closed standard
/// descriptor on /dev/null, read-write, before `main`. A shell's own
/// `>/dev/null` opens it write-only, so that one is left alone.
pub fn check_stdout_open() -> CliResult<()> {
    #[cfg(target_os = "linux")]
    {
        let null = std::fs::read_link("/proc/self/fd/1")
            .is_ok_and(|p| p == std::path::Path::new("/dev/null"));
        // (fdinfo's `flags` are octal; O_ACCMODE 3, O_RDWR 2)
        let read_write = std::fs::read_to_string("/proc/self/fdinfo/1")
            .ok()
            .and_then(|t| {
                let f = t.lines().find_map(|l| l.strip_prefix("flags:"))?;
                u32::from_str_radix(f.trim(), 8).ok()
            })
            .is_some_and(|flags| flags & 3 == 2);
        if null && read_write {
            return Err(
                "standard output is not open (closed with >&-): nowhere to write the text".into(),
            );
        }
    }
    Ok(())
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
        for (bad, why) in [
            ("1,,2", "entry 2 is empty"),
            ("1,2,", "entry 3 is empty"),
            (",1", "entry 1 is empty"),
            ("+5", "\"+5\""),
            ("1,+2", "\"+2\""),
            ("", "no token ids"),
        ] {
            let e = parse_tokens(bad).unwrap_err().to_string();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }
}
