//! Helpers shared by the model-level tests.
#![allow(dead_code)]

pub mod temp_dir;

use turbospark::ComputeBackend;
use turbospark_cpu::CpuBackend;
use turbospark_wgpu::{WgpuBackend, WgpuOptions};

/// The repository the fixtures are read from: `TURBOSPARK_ROOT` where set
/// (a test binary run on another machine, from that machine's checkout:
/// scripts/h200-precision.sh), else the one it was built in.
pub fn repo_root() -> std::path::PathBuf {
    std::env::var_os("TURBOSPARK_ROOT")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

/// Normalised mean squared error `sum (a-b)^2 / sum b^2` (b the reference).
pub fn nmse(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len(), "length mismatch");
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(a, b)| (*a as f64 - *b as f64).powi(2))
        .sum();
    let den: f64 = want.iter().map(|b| (*b as f64).powi(2)).sum();
    num / den.max(f64::MIN_POSITIVE)
}

/// The wgpu backend on the best adapter; None (skip) when there is none,
/// except under `CI=true`, where a missing adapter FAILS the test: CI must
/// run the GPU path (on lavapipe), never silently skip it. An adapter that
/// exists but cannot open as asked (`TURBOSPARK_TENSOR_CORES=1` without
/// tensor cores, a bad tile override) fails the test everywhere.
pub fn wgpu_backend() -> Option<WgpuBackend> {
    wgpu_backend_with(&WgpuOptions::default())
}

/// [`wgpu_backend`] with options (the same skip / CI rule).
pub fn wgpu_backend_with(opts: &WgpuOptions) -> Option<WgpuBackend> {
    match WgpuBackend::new(opts) {
        Ok(b) => {
            eprintln!("wgpu adapter: {} ({})", b.info().device_name, b.info().api);
            Some(b)
        }
        Err(e @ turbospark::Error::NoAdapter(_)) => {
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("CI=true but no wgpu adapter: {e}");
            }
            eprintln!("skipping wgpu test: {e}");
            None
        }
        Err(e) => panic!("the wgpu backend does not open as asked: {e}"),
    }
}

/// The path `be`'s streamed misses take into their slots: straight into
/// the mapped slot where it maps them (`WgpuFeatures::mapped_slots`), else
/// through staging. Under `CI=true` a software adapter (lavapipe) must map
/// them, unless the WebGPU limits profile or `TURBOSPARK_MAPPED_SLOTS=0`
/// says otherwise: CI runs that path, never silently the other.
pub fn slot_write(be: &WgpuBackend) -> turbospark::SlotWrite {
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    let software = be.info().device_type == turbospark::DeviceType::SoftwareGpu;
    let webgpu = turbospark_wgpu::LimitsProfile::or_env(None).ok()
        == Some(turbospark_wgpu::LimitsProfile::WebGpu);
    let off = std::env::var("TURBOSPARK_MAPPED_SLOTS").is_ok_and(|v| v == "0");
    if ci && software && !webgpu && !off {
        assert!(
            be.features().mapped_slots,
            "CI=true: {} must copy misses into mapped slots",
            be.info().device_name
        );
    }
    if be.features().mapped_slots {
        turbospark::SlotWrite::Mapped
    } else {
        turbospark::SlotWrite::Staged
    }
}

/// The wgpu backend with its expert stacks in tile order
/// (backends/wgpu/src/expert_tiles.rs, on by default only on tensor-core
/// devices) and the tiny config at a shape that takes them (hidden 64,
/// moe_inter 32: whole 64-row blocks).
pub fn wgpu_with_tiled_experts() -> Option<(WgpuBackend, turbospark::model::ModelConfig)> {
    let be = wgpu_backend_with(&WgpuOptions {
        expert_tiles: Some(true),
        ..Default::default()
    })?;
    Some((be, tiled_experts_config()))
}

/// [`wgpu_with_tiled_experts`]' config: the tiny one at a shape whose
/// expert stacks take tile order.
pub fn tiled_experts_config() -> turbospark::model::ModelConfig {
    turbospark::model::ModelConfig {
        hidden: 64,
        moe_inter: 32,
        ..turbospark::model::synthetic::tiny_config()
    }
}

/// The CPU reference doing `b`'s arithmetic: where `b` runs some GEMMs from
/// f16-rounded inputs (tensor cores), the reference rounds the same ones
/// (`CpuBackend::rounding_gemm_inputs_as`), so `b` is held to f32 reduction
/// order, not to an allowance for rounding that a model compounds over its
/// layers (on the H200 10x the per-product sum for some rows of the tiny
/// fixtures). None where `b` computes in f32 (the plain reference is the
/// truth).
pub fn reference_for<B: ComputeBackend>(b: &B) -> Option<CpuBackend> {
    b.gemm_rounding()
        .map(|rule| CpuBackend::new().rounding_gemm_inputs_as(rule))
}

/// How far a backend that rounds its GEMM inputs may sit from the CPU
/// reference rounding the same ones, for a row where that reference sits
/// `spread` (NMSE) from f32 arithmetic: both sit from f32 by rounding of the
/// same kind and size, and roundings flip between them wherever inputs
/// straddle a boundary, so |G - E| <= |G - X| + |E - X| ~ 2 |E - X|: 4x the
/// spread in NMSE. The rounding moves the test models' rows by 5e-5 at
/// most; a reference further than 1e-4 from f32 is itself wrong and may
/// not widen the limit it sets.
pub fn rounding_allowance(spread: f64, what: &str) -> f64 {
    assert!(
        spread < 1e-4,
        "{what}: the rounding reference sits {spread:e} from f32 arithmetic"
    );
    4.0 * spread
}
