//! `turbospark logits`: teacher-forced logits of a token sequence, one row
//! per position, written as an F32 safetensors tensor `logits` [n, vocab] —
//! what kernel authors and the oracle tests compare.

use std::io::Write;
use std::path::{Path, PathBuf};

use safetensors::tensor::TensorView;
use turbospark::model::{Checkpoint, ModelOptions, OneSequence};
use turbospark::ComputeBackend;
use turbospark_cpu::CpuBackend;

use crate::common::{
    max_positions, open_checkpoint, open_wgpu, parse_tokens, warn_past_positions, BackendKind,
    CliResult, PrecisionArg,
};

#[derive(clap::Args)]
pub struct Args {
    /// Checkpoint directory (config.json + safetensors).
    #[arg(long)]
    model: PathBuf,
    /// Comma-separated token ids.
    // (hyphen values: `-1` reaches parse_tokens, which names it)
    #[arg(long, allow_hyphen_values = true)]
    tokens: String,
    #[arg(long, value_enum, default_value = "wgpu")]
    backend: BackendKind,
    /// Case-insensitive substring of the adapter name (wgpu only).
    #[arg(long)]
    adapter: Option<String>,
    /// Output file (written whole beside itself, then renamed over it).
    #[arg(long)]
    out: PathBuf,
    #[command(flatten)]
    experts: crate::generate::ExpertArgs,
    /// The tensor-core products: exact (split activations, the f32 floor)
    /// or fast (rounded once to f16).
    #[arg(long, value_enum, default_value = "exact")]
    precision: PrecisionArg,
}

pub fn run(a: Args) -> CliResult {
    let tokens = parse_tokens(&a.tokens)?;
    let ck = open_checkpoint(&a.model)?;
    refuse_input_as_output(&a.out, &inputs_of(&ck))?;
    warn_past_positions(
        tokens.len(),
        max_positions(&a.model)?,
        "the sequence length (--tokens)",
        &a.model,
    );
    let rows = match a.backend {
        BackendKind::Cpu => logits_on(CpuBackend::new(), &ck, &tokens, (&a.experts, a.precision))?,
        BackendKind::Wgpu => logits_on(
            open_wgpu(a.adapter.clone())?,
            &ck,
            &tokens,
            (&a.experts, a.precision),
        )?,
    };
    // A NaN or infinite logit is a broken model, not a result to write.
    for (p, row) in rows.iter().enumerate() {
        if let Some(i) = row.iter().position(|v| !v.is_finite()) {
            return Err(turbospark::Error::NonFinite(format!(
                "logit {i} of position {p} is {} (nothing written to {})",
                row[i],
                a.out.display()
            ))
            .into());
        }
    }
    let vocab = rows.first().map_or(0, Vec::len);
    let flat: Vec<f32> = rows.into_iter().flatten().collect();
    // Native f32 bytes: little-endian on every supported host, as safetensors wants.
    let bytes: &[u8] = bytemuck::cast_slice(&flat);
    let view = TensorView::new(safetensors::Dtype::F32, vec![tokens.len(), vocab], bytes)?;
    let file = safetensors::serialize([("logits", view)], None)
        .map_err(|e| format!("{}: {e}", a.out.display()))?;
    write_replacing(&a.out, &file)?;
    eprintln!(
        "wrote logits [{}, {vocab}] to {}",
        tokens.len(),
        a.out.display()
    );
    Ok(())
}

fn logits_on<B: ComputeBackend>(
    backend: B,
    ck: &Checkpoint,
    tokens: &[u32],
    (experts, precision): (&crate::generate::ExpertArgs, PrecisionArg),
) -> CliResult<Vec<Vec<f32>>> {
    let opts = experts.apply(ModelOptions {
        max_context: tokens.len(),
        precision: precision.get(),
        ..Default::default()
    });
    let mut model = OneSequence::load(backend, ck, opts)?;
    // Before the pass (the CPU backend reads the weights from the maps)
    // and after it (a file rewritten in place during it gave other
    // weights): either is an error naming the file, not logits to write.
    crate::mapped::check_unchanged()?;
    // On the CPU reference a long prompt runs minutes: its prefill batches
    // one call each (the batches one call would run), under a progress bar.
    let batch = model.model().prefill_batch();
    let cpu = model.backend().info().device_type == turbospark::DeviceType::Cpu;
    let rows = if cpu && tokens.len() > 2 * batch {
        let bar = indicatif::ProgressBar::new(tokens.len() as u64).with_style(
            indicatif::ProgressStyle::with_template("logits {pos}/{len} tokens {wide_bar} {eta}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        let mut rows = Vec::with_capacity(tokens.len());
        for chunk in tokens.chunks(batch) {
            rows.extend(model.logits(chunk)?);
            bar.inc(chunk.len() as u64);
        }
        bar.finish_and_clear();
        rows
    } else {
        model.logits(tokens)?
    };
    crate::mapped::check_unchanged()?;
    Ok(rows)
}

/// Every file of the checkpoint a run reads: the mapped shards and the
/// JSON beside them.
fn inputs_of(ck: &Checkpoint) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = ck.files().into_iter().map(Path::to_path_buf).collect();
    for name in [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "model.safetensors.index.json",
        "tokenizer.json",
    ] {
        files.push(ck.dir().join(name));
    }
    files
}

/// An error when `out` is one of `inputs` (compared as canonical paths, so
/// through links and `..`; on Unix also by inode, so through hard links):
/// writing it would destroy the checkpoint being read.
fn refuse_input_as_output(out: &Path, inputs: &[PathBuf]) -> CliResult {
    if out.is_dir() {
        return Err(format!("--out {}: a directory", out.display()).into());
    }
    let Some(target) = canonical_target(out) else {
        // (a parent that does not exist: the write says so)
        return Ok(());
    };
    let out_meta = std::fs::metadata(out).ok();
    for input in inputs {
        let Ok(canon) = input.canonicalize() else {
            continue;
        };
        let same_inode = match (&out_meta, std::fs::metadata(input)) {
            (Some(o), Ok(i)) => same_file(o, &i),
            _ => false,
        };
        if canon == target || same_inode {
            return Err(format!(
                "--out {} is the checkpoint's input {}: refusing to overwrite it",
                out.display(),
                canon.display()
            )
            .into());
        }
    }
    Ok(())
}

/// `path` canonicalized, or its parent's canonical path and its name when
/// the file does not exist yet.
fn canonical_target(path: &Path) -> Option<PathBuf> {
    if let Ok(p) = path.canonicalize() {
        return Some(p);
    }
    let name = path.file_name()?;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    Some(parent.canonicalize().ok()?.join(name))
}

#[cfg(unix)]
fn same_file(a: &std::fs::Metadata, b: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    (a.dev(), a.ino()) == (b.dev(), b.ino())
}

#[cfg(not(unix))]
fn same_file(_: &std::fs::Metadata, _: &std::fs::Metadata) -> bool {
    false
}

/// `bytes` written to a temporary file beside `path`, flushed, then renamed
/// over it: a failed write (a full disk) leaves the old file whole and no
/// partial one under its name. A `path` that is not a regular file (a
/// device such as /dev/null, a FIFO) is written in place: renaming over it
/// would replace the node.
fn write_replacing(out: &Path, bytes: &[u8]) -> CliResult {
    let shown = || out.display();
    if std::fs::metadata(out).is_ok_and(|m| !m.is_file()) {
        return std::fs::write(out, bytes).map_err(|e| format!("--out {}: {e}", shown()).into());
    }
    // (through a link: the file it names is replaced, not the link)
    let path = &canonical_target(out).unwrap_or_else(|| out.to_path_buf());
    let name = path
        .file_name()
        .ok_or_else(|| format!("--out {}: not a file name", shown()))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".tmp-{}", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let written = (|| -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(format!("--out {}: writing {}: {e}", shown(), tmp.display()).into());
    }
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("--out {}: renaming {} over it: {e}", shown(), tmp.display()).into()
    })
}
