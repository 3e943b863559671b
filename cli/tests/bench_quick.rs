//! `turbospark bench --quick` on the CPU reference and on wgpu (lavapipe in
//! CI): every figure is produced and positive. Speeds are not checked.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

/// The end-to-end arguments of the quick runs: the tiny synthetic model.
const TINY_E2E: [&str; 8] = [
    "--synthetic",
    "tiny",
    "--prompt-tokens",
    "24",
    "--decode-tokens",
    "4",
    "--decode-context",
    "40",
];

/// Run the quick bench on one backend; returns (JSON, SVG, stdout).
fn quick(backend: &str) -> (Value, String, String) {
    quick_with(backend, backend, &TINY_E2E)
}

/// The quick bench on `backend` with `args`, its files named by `tag`.
fn quick_with(backend: &str, tag: &str, args: &[&str]) -> (Value, String, String) {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let json = dir.join(format!("bench-quick-{tag}.json"));
    let svg = dir.join(format!("bench-quick-{tag}.svg"));
    let out = Command::new(env!("CARGO_BIN_EXE_turbospark"))
        .args(["bench", "--quick", "--backend", backend])
        .args(args)
        .arg("--json")
        .arg(&json)
        .arg("--plot")
        .arg(&svg)
        .output()
        .expect("turbospark runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "bench --quick --backend {backend} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("JSON written")).expect("JSON");
    (
        v,
        std::fs::read_to_string(&svg).expect("SVG written"),
        stdout,
    )
}

fn positive(v: &Value, what: &str) {
    let x = v
        .as_f64()
        .unwrap_or_else(|| panic!("{what} is not a number: {v}"));
    assert!(x > 0.0 && x.is_finite(), "{what} = {x}");
}

fn check_timing(t: &Value, what: &str) {
    for k in ["median_s", "p10_s", "p90_s", "min_s", "max_s", "mean_s"] {
        positive(&t[k], &format!("{what} {k}"));
    }
    assert!(t["samples"].as_u64().unwrap_or(0) >= 3, "{what}: {t}");
}

/// Checks the report of one backend; returns how many cases it measured.
fn check(backend: &str, allow_unsupported: bool) -> usize {
    let (v, svg, stdout) = quick(backend);
    assert_eq!(v["mode"], "quick");
    assert_eq!(v["complete"], true);
    assert!(v["date"].as_str().is_some_and(|d| d.len() == 20));
    assert!(v["command_line"].as_array().is_some_and(|a| !a.is_empty()));
    let b = &v["backends"][0];
    assert_eq!(b["name"], backend);
    assert!(b["adapter"].as_str().is_some_and(|s| !s.is_empty()));
    assert_eq!(b["ceiling"]["status"], "ok", "{}", b["ceiling"]);
    positive(&b["ceiling"]["gbps"], "ceiling gbps");
    positive(&b["ceiling"]["bytes"], "ceiling bytes");
    check_timing(&b["ceiling"]["timing"], "ceiling");
    // The host-to-device copy ceiling beside it.
    let up = &b["ceiling"]["host_to_device"];
    positive(&up["gbps"], "host-to-device gbps");
    check_timing(&up["timing"], "host to device");
    // The streaming kernels at op sizes: the GPU's only (the CPU reference's
    // ceiling is one thread's).
    let sizes = b["ceiling"]["at_sizes"].as_array().expect("at_sizes");
    assert_eq!(sizes.is_empty(), backend == "cpu", "{sizes:?}");
    for kernel in ["grid-stride", "fixed"] {
        assert_eq!(
            sizes.iter().any(|z| z["kernel"] == kernel),
            backend == "wgpu",
            "{kernel}: {sizes:?}"
        );
    }
    for z in sizes {
        positive(&z["bytes"], "at_sizes bytes");
        positive(&z["gbps"], "at_sizes gbps");
        positive(&z["pct_of_ceiling"], "at_sizes pct_of_ceiling");
        check_timing(&z["timing"], "at_sizes");
    }
    let cases = v["cases"].as_array().expect("cases");
    assert!(cases.len() >= 40, "{} cases", cases.len());
    let mut measured = 0;
    let mut with_stream = 0;
    for c in cases {
        let label = c["label"].as_str().expect("label");
        assert!(stdout.contains(label), "{label} missing from the table");
        assert!(svg.contains(label), "{label} missing from the plot");
        positive(&c["bytes"], &format!("{label} bytes"));
        let r = &c["results"][backend];
        match r["status"].as_str() {
            Some("ok") => {
                measured += 1;
                check_timing(&r["timing"], label);
                positive(&r["gbps"], &format!("{label} gbps"));
                positive(&r["pct_of_ceiling"], &format!("{label} % of ceiling"));
                // Against the faster streaming kernel at the next size up,
                // where one was measured (the GPU's, for sizes it covers).
                let s = &r["pct_of_stream_at_size"];
                if !s.is_null() {
                    positive(&s["pct"], &format!("{label} % of stream"));
                    positive(&s["stream_bytes"], &format!("{label} stream bytes"));
                    with_stream += 1;
                }
                assert!(r["method"].as_str().is_some(), "{label}: {r}");
                // When the timing began, to the millisecond, and the
                // warm-up's length (none in quick mode, so settled).
                let w = &r["warmup"];
                let at = w["timed_at_utc"].as_str().unwrap_or("");
                let shape = at.len() == 24
                    && at.char_indices().all(|(i, ch)| match i {
                        4 | 7 => ch == '-',
                        10 => ch == 'T',
                        13 | 16 => ch == ':',
                        19 => ch == '.',
                        23 => ch == 'Z',
                        _ => ch.is_ascii_digit(),
                    });
                assert!(shape, "{label}: {w}");
                assert!(
                    w["seconds"].as_f64().is_some_and(|x| x >= 0.0),
                    "{label}: {w}"
                );
                assert_eq!(w["settled"], true, "{label}: {w}");
            }
            Some("unsupported") if allow_unsupported => {}
            _ => panic!("{backend} {label}: {r}"),
        }
    }
    assert_eq!(
        with_stream > 0,
        backend == "wgpu",
        "{with_stream} cases against a stream"
    );
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    // End to end on the tiny synthetic model: every figure present and positive.
    let runs = v["end_to_end"]["runs"].as_array().expect("end-to-end runs");
    assert_eq!(runs.len(), 1, "{}", v["end_to_end"]);
    let e = &runs[0];
    assert_eq!(e["status"], "measured", "{e}");
    for k in [
        "prefill_tok_s",
        "decode_tok_s",
        "bytes_per_token",
        "bandwidth_bound_tok_s",
        "load_seconds",
    ] {
        positive(&e[k], &format!("end to end {k}"));
    }
    // Decode at the longer context asked for (`--decode-context 40`), its
    // bound counting the KV caches that context reads.
    let long = e["decode_at_context"]
        .as_array()
        .expect("decode_at_context");
    assert_eq!(long.len(), 1, "{}", e["decode_at_context"]);
    assert_eq!(long[0]["context"], 40, "{}", long[0]);
    for k in [
        "prefill_tok_s",
        "decode_tok_s",
        "kv_bytes_per_token",
        "bandwidth_bound_tok_s",
    ] {
        positive(&long[0][k], &format!("decode at context 40: {k}"));
    }
    assert!(
        long[0]["bandwidth_bound_tok_s"].as_f64() < e["bandwidth_bound_tok_s"].as_f64(),
        "the KV caches' bytes lower the bound: {e}"
    );
    // The decode-step ablation (a GPU's figures only): a finite cost for
    // every kernel of the step's profile, in its order. The costs are
    // differences of two timings, so on a loaded CPU device they may read
    // negative; only the step itself must be positive.
    let ablation = &e["decode_step_ablation"];
    if backend == "wgpu" {
        // A decode step is one submit (its dispatches recorded as one
        // batch), whatever the prefill did before it.
        let counted = &e["decode_step_counts"];
        assert_eq!(counted["submits_per_step"].as_f64(), Some(1.0), "{counted}");
        positive(&counted["dispatches_per_step"], "decode dispatches a step");
        positive(&ablation["step_us"], "ablation step_us");
        let profiled: Vec<&Value> = e["decode_step_profile"]
            .as_array()
            .expect("decode step profile")
            .iter()
            .map(|k| &k["kernel"])
            .collect();
        let rows = ablation["kernels"].as_array().expect("ablation kernels");
        assert!(
            !rows.is_empty() && rows.len() == profiled.len(),
            "{ablation}"
        );
        // One pair of runs a kernel in quick mode (three otherwise).
        assert_eq!(ablation["pairs_per_kernel"], 1, "{ablation}");
        for (row, kernel) in rows.iter().zip(profiled) {
            assert_eq!(&row["kernel"], kernel, "{ablation}");
            let f = |k: &str| row[k].as_f64().filter(|x| x.is_finite());
            let (us, lo, hi) = (f("us_per_step"), f("us_min"), f("us_max"));
            assert!(us.is_some() && lo.is_some() && hi.is_some(), "{row}");
            assert!(lo <= us && us <= hi, "{row}");
        }
    } else {
        assert!(ablation.is_null(), "{ablation}");
    }
    assert!(
        stdout.contains("end to end: tiny on"),
        "end-to-end line missing from the table"
    );
    measured
}

#[test]
fn quick_bench_on_cpu_measures_every_case() {
    check("cpu", false);
}

/// Whether a wgpu adapter is here: without one, skipped on a developer
/// machine, a failure under CI.
fn have_wgpu() -> bool {
    if let Err(e) = turbospark_wgpu::WgpuBackend::new(&Default::default()) {
        if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") {
            panic!("CI=true but the wgpu backend could not start: {e}");
        }
        eprintln!("SKIPPED (no wgpu adapter; set CI=true to make this a failure): {e}");
        return false;
    }
    true
}

#[test]
fn quick_bench_on_wgpu_measures_every_supported_case() {
    if have_wgpu() {
        // Every op has a wgpu kernel: every case must be measured.
        check("wgpu", false);
    }
}

/// `--kv-cache f16`: the attention cases run on f16 caches and count half
/// the K/V bytes of the f32 run (the same cases otherwise), and the
/// end-to-end model decodes with them.
#[test]
fn quick_bench_with_f16_kv_caches() {
    if !have_wgpu() {
        return;
    }
    let filter = ["--filter", "attn full ctx"];
    let (f32s, _, _) = quick_with("wgpu", "wgpu-kv-f32", &filter);
    let mut args = filter.to_vec();
    args.extend(["--kv-cache", "f16"]);
    args.extend(TINY_E2E);
    let (f16s, _, stdout) = quick_with("wgpu", "wgpu-kv-f16", &args);
    assert_eq!(f32s["kv_cache"], "f32");
    assert_eq!(f16s["kv_cache"], "f16");
    assert!(stdout.contains("f16 KV caches"), "{stdout}");
    let (a, b) = (
        f32s["cases"].as_array().expect("cases"),
        f16s["cases"].as_array().expect("cases"),
    );
    assert!(
        !a.is_empty() && a.len() == b.len(),
        "{} / {}",
        a.len(),
        b.len()
    );
    for (c32, c16) in a.iter().zip(b) {
        let label = c16["label"].as_str().expect("label");
        assert_eq!(c32["label"], c16["label"]);
        assert_eq!(c16["results"]["wgpu"]["status"], "ok", "{label}: {c16}");
        let (x, y) = (c32["bytes"].as_f64(), c16["bytes"].as_f64());
        assert!(
            y.is_some_and(|y| y > 0.0) && y < x,
            "{label}: {y:?} bytes with f16 caches, {x:?} with f32"
        );
    }
    let e = &f16s["end_to_end"]["runs"][0];
    assert_eq!(e["kv_cache"], "f16", "{e}");
    positive(&e["decode_tok_s"], "decode tok/s with f16 caches");
    positive(
        &e["decode_at_context"][0]["decode_tok_s"],
        "decode at context 40 with f16 caches",
    );
}

/// `--parallel 1,3,6`: aggregate and per-stream decode rates of streams
/// stepped together on the tiny synthetic model (6 streams: two passes a
/// step at its prefill batch of 4), in the JSON.
#[test]
fn parallel_decode_throughput_on_cpu() {
    let json = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bench-parallel-cpu.json");
    let out = Command::new(env!("CARGO_BIN_EXE_turbospark"))
        .args(["bench", "--backend", "cpu", "--synthetic", "tiny"])
        .args(["--prompt-tokens", "6", "--decode-tokens", "4"])
        .args(["--prefill-batch", "4", "--parallel", "1,3,6", "--json"])
        .arg(&json)
        .output()
        .expect("turbospark runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("JSON written")).expect("JSON");
    let runs = v["parallel"].as_array().expect("parallel runs");
    let streams: Vec<u64> = runs.iter().filter_map(|r| r["streams"].as_u64()).collect();
    assert_eq!(streams, [1, 3, 6], "{v}");
    for r in runs {
        positive(&r["aggregate_tok_s"], "aggregate tok/s");
        positive(&r["per_stream_tok_s"], "per-stream tok/s");
        let (agg, one) = (
            r["aggregate_tok_s"].as_f64(),
            r["per_stream_tok_s"].as_f64(),
        );
        let n = r["streams"].as_f64().unwrap();
        assert!(
            (agg.unwrap() - n * one.unwrap()).abs() <= 1e-6 * agg.unwrap(),
            "{r}"
        );
    }
    assert_eq!(runs[2]["passes_a_step"], 2, "{v}");
    // (a stream count of 0 is refused by name)
    let out = Command::new(env!("CARGO_BIN_EXE_turbospark"))
        .args([
            "bench",
            "--backend",
            "cpu",
            "--synthetic",
            "tiny",
            "--parallel",
            "0",
        ])
        .output()
        .expect("turbospark runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--parallel"), "{err}");
}

/// `--serve`: one stream through `generate`'s path and through the server
/// on the same loaded tiny synthetic model (the reply checked to be the
/// same tokens inside the bench), both timings and their ratios in the
/// JSON.
#[test]
fn serve_against_generate_on_cpu() {
    let json = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bench-serve-cpu.json");
    let out = Command::new(env!("CARGO_BIN_EXE_turbospark"))
        .args(["bench", "--backend", "cpu", "--synthetic", "tiny"])
        .args([
            "--prompt-tokens",
            "5",
            "--decode-tokens",
            "12",
            "--serve",
            "--json",
        ])
        .arg(&json)
        .output()
        .expect("turbospark runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("JSON written")).expect("JSON");
    for path in ["generate", "serve"] {
        for what in ["ttft_ms", "last_token_ms"] {
            positive(&v[path][what], &format!("{path} {what}"));
        }
    }
    for what in ["ttft", "last_token"] {
        positive(&v["serve_over_generate"][what], what);
    }
    positive(&v["generate"]["decode_tok_s"], "generate decode_tok_s");
    // (the client may read a fast model's whole reply at once on a loaded
    // machine: then no decode rate, and none against generate's)
    let served = &v["serve"]["decode_tok_s"];
    if served.is_null() {
        assert!(v["serve_over_generate"]["decode"].is_null(), "{v}");
    } else {
        positive(served, "serve decode_tok_s");
        positive(&v["serve_over_generate"]["decode"], "decode");
    }
    assert_eq!(v["decode_tokens"], 12, "{v}");
}
