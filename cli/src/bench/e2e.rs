//! End-to-end decode and prefill tokens/s on a synthetic model
//! (`--synthetic gemma-4-26b-a4b`, or `tiny`), next to the bandwidth bound:
//! bytes of weights read per decoded token over the ceiling measured in the
//! same run.

use serde_json::{json, Value};
use turbospark::model::synthetic::named_config;
use turbospark::model::{
    GenerateOptions, Model, ModelConfig, ModelOptions, OneSequence, Sampling, SyntheticSource,
};
use turbospark::rng::Rng;
use turbospark::{ComputeBackend, DType, Precision};
use turbospark_wgpu::WgpuBackend;

use super::measure::Stats;
use super::Args;
use crate::common::human_bytes;

/// What the report holds when no end-to-end run was asked for.
pub fn not_run() -> Value {
    json!({ "status": "not run", "note": "not run (pass --synthetic gemma-4-26b-a4b or tiny)" })
}

/// Counts dispatches and submits, and profiles a step, where the backend can.
pub trait Counters {
    fn counters(&self) -> Option<(u64, u64)>;
    /// Buffer copies recorded so far, where the backend counts them.
    fn copies(&self) -> Option<u64> {
        None
    }
    /// Start a per-dispatch GPU profile; false where there is none.
    fn profile_start(&self) -> bool {
        false
    }
    /// `(kernel, seconds)` per dispatch since `profile_start`.
    fn profile_stop(&self) -> Vec<(&'static str, f64)> {
        Vec::new()
    }
    /// Leave out the dispatches of these kernels (none: stop), for
    /// [`ablation`]; `Ok(false)` where the backend cannot.
    fn omit(&self, _kernels: &[&str]) -> turbospark::Result<bool> {
        Ok(false)
    }
    /// Device bytes held `(now, peak)`, where the backend counts them.
    fn memory(&self) -> Option<(u64, u64)> {
        None
    }
    /// Start the peak of [`Counters::memory`] again from what is held now.
    fn reset_peak_memory(&self) {}
    /// Let go of the backend's scratch (made again on use).
    fn release_scratch(&self) {}
}

impl Counters for WgpuBackend {
    fn counters(&self) -> Option<(u64, u64)> {
        Some(WgpuBackend::counters(self))
    }
    fn copies(&self) -> Option<u64> {
        Some(WgpuBackend::copies(self))
    }
    fn profile_start(&self) -> bool {
        WgpuBackend::profile_start(self).unwrap_or(false)
    }
    fn profile_stop(&self) -> Vec<(&'static str, f64)> {
        WgpuBackend::profile_stop(self).unwrap_or_default()
    }
    fn omit(&self, kernels: &[&str]) -> turbospark::Result<bool> {
        self.omit_dispatches(kernels).map(|()| true)
    }
    fn memory(&self) -> Option<(u64, u64)> {
        Some(WgpuBackend::memory(self))
    }
    fn reset_peak_memory(&self) {
        WgpuBackend::reset_peak_memory(self)
    }
    fn release_scratch(&self) {
        WgpuBackend::release_scratch(self)
    }
}

/// Most whole-prompt warm-up runs before the timed one.
const WARMUPS: usize = 8;

/// Decode steps the profile covers (the last prompt token's and one more).
const PROFILE_STEPS: usize = 2;

/// Decode steps each run of the ablation times.
const ABLATION_STEPS: usize = 16;

/// Decode steps counted for a step's dispatches and submits.
const COUNTED_STEPS: usize = 8;

/// Context positions past the timed run's: the profile's and the counted
/// steps continue it, each ablation run prefills the prompt again and
/// decodes its steps.
const SPARE_POSITIONS: usize = 32;
const _: () =
    assert!(PROFILE_STEPS + COUNTED_STEPS <= SPARE_POSITIONS && ABLATION_STEPS <= SPARE_POSITIONS);

/// Greedy generation of `n` tokens, run to its length (timed and compared
/// token for token).
fn greedy(n: usize) -> GenerateOptions {
    GenerateOptions {
        max_new_tokens: n,
        sampling: Sampling::Greedy,
        stop_at_eos: false,
    }
}

/// Pairs of runs (nothing left out, then the kernel left out) per kernel
/// in the ablation, outside `--quick`: its cost is the median of the pairs'
/// differences. One pair a kernel against one shared baseline read
/// rms_norm's single dispatch at 96.6 us a step on the H200 (2026-12-01
/// at ff0b6d1, run 05; its profile: 11 us), the runs' wall-clock jitter.
const ABLATION_PAIRS: usize = 3;

/// What each kernel of a decode step costs the step, its launches and the
/// barriers around them included: decode tokens/s with that kernel's
/// dispatches left out against with none left out, as microseconds per
/// step. A per-dispatch profile cannot show this (a pass per dispatch adds
/// its own overhead). Each run prefills the whole prompt with nothing left
/// out, so the step reads finite, stale values where a kernel is missing
/// (the MoE layers still route to valid experts) and the context is the
/// timed run's. Each kernel's cost is the median over `pairs` pairs of
/// runs, each a run with nothing left out and then one without the kernel
/// (adjacent runs share the device's state); the step is the median of
/// every baseline run. Null where the backend cannot leave dispatches out.
fn ablation<B: ComputeBackend + Counters>(
    model: &mut OneSequence<B>,
    prompt: &[u32],
    kernels: &[String],
    pairs: usize,
) -> turbospark::Result<Value> {
    if pairs == 0 || kernels.is_empty() || !model.backend().omit(&[])? {
        return Ok(Value::Null);
    }
    let step_s = |m: &mut OneSequence<B>, omit: &[&str]| -> turbospark::Result<f64> {
        m.reset();
        let first = m.generate(prompt, &greedy(1))?.tokens[0];
        m.backend().omit(omit)?;
        let g = m.generate(&[first], &greedy(ABLATION_STEPS));
        // (nothing left out again before any error is returned)
        let restored = m.backend().omit(&[]);
        m.reset();
        let g = g?;
        restored?;
        Ok(1.0 / g.decode_tok_s)
    };
    let mut bases = Vec::new();
    let mut rows = Vec::new();
    for k in kernels {
        let mut diffs = Vec::with_capacity(pairs);
        for _ in 0..pairs {
            let base = step_s(model, &[])?;
            diffs.push((base - step_s(model, &[k.as_str()])?) * 1e6);
            bases.push(base * 1e6);
        }
        let d = Stats::of(&diffs);
        eprintln!(
            "bench: decode step ablation: {k:>24} {:>9.1} us a step ({:.1} .. {:.1} over {pairs})",
            d.median, d.min, d.max
        );
        rows.push(json!({
            "kernel": k,
            "us_per_step": d.median,
            "us_min": d.min,
            "us_max": d.max,
        }));
    }
    Ok(json!({
        "step_us": Stats::of(&bases).median,
        "steps_per_run": ABLATION_STEPS,
        "pairs_per_kernel": pairs,
        "kernels": rows,
    }))
}

/// Run `f` (`passes` forward passes) under the backend's per-dispatch
/// profile and print and return its [`kernel_profile`]; null where the
/// backend has no profile. Each dispatch gets a pass of its own, so the sum
/// over kernels exceeds the unprofiled time.
fn profiled<B: ComputeBackend + Counters>(
    model: &mut OneSequence<B>,
    label: &str,
    passes: usize,
    f: impl FnOnce(&mut OneSequence<B>) -> turbospark::Result<()>,
) -> turbospark::Result<Value> {
    if !model.backend().profile_start() {
        return Ok(Value::Null);
    }
    let run = f(model);
    let samples = model.backend().profile_stop();
    run?;
    Ok(print_profile(label, &samples, passes))
}

/// The [`kernel_profile`] of `samples` over `passes` passes, each kernel's
/// line printed under `label`.
pub(super) fn print_profile(label: &str, samples: &[(&'static str, f64)], passes: usize) -> Value {
    let p = kernel_profile(samples, passes);
    for e in p.as_array().into_iter().flatten() {
        eprintln!(
            "bench: {label} profile: {:>24} {:>6.1} dispatches {:>9.1} us",
            e["kernel"].as_str().unwrap_or(""),
            e["dispatches_per_step"].as_f64().unwrap_or(0.0),
            e["us_per_step"].as_f64().unwrap_or(0.0)
        );
    }
    p
}

/// GPU time per pass by kernel, largest first, from a profile of `passes`
/// passes (decode steps, or one whole prefill).
fn kernel_profile(samples: &[(&'static str, f64)], passes: usize) -> Value {
    let mut by: Vec<(&str, usize, f64)> = Vec::new();
    for (k, t) in samples {
        match by.iter_mut().find(|e| e.0 == *k) {
            Some(e) => {
                e.1 += 1;
                e.2 += t;
            }
            None => by.push((k, 1, *t)),
        }
    }
    by.sort_by(|a, b| b.2.total_cmp(&a.2));
    let steps = passes as f64;
    Value::Array(
        by.iter()
            .map(|(k, n, t)| {
                json!({
                    "kernel": k,
                    "dispatches_per_step": *n as f64 / steps,
                    "us_per_step": t / steps * 1e6,
                })
            })
            .collect(),
    )
}

impl Counters for turbospark_cpu::CpuBackend {
    fn counters(&self) -> Option<(u64, u64)> {
        None
    }
}

/// The longest prompt of the run: `--prompt-tokens` or a
/// `--decode-context`.
fn longest_prompt(args: &Args) -> usize {
    args.decode_context
        .iter()
        .copied()
        .fold(args.prompt_tokens, usize::max)
}

/// Decode at a long context: a random prompt of `context` tokens, then
/// `decode` greedy tokens, timed as the main run is (its prefill tok/s is
/// the long prompt's). The bound adds the KV caches a step reads halfway
/// through the decode ([`ModelConfig::kv_bytes_per_token`]) to the weights'
/// `weight_bytes` a token reads.
fn at_context<B: ComputeBackend + Counters>(
    model: &mut OneSequence<B>,
    (cfg, weight_bytes): (&ModelConfig, u64),
    context: usize,
    decode: usize,
    seed: u64,
    ceiling_gbps: Option<f64>,
    kv_cache: DType,
) -> turbospark::Result<Value> {
    let mut rng = Rng::new(seed ^ context as u64);
    let vocab = cfg.vocab as u64;
    let prompt: Vec<u32> = (0..context).map(|_| rng.below(vocab) as u32).collect();
    model.reset();
    let g = model.generate(&prompt, &greedy(decode))?;
    model.reset();
    let kv = cfg.kv_bytes_per_token(context + decode / 2, kv_cache);
    let bytes = weight_bytes + kv;
    let bound = ceiling_gbps.map(|c| c * 1e9 / bytes as f64);
    eprintln!(
        "bench: decode at a {context}-token context: {:.1} tok/s ({} of KV caches read a step)",
        g.decode_tok_s,
        human_bytes(kv)
    );
    Ok(json!({
        "context": context,
        "decode_tokens": decode,
        "prefill_tok_s": g.prefill_tok_s,
        "decode_tok_s": g.decode_tok_s,
        "kv_bytes_per_token": kv,
        "bandwidth_bound_tok_s": bound,
        "decode_share_of_bound": bound.map(|b| g.decode_tok_s / b),
    }))
}

/// The synthetic model `name`'s config, cut to its first `layers` decoder
/// layers where given (`--layers`): an unknown name or a cut past the
/// model's layers is an error that names it.
pub fn config(name: &str, layers: Option<usize>) -> turbospark::Result<ModelConfig> {
    let mut cfg = named_config(name)?;
    if let Some(n) = layers {
        if n == 0 || n > cfg.layers.len() {
            return Err(turbospark::Error::InvalidInput(format!(
                "--layers {n}: {name} has {} decoder layers (keep 1 to {0})",
                cfg.layers.len()
            )));
        }
        cfg.layers.truncate(n);
    }
    Ok(cfg)
}

/// The synthetic model `name`'s config (as [`config`]) and its seeded
/// weights, in `--quant`'s format or bf16.
pub fn source(
    name: &str,
    args: &Args,
    seed: u64,
) -> turbospark::Result<(ModelConfig, SyntheticSource)> {
    let cfg = config(name, args.layers)?;
    let source = match args.quant {
        Some(q) => SyntheticSource::quantized(cfg.clone(), seed, q.synthetic())?,
        None => SyntheticSource::new(cfg.clone(), seed)?,
    };
    Ok((cfg, source))
}

/// The synthetic model `name` loaded on `backend` for `max_context`
/// positions, with the run options `bench` takes (`--prefill-batch`,
/// `--kv-cache`, `--precision`); `what` names the bench in its log line.
pub fn load_model<B: ComputeBackend>(
    backend: B,
    name: &str,
    args: &Args,
    max_context: usize,
    what: &str,
) -> turbospark::Result<(ModelConfig, Model<B>)> {
    let (cfg, source) = self::source(name, args, args.seed)?;
    eprintln!(
        "bench: {what}: loading synthetic {name} on {}",
        backend.info().device_name
    );
    let model = Model::load(
        backend,
        &source,
        ModelOptions {
            max_context,
            prefill_batch: args.prefill_batch,
            kv_cache: args.kv_cache.dtype(),
            precision: args.precision.get(),
            ..Default::default()
        },
    )?;
    Ok((cfg, model))
}

/// Load the synthetic model `name` on `backend`, then time a prefill of
/// `--prompt-tokens` tokens (in batches of `--prefill-batch`) and
/// `--decode-tokens` greedy tokens after it.
pub fn run<B: ComputeBackend + Counters>(
    backend: B,
    name: &str,
    args: &Args,
    ceiling_gbps: Option<f64>,
) -> Value {
    match measure(backend, name, args, ceiling_gbps) {
        Ok(v) => v,
        Err(e) => json!({ "status": "failed", "model": name, "note": format!("{name}: {e}") }),
    }
}

fn measure<B: ComputeBackend + Counters>(
    backend: B,
    name: &str,
    args: &Args,
    ceiling_gbps: Option<f64>,
) -> turbospark::Result<Value> {
    let (prompt_len, decode) = (args.prompt_tokens, args.decode_tokens);
    let (prefill_batch, seed) = (args.prefill_batch, args.seed);
    let (cfg, source) = self::source(name, args, seed)?;
    let device = backend.info().device_name.clone();
    let bytes_per_token = source.bytes_per_token();
    let weights = match args.quant {
        Some(q) => q.affine().name(),
        None => "bf16".to_string(),
    };
    eprintln!("bench: end to end: loading synthetic {name} ({weights} weights) on {device}");
    // (what the backend held before, e.g. from the per-op cases, is not the
    // model's; their scratch is let go so that the model's own counts in
    // its peak: the runs before 86f0e24 left it out)
    backend.release_scratch();
    backend.reset_peak_memory();
    let held_before = backend.memory().map_or(0, |m| m.0);
    let t = std::time::Instant::now();
    let mut model = OneSequence::load(
        backend,
        &source,
        ModelOptions {
            max_context: longest_prompt(args) + decode + SPARE_POSITIONS,
            prefill_batch,
            kv_cache: args.kv_cache.dtype(),
            precision: args.precision.get(),
            ..Default::default()
        },
    )?;
    let load_s = t.elapsed().as_secs_f64();
    // Device bytes once loaded (weights, KV caches, decode scratch); the
    // peak below adds the prefill batches' scratch.
    let loaded_bytes = model.backend().memory().map(|m| m.0 - held_before);
    let mut rng = Rng::new(seed);
    let vocab = cfg.vocab as u64;
    let prompt: Vec<u32> = (0..prompt_len).map(|_| rng.below(vocab) as u32).collect();
    // Warm up: compile every pipeline (both the batched and the decode path)
    // and bring the device to its working clocks. The GPU idles through the
    // load (the weights are generated on the host), and one short warm-up
    // left the H200 below its clocks for a whole timed prefill (1445 against
    // 3241 tok/s, with the same kernels): the whole prompt again until two
    // runs' prefill rates agree within 3% (at most WARMUPS runs).
    model.generate(&prompt[..prompt_len.min(20)], &greedy(decode.clamp(3, 32)))?;
    model.reset();
    // (GPUs only: the CPU reference has no clocks to ramp, and a
    // whole-prompt run of the 26B shape takes it minutes.)
    let warmups = if model.backend().counters().is_some() {
        WARMUPS
    } else {
        0
    };
    let mut last = 0.0;
    for _ in 0..warmups {
        let g = model.generate(&prompt, &greedy(2))?;
        model.reset();
        let settled = (g.prefill_tok_s - last).abs() <= 0.03 * g.prefill_tok_s;
        last = g.prefill_tok_s;
        if settled {
            break;
        }
    }
    let before = model.backend().counters();
    let g = model.generate(&prompt, &greedy(decode))?;
    let after = model.backend().counters();
    // Where a decode step's GPU time goes: two more steps, then what a step
    // dispatches and submits, counted over more (within SPARE_POSITIONS;
    // the timed run's counters average in the prefill's batches, a submit a
    // layer).
    let last = *g.tokens.last().unwrap_or(&0);
    let profile = profiled(&mut model, "decode step", PROFILE_STEPS, |m| {
        m.generate(&[last], &greedy(PROFILE_STEPS)).map(drop)
    })?;
    let c0 = model.backend().counters();
    model.generate(&[last], &greedy(COUNTED_STEPS))?;
    let counted = match c0.zip(model.backend().counters()) {
        Some(((d0, s0), (d1, s1))) => json!({
            "steps": COUNTED_STEPS,
            "dispatches_per_step": (d1 - d0) as f64 / COUNTED_STEPS as f64,
            "submits_per_step": (s1 - s0) as f64 / COUNTED_STEPS as f64,
        }),
        None => Value::Null,
    };
    // What each of those kernels costs the step (every run resets).
    let kernels: Vec<String> = profile
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["kernel"].as_str().map(str::to_string))
        .collect();
    // (each run prefills the prompt and takes ABLATION_STEPS steps, within
    // SPARE_POSITIONS)
    let pairs = match args.ablation_pairs {
        Some(n) => n,
        None if args.quick => 1,
        None => ABLATION_PAIRS,
    };
    let ablation = ablation(&mut model, &prompt, &kernels, pairs)?;
    // Where the prefill's GPU time goes: the prompt's prefill again.
    let prefill_profile = if prompt_len > 1 {
        profiled(&mut model, "prefill", 1, |m| {
            m.reset();
            m.generate(&prompt, &greedy(0)).map(drop)
        })?
    } else {
        Value::Null
    };
    let bound_tok_s = ceiling_gbps.map(|c| c * 1e9 / bytes_per_token as f64);
    // Decode at the long contexts asked for, last: the runs above keep
    // their own conditions (only the full layers' caches are larger).
    let long = args
        .decode_context
        .iter()
        .map(|&n| {
            at_context(
                &mut model,
                (&cfg, bytes_per_token),
                n,
                decode,
                seed,
                ceiling_gbps,
                args.kv_cache.dtype(),
            )
        })
        .collect::<turbospark::Result<Vec<Value>>>()?;
    // The other precision's prefill, timed as the main run's (warmed up to
    // settled clocks), and its profile; then both over the prompt,
    // teacher-forced, for the fast path's fidelity (last: the model's
    // precision is changed).
    let main = args.precision.get();
    let other = match main {
        Precision::Exact => Precision::Fast,
        Precision::Fast => Precision::Exact,
    };
    let other_run = if prompt_len > 1 {
        model.set_precision(other);
        let mut best = 0f64;
        let mut last = 0.0;
        for _ in 0..warmups.max(1) {
            model.reset();
            let g = model.generate(&prompt, &greedy(2))?;
            let settled = (g.prefill_tok_s - last).abs() <= 0.03 * g.prefill_tok_s;
            last = g.prefill_tok_s;
            best = best.max(g.prefill_tok_s);
            if settled {
                break;
            }
        }
        model.reset();
        let timed = model.generate(&prompt, &greedy(2))?.prefill_tok_s;
        let profile = profiled(&mut model, "prefill", 1, |m| {
            m.reset();
            m.generate(&prompt, &greedy(0)).map(drop)
        })?;
        let exact = super::fidelity::pass(&mut model, &prompt, Precision::Exact)?;
        let fast = super::fidelity::pass(&mut model, &prompt, Precision::Fast)?;
        let fid = super::fidelity::compare(&exact, &fast);
        eprintln!(
            "bench: end to end: prefill {timed:.1} tok/s at {other} precision; {}",
            super::fidelity::brief(&fid)
        );
        json!({
            "precision": other.as_str(),
            "prefill_tok_s": timed,
            "prefill_profile": profile,
            "fidelity": fid,
        })
    } else {
        Value::Null
    };
    let per_token = before.zip(after).map(|((d0, s0), (d1, s1))| {
        // The counters cover every forward pass of the run: the prompt's
        // prefill chunks (the last one also yields the first new token)
        // and a decode step for each token after it.
        let chunks = prompt_len.div_ceil(prefill_batch);
        let steps = (chunks + decode.saturating_sub(1)) as f64;
        ((d1 - d0) as f64 / steps, (s1 - s0) as f64 / steps)
    });
    let peak_bytes = model.backend().memory().map(|m| m.1 - held_before);
    let cut = match args.layers {
        Some(n) => format!(" (first {n} layers)"),
        None => String::new(),
    };
    let long_note: String = long
        .iter()
        .map(|v| {
            format!(
                "; decode at a {}-token context {:.1} tok/s{}",
                v["context"],
                v["decode_tok_s"].as_f64().unwrap_or(0.0),
                v["decode_share_of_bound"]
                    .as_f64()
                    .map(|x| format!(" ({:.0}% of its bound)", 100.0 * x))
                    .unwrap_or_default()
            )
        })
        .collect();
    let other_note = match other_run["prefill_tok_s"].as_f64() {
        Some(t) => format!(
            "; prefill at {other} precision {t:.1} tok/s; {}",
            super::fidelity::brief(&other_run["fidelity"])
        ),
        None => String::new(),
    };
    let note = format!(
        "{name}{cut} on {device}{}: prefill {:.1} tok/s ({prompt_len}-token prompt, {main} precision), decode {:.1} tok/s{}{}{}{long_note}{other_note}",
        if args.kv_cache.dtype() == DType::F32 {
            String::new()
        } else {
            format!(" with {} KV caches", args.kv_cache.dtype())
        },
        g.prefill_tok_s,
        g.decode_tok_s,
        match (
            counted["dispatches_per_step"].as_f64(),
            counted["submits_per_step"].as_f64()
        ) {
            (Some(d), Some(s)) => format!(" ({d:.0} dispatches, {s:.0} submit a step)"),
            _ => String::new(),
        },
        bound_tok_s
            .map(|b| format!(
                ", bandwidth bound {b:.1} tok/s ({:.0}% of it)",
                100.0 * g.decode_tok_s / b
            ))
            .unwrap_or_default(),
        loaded_bytes
            .zip(peak_bytes)
            .map(|(l, p)| format!(
                "; device memory {} loaded, {} at peak",
                human_bytes(l),
                human_bytes(p)
            ))
            .unwrap_or_default()
    );
    Ok(json!({
        "status": "measured",
        "model": name,
        "layers": cfg.layers.len(),
        "device": device,
        "load_seconds": load_s,
        "prompt_tokens": prompt_len,
        "decode_tokens": decode,
        "prefill_batch": prefill_batch,
        "kv_cache": args.kv_cache.dtype().name(),
        "weights": weights,
        "weight_bytes": source.weight_bytes(),
        "precision": main.as_str(),
        "prefill_tok_s": g.prefill_tok_s,
        "decode_tok_s": g.decode_tok_s,
        // The prefill at the other precision, and fast against exact on
        // the prompt (bench::fidelity).
        "other_precision": other_run,
        "bytes_per_token": bytes_per_token,
        // Storage bytes the backend held (where it counts them): once the
        // model was loaded, and at most over the whole run (prefill
        // batches' scratch included).
        "device_bytes_loaded": loaded_bytes,
        "device_bytes_peak": peak_bytes,
        "bandwidth_bound_tok_s": bound_tok_s,
        "decode_share_of_bound": bound_tok_s.map(|b| g.decode_tok_s / b),
        // Averages over every forward pass of the timed run (prefill chunks
        // included, which dispatch more and submit a layer at a time); a
        // decode step alone is in decode_step_counts (counted over its own
        // run; the profile's per-kernel counts sum to the same).
        "dispatches_per_forward": per_token.map(|p| p.0),
        "submits_per_forward": per_token.map(|p| p.1),
        "decode_step_counts": counted,
        "decode_step_profile": profile,
        // What each decode kernel costs the step, launches included
        // (`ablation`).
        "decode_step_ablation": ablation,
        // Per kernel over the whole prompt's prefill ("dispatches_per_step"
        // and "us_per_step" there mean per prefill).
        "prefill_profile": prefill_profile,
        // `--decode-context`: decode after a prompt of each length.
        "decode_at_context": long,
        "note": note,
    }))
}
