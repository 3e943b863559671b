//! `turbospark bench`: every decode op of Gemma 4 26B-A4B at its real shape,
//! per backend, against the bandwidth ceiling measured in the same run.
//!
//! For each case and backend: median and spread of the time per call over
//! repeated calls (GPU timestamps where the adapter has them, else the wall
//! clock around a blocking wait), the bytes the op must move (each input read
//! once, each output written once; only the selected experts for MoE), the
//! GB/s that makes, and its share of the ceiling. Inputs rotate over several
//! buffer sets so a small op's data is not served from cache.

mod cases;
mod clock;
mod e2e;
mod fidelity;
mod measure;
mod parallel;
mod replay;
mod report;
mod serve;
mod speculative;
mod streaming;

use std::path::PathBuf;
use std::process::ExitCode;

use turbospark::parity::Case as _;
use turbospark_cpu::CpuBackend;
use turbospark_wgpu::{WgpuBackend, WgpuOptions};

use measure::{Bench, Budget, Ceiling, Outcome};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Which {
    Cpu,
    Wgpu,
    All,
}

/// Per-op timings at Gemma 4 26B-A4B's shapes against the measured bandwidth ceiling.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Backends to measure side by side.
    #[arg(long, value_enum, default_value = "all")]
    pub backend: Which,
    /// Small shapes and short runs (CI).
    #[arg(long)]
    pub quick: bool,
    /// Write every figure and the machine's description as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Draw achieved GB/s per op and backend against the ceiling as SVG.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Only cases whose label contains this; `,` separates alternatives
    /// (labels hold `|`, as in `q|k|v sliding`), and an alternative ending
    /// in `$` must end the label (`"moe_down m=1$,pair m=1$"`).
    #[arg(long, default_value = "")]
    pub filter: String,
    /// Case-insensitive substring of the wgpu adapter name (else TURBOSPARK_ADAPTER).
    #[arg(long)]
    pub adapter: Option<String>,
    /// Also run the cases the CPU reference skips by default (the LM head at M = 16).
    #[arg(long)]
    pub cpu_all: bool,
    /// Seconds to spend per case on the GPU (default 0.25, quick 0.02).
    #[arg(long)]
    pub gpu_seconds: Option<f64>,
    /// Seconds to spend per case on the CPU (default 2, quick 0.02).
    #[arg(long)]
    pub cpu_seconds: Option<f64>,
    /// Size of the ceiling's streamed buffer in MiB (default 1024, quick 64;
    /// clamped to the device's largest binding).
    #[arg(long)]
    pub ceiling_mib: Option<u64>,
    /// Time GPU ops with the wall clock around a blocking wait even where the
    /// adapter has timestamp queries (includes submit and launch overhead).
    #[arg(long)]
    pub wall_clock: bool,
    /// End to end: also load this synthetic model (`gemma-4-26b-a4b`,
    /// `gemma-4-26b-a4b-narrow`: its routing 256 wide, `tiny`)
    /// with random bf16 weights and time prefill and decode on every backend.
    #[arg(long)]
    pub synthetic: Option<String>,
    /// End to end: keep only the synthetic model's first N decoder layers
    /// (a cut that loads in seconds, for A/B runs; its bound is the cut's).
    #[arg(long)]
    pub layers: Option<usize>,
    /// Prompt length of the end-to-end prefill.
    #[arg(long, default_value_t = 512)]
    pub prompt_tokens: usize,
    /// Tokens decoded in the end-to-end run.
    #[arg(long, default_value_t = 64)]
    pub decode_tokens: usize,
    /// End to end: also time decode at these contexts (comma-separated
    /// prompt lengths, e.g. 8192,32768): a random prompt of each length,
    /// then `--decode-tokens` tokens, with the KV caches read at that
    /// context counted in its bound. The caches are sized for the longest.
    #[arg(long, value_delimiter = ',')]
    pub decode_context: Vec<usize>,
    /// Most prompt tokens per prefill pass in the end-to-end run.
    #[arg(long, default_value_t = turbospark::model::DEFAULT_PREFILL_BATCH)]
    pub prefill_batch: usize,
    /// The KV caches' element type of the attention and qkv_post cases and
    /// the end-to-end model (their bytes moved and bounds count it).
    #[arg(long, value_enum, default_value = "f32")]
    pub kv_cache: crate::common::KvCache,
    /// Quantized weights: each per-op case that reads a weight also runs
    /// with it in this format, and the end-to-end model is loaded in it
    /// (random packed values, scales and biases; the router at 8 bits).
    #[arg(long, value_enum)]
    pub quant: Option<crate::common::Quant>,
    /// End to end: pairs of runs per kernel in the decode step's ablation
    /// (default 3, quick 1; 0 leaves the ablation out: a model whose
    /// prefill is slow spends minutes in it).
    #[arg(long)]
    pub ablation_pairs: Option<usize>,
    /// Replay this routing trace (a header `experts E`, then a line per
    /// token: each MoE layer's expert ids, `,` within a layer, `;` between
    /// layers) through the expert-slot counts and policies asked for,
    /// beside offline-optimal replacement, and exit: no GPU needed.
    #[arg(long)]
    pub replay_trace: Option<std::path::PathBuf>,
    /// Expert slots per layer to replay (`,`-separated; default 8, 16, 32,
    /// 64 where the trace has that many experts).
    #[arg(long, value_delimiter = ',')]
    pub expert_slots: Vec<usize>,
    /// Slot replacement policies to replay (`lfu`, `lru`; `,`-separated).
    #[arg(long, value_delimiter = ',', default_value = "lfu,lru")]
    pub policy: Vec<String>,
    /// End to end with streamed experts: load the `--synthetic` model
    /// resident and with each of these expert slot counts a layer
    /// (`,`-separated), report decode, hit rates, traffic, device memory and
    /// the miss cost model (on the wgpu backend, or the CPU with `--backend
    /// cpu`), and exit.
    #[arg(long, value_delimiter = ',')]
    pub stream_slots: Vec<usize>,
    /// Speculative decoding on the `--synthetic` model, and exit: a
    /// verification pass of k + 1 = 2..5 tokens against one decode step,
    /// and decode with a synthetic drafter whose proposals are forced right
    /// at rates 0.5, 0.7 and 0.9 (on the wgpu backend, or the CPU with
    /// `--backend cpu`).
    #[arg(long)]
    pub speculative: bool,
    /// Aggregate decode throughput on the `--synthetic` model at these
    /// stream counts (`,`-separated, e.g. 1,4,16), and exit: that many
    /// sequences stepped together by `Model::decode_batch` (as `serve
    /// --parallel` runs them), aggregate and per-stream tok/s (on the wgpu
    /// backend, or the CPU with `--backend cpu`).
    #[arg(long, value_delimiter = ',', value_name = "N,..")]
    pub parallel: Vec<usize>,
    /// What the server costs a stream, and exit: the `--synthetic` model's
    /// time to first token and decode tok/s through `generate`'s path and
    /// through one streamed `/v1/completions` request to a server on the
    /// same loaded model (on the wgpu backend, or the CPU with `--backend
    /// cpu`).
    #[arg(long)]
    pub serve: bool,
    /// --speculative: the synthetic drafter's layers (the last full).
    #[arg(long, default_value_t = 4)]
    pub draft_layers: usize,
    /// --speculative: the synthetic drafter's hidden size (its MLP 4x).
    #[arg(long, default_value_t = 1024)]
    pub draft_hidden: usize,
    /// With --stream-slots: route the streamed runs by this routing trace
    /// (`generate --routing-trace`'s format, read from its first token again
    /// after its last) instead of the synthetic router's near-uniform
    /// choice: its ids replace the router's top-k, the weights kept, so the
    /// slots miss, evict and upload as that routing makes them.
    #[arg(long)]
    pub route_by_trace: Option<std::path::PathBuf>,
    /// With --stream-slots: when a decode step runs every layer at once
    /// with its slots looked up on the device, its experts' ids read back
    /// once at its end (never: a readback a layer; after-hit: after a step
    /// in which every expert hit; always).
    #[arg(long, default_value = "after-hit", value_parser = crate::generate::parse_optimism)]
    pub expert_optimism: turbospark::model::experts::Optimism,
    /// With --stream-slots: how a prefill batch past the slots runs
    /// (full-layer or token-waves).
    #[arg(long, default_value = "full-layer", value_parser = crate::generate::parse_stream_prefill)]
    pub stream_prefill: turbospark::model::experts::StreamPrefill,
    /// With --stream-slots: where misses are copied from (mapping, or host:
    /// every expert in host memory the GPU copies from).
    #[arg(long, default_value = "mapping", value_parser = crate::generate::parse_expert_store)]
    pub expert_store: turbospark::model::experts::ExpertStore,
    /// Write a generated routing trace for the `--synthetic` model's shape
    /// to this file (for --route-by-trace), print its parameters and its
    /// LFU hit rate at 16 slots, and exit.
    #[arg(long)]
    pub make_trace: Option<std::path::PathBuf>,
    /// --make-trace: tokens.
    #[arg(long, default_value_t = 512)]
    pub trace_tokens: usize,
    /// --make-trace: Zipf exponent of each layer's expert popularity (0:
    /// uniform).
    #[arg(long, default_value_t = 1.0)]
    pub trace_skew: f64,
    /// --make-trace: chance that each of a token's experts is one of the
    /// previous token's in that layer.
    #[arg(long, default_value_t = 0.5)]
    pub trace_reuse: f64,
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The tensor-core products of the per-op cases and the end-to-end
    /// model: exact (split activations) or fast (rounded once). The
    /// end-to-end run also times the prefill at the other and compares the
    /// two on its prompt (logits, argmax, expert choices).
    #[arg(long, value_enum, default_value = "exact")]
    pub precision: crate::common::PrecisionArg,
    /// Checkpoints with an `expected.json` (the transformers fixtures,
    /// e.g. tests/fixtures/wide-text): fast against exact on each, and each
    /// against transformers' logits and greedy tokens (`,`-separated).
    #[arg(long, value_delimiter = ',')]
    pub fidelity: Vec<std::path::PathBuf>,
}

impl Args {
    /// The synthetic model's weight format as the runs name it (`q4g64`,
    /// or `bf16`).
    pub fn weights_name(&self) -> String {
        self.quant.map_or("bf16".to_string(), |q| q.affine().name())
    }
}

/// Whether `--filter` selects the case `label`: empty selects all, else any
/// `,`-separated alternative contained in it (one ending in `$` must end it).
fn selects(filter: &str, label: &str) -> bool {
    filter.is_empty()
        || filter.split(',').any(|alt| match alt.strip_suffix('$') {
            Some(end) => label.ends_with(end),
            None => label.contains(alt),
        })
}

/// A `--filter` with an empty alternative (`a,,b`, a trailing `,`, a bare
/// `$`) would select every case: an error, not a silent full run.
fn check_filter(filter: &str) -> Result<(), String> {
    if filter.is_empty() || filter.split(',').all(|a| !a.is_empty() && a != "$") {
        Ok(())
    } else {
        Err(format!("--filter {filter:?} has an empty alternative"))
    }
}

/// One backend, opened, with its ceiling and results.
pub struct Run {
    pub name: &'static str,
    pub info: turbospark::BackendInfo,
    pub budget: Budget,
    pub ceiling: Result<Ceiling, String>,
    /// One outcome per case, in case order.
    pub outcomes: Vec<Outcome>,
    /// Timestamp period and such, for the JSON.
    pub extra: serde_json::Value,
}

fn budgets(a: &Args) -> (Budget, Budget) {
    let mib = a.ceiling_mib.unwrap_or(if a.quick { 64 } else { 1024 }) << 20;
    let gpu = Budget {
        seconds: a.gpu_seconds.unwrap_or(if a.quick { 0.02 } else { 0.25 }),
        min_reps: if a.quick { 3 } else { 10 },
        max_reps: if a.quick { 20 } else { 200 },
        rotate_bytes: if a.quick { 4 << 20 } else { 256 << 20 },
        max_sets: if a.quick { 4 } else { 128 },
        ceiling_bytes: mib,
        // Single ops' sizes: the MoE decode phases read 32 and 64 MB, the
        // per-layer GEMVs 23-52 MB, attention at 8K 4-17 MB.
        stream_sizes: if a.quick {
            &[1 << 20, 2 << 20]
        } else {
            &[8 << 20, 16 << 20, 32 << 20, 64 << 20, 128 << 20]
        },
        wall_clock: a.wall_clock,
        // GPUs idle at low clocks between cases (the H200 at 345 MHz): a
        // short case measured cold ran 4x slow. Keep the device busy first:
        // 0.3 s left the H200 at 1140 MHz (its ramp can rest there) for the
        // MoE decode cases of runs 03 and 07 at 641cf64 (2026-12-01), which
        // read 2.6x slow after several seconds of host setup; 1 s of work
        // first.
        warmup_seconds: if a.quick { 0.0 } else { 1.0 },
    };
    let cpu = Budget {
        seconds: a.cpu_seconds.unwrap_or(if a.quick { 0.02 } else { 2.0 }),
        min_reps: if a.quick { 3 } else { 2 },
        max_reps: if a.quick { 10 } else { 20 },
        rotate_bytes: if a.quick { 4 << 20 } else { 256 << 20 },
        max_sets: 4,
        ceiling_bytes: mib,
        stream_sizes: &[],
        wall_clock: true,
        warmup_seconds: 0.0,
    };
    (gpu, cpu)
}

fn open_run<B: Bench>(b: &B, budget: Budget, extra: serde_json::Value) -> Run {
    eprintln!(
        "bench: {} on {} ({}): measuring the ceiling",
        b.name(),
        b.info().device_name,
        b.info().api
    );
    let ceiling = b.ceiling(&budget).map_err(|e| e.to_string());
    match &ceiling {
        Ok(c) => eprintln!(
            "bench: {} ceiling {:.1} GB/s ({}); host to device {}",
            b.name(),
            c.gbps(),
            c.how,
            c.upload.as_ref().map_or("not measured".into(), |u| format!(
                "{:.1} GB/s ({} MiB writes)",
                u.gbps(),
                u.bytes >> 20
            ))
        ),
        Err(e) => eprintln!("bench: {} ceiling failed: {e}", b.name()),
    }
    Run {
        name: b.name(),
        info: b.info().clone(),
        budget,
        ceiling,
        outcomes: Vec::new(),
        extra,
    }
}

fn step<B: Bench>(
    b: &B,
    run: &mut Run,
    case: &cases::Case,
    host: &mut Option<cases::HostSets>,
    seed: u64,
    cpu_all: bool,
) {
    if let Some(o) = measure::precheck(b, case, cpu_all) {
        run.outcomes.push(o);
        return;
    }
    let budget = run.budget;
    // Inputs are made once per case and shared by every backend.
    let host = host.get_or_insert_with(|| {
        cases::host_sets(&case.op, seed, budget.rotate_bytes, budget.max_sets)
    });
    let o = measure::run_case(b, case, host, &budget);
    eprintln!(
        "bench:   {:<5} {}",
        b.name(),
        report::outcome_brief(&o, host.bytes)
    );
    run.outcomes.push(o);
}

/// Write `--json` and `--plot` for the cases measured so far.
fn write_files(
    args: &Args,
    cases: &[cases::Case],
    bytes: &[u64],
    runs: &[Run],
    notes: &[String],
    end_to_end: &serde_json::Value,
    complete: bool,
) -> Result<(), ()> {
    let rep = report::Report {
        args,
        cases: &cases[..bytes.len()],
        bytes,
        runs,
        notes,
        end_to_end: end_to_end.clone(),
    };
    let mut json = rep.json();
    json["complete"] = complete.into();
    let files = [(&args.json, json.to_string()), (&args.plot, rep.svg())];
    for (path, text) in files {
        if let Some(path) = path {
            std::fs::write(path, text).map_err(|e| {
                eprintln!("bench: writing {}: {e}", path.display());
            })?;
        }
    }
    Ok(())
}

/// `bench --make-trace`: a generated trace of the `--synthetic` model's
/// shape, written, its parameters and LFU hit rate at 16 slots printed.
fn make_trace(args: &Args, path: &std::path::Path) -> turbospark::Result<()> {
    use turbospark::model::experts::{replay, Policy, Trace, TraceShape};
    let name = args.synthetic.as_deref().ok_or_else(|| {
        turbospark::Error::InvalidInput(
            "--make-trace takes the model's shape from --synthetic".into(),
        )
    })?;
    let cfg = e2e::config(name, args.layers)?;
    let shape = TraceShape {
        tokens: args.trace_tokens,
        skew: args.trace_skew,
        reuse: args.trace_reuse,
        seed: args.seed,
    };
    let layers = if cfg.enable_moe { cfg.layers.len() } else { 0 };
    let trace = Trace::generate(cfg.experts, layers, cfg.top_k, shape)?;
    let mut text = Vec::new();
    trace
        .write(&mut text)
        .and_then(|()| std::fs::write(path, &text))
        .map_err(|e| turbospark::Error::io(format!("--make-trace {}", path.display()), e))?;
    let slots = 16.min(cfg.experts);
    let hits = replay(&trace, slots, Policy::Lfu)?.hit_rate();
    println!(
        "routing trace {}: {} tokens x {layers} layers, top-{} of {} experts, skew {}, \
         reuse {}, seed {}: LFU hit rate at {slots} slots {:.1}%",
        path.display(),
        shape.tokens,
        cfg.top_k,
        cfg.experts,
        shape.skew,
        shape.reuse,
        shape.seed,
        100.0 * hits
    );
    Ok(())
}

/// `turbospark bench`.
pub fn main(args: Args) -> ExitCode {
    if let Some(path) = &args.replay_trace {
        return match replay::run(path, &args.expert_slots, &args.policy) {
            Ok(v) => match &args.json {
                Some(out) => match std::fs::write(out, v.to_string()) {
                    Ok(()) => ExitCode::SUCCESS,
                    Err(e) => {
                        eprintln!("bench: writing {}: {e}", out.display());
                        ExitCode::FAILURE
                    }
                },
                None => ExitCode::SUCCESS,
            },
            Err(e) => {
                eprintln!("bench: --replay-trace: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if let Err(e) = check_filter(&args.filter) {
        eprintln!("bench: {e}");
        return ExitCode::FAILURE;
    }
    if let Some(path) = &args.make_trace {
        return match make_trace(&args, path) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("bench: --make-trace: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if !args.stream_slots.is_empty() {
        return stream_main(&args);
    }
    if args.speculative {
        return speculative_main(&args);
    }
    if args.serve {
        return serve_main(&args);
    }
    if !args.parallel.is_empty() {
        return parallel_main(&args);
    }
    // A bad --synthetic / --layers fails before minutes of per-op cases.
    if let Some(name) = &args.synthetic {
        if let Err(e) = e2e::config(name, args.layers) {
            eprintln!("bench: --synthetic {name}: {e}");
            return ExitCode::FAILURE;
        }
    } else if args.layers.is_some() || !args.decode_context.is_empty() {
        eprintln!(
            "bench: --layers and --decode-context need a synthetic model: pass --synthetic too"
        );
        return ExitCode::FAILURE;
    }
    if args.decode_context.contains(&0) {
        eprintln!("bench: --decode-context: a context is a prompt of at least one token");
        return ExitCode::FAILURE;
    }
    let (gpu_budget, cpu_budget) = budgets(&args);
    let want_cpu = matches!(args.backend, Which::Cpu | Which::All);
    let want_wgpu = matches!(args.backend, Which::Wgpu | Which::All);
    let mut notes = Vec::new();

    let mut wgpu = if want_wgpu {
        match WgpuBackend::new(&WgpuOptions {
            adapter: args.adapter.clone(),
            ..Default::default()
        }) {
            Ok(b) => Some(b),
            Err(e) if args.backend == Which::Wgpu => {
                eprintln!("bench: the wgpu backend could not start: {e}");
                return ExitCode::FAILURE;
            }
            Err(e) => {
                eprintln!("bench: no wgpu backend ({e}); measuring the CPU only");
                notes.push(format!("wgpu unavailable: {e}"));
                None
            }
        }
    } else {
        None
    };
    let mut cpu = want_cpu.then(CpuBackend::new);

    let mut runs: Vec<Run> = Vec::new();
    if let Some(b) = &wgpu {
        let extra = serde_json::json!({
            "timestamp_period_ns": b.queue().get_timestamp_period(),
            "limits": format!("{:?}", b.wgpu_limits()),
        });
        runs.push(open_run(b, gpu_budget, extra));
    }
    if let Some(b) = &cpu {
        let extra = serde_json::json!({ "threads": 1 });
        runs.push(open_run(b, cpu_budget, extra));
    }

    let all = cases::cases(
        args.quick,
        args.kv_cache.dtype(),
        args.quant.map(|q| q.affine()),
    );
    // Each case's seed follows its place in the full list, so a filtered
    // run times the same inputs.
    let (seeds, selected): (Vec<u64>, Vec<cases::Case>) = all
        .into_iter()
        .enumerate()
        .filter(|(_, c)| selects(&args.filter, &c.label))
        .map(|(i, c)| {
            // (every case's tensor-core products at --precision)
            let op = c.op.with_precision(args.precision.get());
            (args.seed.wrapping_add(i as u64), cases::Case { op, ..c })
        })
        .unzip();
    let mut bytes = Vec::with_capacity(selected.len());
    for (i, case) in selected.iter().enumerate() {
        eprintln!("bench: [{}/{}] {}", i + 1, selected.len(), case.label);
        let seed = seeds[i];
        let mut host = None;
        let mut k = 0;
        if let Some(b) = &wgpu {
            step(b, &mut runs[k], case, &mut host, seed, args.cpu_all);
            k += 1;
        }
        if let Some(b) = &cpu {
            step(b, &mut runs[k], case, &mut host, seed, args.cpu_all);
        }
        // Bytes moved do not depend on the backend; cases no backend ran
        // still get their figure.
        bytes.push(host.map(|h| h.bytes).unwrap_or_else(|| case.op.bytes(&[])));
        // Rewrite the files after every case, so a run cut short by a time
        // limit still leaves what it measured (`"complete": false`).
        let done = bytes.len() == selected.len();
        if !done
            && write_files(
                &args,
                &selected,
                &bytes,
                &runs,
                &notes,
                &e2e::not_run(),
                false,
            )
            .is_err()
        {
            return ExitCode::FAILURE;
        }
    }

    // Fast against exact on the fixtures asked for, each on a backend of
    // its own (a model takes its backend over).
    let mut fidelity = Vec::new();
    for dir in &args.fidelity {
        if want_wgpu && wgpu.is_some() {
            match WgpuBackend::new(&WgpuOptions {
                adapter: args.adapter.clone(),
                ..Default::default()
            }) {
                Ok(b) => fidelity.push(fidelity::fixture(b, dir)),
                Err(e) => notes.push(format!("fidelity: wgpu unavailable: {e}")),
            }
        }
        if want_cpu {
            fidelity.push(fidelity::fixture(CpuBackend::new(), dir));
        }
    }

    // End to end last: the model takes the backend over, after the per-op
    // cases have released their buffers.
    let mut end_to_end = match &args.synthetic {
        None => e2e::not_run(),
        Some(name) => {
            let ceiling = |k: usize| {
                runs.get(k)
                    .and_then(|r| r.ceiling.as_ref().ok())
                    .map(|c| c.gbps())
            };
            let mut all = Vec::new();
            let mut k = 0;
            if let Some(b) = wgpu.take() {
                all.push(e2e::run(b, name, &args, ceiling(k)));
                k += 1;
            }
            if let Some(b) = cpu.take() {
                all.push(e2e::run(b, name, &args, ceiling(k)));
            }
            let note = all
                .iter()
                .filter_map(|v| v["note"].as_str())
                .collect::<Vec<_>>()
                .join("; ");
            serde_json::json!({ "runs": all, "note": note })
        }
    };
    end_to_end["fidelity"] = fidelity.into();
    let rep = report::Report {
        args: &args,
        cases: &selected,
        bytes: &bytes,
        runs: &runs,
        notes: &notes,
        end_to_end,
    };
    print!("{}", rep.table());
    if write_files(
        &args,
        &selected,
        &bytes,
        &runs,
        &notes,
        &rep.end_to_end,
        true,
    )
    .is_err()
    {
        return ExitCode::FAILURE;
    }
    let failed = runs
        .iter()
        .any(|r| r.ceiling.is_err() || r.outcomes.iter().any(|o| matches!(o, Outcome::Failed(_))));
    if failed {
        eprintln!("bench: some measurements failed (see the table)");
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// `$run(backend, name, args)` (a bench generic over the backend) on the
/// backend `--backend` names: the CPU reference, or wgpu on `--adapter`.
macro_rules! on_backend {
    ($args:expr, $name:expr, $run:path) => {
        if $args.backend == Which::Cpu {
            $run(CpuBackend::new(), $name, $args)
        } else {
            WgpuBackend::new(&WgpuOptions {
                adapter: $args.adapter.clone(),
                ..Default::default()
            })
            .and_then(|b| $run(b, $name, $args))
        }
    };
}

/// The `--synthetic` model a bench of a synthetic model (`flag`) runs,
/// or an error saying that it needs one.
fn synthetic_name<'a>(args: &'a Args, flag: &str) -> Option<&'a str> {
    let name = args.synthetic.as_deref();
    if name.is_none() {
        eprintln!("bench: {flag} needs a synthetic model: pass --synthetic too");
    }
    name
}

/// A synthetic bench's report: printed where `print` (the others print
/// their lines as they go), written with `--json`; an error named by its
/// flag.
fn finish(
    args: &Args,
    flag: &str,
    print: bool,
    result: turbospark::Result<serde_json::Value>,
) -> ExitCode {
    match result {
        Ok(v) => {
            if print {
                println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
            }
            if let Some(out) = &args.json {
                if let Err(e) = std::fs::write(out, v.to_string()) {
                    eprintln!("bench: writing {}: {e}", out.display());
                    return ExitCode::FAILURE;
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("bench: {flag}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `bench --stream-slots`: [`streaming::run`] on one backend, the report
/// printed (and written with `--json`).
fn stream_main(args: &Args) -> ExitCode {
    let Some(name) = synthetic_name(args, "--stream-slots") else {
        return ExitCode::FAILURE;
    };
    let result = on_backend!(args, name, streaming::run);
    finish(args, "--stream-slots", true, result)
}

/// `bench --parallel`: [`parallel::run`] on one backend, its lines printed
/// (the report written with `--json`).
fn parallel_main(args: &Args) -> ExitCode {
    let Some(name) = synthetic_name(args, "--parallel") else {
        return ExitCode::FAILURE;
    };
    let result = on_backend!(args, name, parallel::run);
    finish(args, "--parallel", false, result)
}

/// `bench --serve`: [`serve::run`] on one backend, its lines printed (the
/// report written with `--json`).
fn serve_main(args: &Args) -> ExitCode {
    let Some(name) = synthetic_name(args, "--serve") else {
        return ExitCode::FAILURE;
    };
    let result = on_backend!(args, name, serve::run);
    finish(args, "--serve", false, result)
}

/// `bench --speculative`: [`speculative::run`] on one backend, its lines
/// printed (the report written with `--json`).
fn speculative_main(args: &Args) -> ExitCode {
    let Some(name) = synthetic_name(args, "--speculative") else {
        return ExitCode::FAILURE;
    };
    let result = on_backend!(args, name, speculative::run);
    finish(args, "--speculative", false, result)
}

#[cfg(test)]
mod tests {
    use super::{check_filter, selects};

    #[test]
    fn filter_alternatives_and_anchors() {
        assert!(selects("", "moe_down m=16"));
        assert!(selects("moe_down", "moe_down m=16"));
        assert!(!selects("moe_down m=1$", "moe_down m=16"));
        assert!(selects("moe_down m=1$", "moe_down m=1"));
        assert!(selects("router,pair m=1$", "dense+moe down pair m=1"));
        assert!(!selects("router,pair m=1$", "dense+moe down pair m=16"));
        // labels with `|` are matched whole
        assert!(selects("dense gate|up m=1$", "dense gate|up m=1"));
        assert!(!selects("dense gate|up m=1$", "moe_gate_up m=1"));
        assert!(!selects("q|k|v sliding", "q_proj sliding m=1"));
    }

    #[test]
    fn empty_filter_alternatives_are_errors() {
        assert!(check_filter("").is_ok());
        assert!(check_filter("a,b$").is_ok());
        for f in ["a,", ",a", "a,,b", "$", "a,$"] {
            assert!(check_filter(f).is_err(), "{f}");
        }
    }
}
