//! Every op family on the wgpu backend against the CPU reference, on fresh
//! seeded inputs (replay a failure with `TURBOSPARK_SEED=<seed>`).

mod common;

use turbospark::parity::{ci_cases, run_cases, seed_from_env};
use turbospark_cpu::CpuBackend;
use turbospark_wgpu::WgpuOptions;

fn family(name: &str) {
    family_on(name, &WgpuOptions::default());
}

/// The families whose kernels reduce across a workgroup
/// (kernels/reduce*.wgsl) again with subgroup operations turned off: the
/// default run takes the subgroup path wherever the device has it (lavapipe
/// does), so this keeps the workgroup-memory path tested too.
fn family_without_subgroups(name: &str) {
    family_on(
        name,
        &WgpuOptions {
            no_subgroups: true,
            ..Default::default()
        },
    );
}

/// The families the prefill GEMM serves, with each shipped tile forced: the
/// launcher picks tiles by shape and device, so the cases alone reach only
/// some of them (on lavapipe never the 16 KB MoE tile). Forced tiles also
/// run shapes their defaults would not get.
#[test]
fn gemm_families_with_every_tile() {
    // DENSE + GROUPED_SMALL, then DENSE_NARROW + GROUPED
    // (backends/wgpu/src/ops/gemm.rs).
    for tiles in ["4,2,2,16;4,2,4,8", "4,1,2,16;4,2,4,16"] {
        let opts = WgpuOptions {
            gemm_tiles: Some(tiles.into()),
            ..Default::default()
        };
        for name in ["matmul", "moe_gate_up", "moe_down", "router"] {
            eprintln!("tiles {tiles}: {name}");
            family_on(name, &opts);
        }
    }
}

fn family_on(name: &str, opts: &WgpuOptions) {
    let Some(device) = common::wgpu_backend_with(opts) else {
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

#[test]
fn moe_gate_up_pair() {
    family("moe_gate_up_pair");
}
#[test]
fn moe_down_pair() {
    family("moe_down_pair");
}

#[test]
fn rms_norm_without_subgroups() {
    family_without_subgroups("rms_norm");
}
#[test]
fn router_without_subgroups() {
    family_without_subgroups("router");
}
#[test]
fn qkv_post_without_subgroups() {
    family_without_subgroups("qkv_post");
}
#[test]
fn post_attention_without_subgroups() {
    family_without_subgroups("post_attention");
}
#[test]
fn attention_without_subgroups() {
    family_without_subgroups("attention");
}
#[test]
fn post_ffn_without_subgroups() {
    family_without_subgroups("post_ffn");
}
