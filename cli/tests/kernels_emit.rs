//! `turbospark kernels --emit DIR`: every module the wgpu backend may
//! compile is written exactly as the backend composes it, and the manifest
//! describes each of them (features, what only wgpu offers, entry points,
//! override sets, those of a pipeline log among them).

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;
use turbospark_wgpu::kernels::builds;

fn turbospark(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_turbospark"))
        .args(args)
        .output()
        .expect("the turbospark binary runs")
}

fn emit(dir: &Path, extra: &[&str]) -> Output {
    let d = dir.display().to_string();
    let mut args = vec!["kernels", "--emit", &d];
    args.extend(extra);
    turbospark(&args)
}

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("turbospark-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn manifest(dir: &Path) -> Value {
    let text = std::fs::read_to_string(dir.join("manifest.json")).expect("manifest.json written");
    serde_json::from_str(&text).expect("manifest.json is JSON")
}

#[test]
fn emit_writes_every_build_as_composed_with_a_manifest() {
    let dir = scratch("emit");
    let out = emit(&dir, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let m = manifest(&dir);
    let modules = m["modules"].as_array().expect("modules");
    let all = builds();
    assert_eq!(modules.len(), all.len());
    for b in &all {
        let text = std::fs::read_to_string(dir.join(b.file_name())).expect("module written");
        assert_eq!(
            text,
            b.source(),
            "{} differs from the backend's text",
            b.file_name()
        );
        let entry = modules
            .iter()
            .find(|e| e["file"] == b.file_name().as_str())
            .unwrap_or_else(|| panic!("{} not in the manifest", b.file_name()));
        let entries = entry["entry_points"].as_array().expect("entry_points");
        assert!(!entries.is_empty(), "{}: no entry points", b.file_name());
        for e in entries {
            let sets = e["overrides"].as_array().expect("overrides");
            assert_eq!(
                sets.len(),
                1,
                "{}: only the defaults without a log",
                b.file_name()
            );
            assert_eq!(e["recorded"], false);
        }
        // Cooperative matrices and coherent storage have no WebGPU
        // equivalent: named, so a WebGPU compiler skips just those.
        let coop = text.contains("enable wgpu_cooperative_matrix;");
        assert_eq!(
            entry["wgpu_only"].is_null(),
            !coop && !b.coherent,
            "{}",
            b.file_name()
        );
        let f16 = text.lines().any(|l| l.trim() == "enable f16;");
        let features = entry["features"].as_array().expect("features");
        assert_eq!(features.contains(&"shader-f16".into()), f16);
        assert_eq!(features.contains(&"subgroups".into()), b.subgroups);
    }
    // The variants the backend composes are all there.
    for f in [
        "gemm.wgsl",
        "gemm.subgroups.wgsl",
        "attention.coherent.wgsl",
        "rope_f16.wgsl",
    ] {
        assert!(dir.join(f).is_file(), "{f} missing");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn emit_lists_the_override_sets_a_pipeline_log_recorded() {
    let dir = scratch("emit-log");
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let log = dir.join("pipelines.log");
    std::fs::write(
        &log,
        "{\"family\":\"gemv\",\"module\":\"gemv.wgsl\",\"entry\":\"gemv\",\"constants\":{\"RL\":64,\"GBK\":0}}\n\
         {\"family\":\"gemv\",\"module\":\"gemv.subgroups.wgsl\",\"entry\":\"gemv\",\"constants\":{\"RL\":64,\"GBK\":0}}\n\
         {\"family\":\"gemv\",\"module\":\"gemv.wgsl\",\"entry\":\"gemv\",\"constants\":{\"RL\":32,\"GBK\":128}}\n",
    )
    .expect("log written");
    let out = emit(&dir, &["--pipelines", &log.display().to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let m = manifest(&dir);
    for file in ["gemv.wgsl", "gemv.subgroups.wgsl"] {
        let module = m["modules"]
            .as_array()
            .expect("modules")
            .iter()
            .find(|e| e["file"] == file)
            .expect("gemv in the manifest");
        let gemv = module["entry_points"]
            .as_array()
            .expect("entry_points")
            .iter()
            .find(|e| e["name"] == "gemv")
            .expect("gemv entry point");
        assert_eq!(gemv["recorded"], true);
        let sets = gemv["overrides"].as_array().expect("overrides");
        assert_eq!(sets.len(), 2, "{file}: {sets:?}");
        assert!(sets.iter().any(|s| s["RL"] == 32 && s["GBK"] == 128));
        assert!(sets.iter().any(|s| s["RL"] == 64 && s["GBK"] == 0));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_bad_pipeline_log_is_an_error_that_names_the_line() {
    let dir = scratch("emit-bad");
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let log = dir.join("pipelines.log");
    std::fs::write(
        &log,
        "{\"family\":\"gemv\",\"entry\":\"gemv\",\"constants\":{}}\nnot json\n",
    )
    .expect("log written");
    let out = emit(&dir, &["--pipelines", &log.display().to_string()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("pipelines.log:2"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let missing = emit(&dir, &["--pipelines", "/nonexistent/pipelines.log"]);
    assert!(String::from_utf8_lossy(&missing.stderr).contains("cannot read pipeline log"));
    let _ = std::fs::remove_dir_all(&dir);
}
