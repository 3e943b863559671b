//! `bench --speculative`: what speculative decoding costs and gives on a
//! synthetic model. A greedy verification pass over k + 1 tokens against
//! one decode step (the same `Model::greedy_rows` over 1 token, each row's
//! argmax on the device as greedy speculative decoding verifies), then
//! decode with a synthetic drafter whose proposals are the plain greedy
//! tokens, each kept right with a set probability (a wrong one replaced by
//! another id): the drafter's real cost, the acceptance a forced rate gives.

use std::ops::ControlFlow;
use std::time::Instant;

use serde_json::{json, Value};
use turbospark::model::drafter::{Drafter, SpeculativeOptions, DEFAULT_DRAFT_TOKENS};
use turbospark::model::{GenerateOptions, Sampling};
use turbospark::rng::Rng;
use turbospark::ComputeBackend;

use super::Args;

/// Forced acceptance rates of the decode runs.
const RATES: [f64; 3] = [0.5, 0.7, 0.9];
/// Timed verification passes of each size (the median is reported).
const REPS: usize = 9;
/// Acceptance rates (each draft right with this probability, on its own)
/// whose expected speed-up is reported.
const ACCEPTANCE: [f64; 5] = [0.5, 0.6, 0.7, 0.8, 0.9];

/// Expected decode speed-up over plain decode for k = 1 .. verify.len() - 1
/// drafts a round at acceptance `a`: a round gives the kept prefix and
/// one token, `1 + a + .. + a^k` on average, for k draft steps and a
/// verification of k + 1 tokens (`verify[k]`), where plain decode pays
/// `step` a token. Each k's speed-up, and its speed-up with a drafter that
/// costs nothing.
fn expected_speedups(step: f64, verify: &[f64], draft: f64, a: f64) -> Vec<(usize, f64, f64)> {
    (1..verify.len())
        .map(|k| {
            let tokens: f64 = (0..=k).map(|i| a.powi(i as i32)).sum();
            let plain = tokens * step;
            (k, plain / (verify[k] + k as f64 * draft), plain / verify[k])
        })
        .collect()
}

/// Runs a forced rate may take for its proposals to settle on the
/// verification pass's own tokens.
const MAX_SETTLE_RUNS: usize = 8;

fn greedy(n: usize) -> GenerateOptions {
    GenerateOptions {
        max_new_tokens: n,
        sampling: Sampling::Greedy,
        stop_at_eos: false,
    }
}

pub fn run<B: ComputeBackend>(backend: B, name: &str, args: &Args) -> turbospark::Result<Value> {
    let (prompt_len, decode) = (args.prompt_tokens.max(1), args.decode_tokens.max(2));
    let device = backend.info().device_name.clone();
    let (cfg, model) =
        super::e2e::load_model(backend, name, args, prompt_len + decode + 8, "speculative")?;
    let mut rng = Rng::new(args.seed);
    let vocab = cfg.vocab as u64;
    let prompt: Vec<u32> = (0..prompt_len).map(|_| rng.below(vocab) as u32).collect();

    // Verification against a decode step: the same call over 1..=5 tokens
    // after the prompt, each pass taken back.
    // (a decode run first: the pipelines built, the GPU at its clocks)
    model.generate(&mut model.new_sequence()?, &prompt, &greedy(decode))?;
    let mut seq = model.new_sequence()?;
    model.prefill(&mut seq, &prompt)?;
    let extra: Vec<u32> = (0..5).map(|_| rng.below(vocab) as u32).collect();
    let mut verify = Vec::new();
    for m in 1..=5 {
        model.greedy_rows(&mut seq, &extra[..m])?;
        model.truncate(&mut seq, prompt_len)?;
        let mut ms: Vec<f64> = (0..REPS)
            .map(|_| {
                let t = Instant::now();
                let r = model.greedy_rows(&mut seq, &extra[..m]);
                let e = t.elapsed().as_secs_f64() * 1e3;
                r.and_then(|_| model.truncate(&mut seq, prompt_len))
                    .map(|()| e)
            })
            .collect::<turbospark::Result<_>>()?;
        ms.sort_by(f64::total_cmp);
        verify.push(ms[REPS / 2]);
    }
    for (i, ms) in verify.iter().enumerate() {
        eprintln!(
            "verify {} tokens: {ms:.3} ms ({:.2}x a decode step)",
            i + 1,
            ms / verify[0]
        );
    }

    let first = first_token_paths(&model, &prompt)?;

    // Plain decode, whose tokens the forced proposals follow at first.
    let plain = model.generate(&mut model.new_sequence()?, &prompt, &greedy(decode))?;
    eprintln!("plain decode: {:.1} tok/s", plain.decode_tok_s);
    // (quantized as the model is, as a converted drafter would be)
    let drafter = Drafter::synthetic(
        &model,
        args.draft_layers,
        (args.draft_hidden, 4 * args.draft_hidden),
        args.quant.map(|q| q.synthetic()),
        args.seed,
    )?;
    let mut runs = Vec::new();
    for rate in RATES {
        // A forced-right proposal must be the token the verification pass
        // itself computes. On a GPU that pass's m-row kernels round
        // otherwise than a decode step's, and the random model carries that
        // rounding until a router choice flips (the first-token check
        // above): the two greedy paths part, and every later proposal from
        // plain decode's tokens would be wrong. So each run's tokens
        // become the next run's base until a run gives back its own base
        // (its first differing token is at least one later each time).
        let mut base = plain.tokens.clone();
        let mut runs_to_settle = 0;
        let (g, st) = loop {
            runs_to_settle += 1;
            let mut r = Rng::new(args.seed ^ (rate * 1000.0) as u64);
            let forced: Vec<u32> = base
                .iter()
                .map(|&t| {
                    if (r.uniform() as f64) < rate {
                        t
                    } else {
                        (t + 1) % cfg.vocab as u32
                    }
                })
                .collect();
            let spec = SpeculativeOptions {
                draft_tokens: DEFAULT_DRAFT_TOKENS,
                forced: Some(forced),
            };
            let mut seq = model.new_sequence()?;
            let (g, st) =
                drafter.generate(&model, &mut seq, &prompt, &greedy(decode), &spec, |_| {
                    ControlFlow::Continue(())
                })?;
            if g.tokens == base || runs_to_settle == MAX_SETTLE_RUNS {
                break (g, st);
            }
            base = g.tokens.clone();
        };
        let settled = g.tokens == base;
        eprintln!(
            "forced rate {rate}: proposals {} the verification's own tokens after {runs_to_settle} run(s)",
            if settled { "were" } else { "were not yet" }
        );
        // (the same tokens on the CPU reference, whose m-row products add in
        // the one-row order; on a GPU a verification pass runs the
        // multi-row kernels, whose other rounding flips the random model's
        // near-ties: how far they agree is reported, not required)
        let same = g
            .tokens
            .iter()
            .zip(&plain.tokens)
            .take_while(|(a, b)| a == b)
            .count();
        eprintln!(
            "forced rate {rate}: the first {same} of {} tokens as plain decode's",
            g.tokens.len()
        );
        eprintln!(
            "forced rate {rate}: {:.1} tok/s ({:.2}x plain); {} of {} drafts kept, {:.2} tokens a \
             target pass; drafting {:.2} ms a round, verifying {:.2} ms a round",
            g.decode_tok_s,
            g.decode_tok_s / plain.decode_tok_s.max(1e-9),
            st.accepted,
            st.drafted,
            st.tokens_per_pass(),
            st.draft_time.as_secs_f64() * 1e3 / st.rounds.max(1) as f64,
            st.verify_time.as_secs_f64() * 1e3 / st.rounds.max(1) as f64,
        );
        runs.push(json!({
            "forced_rate": rate,
            "runs_to_settle": runs_to_settle,
            "settled": settled,
            "same_tokens_as_plain": same,
            "decode_tok_s": g.decode_tok_s,
            "accepted": st.accepted,
            "drafted": st.drafted,
            "rounds": st.rounds,
            "tokens_per_pass": st.tokens_per_pass(),
            "draft_ms": st.draft_time.as_secs_f64() * 1e3,
            "verify_ms": st.verify_time.as_secs_f64() * 1e3,
        }));
    }
    // What a real drafter's acceptance would give, from the passes timed
    // above: a drafter's step as this one's (the mean over every draft).
    let drafted: usize = runs
        .iter()
        .map(|r| r["drafted"].as_u64().unwrap_or(0) as usize)
        .sum();
    let draft_ms: f64 = runs
        .iter()
        .map(|r| r["draft_ms"].as_f64().unwrap_or(0.0))
        .sum();
    let draft_step = draft_ms / drafted.max(1) as f64;
    // (plain decode's step is what a token costs without a drafter)
    let step = 1e3 / plain.decode_tok_s.max(1e-9);
    eprintln!(
        "a draft step: {draft_step:.3} ms ({} drafter); a plain decode step: {step:.3} ms; a \
         verification of 1 token {:.3} ms",
        args.weights_name(),
        verify[0]
    );
    let mut expected = Vec::new();
    for a in ACCEPTANCE {
        let row = expected_speedups(step, &verify, draft_step, a);
        let best = row
            .iter()
            .max_by(|x, y| x.1.total_cmp(&y.1))
            .map_or(0, |x| x.0);
        eprintln!(
            "acceptance {a}: {} (best k {best}); with a free drafter: {}",
            row.iter()
                .map(|(k, x, _)| format!("k {k} {x:.2}x"))
                .collect::<Vec<_>>()
                .join(", "),
            row.iter()
                .map(|(k, _, f)| format!("k {k} {f:.2}x"))
                .collect::<Vec<_>>()
                .join(", "),
        );
        for (k, x, f) in row {
            expected
                .push(json!({ "acceptance": a, "k": k, "speedup": x, "speedup_free_drafter": f }));
        }
    }
    Ok(json!({
        "model": name,
        "device": device,
        "prompt_tokens": prompt_len,
        "draft_step_ms": draft_step,
        "expected": expected,
        "decode_tokens": decode,
        "draft_tokens": DEFAULT_DRAFT_TOKENS,
        "drafter": {
            "layers": args.draft_layers,
            "hidden": args.draft_hidden,
            "intermediate": 4 * args.draft_hidden,
            "weights": args.weights_name(),
        },
        "verify_ms": verify,
        "first_token": first,
        "plain_decode_tok_s": plain.decode_tok_s,
        "speculative": runs,
    }))
}

/// The first generated token's logits two ways: the prompt through the
/// prefill path whole (as plain decode takes it), and the prompt but its
/// last token, then that token as one row (as speculative decoding takes
/// it). Their largest difference against the top-2 gap says whether two
/// argmaxes that differ are a near-tie or a fault.
fn first_token_paths<B: ComputeBackend>(
    model: &turbospark::model::Model<B>,
    prompt: &[u32],
) -> turbospark::Result<Value> {
    let moe = model.config().enable_moe;
    let mut seq = model.new_sequence()?;
    seq.record_routing(moe);
    let whole = model
        .logits(&mut seq, prompt)?
        .pop()
        .expect("one row a token");
    let routed_whole = seq.take_routing();
    let mut seq = model.new_sequence()?;
    seq.record_routing(moe);
    let (head, last) = prompt.split_at(prompt.len() - 1);
    model.prefill(&mut seq, head)?;
    let row = model.logits(&mut seq, last)?.pop().expect("one row");
    // Where the two routed a token's experts otherwise: a router near-tie
    // flipped by rounding (the random model's logits then part by O(1)).
    let mut flips = Vec::new();
    if let (Some(a), Some(b)) = (routed_whole, seq.take_routing()) {
        for (t, (ra, rb)) in a.tokens.iter().zip(&b.tokens).enumerate() {
            for (l, (ea, eb)) in ra.iter().zip(rb).enumerate() {
                let (mut ea, mut eb) = (ea.clone(), eb.clone());
                ea.sort_unstable();
                eb.sort_unstable();
                if ea != eb {
                    flips.push((t, l));
                }
            }
        }
    }
    eprintln!(
        "first token: expert choices that differ between the two: {} (token, layer) {:?}",
        flips.len(),
        &flips[..flips.len().min(8)]
    );
    let argmax = |v: &[f32]| {
        v.iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map_or(0, |(i, _)| i)
    };
    let (a, b) = (argmax(&whole), argmax(&row));
    let mut sorted = whole.clone();
    sorted.sort_by(|x, y| y.total_cmp(x));
    let gap = sorted[0] - sorted.get(1).copied().unwrap_or(sorted[0]);
    let diff = whole
        .iter()
        .zip(&row)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    eprintln!(
        "first token: prompt whole -> {a}, prompt then its last token as a row -> {b}; \
         largest logit difference {diff:.3e}, top-2 gap {gap:.3e}"
    );
    Ok(json!({
        "whole": a,
        "last_as_row": b,
        "max_abs_diff": diff,
        "top2_gap": gap,
        "expert_choices_differing": flips.len(),
        "first_differing_choice": flips.first(),
    }))
}

#[cfg(test)]
mod tests {
    use super::expected_speedups;

    #[test]
    fn speedup_counts_the_kept_prefix_and_the_rounds_cost() {
        // verification as dear as k + 1 steps and a free drafter: never a
        // gain; all kept (a = 1): k + 1 tokens for the round's cost
        let verify = [1.0, 2.0, 3.0];
        for (k, x, f) in expected_speedups(1.0, &verify, 0.0, 1.0) {
            assert_eq!((x, f), (1.0, 1.0), "k {k}");
        }
        let got = expected_speedups(2.0, &[2.0, 2.5, 3.0], 0.5, 0.5);
        // k 1: 1.5 tokens (3 ms plain) for 2.5 + 0.5; k 2: 1.75 (3.5 ms) for 3 + 1
        assert_eq!(got, vec![(1, 1.0, 1.2), (2, 0.875, 3.5 / 3.0)]);
    }
}
