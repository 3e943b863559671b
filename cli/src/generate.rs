//! `turbospark generate`: a prompt (text through the checkpoint's tokenizer,
//! or token ids) in, the continuation out on stdout as it is generated;
//! prefill and decode tokens/s on stderr.

use std::ops::ControlFlow;
use std::path::PathBuf;

use turbospark::model::{GenerateOptions, Generation, Model, ModelOptions, Sampling};
use turbospark::ComputeBackend;
use turbospark_cpu::CpuBackend;

use crate::common::{
    encode, open_checkpoint, open_wgpu, parse_tokens, tokenizer, BackendKind, CliResult, KvCache,
};
use crate::stream::Stream;

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["prompt", "tokens"])))]
pub struct Args {
    /// Checkpoint directory (config.json + safetensors [+ tokenizer.json]).
    #[arg(long)]
    model: PathBuf,
    /// Prompt text (needs the checkpoint's tokenizer.json).
    #[arg(long)]
    prompt: Option<String>,
    /// Prompt as comma-separated token ids.
    #[arg(long)]
    tokens: Option<String>,
    #[arg(long, default_value_t = 32)]
    max_new_tokens: usize,
    /// Keep generating past the model's end-of-sequence tokens
    /// (config.json's `eos_token_id`); by default generation stops at one.
    #[arg(long)]
    ignore_eos: bool,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[arg(long, value_enum, default_value = "wgpu")]
    backend: BackendKind,
    /// Case-insensitive substring of the adapter name (wgpu only).
    #[arg(long)]
    adapter: Option<String>,
    /// Longest context (prompt + new tokens); sizes the KV caches up front.
    #[arg(long, default_value_t = 4096)]
    max_context: usize,
    /// Most prompt tokens per prefill pass (more: fewer weight reads, more memory).
    #[arg(long, default_value_t = turbospark::model::DEFAULT_PREFILL_BATCH)]
    prefill_batch: usize,
    /// The KV caches' element type: f16 halves their memory and the
    /// attention's reads at long contexts, rounding each key and value.
    #[arg(long, value_enum, default_value = "f32")]
    kv_cache: KvCache,
}

/// Sampling flags: none (or a temperature of 0) means greedy decoding.
#[derive(clap::Args, Clone, Debug)]
pub struct SamplingArgs {
    /// Softmax temperature; 0 is greedy (the default unless --top-k/--top-p are given).
    #[arg(long)]
    temperature: Option<f32>,
    /// Sample among the K most likely tokens.
    #[arg(long)]
    top_k: Option<usize>,
    /// Sample among the smallest set of tokens holding probability P.
    #[arg(long)]
    top_p: Option<f32>,
    /// Seed of the sampler.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

impl SamplingArgs {
    pub fn sampling(&self) -> Sampling {
        let random = self.top_k.is_some() || self.top_p.is_some();
        match self.temperature {
            None if !random => Sampling::Greedy,
            t => Sampling::Random {
                temperature: t.unwrap_or(1.0),
                top_k: self.top_k,
                top_p: self.top_p,
                seed: self.seed,
            },
        }
    }
}

pub fn run(a: Args) -> CliResult {
    let tok = tokenizer(&a.model)?;
    let prompt = match (&a.prompt, &a.tokens, &tok) {
        (_, Some(ids), _) => parse_tokens(ids)?,
        (Some(text), None, Some(t)) => encode(t, text)?,
        (Some(_), None, None) => {
            return Err(format!(
                "{} has no tokenizer.json: pass the prompt as --tokens",
                a.model.display()
            )
            .into())
        }
        (None, None, _) => return Err("give --prompt or --tokens".into()),
    };
    let opts = GenerateOptions {
        max_new_tokens: a.max_new_tokens,
        sampling: a.sampling.sampling(),
        stop_at_eos: !a.ignore_eos,
    };
    // The continuation goes to stdout token by token; a write that fails
    // (stdout closed) stops generation and is the error reported.
    let mut out = Stream::new(std::io::stdout().lock(), tok.as_ref());
    let mut failed = None;
    let mut on_token = |id: u32| match out.push(id) {
        Ok(()) => ControlFlow::Continue(()),
        Err(e) => {
            failed = Some(e);
            ControlFlow::Break(())
        }
    };
    let (g, device) = match a.backend {
        BackendKind::Cpu => generate_on(CpuBackend::new(), &a, &prompt, &opts, &mut on_token)?,
        BackendKind::Wgpu => generate_on(
            open_wgpu(a.adapter.clone())?,
            &a,
            &prompt,
            &opts,
            &mut on_token,
        )?,
    };
    if let Some(e) = failed {
        return Err(e);
    }
    out.finish()?;
    eprintln!(
        "{device}: {} prompt tokens, {} new; prefill {:.1} tok/s, decode {:.1} tok/s",
        prompt.len(),
        g.tokens.len(),
        g.prefill_tok_s,
        g.decode_tok_s
    );
    Ok(())
}

fn generate_on<B: ComputeBackend>(
    backend: B,
    a: &Args,
    prompt: &[u32],
    opts: &GenerateOptions,
    on_token: &mut dyn FnMut(u32) -> ControlFlow<()>,
) -> CliResult<(Generation, String)> {
    let device = format!(
        "{} ({})",
        backend.info().device_name,
        backend.info().backend
    );
    let ck = open_checkpoint(&a.model)?;
    let mut model = Model::load(
        backend,
        &ck,
        ModelOptions {
            max_context: a.max_context,
            prefill_batch: a.prefill_batch,
            kv_cache: a.kv_cache.dtype(),
        },
    )?;
    Ok((model.generate_streaming(prompt, opts, on_token)?, device))
}
