//! Every kernel in `kernels/` parses and validates with naga and translates to
//! MSL (Metal), SPIR-V (Vulkan) and HLSL (DX12), for every weight dtype its
//! `WDTYPE` override takes. No GPU needed: this is as close to "it runs on
//! Metal" as a Linux machine gets.

use naga::back::{hlsl, msl, spv};
use naga::valid::{Capabilities, ValidationFlags, Validator};
use turbospark_wgpu::kernels::{
    families, source, COHERENT_MARK, F16_CACHE_BUILDS, KERNELS, OPTIONAL,
};

/// Family `name` (its subgroup build or not, its coherent build or not)
/// parsed, validated and with its overrides resolved at their defaults,
/// WDTYPE at `wdtype` where it has one.
fn resolved(
    name: &str,
    wdtype: f64,
    subgroups: bool,
    coherent: bool,
) -> Result<(naga::Module, naga::valid::ModuleInfo), String> {
    let src = source(name, subgroups, coherent).ok_or("missing")?;
    let module = naga::front::wgsl::parse_str(&src).map_err(|e| e.emit_to_string(&src))?;
    // Subgroup operations are optional: only the subgroup build of a family
    // may use them (validated with the capability), the other is validated
    // without it.
    let mut caps = if subgroups {
        Capabilities::default() | Capabilities::SUBGROUP
    } else {
        Capabilities::default()
    };
    // The optional families (f16 and cooperative matrices: wgpu offers the
    // latter on Vulkan and Metal only) translate to SPIR-V and MSL.
    if OPTIONAL.contains(&name) {
        caps |= Capabilities::SHADER_FLOAT16 | Capabilities::COOPERATIVE_MATRIX;
    }
    // (coherent storage is optional too: only its build declares it)
    if coherent {
        caps |= Capabilities::MEMORY_DECORATION_COHERENT;
    }
    let info = Validator::new(ValidationFlags::all(), caps)
        .validate(&module)
        .map_err(|e| e.emit_to_string(&src))?;
    let mut constants = naga::back::PipelineConstants::default();
    if module
        .overrides
        .iter()
        .any(|(_, o)| o.name.as_deref() == Some("WDTYPE"))
    {
        constants.insert("WDTYPE".to_string(), wdtype);
    }
    naga::back::pipeline_constants::process_overrides(&module, &info, None, &constants)
        .map(|(m, i)| (m.into_owned(), i.into_owned()))
        .map_err(|e| format!("overrides: {e}"))
}

fn translate(name: &str, wdtype: f64, subgroups: bool, coherent: bool) -> Result<(), String> {
    let (module, info) = resolved(name, wdtype, subgroups, coherent)?;
    let optional = OPTIONAL.contains(&name);

    // (wgpu offers coherent storage on Metal from MSL 3.2)
    let msl_opts = msl::Options {
        lang_version: if coherent { (3, 2) } else { (2, 4) },
        ..Default::default()
    };
    msl::write_string(&module, &info, &msl_opts, &msl::PipelineOptions::default())
        .map_err(|e| format!("MSL: {e:?}"))?;

    spv::write_vec(&module, &info, &spv::Options::default(), None)
        .map_err(|e| format!("SPIR-V: {e:?}"))?;

    // DX12 has f16 from shader model 6.2; it has no cooperative matrices.
    let f16_caches = F16_CACHE_BUILDS.iter().any(|(n, _)| *n == name);
    if optional && (!f16_caches || name.contains("coop")) {
        return Ok(());
    }
    let hlsl_opts = hlsl::Options {
        shader_model: if f16_caches {
            hlsl::ShaderModel::V6_2
        } else {
            hlsl::ShaderModel::V6_0
        },
        ..Default::default()
    };
    let mut out = String::new();
    hlsl::Writer::new(&mut out, &hlsl_opts, &hlsl::PipelineOptions::default())
        .write(&module, &info, None)
        .map_err(|e| format!("HLSL: {e:?}"))?;
    Ok(())
}

#[test]
fn every_kernel_validates_and_translates() {
    let mut failures = Vec::new();
    for name in families() {
        for wdtype in [0.0, 1.0, 2.0] {
            for subgroups in [false, true] {
                // (the coherent build differs only where a family marks a
                // declaration coherent)
                let marked =
                    source(name, subgroups, false).is_some_and(|s| s.contains(COHERENT_MARK));
                for coherent in [false, true] {
                    if coherent && !marked {
                        continue;
                    }
                    if let Err(e) = translate(name, wdtype, subgroups, coherent) {
                        failures.push(format!(
                            "kernels/{name}.wgsl (WDTYPE={wdtype}, subgroups {subgroups}, \
                             coherent {coherent}): {e}"
                        ));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn every_kernel_file_is_registered() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels");
    for entry in std::fs::read_dir(&dir).expect("kernels/ exists") {
        let path = entry.expect("readable").path();
        let stem = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default()
            .to_string();
        // (appended to other families by kernels::source, not compiled alone)
        let prelude = [
            "common",
            "reduce",
            "reduce_subgroup",
            "gemm_tiles",
            "topk",
            "routed_pair",
            "rope_angle",
            "attention_qkv",
            "f16_round",
            "attention_keys",
            "kv_f32",
            "kv_f16",
            "tail",
            "affine",
            "affine_pair",
        ]
        .contains(&stem.as_str());
        if path.extension().and_then(|e| e.to_str()) == Some("wgsl") && !prelude {
            assert!(
                KERNELS.iter().any(|(n, _)| *n == stem),
                "kernels/{stem}.wgsl is not in KERNELS"
            );
        }
    }
}

/// The kernel lab's variant file (examples/kernel_lab.wgsl) still parses and
/// validates against the kernel it builds on, so the lab does not rot
/// between GPU runs.
#[test]
fn kernel_lab_sources_validate() {
    // as the lab composes it: after the backend's gemv source
    let src = format!(
        "{}\n{}",
        source("gemv", true, false).expect("gemv"),
        include_str!("../examples/kernel_lab.wgsl")
    );
    let module = naga::front::wgsl::parse_str(&src)
        .unwrap_or_else(|e| panic!("kernel_lab.wgsl: {}", e.emit_to_string(&src)));
    Validator::new(
        ValidationFlags::all(),
        Capabilities::default() | Capabilities::SUBGROUP,
    )
    .validate(&module)
    .unwrap_or_else(|e| panic!("kernel_lab.wgsl: {}", e.emit_to_string(&src)));
}

/// Every workgroup variable of a family that uses cooperative matrices is a
/// whole number of 16-byte units (at the overrides' defaults). A
/// cooperative load or store in workgroup memory needs 16-byte alignment,
/// and the driver lays the variables out in an order of its own: a single
/// 8-byte `vec2` made attention_coop read NaN on the H200 (2026-12-01 at
/// f16691c), which no Linux machine without tensor cores could show.
#[test]
fn cooperative_families_keep_workgroup_variables_16_byte_sized() {
    let mut failures = Vec::new();
    for name in families() {
        let src = source(name, true, false).expect("registered");
        if !src.contains("coop_mat") {
            continue;
        }
        let (module, _) = resolved(name, 0.0, true, false).expect("validates (tested above)");
        for (_, var) in module.global_variables.iter() {
            if var.space != naga::AddressSpace::WorkGroup {
                continue;
            }
            let size = module.types[var.ty].inner.size(module.to_ctx());
            if size % 16 != 0 {
                failures.push(format!(
                    "kernels/{name}.wgsl: var<workgroup> {} is {size} bytes",
                    var.name.as_deref().unwrap_or("?")
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The tiled GEMMs' quantized loaders (kernels/affine.wgsl's eight-value
/// helpers) resolve and translate at every width mlx writes, and the
/// tensor-core GEMM with its W split in two (`WSPLIT`), whose branches the
/// defaults (a plain weight) leave unresolved; its workgroup variables stay
/// 16-byte sized there too.
#[test]
fn quantized_gemm_builds_translate_at_every_width() {
    let mut failures = Vec::new();
    for name in ["gemm", "gemm_coop"] {
        let src = source(name, true, false).expect("registered");
        let module = naga::front::wgsl::parse_str(&src).expect("parses (tested above)");
        let caps = Capabilities::default()
            | Capabilities::SUBGROUP
            | Capabilities::SHADER_FLOAT16
            | Capabilities::COOPERATIVE_MATRIX;
        let info = Validator::new(ValidationFlags::all(), caps)
            .validate(&module)
            .expect("validates (tested above)");
        for bits in [2.0, 3.0, 4.0, 5.0, 6.0, 8.0] {
            let mut constants = naga::back::PipelineConstants::default();
            constants.insert("WDTYPE".to_string(), 2.0);
            constants.insert("QBITS".to_string(), bits);
            if name == "gemm_coop" {
                constants.insert("SPLIT".to_string(), 1.0);
                constants.insert("WSPLIT".to_string(), 1.0);
                constants.insert("WSN".to_string(), 2.0 * 10240.0);
            }
            let resolved =
                naga::back::pipeline_constants::process_overrides(&module, &info, None, &constants);
            let (m, i) = match resolved {
                Ok(r) => r,
                Err(e) => {
                    failures.push(format!("{name} at {bits} bits: overrides: {e}"));
                    continue;
                }
            };
            if let Err(e) = spv::write_vec(&m, &i, &spv::Options::default(), None) {
                failures.push(format!("{name} at {bits} bits: SPIR-V: {e:?}"));
            }
            for (_, var) in m.global_variables.iter() {
                let size = m.types[var.ty].inner.size(m.to_ctx());
                if var.space == naga::AddressSpace::WorkGroup && size % 16 != 0 {
                    failures.push(format!("{name} at {bits} bits: a {size}-byte variable"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
