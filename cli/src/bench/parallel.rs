//! `bench --parallel 1,4,16`: aggregate decode throughput of several
//! streams stepped together (`Model::decode_batch_ahead`, what `serve
//! --parallel` runs) on a synthetic model. For each stream count: that many
//! sequences, each with a random prompt of `--prompt-tokens` prefilled
//! alone, then `--decode-tokens` batched greedy steps timed, each recorded
//! while the device runs the one before, then as many again through
//! `Model::decode_batch` (each step recorded, run and read back before the
//! next: what running ahead saves), and, where
//! the backend profiles dispatches, two more steps a pass a dispatch (GPU
//! time per kernel a step; copies between passes are not in it). First, the
//! baseline the streams are weighed against: one stream alone through
//! `generate`'s pipelined decode (a step recorded before the previous one's
//! token is read back, as `serve` runs a request that is alone), after a
//! second of it to bring the GPU to its clocks.

use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use turbospark::model::sampling::Sampler;
use turbospark::model::{GenerateOptions, Sampling, Sequence};
use turbospark::rng::Rng;
use turbospark::ComputeBackend;

use super::e2e::Counters;
use super::Args;

pub fn run<B: ComputeBackend + Counters>(
    backend: B,
    name: &str,
    args: &Args,
) -> turbospark::Result<Value> {
    if args.parallel.contains(&0) {
        return Err(turbospark::Error::InvalidInput(
            "--parallel: a stream count is at least 1".into(),
        ));
    }
    let (prompt_len, steps) = (args.prompt_tokens.max(1), args.decode_tokens.max(1));
    let device = backend.info().device_name.clone();
    // (a warm-up step, the first token and two profiled steps besides the
    // timed ones)
    let (cfg, model) =
        super::e2e::load_model(backend, name, args, prompt_len + 2 * steps + 6, "parallel")?;
    let mut rng = Rng::new(args.seed);
    let vocab = cfg.vocab as u64;
    let prompt: Vec<u32> = (0..prompt_len).map(|_| rng.below(vocab) as u32).collect();
    let alone = lone_stream(&model, &prompt, steps)?;
    eprintln!("bench: one stream alone (generate's pipelined decode): {alone:.1} tok/s");
    let mut results = Vec::new();
    for &n in &args.parallel {
        let mut seqs: Vec<Sequence<B>> = Vec::with_capacity(n);
        let mut samplers = Vec::with_capacity(n);
        let mut last = Vec::with_capacity(n);
        for _ in 0..n {
            let prompt: Vec<u32> = (0..prompt_len).map(|_| rng.below(vocab) as u32).collect();
            let mut seq = model.new_sequence()?;
            let mut sampler = Sampler::new(&Sampling::Greedy)?;
            last.push(model.prefill_next(&mut seq, &prompt, &mut sampler, 2 * steps + 6)?);
            seqs.push(seq);
            samplers.push(sampler);
        }
        let mut ahead = model.batch_ahead()?;
        let mut step = |last: &mut Vec<u32>, run_ahead: bool| -> turbospark::Result<()> {
            let mut s: Vec<&mut Sequence<B>> = seqs.iter_mut().collect();
            let mut p: Vec<&mut Sampler> = samplers.iter_mut().collect();
            *last = if run_ahead {
                model.decode_batch_ahead(&mut ahead, &mut s, last, &mut p)?
            } else {
                model.decode_batch(&mut s, last, &mut p)?
            };
            Ok(())
        };
        // (one step untimed: the first allocates the batch's scratch and
        // runs the next ahead)
        step(&mut last, true)?;
        let be = model.backend();
        let (c0, k0) = (be.counters(), be.copies());
        let t = Instant::now();
        for _ in 0..steps {
            step(&mut last, true)?;
        }
        let secs = t.elapsed().as_secs_f64().max(1e-9);
        let t = Instant::now();
        for _ in 0..steps {
            step(&mut last, false)?;
        }
        let unpipelined_ms = t.elapsed().as_secs_f64() * 1e3 / steps as f64;
        // Dispatches and buffer copies a step, where the backend counts them.
        let per_step = |n: u64| n as f64 / steps as f64;
        // (both timed runs counted: a step records the same either way)
        let dispatches = be
            .counters()
            .zip(c0)
            .map(|(a, b)| per_step(a.0 - b.0) / 2.0);
        let copies = be.copies().zip(k0).map(|(a, b)| per_step(a - b) / 2.0);
        let profile = if model.backend().profile_start() {
            let ran = step(&mut last, false).and_then(|()| step(&mut last, false));
            let samples = model.backend().profile_stop();
            ran?;
            super::e2e::print_profile(&format!("{n} streams, a step"), &samples, 2)
        } else {
            Value::Null
        };
        let per_stream = steps as f64 / secs;
        // (steps found run ahead, and dropped: every timed step after the
        // first should be found, none dropped)
        let (ahead_used, ahead_dropped) = ahead.counts();
        let counted = match (dispatches, copies) {
            (Some(d), Some(c)) => format!(", {d:.0} dispatches and {c:.0} copies a step"),
            _ => String::new(),
        };
        eprintln!(
            "bench: {n} streams: {:.1} tok/s together ({:.2}x one alone), {per_stream:.1} tok/s \
             a stream, {:.3} ms a step run ahead ({unpipelined_ms:.3} ms not){counted}",
            n as f64 * per_stream,
            n as f64 * per_stream / alone.max(1e-9),
            secs * 1e3 / steps as f64
        );
        results.push(json!({
            "streams": n,
            "aggregate_tok_s": n as f64 * per_stream,
            "over_one_alone": n as f64 * per_stream / alone.max(1e-9),
            "per_stream_tok_s": per_stream,
            "step_ms": secs * 1e3 / steps as f64,
            "step_ms_not_run_ahead": unpipelined_ms,
            "passes_a_step": n.div_ceil(model.max_decode_batch()),
            "dispatches_a_step": dispatches,
            "copies_a_step": copies,
            "steps_found_run_ahead": ahead_used,
            "steps_run_ahead_dropped": ahead_dropped,
            "profile": profile,
        }));
    }
    Ok(json!({
        "model": name,
        "device": device,
        "prompt_tokens": prompt_len,
        "decode_tokens": steps,
        "max_decode_batch": model.max_decode_batch(),
        "one_alone_tok_s": alone,
        "parallel": results,
    }))
}

/// Decode tok/s of one stream alone through `generate`'s pipelined path:
/// `steps` greedy tokens after `prompt` on a fresh sequence, repeated until
/// a second has passed (the GPU then at its clocks), the last run timed
/// from its first token to its last.
fn lone_stream<B: ComputeBackend>(
    model: &turbospark::model::Model<B>,
    prompt: &[u32],
    steps: usize,
) -> turbospark::Result<f64> {
    let opts = GenerateOptions {
        max_new_tokens: steps + 1,
        sampling: Sampling::Greedy,
        stop_at_eos: false,
    };
    let start = Instant::now();
    loop {
        let mut seq = model.new_sequence()?;
        let mut stamps = Vec::with_capacity(steps + 1);
        let t0 = Instant::now();
        model.generate_streaming(&mut seq, prompt, &opts, |_| {
            stamps.push(t0.elapsed());
            ControlFlow::Continue(())
        })?;
        if start.elapsed() >= Duration::from_secs(1) {
            let span = match (stamps.first(), stamps.last()) {
                (Some(a), Some(b)) => (*b - *a).as_secs_f64(),
                _ => 0.0,
            };
            return Ok((stamps.len().saturating_sub(1)) as f64 / span.max(1e-9));
        }
    }
}
