//! Decoder consistency on the CPU reference backend with a tiny synthetic
//! model: batched prefill, token-by-token decode and generate agree; bad
//! requests are clear errors.

mod common;

use std::ops::ControlFlow;

use common::nmse;
use turbospark::model::decoder::{scratch_bytes, stream_scratch_bytes};
use turbospark::model::sampling::Sampler;
use turbospark::model::synthetic::{tiny_config, SyntheticSource};
use turbospark::model::{GenerateOptions, ModelOptions, OneSequence, Sampling, LOGITS_BATCH};
use turbospark::{ComputeBackend, DType, Error};
use turbospark_cpu::CpuBackend;

/// Both paths do the same f32 arithmetic per row (the CPU ops process rows
/// independently), so they agree to rounding of identical operations.
const SAME_PATH_NMSE: f64 = 1e-10;

/// A GPU against the CPU reference doing the same arithmetic: f32 reduction
/// orders differ (the oracle's limit, tests/oracle.rs).
const CROSS_BACKEND_NMSE: f64 = 1e-8;

fn opts(max_context: usize) -> ModelOptions {
    ModelOptions {
        max_context,
        ..Default::default()
    }
}

fn tiny_model(max_context: usize) -> OneSequence<CpuBackend> {
    let src = SyntheticSource::new(tiny_config(), 42).unwrap();
    OneSequence::load(CpuBackend::new(), &src, opts(max_context)).unwrap()
}

/// A prompt longer than one batch and than the sliding window.
fn prompt(n: usize, vocab: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 37 + 11) % vocab) as u32).collect()
}

fn argmax(row: &[f32]) -> u32 {
    turbospark::model::sampling::argmax(row)
}

/// What `pick` chooses from each row that predicted one of `new` when the
/// prompt and `new` are teacher-forced from a reset model: a generation
/// made with that choice returns `new` itself.
fn teacher_forced_picks<B: ComputeBackend>(
    m: &mut OneSequence<B>,
    prompt: &[u32],
    new: &[u32],
    mut pick: impl FnMut(&[f32]) -> u32,
) -> Vec<u32> {
    m.reset();
    let all: Vec<u32> = prompt.iter().chain(new).copied().collect();
    let rows = m.logits(&all).unwrap();
    rows[prompt.len() - 1..][..new.len()]
        .iter()
        .map(|r| pick(r))
        .collect()
}

/// `tokens`' rows from position 0, batched and token by token.
type Rows = Vec<Vec<f32>>;
fn teacher_forced<B: ComputeBackend>(m: &mut OneSequence<B>, tokens: &[u32]) -> (Rows, Rows) {
    m.reset();
    let batched = m.logits(tokens).unwrap();
    m.reset();
    let single = tokens
        .iter()
        .map(|&t| m.logits(&[t]).unwrap().remove(0))
        .collect();
    (batched, single)
}

/// Batched teacher forcing against token-by-token decode. On a backend that
/// runs some GEMMs from f16-rounded inputs (tensor cores) the two differ by
/// that rounding, so each is held instead to the CPU reference doing the
/// same arithmetic (`common::reference_for`), within [`CROSS_BACKEND_NMSE`]
/// and `common::rounding_allowance` of what the rounding moves that
/// reference from f32 arithmetic.
fn batched_and_single<B: ComputeBackend>(be: B, o: ModelOptions, n: usize) {
    let src = SyntheticSource::new(tiny_config(), 42).unwrap();
    let load = |be| OneSequence::load(be, &src, o.clone()).unwrap();
    let mut m = OneSequence::load(be, &src, o.clone()).unwrap();
    let tokens = &prompt(n, m.config().vocab);
    let (batched, single) = teacher_forced(&mut m, tokens);
    assert_eq!(batched.len(), tokens.len());
    match common::reference_for(m.backend()) {
        None => within("between batched and single-token", &batched, &single, None),
        Some(cpu) => {
            let (rb, rs) = teacher_forced(&mut load(cpu), tokens);
            let (fb, fs) = teacher_forced(&mut load(CpuBackend::new()), tokens);
            within("batched, against the reference", &batched, &rb, Some(&fb));
            within(
                "single-token, against the reference",
                &single,
                &rs,
                Some(&fs),
            );
        }
    }
}

/// Rows `got` against `want`: within [`SAME_PATH_NMSE`] on one backend
/// (`f32` None), else within [`CROSS_BACKEND_NMSE`] plus each row's
/// `common::rounding_allowance` (from `want` to its f32 twin in `f32`); the
/// same argmax either way.
fn within(what: &str, got: &[Vec<f32>], want: &[Vec<f32>], f32: Option<&[Vec<f32>]>) {
    assert_eq!(got.len(), want.len(), "row count {what}");
    if let Some(f) = f32 {
        assert_eq!(f.len(), want.len(), "f32 row count {what}");
    }
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let limit = match f32 {
            None => SAME_PATH_NMSE,
            Some(f) => {
                let spread = nmse(w, &f[i]);
                CROSS_BACKEND_NMSE + common::rounding_allowance(spread, &format!("row {i} {what}"))
            }
        };
        let e = nmse(g, w);
        assert!(e < limit, "row {i}: NMSE {e:e} {what} (limit {limit:e})");
        assert_eq!(argmax(g), argmax(w), "row {i}: argmax differs {what}");
    }
}

#[test]
fn logits_batches_match_token_by_token_decode() {
    batched_and_single(CpuBackend::new(), opts(64), 2 * LOGITS_BATCH + 5);
}

/// Teacher forcing over several prefill batches, each with more rows than
/// one LM head slice (20 = 16 + 4), and a last batch of one slice (5).
#[test]
fn logits_over_several_batches_and_head_slices() {
    let o = ModelOptions {
        max_context: 64,
        prefill_batch: 20,
        ..Default::default()
    };
    batched_and_single(CpuBackend::new(), o, 45);
}

/// Prefill in batches of `batch` (the last one partial) leaves the same KV
/// caches as prefill one token at a time: the next token's logits agree.
/// Batches past 16 tokens take a GPU's prefill GEMM and attn_prefill.
fn prefill_batch_sizes_agree<B: ComputeBackend>(
    open: impl Fn() -> B,
    cfg: turbospark::model::ModelConfig,
    batch: usize,
) {
    let src = SyntheticSource::new(cfg, 42).unwrap();
    let batched = row_after_prefill(open(), &src, batch, batch);
    let single = row_after_prefill(open(), &src, batch, 1);
    match common::reference_for(&open()) {
        None => within(
            &format!("between prefill batches of {batch} and 1"),
            &[batched],
            &[single],
            None,
        ),
        // (a batch's GEMMs round x to f16, one token's stay f32: each
        // against the CPU reference doing the same)
        Some(cpu) => {
            let want = row_after_prefill(cpu, &src, batch, batch);
            let f32 = row_after_prefill(CpuBackend::new(), &src, batch, batch);
            let what = format!("after prefill batches of {batch}, against the reference");
            within(&what, &[batched], &[want], Some(&[f32]));
            let want = row_after_prefill(CpuBackend::new(), &src, batch, 1);
            let what = "after prefill batches of 1, against the reference";
            let f32 = std::slice::from_ref(&want);
            within(what, &[single], f32, Some(f32));
        }
    }
}

/// The logits of token 3 after a prompt of `2 * batch + 5` tokens
/// prefilled in batches of `prefill_batch`.
fn row_after_prefill<B: ComputeBackend>(
    be: B,
    src: &SyntheticSource,
    batch: usize,
    prefill_batch: usize,
) -> Vec<f32> {
    let o = ModelOptions {
        max_context: 64,
        prefill_batch,
        ..Default::default()
    };
    let mut m = OneSequence::load(be, src, o).unwrap();
    let p = prompt(2 * batch + 5, m.config().vocab);
    let none = GenerateOptions {
        max_new_tokens: 0,
        ..Default::default()
    };
    m.generate(&p, &none).unwrap();
    assert_eq!(m.position(), p.len());
    m.logits(&[3]).unwrap().remove(0)
}

#[test]
fn prefill_batch_size_does_not_change_the_caches() {
    prefill_batch_sizes_agree(CpuBackend::new, tiny_config(), 24);
}

#[test]
fn wgpu_prefill_batch_size_does_not_change_the_caches() {
    if common::wgpu_backend().is_some() {
        let open = || common::wgpu_backend().unwrap();
        // moe_inter 12: phase 2 through the route-list kernel; 16: through
        // the GEMM and moe_sum.
        prefill_batch_sizes_agree(open, tiny_config(), 24);
        let mut cfg = tiny_config();
        cfg.moe_inter = 16;
        prefill_batch_sizes_agree(open, cfg, 24);
    }
}

#[test]
fn bad_prefill_batch_is_refused() {
    let src = SyntheticSource::new(tiny_config(), 42).unwrap();
    for prefill_batch in [0, turbospark::model::MAX_PREFILL_BATCH + 1] {
        let o = ModelOptions {
            prefill_batch,
            ..Default::default()
        };
        let e = OneSequence::load(CpuBackend::new(), &src, o).err().unwrap();
        assert!(e.to_string().contains("prefill_batch"), "{e}");
    }
}

#[test]
fn bad_kv_cache_dtype_is_refused() {
    let src = SyntheticSource::new(tiny_config(), 42).unwrap();
    for kv_cache in [DType::BF16, DType::U32] {
        let o = ModelOptions {
            kv_cache,
            ..Default::default()
        };
        let e = OneSequence::load(CpuBackend::new(), &src, o).err().unwrap();
        assert!(e.to_string().contains("kv_cache"), "{e}");
    }
}

#[test]
fn generate_matches_teacher_forced_greedy() {
    let mut m = tiny_model(64);
    let vocab = m.config().vocab;
    let p = prompt(21, vocab);
    let g = m
        .generate(
            &p,
            &GenerateOptions {
                max_new_tokens: 10,
                sampling: Sampling::Greedy,
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(g.tokens.len(), 10);
    // Teacher-forcing the prompt plus the generated tokens must reproduce
    // every greedy choice.
    assert_eq!(
        teacher_forced_picks(&mut m, &p, &g.tokens, argmax),
        g.tokens
    );
    // Same answer when the prompt goes one token at a time.
    m.reset();
    let g1 = m
        .generate(
            &p[..1],
            &GenerateOptions {
                max_new_tokens: 0,
                sampling: Sampling::Greedy,
                ..Default::default()
            },
        )
        .unwrap();
    assert!(g1.tokens.is_empty());
    for &t in &p[1..p.len() - 1] {
        m.logits(&[t]).unwrap();
    }
    let g2 = m
        .generate(
            &p[p.len() - 1..],
            &GenerateOptions {
                max_new_tokens: 10,
                sampling: Sampling::Greedy,
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(g2.tokens, g.tokens);
}

/// The prompt's last token rides in its last prefill batch, and the LM
/// head runs for that row only: whatever the last batch holds (a whole
/// batch, a part, or the one token on the decode path), generation
/// matches the teacher-forced greedy choice and ends at the same position.
#[test]
fn generate_takes_the_first_token_from_the_last_prefill_batch() {
    let src = SyntheticSource::new(tiny_config(), 42).unwrap();
    let o = ModelOptions {
        max_context: 64,
        prefill_batch: 8,
        ..Default::default()
    };
    let mut m = OneSequence::load(CpuBackend::new(), &src, o).unwrap();
    let vocab = m.config().vocab;
    let greedy = |n| GenerateOptions {
        max_new_tokens: n,
        sampling: Sampling::Greedy,
        ..Default::default()
    };
    for len in [16, 17, 20, 1] {
        let p = prompt(len, vocab);
        m.reset();
        let g = m.generate(&p, &greedy(6)).unwrap();
        assert_eq!(g.tokens.len(), 6, "prompt of {len}");
        assert_eq!(m.position(), len + 5, "prompt of {len}: position");
        let picks = teacher_forced_picks(&mut m, &p, &g.tokens, argmax);
        assert_eq!(picks, g.tokens, "prompt of {len}");
        // One new token: the prefill's head alone.
        m.reset();
        let one = m.generate(&p, &greedy(1)).unwrap();
        assert_eq!(one.tokens, g.tokens[..1], "prompt of {len}: one token");
        assert_eq!(m.position(), len, "prompt of {len}: position after one");
        // The sampled path samples the prefill's head row first, then one
        // decode step's row a token: a sampler replayed over the
        // teacher-forced rows picks the same tokens. (Top-1 sampling would
        // not test it: it takes the greedy path.)
        m.reset();
        let sampling = Sampling::Random {
            temperature: 1.0,
            top_k: Some(20),
            top_p: None,
            min_p: None,
            repetition_penalty: None,
            seed: 9,
        };
        assert!(!sampling.is_greedy());
        let sampled = GenerateOptions {
            max_new_tokens: 6,
            sampling: sampling.clone(),
            ..Default::default()
        };
        let s = m.generate(&p, &sampled).unwrap();
        assert_eq!(s.tokens.len(), 6, "prompt of {len}: sampled");
        let mut replay = Sampler::new(&sampling).unwrap();
        let picks = teacher_forced_picks(&mut m, &p, &s.tokens, |r| replay.sample(r).unwrap());
        assert_eq!(picks, s.tokens, "prompt of {len}: sampled");
    }
}

#[test]
fn seeded_sampling_is_reproducible() {
    let mut m = tiny_model(64);
    let p = prompt(7, m.config().vocab);
    let opts = GenerateOptions {
        max_new_tokens: 8,
        sampling: Sampling::Random {
            temperature: 1.0,
            top_k: Some(20),
            top_p: Some(0.9),
            min_p: None,
            repetition_penalty: None,
            seed: 5,
        },
        ..Default::default()
    };
    let a = m.generate(&p, &opts).unwrap();
    m.reset();
    let b = m.generate(&p, &opts).unwrap();
    assert_eq!(a.tokens, b.tokens);
}

#[test]
fn decode_only_run_allocates_no_batch_scratch() {
    let mut m = tiny_model(32);
    m.generate(
        &[3],
        &GenerateOptions {
            max_new_tokens: 4,
            sampling: Sampling::Greedy,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(!m.has_batch_scratch());
    m.reset();
    m.logits(&[1, 2, 3]).unwrap();
    assert!(m.has_batch_scratch());
}

/// The batch scratch a model's first batched pass allocates holds the
/// bytes `scratch_bytes` counts for it (and with streamed experts
/// `stream_scratch_bytes` more): the figure `runtime_bytes` checks a run
/// against at load is the list the scratch is made from.
#[test]
fn wgpu_batch_scratch_holds_the_bytes_counted() {
    let Some(mut be) = common::wgpu_backend() else {
        return;
    };
    let cfg = tiny_config();
    let src = SyntheticSource::new(cfg.clone(), 42).unwrap();
    let batch = 24;
    for slots in [None, Some(cfg.top_k)] {
        let o = ModelOptions {
            max_context: 64,
            prefill_batch: batch,
            expert_slots: slots,
            ..Default::default()
        };
        let mut m = OneSequence::load(be, &src, o).unwrap();
        // (the ops' own scratch, made on use, is let go on both sides)
        m.backend().release_scratch();
        let before = m.backend().memory().0;
        m.logits(&prompt(batch, cfg.vocab)).unwrap();
        assert!(m.has_batch_scratch());
        m.backend().release_scratch();
        let held = m.backend().memory().0 - before;
        let mut want = scratch_bytes(&cfg, batch, LOGITS_BATCH.min(batch));
        if slots.is_some() {
            want += stream_scratch_bytes(&cfg, batch);
        }
        assert_eq!(held, want, "{slots:?} expert slots");
        be = m.into_backend();
    }
}

#[test]
fn context_and_vocab_limits_are_errors() {
    let mut m = tiny_model(16);
    let vocab = m.config().vocab as u32;
    let e = m.logits(&prompt(17, vocab as usize)).unwrap_err();
    assert!(matches!(e, Error::InvalidInput(_)), "{e}");
    assert!(e.to_string().contains("maximum context"), "{e}");
    let e = m
        .generate(
            &prompt(10, vocab as usize),
            &GenerateOptions {
                max_new_tokens: 8,
                sampling: Sampling::Greedy,
                ..Default::default()
            },
        )
        .unwrap_err();
    assert!(matches!(e, Error::InvalidInput(_)), "{e}");
    let e = m.logits(&[1, vocab, 2]).unwrap_err();
    assert!(matches!(e, Error::InvalidInput(_)), "{e}");
    assert!(e.to_string().contains("past the vocabulary"), "{e}");
    assert!(m.generate(&[], &GenerateOptions::default()).is_err());
    // Exactly max_context fits.
    m.reset();
    assert_eq!(m.logits(&prompt(16, vocab as usize)).unwrap().len(), 16);
}

#[test]
fn synthetic_weights_are_deterministic() {
    let a = tiny_model(8).logits(&[1, 2, 3]).unwrap();
    let b = tiny_model(8).logits(&[1, 2, 3]).unwrap();
    assert_eq!(a, b);
    assert!(a.iter().flatten().all(|v| v.is_finite()));
}

/// A source that lies about one tensor's shape.
struct Misshapen(SyntheticSource);

impl turbospark::model::TensorSource for Misshapen {
    fn config(&self) -> &turbospark::model::ModelConfig {
        self.0.config()
    }
    fn tensor(&self, name: &str) -> turbospark::Result<turbospark::model::TensorRef> {
        let mut t = self.0.tensor(name)?;
        if name == "layers.1.self_attn.k_proj.weight" {
            t.shape.reverse();
        }
        Ok(t)
    }
}

#[test]
fn misshapen_tensor_is_named() {
    use turbospark::model::TensorSource;
    let src = Misshapen(SyntheticSource::new(tiny_config(), 1).unwrap());
    assert!(src.tensor("nope").is_err());
    let e = OneSequence::load(CpuBackend::new(), &src, ModelOptions::default())
        .err()
        .unwrap();
    let msg = e.to_string();
    assert!(msg.contains("layers.1.self_attn.k_proj.weight"), "{msg}");
    assert!(msg.contains("expected"), "{msg}");
}

#[test]
fn wgpu_logits_batches_match_token_by_token_decode() {
    if let Some(b) = common::wgpu_backend() {
        batched_and_single(b, opts(64), 2 * LOGITS_BATCH + 5);
    }
}

#[test]
fn named_synthetic_configs() {
    use turbospark::model::synthetic::named_config;
    let big = named_config("gemma-4-26b-a4b").unwrap();
    assert_eq!(big.layers.len(), 30);
    let src = SyntheticSource::new(big, 0).unwrap();
    // Generated on demand: one tensor, not the model.
    let t =
        turbospark::model::TensorSource::tensor(&src, "layers.5.self_attn.q_proj.weight").unwrap();
    assert_eq!(t.shape, vec![16 * 512, 2816]);
    // Full layers are k_eq_v: no v_proj.
    let names = src.names();
    assert!(!names
        .iter()
        .any(|(n, _)| n == "layers.5.self_attn.v_proj.weight"));
    assert!(names
        .iter()
        .any(|(n, _)| n == "layers.4.self_attn.v_proj.weight"));
    assert!(named_config("nope").is_err());
}

/// Greedy and sampled generation stop at an end-of-sequence token when asked
/// (it is the last token returned) and leave the position where a run of
/// that many tokens would; without the flag they run to the length asked.
/// On the wgpu backend too: its greedy decode has steps in flight past the
/// stop token that must be taken back.
fn stops_at_eos<B: ComputeBackend>(open: impl Fn() -> B) {
    let free = |eos: Vec<u32>| {
        let mut cfg = tiny_config();
        cfg.eos_token_ids = eos;
        // Weights depend on (seed, tensor name) only: same model, other eos.
        let src = SyntheticSource::new(cfg, 42).unwrap();
        OneSequence::load(open(), &src, opts(64)).unwrap()
    };
    let mut m = free(vec![]);
    let p = prompt(9, m.config().vocab);
    let opts = |stop_at_eos, sampling| GenerateOptions {
        max_new_tokens: 12,
        sampling,
        stop_at_eos,
    };
    let sampled = Sampling::Random {
        temperature: 1.0,
        top_k: Some(20),
        top_p: None,
        min_p: None,
        repetition_penalty: None,
        seed: 3,
    };
    for sampling in [Sampling::Greedy, sampled] {
        m.reset();
        let all = m.generate(&p, &opts(true, sampling.clone())).unwrap();
        assert_eq!(all.tokens.len(), 12, "no eos configured: full length");
        let eos = all.tokens[4];
        let k = all.tokens.iter().position(|&t| t == eos).unwrap() + 1;
        let mut stopping = free(vec![eos]);
        let g = stopping
            .generate(&p, &opts(true, sampling.clone()))
            .unwrap();
        assert_eq!(g.tokens, all.tokens[..k], "stops after the first eos");
        assert_eq!(
            stopping.position(),
            p.len() + k - 1,
            "position after the stop"
        );
        stopping.reset();
        let g = stopping.generate(&p, &opts(false, sampling)).unwrap();
        assert_eq!(g.tokens, all.tokens, "stop_at_eos off: full length");
    }
}

#[test]
fn cpu_stops_at_eos() {
    stops_at_eos(CpuBackend::new);
}

#[test]
fn wgpu_stops_at_eos() {
    if common::wgpu_backend().is_some() {
        stops_at_eos(|| common::wgpu_backend().unwrap());
    }
}

/// A decode step on the GPU is one submit and exactly 8 dispatches per
/// layer (q|k|v GEMV, qkv_post inside the attention's split phase, the
/// combine, o_proj, post_attention with the router's logits, the dense and
/// routed gate_up as one launch that also picks the experts, the same for
/// down, post_ffn) plus 6 around them (embed, the first input norm, LM
/// head, softcap, two argmax passes); 9 on a device that binds fewer than
/// 14 storage buffers a stage (the router's top-k takes its own launch), 10
/// at 10 (so do the logits). Exact, so that a fusion lost shows; below 10
/// (every pair and fused launch splits) only the one submit is checked.
/// Counted from the difference between two greedy runs of different
/// lengths.
#[test]
fn wgpu_decode_step_is_one_submit() {
    let Some(be) = common::wgpu_backend() else {
        return;
    };
    // Sizes the decode kernels take (reduced dimensions multiples of 8; the
    // tiny model's moe_inter of 12 sends phase 2 down the general path).
    let mut cfg = tiny_config();
    cfg.moe_inter = 16;
    assert!(cfg.enable_moe, "the tiny model exercises the MoE path");
    let layers = cfg.layers.len() as u64;
    // 8 a layer where every fusion binds its buffers (the routed gate_up
    // pair 14, attn_decode_qkv 12, post_attention_logits 11), and one fewer
    // where launches finish in their last workgroup (coherent storage): the
    // decode attention's combine (the tiny model's layers all take it).
    let tails = u64::from(be.features().coherent_storage);
    let per_layer = match be.wgpu_limits().max_storage_buffers_per_shader_stage {
        14.. => Some(8),
        12..=13 => Some(9),
        11 => Some(10),
        10 => Some(11),
        _ => None,
    }
    .map(|n| n - tails);
    let src = SyntheticSource::new(cfg, 42).unwrap();
    let (dispatches, submits) = decode_step_counts(be, &src);
    assert_eq!(submits, 1, "one submit per decode step");
    if let Some(per_layer) = per_layer {
        assert_eq!(
            dispatches,
            per_layer * layers + 6,
            "dispatches per decode step over {layers} layers"
        );
    }
}

/// Dispatches and submits a greedy decode step of the model in `src`
/// records, from the difference between two runs of different lengths.
fn decode_step_counts(be: turbospark_wgpu::WgpuBackend, src: &SyntheticSource) -> (u64, u64) {
    let mut m = OneSequence::load(be, src, opts(64)).unwrap();
    let p = prompt(5, m.config().vocab);
    let mut run = |n: usize| {
        m.reset();
        let before = m.backend().counters();
        let opts = GenerateOptions {
            max_new_tokens: n,
            sampling: Sampling::Greedy,
            stop_at_eos: false,
        };
        let g = m.generate(&p, &opts).unwrap();
        assert_eq!(g.tokens.len(), n);
        let after = m.backend().counters();
        (after.0 - before.0, after.1 - before.1)
    };
    run(2); // compile every pipeline first
    let (d2, s2) = run(2);
    let (d8, s8) = run(8);
    assert_eq!(
        (s8 - s2) % 6,
        0,
        "submits per step not constant: {s2} vs {s8}"
    );
    ((d8 - d2) / 6, (s8 - s2) / 6)
}

/// A decode step with MLX affine weights (4 bits, group 32; the router at
/// 8 bits, as mlx-lm writes Gemma 4) records as many dispatches as with
/// bf16 weights where the device binds 14 storage buffers a stage: the
/// router's logits inside post_attention, both gate_up problems in one
/// launch that also picks the experts, both down problems in one launch.
#[test]
fn wgpu_quantized_decode_step_matches_bf16() {
    let Some(be) = common::wgpu_backend() else {
        return;
    };
    // Sizes every group of 32 divides (a weight it does not stays bf16).
    let mut cfg = tiny_config();
    cfg.hidden = 64;
    cfg.intermediate = 64;
    cfg.moe_inter = 32;
    let fused = be.wgpu_limits().max_storage_buffers_per_shader_stage >= 14;
    let q = turbospark::model::synthetic::SyntheticQuant { bits: 4, group: 32 };
    let quantized = SyntheticSource::quantized(cfg.clone(), 42, q).unwrap();
    let (dq, sq) = decode_step_counts(be, &quantized);
    let plain = SyntheticSource::new(cfg, 42).unwrap();
    let (db, _) = decode_step_counts(common::wgpu_backend().unwrap(), &plain);
    eprintln!("dispatches a decode step: {dq} quantized, {db} bf16");
    assert_eq!(sq, 1, "one submit per decode step");
    if fused {
        assert_eq!(dq, db, "dispatches a decode step, quantized against bf16");
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        assert_eq!(dq, db, "CI's lavapipe runs the fused kernels");
    }
}

/// The CPU reference given a rounding rule rounds the products it names and
/// no others: batched rows move (by what f16 inputs cost, far below what a
/// wrong op gives), token-by-token rows (m = 1, not named) stay bit-equal.
#[test]
fn cpu_reference_rounds_the_gemms_a_rule_names() {
    let rule: turbospark::GemmRounding = std::sync::Arc::new(|_, m, _| m > 1);
    let src = SyntheticSource::new(tiny_config(), 42).unwrap();
    let tokens = prompt(24, tiny_config().vocab);
    let mut plain = OneSequence::load(CpuBackend::new(), &src, opts(64)).unwrap();
    let rounding = CpuBackend::new().rounding_gemm_inputs_as(rule);
    let mut rounded = OneSequence::load(rounding, &src, opts(64)).unwrap();
    let (pb, ps) = teacher_forced(&mut plain, &tokens);
    let (rb, rs) = teacher_forced(&mut rounded, &tokens);
    assert_eq!(ps, rs, "token-by-token rows");
    for (i, (r, p)) in rb.iter().zip(&pb).enumerate() {
        let e = nmse(r, p);
        assert!(e > 0.0 && e < 1e-3, "row {i}: NMSE {e:e} from rounding");
    }
}

/// The model with its expert stacks in tile order
/// (backends/wgpu/src/expert_tiles.rs, on by default only on tensor-core
/// devices) on a shape that takes them (hidden 64, moe_inter 32: whole
/// 64-row blocks): prefill batches and token-by-token decode, with the
/// fused and routed decode launches, against the CPU reference, which
/// keeps the experts row-major, and the first tokens `generate` picks.
#[test]
fn wgpu_with_tiled_experts_matches_the_reference() {
    let Some((gpu, cfg)) = common::wgpu_with_tiled_experts() else {
        return;
    };
    let src = SyntheticSource::new(cfg, 7).unwrap();
    // (the CPU reference rounding as the device does, where it rounds; its
    // f32 twin is then the plain reference, else the reference itself)
    let rounding = common::reference_for(&gpu);
    let plain = rounding.is_none();
    let load = |be| OneSequence::load(be, &src, opts(64)).unwrap();
    let mut m = OneSequence::load(gpu, &src, opts(64)).unwrap();
    let tokens = &prompt(2 * LOGITS_BATCH + 5, m.config().vocab);
    let (batched, single) = teacher_forced(&mut m, tokens);
    let mut r = load(rounding.unwrap_or_default());
    let (rb, rs) = teacher_forced(&mut r, tokens);
    let (fb, fs) = if plain {
        (rb.clone(), rs.clone())
    } else {
        teacher_forced(&mut load(CpuBackend::new()), tokens)
    };
    within("batched, tiled experts", &batched, &rb, Some(&fb));
    within("single-token, tiled experts", &single, &rs, Some(&fs));
    let greedy = GenerateOptions {
        max_new_tokens: 6,
        sampling: Sampling::Greedy,
        ..Default::default()
    };
    m.reset();
    r.reset();
    let got = m.generate(&tokens[..20], &greedy).unwrap().tokens;
    let want = r.generate(&tokens[..20], &greedy).unwrap().tokens;
    assert_eq!(got, want, "greedy tokens with tiled experts");
}

/// `generate_streaming` hands over each token once, in order, as
/// `generate` returns them (greedy, pipelined on the device, and sampled).
#[test]
fn streaming_hands_over_every_token_in_order() {
    let mut m = tiny_model(64);
    let p = prompt(9, m.config().vocab);
    for sampling in [
        Sampling::Greedy,
        Sampling::Random {
            temperature: 0.9,
            top_k: Some(20),
            top_p: None,
            min_p: None,
            repetition_penalty: None,
            seed: 3,
        },
    ] {
        let opts = GenerateOptions {
            max_new_tokens: 12,
            sampling,
            ..Default::default()
        };
        m.reset();
        let mut seen = Vec::new();
        let g = m
            .generate_streaming(&p, &opts, |t| {
                seen.push(t);
                ControlFlow::Continue(())
            })
            .unwrap();
        assert_eq!(g.tokens.len(), 12);
        assert_eq!(seen, g.tokens, "{:?}", opts.sampling);
        m.reset();
        assert_eq!(m.generate(&p, &opts).unwrap().tokens, g.tokens);
    }
}

/// A `Break` from the callback ends generation after that token and
/// leaves the context as a stop token does: the greedy steps recorded past
/// it are taken back, so continuing from the last token gives the rest of
/// the uninterrupted run.
#[test]
fn streaming_stops_where_the_callback_says_and_can_continue() {
    let mut m = tiny_model(64);
    let p = prompt(9, m.config().vocab);
    let greedy = |n| GenerateOptions {
        max_new_tokens: n,
        ..Default::default()
    };
    let whole = m.generate(&p, &greedy(10)).unwrap().tokens;
    m.reset();
    // Stopped after its fourth token.
    let head_of = |m: &mut OneSequence<CpuBackend>| {
        m.reset();
        let mut n = 0;
        m.generate_streaming(&p, &greedy(10), |_| {
            n += 1;
            if n == 4 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })
        .unwrap()
        .tokens
    };
    assert_eq!(head_of(&mut m), whole[..4]);
    let rest = m.generate(&whole[3..4], &greedy(6)).unwrap().tokens;
    assert_eq!(rest, whole[4..]);
    // The context holds the prompt and the first three new tokens: the
    // next rows match a model fed all of them at once.
    head_of(&mut m);
    let next = m.logits(&whole[3..5]).unwrap();
    let mut fresh = tiny_model(64);
    let all: Vec<u32> = p.iter().chain(&whole[..5]).copied().collect();
    let want = fresh.logits(&all).unwrap();
    for (got, want) in next.iter().zip(&want[all.len() - 2..]) {
        let e = nmse(got, want);
        assert!(e < SAME_PATH_NMSE, "NMSE {e:e}");
    }
}

/// A repetition penalty reaches the model's sampling: the tiny model
/// repeats itself greedily, and with a large penalty (temperature 0, so
/// the host's argmax over penalized logits) it takes no token twice and
/// none of the prompt's.
#[test]
fn repetition_penalty_applies_to_the_prompt_and_the_new_tokens() {
    let mut m = tiny_model(64);
    let p = prompt(9, m.config().vocab);
    let plain = m
        .generate(
            &p,
            &GenerateOptions {
                max_new_tokens: 12,
                ..Default::default()
            },
        )
        .unwrap()
        .tokens;
    let mut distinct = plain.clone();
    distinct.sort();
    distinct.dedup();
    assert!(distinct.len() < plain.len(), "greedy repeats: {plain:?}");
    m.reset();
    let opts = GenerateOptions {
        max_new_tokens: 12,
        sampling: Sampling::Random {
            temperature: 0.0,
            top_k: None,
            top_p: None,
            min_p: None,
            repetition_penalty: Some(1e4),
            seed: 0,
        },
        ..Default::default()
    };
    let got = m.generate(&p, &opts).unwrap().tokens;
    let mut distinct = got.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), got.len(), "{got:?}");
    assert!(!got.iter().any(|t| p.contains(t)), "{got:?} against {p:?}");
}
