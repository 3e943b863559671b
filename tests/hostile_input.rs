//! Hostile input to the library: a context whose KV caches the backend
//! cannot hold is refused at load with the figure and the limit (it
//! aborted in the allocator), `max_position_embeddings` is validated, and
//! a checkpoint changed under its memory maps is told, naming the file.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

#[path = "common/temp_dir.rs"]
mod temp_dir;

use temp_dir::TempDir;
use turbospark::model::synthetic::tiny_config;
use turbospark::model::TensorSource;
use turbospark::model::{Checkpoint, ModelConfig, ModelOptions, OneSequence, SyntheticSource};
use turbospark::Error;
use turbospark_cpu::CpuBackend;

#[test]
fn caches_past_the_machine_are_refused_before_allocation() {
    let src = SyntheticSource::new(tiny_config(), 7).unwrap();
    let opts = ModelOptions {
        max_context: u32::MAX as usize,
        ..Default::default()
    };
    match OneSequence::load(CpuBackend::new(), &src, opts) {
        Err(Error::DeviceLimit {
            what, bytes, limit, ..
        }) => {
            assert!(what.contains("max_context 4294967295"), "{what}");
            // The full layer's K and V caches alone: 2 x 32 x 4 bytes a slot.
            assert!(bytes >= 256 * u32::MAX as u64, "{bytes}");
            assert!(limit < bytes);
        }
        Err(e) => panic!("expected a DeviceLimit error, got {e}"),
        Ok(_) => panic!("a 1 TiB KV cache was accepted"),
    }
    // A sane context still loads.
    let opts = ModelOptions {
        max_context: 64,
        ..Default::default()
    };
    assert!(OneSequence::load(CpuBackend::new(), &src, opts).is_ok());
}

/// A text-only config with `max_position_embeddings` set to `v` (absent
/// when None).
fn config_with(v: Option<serde_json::Value>) -> String {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/tiny-text/config.json"
    );
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let obj = cfg.as_object_mut().unwrap();
    match v {
        Some(v) => obj.insert("max_position_embeddings".into(), v),
        None => obj.remove("max_position_embeddings"),
    };
    cfg.to_string()
}

#[test]
fn max_position_embeddings_is_validated() {
    let ok = config_with(Some(serde_json::json!(4096)));
    assert!(ModelConfig::from_json(&ok, "config.json").is_ok());
    assert_eq!(
        ModelConfig::max_position_embeddings(&ok, "config.json").unwrap(),
        Some(4096)
    );
    let absent = config_with(None);
    assert!(ModelConfig::from_json(&absent, "config.json").is_ok());
    assert_eq!(
        ModelConfig::max_position_embeddings(&absent, "config.json").unwrap(),
        None
    );
    for (v, needle) in [
        (serde_json::json!(0), "0 is outside 1..="),
        (serde_json::json!(-1), "found -1"),
        (serde_json::json!("abc"), "found \"abc\""),
        (serde_json::json!(4096.5), "found 4096.5"),
        (
            serde_json::json!(1u64 << 62),
            "4611686018427387904 is outside",
        ),
    ] {
        let text = config_with(Some(v.clone()));
        for e in [
            ModelConfig::from_json(&text, "config.json").unwrap_err(),
            ModelConfig::max_position_embeddings(&text, "config.json").unwrap_err(),
        ] {
            let msg = e.to_string();
            assert!(matches!(e, Error::Config { .. }), "{v}: {msg}");
            assert!(
                msg.contains("config.json") && msg.contains("`max_position_embeddings`"),
                "{v}: {msg}"
            );
            assert!(msg.contains(needle), "{v}: {msg}");
        }
    }
}

/// The multimodal spelling keeps it under text_config.
#[test]
fn max_position_embeddings_of_a_multimodal_config() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/tiny-multimodal/config.json"
    );
    let text = std::fs::read_to_string(path).unwrap();
    assert_eq!(
        ModelConfig::max_position_embeddings(&text, path).unwrap(),
        Some(4096)
    );
    let mut cfg: serde_json::Value = serde_json::from_str(&text).unwrap();
    cfg["text_config"]["max_position_embeddings"] = serde_json::json!(0);
    let e = ModelConfig::from_json(&cfg.to_string(), path).unwrap_err();
    assert!(
        e.to_string()
            .contains("`text_config.max_position_embeddings`"),
        "{e}"
    );
}

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-text")
}

/// A copy of the tiny fixture in a directory of its own.
fn fixture_copy(name: &str) -> TempDir {
    TempDir::copy_of(&fixture(), &format!("hostile-input-{name}"))
}

fn assert_changed(ck: &Checkpoint, weights: &Path, needle: &str) {
    for e in [
        ck.check_unchanged().unwrap_err(),
        TensorSource::check_unchanged(ck).unwrap_err(),
    ] {
        let msg = e.to_string();
        assert!(matches!(e, Error::Checkpoint { .. }), "{msg}");
        assert!(msg.contains(&weights.display().to_string()), "{msg}");
        assert!(msg.contains(needle), "{msg}");
    }
}

/// A mapped file truncated, or rewritten in place with the same size, is
/// an error naming it (reading its map would fault or give other weights);
/// untouched, or replaced by a rename (the map keeps the old file), it is
/// not.
#[test]
fn a_checkpoint_changed_under_its_maps_is_told() {
    let copy = fixture_copy("truncated");
    let dir = copy.path();
    let weights = dir.join("model.safetensors");
    let ck = Checkpoint::open(dir).unwrap();
    ck.check_unchanged().unwrap();
    let len = std::fs::metadata(&weights).unwrap().len();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&weights)
        .unwrap();
    f.set_len(len / 2).unwrap();
    assert_changed(
        &ck,
        &weights,
        &format!(
            "truncated on disk while the run maps it ({len} bytes when opened, {} now",
            len / 2
        ),
    );

    // The same bytes written again: only the modification time tells
    // (set a second later, past any file system's timestamp granularity).
    let copy = fixture_copy("rewritten");
    let dir = copy.path();
    let weights = dir.join("model.safetensors");
    let ck = Checkpoint::open(dir).unwrap();
    let bytes = std::fs::read(&weights).unwrap();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&weights)
        .unwrap();
    std::io::Write::write_all(&mut &f, &bytes).unwrap();
    f.set_modified(SystemTime::now() + Duration::from_secs(1))
        .unwrap();
    assert_changed(&ck, &weights, "modification time changed");

    // Replaced by a rename: the map still reads the file it mapped.
    let copy = fixture_copy("renamed");
    let dir = copy.path();
    let weights = dir.join("model.safetensors");
    let ck = Checkpoint::open(dir).unwrap();
    let other = dir.join("other.safetensors");
    std::fs::write(&other, b"not the weights").unwrap();
    std::fs::rename(&other, &weights).unwrap();
    ck.check_unchanged().unwrap();
    assert_eq!(ck.mapped_files().len(), 1);
    assert_eq!(ck.mapped_files()[0].path(), weights);

    // A source without files: nothing to change.
    let src = SyntheticSource::new(tiny_config(), 7).unwrap();
    src.check_unchanged().unwrap();
}
