//! `turbospark quantize`: a Hugging Face Gemma 4 checkpoint (bf16, f16 or
//! f32 safetensors) written as an MLX affine-quantized checkpoint, tensor
//! for tensor what mlx-lm's `mlx_lm.convert --quantize` writes for the same
//! input (turbospark::model::mlx_writer; docs/mlx-quantization.md).

use std::path::PathBuf;

use clap::ValueEnum;
use turbospark::model::mlx_writer::{
    quantize_checkpoint, Override, QuantizeOptions, MLX_SHARD_BYTES,
};
use turbospark::DType;

use crate::common::{human_bytes, CliResult};

#[derive(clap::Args)]
#[command(after_help = "\
Module paths are mlx-lm's: `embed_tokens`, `layers.N.self_attn.{q,k,v,o}_proj`,
`layers.N.mlp.{gate,up,down}_proj`, `layers.N.router.proj`,
`layers.N.experts.switch_glu.{gate,up,down}_proj`, `lm_head` (untied only); a
pattern may also spell the full path (`language_model.model.layers.0.mlp.up_proj`
in a multimodal checkpoint). Without overrides the result is mlx-lm's default
Gemma 4 conversion: every module at --bits/--group-size, the routers at 8 bits
group 64. Example (mixed precision):

  turbospark quantize --model gemma-4-26b-a4b-it --out q4 --bits 4 --group-size 64 \\
      --override 'layers.*.mlp.*=8' --override embed_tokens=6 --override 'layers.0.*=float'")]
pub struct Args {
    /// Hugging Face checkpoint directory: config.json, model.safetensors or
    /// model-*.safetensors with model.safetensors.index.json, tokenizer files.
    #[arg(long)]
    model: PathBuf,
    /// Output directory; created if missing, refused if not empty (see --force).
    #[arg(long)]
    out: PathBuf,
    /// Bits per weight: 2, 3, 4, 5, 6 or 8 (mlx-lm's --q-bits).
    #[arg(long, default_value_t = 4)]
    bits: u32,
    /// Values per scale/bias group: 32, 64 or 128 (mlx-lm's --q-group-size).
    /// A module whose input dimension this does not divide stays in float,
    /// as mlx-lm leaves it.
    #[arg(long, default_value_t = 64)]
    group_size: u32,
    /// Per-module precision, repeatable: PATTERN=BITS[:GROUP] (GROUP defaults
    /// to --group-size) or PATTERN=float (left unquantized). `*` in PATTERN
    /// matches any run of characters; where several overrides match a
    /// module the last one wins. An override that matches no module is an
    /// error. Each overridden module is recorded in config.json's
    /// quantization block under its full path, as mlx-lm records a
    /// predicate's choices.
    #[arg(long = "override", value_name = "PATTERN=BITS[:GROUP]")]
    overrides: Vec<Override>,
    /// Cast every float tensor to this before quantizing (mlx-lm's --dtype).
    /// Default: the config's torch_dtype, else text_config.dtype, else each
    /// tensor's own, as mlx-lm does.
    #[arg(long, value_enum)]
    dtype: Option<CastType>,
    /// Write into a non-empty output directory: files of the same name are
    /// replaced and every model*.safetensors already there is removed (a
    /// stale shard would otherwise be loaded beside the new ones).
    #[arg(long)]
    force: bool,
}

/// The float types mlx-lm's convert casts to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum CastType {
    Bfloat16,
    Float16,
    Float32,
}

impl CastType {
    fn dtype(self) -> DType {
        match self {
            CastType::Bfloat16 => DType::BF16,
            CastType::Float16 => DType::F16,
            CastType::Float32 => DType::F32,
        }
    }
}

pub fn run(a: Args) -> CliResult {
    let opts = QuantizeOptions {
        bits: a.bits,
        group_size: a.group_size,
        overrides: a.overrides,
        dtype: a.dtype.map(CastType::dtype),
        force: a.force,
        max_shard_bytes: MLX_SHARD_BYTES,
        progress: true,
    };
    let r = quantize_checkpoint(&a.model, &a.out, &opts)?;
    if let Some(d) = r.cast {
        eprintln!("cast every float tensor to {d} first (as mlx-lm's convert does)");
    }
    let mut by_format: Vec<((u32, u32), usize)> = Vec::new();
    for &(_, bits, group) in &r.quantized {
        match by_format.iter_mut().find(|(f, _)| *f == (bits, group)) {
            Some((_, n)) => *n += 1,
            None => by_format.push(((bits, group), 1)),
        }
    }
    by_format.sort();
    let formats: Vec<String> = by_format
        .iter()
        .map(|((b, g), n)| format!("{n} at {b} bits group {g}"))
        .collect();
    eprintln!(
        "quantized {} modules ({})",
        r.quantized.len(),
        formats.join(", ")
    );
    if !r.skipped.is_empty() {
        eprintln!(
            "left in float (in-dim not a multiple of group {}): {}",
            a.group_size,
            r.skipped.join(", ")
        );
    }
    if !r.kept_float.is_empty() {
        eprintln!("left in float by --override: {}", r.kept_float.join(", "));
    }
    eprintln!(
        "wrote {} ({}, {:.3} bits per weight over {} parameters) and {} to {}",
        r.shards.join(", "),
        human_bytes(r.total_size),
        r.bits_per_weight(),
        r.total_parameters,
        if r.copied.is_empty() {
            "config.json".to_string()
        } else {
            format!("config.json, {}", r.copied.join(", "))
        },
        a.out.display()
    );
    Ok(())
}
