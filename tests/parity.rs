//! Every op family on the wgpu backend against the CPU reference, on fresh
//! seeded inputs (replay a failure with `TURBOSPARK_SEED=<seed>`).

mod common;

use turbospark::parity::{ci_cases, run_cases, seed_from_env, Case, Status};
use turbospark_cpu::CpuBackend;
use turbospark_wgpu::{LimitsProfile, WgpuOptions};

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

/// The families whose decode launches finish in their last workgroup where
/// the device has coherent storage (attn_decode's combine; lavapipe has
/// it) again with it off, so the dependent dispatch it replaces
/// (attn_combine) stays tested on the same cases.
fn family_without_tails(name: &str) {
    family_on(
        name,
        &WgpuOptions {
            tails: Some(false),
            ..Default::default()
        },
    );
}

/// Whether the backend opens with the tiles `opts` forces (`what` names
/// them): one past the device's workgroup memory is refused when the backend
/// opens, and of the shipped tiles only WebGPU's 16 KiB may refuse one,
/// which is then printed as not run. The caller has found an adapter.
fn opens_with_forced_tiles(opts: &WgpuOptions, what: &str) -> bool {
    let Err(e) = turbospark_wgpu::WgpuBackend::new(opts) else {
        return true;
    };
    let profile = LimitsProfile::or_env(None).expect("TURBOSPARK_LIMITS");
    assert_eq!(
        profile,
        LimitsProfile::WebGpu,
        "{what} must fit the device under the {} limits: {e}",
        profile.name()
    );
    eprintln!("not run: {what} under the webgpu limits: {e}");
    false
}

/// The families the prefill GEMM serves, with each shipped tile forced: the
/// launcher picks tiles by shape and device, so the cases alone reach only
/// some of them (on lavapipe never the 16 KB MoE tile). Forced tiles also
/// run shapes their defaults would not get. Under `webgpu` (16 KiB) the MoE
/// tile does not fit and is not run ([`opens_with_forced_tiles`]).
#[test]
fn gemm_families_with_every_tile() {
    if common::wgpu_backend().is_none() {
        return;
    }
    let mut ran = 0;
    // DENSE + GROUPED_SMALL, then DENSE_NARROW + GROUPED
    // (backends/wgpu/src/ops/gemm.rs).
    for tiles in ["4,2,2,16;4,2,4,8", "4,1,2,16;4,2,4,16"] {
        // (tensor cores off: where a device has them they would take every
        // case with k % 32 == 0 instead of the forced f32 tiles)
        let opts = WgpuOptions {
            gemm_tiles: Some(tiles.into()),
            tensor_cores: Some(false),
            ..Default::default()
        };
        if !opens_with_forced_tiles(&opts, &format!("GEMM tiles {tiles}")) {
            continue;
        }
        for name in ["matmul", "moe_gate_up", "moe_down", "router"] {
            eprintln!("tiles {tiles}: {name}");
            family_on(name, &opts);
        }
        ran += 1;
    }
    assert!(ran > 0, "no forced tile fits the device");
}

/// Small batches (2 to 16 rows of x) all through the tiled GEMM's 16-row
/// tile (`WgpuOptions::gemm_from_m` 2), then all through the streaming GEMVs
/// (17): the default (9) splits the matmul families' cases of 2, 3, 5 and
/// 16 rows between the two, so each path also runs the other's cases, every
/// weight format among them (the GEMM's 8-of-k tile where the device's
/// workgroup memory is WebGPU's 16 KiB).
#[test]
fn small_batches_through_the_gemm_and_the_gemvs() {
    if common::wgpu_backend().is_none() {
        return;
    }
    for from in [2, 17] {
        let opts = WgpuOptions {
            gemm_from_m: Some(from),
            ..Default::default()
        };
        for name in ["matmul", "matmul_quantized"] {
            eprintln!("small batches, the GEMM from {from} rows: {name}");
            family_on(name, &opts);
        }
    }
}

/// The same families on the tensor-core GEMM with tiles other than the
/// defaults forced (backends/wgpu/src/ops/gemm_coop.rs: dense; narrow;
/// grouped): the MoE tiles take one slice of k a step and the dense ones
/// two, and the defaults alone leave the 2-warp MoE tiles and a staged-x
/// narrow tile unrun. Runs where the adapter has the tensor-core GEMM;
/// elsewhere it says so and passes (`TURBOSPARK_TENSOR_CORES=1` makes that
/// a failure, as for the other tensor-core tests).
#[test]
fn tensor_core_gemm_families_with_other_tiles() {
    use turbospark::ComputeBackend;
    let Some(gpu) = common::wgpu_backend() else {
        return;
    };
    if !gpu.features().tensor_core_gemm {
        eprintln!(
            "not run: {} has no tensor-core GEMM",
            gpu.info().device_name
        );
        return;
    }
    drop(gpu);
    for tiles in ["2,2,1;2,2,0;1,2,0", "1,2,1;1,4,0;2,2,0"] {
        let opts = WgpuOptions {
            coop_tiles: Some(tiles.into()),
            ..Default::default()
        };
        if !opens_with_forced_tiles(&opts, &format!("tensor-core tiles {tiles}")) {
            continue;
        }
        for name in ["matmul", "moe_gate_up", "moe_down"] {
            eprintln!("tensor-core tiles {tiles}: {name}");
            family_on(name, &opts);
        }
    }
}

/// The families with tensor-core products at `Precision::Fast` (one f16
/// rounding of the activations, held to its own limits): the default runs
/// them split. Runs where the adapter has the tensor-core GEMM; elsewhere
/// fast computes in f32 as exact does, and it says so and passes.
#[test]
fn tensor_core_families_fast() {
    use turbospark::ComputeBackend;
    let Some(gpu) = common::wgpu_backend() else {
        return;
    };
    if !gpu.features().tensor_core_gemm {
        eprintln!(
            "not run: {} has no tensor-core GEMM (fast is exact there)",
            gpu.info().device_name
        );
        return;
    }
    drop(gpu);
    for name in [
        "matmul",
        "moe_gate_up",
        "moe_down",
        "attention",
        "qkv_post_attention",
        "matmul_quantized",
        "moe_gate_up_quantized",
        "moe_down_quantized",
    ] {
        eprintln!("fast: {name}");
        family_at(name, &WgpuOptions::default(), turbospark::Precision::Fast);
    }
}

/// The MoE families with expert stacks stored in tile order where their
/// shape allows (backends/wgpu/src/expert_tiles.rs): every kernel that
/// reads expert weights (decode, pairs, the route-list kernels, the GEMMs
/// with and without tensor cores) against the CPU reference, which keeps
/// them row-major; the cases mix stacks that take the layout with ones that
/// do not, and a pair's dense MLP with routed experts.
#[test]
fn moe_families_with_tiled_experts() {
    let Some(gpu) = common::wgpu_backend() else {
        return;
    };
    // (f32 GEMMs as well only where the default is the tensor-core one)
    let settings: &[Option<bool>] = if gpu.features().tensor_core_gemm {
        &[None, Some(false)]
    } else {
        &[None]
    };
    drop(gpu);
    for &tensor_cores in settings {
        let opts = WgpuOptions {
            expert_tiles: Some(true),
            tensor_cores,
            ..Default::default()
        };
        for name in [
            "moe_gate_up",
            "moe_down",
            "moe_gate_up_pair",
            "moe_down_pair",
        ] {
            eprintln!("tiled experts (tensor cores {tensor_cores:?}): {name}");
            family_on(name, &opts);
        }
    }
}

/// The families whose kernels bind more storage buffers than WebGPU's
/// default 8 a stage (post_ffn's 9, alone or after the down pair): under
/// `TURBOSPARK_LIMITS=webgpu` the backend reports every one of their cases
/// Unsupported (through `supports`, before any pipeline). Under every other
/// profile nothing may be unsupported; under webgpu nothing else.
const UNSUPPORTED_UNDER_WEBGPU: &[&str] = &[
    "post_ffn",
    "moe_down_pair_post_ffn",
    "moe_down_pair_post_ffn_quantized",
];

fn family_on(name: &str, opts: &WgpuOptions) {
    family_at(name, opts, turbospark::Precision::Exact);
}

/// [`family_on`] with the device's tensor-core products at `precision`
/// (the reference follows it: `CpuBackend::parity_reference_for`).
fn family_at(name: &str, opts: &WgpuOptions, precision: turbospark::Precision) {
    let Some(device) = common::wgpu_backend_with(opts) else {
        return;
    };
    let cases: Vec<_> = ci_cases()
        .into_iter()
        .filter(|c| c.family() == name)
        .map(|c| c.with_precision(precision))
        .collect();
    assert!(!cases.is_empty(), "no cases for {name}");
    let seed = seed_from_env();
    let outcomes = run_cases(
        &CpuBackend::parity_reference_for(&device),
        &device,
        &cases,
        "",
        seed,
        |o| eprintln!("{o}"),
    );
    let unsupported = outcomes
        .iter()
        .filter(|o| matches!(o.status, Status::Unsupported(_)))
        .count();
    let profile = LimitsProfile::or_env(None).expect("TURBOSPARK_LIMITS");
    let expected = profile == LimitsProfile::WebGpu && UNSUPPORTED_UNDER_WEBGPU.contains(&name);
    if expected {
        assert_eq!(
            unsupported,
            outcomes.len(),
            "{name} is listed as unsupported under the webgpu limits, but {} of its {} cases ran: \
             update UNSUPPORTED_UNDER_WEBGPU",
            outcomes.len() - unsupported,
            outcomes.len()
        );
        eprintln!("not run: {name} under the webgpu limits, all {unsupported} cases unsupported");
        return;
    }
    let failed: Vec<String> = outcomes
        .iter()
        .filter(|o| !o.passed())
        .map(|o| o.to_string())
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} {name} cases failed under the {} limits (base seed {seed}; replay with \
         TURBOSPARK_SEED={seed}):\n{}",
        failed.len(),
        outcomes.len(),
        profile.name(),
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
fn copy_range() {
    family("copy_range");
}
#[test]
fn slot_lookup() {
    family("slot_lookup");
}

#[test]
fn post_attention() {
    family("post_attention");
}

#[test]
fn post_attention_router() {
    family("post_attention_router");
}

#[test]
fn post_attention_gate_up() {
    family("post_attention_gate_up");
}

#[test]
fn post_attention_gate_up_slots() {
    family("post_attention_gate_up_slots");
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
fn qkv_post_attention() {
    family("qkv_post_attention");
}

#[test]
fn qkv_post_attention_row() {
    family("qkv_post_attention_row");
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
fn moe_down_pair_post_ffn() {
    family("moe_down_pair_post_ffn");
}

// MLX affine-quantized weights (src/parity/quantized_cases.rs).
#[test]
fn matmul_quantized() {
    family("matmul_quantized");
}
#[test]
fn router_quantized() {
    family("router_quantized");
}
#[test]
fn moe_gate_up_quantized() {
    family("moe_gate_up_quantized");
}
#[test]
fn moe_down_quantized() {
    family("moe_down_quantized");
}
#[test]
fn moe_gate_up_pair_quantized() {
    family("moe_gate_up_pair_quantized");
}
#[test]
fn moe_down_pair_quantized() {
    family("moe_down_pair_quantized");
}
#[test]
fn moe_down_pair_post_ffn_quantized() {
    family("moe_down_pair_post_ffn_quantized");
}
#[test]
fn embed_quantized() {
    family("embed_quantized");
}
#[test]
fn post_attention_router_quantized() {
    family("post_attention_router_quantized");
}
#[test]
fn post_attention_gate_up_quantized() {
    family("post_attention_gate_up_quantized");
}

#[test]
fn post_attention_gate_up_slots_quantized() {
    family("post_attention_gate_up_slots_quantized");
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
fn qkv_post_attention_without_subgroups() {
    family_without_subgroups("qkv_post_attention");
}
#[test]
fn post_attention_without_subgroups() {
    family_without_subgroups("post_attention");
}

#[test]
fn post_attention_router_without_subgroups() {
    family_without_subgroups("post_attention_router");
}

#[test]
fn post_attention_gate_up_without_subgroups() {
    family_without_subgroups("post_attention_gate_up");
}
#[test]
fn attention_without_subgroups() {
    family_without_subgroups("attention");
}
#[test]
fn post_ffn_without_subgroups() {
    family_without_subgroups("post_ffn");
}

#[test]
fn attention_without_tails() {
    family_without_tails("attention");
}
#[test]
fn qkv_post_attention_without_tails() {
    family_without_tails("qkv_post_attention");
}
#[test]
fn qkv_post_attention_row_without_tails() {
    family_without_tails("qkv_post_attention_row");
}

/// The tensor-core GEMM's per-row scale (kernels/gemm_coop.wgsl's
/// gemm_prep): rows of x from 1e-6 to 1e6 (past f16's 65504, and far below
/// its normal range) each keep the f16 rounding's accuracy. NMSE per row,
/// so a small row's error is not hidden under a large one's. Runs where the
/// adapter has the tensor-core GEMM; elsewhere it says so and passes. To make
/// that a failure (the H200 runs), set `TURBOSPARK_TENSOR_CORES=1`: the
/// backend itself then refuses to open without them, failing every wgpu test.
#[test]
fn tensor_core_gemm_keeps_each_rows_range() {
    use turbospark::ops::Matmul;
    use turbospark::parity::{case, Op, F16_INPUT_NMSE};
    use turbospark::{ComputeBackend, DType};

    let Some(gpu) = common::wgpu_backend() else {
        return;
    };
    if !gpu.features().tensor_core_gemm {
        eprintln!(
            "not run: {} has no tensor-core GEMM (cooperative matrices: [{}])",
            gpu.info().device_name,
            gpu.features().cooperative_matrix.join(", ")
        );
        return;
    }
    let (m, n, k) = (40, 96, 2816);
    let op = Op::Matmul(case::Matmul {
        p: Matmul {
            m,
            n,
            k,
            precision: turbospark::Precision::Exact,
        },
        w: DType::BF16,
    });
    assert!(
        gpu.rounds_gemm_inputs(&op.kind(), m, k),
        "the case must take the tensor cores"
    );
    for precision in turbospark::Precision::ALL {
        let op = op.clone().with_precision(precision);
        // (fast: F16_INPUT_NMSE; exact: the f32 GEMM's own limit)
        let limit = op.limit_on(&gpu);
        assert!(limit >= F16_INPUT_NMSE || precision == turbospark::Precision::Exact);
        rows_keep_their_range(&gpu, &op, (m, n, k), limit, precision);
    }
}

fn rows_keep_their_range(
    gpu: &turbospark_wgpu::WgpuBackend,
    op: &turbospark::parity::Op,
    (m, n, k): (usize, usize, usize),
    limit: f64,
    precision: turbospark::Precision,
) {
    use turbospark::parity::{run_on, HostTensor};
    let seed = seed_from_env();
    // The case's own inputs (bf16 weights, x), then rows of x from 1e-6 to 1e6.
    let mut inputs = op.inputs(&mut turbospark::rng::Rng::new(seed));
    let HostTensor::F32(x) = &mut inputs[1] else {
        unreachable!("matmul's second input is x")
    };
    for (i, row) in x.chunks_mut(k).enumerate() {
        let s = 10f32.powi(i as i32 % 13 - 6);
        row.iter_mut().for_each(|v| *v *= s);
    }
    let out = |b: &dyn Fn() -> turbospark::Result<Vec<HostTensor>>| match b() {
        Ok(mut o) => match o.remove(0) {
            HostTensor::F32(v) => v,
            _ => unreachable!("matmul's output is f32"),
        },
        Err(e) => panic!("matmul: {e}"),
    };
    let want = out(&|| run_on(&CpuBackend::new(), op, &inputs));
    let got = out(&|| run_on(gpu, op, &inputs));
    for i in 0..m {
        let (g, r) = (&got[i * n..(i + 1) * n], &want[i * n..(i + 1) * n]);
        assert!(
            g.iter().all(|v| v.is_finite()),
            "row {i}: non-finite (seed {seed})"
        );
        let e = common::nmse(g, r);
        assert!(
            e <= limit,
            "row {i} (x scaled by 1e{}): NMSE {e:.3e} over {limit:.3e} at {} precision (seed {seed})",
            i as i32 % 13 - 6,
            precision
        );
    }
}

/// On a device that rounds attention's inputs to f16 at prefill sizes (as
/// the tensor cores do), the attention cases at those sizes, alone or after
/// qkv_post, are held to the rounding's limit for their rows and every
/// other case to its own: the fused op's attention is the same attention.
#[test]
fn rounded_attention_sets_the_limit_of_both_attention_ops() {
    use std::sync::Arc;
    use turbospark::ops::OpKind;
    use turbospark::parity::{all_cases, rounded_attention_nmse, Op};
    use turbospark::Precision;
    let rounding = CpuBackend::new().rounding_gemm_inputs_as(Arc::new(|k: &OpKind, m, _| {
        matches!(k, OpKind::Attention { .. }) && m >= 17
    }));
    let (mut fused, mut alone) = (0, 0);
    for op in all_cases() {
        // (fast: one rounding; exact keeps every op's own limit, below)
        let split = op.clone().with_precision(Precision::Exact);
        let op = op.with_precision(Precision::Fast);
        let (m, heads) = match &op {
            Op::Attention(c) => (c.p.m, c.p.heads),
            Op::QkvPostAttention(c) => (c.p.m, c.p.heads),
            _ => continue,
        };
        let want = if m >= 17 {
            match op {
                Op::QkvPostAttention(_) => fused += 1,
                _ => alone += 1,
            }
            op.limit().max(rounded_attention_nmse(m * heads))
        } else {
            op.limit()
        };
        assert_eq!(op.limit_on(&rounding), want, "{}", op.name());
        assert_eq!(
            split.limit_on(&rounding),
            split.limit(),
            "{} split",
            op.name()
        );
    }
    assert!(
        fused > 0 && alone > 0,
        "cases at prefill sizes: {fused} fused, {alone} alone"
    );
}

/// The CPU reference's model of the tensor cores on quantized weights
/// (`Weights::rounded_as`: x and w one f16 each at fast, both split at
/// exact) stays within the limits derived for it
/// (`turbospark::parity::AFFINE_F16_NMSE`; exact keeps the f32 limit) of
/// the f32 reference, on the quantized GEMM families at every size: the
/// arithmetic the device is held to, checked where no device is needed.
#[test]
fn rounding_reference_keeps_quantized_gemms_within_their_limits() {
    use std::sync::Arc;
    use turbospark::ops::OpKind;
    use turbospark::Precision;
    let rounding = CpuBackend::new().rounding_gemm_inputs_as(Arc::new(|k: &OpKind, m, _| {
        !matches!(k, OpKind::Attention { .. }) && m >= 17
    }));
    let seed = seed_from_env();
    for precision in [Precision::Fast, Precision::Exact] {
        let cases: Vec<_> = ci_cases()
            .into_iter()
            .filter(|c| {
                matches!(
                    c.family(),
                    "matmul_quantized" | "moe_gate_up_quantized" | "moe_down_quantized"
                )
            })
            .map(|c| c.with_precision(precision))
            .collect();
        let outcomes = run_cases(&CpuBackend::new(), &rounding, &cases, "", seed, |_| {});
        let failed: Vec<String> = outcomes
            .iter()
            .filter(|o| !o.passed())
            .map(|o| o.to_string())
            .collect();
        assert!(
            failed.is_empty(),
            "{precision}: {} of {} failed (seed {seed}):\n{}",
            failed.len(),
            outcomes.len(),
            failed.join("\n")
        );
    }
}
