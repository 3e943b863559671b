//! `bench --replay-trace`: a routing trace replayed through expert-slot
//! counts and policies without a GPU.

use std::process::Command;

fn bench(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_turbospark"))
        .arg("bench")
        .args(args)
        .output()
        .expect("the turbospark binary runs")
}

fn temp(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("turbospark-{}-{name}", std::process::id()))
}

#[test]
fn replays_a_trace_beside_optimal() {
    let trace = temp("replay.trace");
    let json = temp("replay.json");
    // Two layers; layer 0 cycles through three experts, layer 1 repeats one pair.
    let mut text = String::from("experts 8\n");
    for t in 0..30 {
        text.push_str(&format!("{};4,5\n", t % 3));
    }
    std::fs::write(&trace, text).unwrap();
    let out = bench(&[
        "--replay-trace",
        trace.to_str().unwrap(),
        "--expert-slots",
        "2,3",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    // Two slots: LRU misses every access of the three-expert cycle (30)
    // and the pair only once (2 of 60), optimal misses fewer.
    let lru = &rows[0]["policies"]["lru"];
    assert_eq!(lru["misses"], 32);
    assert_eq!(lru["hits"], 58);
    assert!(rows[0]["optimal"]["misses"].as_u64().unwrap() < 32);
    // Three slots hold layer 0's cycle: 3 + 2 cold misses, whatever the policy.
    for p in ["lfu", "lru"] {
        assert_eq!(rows[1]["policies"][p]["misses"], 5, "{p}");
    }
    assert_eq!(rows[1]["optimal"]["misses"], 5);
    let _ = std::fs::remove_file(&trace);
    let _ = std::fs::remove_file(&json);
}

#[test]
fn a_bad_trace_or_policy_is_named() {
    let trace = temp("bad.trace");
    std::fs::write(&trace, "experts 4\n1,2\n1,7\n").unwrap();
    let out = bench(&["--replay-trace", trace.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 3") && err.contains("\"7\""), "{err}");
    std::fs::write(&trace, "experts 4\n1,2\n").unwrap();
    let out = bench(&[
        "--replay-trace",
        trace.to_str().unwrap(),
        "--policy",
        "fifo",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("\"fifo\""));
    let _ = std::fs::remove_file(&trace);
}

/// `generate --routing-trace` records each forwarded token's experts per
/// MoE layer (the prompt's and each generated token's but the last, which
/// is not forwarded), and the trace replays.
#[test]
fn generate_records_a_trace_that_replays() {
    let trace = temp("generated.trace");
    let model = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/tiny-text")
        .display()
        .to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_turbospark"))
        .args([
            "generate",
            "--model",
            &model,
            "--backend",
            "cpu",
            "--tokens",
            "1,2,3,4,5",
        ])
        .args(["--max-new-tokens", "6", "--ignore-eos", "--routing-trace"])
        .arg(&trace)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&trace).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("experts 8"));
    let tokens: Vec<&str> = lines.collect();
    assert_eq!(tokens.len(), 5 + 6 - 1);
    for t in &tokens {
        let layers: Vec<&str> = t.split(';').collect();
        assert_eq!(layers.len(), 4, "{t}");
        for l in layers {
            let mut ids: Vec<u32> = l.split(',').map(|i| i.parse().unwrap()).collect();
            ids.sort_unstable();
            ids.dedup();
            assert_eq!(ids.len(), 2, "top-2, distinct: {l}");
            assert!(ids.iter().all(|&i| i < 8));
        }
    }
    let out = bench(&[
        "--replay-trace",
        trace.to_str().unwrap(),
        "--expert-slots",
        "2,4",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_file(&trace);
}
