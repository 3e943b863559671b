//! The oracle: transformers' logits and greedy continuation for the tiny
//! fixture checkpoints in `tests/fixtures/` (made by `scripts/`), reproduced
//! through `Checkpoint` on each backend.
//!
//! Written once, generic over the backend; each backend is one `#[test]` line.

mod common;
#[path = "common/primitives_only.rs"]
mod primitives_only;

use std::path::{Path, PathBuf};

use common::nmse;
use primitives_only::PrimitivesOnly;
use turbospark::model::{Checkpoint, GenerateOptions, ModelOptions, OneSequence, Sampling};
use turbospark::{ComputeBackend, DType, Precision};
use turbospark_cpu::CpuBackend;

/// Limit on the NMSE of each logits row against transformers (float32,
/// eager attention, the same bf16-rounded weights). Both sides compute in
/// f32 from identical inputs; they differ only in summation order and in
/// exp/tanh implementations, a few ulp (~1e-7 relative) per op, compounded
/// over 4 layers and a softcap: an NMSE around 1e-12..1e-10. 1e-8 leaves two
/// orders of magnitude for GPU reduction orders while still catching any real
/// bug (a wrong norm, RoPE pair or routing choice gives NMSE > 1e-3).
const ORACLE_NMSE: f64 = 1e-8;

fn fixture(name: &str) -> PathBuf {
    common::repo_root().join("tests/fixtures").join(name)
}

struct Expected {
    prompt_len: usize,
    tokens: Vec<u32>,
    /// `[N, vocab]` row-major.
    logits: Vec<f32>,
    vocab: usize,
}

fn expected(dir: &Path) -> Expected {
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let prompt_len = j["prompt_len"].as_u64().unwrap() as usize;
    let tokens: Vec<u32> = j["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect();
    let bytes = std::fs::read(dir.join("logits.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor("logits").unwrap();
    assert_eq!(t.dtype(), safetensors::Dtype::F32);
    assert_eq!(t.shape()[0], tokens.len());
    let logits: Vec<f32> = t
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    Expected {
        prompt_len,
        tokens,
        logits,
        vocab: t.shape()[1],
    }
}

fn load<B: ComputeBackend>(
    backend: B,
    ck: &Checkpoint,
    kv_cache: DType,
    precision: Precision,
) -> OneSequence<B> {
    OneSequence::load(
        backend,
        ck,
        ModelOptions {
            max_context: 128,
            kv_cache,
            precision,
            ..Default::default()
        },
    )
    .unwrap()
}

/// What the backend under test must reproduce: the fixture's own figures
/// (transformers) at [`ORACLE_NMSE`] (at `Precision::Exact` on every
/// backend: its split products sit at the f32 floor), or, on a backend
/// that runs some GEMMs from f16-rounded inputs at `Precision::Fast`, the
/// CPU reference rounding the same ones (`common::reference_for`). Two computations that round alike still
/// differ by more than f32 reduction order: a rounding flips wherever their
/// inputs straddle a rounding boundary, and the flips compound over the
/// layers (on the H200, 1e-7 to 1.5e-6 for these fixtures): each such row
/// may sit from the reference by `common::rounding_allowance` of the NMSE
/// the rounding puts between the reference and transformers (the row's
/// allowance), on top of [`ORACLE_NMSE`]. A wrong op moves a row by more
/// than 1e-3. The plain CPU reference is held to transformers by the
/// `cpu_*` tests.
struct Truth {
    want: Expected,
    reference: Option<OneSequence<CpuBackend>>,
}

/// A row to reproduce and its allowance past [`ORACLE_NMSE`].
type Row = (Vec<f32>, f64);

impl Truth {
    /// Transformers' row at `pos`.
    fn want(&self, pos: usize) -> &[f32] {
        let v = self.want.vocab;
        &self.want.logits[pos * v..(pos + 1) * v]
    }

    /// The reference's rows for positions `pos0..` against transformers'.
    fn with_allowance(&self, pos0: usize, rows: Vec<Vec<f32>>) -> Vec<Row> {
        rows.into_iter()
            .enumerate()
            .map(|(i, r)| {
                let spread = nmse(&r, self.want(pos0 + i));
                let what = format!("row {}", pos0 + i);
                (r, common::rounding_allowance(spread, &what))
            })
            .collect()
    }

    /// Teacher-forced rows of `tokens` from position 0.
    fn rows(&mut self, tokens: &[u32]) -> Vec<Row> {
        let rows = match &mut self.reference {
            Some(r) => {
                r.reset();
                r.logits(tokens).unwrap()
            }
            None => {
                return (0..tokens.len())
                    .map(|i| (self.want(i).to_vec(), 0.0))
                    .collect()
            }
        };
        self.with_allowance(0, rows)
    }

    /// Token-by-token rows of `tokens` from position 0.
    fn single_rows(&mut self, tokens: &[u32]) -> Vec<Row> {
        let rows = match &mut self.reference {
            Some(r) => {
                r.reset();
                tokens
                    .iter()
                    .map(|&t| r.logits(&[t]).unwrap().remove(0))
                    .collect()
            }
            None => return self.rows(tokens),
        };
        self.with_allowance(0, rows)
    }

    /// The last token's row after one prefill batch of the others.
    fn row_after_prefill(&mut self, tokens: &[u32]) -> Row {
        let n = tokens.len();
        let row = match &mut self.reference {
            Some(r) => last_after_prefill(r, tokens),
            None => return (self.want(n - 1).to_vec(), 0.0),
        };
        self.with_allowance(n - 1, vec![row]).remove(0)
    }

    /// The greedy continuation of the prompt.
    fn continuation(&mut self) -> Vec<u32> {
        let (p, n) = (self.want.prompt_len, self.want.tokens.len());
        match &mut self.reference {
            Some(r) => greedy(r, &self.want.tokens[..p], n - p),
            None => self.want.tokens[p..].to_vec(),
        }
    }
}

fn last_after_prefill<B: ComputeBackend>(model: &mut OneSequence<B>, tokens: &[u32]) -> Vec<f32> {
    let n = tokens.len();
    model.reset();
    let prefill_only = GenerateOptions {
        max_new_tokens: 0,
        ..Default::default()
    };
    model.generate(&tokens[..n - 1], &prefill_only).unwrap();
    model.logits(&tokens[n - 1..]).unwrap().remove(0)
}

fn greedy<B: ComputeBackend>(model: &mut OneSequence<B>, prompt: &[u32], n: usize) -> Vec<u32> {
    model.reset();
    let opts = GenerateOptions {
        max_new_tokens: n,
        sampling: Sampling::Greedy,
        ..Default::default()
    };
    model.generate(prompt, &opts).unwrap().tokens
}

/// Each row against its truth, within [`ORACLE_NMSE`] and the row's
/// allowance; the worst NMSE.
fn check_rows(name: &str, what: &str, got: &[Vec<f32>], truth: &[Row]) -> f64 {
    assert_eq!(got.len(), truth.len(), "{name}: {what}: row count");
    let mut worst = 0f64;
    for (i, (g, (t, allowance))) in got.iter().zip(truth).enumerate() {
        let e = nmse(g, t);
        let limit = ORACLE_NMSE + allowance;
        assert!(
            e < limit,
            "{name}: {what}: row {i} NMSE {e:e} over {limit:e} (allowance {allowance:e})"
        );
        worst = worst.max(e);
    }
    worst
}

/// The fixture `name` reproduced by `backend` with KV caches of
/// `kv_cache`. f16 caches round every key and value, so their truth is the
/// CPU reference with f16 caches (rounding its GEMM inputs as `backend`
/// does), each row with the allowance that rounding sets
/// (`common::rounding_allowance`: the reference itself within 1e-4 of
/// transformers); on the CPU reference that is itself, so its f16 test
/// checks that bound.
fn oracle<B: ComputeBackend>(backend: B, name: &str, kv_cache: DType) {
    oracle_at(backend, name, kv_cache, Precision::Exact)
}

/// [`oracle`] at `precision`: held to transformers where the backend calls
/// it exact ([`ComputeBackend::is_exact`]), else to the CPU reference
/// rounding alike.
fn oracle_at<B: ComputeBackend>(backend: B, name: &str, kv_cache: DType, precision: Precision) {
    let dir = fixture(name);
    let ck = Checkpoint::open(&dir).unwrap();
    let rounding = if backend.is_exact(precision) {
        None
    } else {
        common::reference_for(&backend)
    };
    let reference = match rounding {
        Some(cpu) => Some(cpu),
        None => (kv_cache != DType::F32).then(|| {
            // (f16 caches: the reference with f16 caches, rounding its
            // GEMM inputs as the backend does at this precision)
            common::reference_for(&backend).unwrap_or_default()
        }),
    }
    .map(|cpu| load(cpu, &ck, kv_cache, precision));
    let mut truth = Truth {
        want: expected(&dir),
        reference,
    };
    let mut model = load(backend, &ck, kv_cache, precision);
    assert_eq!(model.config().vocab, truth.want.vocab);
    let tokens = truth.want.tokens.clone();
    let n = tokens.len();
    let device = model.backend().info().device_name.clone();

    // Teacher-forced logits, every position: the layers in one prefill
    // batch (on a GPU the prefill GEMM and attn_prefill), the head in
    // slices of LOGITS_BATCH rows.
    let rows = model.logits(&tokens).unwrap();
    let worst = check_rows(name, "teacher-forced rows", &rows, &truth.rows(&tokens));
    let against = if truth.reference.is_some() {
        "the CPU reference rounding alike"
    } else {
        "the fixture's reference (transformers, or mlx-lm for a quantized one)"
    };
    eprintln!("{name} on {device}: worst logits NMSE vs {against} {worst:e}");
    if truth.reference.is_some() {
        let cost = (0..n)
            .map(|i| nmse(&rows[i], truth.want(i)))
            .fold(0f64, f64::max);
        eprintln!("{name}: rounded as the backend rounds, worst row NMSE vs transformers {cost:e}");
    }

    // Token-by-token decode.
    model.reset();
    let single: Vec<Vec<f32>> = tokens
        .iter()
        .map(|&t| model.logits(&[t]).unwrap().remove(0))
        .collect();
    check_rows(
        name,
        "token-by-token rows",
        &single,
        &truth.single_rows(&tokens),
    );

    // One prefill batch of all but the last token (on a GPU the prefill
    // GEMM and attn_prefill), then the last token's row.
    assert!(
        n > turbospark_wgpu::PREFILL_MIN_M,
        "{name}: the fixture is too short for a prefill GEMM batch"
    );
    let last = last_after_prefill(&mut model, &tokens);
    let want = truth.row_after_prefill(&tokens);
    let e = check_rows(name, "last row after one prefill batch", &[last], &[want]);
    eprintln!("{name}: last row after one prefill batch: NMSE {e:e}");

    // The greedy continuation, token for token.
    let p = truth.want.prompt_len;
    let g = greedy(&mut model, &tokens[..p], n - p);
    assert_eq!(g, truth.continuation(), "{name}: greedy continuation");
}

#[test]
fn cpu_tiny_text() {
    oracle(CpuBackend::new(), "tiny-text", DType::F32);
}

#[test]
fn cpu_tiny_multimodal() {
    oracle(CpuBackend::new(), "tiny-multimodal", DType::F32);
}

#[test]
fn wgpu_tiny_text() {
    if let Some(b) = common::wgpu_backend() {
        oracle(b, "tiny-text", DType::F32);
    }
}

#[test]
fn wgpu_tiny_multimodal() {
    if let Some(b) = common::wgpu_backend() {
        oracle(b, "tiny-multimodal", DType::F32);
    }
}

// The wide fixture (scripts/make_wide_fixture.py: hidden 256, top-4 of 16
// experts, head_dim 256 sliding / 512 full, window 32, 100 tokens), whose
// router has near-ties that a single f16 rounding of the activations
// flips: at the default precision every backend reproduces transformers
// to the f32 floor and its greedy tokens.
#[test]
fn cpu_wide_text() {
    oracle(CpuBackend::new(), "wide-text", DType::F32);
}

#[test]
fn wgpu_wide_text() {
    if let Some(b) = common::wgpu_backend() {
        oracle(b, "wide-text", DType::F32);
    }
}

// `Precision::Fast`: on tensor cores held to the CPU reference rounding
// alike (on devices without them it computes in f32 and is held to
// transformers, as exact is).
#[test]
fn wgpu_tiny_text_fast() {
    if let Some(b) = common::wgpu_backend() {
        oracle_at(b, "tiny-text", DType::F32, Precision::Fast);
    }
}

// f16 KV caches (`ModelOptions::kv_cache`), on one fixture: both layer
// kinds and every cache op run in it.
#[test]
fn cpu_tiny_text_f16_caches() {
    oracle(CpuBackend::new(), "tiny-text", DType::F16);
}

#[test]
fn wgpu_tiny_text_f16_caches() {
    if let Some(b) = common::wgpu_backend() {
        // An adapter without shader-f16 (llvmpipe's GL one) fails here with
        // the backend's reason, not at an unwrap inside the load.
        let kind = turbospark::ops::OpKind::KvCache { dtype: DType::F16 };
        if let turbospark::Support::No(reason) = b.supports(&kind) {
            panic!(
                "{} cannot hold f16 KV caches: {reason}",
                b.info().device_name
            );
        }
        oracle(b, "tiny-text", DType::F16);
    }
}

// A backend with only the primitive ops, every fused op by its default
// body: the fixtures to transformers' logits, and to the CPU reference's
// own, bit for bit (the defaults are the reference's fused arithmetic,
// step for step).
fn primitives_only(name: &str) {
    oracle(PrimitivesOnly::new(), name, DType::F32);
    let ck = Checkpoint::open(&fixture(name)).unwrap();
    let tokens = expected(&fixture(name)).tokens;
    let mut fused = load(CpuBackend::new(), &ck, DType::F32, Precision::Exact);
    let mut prims = load(PrimitivesOnly::new(), &ck, DType::F32, Precision::Exact);
    assert_eq!(
        prims.logits(&tokens).unwrap(),
        fused.logits(&tokens).unwrap(),
        "{name}: primitives-only teacher-forced logits against the CPU reference's"
    );
    fused.reset();
    prims.reset();
    for (i, &t) in tokens.iter().enumerate() {
        assert_eq!(
            prims.logits(&[t]).unwrap(),
            fused.logits(&[t]).unwrap(),
            "{name}: primitives-only decode row {i} against the CPU reference's"
        );
    }
}

#[test]
fn primitives_only_tiny_text() {
    primitives_only("tiny-text");
}

#[test]
fn primitives_only_tiny_multimodal() {
    primitives_only("tiny-multimodal");
}

// MLX-quantized checkpoints made by mlx-lm (scripts/make_quant_fixtures.py),
// against mlx-lm's own float32 logits and greedy tokens.
#[test]
fn cpu_tiny_text_q4() {
    oracle(CpuBackend::new(), "tiny-text-q4", DType::F32);
}

#[test]
fn cpu_tiny_text_q8() {
    oracle(CpuBackend::new(), "tiny-text-q8", DType::F32);
}

#[test]
fn cpu_tiny_multimodal_mixed() {
    oracle(CpuBackend::new(), "tiny-multimodal-mixed", DType::F32);
}

#[test]
fn wgpu_tiny_text_q4() {
    if let Some(b) = common::wgpu_backend() {
        oracle(b, "tiny-text-q4", DType::F32);
    }
}

#[test]
fn wgpu_tiny_text_q8() {
    if let Some(b) = common::wgpu_backend() {
        oracle(b, "tiny-text-q8", DType::F32);
    }
}

#[test]
fn wgpu_tiny_multimodal_mixed() {
    if let Some(b) = common::wgpu_backend() {
        oracle(b, "tiny-multimodal-mixed", DType::F32);
    }
}
