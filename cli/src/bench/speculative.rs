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

    // Plain decode, whose tokens the forced proposals follow.
    let plain = model.generate(&mut model.new_sequence()?, &prompt, &greedy(decode))?;
    eprintln!("plain decode: {:.1} tok/s", plain.decode_tok_s);
    let drafter = Drafter::synthetic(
        &model,
        args.draft_layers,
        args.draft_hidden,
        4 * args.draft_hidden,
        args.seed,
    )?;
    let mut runs = Vec::new();
    for rate in RATES {
        let mut r = Rng::new(args.seed ^ (rate * 1000.0) as u64);
        let forced: Vec<u32> = plain
            .tokens
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
    Ok(json!({
        "model": name,
        "device": device,
        "prompt_tokens": prompt_len,
        "decode_tokens": decode,
        "draft_tokens": DEFAULT_DRAFT_TOKENS,
        "drafter": { "layers": args.draft_layers, "hidden": args.draft_hidden, "intermediate": 4 * args.draft_hidden },
        "verify_ms": verify,
        "plain_decode_tok_s": plain.decode_tok_s,
        "speculative": runs,
    }))
}
