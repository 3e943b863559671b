//! `bench --synthetic NAME --stream-slots N,..`: end to end with the
//! routed experts streamed through N slots a layer, beside the resident
//! run, on one backend: decode and prefill rates, the slot caches' hit rate
//! and traffic, device memory, the host-to-device bandwidth of the same
//! run, and the cost model built from them (the time of one miss, and the
//! decode a given hit rate would reach).
//!
//! Synthetic weights route close to uniformly, the worst case for a cache;
//! the cost model carries the figures over to a real trace's hit rate
//! (`bench --replay-trace`).

use serde_json::{json, Value};
use turbospark::model::experts::StreamStats;
use turbospark::model::{ModelOptions, OneSequence, SyntheticSource};
use turbospark::rng::Rng;
use turbospark::{ComputeBackend, SlotWrite};

use super::e2e::{self, Counters};
use super::Args;
use turbospark::model::experts::Trace;

/// Hit rate the report carries the cost model to: LFU's at 16 slots a
/// layer replayed from a real Gemma 4 26B-A4B decode trace (71.0%, as
/// measured elsewhere and cited in docs/decisions.md).
pub const TRACE_HIT_RATE: f64 = 0.71;

/// Prompt tokens that fill every slot at all-hits (a random prompt of this
/// many routes to each of 128 experts a layer with near certainty).
const FILL_TOKENS: usize = 256;
/// Most decode runs of the warm-up, and their tokens.
const SETTLE_RUNS: usize = 6;
const SETTLE_TOKENS: usize = 16;

/// One load of the model: resident (`slots` None) or streamed.
struct Point {
    slots: Option<usize>,
    prefill_tok_s: f64,
    decode_tok_s: f64,
    decode: StreamStats,
    /// The prompt's prefill (one pass of it, after the warm-up).
    prefill: StreamStats,
    loaded_bytes: Option<u64>,
    /// Seconds the model took to load (a host store of experts included).
    load_s: f64,
    peak_bytes: Option<u64>,
    /// The peak over the timed decode alone (a prefill past the slots
    /// holds full-layer stacks while it runs).
    decode_peak_bytes: Option<u64>,
}

pub fn run<B: ComputeBackend + Counters>(
    mut backend: B,
    name: &str,
    args: &Args,
) -> turbospark::Result<Value> {
    let (cfg, source) = e2e::source(name, args, args.seed)?;
    let device = backend.info().device_name.clone();
    let h2d = super::measure::host_to_device(&backend, 5)?;
    let slot = super::measure::slot_writes(&backend, 5)?;
    // The copy ceiling: the faster of a plain write and the slot path's
    // own (threads, one view a run of adjacent slots).
    let h2d_gbps = h2d.gbps().max(slot.gbps());
    eprintln!(
        "bench: streaming: host to device on {device}: {:.1} GB/s through one write ({} MiB), \
         {:.1} GB/s through the slot path ({} MiB of 4-bit experts into adjacent slots), \
         medians of {}; the copy ceiling {h2d_gbps:.1} GB/s",
        h2d.gbps(),
        h2d.bytes >> 20,
        slot.gbps(),
        slot.bytes >> 20,
        h2d.stats.n
    );
    let mut rng = Rng::new(args.seed);
    let prompt: Vec<u32> = (0..args.prompt_tokens.max(1))
        .map(|_| rng.below(cfg.vocab as u64) as u32)
        .collect();
    let trace = match &args.route_by_trace {
        Some(path) => {
            let what = path.display().to_string();
            let file = std::fs::File::open(path).map_err(|e| {
                turbospark::Error::InvalidInput(format!("--route-by-trace {what}: {e}"))
            })?;
            let t = Trace::read(std::io::BufReader::new(file), &what)?;
            eprintln!(
                "bench: streaming: routed by {what} ({} tokens x {} layers)",
                t.tokens.len(),
                t.layers()
            );
            Some(t)
        }
        None => None,
    };
    let mut points = Vec::new();
    let slots: Vec<Option<usize>> = std::iter::once(None)
        .chain(args.stream_slots.iter().map(|&n| Some(n)))
        .collect();
    for n in slots {
        let (p, b) = point(backend, &source, &prompt, (args, trace.as_ref()), n)?;
        backend = b;
        eprintln!(
            "bench: streaming: {} slots: decode {:.1} tok/s, prefill {:.1} tok/s, hit {:.1}% \
             (loaded in {:.1} s)",
            n.map_or("resident".into(), |n| n.to_string()),
            p.decode_tok_s,
            p.prefill_tok_s,
            100.0 * p.decode.counts.hit_rate(),
            p.load_s
        );
        if n.is_some() {
            let tokens = args.decode_tokens.max(2);
            eprintln!(
                "bench: streaming:   {}",
                crate::generate::stats_line(&p.decode, tokens, n)
            );
            eprintln!(
                "bench: streaming:   prefill of {} tokens: {}",
                prompt.len(),
                crate::generate::stats_line(&p.prefill, prompt.len(), n)
            );
            let streamed = p.decode.bytes as f64 / tokens as f64 * p.decode_tok_s / 1e9;
            eprintln!(
                "bench: streaming:   decode streams {streamed:.2} GB/s, {:.1}% of the \
                 {h2d_gbps:.1} GB/s copy ceiling",
                100.0 * streamed / h2d_gbps
            );
        }
        points.push(p);
    }
    let moe_layers = if cfg.enable_moe { cfg.layers.len() } else { 0 };
    let expert_bytes = source.expert_bytes();
    // The slot path's own cost: every slot count's step less the misses.
    let all = points.iter().find(|p| p.slots == Some(cfg.experts));
    // (the decode run's forward passes: its first token's and each step's)
    let tokens = args.decode_tokens.max(2) as f64;
    let rows: Vec<Value> = points
        .iter()
        .map(|p| {
            let misses = p.decode.counts.misses as f64 / tokens;
            let miss_s = all
                .filter(|_| misses > 0.0)
                .map(|a| (1.0 / p.decode_tok_s - 1.0 / a.decode_tok_s).max(0.0) / misses);
            json!({
                "expert_slots": p.slots,
                "decode_tok_s": p.decode_tok_s,
                "prefill_tok_s": p.prefill_tok_s,
                "decode_hit_rate": p.decode.counts.hit_rate(),
                "decode_misses_per_token": misses,
                "decode_bytes_streamed_per_token": p.decode.bytes as f64 / tokens,
                "decode_host_wait_ms_per_token": p.decode.host_wait.as_secs_f64() * 1e3 / tokens,
                "decode_host_waits_per_token": p.decode.waits as f64 / tokens,
                // (the host's copies out of the mapping into staging or,
                // mapped, into the slots themselves)
                "decode_copy_gbps": (p.decode.write_time.as_secs_f64() > 0.0
                    && p.decode.write_path != Some(SlotWrite::Device))
                    .then(|| p.decode.bytes as f64 / p.decode.write_time.as_secs_f64() / 1e9),
                "decode_write_path": p.decode.write_path.map(|w| w.name()),
                // (bytes moved over the decode's wall clock)
                "decode_stream_gbps": p.decode.bytes as f64 / tokens * p.decode_tok_s / 1e9,
                "decode_stream_over_copy_ceiling":
                    p.decode.bytes as f64 / tokens * p.decode_tok_s / 1e9 / h2d_gbps,
                "optimistic_passes": p.decode.optimistic,
                "optimistic_stood": p.decode.stood,
                // (prediction accuracy: optimistic passes that stood)
                "optimistic_stood_rate": (p.decode.optimistic > 0)
                    .then(|| p.decode.stood as f64 / p.decode.optimistic as f64),
                "rerun_layers_per_token": p.decode.rerun_layers as f64 / tokens,
                "device_bytes_loaded": p.loaded_bytes,
                "load_s": p.load_s,
                "device_bytes_peak": p.peak_bytes,
                "device_bytes_peak_decode": p.decode_peak_bytes,
                "prefill_bytes_streamed": p.prefill.bytes,
                "prefill_copy_gbps": (p.prefill.write_time.as_secs_f64() > 0.0
                    && p.prefill.write_path != Some(SlotWrite::Device))
                    .then(|| p.prefill.bytes as f64 / p.prefill.write_time.as_secs_f64() / 1e9),
                "prefill_host_wait_ms": p.prefill.host_wait.as_secs_f64() * 1e3,
                "prefill_full_layer_passes": p.prefill.full_layer_passes,
                "prefill_layer_passes_in_waves": p.prefill.extra_waves,
                "miss_us": miss_s.map(|s| s * 1e6),
                "miss_over_bandwidth": miss_s.map(|s| s / (expert_bytes as f64 / (h2d_gbps * 1e9))),
            })
        })
        .collect();
    let resident = points.iter().find(|p| p.slots.is_none());
    let slot_path_cost = resident
        .zip(all)
        .map(|(r, a)| r.decode_tok_s / a.decode_tok_s - 1.0);
    // Decode at the trace's hit rate with 16 slots: the all-hit step plus
    // that share of misses at the miss time measured at 16 slots. (The
    // all-hit step may run optimistically, a missing one on the per-layer
    // path: a miss's time includes the optimism lost, so this is an
    // estimate; --route-by-trace measures the rate itself.)
    let predicted = all
        .zip(rows.iter().find(|r| r["expert_slots"] == json!(16)))
        .and_then(|(a, r)| {
            let miss = r["miss_us"].as_f64()? * 1e-6;
            let misses = (1.0 - TRACE_HIT_RATE) * (cfg.top_k * moe_layers) as f64;
            Some(1.0 / (1.0 / a.decode_tok_s + misses * miss))
        });
    Ok(json!({
        "model": name,
        "device": device,
        "weights": args.weights_name(),
        "expert_store": args.expert_store.name(),
        "prompt_tokens": prompt.len(),
        "decode_tokens": args.decode_tokens,
        "host_to_device_gbps": h2d_gbps,
        "one_write_gbps": h2d.gbps(),
        "slot_path_write_gbps": slot.gbps(),
        "slot_path_write_bytes": slot.bytes,
        "host_to_device_timing_s": {
            "median": h2d.stats.median,
            "min": h2d.stats.min,
            "max": h2d.stats.max,
            "n": h2d.stats.n,
        },
        "expert_optimism": args.expert_optimism.name(),
        "stream_prefill": args.stream_prefill.name(),
        "expert_bytes": expert_bytes,
        "points": rows,
        "slot_path_cost_at_all_hits": slot_path_cost,
        "trace_hit_rate": TRACE_HIT_RATE,
        "decode_tok_s_at_trace_hit_rate_16_slots": predicted,
    }))
}

fn point<B: ComputeBackend + Counters>(
    backend: B,
    source: &SyntheticSource,
    prompt: &[u32],
    (args, trace): (&Args, Option<&Trace>),
    slots: Option<usize>,
) -> turbospark::Result<(Point, B)> {
    backend.release_scratch();
    backend.reset_peak_memory();
    let held = backend.memory().map_or(0, |m| m.0);
    let t_load = std::time::Instant::now();
    let mut model = OneSequence::load(
        backend,
        source,
        ModelOptions {
            max_context: (prompt.len() + args.decode_tokens).max(FILL_TOKENS)
                + SETTLE_RUNS * SETTLE_TOKENS
                + 64,
            prefill_batch: args.prefill_batch,
            kv_cache: args.kv_cache.dtype(),
            expert_slots: slots,
            expert_optimism: args.expert_optimism,
            stream_prefill: args.stream_prefill,
            expert_store: args.expert_store,
            ..Default::default()
        },
    )?;
    let loaded_bytes = model.backend().memory().map(|m| m.0 - held);
    let load_s = t_load.elapsed().as_secs_f64();
    // (the resident run routes by its router: its experts are all there)
    if let (Some(t), Some(_)) = (trace, slots) {
        let (m, seq) = model.parts();
        m.route_by(seq, Some(t.clone()))?;
    }
    let greedy = |n| turbospark::model::GenerateOptions {
        max_new_tokens: n,
        sampling: turbospark::model::Sampling::Greedy,
        stop_at_eos: false,
    };
    // Warm-up: every pipeline compiled; with a slot for every expert, a
    // prompt that routes to all of them fills every slot (at all hits, the
    // slot path's own cost is what the run measures); then decode runs
    // until two agree within 3% (the GPU at its working clocks).
    let experts = model.config().experts;
    if slots == Some(experts) {
        let mut rng = Rng::new(args.seed ^ 0x5eed);
        let fill: Vec<u32> = (0..FILL_TOKENS)
            .map(|_| rng.below(model.config().vocab as u64) as u32)
            .collect();
        model.generate(&fill, &greedy(1))?;
        model.reset();
    }
    model.generate(&prompt[..prompt.len().min(20)], &greedy(8))?;
    let mut last = 0.0;
    for _ in 0..SETTLE_RUNS {
        let d = model.generate(&[1], &greedy(SETTLE_TOKENS))?;
        let settled = (d.decode_tok_s - last).abs() <= 0.03 * d.decode_tok_s;
        last = d.decode_tok_s;
        if settled {
            break;
        }
    }
    model.reset();
    model.take_stream_stats();
    let g = model.generate(prompt, &greedy(1))?;
    let first = *g.tokens.last().unwrap_or(&0);
    let prefill = model.take_stream_stats().unwrap_or_default();
    let peak_bytes = model.backend().memory().map(|m| m.1 - held);
    model.backend().reset_peak_memory();
    let d = model.generate(&[first], &greedy(args.decode_tokens.max(2)))?;
    let decode = model.take_stream_stats().unwrap_or_default();
    let decode_peak_bytes = model.backend().memory().map(|m| m.1 - held);
    let peak_bytes = peak_bytes.max(decode_peak_bytes);
    Ok((
        Point {
            slots,
            prefill_tok_s: g.prefill_tok_s,
            decode_tok_s: d.decode_tok_s,
            decode,
            prefill,
            loaded_bytes,
            load_s,
            peak_bytes,
            decode_peak_bytes,
        },
        model.into_backend(),
    ))
}
