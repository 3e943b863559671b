//! `config.json` parsing: both spellings (text-only and multimodal), both
//! full-attention override spellings, transformers' defaults, the flagship
//! shape, and every way a config can fail to describe a supported model.

use std::path::Path;

use turbospark::model::{LayerKind, LayerSpec, ModelConfig};
use turbospark::{DType, Error};

/// A small text-only config with every feature on; `extra` fields are merged
/// over it (a `null` value removes the field).
fn text_json(extra: serde_json::Value) -> String {
    let mut base = serde_json::json!({
        "architectures": ["Gemma4ForCausalLM"],
        "model_type": "gemma4_text",
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "global_head_dim": 64,
        "num_global_key_value_heads": 1,
        "attention_k_eq_v": true,
        "intermediate_size": 40,
        "enable_moe_block": true,
        "num_experts": 8,
        "top_k_experts": 2,
        "moe_intermediate_size": 12,
        "vocab_size": 512,
        "hidden_size_per_layer_input": 0,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "proportional", "rope_theta": 1000000.0, "partial_rotary_factor": 0.25}
        },
        "sliding_window": 4,
        "final_logit_softcapping": 30.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": true
    });
    merge(&mut base, extra);
    base.to_string()
}

fn merge(base: &mut serde_json::Value, extra: serde_json::Value) {
    let (Some(b), serde_json::Value::Object(e)) = (base.as_object_mut(), extra) else {
        panic!("merge needs objects");
    };
    for (k, v) in e {
        if v.is_null() {
            b.remove(&k);
        } else {
            b.insert(k, v);
        }
    }
}

/// The same fields nested as `Gemma4ForConditionalGeneration` writes them.
fn multimodal_json(text: &str, top: serde_json::Value) -> String {
    let text: serde_json::Value = serde_json::from_str(text).unwrap();
    let mut root = serde_json::json!({
        "architectures": ["Gemma4ForConditionalGeneration"],
        "model_type": "gemma4",
        "text_config": text,
        "vision_config": null,
        "audio_config": null,
        "tie_word_embeddings": true
    });
    merge(&mut root, top);
    root.to_string()
}

fn parse(text: &str) -> turbospark::Result<ModelConfig> {
    ModelConfig::from_json(text, "test/config.json")
}

/// Asserts a config error whose message names every one of `culprits`.
fn assert_config_err(text: &str, culprits: &[&str]) {
    match parse(text) {
        Err(Error::Config { path, detail }) => {
            assert_eq!(path, "test/config.json");
            for c in culprits {
                assert!(detail.contains(c), "message {detail:?} does not name {c:?}");
            }
        }
        Err(e) => panic!("expected Error::Config naming {culprits:?}, got {e:?}"),
        Ok(c) => panic!("expected Error::Config naming {culprits:?}, parsed {c:?}"),
    }
}

fn sliding(head_dim: usize, kv: usize) -> LayerSpec {
    LayerSpec {
        kind: LayerKind::Sliding,
        head_dim,
        kv_heads: kv,
        rope_theta: 10_000.0,
        rot_pairs: head_dim / 2,
        k_eq_v: false,
    }
}

fn full(head_dim: usize, kv: usize, k_eq_v: bool) -> LayerSpec {
    LayerSpec {
        kind: LayerKind::Full,
        head_dim,
        kv_heads: kv,
        rope_theta: 1_000_000.0,
        rot_pairs: head_dim / 8,
        k_eq_v,
    }
}

#[test]
fn text_only_spelling() {
    let c = parse(&text_json(serde_json::json!({}))).unwrap();
    assert_eq!(c.hidden, 64);
    assert_eq!(c.heads, 4);
    assert_eq!(
        c.layers,
        vec![
            sliding(32, 2),
            full(64, 1, true),
            sliding(32, 2),
            full(64, 1, true)
        ]
    );
    assert_eq!(c.intermediate, 40);
    assert!(c.enable_moe);
    assert_eq!((c.experts, c.top_k, c.moe_inter), (8, 2, 12));
    assert_eq!(c.vocab, 512);
    assert_eq!(c.sliding_window, 4);
    assert_eq!(c.final_softcap, Some(30.0));
    assert_eq!(c.eps, 1e-6);
    assert!(c.tie_embeddings);
}

#[test]
fn multimodal_spelling_matches_text_only() {
    let text = text_json(serde_json::json!({}));
    let a = parse(&text).unwrap();
    let b = parse(&multimodal_json(&text, serde_json::json!({}))).unwrap();
    assert_eq!(a, b);
}

#[test]
fn per_layer_config_matches_global_head_dim() {
    let flat = parse(&text_json(serde_json::json!({}))).unwrap();
    let per_layer = parse(&text_json(serde_json::json!({
        "global_head_dim": null,
        "num_global_key_value_heads": null,
        "per_layer_config": {
            "1": {"head_dim": 64, "num_key_value_heads": 1},
            "3": {"head_dim": 64, "num_key_value_heads": 1}
        }
    })))
    .unwrap();
    assert_eq!(flat, per_layer);
}

#[test]
fn per_layer_config_wins_over_global_head_dim() {
    // transformers ignores global_head_dim when per_layer_config is given.
    let c = parse(&text_json(serde_json::json!({
        "global_head_dim": 128,
        "per_layer_config": {"3": {"head_dim": 64, "num_key_value_heads": 1}}
    })))
    .unwrap();
    assert_eq!(c.layers[1].head_dim, 32, "no override for layer 1");
    assert_eq!(c.layers[1].kv_heads, 2);
    assert_eq!(c.layers[3].head_dim, 64);
}

#[test]
fn global_kv_heads_apply_only_with_k_eq_v() {
    let c = parse(&text_json(serde_json::json!({"attention_k_eq_v": false}))).unwrap();
    assert_eq!(c.layers[1], {
        let mut l = full(64, 2, false);
        l.rot_pairs = 8;
        l
    });
    assert!(c.layers.iter().all(|l| !l.k_eq_v));
}

#[test]
fn transformers_defaults() {
    let c = parse(&text_json(serde_json::json!({
        "layer_types": null,
        "num_hidden_layers": 12,
        "rope_parameters": null,
        "global_head_dim": null,
        "sliding_window": null,
        "final_logit_softcapping": null,
        "rms_norm_eps": null,
        "tie_word_embeddings": null,
        "attention_k_eq_v": null
    })))
    .unwrap();
    let kinds: Vec<_> = c.layers.iter().map(|l| l.kind).collect();
    for (i, k) in kinds.iter().enumerate() {
        let want = if i == 5 || i == 11 {
            LayerKind::Full
        } else {
            LayerKind::Sliding
        };
        assert_eq!(*k, want, "layer {i}");
    }
    // global_head_dim defaults to 512; proportional RoPE with factor 0.25 rotates 64 pairs.
    assert_eq!(c.layers[5].head_dim, 512);
    assert_eq!(c.layers[5].rot_pairs, 64);
    assert_eq!(c.layers[5].rope_theta, 1e6);
    assert!(!c.layers[5].k_eq_v);
    assert_eq!(c.layers[0].rot_pairs, 16);
    assert_eq!(c.layers[0].rope_theta, 1e4);
    assert_eq!(c.sliding_window, 512);
    assert_eq!(c.final_softcap, None);
    assert_eq!(c.eps, 1e-6);
    assert!(c.tie_embeddings);
}

#[test]
fn null_softcap_means_none() {
    let c = parse(&text_json(serde_json::json!({})).replace(
        "\"final_logit_softcapping\":30.0",
        "\"final_logit_softcapping\":null",
    ))
    .unwrap();
    assert_eq!(c.final_softcap, None);
}

#[test]
fn last_layer_is_forced_full_as_in_transformers() {
    let c = parse(&text_json(serde_json::json!({
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"]
    })))
    .unwrap();
    assert_eq!(c.layers[3].kind, LayerKind::Full);
    assert_eq!(c.layers[3].head_dim, 64);
}

#[test]
fn dense_only_model_has_no_experts() {
    let c = parse(&text_json(serde_json::json!({
        "enable_moe_block": false, "num_experts": null, "top_k_experts": null, "moe_intermediate_size": null
    })))
    .unwrap();
    assert!(!c.enable_moe);
    assert_eq!((c.experts, c.top_k, c.moe_inter), (0, 0, 0));
}

#[test]
fn multimodal_ties_by_the_top_level_field() {
    let text = text_json(serde_json::json!({"tie_word_embeddings": true}));
    let c = parse(&multimodal_json(
        &text,
        serde_json::json!({"tie_word_embeddings": false}),
    ))
    .unwrap();
    assert!(!c.tie_embeddings);
}

#[test]
fn text_fixture() {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-text/config.json");
    if !p.exists() {
        eprintln!("skipping: {} not present", p.display());
        return;
    }
    let c = ModelConfig::from_file(&p).unwrap();
    assert_eq!(
        c.layers,
        vec![
            sliding(32, 2),
            full(64, 1, true),
            sliding(32, 2),
            full(64, 1, true)
        ]
    );
    assert_eq!(
        (c.hidden, c.heads, c.vocab, c.intermediate),
        (64, 4, 512, 40)
    );
    assert_eq!((c.experts, c.top_k, c.moe_inter), (8, 2, 12));
    assert_eq!(c.sliding_window, 4);
    assert_eq!(c.final_softcap, Some(30.0));
}

#[test]
fn multimodal_fixture() {
    let p =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-multimodal/config.json");
    if !p.exists() {
        eprintln!("skipping: {} not present", p.display());
        return;
    }
    let c = ModelConfig::from_file(&p).unwrap();
    assert_eq!(
        c.layers,
        vec![
            sliding(32, 2),
            sliding(32, 2),
            sliding(32, 2),
            full(64, 1, true)
        ]
    );
    assert_eq!((c.experts, c.top_k, c.moe_inter), (8, 3, 12));
    assert!(c.tie_embeddings);
}

#[test]
fn flagship_shape() {
    let c = ModelConfig::gemma4_26b_a4b();
    c.validate().unwrap();
    assert_eq!(c.layers.len(), 30);
    for (i, l) in c.layers.iter().enumerate() {
        if (i + 1) % 6 == 0 {
            assert_eq!(*l, {
                let mut f = full(512, 2, true);
                f.rot_pairs = 64;
                f
            });
        } else {
            assert_eq!(*l, sliding(256, 8), "layer {i}");
        }
    }
    assert_eq!(c.layers.last().map(|l| l.kind), Some(LayerKind::Full));
    assert_eq!((c.hidden, c.heads, c.intermediate), (2816, 16, 2112));
    assert_eq!((c.experts, c.top_k, c.moe_inter), (128, 8, 704));
    assert_eq!((c.vocab, c.sliding_window), (262_144, 1024));
    assert_eq!(c.final_softcap, Some(30.0));
    assert!(c.tie_embeddings && c.enable_moe);

    let params = c.parameter_count();
    assert!(
        (24e9..27e9).contains(&(params as f64)),
        "{params} parameters"
    );
    // docs/gemma4.md: about 7.65 GB of weights read per token at bf16, 1.48 GB of it the LM head.
    let bytes = c.bytes_per_token(DType::BF16);
    assert!(
        (7.0e9..8.0e9).contains(&(bytes as f64)),
        "{bytes} bytes per token"
    );
    assert_eq!(c.bytes_per_token(DType::F32), 2 * bytes);
    // The KV caches read per token: 5 full layers (2 kv heads of 512) see
    // every key, 25 sliding ones (8 of 256) at most the last 1024; K and V,
    // f32. At position 0 one key each; from 1023 on the sliding layers stop
    // growing.
    let kv_row = |keys_full: u64, keys_sliding: u64| {
        (5 * keys_full * 2 * 512 + 25 * keys_sliding * 8 * 256) * 2 * 4
    };
    assert_eq!(c.kv_bytes_per_token(0, DType::F32), kv_row(1, 1));
    assert_eq!(c.kv_bytes_per_token(1023, DType::F32), kv_row(1024, 1024));
    assert_eq!(c.kv_bytes_per_token(32767, DType::F32), kv_row(32768, 1024));
    // f16 caches read half
    assert_eq!(
        2 * c.kv_bytes_per_token(32767, DType::F16),
        kv_row(32768, 1024)
    );
}

#[test]
fn from_file_of_a_missing_path_is_io() {
    match ModelConfig::from_file(Path::new("/nonexistent/config.json")) {
        Err(Error::Io { path, .. }) => assert!(path.contains("/nonexistent/config.json")),
        other => panic!("expected Io error, got {other:?}"),
    }
}

// ---- configs that do not describe a supported model ------------------------

#[test]
fn rejects_invalid_json() {
    assert_config_err("{\"hidden_size\": ", &["not valid JSON"]);
    assert_config_err("[1, 2]", &["object"]);
}

#[test]
fn rejects_other_model_types() {
    assert_config_err(
        &text_json(serde_json::json!({"model_type": "llama"})),
        &["model_type", "llama"],
    );
    assert_config_err(
        &text_json(serde_json::json!({"model_type": null, "architectures": ["LlamaForCausalLM"]})),
        &["model_type"],
    );
    let text = text_json(serde_json::json!({"model_type": "gemma3_text"}));
    assert_config_err(
        &multimodal_json(&text, serde_json::json!({})),
        &["text_config.model_type", "gemma3_text"],
    );
    assert_config_err(
        &multimodal_json(
            &text_json(serde_json::json!({})),
            serde_json::json!({"model_type": "gemma3"}),
        ),
        &["model_type", "gemma3"],
    );
}

#[test]
fn accepts_architectures_without_model_type() {
    parse(&text_json(serde_json::json!({"model_type": null}))).unwrap();
}

#[test]
fn rejects_multimodal_without_text_config() {
    let mut v: serde_json::Value = serde_json::from_str(&multimodal_json(
        &text_json(serde_json::json!({})),
        serde_json::json!({}),
    ))
    .unwrap();
    v.as_object_mut().unwrap().remove("text_config");
    assert_config_err(&v.to_string(), &["text_config"]);
}

#[test]
fn rejects_missing_required_fields() {
    for field in [
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "intermediate_size",
        "vocab_size",
        "num_experts",
        "top_k_experts",
        "moe_intermediate_size",
    ] {
        let mut extra = serde_json::Map::new();
        extra.insert(field.into(), serde_json::Value::Null);
        assert_config_err(&text_json(extra.into()), &[field, "missing"]);
    }
}

#[test]
fn missing_fields_are_named_with_their_nesting() {
    let text = text_json(serde_json::json!({"vocab_size": null}));
    assert_config_err(
        &multimodal_json(&text, serde_json::json!({})),
        &["text_config.vocab_size"],
    );
}

#[test]
fn rejects_wrong_types() {
    assert_config_err(
        &text_json(serde_json::json!({"hidden_size": -64})),
        &["hidden_size", "-64"],
    );
    assert_config_err(
        &text_json(serde_json::json!({"hidden_size": "64"})),
        &["hidden_size"],
    );
    assert_config_err(
        &text_json(serde_json::json!({"hidden_size": 64.5})),
        &["hidden_size"],
    );
    assert_config_err(
        &text_json(serde_json::json!({"enable_moe_block": "yes"})),
        &["enable_moe_block"],
    );
    assert_config_err(
        &text_json(serde_json::json!({"rms_norm_eps": "tiny"})),
        &["rms_norm_eps"],
    );
    assert_config_err(
        &text_json(serde_json::json!({"layer_types": "sliding_attention"})),
        &["layer_types"],
    );
}

#[test]
fn rejects_per_layer_inputs() {
    assert_config_err(
        &text_json(serde_json::json!({"hidden_size_per_layer_input": 256})),
        &["hidden_size_per_layer_input", "256"],
    );
    // transformers' default when the field is absent is 256.
    assert_config_err(
        &text_json(serde_json::json!({"hidden_size_per_layer_input": null})),
        &["hidden_size_per_layer_input", "default"],
    );
}

#[test]
fn rejects_unsupported_features() {
    assert_config_err(
        &text_json(serde_json::json!({"num_kv_shared_layers": 2})),
        &["num_kv_shared_layers"],
    );
    assert_config_err(
        &text_json(serde_json::json!({"attention_bias": true})),
        &["attention_bias"],
    );
    assert_config_err(
        &text_json(serde_json::json!({"hidden_activation": "silu"})),
        &["hidden_activation", "silu"],
    );
    assert_config_err(
        &text_json(serde_json::json!({"use_bidirectional_attention": "all"})),
        &["use_bidirectional_attention"],
    );
}

#[test]
fn rejects_bad_layer_types() {
    assert_config_err(
        &text_json(serde_json::json!({"layer_types": ["sliding_attention", "full_attention"]})),
        &["layer_types", "2 entries", "num_hidden_layers is 4"],
    );
    assert_config_err(
        &text_json(
            serde_json::json!({"layer_types": ["sliding_attention", "chunked_attention", "sliding_attention", "full_attention"]}),
        ),
        &["layer_types[1]", "chunked_attention"],
    );
}

#[test]
fn rejects_bad_per_layer_config() {
    assert_config_err(
        &text_json(serde_json::json!({"per_layer_config": {"9": {"head_dim": 64}}})),
        &["per_layer_config.9", "layer index"],
    );
    assert_config_err(
        &text_json(serde_json::json!({"per_layer_config": {"1": {"intermediate_size": 64}}})),
        &["per_layer_config.1.intermediate_size"],
    );
    assert_config_err(
        &text_json(serde_json::json!({"per_layer_config": {"1": {"head_dim": "big"}}})),
        &["per_layer_config.1.head_dim"],
    );
}

#[test]
fn rejects_bad_rope() {
    assert_config_err(
        &text_json(serde_json::json!({"rope_parameters": {
            "sliding_attention": {"rope_type": "yarn", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "proportional", "rope_theta": 1e6, "partial_rotary_factor": 0.25}
        }})),
        &["rope_parameters.sliding_attention.rope_type", "yarn"],
    );
    assert_config_err(
        &text_json(serde_json::json!({"rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}
        }})),
        &["rope_parameters.full_attention", "missing"],
    );
    assert_config_err(
        &text_json(serde_json::json!({"rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "proportional", "rope_theta": 1e6, "partial_rotary_factor": 1.5}
        }})),
        &["rope_parameters.full_attention.partial_rotary_factor"],
    );
    assert_config_err(
        &text_json(serde_json::json!({"rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": -1.0},
            "full_attention": {"rope_type": "proportional", "rope_theta": 1e6, "partial_rotary_factor": 0.25}
        }})),
        &["rope_parameters.sliding_attention.rope_theta"],
    );
}

#[test]
fn rejects_inconsistent_sizes() {
    assert_config_err(
        &text_json(serde_json::json!({"hidden_size": 0})),
        &["hidden_size"],
    );
    assert_config_err(
        &text_json(serde_json::json!({"num_hidden_layers": 0, "layer_types": []})),
        &["num_hidden_layers"],
    );
    assert_config_err(
        &text_json(serde_json::json!({"vocab_size": 0})),
        &["vocab_size"],
    );
    assert_config_err(
        &text_json(serde_json::json!({"num_key_value_heads": 3})),
        &["num_key_value_heads", "layer 0"],
    );
    assert_config_err(
        &text_json(serde_json::json!({"num_global_key_value_heads": 3})),
        &["num_key_value_heads", "layer 1"],
    );
    assert_config_err(
        &text_json(serde_json::json!({"head_dim": 31})),
        &["head_dim", "layer 0"],
    );
    assert_config_err(
        &text_json(serde_json::json!({"global_head_dim": 1024})),
        &["head_dim", "layer 1"],
    );
    assert_config_err(
        &text_json(serde_json::json!({"top_k_experts": 9, "num_experts": 16})),
        &["top_k_experts"],
    );
    assert_config_err(
        &text_json(serde_json::json!({"top_k_experts": 4, "num_experts": 3})),
        &["top_k_experts", "num_experts"],
    );
    assert_config_err(
        &text_json(serde_json::json!({"num_experts": 512})),
        &["num_experts"],
    );
    assert_config_err(
        &text_json(serde_json::json!({"top_k_experts": 0})),
        &["top_k_experts"],
    );
    assert_config_err(
        &text_json(serde_json::json!({"moe_intermediate_size": 0})),
        &["moe_intermediate_size"],
    );
    assert_config_err(
        &text_json(serde_json::json!({"sliding_window": 0})),
        &["sliding_window"],
    );
    assert_config_err(
        &text_json(serde_json::json!({"final_logit_softcapping": 0.0})),
        &["final_logit_softcapping"],
    );
    assert_config_err(
        &text_json(serde_json::json!({"rms_norm_eps": 0.0})),
        &["rms_norm_eps"],
    );
    assert_config_err(
        &text_json(serde_json::json!({"hidden_size": 1u64 << 40})),
        &["hidden_size"],
    );
}

#[test]
fn validate_names_the_field() {
    let mut c = ModelConfig::gemma4_26b_a4b();
    c.top_k = 9;
    match c.validate() {
        Err(Error::Config { detail, .. }) => assert!(detail.contains("top_k_experts"), "{detail}"),
        other => panic!("{other:?}"),
    }
    let mut c = ModelConfig::gemma4_26b_a4b();
    c.layers[3].head_dim = 7;
    match c.validate() {
        Err(Error::Config { detail, .. }) => {
            assert!(detail.contains("head_dim (layer 3"), "{detail}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn eos_token_ids_one_or_many() {
    let ids = |extra| parse(&text_json(extra)).unwrap().eos_token_ids;
    assert_eq!(ids(serde_json::json!({})), Vec::<u32>::new());
    assert_eq!(ids(serde_json::json!({"eos_token_id": 1})), vec![1]);
    assert_eq!(
        ids(serde_json::json!({"eos_token_id": [1, 106]})),
        vec![1, 106]
    );
    // The multimodal spelling keeps it at the top level.
    let mm = multimodal_json(
        &text_json(serde_json::json!({})),
        serde_json::json!({"eos_token_id": [1, 7]}),
    );
    assert_eq!(parse(&mm).unwrap().eos_token_ids, vec![1, 7]);
    assert_config_err(
        &text_json(serde_json::json!({"eos_token_id": "one"})),
        &["eos_token_id"],
    );
    assert_config_err(
        &text_json(serde_json::json!({"eos_token_id": [1, -2]})),
        &["eos_token_id"],
    );
    assert_config_err(
        &text_json(serde_json::json!({"eos_token_id": 512})),
        &["eos_token_id"],
    );
}
