//! `mlx_writer::quantize_checkpoint` against mlx-lm itself: the bf16
//! fixtures quantized here must give the committed mlx-lm conversions
//! (scripts/make_quant_fixtures.py) tensor for tensor (names, dtypes,
//! shapes, bytes), the same config.json and index bytes, and the same
//! copied files; plus the shard split, mlx-lm's skip rule, and the errors.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use safetensors::SafeTensors;
use turbospark::model::mlx_writer::{quantize_checkpoint, Override, QuantizeOptions};
use turbospark::model::Checkpoint;
use turbospark::{DType, Error};

use common::temp_dir::TempDir;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn opts(bits: u32, group_size: u32, overrides: &[&str]) -> QuantizeOptions {
    QuantizeOptions {
        bits,
        group_size,
        overrides: overrides.iter().map(|o| o.parse().unwrap()).collect(),
        ..Default::default()
    }
}

fn files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// name -> (dtype, shape, bytes) over every safetensors file of `dir`.
type Tensors = BTreeMap<String, (safetensors::Dtype, Vec<usize>, Vec<u8>)>;

fn tensors(dir: &Path) -> Tensors {
    let mut out = BTreeMap::new();
    for f in files(dir) {
        if !(f.starts_with("model") && f.ends_with(".safetensors")) {
            continue;
        }
        let bytes = std::fs::read(dir.join(&f)).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        for (name, t) in st.tensors() {
            let prev = out.insert(name, (t.dtype(), t.shape().to_vec(), t.data().to_vec()));
            assert!(prev.is_none(), "a tensor in two shards");
        }
    }
    out
}

fn assert_same_tensors(ours: &Tensors, mlx: &Tensors) {
    let (a, b): (Vec<&String>, Vec<&String>) = (ours.keys().collect(), mlx.keys().collect());
    assert_eq!(a, b, "tensor names");
    for (name, (dt, shape, data)) in mlx {
        let (odt, oshape, odata) = &ours[name];
        assert_eq!((odt, oshape), (dt, shape), "`{name}`: dtype and shape");
        if odata != data {
            let at = odata.iter().zip(data).position(|(x, y)| x != y);
            panic!("`{name}`: bytes differ (first at byte {at:?})");
        }
    }
}

/// `ours` holds what mlx-lm wrote in `mlx` (less the oracle files the
/// fixture script added): the same files, the JSON files byte for byte,
/// the tensors one by one. The output also opens through the loader.
fn assert_matches_fixture(ours: &Path, mlx: &Path) {
    let want: Vec<String> = files(mlx)
        .into_iter()
        .filter(|f| f != "expected.json" && f != "logits.safetensors")
        .collect();
    assert_eq!(files(ours), want, "files");
    for f in &want {
        if f.ends_with(".safetensors") {
            continue;
        }
        let (a, b) = (
            std::fs::read(ours.join(f)).unwrap(),
            std::fs::read(mlx.join(f)).unwrap(),
        );
        assert!(
            a == b,
            "{f} differs:\n--- ours\n{}\n--- mlx-lm\n{}",
            String::from_utf8_lossy(&a),
            String::from_utf8_lossy(&b)
        );
    }
    assert_same_tensors(&tensors(ours), &tensors(mlx));
    Checkpoint::open(ours).unwrap();
}

#[test]
fn text_q4_is_mlx_lms_conversion() {
    let out = TempDir::unmade("quantize-test");
    let r = quantize_checkpoint(&fixture("tiny-text-g64"), out.path(), &opts(4, 64, &[])).unwrap();
    assert_matches_fixture(out.path(), &fixture("tiny-text-q4"));
    assert_eq!(
        r.cast, None,
        "a text config's top-level dtype is not mlx-lm's cast"
    );
    assert!(r.skipped.is_empty() && r.kept_float.is_empty());
    assert_eq!(
        r.quantized.iter().filter(|q| q.1 == 8).count(),
        2,
        "the routers"
    );
    assert_eq!(r.shards, ["model.safetensors"]);
    assert_eq!(r.copied, ["generation_config.json", "tokenizer.json"]);
}

#[test]
fn text_q8_is_mlx_lms_conversion() {
    let out = TempDir::unmade("quantize-test");
    quantize_checkpoint(&fixture("tiny-text-g64"), out.path(), &opts(8, 32, &[])).unwrap();
    assert_matches_fixture(out.path(), &fixture("tiny-text-q8"));
}

/// The mixed recipe of scripts/make_quant_fixtures.py (default 4/32, the
/// routers 8/64 by mlx-lm's rule, dense MLP 8/64, MIXED_OVERRIDES) as
/// overrides, on the sharded multimodal source (f32/f16/bf16, cast to bf16
/// by its text_config.dtype; vision tensors dropped).
#[test]
fn multimodal_mixed_is_mlx_lms_conversion() {
    let out = TempDir::unmade("quantize-test");
    let o = opts(
        4,
        32,
        &[
            "layers.*.mlp.*=8:64",
            "embed_tokens=6:64",
            "layers.0.experts.switch_glu.gate_proj=3",
            "layers.0.experts.switch_glu.down_proj=2:32",
            "layers.1.self_attn.*=6",
            "layers.2.self_attn.k_proj=3:64",
            "language_model.model.layers.2.self_attn.o_proj=5:128",
            "layers.2.experts.switch_glu.up_proj=5:64",
        ],
    );
    let r = quantize_checkpoint(&fixture("tiny-multimodal-g32"), out.path(), &o).unwrap();
    assert_eq!(r.cast, Some(DType::BF16));
    assert_matches_fixture(out.path(), &fixture("tiny-multimodal-mixed"));
}

/// mlx-lm's `make_shards` over the parameters in the model's order; the
/// shards hold the same tensors and open through the index.
#[test]
fn shards_split_in_parameter_order() {
    let out = TempDir::unmade("quantize-test");
    let mut o = opts(4, 64, &[]);
    o.max_shard_bytes = 40_000;
    let r = quantize_checkpoint(&fixture("tiny-text-g64"), out.path(), &o).unwrap();
    let n = r.shards.len();
    assert!(n > 2, "{:?}", r.shards);
    for (i, s) in r.shards.iter().enumerate() {
        assert_eq!(s, &format!("model-{:05}-of-{n:05}.safetensors", i + 1));
        let size = std::fs::metadata(out.path().join(s)).unwrap().len();
        assert!(size < 40_000 + 16_384, "{s}: {size} bytes");
    }
    // The first shard starts with the embedding, the last ends with norm.
    let first = std::fs::read(out.path().join(&r.shards[0])).unwrap();
    let st = SafeTensors::deserialize(&first).unwrap();
    assert!(st.names().contains(&"model.embed_tokens.weight"));
    let last = std::fs::read(out.path().join(&r.shards[n - 1])).unwrap();
    let st = SafeTensors::deserialize(&last).unwrap();
    assert!(st.names().contains(&"model.norm.weight"));

    assert_same_tensors(&tensors(out.path()), &tensors(&fixture("tiny-text-q4")));
    let index: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.path().join("model.safetensors.index.json")).unwrap(),
    )
    .unwrap();
    let map = index["weight_map"].as_object().unwrap();
    let mut seen = 0;
    for s in &r.shards {
        let bytes = std::fs::read(out.path().join(s)).unwrap();
        for name in SafeTensors::deserialize(&bytes).unwrap().names() {
            assert_eq!(map[&name.to_string()], s.as_str());
            seen += 1;
        }
    }
    assert_eq!(seen, map.len());
    assert_eq!(index["metadata"]["total_parameters"], 317_568);
    Checkpoint::open(out.path()).unwrap();
}

/// mlx-lm quantizes a module only when the DEFAULT group divides its
/// in-dim: with group 128 on hidden 64 only the attention outputs (in-dims
/// 128 and 256) are quantized; the rest, routers included, stay bf16, with
/// no config entry.
#[test]
fn modules_the_group_does_not_divide_stay_float() {
    let out = TempDir::unmade("quantize-test");
    let r = quantize_checkpoint(&fixture("tiny-text-g64"), out.path(), &opts(4, 128, &[])).unwrap();
    let q: Vec<&str> = r.quantized.iter().map(|q| q.0.as_str()).collect();
    assert_eq!(
        q,
        [
            "model.layers.0.self_attn.o_proj",
            "model.layers.1.self_attn.o_proj"
        ]
    );
    assert!(r
        .skipped
        .contains(&"model.layers.0.router.proj".to_string()));
    assert!(r.skipped.contains(&"model.embed_tokens".to_string()));
    let t = tensors(out.path());
    let src = tensors(&fixture("tiny-text-g64"));
    assert_eq!(
        t["model.embed_tokens.weight"],
        src["model.embed_tokens.weight"]
    );
    assert_eq!(
        t["model.layers.0.self_attn.o_proj.weight"].0,
        safetensors::Dtype::U32
    );
    assert_eq!(t["model.layers.0.self_attn.o_proj.scales"].1, [64, 1]);
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("config.json")).unwrap())
            .unwrap();
    let qc = cfg["quantization"].as_object().unwrap();
    assert_eq!(qc.len(), 3, "only the defaults: {qc:?}");
    assert_eq!(cfg["quantization"], cfg["quantization_config"]);
    Checkpoint::open(out.path()).unwrap();
}

/// `=float` keeps a module in float with no entry, as a predicate
/// returning False does; an override's entry appears even when it equals
/// the default.
#[test]
fn overrides_keep_float_or_list_the_module() {
    let out = TempDir::unmade("quantize-test");
    let o = opts(4, 64, &["embed_tokens=float", "layers.1.mlp.up_proj=4"]);
    let r = quantize_checkpoint(&fixture("tiny-text-g64"), out.path(), &o).unwrap();
    assert_eq!(r.kept_float, ["model.embed_tokens"]);
    let t = tensors(out.path());
    let src = tensors(&fixture("tiny-text-g64"));
    assert_eq!(
        t["model.embed_tokens.weight"],
        src["model.embed_tokens.weight"]
    );
    assert!(!t.contains_key("model.embed_tokens.scales"));
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("config.json")).unwrap())
            .unwrap();
    assert_eq!(
        cfg["quantization"]["model.layers.1.mlp.up_proj"],
        serde_json::json!({"group_size": 64, "bits": 4})
    );
    assert!(cfg["quantization"].get("model.embed_tokens").is_none());
    Checkpoint::open(out.path()).unwrap();
}

fn invalid(e: Error, words: &str) {
    let msg = e.to_string();
    assert!(msg.contains(words), "`{msg}` does not say `{words}`");
}

#[test]
fn a_non_empty_output_needs_force() {
    let out = TempDir::unmade("quantize-test");
    std::fs::create_dir_all(out.path()).unwrap();
    std::fs::write(
        out.path().join("model-00001-of-00009.safetensors"),
        b"stale",
    )
    .unwrap();
    let src = fixture("tiny-text-g64");
    let e = quantize_checkpoint(&src, out.path(), &opts(4, 64, &[])).unwrap_err();
    invalid(e, "not empty");
    let mut o = opts(4, 64, &[]);
    o.force = true;
    quantize_checkpoint(&src, out.path(), &o).unwrap();
    // The stale shard is gone: mlx-lm would load every model*.safetensors.
    assert_matches_fixture(out.path(), &fixture("tiny-text-q4"));

    let e = quantize_checkpoint(&src, &src, &o).unwrap_err();
    invalid(e, "is the source checkpoint");
}

#[test]
fn bad_requests_are_named_errors() {
    let src = fixture("tiny-text-g64");
    let out = TempDir::unmade("quantize-test");
    let run = |o: QuantizeOptions| quantize_checkpoint(&src, out.path(), &o).unwrap_err();
    invalid(run(opts(7, 64, &[])), "bits 7");
    invalid(run(opts(4, 48, &[])), "group_size 48");
    invalid(
        run(opts(4, 64, &["layers.9.*=8"])),
        "matches no quantizable module",
    );
    // The experts' down_proj has in-dim 64: mx.quantize refuses group 128.
    invalid(
        run(opts(
            4,
            64,
            &["layers.0.experts.switch_glu.down_proj=4:128"],
        )),
        "not a multiple of group 128",
    );
    assert!(
        !out.path().exists(),
        "nothing is written for a refused request"
    );

    let e =
        quantize_checkpoint(&fixture("tiny-text-q4"), out.path(), &opts(4, 64, &[])).unwrap_err();
    invalid(e, "already");

    for bad in ["embed_tokens", "x=7", "x=4:48", "=4"] {
        assert!(bad.parse::<Override>().is_err(), "{bad}");
    }
}

/// A config that leans on mlx-lm's defaults where they differ from
/// transformers' (no num_kv_shared_layers: mlx-lm reads 20 and would drop
/// the k/v projections of the last 20 layers) is refused by name.
#[test]
fn a_config_mlx_lm_reads_differently_is_refused() {
    let dir = TempDir::unmade("quantize-test");
    std::fs::create_dir_all(dir.path()).unwrap();
    let src = fixture("tiny-text-g64");
    for f in ["model.safetensors", "tokenizer.json"] {
        std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
    }
    let text = std::fs::read_to_string(src.join("config.json")).unwrap();
    let mut cfg: serde_json::Value = serde_json::from_str(&text).unwrap();
    cfg.as_object_mut().unwrap().remove("num_kv_shared_layers");
    std::fs::write(dir.path().join("config.json"), cfg.to_string()).unwrap();
    let out = TempDir::unmade("quantize-test");
    let e = quantize_checkpoint(dir.path(), out.path(), &opts(4, 64, &[])).unwrap_err();
    invalid(e, "num_kv_shared_layers 20");
    assert!(!out.path().exists());
}
