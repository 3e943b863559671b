//! Gemma 4's drafter and speculative decoding, against transformers
//! (tests/fixtures/tiny-text-assistant*, scripts/make_drafter_fixtures.py):
//! the drafter's logits to the f32 floor, greedy speculative output token
//! for token the target's own with transformers' acceptance counts, forced
//! proposals, the sampling rule's distribution, and drafters that do not
//! fit. On the CPU reference and on wgpu.

mod common;

use std::ops::ControlFlow;
use std::path::PathBuf;

use serde_json::Value;
use turbospark::model::drafter::{
    accept_rule, DraftInput, Drafter, SpeculativeOptions, SpeculativeStats,
};
use turbospark::model::sampling::Sampler;
use turbospark::model::{Checkpoint, GenerateOptions, Model, ModelOptions, Sampling};
use turbospark::ComputeBackend;
use turbospark_cpu::CpuBackend;

use common::{nmse, repo_root, temp_dir::TempDir, wgpu_backend};

const DRAFTERS: [&str; 2] = ["tiny-text-assistant", "tiny-text-assistant-ordered"];

fn fixture(name: &str) -> PathBuf {
    repo_root().join("tests/fixtures").join(name)
}

fn target<B: ComputeBackend>(be: B) -> Model<B> {
    let ckpt = Checkpoint::open(&fixture("tiny-text")).unwrap();
    let opts = ModelOptions {
        max_context: 64,
        ..Default::default()
    };
    Model::load(be, &ckpt, opts).unwrap()
}

fn expected(name: &str) -> Value {
    let text = std::fs::read_to_string(fixture(name).join("expected.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// Rows of an F32 tensor of `draft.safetensors`.
fn rows(name: &str, tensor: &str) -> Vec<Vec<f32>> {
    let bytes = std::fs::read(fixture(name).join("draft.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor(tensor).unwrap();
    let width = t.shape()[1];
    let flat: Vec<f32> = t
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    flat.chunks(width).map(<[f32]>::to_vec).collect()
}

/// Three draft steps at the fixture's position: logits and projected
/// states to the f32 floor, the same drafted tokens.
fn drafter_logits<B: ComputeBackend>(be: B, limit: f64) {
    let model = target(be);
    for name in DRAFTERS {
        let drafter = Drafter::load(&model, &fixture(name)).unwrap();
        let case = &expected(name)["draft"];
        let tokens = ids(&case["tokens"]);
        let p = case["position"].as_u64().unwrap() as usize;
        let want_logits = rows(name, "logits");
        let want_hidden = rows(name, "hidden");
        let mut seq = model.new_sequence().unwrap();
        model.logits(&mut seq, &tokens[..p]).unwrap();
        let mut input = DraftInput::Target { m: p, row: p - 1 };
        let mut tok = tokens[p];
        let mut drafted = Vec::new();
        for (step, (wl, wh)) in want_logits.iter().zip(&want_hidden).enumerate() {
            let got = drafter.step(&model, &seq, p, tok, input).unwrap();
            let hidden = drafter.projected(model.backend()).unwrap();
            let (el, eh) = (nmse(&got, wl), nmse(&hidden, wh));
            eprintln!("{name} step {step}: logits NMSE {el:.2e}, hidden NMSE {eh:.2e}");
            assert!(
                el < limit && eh < limit,
                "{name} step {step}: {el:.2e} / {eh:.2e} over {limit:.0e}"
            );
            tok = turbospark::model::sampling::argmax(&got);
            drafted.push(tok);
            input = DraftInput::Previous;
        }
        assert_eq!(drafted, ids(&case["drafted"]), "{name}: drafted tokens");
        // The greedy step (the selected logits' argmax where the drafter
        // has centroids, the device's where not) drafts the same tokens.
        let (mut input, mut tok, mut greedy) = (
            DraftInput::Target { m: p, row: p - 1 },
            tokens[p],
            Vec::new(),
        );
        for _ in 0..drafted.len() {
            tok = drafter.step_greedy(&model, &seq, p, tok, input).unwrap();
            greedy.push(tok);
            input = DraftInput::Previous;
        }
        assert_eq!(greedy, drafted, "{name}: greedy steps' tokens");
    }
}

fn greedy(n: usize) -> GenerateOptions {
    GenerateOptions {
        max_new_tokens: n,
        sampling: Sampling::Greedy,
        stop_at_eos: false,
    }
}

fn speculate<B: ComputeBackend>(
    model: &Model<B>,
    drafter: &Drafter<B>,
    prompt: &[u32],
    opts: &GenerateOptions,
    spec: &SpeculativeOptions,
) -> (Vec<u32>, SpeculativeStats) {
    let mut seq = model.new_sequence().unwrap();
    let (g, stats) = drafter
        .generate(model, &mut seq, prompt, opts, spec, |_| {
            ControlFlow::Continue(())
        })
        .unwrap();
    // The context ends before the last new token, as a plain run leaves it.
    assert_eq!(seq.position(), prompt.len() + g.tokens.len() - 1);
    (g.tokens, stats)
}

/// Greedy with each drafter, for the fixture's cases of its k in `runs`:
/// the target's greedy tokens (plain generation's too with `plain`), and
/// the fixture's acceptance counts.
fn greedy_speculation<B: ComputeBackend>(be: B, runs: &[(&str, &[usize])], plain: bool) {
    let model = target(be);
    for &(name, ks) in runs {
        let drafter = Drafter::load(&model, &fixture(name)).unwrap();
        let exp = expected(name);
        let n = exp["max_new_tokens"].as_u64().unwrap() as usize;
        for case in exp["assisted"].as_array().unwrap() {
            let prompt = ids(&case["prompt"]);
            let k = case["k"].as_u64().unwrap() as usize;
            if !ks.contains(&k) {
                continue;
            }
            let spec = SpeculativeOptions {
                draft_tokens: k,
                forced: None,
            };
            let (tokens, stats) = speculate(&model, &drafter, &prompt, &greedy(n), &spec);
            let what = format!("{name}, prompt of {}, k {k}", prompt.len());
            if plain {
                let mut seq = model.new_sequence().unwrap();
                let want = model.generate(&mut seq, &prompt, &greedy(n)).unwrap();
                assert_eq!(
                    tokens, want.tokens,
                    "{what}: not the target's greedy tokens"
                );
            }
            assert_eq!(
                tokens,
                ids(&case["tokens"]),
                "{what}: not transformers' tokens"
            );
            let want = |key: &str| case[key].as_u64().unwrap() as usize;
            assert_eq!(
                (stats.accepted, stats.drafted, stats.rounds),
                (want("accepted"), want("drafted"), want("rounds")),
                "{what}: accepted, drafted, rounds"
            );
        }
    }
}

/// Forced proposals: all right (every draft kept), and every third wrong
/// (a rejection and a truncation most rounds); the output stays the
/// target's either way. For k in `ks`.
fn forced_proposals<B: ComputeBackend>(be: B, ks: &[usize]) {
    let model = target(be);
    let drafter = Drafter::load(&model, &fixture(DRAFTERS[0])).unwrap();
    let prompt = [17, 301, 88, 5, 412, 230, 77, 150, 9, 499];
    let n = 20;
    let plain = model
        .generate(&mut model.new_sequence().unwrap(), &prompt, &greedy(n))
        .unwrap()
        .tokens;
    for &k in ks {
        let right = SpeculativeOptions {
            draft_tokens: k,
            forced: Some(plain.clone()),
        };
        let (tokens, stats) = speculate(&model, &drafter, &prompt, &greedy(n), &right);
        assert_eq!(tokens, plain, "k {k}, right proposals");
        assert_eq!(
            stats.accepted, stats.drafted,
            "k {k}: every right proposal kept"
        );
        assert_eq!(stats.rounds, (n - 1).div_ceil(k + 1), "k {k}: rounds");
        let wrong: Vec<u32> = plain
            .iter()
            .enumerate()
            .map(|(i, &t)| if i % 3 == 2 { (t + 1) % 512 } else { t })
            .collect();
        let spec = SpeculativeOptions {
            draft_tokens: k,
            forced: Some(wrong),
        };
        let (tokens, stats) = speculate(&model, &drafter, &prompt, &greedy(n), &spec);
        assert_eq!(tokens, plain, "k {k}, every third proposal wrong");
        assert!(stats.accepted < stats.drafted, "k {k}: some rejected");
    }
}

#[test]
fn cpu_drafter_logits_match_transformers() {
    drafter_logits(CpuBackend::new(), 1e-10);
}

#[test]
fn wgpu_drafter_logits_match_transformers() {
    if let Some(be) = wgpu_backend() {
        drafter_logits(be, 1e-10);
    }
}

#[test]
fn cpu_greedy_speculation_is_the_targets_greedy() {
    let all: &[usize] = &[1, 2, 3, 4];
    greedy_speculation(
        CpuBackend::new(),
        &[(DRAFTERS[0], all), (DRAFTERS[1], all)],
        true,
    );
}

#[test]
fn wgpu_greedy_speculation_is_the_targets_greedy() {
    // (against the fixture's tokens, which are the target's; the ordered
    // head at k 4 only: lavapipe takes tens of milliseconds a pass)
    if let Some(be) = wgpu_backend() {
        greedy_speculation(
            be,
            &[(DRAFTERS[0], &[1, 2, 3, 4]), (DRAFTERS[1], &[4])],
            false,
        );
    }
}

#[test]
fn cpu_forced_proposals_accept_and_truncate() {
    forced_proposals(CpuBackend::new(), &[1, 2, 3, 4]);
}

#[test]
fn wgpu_forced_proposals_accept_and_truncate() {
    if let Some(be) = wgpu_backend() {
        forced_proposals(be, &[1, 3]);
    }
}

/// The rule on given distributions: the first output token is distributed
/// as p[0] (and, after a kept first draft, the second as p[1]), whatever
/// q is. 40000 seeded rounds; the largest deviation of any token's
/// frequency is held to 5 standard errors.
#[test]
fn the_sampling_rule_keeps_the_targets_distribution() {
    let p = vec![
        vec![0.5, 0.2, 0.2, 0.1, 0.0],
        vec![0.1, 0.1, 0.3, 0.3, 0.2],
        vec![0.25, 0.25, 0.25, 0.25, 0.0],
    ];
    let q = vec![vec![0.1, 0.6, 0.1, 0.1, 0.1], vec![0.4, 0.0, 0.2, 0.2, 0.2]];
    let random = Sampling::Random {
        temperature: 1.0,
        top_k: None,
        top_p: None,
        min_p: None,
        repetition_penalty: None,
        seed: 3,
    };
    let mut sampler = Sampler::new(&random).unwrap();
    let trials = 40_000;
    let mut first = [0usize; 5];
    let mut second = [0usize; 5];
    let mut second_n = 0;
    for _ in 0..trials {
        let drafts: Vec<u32> = q.iter().map(|row| sampler.draw(row)).collect();
        let (n, next) = accept_rule(&mut sampler, &p, &q, &drafts);
        let out: Vec<u32> = drafts[..n].iter().copied().chain([next]).collect();
        first[out[0] as usize] += 1;
        // Given the first token, the second is p[1]'s draw only where
        // the first was a kept draft; condition on token 0 kept.
        if out.len() > 1 && out[0] == 0 {
            second[out[1] as usize] += 1;
            second_n += 1;
        }
    }
    let check = |counts: &[usize], total: usize, want: &[f32], what: &str| {
        for (t, (&c, &w)) in counts.iter().zip(want).enumerate() {
            let f = c as f64 / total as f64;
            let se = ((w as f64 * (1.0 - w as f64)) / total as f64)
                .sqrt()
                .max(1e-4);
            assert!(
                (f - w as f64).abs() < 5.0 * se,
                "{what}: token {t} at {f:.4}, the target's {w}"
            );
        }
    };
    check(&first, trials, &p[0], "first token");
    assert!(second_n > 1000);
    check(&second, second_n, &p[1], "second token after a kept 0");
}

/// Pearson's statistic of `counts` (per condition, per token) against the
/// exact distributions `want` (per condition), cells expected under 5
/// pooled per condition; returns (statistic, degrees of freedom).
fn chi_square(
    counts: &std::collections::BTreeMap<Vec<u32>, Vec<usize>>,
    want: &std::collections::BTreeMap<Vec<u32>, Vec<f32>>,
) -> (f64, usize) {
    let (mut chi2, mut dof) = (0.0, 0usize);
    for (cond, c) in counts {
        let n: usize = c.iter().sum();
        let p = &want[cond];
        let (mut pooled_obs, mut pooled_exp, mut cells) = (0.0, 0.0, 0usize);
        for (t, &obs) in c.iter().enumerate() {
            let exp = n as f64 * p[t] as f64;
            assert!(
                exp > 0.0 || obs == 0,
                "token {t} after {cond:?}: drawn, probability 0"
            );
            if exp >= 5.0 {
                chi2 += (obs as f64 - exp).powi(2) / exp;
                cells += 1;
            } else {
                pooled_obs += obs as f64;
                pooled_exp += exp;
            }
        }
        if pooled_exp > 0.0 {
            chi2 += (pooled_obs - pooled_exp).powi(2) / pooled_exp.max(1.0);
            cells += 1;
        }
        dof += cells.saturating_sub(1);
    }
    (chi2, dof)
}

/// Seeded sampling through the drafter on the tiny model: the tokens the
/// first verification gives (a kept or replaced draft, then a bonus draw
/// or the next round's) are distributed as the target's own sampling, each
/// given the tokens before it, over 600 seeds: Pearson's statistic under
/// its degrees of freedom plus 6 standard deviations.
#[test]
fn cpu_speculative_sampling_keeps_the_targets_distribution() {
    use std::collections::BTreeMap;
    let model = target(CpuBackend::new());
    let drafter = Drafter::load(&model, &fixture(DRAFTERS[0])).unwrap();
    let prompt = [44, 45, 46, 200, 201, 13, 380];
    let sampling = |seed| Sampling::Random {
        temperature: 1.0,
        top_k: Some(8),
        top_p: None,
        min_p: None,
        repetition_penalty: None,
        seed,
    };
    let opts = |seed| GenerateOptions {
        max_new_tokens: 3,
        sampling: sampling(seed),
        stop_at_eos: false,
    };
    let spec = SpeculativeOptions {
        draft_tokens: 2,
        forced: None,
    };
    let (mut drafted, mut accepted) = (0, 0);
    let mut counts: [BTreeMap<Vec<u32>, Vec<usize>>; 2] = Default::default();
    for seed in 0..600 {
        let (t, stats) = speculate(&model, &drafter, &prompt, &opts(seed), &spec);
        drafted += stats.drafted;
        accepted += stats.accepted;
        for i in 1..3 {
            counts[i - 1]
                .entry(t[..i].to_vec())
                .or_insert_with(|| vec![0; 512])[t[i] as usize] += 1;
        }
    }
    assert!(
        accepted > 50 && accepted < drafted,
        "{accepted} of {drafted} kept"
    );
    let mut exact = Sampler::new(&sampling(0)).unwrap();
    for (i, c) in counts.iter().enumerate() {
        let want: BTreeMap<Vec<u32>, Vec<f32>> = c
            .keys()
            .map(|cond| {
                let mut seq = model.new_sequence().unwrap();
                let tokens: Vec<u32> = prompt.iter().chain(cond).copied().collect();
                let rows = model.logits(&mut seq, &tokens).unwrap();
                let p = exact.distribution(rows.last().unwrap(), &[]).unwrap();
                (cond.clone(), p)
            })
            .collect();
        let (chi2, dof) = chi_square(c, &want);
        let bound = dof as f64 + 6.0 * (2.0 * dof as f64).sqrt();
        eprintln!(
            "new token {}: chi-square {chi2:.1} on {dof} degrees of freedom (bound {bound:.1})",
            i + 1
        );
        assert!(
            dof > 3 && chi2 < bound,
            "new token {}: chi-square {chi2:.1}, bound {bound:.1}",
            i + 1
        );
    }
}

/// A drafter that does not fit its target, or is not whole, is refused
/// with what does not fit.
#[test]
fn a_drafter_that_does_not_fit_is_named() {
    let model = target(CpuBackend::new());
    let edit = |from: &str, to: &str| -> String {
        let dir = TempDir::copy_of(&fixture(DRAFTERS[1]), "drafter");
        let path = dir.path().join("config.json");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(from), "{from}");
        std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
        match Drafter::load(&model, dir.path()) {
            Ok(_) => panic!("{to}: loaded"),
            Err(e) => e.to_string(),
        }
    };
    let cases = [
        (
            "\"backbone_hidden_size\": 64",
            "\"backbone_hidden_size\": 32",
            "backbone_hidden_size 32",
        ),
        (
            "\"vocab_size\": 512",
            "\"vocab_size\": 1024",
            "vocabulary 1024",
        ),
        (
            "\"model_type\": \"gemma4_assistant\"",
            "\"model_type\": \"gemma4\"",
            "gemma4_assistant",
        ),
        (
            "\"sliding_window\": 4",
            "\"sliding_window\": 8",
            "sliding_window 8",
        ),
        (
            "\"num_centroids\": 16",
            "\"num_centroids\": 15",
            "num_centroids",
        ),
        ("\"head_dim\": 64", "\"head_dim\": 32", "KV heads"),
    ];
    for (from, to, want) in cases {
        let e = edit(from, to);
        assert!(e.contains(want), "{to}: {e}");
    }
    let dir = TempDir::copy_of(&fixture(DRAFTERS[0]), "drafter");
    let weights = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&weights).unwrap();
    std::fs::write(&weights, &bytes[..bytes.len() / 2]).unwrap();
    let e = Drafter::load(&model, dir.path()).err().unwrap().to_string();
    assert!(e.contains("not a safetensors file"), "{e}");
    std::fs::remove_file(&weights).unwrap();
    let e = Drafter::load(&model, dir.path()).err().unwrap().to_string();
    assert!(e.contains("model.safetensors"), "{e}");
    // A third layer the weights lack: named.
    let dir3 = TempDir::copy_of(&fixture(DRAFTERS[0]), "drafter");
    let path = dir3.path().join("config.json");
    let mut cfg: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    cfg["text_config"]["num_hidden_layers"] = 3.into();
    cfg["text_config"]["layer_types"] =
        serde_json::json!(["sliding_attention", "full_attention", "full_attention"]);
    cfg["text_config"]["num_kv_shared_layers"] = 3.into();
    cfg["text_config"]["per_layer_config"] = serde_json::json!({"1": {"head_dim": 64, "num_key_value_heads": 1},
                           "2": {"head_dim": 64, "num_key_value_heads": 1}});
    std::fs::write(&path, cfg.to_string()).unwrap();
    let e = Drafter::load(&model, dir3.path())
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("model.layers.2.") && e.contains("missing"),
        "{e}"
    );
    std::fs::write(dir.path().join("config.json"), "{ not json").unwrap();
    let e = Drafter::load(&model, dir.path()).err().unwrap().to_string();
    assert!(e.contains("config.json"), "{e}");
    let k = SpeculativeOptions {
        draft_tokens: 0,
        forced: None,
    };
    let drafter = Drafter::load(&model, &fixture(DRAFTERS[0])).unwrap();
    let mut seq = model.new_sequence().unwrap();
    let e = drafter
        .generate(&model, &mut seq, &[5], &greedy(4), &k, |_| {
            ControlFlow::Continue(())
        })
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("1 to 15"), "{e}");
    let k = SpeculativeOptions {
        draft_tokens: usize::MAX,
        forced: None,
    };
    let e = drafter
        .generate(&model, &mut seq, &[5], &greedy(4), &k, |_| {
            ControlFlow::Continue(())
        })
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("1 to 15"), "{e}");
}

/// One tensor of a drafter written by a test.
struct Written {
    name: String,
    dtype: safetensors::Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

fn write_checkpoint(dir: &std::path::Path, config: &Value, tensors: &[Written]) {
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|t| {
            let view =
                safetensors::tensor::TensorView::new(t.dtype, t.shape.clone(), &t.data).unwrap();
            (t.name.clone(), view)
        })
        .collect();
    let bytes = safetensors::serialize(views, None).unwrap();
    std::fs::write(dir.join("model.safetensors"), bytes).unwrap();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
}

/// A drafter for tiny-text 64 wide (so a group of 32 divides every matrix),
/// written twice from the same seeded random values: MLX-quantized as
/// `quantization` says (bf16 scales and biases, packed by
/// `turbospark::quant::quantize`, which tests/mlx_quantize.rs holds to mlx's
/// own bit for bit), and in f32 holding exactly the values the quantized
/// one dequantises to (`scale * q + bias`, each rounded to f32), its
/// float-kept modules the same bf16 values in both.
fn quantized_drafter_pair(quantization: Value, seed: u64) -> (TempDir, TempDir) {
    use turbospark::quant::{quantize, Affine, ScaleType};
    let text = std::fs::read_to_string(fixture(DRAFTERS[1]).join("config.json")).unwrap();
    let mut cfg: Value = serde_json::from_str(&text).unwrap();
    let (h, bh, inter, vocab, centroids) = (64, 64, 128, 512, 16);
    cfg["text_config"]["hidden_size"] = h.into();
    cfg["text_config"]["intermediate_size"] = inter.into();
    // (the fixture's layers: sliding 2 heads of 32, full 2 of 64)
    let head_dims = [32, 64];
    let mut matrices = vec![
        ("pre_projection".to_string(), h, 2 * bh),
        ("post_projection".to_string(), bh, h),
        ("model.embed_tokens".to_string(), vocab, h),
        ("masked_embedding.centroids".to_string(), centroids, h),
    ];
    let mut vectors = vec![("model.norm.weight".to_string(), h)];
    for (i, hd) in head_dims.into_iter().enumerate() {
        let p = format!("model.layers.{i}.");
        let qd = 2 * hd;
        for (n, r, c) in [
            ("self_attn.q_proj", qd, h),
            ("self_attn.o_proj", h, qd),
            ("mlp.gate_proj", inter, h),
            ("mlp.up_proj", inter, h),
            ("mlp.down_proj", h, inter),
        ] {
            matrices.push((format!("{p}{n}"), r, c));
        }
        for (n, len) in [
            ("input_layernorm.weight", h),
            ("self_attn.q_norm.weight", hd),
            ("post_attention_layernorm.weight", h),
            ("pre_feedforward_layernorm.weight", h),
            ("post_feedforward_layernorm.weight", h),
            ("layer_scalar", 1),
        ] {
            vectors.push((format!("{p}{n}"), len));
        }
    }
    let bf16 = |x: f32| half::bf16::from_f32(x);
    let f32_bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let bf16_bytes = |v: &[f32]| {
        v.iter()
            .flat_map(|&x| bf16(x).to_le_bytes())
            .collect::<Vec<u8>>()
    };
    let params = |path: &str| -> Option<(u8, usize)> {
        match &quantization[path] {
            Value::Bool(false) => None,
            Value::Object(m) => Some((
                m["bits"].as_u64().unwrap() as u8,
                m["group_size"].as_u64().unwrap() as usize,
            )),
            _ => Some((
                quantization["bits"].as_u64().unwrap() as u8,
                quantization["group_size"].as_u64().unwrap() as usize,
            )),
        }
    };
    let mut rng = turbospark::rng::Rng::new(seed);
    let (mut q, mut f) = (Vec::new(), Vec::new());
    let add = |list: &mut Vec<Written>, name: String, dtype, shape: Vec<usize>, data| {
        list.push(Written {
            name,
            dtype,
            shape,
            data,
        })
    };
    for (path, rows, cols) in matrices {
        let v: Vec<f32> = rng
            .vec_normal(rows * cols, 0.08)
            .into_iter()
            .map(|x| bf16(x).to_f32())
            .collect();
        let name = format!("{path}.weight");
        let Some((bits, group)) = params(&path) else {
            add(
                &mut q,
                name.clone(),
                safetensors::Dtype::BF16,
                vec![rows, cols],
                bf16_bytes(&v),
            );
            add(
                &mut f,
                name,
                safetensors::Dtype::F32,
                vec![rows, cols],
                f32_bytes(&v),
            );
            continue;
        };
        let qz = quantize(&v, bits, group);
        let (words, scales, biases) = (
            bytemuck::cast_slice::<u32, u8>(&qz.words).to_vec(),
            bf16_bytes(&qz.scales),
            bf16_bytes(&qz.biases),
        );
        let a = Affine::new(bits as u32, group as u32, ScaleType::BF16).unwrap();
        let n = rows * cols;
        let buf = a.assemble(n, &words, &scales, &biases);
        let deq: Vec<f32> = (0..n).map(|i| a.get(&buf, n, i)).collect();
        let wcols = cols * bits as usize / 32;
        add(
            &mut q,
            name.clone(),
            safetensors::Dtype::U32,
            vec![rows, wcols],
            words,
        );
        for (part, bytes) in [("scales", scales), ("biases", biases)] {
            let shape = vec![rows, cols / group];
            add(
                &mut q,
                format!("{path}.{part}"),
                safetensors::Dtype::BF16,
                shape,
                bytes,
            );
        }
        add(
            &mut f,
            name,
            safetensors::Dtype::F32,
            vec![rows, cols],
            f32_bytes(&deq),
        );
    }
    for (name, len) in vectors {
        let v: Vec<f32> = (0..len)
            .map(|_| bf16(1.0 + rng.normal(0.1)).to_f32())
            .collect();
        add(
            &mut q,
            name.clone(),
            safetensors::Dtype::BF16,
            vec![len],
            bf16_bytes(&v),
        );
        add(
            &mut f,
            name,
            safetensors::Dtype::F32,
            vec![len],
            f32_bytes(&v),
        );
    }
    let mut order: Vec<i64> = (0..vocab as i64).collect();
    for i in (1..vocab).rev() {
        order.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let order: Vec<u8> = order.iter().flat_map(|x| x.to_le_bytes()).collect();
    for list in [&mut q, &mut f] {
        let name = "masked_embedding.token_ordering".to_string();
        add(
            list,
            name,
            safetensors::Dtype::I64,
            vec![vocab],
            order.clone(),
        );
    }
    let (qdir, fdir) = (TempDir::new("drafter-q"), TempDir::new("drafter-f"));
    write_checkpoint(fdir.path(), &cfg, &f);
    cfg["quantization"] = quantization;
    write_checkpoint(qdir.path(), &cfg, &q);
    (qdir, fdir)
}

/// An MLX-quantized drafter (per-module entries included: modules kept in
/// float, pre_projection at its own bits and group, once in groups its
/// halves' edge does not cut and once in groups it does) drafts what its
/// dequantised f32 twin drafts: logits and projected states to the f32
/// floor, the same tokens; and speculation with it keeps the target's
/// greedy tokens.
fn quantized_drafter<B: ComputeBackend>(be: B, limit: f64) {
    let model = target(be);
    let prompt = [17, 301, 88, 5, 412, 230, 77, 150, 9, 499];
    let p = prompt.len() - 1;
    let mut seq = model.new_sequence().unwrap();
    model.logits(&mut seq, &prompt[..p]).unwrap();
    for (case, pre) in [(0, (8, 64)), (1, (4, 128))] {
        let quantization = serde_json::json!({
            "bits": 4,
            "group_size": 32,
            "model.layers.0.self_attn.q_proj": false,
            // (mlx-lm's predicate for this model keeps the centroids float)
            "masked_embedding.centroids": false,
            "pre_projection": {"bits": pre.0, "group_size": pre.1},
        });
        let (qdir, fdir) = quantized_drafter_pair(quantization, 90 + case);
        let quant = Drafter::load(&model, qdir.path()).unwrap();
        let float = Drafter::load(&model, fdir.path()).unwrap();
        let mut input = DraftInput::Target { m: p, row: p - 1 };
        let mut tok = prompt[p];
        for step in 0..3 {
            let got = quant.step(&model, &seq, p, tok, input).unwrap();
            let got_h = quant.projected(model.backend()).unwrap();
            let want = float.step(&model, &seq, p, tok, input).unwrap();
            let want_h = float.projected(model.backend()).unwrap();
            let (el, eh) = (nmse(&got, &want), nmse(&got_h, &want_h));
            eprintln!("pre_projection {pre:?}, step {step}: logits NMSE {el:.2e}, hidden {eh:.2e}");
            assert!(
                el <= limit && eh <= limit,
                "pre_projection {pre:?}, step {step}: {el:.2e} / {eh:.2e} over {limit:.0e}"
            );
            tok = turbospark::model::sampling::argmax(&got);
            assert_eq!(
                tok,
                turbospark::model::sampling::argmax(&want),
                "step {step}"
            );
            input = DraftInput::Previous;
        }
        let n = 12;
        let plain = model
            .generate(&mut model.new_sequence().unwrap(), &prompt, &greedy(n))
            .unwrap()
            .tokens;
        let spec = SpeculativeOptions {
            draft_tokens: 3,
            forced: None,
        };
        let (tokens, _) = speculate(&model, &quant, &prompt, &greedy(n), &spec);
        assert_eq!(tokens, plain, "pre_projection {pre:?}: the target's tokens");
    }
}

#[test]
fn cpu_quantized_drafter_is_its_dequantised_twin() {
    // The reference dequantises to the f32 its twin holds and sums alike.
    quantized_drafter(CpuBackend::new(), 0.0);
}

#[test]
fn wgpu_quantized_drafter_is_its_dequantised_twin() {
    // The quantized and f32 GEMVs sum in orders of their own (a few ulp a
    // value, 7e-13 at most over these steps on lavapipe).
    if let Some(be) = wgpu_backend() {
        quantized_drafter(be, 1e-11);
    }
}

/// A quantized drafter whose config or parts do not agree is refused
/// with the module named.
#[test]
fn a_quantized_drafter_that_does_not_agree_is_named() {
    let model = target(CpuBackend::new());
    let quantization = serde_json::json!({"bits": 4, "group_size": 32});
    let (qdir, _f) = quantized_drafter_pair(quantization, 7);
    let cfg_path = qdir.path().join("config.json");
    let cfg: Value = serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    let load_with = |edit: &dyn Fn(&mut Value)| -> String {
        let mut c = cfg.clone();
        edit(&mut c);
        std::fs::write(&cfg_path, c.to_string()).unwrap();
        match Drafter::load(&model, qdir.path()) {
            Ok(_) => panic!("loaded"),
            Err(e) => e.to_string(),
        }
    };
    let e = load_with(&|c| {
        c.as_object_mut().unwrap().remove("quantization");
    });
    assert!(e.contains("no `quantization`"), "{e}");
    let e = load_with(&|c| c["quantization"]["bits"] = 8.into());
    assert!(e.contains("do not fit 8 bits"), "{e}");
    let e = load_with(&|c| c["quantization"]["model.layers.1.mlp.down_proj"] = false.into());
    assert!(
        e.contains("model.layers.1.mlp.down_proj") && e.contains("keeps it in float"),
        "{e}"
    );
    let e = load_with(&|c| c["quantization"]["bits"] = 7.into());
    assert!(e.contains("bits"), "{e}");
}

/// Speculation on a model whose experts stream through slots: a
/// verification pass is a micro-batch (its rows' union of experts through
/// the slots, or a full-layer stack past them), so with proposals forced
/// right (every round verifies k + 1 rows) and with the fixture's drafter,
/// the tokens are the resident model's plain greedy tokens, for every k.
fn streamed_speculation<B: ComputeBackend>(be: impl Fn() -> B, slots: &[usize], ks: &[usize]) {
    let ckpt = Checkpoint::open(&fixture("tiny-text")).unwrap();
    let load = |slots: Option<usize>| {
        let opts = ModelOptions {
            max_context: 64,
            expert_slots: slots,
            ..Default::default()
        };
        Model::load(be(), &ckpt, opts).unwrap()
    };
    let resident = load(None);
    let prompt = [17, 301, 88, 5, 412, 230, 77, 150, 9, 499];
    let n = 16;
    let plain = resident
        .generate(&mut resident.new_sequence().unwrap(), &prompt, &greedy(n))
        .unwrap()
        .tokens;
    for &s in slots {
        let model = load(Some(s));
        let drafter = Drafter::load(&model, &fixture(DRAFTERS[1])).unwrap();
        for &k in ks {
            for forced in [Some(plain.clone()), None] {
                let spec = SpeculativeOptions {
                    draft_tokens: k,
                    forced: forced.clone(),
                };
                let (tokens, stats) = speculate(&model, &drafter, &prompt, &greedy(n), &spec);
                let what = format!("{s} slots, k {k}, forced {}", forced.is_some());
                assert_eq!(tokens, plain, "{what}: not the resident model's tokens");
                if forced.is_some() {
                    assert_eq!(stats.accepted, stats.drafted, "{what}: every draft kept");
                }
            }
        }
    }
}

#[test]
fn cpu_speculation_through_streamed_experts_is_the_resident_greedy() {
    streamed_speculation(CpuBackend::new, &[2, 5], &[1, 2, 4]);
}

#[test]
fn wgpu_speculation_through_streamed_experts_is_the_resident_greedy() {
    if wgpu_backend().is_some() {
        streamed_speculation(|| wgpu_backend().unwrap(), &[2], &[4]);
    }
}
