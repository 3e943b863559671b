//! Shared test setup: the wgpu backend, which must exist under CI.

use turbospark_wgpu::{WgpuBackend, WgpuOptions};

/// The wgpu backend on the preferred adapter. Without one, the test is
/// skipped on a developer machine but FAILS under `CI=true`: CI must run
/// every GPU test on a real adapter (lavapipe at least).
pub fn wgpu_backend() -> Option<WgpuBackend> {
    match WgpuBackend::new(&WgpuOptions::default()) {
        Ok(b) => {
            eprintln!("wgpu adapter: {} ({})", b_info(&b), b_api(&b));
            Some(b)
        }
        Err(e) if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") => {
            panic!("CI=true but the wgpu backend could not start: {e}")
        }
        Err(e) => {
            eprintln!("SKIPPED (no wgpu adapter; set CI=true to make this a failure): {e}");
            None
        }
    }
}

fn b_info(b: &WgpuBackend) -> String {
    use turbospark::ComputeBackend;
    b.info().device_name.clone()
}

fn b_api(b: &WgpuBackend) -> String {
    use turbospark::ComputeBackend;
    b.info().api.clone()
}
