//! `bench --parallel 1,4,16`: aggregate decode throughput of several
//! streams stepped together (`Model::decode_batch`, what `serve
//! --parallel` runs) on a synthetic model. For each stream count: that many
//! sequences, each with a random prompt of `--prompt-tokens` prefilled
//! alone, then `--decode-tokens` batched greedy steps timed, and, where
//! the backend profiles dispatches, two more steps a pass a dispatch (GPU
//! time per kernel a step; copies between passes are not in it).

use std::time::Instant;

use serde_json::{json, Value};
use turbospark::model::sampling::Sampler;
use turbospark::model::{Sampling, Sequence};
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
        super::e2e::load_model(backend, name, args, prompt_len + steps + 4, "parallel")?;
    let mut rng = Rng::new(args.seed);
    let vocab = cfg.vocab as u64;
    let mut results = Vec::new();
    for &n in &args.parallel {
        let mut seqs: Vec<Sequence<B>> = Vec::with_capacity(n);
        let mut samplers = Vec::with_capacity(n);
        let mut last = Vec::with_capacity(n);
        for _ in 0..n {
            let prompt: Vec<u32> = (0..prompt_len).map(|_| rng.below(vocab) as u32).collect();
            let mut seq = model.new_sequence()?;
            let mut sampler = Sampler::new(&Sampling::Greedy)?;
            last.push(model.prefill_next(&mut seq, &prompt, &mut sampler, steps + 4)?);
            seqs.push(seq);
            samplers.push(sampler);
        }
        let mut step = |last: &mut Vec<u32>| -> turbospark::Result<()> {
            let mut s: Vec<&mut Sequence<B>> = seqs.iter_mut().collect();
            let mut p: Vec<&mut Sampler> = samplers.iter_mut().collect();
            *last = model.decode_batch(&mut s, last, &mut p)?;
            Ok(())
        };
        // (one step untimed: the first allocates the batch's scratch)
        step(&mut last)?;
        let t = Instant::now();
        for _ in 0..steps {
            step(&mut last)?;
        }
        let secs = t.elapsed().as_secs_f64().max(1e-9);
        let profile = if model.backend().profile_start() {
            let ran = step(&mut last).and_then(|()| step(&mut last));
            let samples = model.backend().profile_stop();
            ran?;
            super::e2e::print_profile(&format!("{n} streams, a step"), &samples, 2)
        } else {
            Value::Null
        };
        let per_stream = steps as f64 / secs;
        eprintln!(
            "bench: {n} streams: {:.1} tok/s together, {per_stream:.1} tok/s a stream, \
             {:.3} ms a step",
            n as f64 * per_stream,
            secs * 1e3 / steps as f64
        );
        results.push(json!({
            "streams": n,
            "aggregate_tok_s": n as f64 * per_stream,
            "per_stream_tok_s": per_stream,
            "step_ms": secs * 1e3 / steps as f64,
            "passes_a_step": n.div_ceil(model.max_decode_batch()),
            "profile": profile,
        }));
    }
    Ok(json!({
        "model": name,
        "device": device,
        "prompt_tokens": prompt_len,
        "decode_tokens": steps,
        "max_decode_batch": model.max_decode_batch(),
        "parallel": results,
    }))
}
