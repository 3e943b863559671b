//! Every op family on the wgpu backend against the CPU reference, on fresh
//! seeded inputs (replay a failure with `TURBOSPARK_SEED=<seed>`).

mod common;

use turbospark::parity::{ci_cases, run_cases, seed_from_env};
use turbospark_cpu::CpuBackend;

fn family(name: &str) {
    let Some(device) = common::wgpu_backend() else {
        return;
    };
    let cases: Vec<_> = ci_cases()
        .into_iter()
        .filter(|c| c.family() == name)
        .collect();
    assert!(!cases.is_empty(), "no cases for {name}");
    let seed = seed_from_env();
    let outcomes = run_cases(&CpuBackend::new(), &device, &cases, "", seed, |o| {
        eprintln!("{o}")
    });
    let failed: Vec<String> = outcomes
        .iter()
        .filter(|o| !o.passed())
        .map(|o| o.to_string())
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} {name} cases failed (base seed {seed}; replay with TURBOSPARK_SEED={seed}):\n{}",
        failed.len(),
        outcomes.len(),
        failed.join("\n")
    );
}

#[test]
fn rms_norm() {
    family("rms_norm");
}
#[test]
fn matmul() {
    family("matmul");
}
#[test]
fn router() {
    family("router");
}
#[test]
fn moe_gate_up() {
    family("moe_gate_up");
}
#[test]
fn moe_down() {
    family("moe_down");
}
#[test]
fn rope() {
    family("rope");
}
#[test]
fn kv_append() {
    family("kv_append");
}
#[test]
fn attention() {
    family("attention");
}
#[test]
fn add() {
    family("add");
}
#[test]
fn scale() {
    family("scale");
}
#[test]
fn gelu_mul() {
    family("gelu_mul");
}
#[test]
fn softcap() {
    family("softcap");
}
#[test]
fn embed() {
    family("embed");
}
#[test]
fn argmax() {
    family("argmax");
}

#[test]
fn post_attention() {
    family("post_attention");
}

#[test]
fn post_ffn() {
    family("post_ffn");
}

#[test]
fn qkv_post() {
    family("qkv_post");
}
