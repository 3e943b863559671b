//! A prompt prefilled in batches and the same prompt decoded token by token
//! give the same rows (to the f32 floor) and the same greedy tokens on one
//! backend, at every precision the backend calls exact
//! (`ComputeBackend::is_exact`): the prefill's tensor-core products must
//! not route a token to other experts than decode does. On the wide
//! fixture, whose router has near-ties a single f16 rounding flips.

mod common;

use common::nmse;
use turbospark::model::{Checkpoint, ModelOptions, OneSequence};
use turbospark::{ComputeBackend, Precision};
use turbospark_cpu::CpuBackend;

/// Rows of the same token computed two ways, both at the f32 floor: the
/// oracle's limit against transformers (tests/oracle.rs, `ORACLE_NMSE`),
/// which each side holds; a flipped expert moves a row by more than 1e-3.
const CONSISTENT_NMSE: f64 = 1e-8;

/// Prompt length and greedy tokens after it: the prompt crosses the
/// sliding window (32) and takes the prefill GEMMs (from 17 rows).
const PROMPT: usize = 60;
const NEW: usize = 12;

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in row.iter().enumerate() {
        if *v > row[best] {
            best = i;
        }
    }
    best as u32
}

/// Greedy continuation of `prompt` from the prompt's last row, one token a
/// step: the rows (the prompt's last, then each step's) and the tokens.
fn continue_greedy<B: ComputeBackend>(
    model: &mut OneSequence<B>,
    last: Vec<f32>,
) -> (Vec<Vec<f32>>, Vec<u32>) {
    let mut rows = vec![last];
    let mut tokens = Vec::new();
    for _ in 0..NEW {
        let t = argmax(rows.last().expect("a row"));
        tokens.push(t);
        rows.push(model.logits(&[t]).unwrap().remove(0));
    }
    (rows, tokens)
}

fn consistent<B: ComputeBackend>(make: impl Fn() -> B) {
    let dir = common::repo_root().join("tests/fixtures/wide-text");
    let ck = Checkpoint::open(&dir).unwrap();
    let text = std::fs::read_to_string(dir.join("expected.json")).unwrap();
    let j: serde_json::Value = serde_json::from_str(&text).unwrap();
    let prompt: Vec<u32> = j["tokens"].as_array().unwrap()[..PROMPT]
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect();
    let mut ran = 0;
    for precision in Precision::ALL {
        let backend = make();
        let device = backend.info().device_name.clone();
        if !backend.is_exact(precision) {
            eprintln!("{device}: {precision} is not exact here: not held to decode");
            continue;
        }
        // (without tensor-core products every precision is the same f32
        // arithmetic, one code path: run once)
        if precision != Precision::Exact && backend.gemm_rounding().is_none() {
            eprintln!("{device}: {precision} computes as exact does here (no tensor cores)");
            continue;
        }
        let mut model = OneSequence::load(
            backend,
            &ck,
            ModelOptions {
                max_context: 128,
                // two batches: the second prefill batch reads the first's
                // cache rows, as decode does
                prefill_batch: 32,
                precision,
                ..Default::default()
            },
        )
        .unwrap();
        let batched = model.logits(&prompt).unwrap();
        let (rows_a, tokens_a) = continue_greedy(&mut model, batched.last().unwrap().clone());
        model.reset();
        let single: Vec<Vec<f32>> = prompt
            .iter()
            .map(|&t| model.logits(&[t]).unwrap().remove(0))
            .collect();
        let (rows_b, tokens_b) = continue_greedy(&mut model, single.last().unwrap().clone());
        let mut worst = 0f64;
        for (i, (a, b)) in batched.iter().zip(&single).enumerate() {
            let e = nmse(a, b);
            assert!(
                e < CONSISTENT_NMSE,
                "{device} at {precision}: prompt row {i}, batched against token by token: \
                 NMSE {e:e}"
            );
            worst = worst.max(e);
        }
        for (i, (a, b)) in rows_a.iter().zip(&rows_b).enumerate() {
            let e = nmse(a, b);
            assert!(
                e < CONSISTENT_NMSE,
                "{device} at {precision}: decode row {i} after a batched prefill against after \
                 token-by-token: NMSE {e:e}"
            );
            worst = worst.max(e);
        }
        assert_eq!(
            tokens_a, tokens_b,
            "{device} at {precision}: greedy tokens after a batched prefill against after \
             token-by-token decode"
        );
        eprintln!("{device} at {precision}: worst row NMSE {worst:e}, {NEW} greedy tokens equal");
        ran += 1;
    }
    assert!(ran >= 1, "exact is exact on every backend");
}

#[test]
fn cpu_prefill_matches_decode() {
    consistent(CpuBackend::new);
}

#[test]
fn wgpu_prefill_matches_decode() {
    if common::wgpu_backend().is_none() {
        return;
    }
    consistent(|| common::wgpu_backend().expect("opened above"));
}
