//! The oracle: transformers' logits and greedy continuation for the tiny
//! fixture checkpoints in `tests/fixtures/` (made by `scripts/`), reproduced
//! through `Checkpoint` on each backend.
//!
//! Written once, generic over the backend; each backend is one `#[test]` line.

mod common;

use std::path::{Path, PathBuf};

use common::nmse;
use turbospark::model::{Checkpoint, GenerateOptions, Model, ModelOptions, Sampling};
use turbospark::ComputeBackend;
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
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
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

fn oracle<B: ComputeBackend>(backend: B, name: &str) {
    let dir = fixture(name);
    let want = expected(&dir);
    let ck = Checkpoint::open(&dir).unwrap();
    let mut model = Model::load(
        backend,
        &ck,
        ModelOptions {
            max_context: 64,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(model.config().vocab, want.vocab);

    // Teacher-forced logits, every position: the layers in one prefill
    // batch (on a GPU the prefill GEMM and attn_prefill; on tensor cores
    // they round x to f16, what gemm_rounding_nmse allows), the head in
    // slices of LOGITS_BATCH rows.
    let rows = model.logits(&want.tokens).unwrap();
    let limit = ORACLE_NMSE + model.gemm_rounding_nmse(want.tokens.len());
    let mut worst = 0f64;
    for (i, row) in rows.iter().enumerate() {
        let e = nmse(row, &want.logits[i * want.vocab..(i + 1) * want.vocab]);
        worst = worst.max(e);
        assert!(e < limit, "{name}: row {i} NMSE {e:e} over {limit:e}");
    }
    eprintln!(
        "{name} on {}: worst logits NMSE vs transformers {worst:e}",
        model.backend().info().device_name
    );

    // Token-by-token decode agrees with the batched rows.
    model.reset();
    for (i, &t) in want.tokens.iter().enumerate() {
        let row = model.logits(&[t]).unwrap().remove(0);
        let e = nmse(&row, &rows[i]);
        assert!(e < limit, "{name}: token-by-token row {i} NMSE {e:e}");
    }

    // One prefill batch of all but the last token (17 of them: on a GPU the
    // prefill GEMM and attn_prefill), then the last token's row.
    model.reset();
    let n = want.tokens.len();
    assert!(
        n > turbospark_wgpu::PREFILL_MIN_M,
        "{name}: the fixture is too short for a prefill GEMM batch"
    );
    let prefill_only = GenerateOptions {
        max_new_tokens: 0,
        ..Default::default()
    };
    model
        .generate(&want.tokens[..n - 1], &prefill_only)
        .unwrap();
    let last = model.logits(&want.tokens[n - 1..]).unwrap().remove(0);
    let e = nmse(&last, &want.logits[(n - 1) * want.vocab..]);
    // On tensor cores the batch's GEMMs round x to f16 (on the H200 1.8e-6
    // against 4.8e-6 for these fixtures, BENCHMARKS.md).
    let limit = ORACLE_NMSE + model.gemm_rounding_nmse(n - 1);
    eprintln!("{name}: last row after one prefill batch: NMSE {e:e} (limit {limit:e})");
    assert!(
        e < limit,
        "{name}: last row after one prefill batch: NMSE {e:e} over {limit:e}"
    );

    // The greedy continuation, token for token.
    model.reset();
    let p = want.prompt_len;
    let g = model
        .generate(
            &want.tokens[..p],
            &GenerateOptions {
                max_new_tokens: want.tokens.len() - p,
                sampling: Sampling::Greedy,
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(g.tokens, want.tokens[p..], "{name}: greedy continuation");
}

#[test]
fn cpu_tiny_text() {
    oracle(CpuBackend::new(), "tiny-text");
}

#[test]
fn cpu_tiny_multimodal() {
    oracle(CpuBackend::new(), "tiny-multimodal");
}

#[test]
fn wgpu_tiny_text() {
    if let Some(b) = common::wgpu_backend() {
        oracle(b, "tiny-text");
    }
}

#[test]
fn wgpu_tiny_multimodal() {
    if let Some(b) = common::wgpu_backend() {
        oracle(b, "tiny-multimodal");
    }
}
