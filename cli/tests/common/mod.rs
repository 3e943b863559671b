//! Helpers shared by the CLI's tests: the bundled fixture and the binary
//! run on it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

pub fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tiny-text")
}

/// The binary run with `args`, stdin empty; killed (and the test failed)
/// past 60 s, so a read that blocks shows as a failure, not a hung suite.
pub fn turbospark(args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_turbospark"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the turbospark binary runs");
    let start = Instant::now();
    while child.try_wait().expect("waiting on turbospark").is_none() {
        if start.elapsed() > Duration::from_secs(60) {
            child.kill().ok();
            let out = child.wait_with_output().unwrap();
            panic!(
                "turbospark {args:?} still ran after 60 s; stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// `turbospark generate` on the CPU backend and the checkpoint `dir`.
pub fn generate_on(dir: &Path, args: &[&str]) -> Output {
    let m = dir.display().to_string();
    let mut all = vec!["generate", "--model", &m, "--backend", "cpu"];
    all.extend(args);
    turbospark(&all)
}

/// [`generate_on`] the bundled fixture.
pub fn generate_on_cpu(args: &[&str]) -> Output {
    generate_on(&fixture(), args)
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `turbospark logits` on the CPU backend: `tokens` of checkpoint `model`
/// to `out`.
pub fn logits_with(model: &Path, tokens: &str, out: &Path) -> Output {
    turbospark(&[
        "logits",
        "--model",
        model.to_str().unwrap(),
        "--backend",
        "cpu",
        "--tokens",
        tokens,
        "--out",
        out.to_str().unwrap(),
    ])
}

/// [`logits_with`] the tokens 5, 17, 42.
pub fn logits(model: &Path, out: &Path) -> Output {
    logits_with(model, "5,17,42", out)
}
