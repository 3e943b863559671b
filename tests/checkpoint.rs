//! Checkpoint loading: the committed fixtures in both prefix spellings,
//! synthetic single-file and sharded checkpoints, every bad-input case as its
//! own test (the error must be `Error::Checkpoint` naming the file and the
//! tensor), and property tests that throw random and mutated safetensors
//! headers at `Checkpoint::open`, which must return Ok or Err and never panic.

mod common;

use std::path::{Path, PathBuf};

use proptest::prelude::*;
use safetensors::{Dtype, SafeTensors};
use turbospark::model::checkpoint::expected_tensors;
use turbospark::model::{Checkpoint, ModelConfig};
use turbospark::{DType, Error};

use common::temp_dir::TempDir;

// ---- helpers ---------------------------------------------------------------

/// A tiny config with every feature on: MoE, a sliding and a k_eq_v full layer.
fn tiny_config_json(tie: bool) -> String {
    serde_json::json!({
        "architectures": ["Gemma4ForCausalLM"],
        "model_type": "gemma4_text",
        "hidden_size": 8,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 4,
        "global_head_dim": 8,
        "num_global_key_value_heads": 1,
        "attention_k_eq_v": true,
        "intermediate_size": 6,
        "enable_moe_block": true,
        "num_experts": 4,
        "top_k_experts": 2,
        "moe_intermediate_size": 4,
        "vocab_size": 16,
        "hidden_size_per_layer_input": 0,
        "layer_types": ["sliding_attention", "full_attention"],
        "sliding_window": 4,
        "final_logit_softcapping": 30.0,
        "tie_word_embeddings": tie
    })
    .to_string()
}

/// An owned tensor to serialize: full name, dtype, shape, bytes.
#[derive(Clone, Debug)]
struct Raw {
    name: String,
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

fn dtype_size(d: Dtype) -> usize {
    d.bitsize() / 8
}

/// Every tensor `cfg` needs, under `prefix`, filled with a byte pattern
/// distinct per tensor.
fn tensors_for(cfg: &ModelConfig, prefix: &str, dtype: Dtype) -> Vec<Raw> {
    expected_tensors(cfg)
        .into_iter()
        .enumerate()
        .map(|(i, (name, shape))| {
            let n: usize = shape.iter().product::<usize>() * dtype_size(dtype);
            let full = if name == "lm_head.weight" {
                name
            } else {
                format!("{prefix}{name}")
            };
            Raw {
                name: full,
                dtype,
                shape,
                data: (0..n).map(|b| (b * 7 + i * 13) as u8).collect(),
            }
        })
        .collect()
}

fn serialize(tensors: &[Raw]) -> Vec<u8> {
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|t| {
            (
                t.name.clone(),
                safetensors::tensor::TensorView::new(t.dtype, t.shape.clone(), &t.data).unwrap(),
            )
        })
        .collect();
    safetensors::serialize(views, None).unwrap()
}

/// A safetensors file from a hand-written header (lies allowed) and data.
fn raw_file(header: &str, data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

fn write(dir: &Path, name: &str, bytes: &[u8]) {
    std::fs::write(dir.join(name), bytes).unwrap();
}

/// A synthetic single-file checkpoint after `edit` has had its way with the tensors.
fn single_file_ckpt(tie: bool, edit: impl FnOnce(&mut Vec<Raw>)) -> TempDir {
    let dir = TempDir::new("ckpt-test");
    let json = tiny_config_json(tie);
    let cfg = ModelConfig::from_json(&json, "tiny").unwrap();
    let mut t = tensors_for(&cfg, "model.", Dtype::BF16);
    edit(&mut t);
    write(dir.path(), "config.json", json.as_bytes());
    write(dir.path(), "model.safetensors", &serialize(&t));
    dir
}

/// The bytes of a valid tiny single-file checkpoint (for mutation).
fn valid_file_bytes() -> Vec<u8> {
    let cfg = ModelConfig::from_json(&tiny_config_json(true), "tiny").unwrap();
    serialize(&tensors_for(&cfg, "model.", Dtype::BF16))
}

/// Asserts `Error::Checkpoint` whose path ends with `file` and whose message
/// names every one of `culprits`.
fn assert_ckpt_err(r: turbospark::Result<Checkpoint>, file: &str, culprits: &[&str]) {
    match r {
        Err(Error::Checkpoint { path, detail }) => {
            assert!(
                path.ends_with(file),
                "error path {path:?} is not {file:?} ({detail})"
            );
            for c in culprits {
                assert!(detail.contains(c), "message {detail:?} does not name {c:?}");
            }
        }
        Err(e) => panic!("expected Error::Checkpoint naming {culprits:?}, got {e:?}"),
        Ok(c) => panic!("expected Error::Checkpoint naming {culprits:?}, opened {c:?}"),
    }
}

fn fixture(name: &str) -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    if p.join("config.json").exists() {
        Some(p)
    } else {
        eprintln!("skipping: fixture {} not present", p.display());
        None
    }
}

/// Every expected tensor comes back with the config's shape, a float dtype,
/// and exactly the bytes the file holds under its full name.
fn check_all_tensors(ckpt: &Checkpoint, files: &[PathBuf]) {
    let contents: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(f).unwrap()).collect();
    let parsed: Vec<SafeTensors<'_>> = contents
        .iter()
        .map(|c| SafeTensors::deserialize(c).unwrap())
        .collect();
    let mut total = 0u64;
    for (name, shape) in expected_tensors(ckpt.config()) {
        let t = ckpt.tensor(&name).unwrap();
        assert_eq!(t.name, name);
        assert_eq!(t.shape, shape, "{name}");
        assert!(t.dtype.is_float());
        assert_eq!(
            t.bytes.as_slice().len(),
            t.numel() * t.dtype.size(),
            "{name}"
        );
        let full = if name == "lm_head.weight" {
            name.clone()
        } else {
            format!("{}{name}", ckpt.prefix())
        };
        let want = parsed.iter().find_map(|p| p.tensor(&full).ok()).unwrap();
        assert_eq!(t.bytes.as_slice(), want.data(), "{name}");
        assert!(matches!(t.bytes, turbospark::HostBytes::Mapped { .. }));
        total += t.bytes.as_slice().len() as u64;
    }
    assert_eq!(ckpt.total_bytes(), total);
}

// ---- good checkpoints --------------------------------------------------------

#[test]
fn opens_text_fixture() {
    let Some(dir) = fixture("tiny-text") else {
        return;
    };
    let ckpt = Checkpoint::open(&dir).unwrap();
    assert_eq!(ckpt.prefix(), "model.");
    assert_eq!(ckpt.dir(), dir.as_path());
    assert_eq!(ckpt.config().layers.len(), 4);
    check_all_tensors(&ckpt, &[dir.join("model.safetensors")]);
    let e = ckpt.tensor("embed_tokens.weight").unwrap();
    assert_eq!(e.dtype, DType::BF16);
    assert_eq!(e.shape, vec![512, 64]);
}

#[test]
fn opens_multimodal_sharded_fixture() {
    let Some(dir) = fixture("tiny-multimodal") else {
        return;
    };
    let ckpt = Checkpoint::open(&dir).unwrap();
    assert_eq!(ckpt.prefix(), "model.language_model.");
    let files = [
        dir.join("model-00001-of-00002.safetensors"),
        dir.join("model-00002-of-00002.safetensors"),
    ];
    check_all_tensors(&ckpt, &files);
    // The vision tensor is ignored, under either spelling.
    assert!(ckpt.tensor("embed_vision.dummy.weight").is_err());
    assert!(ckpt.tensor("model.embed_vision.dummy.weight").is_err());
}

#[test]
fn opens_synthetic_single_file() {
    let dir = single_file_ckpt(true, |_| {});
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    check_all_tensors(&ckpt, &[dir.path().join("model.safetensors")]);
    assert!(ckpt.tensor("self_attn.q_proj.weight").is_err());
    assert!(
        ckpt.tensor("layers.1.self_attn.v_proj.weight").is_err(),
        "k_eq_v layer has no v_proj"
    );
    assert!(ckpt.tensor("layers.0.self_attn.v_proj.weight").is_ok());
}

/// `generation_config.json`'s end tokens join config.json's (transformers'
/// generate stops at those); a bad one is an error naming the file and
/// the field, before any weight is read.
#[test]
fn generation_config_adds_its_end_tokens() {
    let dir = single_file_ckpt(true, |_| {});
    let own = Checkpoint::open(dir.path())
        .unwrap()
        .config()
        .eos_token_ids
        .clone();
    write(
        dir.path(),
        "generation_config.json",
        br#"{"bos_token_id": 2, "eos_token_id": [1, 7, 9]}"#,
    );
    let ids = Checkpoint::open(dir.path())
        .unwrap()
        .config()
        .eos_token_ids
        .clone();
    let mut want = own.clone();
    for id in [1, 7, 9] {
        if !want.contains(&id) {
            want.push(id);
        }
    }
    assert_eq!(ids, want);
    assert!(ids.contains(&7) && ids.contains(&9), "{ids:?}");
    for (text, culprit) in [
        (&br#"{"eos_token_id": 16}"#[..], "past the vocabulary"),
        (&br#"{"eos_token_id": "x"}"#[..], "eos_token_id"),
        (&b"{not json"[..], "not valid JSON"),
    ] {
        write(dir.path(), "generation_config.json", text);
        match Checkpoint::open(dir.path()) {
            Err(Error::Config { path, detail }) => {
                assert!(path.ends_with("generation_config.json"), "{path}");
                assert!(detail.contains(culprit), "{detail}");
            }
            other => panic!("expected Error::Config, got {other:?}"),
        }
    }
}

#[test]
fn f16_and_f32_weights_are_accepted() {
    for (st, dt) in [(Dtype::F16, DType::F16), (Dtype::F32, DType::F32)] {
        let dir = single_file_ckpt(true, |t| {
            for r in t.iter_mut() {
                r.dtype = st;
                r.data = vec![0x3c; r.shape.iter().product::<usize>() * dtype_size(st)];
            }
        });
        let ckpt = Checkpoint::open(dir.path()).unwrap();
        assert_eq!(ckpt.tensor("norm.weight").unwrap().dtype, dt);
        check_all_tensors(&ckpt, &[dir.path().join("model.safetensors")]);
    }
}

#[test]
fn mixed_dtypes_are_accepted() {
    let dir = single_file_ckpt(true, |t| {
        let r = t
            .iter_mut()
            .find(|r| r.name == "model.layers.0.layer_scalar")
            .unwrap();
        r.dtype = Dtype::F32;
        r.data = 1.5f32.to_le_bytes().to_vec();
    });
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let s = ckpt.tensor("layers.0.layer_scalar").unwrap();
    assert_eq!(s.dtype, DType::F32);
    assert_eq!(s.bytes.as_slice(), 1.5f32.to_le_bytes());
}

#[test]
fn extra_and_vision_tensors_are_ignored() {
    let dir = single_file_ckpt(true, |t| {
        t.push(Raw {
            name: "model.vision_tower.x.weight".into(),
            dtype: Dtype::I64,
            shape: vec![3],
            data: vec![0; 24],
        });
        t.push(Raw {
            name: "model.layers.1.self_attn.v_proj.weight".into(),
            dtype: Dtype::BF16,
            shape: vec![8, 8],
            data: vec![0; 128],
        });
    });
    let ck = Checkpoint::open(dir.path()).unwrap();
    // (the vision tower is not the language model's; the extra v_proj is)
    assert_eq!(
        ck.unused_tensors(),
        vec!["layers.1.self_attn.v_proj.weight"]
    );
}

/// Every fixture, plain or MLX-quantized, uses all it stores; with the MoE
/// block switched off in config.json the experts are named as unused.
#[test]
fn unused_tensors_are_named() {
    for name in [
        "tiny-text",
        "tiny-multimodal",
        "tiny-text-q4",
        "tiny-multimodal-mixed",
    ] {
        let dir = fixture(name).expect("fixture");
        let ck = Checkpoint::open(&dir).unwrap();
        assert!(
            ck.unused_tensors().is_empty(),
            "{name}: {:?}",
            ck.unused_tensors()
        );
    }
    let dir = q4_copy(|c| c["enable_moe_block"] = false.into(), |_| {});
    let ck = Checkpoint::open(dir.path()).unwrap();
    let unused = ck.unused_tensors();
    assert!(
        unused.iter().any(|n| n.contains("experts.switch_glu"))
            && unused.iter().any(|n| n.contains("router")),
        "{unused:?}"
    );
}

#[test]
fn untied_head_is_required_and_served() {
    let dir = single_file_ckpt(false, |_| {});
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    assert!(!ckpt.config().tie_embeddings);
    assert_eq!(ckpt.tensor("lm_head.weight").unwrap().shape, vec![16, 8]);

    let dir = single_file_ckpt(false, |t| t.retain(|r| r.name != "lm_head.weight"));
    assert_ckpt_err(
        Checkpoint::open(dir.path()),
        "model.safetensors",
        &["lm_head.weight", "missing", "[16, 8]"],
    );
}

/// Writes `tensors` as a two-shard checkpoint with an index; `edit_index`
/// may change the weight_map before it is written.
fn sharded_ckpt(
    prefix: &str,
    edit_index: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>),
) -> TempDir {
    let dir = TempDir::new("ckpt-test");
    let json = tiny_config_json(true);
    let cfg = ModelConfig::from_json(&json, "tiny").unwrap();
    let mut t = tensors_for(&cfg, prefix, Dtype::BF16);
    t.push(Raw {
        name: "model.vision_tower.patch.weight".into(),
        dtype: Dtype::F32,
        shape: vec![2],
        data: vec![0; 8],
    });
    let half = t.len() / 2;
    let (a, b) = t.split_at(half);
    let names = [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ];
    let mut map = serde_json::Map::new();
    for (part, file) in [a, b].iter().zip(names) {
        write(dir.path(), file, &serialize(part));
        for r in part.iter() {
            map.insert(r.name.clone(), file.into());
        }
    }
    edit_index(&mut map);
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": map});
    write(dir.path(), "config.json", json.as_bytes());
    write(
        dir.path(),
        "model.safetensors.index.json",
        index.to_string().as_bytes(),
    );
    dir
}

#[test]
fn opens_synthetic_sharded_in_both_prefixes() {
    for prefix in ["model.", "model.language_model."] {
        let dir = sharded_ckpt(prefix, |_| {});
        let ckpt = Checkpoint::open(dir.path()).unwrap();
        assert_eq!(ckpt.prefix(), prefix);
        assert_eq!(ckpt.files().len(), 2);
        check_all_tensors(
            &ckpt,
            &[
                dir.path().join("model-00001-of-00002.safetensors"),
                dir.path().join("model-00002-of-00002.safetensors"),
            ],
        );
    }
}

// ---- bad input: each its own test -------------------------------------------

#[test]
fn missing_config() {
    let dir = single_file_ckpt(true, |_| {});
    std::fs::remove_file(dir.path().join("config.json")).unwrap();
    let name = dir
        .path()
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    assert_ckpt_err(Checkpoint::open(dir.path()), &name, &["config.json"]);
}

#[test]
fn bad_config_is_a_config_error() {
    let dir = single_file_ckpt(true, |_| {});
    write(
        dir.path(),
        "config.json",
        tiny_config_json(true)
            .replace("\"num_experts\":4", "\"num_experts\":1")
            .as_bytes(),
    );
    match Checkpoint::open(dir.path()) {
        Err(Error::Config { path, detail }) => {
            assert!(path.ends_with("config.json"));
            assert!(detail.contains("top_k_experts"), "{detail}");
        }
        other => panic!("expected Error::Config, got {other:?}"),
    }
}

#[test]
fn missing_weights() {
    let dir = single_file_ckpt(true, |_| {});
    std::fs::remove_file(dir.path().join("model.safetensors")).unwrap();
    let name = dir
        .path()
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    assert_ckpt_err(Checkpoint::open(dir.path()), &name, &["model.safetensors"]);
}

#[test]
fn missing_tensor() {
    let dir = single_file_ckpt(true, |t| {
        t.retain(|r| r.name != "model.layers.1.mlp.up_proj.weight")
    });
    assert_ckpt_err(
        Checkpoint::open(dir.path()),
        "model.safetensors",
        &["model.layers.1.mlp.up_proj.weight", "missing", "[6, 8]"],
    );
}

#[test]
fn missing_v_proj_on_a_sliding_layer() {
    let dir = single_file_ckpt(true, |t| {
        t.retain(|r| r.name != "model.layers.0.self_attn.v_proj.weight")
    });
    assert_ckpt_err(
        Checkpoint::open(dir.path()),
        "model.safetensors",
        &["model.layers.0.self_attn.v_proj.weight"],
    );
}

#[test]
fn misshapen_tensor() {
    let dir = single_file_ckpt(true, |t| {
        let r = t
            .iter_mut()
            .find(|r| r.name == "model.layers.0.self_attn.q_proj.weight")
            .unwrap();
        r.shape = vec![4, 16]; // same element count as [8, 8], wrong shape
    });
    assert_ckpt_err(
        Checkpoint::open(dir.path()),
        "model.safetensors",
        &[
            "model.layers.0.self_attn.q_proj.weight",
            "[4, 16]",
            "expected [8, 8]",
        ],
    );
}

#[test]
fn misshapen_experts() {
    let dir = single_file_ckpt(true, |t| {
        let r = t
            .iter_mut()
            .find(|r| r.name == "model.layers.1.experts.gate_up_proj")
            .unwrap();
        r.shape = vec![4, 4, 16]; // gate and up side by side instead of stacked
    });
    assert_ckpt_err(
        Checkpoint::open(dir.path()),
        "model.safetensors",
        &[
            "model.layers.1.experts.gate_up_proj",
            "[4, 4, 16]",
            "expected [4, 8, 8]",
        ],
    );
    let dir = single_file_ckpt(true, |t| {
        let r = t
            .iter_mut()
            .find(|r| r.name == "model.layers.1.experts.down_proj")
            .unwrap();
        r.shape = vec![128];
    });
    assert_ckpt_err(
        Checkpoint::open(dir.path()),
        "model.safetensors",
        &[
            "model.layers.1.experts.down_proj",
            "[128]",
            "expected [4, 8, 4]",
        ],
    );
}

#[test]
fn wrong_dtype() {
    for (st, shown) in [
        (Dtype::F64, "F64"),
        (Dtype::I16, "I16"),
        (Dtype::U32, "U32"),
    ] {
        let dir = single_file_ckpt(true, |t| {
            let r = t
                .iter_mut()
                .find(|r| r.name == "model.norm.weight")
                .unwrap();
            r.dtype = st;
            r.data = vec![0; 8 * dtype_size(st)];
        });
        assert_ckpt_err(
            Checkpoint::open(dir.path()),
            "model.safetensors",
            &["model.norm.weight", shown, "expected bf16, f16 or f32"],
        );
    }
}

#[test]
fn truncated_file() {
    let dir = single_file_ckpt(true, |_| {});
    let p = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&p).unwrap();
    std::fs::write(&p, &bytes[..bytes.len() - 10]).unwrap();
    assert_ckpt_err(
        Checkpoint::open(dir.path()),
        "model.safetensors",
        &["truncated", "model.norm.weight", "end at byte"],
    );
}

#[test]
fn truncated_inside_the_header() {
    let dir = single_file_ckpt(true, |_| {});
    let p = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&p).unwrap();
    std::fs::write(&p, &bytes[..100]).unwrap();
    assert_ckpt_err(
        Checkpoint::open(dir.path()),
        "model.safetensors",
        &["header length", "truncated"],
    );
}

#[test]
fn shorter_than_the_length_field() {
    for n in [0usize, 1, 7] {
        let dir = single_file_ckpt(true, |_| {});
        let p = dir.path().join("model.safetensors");
        std::fs::write(&p, vec![0u8; n]).unwrap();
        assert_ckpt_err(
            Checkpoint::open(dir.path()),
            "model.safetensors",
            &["truncated", &format!("{n} bytes")],
        );
    }
}

#[test]
fn trailing_bytes() {
    let dir = single_file_ckpt(true, |_| {});
    let p = dir.path().join("model.safetensors");
    let mut bytes = std::fs::read(&p).unwrap();
    bytes.extend_from_slice(&[0; 16]);
    std::fs::write(&p, &bytes).unwrap();
    assert_ckpt_err(
        Checkpoint::open(dir.path()),
        "model.safetensors",
        &["trailing"],
    );
}

#[test]
fn header_length_lies() {
    let dir = single_file_ckpt(true, |_| {});
    let p = dir.path().join("model.safetensors");
    for lie in [u64::MAX, 1 << 40, 3] {
        let mut bytes = std::fs::read(&p).unwrap();
        bytes[..8].copy_from_slice(&lie.to_le_bytes());
        let q = dir.path().join("lie");
        std::fs::create_dir_all(&q).unwrap();
        write(&q, "config.json", tiny_config_json(true).as_bytes());
        write(&q, "model.safetensors", &bytes);
        assert_ckpt_err(Checkpoint::open(&q), "model.safetensors", &["header"]);
    }
}

/// A file with one tensor `x` under a hand-written header.
fn lying_file(entries: &str, data_len: usize) -> TempDir {
    let dir = TempDir::new("ckpt-test");
    write(dir.path(), "config.json", tiny_config_json(true).as_bytes());
    write(
        dir.path(),
        "model.safetensors",
        &raw_file(entries, &vec![0u8; data_len]),
    );
    dir
}

#[test]
fn header_offsets_past_the_data() {
    let dir = lying_file(
        r#"{"model.norm.weight":{"dtype":"BF16","shape":[8],"data_offsets":[0,16]}}"#,
        8,
    );
    assert_ckpt_err(
        Checkpoint::open(dir.path()),
        "model.safetensors",
        &["model.norm.weight", "16", "8 data bytes"],
    );
}

#[test]
fn header_offsets_reversed() {
    let dir = lying_file(
        r#"{"model.norm.weight":{"dtype":"BF16","shape":[8],"data_offsets":[16,0]}}"#,
        16,
    );
    assert_ckpt_err(
        Checkpoint::open(dir.path()),
        "model.safetensors",
        &["model.norm.weight", "data_offsets"],
    );
}

#[test]
fn header_length_disagrees_with_shape() {
    let dir = lying_file(
        r#"{"model.norm.weight":{"dtype":"BF16","shape":[8],"data_offsets":[0,12]}}"#,
        12,
    );
    assert_ckpt_err(
        Checkpoint::open(dir.path()),
        "model.safetensors",
        &["model.norm.weight", "needs 16 bytes", "span 12"],
    );
}

#[test]
fn header_offsets_overlap() {
    let dir = lying_file(
        r#"{"model.norm.weight":{"dtype":"BF16","shape":[8],"data_offsets":[0,16]},
            "model.layers.0.layer_scalar":{"dtype":"BF16","shape":[1],"data_offsets":[8,10]}}"#,
        16,
    );
    assert_ckpt_err(
        Checkpoint::open(dir.path()),
        "model.safetensors",
        &["model.layers.0.layer_scalar", "overlap"],
    );
}

#[test]
fn header_shape_overflows() {
    let dir = lying_file(
        r#"{"model.norm.weight":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,16]}}"#,
        16,
    );
    assert_ckpt_err(
        Checkpoint::open(dir.path()),
        "model.safetensors",
        &["model.norm.weight"],
    );
}

#[test]
fn header_not_json() {
    let dir = lying_file("{not json at all}", 0);
    assert_ckpt_err(Checkpoint::open(dir.path()), "model.safetensors", &["JSON"]);
    let dir = lying_file(
        r#"{"model.norm.weight":{"dtype":"Q9","shape":[8],"data_offsets":[0,16]}}"#,
        16,
    );
    assert_ckpt_err(
        Checkpoint::open(dir.path()),
        "model.safetensors",
        &["model.norm.weight"],
    );
}

#[test]
fn header_not_utf8() {
    let dir = TempDir::new("ckpt-test");
    write(dir.path(), "config.json", tiny_config_json(true).as_bytes());
    let mut bytes = 4u64.to_le_bytes().to_vec();
    bytes.extend_from_slice(&[0xff, 0xfe, 0xfd, 0xfc]);
    write(dir.path(), "model.safetensors", &bytes);
    assert_ckpt_err(
        Checkpoint::open(dir.path()),
        "model.safetensors",
        &["UTF-8"],
    );
}

#[test]
fn shard_missing() {
    let dir = sharded_ckpt("model.language_model.", |_| {});
    std::fs::remove_file(dir.path().join("model-00002-of-00002.safetensors")).unwrap();
    assert_ckpt_err(
        Checkpoint::open(dir.path()),
        "model-00002-of-00002.safetensors",
        &["cannot open"],
    );
}

#[test]
fn index_names_a_tensor_its_shard_lacks() {
    let dir = sharded_ckpt("model.", |m| {
        m.insert(
            "model.norm.weight".into(),
            "model-00002-of-00002.safetensors".into(),
        );
    });
    // embed_tokens and norm come first in the list, so they are in shard 1.
    assert_ckpt_err(
        Checkpoint::open(dir.path()),
        "model-00002-of-00002.safetensors",
        &["model.norm.weight", "not in its header"],
    );
}

#[test]
fn index_missing_a_tensor() {
    let dir = sharded_ckpt("model.", |m| {
        m.remove("model.layers.1.router.per_expert_scale");
    });
    assert_ckpt_err(
        Checkpoint::open(dir.path()),
        "model.safetensors.index.json",
        &["model.layers.1.router.per_expert_scale", "missing", "[4]"],
    );
}

#[test]
fn index_points_outside_the_directory() {
    for bad in [
        "../model-00001-of-00002.safetensors",
        "/etc/passwd",
        "sub/x.safetensors",
    ] {
        let dir = sharded_ckpt("model.", |m| {
            m.insert("model.norm.weight".into(), bad.into());
        });
        assert_ckpt_err(
            Checkpoint::open(dir.path()),
            "model.safetensors.index.json",
            &["model.norm.weight", bad],
        );
    }
}

#[test]
fn index_malformed() {
    let dir = sharded_ckpt("model.", |_| {});
    write(
        dir.path(),
        "model.safetensors.index.json",
        b"{\"weight_map\": [1, 2]}",
    );
    assert_ckpt_err(
        Checkpoint::open(dir.path()),
        "model.safetensors.index.json",
        &["weight_map"],
    );
    write(
        dir.path(),
        "model.safetensors.index.json",
        b"{\"weight_map\": {\"model.norm.weight\": 7}}",
    );
    assert_ckpt_err(
        Checkpoint::open(dir.path()),
        "model.safetensors.index.json",
        &["model.norm.weight"],
    );
    write(dir.path(), "model.safetensors.index.json", b"not json");
    assert_ckpt_err(
        Checkpoint::open(dir.path()),
        "model.safetensors.index.json",
        &["JSON"],
    );
}

#[test]
fn tensor_lookup_of_an_unknown_name() {
    let dir = single_file_ckpt(true, |_| {});
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    match ckpt.tensor("layers.7.mlp.up_proj.weight") {
        Err(Error::Checkpoint { detail, .. }) => {
            assert!(detail.contains("layers.7.mlp.up_proj.weight"), "{detail}");
            assert!(
                detail.contains("model.layers.7.mlp.up_proj.weight"),
                "{detail}"
            );
        }
        other => panic!("expected Error::Checkpoint, got {other:?}"),
    }
}

// ---- property tests ------------------------------------------------------------

/// Writes `bytes` as the model file of a checkpoint with a valid config and
/// opens it. Whatever happens must be a value: Ok with every tensor in bounds,
/// or an Err that is not a caught parser panic.
fn open_bytes(bytes: &[u8]) -> Result<(), TestCaseError> {
    let dir = TempDir::new("ckpt-test");
    write(dir.path(), "config.json", tiny_config_json(true).as_bytes());
    write(dir.path(), "model.safetensors", bytes);
    match Checkpoint::open(dir.path()) {
        Ok(ckpt) => {
            for (name, _) in expected_tensors(ckpt.config()) {
                let t = ckpt
                    .tensor(&name)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(t.bytes.as_slice().len(), t.numel() * t.dtype.size());
            }
        }
        Err(Error::Checkpoint { detail, .. }) => {
            prop_assert!(!detail.contains("panicked"), "parser panicked: {}", detail);
        }
        Err(e) => return Err(TestCaseError::fail(format!("unexpected error kind: {e:?}"))),
    }
    Ok(())
}

fn dtype_name() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("BF16".to_string()),
        Just("F16".to_string()),
        Just("F32".to_string()),
        Just("F64".to_string()),
        Just("U8".to_string()),
        Just("F4".to_string()),
        Just("BOOL".to_string()),
        "[A-Z0-9_]{0,5}",
    ]
}

/// A header entry with plausible-to-absurd fields.
fn entry() -> impl Strategy<Value = String> {
    let name = prop_oneof![
        Just("model.norm.weight".to_string()),
        Just("model.embed_tokens.weight".to_string()),
        Just("model.layers.0.layer_scalar".to_string()),
        "[a-z._0-9]{0,20}",
    ];
    let dim = prop_oneof![0usize..20, Just(usize::MAX), Just(1 << 33)];
    let off = prop_oneof![0usize..300, Just(usize::MAX), Just(usize::MAX - 1)];
    (
        name,
        dtype_name(),
        prop::collection::vec(dim, 0..4),
        off.clone(),
        off,
    )
        .prop_map(|(n, d, shape, s, e)| {
            format!(r#""{n}":{{"dtype":"{d}","shape":{shape:?},"data_offsets":[{s},{e}]}}"#)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        open_bytes(&bytes)?;
    }

    #[test]
    fn random_length_prefix_never_panics(len in any::<u64>(), rest in prop::collection::vec(any::<u8>(), 0..200)) {
        let mut bytes = len.to_le_bytes().to_vec();
        bytes.extend_from_slice(&rest);
        open_bytes(&bytes)?;
    }

    #[test]
    fn random_headers_never_panic(
        entries in prop::collection::vec(entry(), 0..5),
        data_len in 0usize..300,
        meta in any::<bool>(),
    ) {
        let mut parts = entries;
        if meta {
            parts.push(r#""__metadata__":{"format":"pt"}"#.to_string());
        }
        let header = format!("{{{}}}", parts.join(","));
        open_bytes(&raw_file(&header, &vec![0u8; data_len]))?;
    }

    #[test]
    fn mutated_valid_files_never_panic(
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        header_only in any::<bool>(),
    ) {
        let mut bytes = valid_file_bytes();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize + 8;
        let span = if header_only { n } else { bytes.len() };
        for (i, v) in flips {
            let at = i.index(span);
            bytes[at] = v;
        }
        open_bytes(&bytes)?;
    }

    #[test]
    fn truncated_valid_files_never_panic(cut in any::<prop::sample::Index>()) {
        let bytes = valid_file_bytes();
        let at = cut.index(bytes.len());
        open_bytes(&bytes[..at])?;
    }

    #[test]
    fn edited_header_text_never_panics(
        pos in any::<prop::sample::Index>(),
        insert in "[0-9\\[\\]{},:\"a-zA-Z_ -]{0,6}",
        remove in 0usize..6,
    ) {
        let bytes = valid_file_bytes();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header = String::from_utf8(bytes[8..8 + n].to_vec()).unwrap();
        let at = pos.index(header.len() + 1);
        let end = (at + remove).min(header.len());
        let edited = format!("{}{}{}", &header[..at], insert, &header[end..]);
        open_bytes(&raw_file(&edited, &bytes[8 + n..]))?;
    }
}

#[test]
fn layer_state_is_decoded_at_open() {
    let two_bf16: Vec<u8> = (0..8).flat_map(|_| half_bf16_bits(2.0)).collect();
    let pes_bf16: Vec<u8> = [0.5f32, 1.0, 1.5, 2.0]
        .iter()
        .flat_map(|&v| half_bf16_bits(v))
        .collect();
    let dir = single_file_ckpt(true, |t| {
        for r in t.iter_mut() {
            match r.name.as_str() {
                "model.layers.1.layer_scalar" => {
                    r.dtype = Dtype::F32;
                    r.data = 0.25f32.to_le_bytes().to_vec();
                }
                "model.layers.1.router.scale" => r.data = two_bf16.clone(),
                "model.layers.1.router.per_expert_scale" => r.data = pes_bf16.clone(),
                _ => {}
            }
        }
    });
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let s = ckpt.layer_state();
    assert_eq!(s.len(), 2);
    assert_eq!(s[1].layer_scalar, 0.25);
    assert_eq!(s[1].router_effective_scale, vec![2.0 / 8f32.sqrt(); 8]);
    assert_eq!(s[1].per_expert_scale, vec![0.5, 1.0, 1.5, 2.0]);
    assert_eq!(s[0].per_expert_scale.len(), 4);
}

#[test]
fn layer_state_of_the_fixtures_matches_the_tensors() {
    for name in ["tiny-text", "tiny-multimodal"] {
        let Some(dir) = fixture(name) else { continue };
        let ckpt = Checkpoint::open(&dir).unwrap();
        let hidden = ckpt.config().hidden as f32;
        for (i, s) in ckpt.layer_state().iter().enumerate() {
            let scalar = ckpt
                .tensor(&format!("layers.{i}.layer_scalar"))
                .unwrap()
                .to_f32();
            assert_eq!(vec![s.layer_scalar], scalar);
            let scale = ckpt
                .tensor(&format!("layers.{i}.router.scale"))
                .unwrap()
                .to_f32();
            let folded: Vec<f32> = scale.iter().map(|v| v / hidden.sqrt()).collect();
            for (a, b) in s.router_effective_scale.iter().zip(&folded) {
                assert!(
                    (a - b).abs() <= 1e-6 * b.abs(),
                    "{name} layer {i}: {a} vs {b}"
                );
            }
            assert_eq!(s.per_expert_scale.len(), ckpt.config().experts);
        }
        // The fixture generator moves these away from 1 so bugs show.
        assert!(
            ckpt.layer_state().iter().any(|s| s.layer_scalar != 1.0),
            "{name}"
        );
    }
}

/// bf16 bytes of `v` (exact for the values used here).
fn half_bf16_bits(v: f32) -> [u8; 2] {
    ((v.to_bits() >> 16) as u16).to_le_bytes()
}

// ---- MLX-quantized checkpoints --------------------------------------------

/// The tiny-text-q4 fixture copied to a temp dir, its config.json passed
/// through `edit_config` and its tensors through `edit_tensors`.
fn q4_copy(
    edit_config: impl FnOnce(&mut serde_json::Value),
    edit_tensors: impl FnOnce(&mut Vec<Raw>),
) -> TempDir {
    let src = fixture("tiny-text-q4").expect("tiny-text-q4 fixture");
    let dir = TempDir::new("ckpt-test");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    edit_config(&mut cfg);
    write(dir.path(), "config.json", cfg.to_string().as_bytes());
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut t: Vec<Raw> = st
        .tensors()
        .into_iter()
        .map(|(name, v)| Raw {
            name,
            dtype: v.dtype(),
            shape: v.shape().to_vec(),
            data: v.data().to_vec(),
        })
        .collect();
    edit_tensors(&mut t);
    write(dir.path(), "model.safetensors", &serialize(&t));
    dir
}

#[test]
fn quantized_checkpoint_opens_with_its_formats() {
    let dir = q4_copy(|_| {}, |_| {});
    let ck = Checkpoint::open(dir.path()).unwrap();
    let q = ck.tensor("layers.0.self_attn.q_proj.weight").unwrap();
    assert!(
        matches!(q.dtype, DType::Affine(a) if a.bits == 4 && a.group == 64),
        "{q:?}"
    );
    let r = ck.tensor("layers.0.router.proj.weight").unwrap();
    assert!(matches!(r.dtype, DType::Affine(a) if a.bits == 8), "{r:?}");
    let gu = ck.tensor("layers.0.experts.gate_up_proj").unwrap();
    let cfg = ck.config();
    assert_eq!(gu.shape, vec![cfg.experts, 2 * cfg.moe_inter, cfg.hidden]);
}

#[test]
fn quantized_bits_the_shapes_do_not_allow_are_named() {
    let dir = q4_copy(|c| c["quantization"]["bits"] = 8.into(), |_| {});
    assert_ckpt_err(
        Checkpoint::open(dir.path()),
        "",
        &["model.embed_tokens", "do not fit 8 bits in groups of 64"],
    );
}

#[test]
fn packed_weight_without_scales_is_named() {
    let dir = q4_copy(
        |_| {},
        |t| t.retain(|r| r.name != "model.layers.1.self_attn.o_proj.scales"),
    );
    assert_ckpt_err(
        Checkpoint::open(dir.path()),
        "",
        &[
            "model.layers.1.self_attn.o_proj.weight",
            "packed U32",
            ".scales` is missing",
        ],
    );
}

#[test]
fn biases_that_disagree_with_scales_are_named() {
    let dir = q4_copy(
        |_| {},
        |t| {
            let b = t
                .iter_mut()
                .find(|r| r.name == "model.layers.0.mlp.down_proj.biases")
                .unwrap();
            b.dtype = Dtype::F16;
        },
    );
    assert_ckpt_err(
        Checkpoint::open(dir.path()),
        "",
        &["model.layers.0.mlp.down_proj.biases", "does not match"],
    );
}

#[test]
fn unsupported_quantization_modes_are_refused_by_name() {
    let dir = q4_copy(|c| c["quantization"]["mode"] = "mxfp4".into(), |_| {});
    match Checkpoint::open(dir.path()) {
        Err(e) => assert!(e.to_string().contains("\"mxfp4\""), "{e}"),
        Ok(_) => panic!("an mxfp4 config opened"),
    }
}

/// The weight bytes a decoded token reads, from what the checkpoint
/// stores: the config's count for a bf16 one, and for a quantized one its
/// packed values, scales and biases (a quarter and a bit of bf16's at 4
/// bits, the 8-bit router and the routed experts' top-k share included).
#[test]
fn bytes_per_token_follows_the_stored_format() {
    let dir = |n: &str| {
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(n)
    };
    let bf16 = Checkpoint::open(&dir("tiny-text-g64")).unwrap();
    let want = bf16.config().bytes_per_token(turbospark::DType::BF16);
    assert_eq!(bf16.bytes_per_token(), want);
    let q4 = Checkpoint::open(&dir("tiny-text-q4")).unwrap();
    for name in [
        "embed_tokens.weight",
        "layers.0.experts.down_proj",
        "norm.weight",
    ] {
        let t = q4.tensor(name).unwrap();
        assert_eq!(
            q4.dtype_of(name).unwrap(),
            t.dtype,
            "{name}: from the headers alone"
        );
    }
    let (got, bf) = (q4.bytes_per_token() as f64, want as f64);
    assert!(
        got > 0.25 * bf && got < 0.45 * bf,
        "q4 reads {got} bytes a token against bf16's {bf}"
    );
}
