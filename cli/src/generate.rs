//! `turbospark generate`: a prompt (text through the checkpoint's tokenizer,
//! or token ids) in, the continuation out on stdout as it is generated;
//! prefill and decode tokens/s on stderr.

use std::ops::ControlFlow;
use std::path::PathBuf;

use turbospark::model::drafter::{Drafter, SpeculativeOptions, SpeculativeStats};
use turbospark::model::experts::StreamStats;
use turbospark::model::experts::{ExpertStore, Optimism, Policy, StreamPrefill};
use turbospark::model::{GenerateOptions, Generation, Model, ModelOptions, OneSequence, Sampling};
use turbospark::{ComputeBackend, SlotWrite};
use turbospark_cpu::CpuBackend;
use turbospark_wgpu::WgpuBackend;

use crate::common::{
    encode, open_checkpoint, open_wgpu, parse_tokens, read_text_bounded, read_text_file,
    resolve_context, tokenizer, BackendKind, CliResult, KvCache, PrecisionArg,
};
use crate::stream::Stream;
use crate::turns;

#[derive(clap::Args)]
#[command(group(
    clap::ArgGroup::new("input")
        .required(true)
        .args(["prompt", "prompt_file", "tokens"])
))]
pub struct Args {
    /// Checkpoint directory (config.json + safetensors [+ tokenizer.json]).
    #[arg(long)]
    model: PathBuf,
    /// Prompt text (needs the checkpoint's tokenizer.json).
    #[arg(long)]
    prompt: Option<String>,
    /// Prompt text read from a file (`-`: standard input), for prompts too
    /// long for a command line.
    #[arg(long)]
    prompt_file: Option<PathBuf>,
    /// Prompt as comma-separated token ids.
    // (hyphen values: `-1` reaches parse_tokens, which names it)
    #[arg(long, allow_hyphen_values = true)]
    tokens: Option<String>,
    #[arg(long, default_value_t = 32, allow_negative_numbers = true)]
    max_new_tokens: usize,
    /// Keep generating past the model's end-of-sequence tokens (the
    /// `eos_token_id` of config.json and generation_config.json); by
    /// default generation stops at one.
    #[arg(long)]
    ignore_eos: bool,
    /// Wrap the prompt in the checkpoint's chat template (chat_template.jinja
    /// or tokenizer_config.json's; Gemma 4's turns where it has none: a user
    /// turn, then the model's) and stop where the model ends its turn: for
    /// instruction-tuned checkpoints.
    #[arg(long)]
    chat: bool,
    /// With --chat: a system turn before the prompt.
    #[arg(long, requires = "chat")]
    system: Option<String>,
    /// Stop once the generated text contains STRING (printed with it);
    /// may be given several times.
    #[arg(long = "stop", value_name = "STRING")]
    stops: Vec<String>,
    /// Write every token's routed experts per MoE layer (prompt and
    /// generated tokens) to FILE, for `turbospark bench --replay-trace`
    /// (slower: each layer's choice is read back as it is made).
    #[arg(long, value_name = "FILE")]
    routing_trace: Option<PathBuf>,
    /// Print the streamed experts' counters (with --expert-slots): hits,
    /// misses, bytes streamed and their copy rate, the host's waits and
    /// their time per token, the optimistic decode passes that stood; with
    /// --draft-model, the drafts' acceptance, tokens per target pass and
    /// the time drafting and verifying.
    #[arg(long)]
    stats: bool,
    /// Speculative decoding with a Gemma 4 drafter ("assistant")
    /// checkpoint made for this model: it proposes tokens, the model checks
    /// them in one pass; the output is the model's own (greedy: the same
    /// tokens; sampling: the same distribution).
    #[arg(long, value_name = "DIR")]
    draft_model: Option<PathBuf>,
    /// Tokens the drafter proposes a round, with --draft-model (default 4).
    #[arg(
        long,
        value_name = "K",
        requires = "draft_model",
        allow_negative_numbers = true
    )]
    draft_tokens: Option<usize>,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    run: RunArgs,
}

/// Where and how a model runs: what `generate` and `chat` share.
#[derive(clap::Args, Clone, Debug)]
pub struct RunArgs {
    #[arg(long, value_enum, default_value = "wgpu")]
    pub backend: BackendKind,
    /// Case-insensitive substring of the adapter name (wgpu only).
    #[arg(long)]
    pub adapter: Option<String>,
    /// Longest context (prompt + new tokens); sizes the KV caches up front.
    /// Default: 4096, or the model's max_position_embeddings where smaller.
    #[arg(long, allow_negative_numbers = true)]
    max_context: Option<usize>,
    /// Most prompt tokens per prefill pass (more: fewer weight reads, more memory).
    #[arg(long, default_value_t = turbospark::model::DEFAULT_PREFILL_BATCH, allow_negative_numbers = true)]
    prefill_batch: usize,
    /// The KV caches' element type: f16 halves their memory and the
    /// attention's reads at long contexts, rounding each key and value.
    #[arg(long, value_enum, default_value = "f32")]
    kv_cache: KvCache,
    /// The tensor-core products (prefill GEMMs and attention): exact splits
    /// each activation in two f16 parts (the f32 floor), fast rounds it
    /// once (fewer products; close router logits may pick other experts).
    #[arg(long, value_enum, default_value = "exact")]
    precision: PrecisionArg,
    #[command(flatten)]
    pub experts: ExpertArgs,
}

/// Streamed experts (`ModelOptions::expert_slots`): what the commands that
/// load a model share.
#[derive(clap::Args, Clone, Debug)]
pub struct ExpertArgs {
    /// Keep each MoE layer's routed experts in the checkpoint and stream
    /// them through N device slots a layer (at least top_k; past the expert
    /// count, a slot each),
    /// instead of all resident: less device memory, an upload per miss.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub expert_slots: Option<usize>,
    /// Which streamed expert a miss evicts: lfu (least used, then least
    /// recent) or lru.
    #[arg(long, default_value = "lfu", value_parser = parse_policy)]
    pub expert_policy: Policy,
    /// When a decode step of streamed experts runs every layer at once,
    /// its slots looked up on the device and its experts' ids read back
    /// once at its end (a step that missed reruns from the layer that
    /// missed): never (a readback a layer), after-hit (after a step in
    /// which every expert hit) or always.
    #[arg(long, default_value = "after-hit", value_parser = parse_optimism)]
    pub expert_optimism: Optimism,
    /// How a prefill batch whose streamed experts exceed the slots runs:
    /// full-layer (a layer's experts in stacks held for the pass, each
    /// written once) or token-waves (waves of tokens through the slots, no
    /// memory past them).
    #[arg(long, default_value = "full-layer", value_parser = parse_stream_prefill)]
    pub stream_prefill: StreamPrefill,
    /// Where a streamed expert's miss is copied from: mapping (the
    /// checkpoint's pages, by the host) or host (every expert copied once
    /// at load into host memory the GPU reads, so that a miss is the GPU's
    /// own copy and no host copy, for host memory the size of the experts;
    /// as mapping where the GPU shares the host's memory or the backend is
    /// the CPU).
    #[arg(long, default_value = "mapping", value_parser = parse_expert_store)]
    pub expert_store: ExpertStore,
}

pub fn parse_expert_store(s: &str) -> Result<ExpertStore, String> {
    ExpertStore::parse(s).map_err(|e| e.to_string())
}

pub fn parse_stream_prefill(s: &str) -> Result<StreamPrefill, String> {
    StreamPrefill::parse(s).map_err(|e| e.to_string())
}

fn parse_policy(s: &str) -> Result<Policy, String> {
    Policy::parse(s).map_err(|e| e.to_string())
}

pub fn parse_optimism(s: &str) -> Result<Optimism, String> {
    Optimism::parse(s).map_err(|e| e.to_string())
}

impl ExpertArgs {
    /// `opts` with these slots and policy.
    pub fn apply(&self, opts: ModelOptions) -> ModelOptions {
        ModelOptions {
            expert_slots: self.expert_slots,
            expert_policy: self.expert_policy,
            expert_optimism: self.expert_optimism,
            stream_prefill: self.stream_prefill,
            expert_store: self.expert_store,
            ..opts
        }
    }
}

impl RunArgs {
    /// The context to size the caches for ([`resolve_context`]: a warning
    /// when --max-context is past the model's max_position_embeddings).
    pub fn context(&self, dir: &std::path::Path) -> CliResult<usize> {
        resolve_context(dir, self.max_context)
    }

    /// `dir`'s checkpoint loaded on the backend asked for, and the
    /// device's name.
    pub fn load(&self, dir: &std::path::Path) -> CliResult<(AnyModel, String)> {
        let max_context = self.context(dir)?;
        self.load_with(dir, max_context)
    }

    /// [`Self::load`] with the context already resolved.
    pub fn load_with(
        &self,
        dir: &std::path::Path,
        max_context: usize,
    ) -> CliResult<(AnyModel, String)> {
        Ok(match self.backend {
            BackendKind::Cpu => {
                let (m, d) = self.load_on(CpuBackend::new(), dir, max_context)?;
                (AnyModel::Cpu(Box::new(m)), d)
            }
            BackendKind::Wgpu => {
                let (m, d) = self.load_on(open_wgpu(self.adapter.clone())?, dir, max_context)?;
                (AnyModel::Wgpu(Box::new(m)), d)
            }
        })
    }

    fn load_on<B: ComputeBackend>(
        &self,
        backend: B,
        dir: &std::path::Path,
        max_context: usize,
    ) -> CliResult<(OneSequence<B>, String)> {
        let (model, device) = self.load_model(backend, dir, max_context)?;
        Ok((OneSequence::new(model)?, device))
    }

    /// `dir`'s checkpoint loaded on `backend` as a [`Model`] any number of
    /// sequences share, and the device's name.
    pub fn load_model<B: ComputeBackend>(
        &self,
        backend: B,
        dir: &std::path::Path,
        max_context: usize,
    ) -> CliResult<(Model<B>, String)> {
        let device = format!(
            "{} ({})",
            backend.info().device_name,
            backend.info().backend
        );
        let ck = open_checkpoint(dir)?;
        let model = Model::load(
            backend,
            &ck,
            self.experts.apply(ModelOptions {
                max_context,
                prefill_batch: self.prefill_batch,
                kv_cache: self.kv_cache.dtype(),
                precision: self.precision.get(),
                ..Default::default()
            }),
        )?;
        Ok((model, device))
    }
}

/// A model on whichever backend the command line picked (boxed: one
/// lives for the run, and the wgpu one's handles are the larger).
pub enum AnyModel {
    Cpu(Box<OneSequence<CpuBackend>>),
    Wgpu(Box<OneSequence<WgpuBackend>>),
}

impl AnyModel {
    /// [`OneSequence::generate_streaming`].
    pub fn generate_streaming(
        &mut self,
        prompt: &[u32],
        opts: &GenerateOptions,
        on_token: impl FnMut(u32) -> ControlFlow<()>,
    ) -> turbospark::Result<Generation> {
        match self {
            AnyModel::Cpu(m) => m.generate_streaming(prompt, opts, on_token),
            AnyModel::Wgpu(m) => m.generate_streaming(prompt, opts, on_token),
        }
    }

    /// [`Drafter::generate`] with the drafter in `dir`, loaded for this
    /// model.
    pub fn generate_speculative(
        &mut self,
        dir: &std::path::Path,
        prompt: &[u32],
        opts: &GenerateOptions,
        spec: &SpeculativeOptions,
        on_token: impl FnMut(u32) -> ControlFlow<()>,
    ) -> turbospark::Result<(Generation, SpeculativeStats)> {
        fn run<B: ComputeBackend>(
            m: &mut OneSequence<B>,
            dir: &std::path::Path,
            prompt: &[u32],
            opts: &GenerateOptions,
            spec: &SpeculativeOptions,
            on_token: impl FnMut(u32) -> ControlFlow<()>,
        ) -> turbospark::Result<(Generation, SpeculativeStats)> {
            let (model, seq) = m.parts();
            let drafter = Drafter::load(model, dir)?;
            drafter.generate(model, seq, prompt, opts, spec, on_token)
        }
        match self {
            AnyModel::Cpu(m) => run(m, dir, prompt, opts, spec, on_token),
            AnyModel::Wgpu(m) => run(m, dir, prompt, opts, spec, on_token),
        }
    }

    /// [`OneSequence::record_routing`].
    pub fn record_routing(&mut self, on: bool) {
        match self {
            AnyModel::Cpu(m) => m.record_routing(on),
            AnyModel::Wgpu(m) => m.record_routing(on),
        }
    }

    /// [`OneSequence::take_routing`].
    pub fn take_routing(&mut self) -> Option<turbospark::model::experts::Trace> {
        match self {
            AnyModel::Cpu(m) => m.take_routing(),
            AnyModel::Wgpu(m) => m.take_routing(),
        }
    }

    /// [`OneSequence::take_stream_stats`].
    pub fn take_stream_stats(&mut self) -> Option<StreamStats> {
        match self {
            AnyModel::Cpu(m) => m.take_stream_stats(),
            AnyModel::Wgpu(m) => m.take_stream_stats(),
        }
    }

    /// [`OneSequence::expert_slots`].
    pub fn expert_slots(&self) -> Option<usize> {
        match self {
            AnyModel::Cpu(m) => m.expert_slots(),
            AnyModel::Wgpu(m) => m.expert_slots(),
        }
    }

    /// [`OneSequence::reset`]: an empty context.
    pub fn reset(&mut self) {
        match self {
            AnyModel::Cpu(m) => m.reset(),
            AnyModel::Wgpu(m) => m.reset(),
        }
    }

    /// On the CPU reference, the prompt's prefill batches before its last
    /// one, each through [`Model::prefill`] under a progress bar on a
    /// terminal's stderr (a long prompt runs minutes there): the batches
    /// [`Model::generate`] would run, so the same arithmetic. Returns where
    /// the rest of the prompt starts (0 on a GPU, or a prompt of one batch).
    pub fn prefill_with_progress(&mut self, prompt: &[u32]) -> turbospark::Result<usize> {
        let AnyModel::Cpu(m) = self else {
            return Ok(0);
        };
        let (model, seq) = m.parts();
        let batch = model.prefill_batch();
        let last = prompt.len().saturating_sub(1) / batch * batch;
        if last < 2 * batch {
            return Ok(0);
        }
        let bar = indicatif::ProgressBar::new(prompt.len() as u64).with_style(
            indicatif::ProgressStyle::with_template("prefill {pos}/{len} tokens {wide_bar} {eta}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        for chunk in prompt[..last].chunks(batch) {
            model.prefill(seq, chunk)?;
            bar.inc(chunk.len() as u64);
        }
        bar.finish_and_clear();
        Ok(last)
    }

    /// The context cut back to its first `p` tokens ([`Model::truncate`]).
    pub fn truncate(&mut self, p: usize) -> turbospark::Result<()> {
        match self {
            AnyModel::Cpu(m) => {
                let (model, seq) = m.parts();
                model.truncate(seq, p)
            }
            AnyModel::Wgpu(m) => {
                let (model, seq) = m.parts();
                model.truncate(seq, p)
            }
        }
    }

    /// Positions left in the context ([`OneSequence::max_context`] past
    /// [`OneSequence::position`]).
    pub fn room(&self) -> usize {
        match self {
            AnyModel::Cpu(m) => m.max_context() - m.position(),
            AnyModel::Wgpu(m) => m.max_context() - m.position(),
        }
    }
}

/// Sampling flags: none (or a temperature of 0) means greedy decoding.
#[derive(clap::Args, Clone, Debug)]
pub struct SamplingArgs {
    /// Softmax temperature; 0 is greedy (the default unless --top-k/--top-p are given).
    // (hyphen values: `-inf` is a float too, refused by the sampler by name)
    #[arg(long, allow_hyphen_values = true)]
    temperature: Option<f32>,
    /// Sample among the K most likely tokens.
    #[arg(long, allow_negative_numbers = true)]
    top_k: Option<usize>,
    /// Sample among the smallest set of tokens holding probability P.
    #[arg(long, allow_hyphen_values = true)]
    top_p: Option<f32>,
    /// Sample among the tokens at least P times as likely as the likeliest.
    #[arg(long, allow_hyphen_values = true)]
    min_p: Option<f32>,
    /// Divide the positive logits (multiply the negative ones) of tokens
    /// already seen, the prompt's included, by this (1.1 to 1.3 is usual).
    #[arg(long, allow_hyphen_values = true)]
    repetition_penalty: Option<f32>,
    /// Seed of the sampler.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    seed: u64,
}

impl SamplingArgs {
    pub fn sampling(&self) -> Sampling {
        // (a repetition penalty alone keeps greedy's pick, on penalized logits)
        let random = self.top_k.is_some() || self.top_p.is_some() || self.min_p.is_some();
        match self.temperature {
            None if !random && self.repetition_penalty.is_none() => Sampling::Greedy,
            t => Sampling::Random {
                temperature: t.unwrap_or(if random { 1.0 } else { 0.0 }),
                top_k: self.top_k,
                top_p: self.top_p,
                min_p: self.min_p,
                repetition_penalty: self.repetition_penalty,
                seed: self.seed,
            },
        }
    }
}

/// Most prompt-file bytes a context position may take: far more than any
/// token's text, so a prompt that could fit is never refused, while one
/// that cannot is refused before tokenizing (~120 bytes of memory a byte).
pub const PROMPT_BYTES_PER_TOKEN: u64 = 64;
/// Bytes allowed over that, for short contexts.
pub const PROMPT_SLACK_BYTES: u64 = 64 << 10;

/// The prompt's text: `--prompt`, or `--prompt-file`'s contents (a regular
/// file or standard input) of at most what `max_context` positions can
/// hold at [`PROMPT_BYTES_PER_TOKEN`].
fn prompt_text(a: &Args, max_context: usize) -> CliResult<Option<String>> {
    let Some(path) = &a.prompt_file else {
        return Ok(a.prompt.clone());
    };
    let limit = (max_context as u64)
        .saturating_mul(PROMPT_BYTES_PER_TOKEN)
        .saturating_add(PROMPT_SLACK_BYTES);
    let what = format!("--prompt-file {}", path.display());
    let why = format!(
        "{PROMPT_BYTES_PER_TOKEN} bytes a position of the {max_context}-token context, \
         and {PROMPT_SLACK_BYTES} more"
    );
    let limit = (limit, why.as_str());
    Ok(Some(if path.as_os_str() == "-" {
        read_text_bounded(std::io::stdin().lock(), &what, limit)?
    } else {
        read_text_file(path, &what, limit)?
    }))
}

pub fn run(a: Args) -> CliResult {
    let tok = tokenizer(&a.model)?;
    let max_context = a.run.context(&a.model)?;
    let text = prompt_text(&a, max_context)?;
    // With --chat, where the model's turn ends (its id, from the tokenizer),
    // and the checkpoint's template, if it has one.
    let turn_end = match (&tok, a.chat) {
        (Some(t), true) => Some(turns::turn_end_id(t)?),
        (None, true) => {
            return Err(format!(
                "--chat needs the checkpoint's tokenizer.json ({} has none)",
                a.model.display()
            )
            .into())
        }
        (_, false) => None,
    };
    if tok.is_none() && !a.stops.is_empty() {
        return Err(format!(
            "--stop matches text, which needs the checkpoint's tokenizer.json ({} has none)",
            a.model.display()
        )
        .into());
    }
    if a.stops.iter().any(String::is_empty) {
        return Err("--stop needs a non-empty string".into());
    }
    let chat_turns = if a.chat {
        Some(turns::Turns::of(&a.model)?)
    } else {
        None
    };
    let prompt = match (&text, &a.tokens, &tok) {
        (Some(text), None, Some(t)) if a.chat => chat_turns
            .as_ref()
            .expect("set with --chat")
            .first(t, a.system.as_deref(), text)?,
        (_, Some(_), _) if a.chat => return Err("--chat takes --prompt, not --tokens".into()),
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
    let mut on_token = |id: u32| {
        if Some(id) == turn_end {
            return ControlFlow::Break(());
        }
        out.take(id)?;
        if a.stops.iter().any(|s| out.printed().contains(s.as_str())) {
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    };
    crate::common::check_stdout_open()?;
    let (mut model, device) = a.run.load_with(&a.model, max_context)?;
    model.record_routing(a.routing_trace.is_some());
    // (the CPU backend reads its weights from the maps as it generates)
    crate::mapped::check_unchanged()?;
    let t0 = std::time::Instant::now();
    let mut before = 0.0;
    let (mut g, done, spec) = match &a.draft_model {
        Some(dir) => {
            let spec = SpeculativeOptions {
                draft_tokens: a
                    .draft_tokens
                    .unwrap_or(turbospark::model::drafter::DEFAULT_DRAFT_TOKENS),
                forced: None,
            };
            let (g, st) = model.generate_speculative(dir, &prompt, &opts, &spec, &mut on_token)?;
            (g, 0, Some((spec.draft_tokens, st)))
        }
        None => {
            let done = model.prefill_with_progress(&prompt)?;
            before = t0.elapsed().as_secs_f64();
            let g = model.generate_streaming(&prompt[done..], &opts, &mut on_token)?;
            (g, done, None)
        }
    };
    if done > 0 && g.prefill_tok_s > 0.0 {
        // (the whole prompt's rate: its batches before the last, then the rest)
        let rest = (prompt.len() - done) as f64 / g.prefill_tok_s;
        g.prefill_tok_s = prompt.len() as f64 / (before + rest);
    }
    out.finish()?;
    if let (Some(path), Some(trace)) = (&a.routing_trace, model.take_routing()) {
        let mut text = Vec::new();
        trace
            .write(&mut text)
            .and_then(|()| std::fs::write(path, &text))
            .map_err(|e| format!("--routing-trace {}: {e}", path.display()))?;
        eprintln!(
            "routing trace: {} tokens x {} MoE layers into {}",
            trace.tokens.len(),
            trace.layers(),
            path.display()
        );
    }
    eprintln!(
        "{device}: {} prompt tokens, {} new; prefill {:.1} tok/s, decode {:.1} tok/s",
        prompt.len(),
        g.tokens.len(),
        g.prefill_tok_s,
        g.decode_tok_s
    );
    if let (true, Some((k, st))) = (a.stats, &spec) {
        eprintln!("{}", speculative_line(*k, st));
    }
    if a.stats {
        match model.take_stream_stats() {
            Some(st) => eprintln!(
                "{}",
                stats_line(&st, prompt.len() + g.tokens.len(), model.expert_slots())
            ),
            None => eprintln!("experts: resident (no --expert-slots), nothing streamed"),
        }
    }
    Ok(())
}

/// A speculative generation's counters, in one line.
pub fn speculative_line(k: usize, st: &SpeculativeStats) -> String {
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    format!(
        "speculative: {k} draft tokens a round, {} rounds; {} of {} drafts accepted ({:.1}%); \
         {:.2} tokens a target pass; drafting {:.1} ms ({:.2} ms a round), verifying {:.1} ms \
         ({:.2} ms a round)",
        st.rounds,
        st.accepted,
        st.drafted,
        100.0 * st.acceptance_rate(),
        st.tokens_per_pass(),
        ms(st.draft_time),
        ms(st.draft_time) / st.rounds.max(1) as f64,
        ms(st.verify_time),
        ms(st.verify_time) / st.rounds.max(1) as f64,
    )
}

/// The streamed experts' counters over `tokens` tokens, in one line.
pub fn stats_line(st: &StreamStats, tokens: usize, slots: Option<usize>) -> String {
    let per = |v: f64| v / tokens.max(1) as f64;
    let write_s = st.write_time.as_secs_f64();
    format!(
        "experts: {} slots a layer; {} hits, {} misses ({:.1}% hit); {} streamed \
         ({} a token, {}); {:.2} host waits a token, \
         host wait {:.2} ms a token; {} optimistic decode passes, {} stood{}; {} \
         prefill layer passes through full-layer stacks, {} in waves",
        slots.map_or("?".into(), |n| n.to_string()),
        st.counts.hits,
        st.counts.misses,
        100.0 * st.counts.hit_rate(),
        crate::common::human_bytes(st.bytes),
        crate::common::human_bytes(per(st.bytes as f64) as u64),
        match st.write_path {
            // (the device's copies are not timed on the host)
            Some(SlotWrite::Device) => "copied by the device from the host store".into(),
            path if write_s > 0.0 => format!(
                "copied from the mapping at {:.2} GB/s, {}",
                st.bytes as f64 / write_s / 1e9,
                path.map_or("?", |p| p.name())
            ),
            _ => "copied from the mapping".into(),
        },
        per(st.waits as f64),
        per(st.host_wait.as_secs_f64() * 1e3),
        st.optimistic,
        st.stood,
        if st.optimistic > 0 {
            format!(
                " ({:.1}%; {} layers rerun)",
                100.0 * st.stood as f64 / st.optimistic as f64,
                st.rerun_layers
            )
        } else {
            String::new()
        },
        st.full_layer_passes,
        st.extra_waves
    )
}
