//! Runs the parity suite (every op, wgpu against the CPU reference) on any
//! adapter: `cargo run --release --example parity -- [FILTER] [--full]
//! [--fast]` (`--fast`: every case at `Precision::Fast`).
//! Pick the adapter with `TURBOSPARK_ADAPTER=<name substring>` and the API
//! with `WGPU_BACKEND=vulkan|metal|dx12`; replay a run with `TURBOSPARK_SEED`.

use turbospark::parity::{all_cases, ci_cases, run_cases, seed_from_env, Status};
use turbospark::ComputeBackend;
use turbospark_cpu::CpuBackend;
use turbospark_wgpu::{WgpuBackend, WgpuOptions};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let full = args.iter().any(|a| a == "--full");
    let fast = args.iter().any(|a| a == "--fast");
    let filter = args
        .iter()
        .find(|a| !a.starts_with("--"))
        .cloned()
        .unwrap_or_default();
    let device = match WgpuBackend::new(&WgpuOptions::default()) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    let info = device.info();
    println!(
        "adapter: {} ({}, {:?}) driver {}",
        info.device_name, info.api, info.device_type, info.driver
    );
    let seed = seed_from_env();
    println!("seed: {seed}");
    let mut cases = if full { all_cases() } else { ci_cases() };
    if fast {
        cases = cases
            .into_iter()
            .map(|c| c.with_precision(turbospark::Precision::Fast))
            .collect();
    }
    let outcomes = run_cases(
        &CpuBackend::parity_reference_for(&device),
        &device,
        &cases,
        &filter,
        seed,
        |o| println!("{o}"),
    );
    let count = |f: fn(&Status) -> bool| outcomes.iter().filter(|o| f(&o.status)).count();
    let (pass, fail, unsup) = (
        count(|s| matches!(s, Status::Pass)),
        count(|s| matches!(s, Status::Fail(_))),
        count(|s| matches!(s, Status::Unsupported(_))),
    );
    println!("{pass} passed, {fail} failed, {unsup} not supported");
    if fail > 0 {
        std::process::exit(1);
    }
}
