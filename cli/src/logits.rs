//! `turbospark logits`: teacher-forced logits of a token sequence, one row
//! per position, written as an F32 safetensors tensor `logits` [n, vocab] —
//! what kernel authors and the oracle tests compare.

use std::path::PathBuf;

use safetensors::tensor::TensorView;
use turbospark::model::{Model, ModelOptions};
use turbospark::ComputeBackend;
use turbospark_cpu::CpuBackend;

use crate::common::{open_checkpoint, open_wgpu, parse_tokens, BackendKind, CliResult};

#[derive(clap::Args)]
pub struct Args {
    /// Checkpoint directory (config.json + safetensors).
    #[arg(long)]
    model: PathBuf,
    /// Comma-separated token ids.
    #[arg(long)]
    tokens: String,
    #[arg(long, value_enum, default_value = "wgpu")]
    backend: BackendKind,
    /// Case-insensitive substring of the adapter name (wgpu only).
    #[arg(long)]
    adapter: Option<String>,
    /// Output file.
    #[arg(long)]
    out: PathBuf,
}

pub fn run(a: Args) -> CliResult {
    let tokens = parse_tokens(&a.tokens)?;
    let rows = match a.backend {
        BackendKind::Cpu => logits_on(CpuBackend::new(), &a, &tokens)?,
        BackendKind::Wgpu => logits_on(open_wgpu(a.adapter.clone())?, &a, &tokens)?,
    };
    let vocab = rows.first().map_or(0, Vec::len);
    let flat: Vec<f32> = rows.into_iter().flatten().collect();
    // Native f32 bytes: little-endian on every supported host, as safetensors wants.
    let bytes: &[u8] = bytemuck::cast_slice(&flat);
    let view = TensorView::new(safetensors::Dtype::F32, vec![tokens.len(), vocab], bytes)?;
    safetensors::serialize_to_file([("logits", view)], None, &a.out)
        .map_err(|e| format!("{}: {e}", a.out.display()))?;
    eprintln!(
        "wrote logits [{}, {vocab}] to {}",
        tokens.len(),
        a.out.display()
    );
    Ok(())
}

fn logits_on<B: ComputeBackend>(backend: B, a: &Args, tokens: &[u32]) -> CliResult<Vec<Vec<f32>>> {
    let ck = open_checkpoint(&a.model)?;
    let opts = ModelOptions {
        max_context: tokens.len(),
        ..Default::default()
    };
    let mut model = Model::load(backend, &ck, opts)?;
    Ok(model.logits(tokens)?)
}
