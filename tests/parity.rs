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

/// The tensor-core GEMM's per-row scale (kernels/gemm_coop.wgsl's
/// gemm_prep): rows of x from 1e-6 to 1e6 (past f16's 65504, and far below
/// its normal range) each keep the f16 rounding's accuracy. NMSE per row,
/// so a small row's error is not hidden under a large one's. Runs where the
/// adapter has the tensor-core GEMM; elsewhere it says so and passes, unless
/// `TURBOSPARK_REQUIRE_TENSOR_CORES=1` (the H200 runs set it), where it fails.
#[test]
fn tensor_core_gemm_keeps_each_rows_range() {
    use turbospark::ops::Matmul;
    use turbospark::parity::F16_INPUT_NMSE;
    use turbospark::{ComputeBackend, DType, HostBytes};

    let Some(gpu) = common::wgpu_backend() else {
        return;
    };
    if !gpu.info().features.tensor_core_gemm {
        assert!(
            !std::env::var("TURBOSPARK_REQUIRE_TENSOR_CORES").is_ok_and(|v| v == "1"),
            "TURBOSPARK_REQUIRE_TENSOR_CORES=1 but {} has no tensor-core GEMM",
            gpu.info().device_name
        );
        eprintln!(
            "not run: {} has no tensor-core GEMM (cooperative matrices: [{}])",
            gpu.info().device_name,
            gpu.info().features.cooperative_matrix.join(", ")
        );
        return;
    }
    let cpu = CpuBackend::new();
    let seed = seed_from_env();
    let mut rng = turbospark::rng::Rng::new(seed);
    let (m, n, k) = (40, 96, 2816);
    let p = Matmul { m, n, k };
    let w = turbospark::dtype::encode_f32(DType::BF16, &rng.vec_normal(n * k, 0.05));
    let mut x = rng.vec_normal(m * k, 1.0);
    for (i, row) in x.chunks_mut(k).enumerate() {
        let s = 10f32.powi(i as i32 % 13 - 6);
        row.iter_mut().for_each(|v| *v *= s);
    }
    fn matmul<B: ComputeBackend>(
        b: &B,
        w: &[u8],
        x: &[f32],
        p: Matmul,
    ) -> turbospark::Result<Vec<f32>> {
        let wb = b.upload_weight(DType::BF16, p.n, p.k, HostBytes::Slice(w), "w")?;
        let xb = b.upload(DType::F32, HostBytes::Slice(bytemuck::cast_slice(x)), "x")?;
        let ob = b.alloc(DType::F32, p.m * p.n, "out")?;
        b.write_f32(&ob, 0, &vec![f32::NAN; p.m * p.n])?;
        b.matmul(&wb, &xb, &ob, p)?;
        b.sync()?;
        b.download_f32(&ob)
    }
    let want = matmul(&cpu, &w, &x, p).expect("cpu matmul");
    let got = matmul(&gpu, &w, &x, p).expect("wgpu matmul");
    for i in 0..m {
        let (g, r) = (&got[i * n..(i + 1) * n], &want[i * n..(i + 1) * n]);
        assert!(
            g.iter().all(|v| v.is_finite()),
            "row {i}: non-finite (seed {seed})"
        );
        let e = common::nmse(g, r);
        assert!(
            e <= F16_INPUT_NMSE,
            "row {i} (x scaled by 1e{}): NMSE {e:.3e} over {F16_INPUT_NMSE:.3e} (seed {seed})",
            i as i32 % 13 - 6
        );
    }
}
