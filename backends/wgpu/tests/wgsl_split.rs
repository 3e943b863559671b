//! The split builds of the tensor-core families (`SPLIT = 1`,
//! `turbospark::Precision::Exact`) translate to SPIR-V and MSL with their
//! overrides resolved as the launchers set them: `wgsl_valid.rs` resolves
//! every override at its default, where the split's branches are dead
//! code, and no CI machine has the cooperative matrices that compile them.

use naga::back::{msl, spv};
use naga::valid::{Capabilities, ValidationFlags, Validator};
use turbospark_wgpu::kernels::source;

fn translate(name: &str, overrides: &[(&str, f64)]) -> Result<(), String> {
    let src = source(name, false, false).ok_or("missing")?;
    let module = naga::front::wgsl::parse_str(&src).map_err(|e| e.emit_to_string(&src))?;
    let caps =
        Capabilities::default() | Capabilities::SHADER_FLOAT16 | Capabilities::COOPERATIVE_MATRIX;
    let info = Validator::new(ValidationFlags::all(), caps)
        .validate(&module)
        .map_err(|e| e.emit_to_string(&src))?;
    let constants: naga::back::PipelineConstants =
        overrides.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    let (module, info) =
        naga::back::pipeline_constants::process_overrides(&module, &info, None, &constants)
            .map_err(|e| format!("overrides: {e}"))?;
    msl::write_string(
        &module,
        &info,
        &msl::Options {
            lang_version: (2, 4),
            ..Default::default()
        },
        &msl::PipelineOptions::default(),
    )
    .map_err(|e| format!("MSL: {e:?}"))?;
    spv::write_vec(&module, &info, &spv::Options::default(), None)
        .map_err(|e| format!("SPIR-V: {e:?}"))?;
    Ok(())
}

#[test]
fn split_builds_translate() {
    let mut failures = Vec::new();
    let mut check = |name: &str, o: &[(&str, f64)]| {
        if let Err(e) = translate(name, o) {
            failures.push(format!("kernels/{name}.wgsl {o:?}: {e}"));
        }
    };
    for mode in [0.0, 1.0, 2.0] {
        check("gemm_prep", &[("MODE", mode), ("WM", 1.0), ("SPLIT", 1.0)]);
        // the dense tile (x staged, two slices a step: XSN doubled), the
        // narrow and grouped ones (x by fragment loads, one or two slices)
        for (wm, wn, stage_x, sl) in [
            (2.0, 4.0, 1.0, 2.0),
            (2.0, 2.0, 0.0, 2.0),
            (1.0, 1.0, 0.0, 1.0),
        ] {
            let bkp = 16.0 * sl + 8.0;
            let xsn = if stage_x == 1.0 {
                2.0 * 32.0 * wm * 40.0
            } else {
                8.0
            };
            check(
                "gemm_coop",
                &[
                    ("MODE", mode),
                    ("SPLIT", 1.0),
                    ("WM", wm),
                    ("WN", wn),
                    ("STAGE_X", stage_x),
                    ("WG", 32.0 * wm * wn),
                    ("WSN", 64.0 * wn * bkp),
                    ("XSN", xsn),
                    ("CSN", 256.0 * wm * wn),
                    ("SL", sl),
                ],
            );
        }
    }
    for name in ["attention_coop", "attention_coop_f16"] {
        // head_dim 128 / 256 / 512 at 64 dims a warp (ND, NSG)
        for (nd, nsg) in [(2.0, 4.0), (4.0, 2.0), (8.0, 1.0)] {
            check(
                name,
                &[
                    ("SPLIT", 1.0),
                    ("DW", 64.0),
                    ("ND", nd),
                    ("NSG", nsg),
                    ("WG", 32.0 * nd * nsg),
                ],
            );
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
