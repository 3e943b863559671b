//! Streamed experts (`ModelOptions::expert_slots`) against the resident
//! layout: the same logits bit for bit and the same greedy tokens, on every
//! backend, for every slot count from top_k to the expert count, on the
//! float and quantized fixtures (on wgpu, where its route-list kernel takes
//! the float fixtures' odd expert width, to the f32 floor instead:
//! [`REORDERED_SUM_NMSE`]). The fixtures' 8 experts and 10-token
//! prompts make small slot counts miss and evict on nearly every token,
//! and run the prefill batch in waves.

mod common;
#[path = "common/primitives_only.rs"]
mod primitives_only;

use std::path::{Path, PathBuf};

use turbospark::model::experts::{
    Counts, ExpertStore, Optimism, Policy, SlotCache, StreamPrefill, ROUTES_AN_EXPERT,
};
use turbospark::model::{Checkpoint, GenerateOptions, ModelOptions, OneSequence, TensorSource};
use turbospark::{ComputeBackend, SlotWrite};
use turbospark_cpu::CpuBackend;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn tokens(dir: &Path) -> (Vec<u32>, usize) {
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let t = j["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect();
    (t, j["prompt_len"].as_u64().unwrap() as usize)
}

fn options(slots: Option<usize>, policy: Policy, prefill_batch: usize) -> ModelOptions {
    ModelOptions {
        max_context: 64,
        prefill_batch,
        expert_slots: slots,
        expert_policy: policy,
        ..Default::default()
    }
}

const OPTIMISMS: [Optimism; 3] = [Optimism::Never, Optimism::AfterHit, Optimism::Always];

/// What a run produces: teacher-forced logits (as bits) over the tokens in
/// two calls (the second continues the first's caches, as chat does), and
/// the greedy continuation of the prompt after a reset.
struct Run {
    logits: Vec<Vec<u32>>,
    greedy: Vec<u32>,
}

/// Logits rows as their bits (compared exactly).
fn bits(rows: Vec<Vec<f32>>) -> Vec<Vec<u32>> {
    rows.into_iter()
        .map(|r| r.into_iter().map(f32::to_bits).collect())
        .collect()
}

fn run<B: ComputeBackend>(model: &mut OneSequence<B>, toks: &[u32], prompt: usize) -> Run {
    let mut logits = bits(model.logits(&toks[..prompt]).unwrap());
    logits.extend(bits(model.logits(&toks[prompt..]).unwrap()));
    model.reset();
    let g = model
        .generate(
            &toks[..prompt],
            &GenerateOptions {
                max_new_tokens: toks.len() - prompt,
                ..Default::default()
            },
        )
        .unwrap();
    Run {
        logits,
        greedy: g.tokens,
    }
}

/// Every slot count of `name` on `backend` against its resident run, with
/// prefill batches of `batch` tokens, the misses taking `path` into their
/// slots; the backend comes back.
fn streams_bit_identically<B: ComputeBackend>(
    backend: B,
    name: &str,
    batch: usize,
    path: SlotWrite,
) -> B {
    streams_like_resident(backend, name, (batch, path), None)
}

/// Where a backend's MoE down phase sums a token's experts in an order that
/// follows their numbering (the wgpu route-list kernel, which takes
/// `moe_inter` not a multiple of 8: the float fixtures' 12, no Gemma 4
/// shape), slot numbering reorders that k-term f32 sum: a few ulp per MoE
/// layer, compounded over the fixtures' 4 layers and the softcap (measured
/// 2026-12-02 on lavapipe: at most 1.8e-12). A wrong expert or a flipped
/// route gives over 1e-3.
const REORDERED_SUM_NMSE: f64 = 1e-10;

/// As [`streams_bit_identically`], or with `nmse` Some(limit) each logits
/// row within that NMSE of the resident one (and the same greedy tokens).
fn streams_like_resident<B: ComputeBackend>(
    backend: B,
    name: &str,
    (batch, path): (usize, SlotWrite),
    nmse: Option<f64>,
) -> B {
    streams_like_resident_from(backend, name, (batch, path), nmse, ExpertStore::Mapping)
}

/// [`streams_like_resident`] with the misses copied from `store`.
fn streams_like_resident_from<B: ComputeBackend>(
    mut backend: B,
    name: &str,
    (batch, path): (usize, SlotWrite),
    nmse: Option<f64>,
    store: ExpertStore,
) -> B {
    let dir = fixture(name);
    let ck = Checkpoint::open(&dir).unwrap();
    let (toks, prompt) = tokens(&dir);
    let (k, e) = (ck.config().top_k, ck.config().experts);
    let mut model = OneSequence::load(backend, &ck, options(None, Policy::Lfu, batch)).unwrap();
    let resident = run(&mut model, &toks, prompt);
    backend = model.into_backend();
    let mut per_layer = None;
    // Every slot count, policy and optimism with the default prefill
    // (full-layer stacks), then each slot count in token waves.
    let runs = (k..=e)
        .flat_map(|n| {
            [Policy::Lfu, Policy::Lru]
                .into_iter()
                .flat_map(move |p| OPTIMISMS.map(|o| (n, p, o, StreamPrefill::FullLayer)))
        })
        .chain((k..e).map(|n| (n, Policy::Lfu, Optimism::Never, StreamPrefill::TokenWaves)));
    for (slots, policy, optimism, prefill) in runs {
        {
            let what = format!(
                "{name}, {slots} slots, {}, optimism {}, batch {batch}, prefill {}, store {}",
                policy.name(),
                optimism.name(),
                prefill.name(),
                store.name()
            );
            let o = ModelOptions {
                expert_optimism: optimism,
                stream_prefill: prefill,
                expert_store: store,
                ..options(Some(slots), policy, batch)
            };
            let mut model = OneSequence::load(backend, &ck, o).unwrap();
            let got = run(&mut model, &toks, prompt);
            for (i, (a, b)) in got.logits.iter().zip(&resident.logits).enumerate() {
                match nmse {
                    None => assert!(
                        a == b,
                        "{what}: logits row {i} differ from the resident run"
                    ),
                    Some(limit) => {
                        let f =
                            |r: &[u32]| r.iter().map(|&u| f32::from_bits(u)).collect::<Vec<_>>();
                        let e = common::nmse(&f(a), &f(b));
                        assert!(
                            e <= limit,
                            "{what}: logits row {i} at NMSE {e:e} > {limit:e}"
                        );
                    }
                }
            }
            assert_eq!(got.logits.len(), resident.logits.len(), "{what}");
            assert_eq!(got.greedy, resident.greedy, "{what}: greedy tokens");
            let st = model.take_stream_stats().expect("streamed");
            assert!(st.counts.misses >= e.min(slots) as u64, "{what}: {st:?}");
            assert_eq!(st.write_path, Some(path), "{what}: the misses' path");
            if slots < e {
                assert!(st.counts.hits > 0 && st.bytes > 0, "{what}: {st:?}");
            }
            if slots < 2 * k && batch > 1 {
                let (waves, full) = match prefill {
                    StreamPrefill::FullLayer => (0, st.full_layer_passes),
                    StreamPrefill::TokenWaves => (st.extra_waves, 0),
                };
                assert!(
                    waves + full > 0 && waves * full == 0,
                    "{what}: no prefill past the slots ran as asked: {st:?}"
                );
                assert_eq!(
                    (st.extra_waves, st.full_layer_passes),
                    (waves, full),
                    "{what}"
                );
            }
            if prefill == StreamPrefill::TokenWaves {
                backend = model.into_backend();
                continue;
            }
            // The slots as the per-layer path places them: its hits,
            // misses and bytes (every optimism runs after Never).
            if optimism == Optimism::Never {
                per_layer = Some(st);
            }
            let pl = per_layer.expect("Never runs first");
            assert_eq!((st.counts, st.bytes), (pl.counts, pl.bytes), "{what}");
            match optimism {
                Optimism::Never => assert_eq!(st.optimistic, 0, "{what}: {st:?}"),
                Optimism::Always => assert!(st.optimistic > 0, "{what}: {st:?}"),
                Optimism::AfterHit => {}
            }
            if slots == e && optimism != Optimism::Never {
                // (every expert in a slot once used: decode ends up hitting)
                assert!(st.stood > 0, "{what}: no optimistic pass stood: {st:?}");
            }
            backend = model.into_backend();
        }
    }
    backend
}

const FIXTURES: [&str; 4] = [
    "tiny-text",
    "tiny-multimodal",
    "tiny-text-q4",
    "tiny-multimodal-g32",
];

#[test]
fn cpu_streams_bit_identically() {
    let mut be = CpuBackend::new();
    for name in FIXTURES {
        be = streams_bit_identically(be, name, 512, SlotWrite::Host);
    }
    // Prefill in batches of 3: waves within each, and decode after.
    be = streams_bit_identically(be, "tiny-text", 3, SlotWrite::Host);
    // Batches of 1: a sliding ring of just the window, where pipelined
    // decode settles each optimistic step before recording the next.
    streams_bit_identically(be, "tiny-text", 1, SlotWrite::Host);
}

/// On the default adapter's path: straight into mapped slots where its
/// memory is the host's (under `CI=true` on lavapipe it must be,
/// `common::slot_write`), else through staging.
#[test]
fn wgpu_streams_bit_identically() {
    let Some(mut be) = common::wgpu_backend() else {
        return;
    };
    let path = common::slot_write(&be);
    eprintln!("misses take the {} path", path.name());
    // (moe_inter 64 and 32: the decode kernels and the GEMM with its
    // moe_sum, which add a token's experts in route order)
    for name in ["tiny-text-q4", "tiny-multimodal-g32"] {
        be = streams_bit_identically(be, name, 512, path);
    }
    be = streams_like_resident(be, "tiny-text", (3, path), Some(REORDERED_SUM_NMSE));
    streams_like_resident(be, "tiny-multimodal", (512, path), Some(REORDERED_SUM_NMSE));
}

/// The staging path where the default would map the slots
/// (`WgpuOptions::mapped_slots` off): the same logits.
#[test]
fn wgpu_streams_bit_identically_through_staging() {
    let Some(mut be) = unmapped(None) else {
        return;
    };
    be = streams_bit_identically(be, "tiny-text-q4", 512, SlotWrite::Staged);
    streams_like_resident(
        be,
        "tiny-text",
        (3, SlotWrite::Staged),
        Some(REORDERED_SUM_NMSE),
    );
}

/// The wgpu backend with its slots unmapped (`WgpuOptions::mapped_slots`
/// off: staging, or a host store), expert tiles as `tiles` says (None:
/// the adapter's default).
fn unmapped(tiles: Option<bool>) -> Option<turbospark_wgpu::WgpuBackend> {
    let be = common::wgpu_backend_with(&turbospark_wgpu::WgpuOptions {
        mapped_slots: Some(false),
        expert_tiles: tiles,
        ..Default::default()
    })?;
    assert!(!be.features().mapped_slots);
    Some(be)
}

/// Misses copied by the device from a host store of every expert
/// (`ExpertStore::Host`, where the slots are not mapped): the same logits
/// as resident, every slot count, policy, optimism and prefill; on the CPU
/// the store is not made and the misses come from the mapping.
#[test]
fn wgpu_streams_bit_identically_from_a_host_store() {
    let Some(mut be) = unmapped(None) else {
        return;
    };
    let host = ExpertStore::Host;
    be = streams_like_resident_from(be, "tiny-text-q4", (512, SlotWrite::Device), None, host);
    be = streams_like_resident_from(
        be,
        "tiny-multimodal-g32",
        (3, SlotWrite::Device),
        None,
        host,
    );
    streams_like_resident_from(
        be,
        "tiny-text",
        (3, SlotWrite::Device),
        Some(REORDERED_SUM_NMSE),
        host,
    );
    let cpu = (512, SlotWrite::Host);
    streams_like_resident_from(CpuBackend::new(), "tiny-text-q4", cpu, None, host);
}

/// The host store of a tile-ordered slot stack holds its experts tiled:
/// the same logits as resident, full-layer prefill (whose stacks of every
/// expert may be laid out otherwise) and decode misses.
#[test]
fn wgpu_streams_tiled_slots_from_a_host_store() {
    let Some(mut be) = unmapped(Some(true)) else {
        return;
    };
    let cfg = common::tiled_experts_config();
    let src = turbospark::model::SyntheticSource::new(cfg.clone(), 7).unwrap();
    let mut rng = turbospark::rng::Rng::new(5);
    let toks: Vec<u32> = (0..24)
        .map(|_| rng.below(cfg.vocab as u64) as u32)
        .collect();
    let mut model = OneSequence::load(be, &src, options(None, Policy::Lfu, 16)).unwrap();
    let resident = run(&mut model, &toks, 16);
    be = model.into_backend();
    for slots in [cfg.top_k, cfg.top_k + 1] {
        let o = ModelOptions {
            expert_store: ExpertStore::Host,
            ..options(Some(slots), Policy::Lfu, 16)
        };
        let mut model = OneSequence::load(be, &src, o).unwrap();
        // (the prompt's full-layer stacks, tiled as the slots are, take
        // their experts from the store too, not from the mapping)
        model.logits(&toks[..16]).unwrap();
        let st = model.take_stream_stats().expect("streamed");
        assert!(st.full_layer_passes > 0, "{slots} slots: {st:?}");
        assert_eq!(
            st.write_path,
            Some(SlotWrite::Device),
            "{slots} slots: prefill"
        );
        model.reset();
        let got = run(&mut model, &toks, 16);
        assert!(
            got.logits == resident.logits,
            "{slots} slots: logits differ"
        );
        assert_eq!(got.greedy, resident.greedy, "{slots} slots");
        let st = model.take_stream_stats().expect("streamed");
        assert_eq!(
            st.write_path,
            Some(SlotWrite::Device),
            "{slots} slots: {st:?}"
        );
        assert!(st.counts.misses > 0 && st.full_layer_passes > 0, "{st:?}");
        be = model.into_backend();
    }
}

#[test]
fn slot_counts_below_top_k_are_refused_and_past_the_experts_clamped() {
    let ck = Checkpoint::open(&fixture("tiny-text")).unwrap();
    let (k, e) = (ck.config().top_k, ck.config().experts);
    let m = OneSequence::load(
        CpuBackend::new(),
        &ck,
        options(Some(e + 9), Policy::Lfu, 512),
    )
    .unwrap();
    assert_eq!(m.expert_slots(), Some(e));
    for bad in [0, k - 1] {
        let err = OneSequence::load(CpuBackend::new(), &ck, options(Some(bad), Policy::Lfu, 512))
            .err()
            .unwrap_or_else(|| panic!("{bad} slots accepted"))
            .to_string();
        assert!(err.contains(&format!("{bad} expert slots")), "{err}");
    }
}

#[test]
fn gate_and_up_of_two_formats_are_refused_by_name() {
    let ck = Checkpoint::open(&fixture("tiny-multimodal-mixed")).unwrap();
    let err = OneSequence::load(CpuBackend::new(), &ck, options(Some(4), Policy::Lfu, 512))
        .err()
        .expect("a mixed gate/up checkpoint streamed")
        .to_string();
    assert!(
        err.contains("gate_up_proj") && err.contains("one format"),
        "{err}"
    );
}

/// A checkpoint truncated while a streamed run maps it: the next miss is
/// an error naming the file, not a fault. (wgpu: the CPU backend reads its
/// resident weights from the same maps.)
#[test]
fn a_checkpoint_truncated_under_a_streamed_run_is_named() {
    let Some(be) = common::wgpu_backend() else {
        return;
    };
    let copy = common::temp_dir::TempDir::copy_of(&fixture("tiny-text"), "stream-truncated");
    let dir = copy.path();
    let ck = Checkpoint::open(dir).unwrap();
    let (toks, prompt) = tokens(dir);
    let mut model = OneSequence::load(be, &ck, options(Some(2), Policy::Lfu, 512)).unwrap();
    model.logits(&toks[..prompt]).unwrap();
    let file = dir.join("model.safetensors");
    let len = std::fs::metadata(&file).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let err = model.logits(&toks[prompt..]).unwrap_err().to_string();
    assert!(
        err.contains("model.safetensors") && err.contains("truncated"),
        "{err}"
    );
}

/// The device bytes the wgpu backend counts for a streamed model against
/// the resident one: the experts' stacks shrink to `slots` of each layer's
/// (`Checkpoint::device_weight_bytes`, which `info --expert-slots` prints)
/// and the one-row scratch gains the waves' (`stream_scratch_bytes`).
#[test]
fn the_backend_holds_the_bytes_info_counts() {
    let Some(mut be) = common::wgpu_backend() else {
        return;
    };
    let ck = Checkpoint::open(&fixture("tiny-text")).unwrap();
    let cfg = ck.config().clone();
    let loaded = |be: turbospark_wgpu::WgpuBackend, slots| {
        let before = be.memory().0;
        let model = OneSequence::load(be, &ck, options(slots, Policy::Lfu, 512)).unwrap();
        let held = model.backend().memory().0 - before;
        (held, model.into_backend())
    };
    let (resident, b) = loaded(be, None);
    be = b;
    for slots in [cfg.top_k, 5, cfg.experts] {
        let (streamed, b) = loaded(be, Some(slots));
        be = b;
        // (at every expert a slot, the slot tables make the streamed
        // weights the larger)
        let want = ck.device_weight_bytes(None) as i64 - ck.device_weight_bytes(Some(slots)) as i64;
        let extra = turbospark::model::decoder::stream_scratch_bytes(&cfg, 1);
        assert_eq!(
            resident as i64 - streamed as i64,
            want - extra as i64,
            "{slots} slots: the backend holds {streamed} bytes, resident {resident}"
        );
    }
}

/// A prompt long enough for a prefill pass to write every expert of a
/// layer without reading its ids back ([`ROUTES_AN_EXPERT`] routes an
/// expert): the fixture's tokens, repeated.
fn long_prompt(toks: &[u32], cfg: &turbospark::model::ModelConfig) -> Vec<u32> {
    let n = (ROUTES_AN_EXPERT * cfg.experts).div_ceil(cfg.top_k);
    toks.iter().copied().cycle().take(n).collect()
}

/// A prefill with enough routes an expert writes every expert of each
/// layer into the full-layer stacks, reads no ids back, and gives the
/// resident logits bit for bit (CPU and wgpu).
fn full_layer_without_readback<B: ComputeBackend>(mut be: B) -> B {
    let dir = fixture("tiny-text-q4");
    let ck = Checkpoint::open(&dir).unwrap();
    let (toks, _) = tokens(&dir);
    let cfg = ck.config().clone();
    let input = long_prompt(&toks, &cfg);
    let mut resident = OneSequence::load(be, &ck, options(None, Policy::Lfu, 512)).unwrap();
    let want = bits(resident.logits(&input).unwrap());
    be = resident.into_backend();
    let mut model = OneSequence::load(be, &ck, options(Some(cfg.top_k), Policy::Lfu, 512)).unwrap();
    let got = bits(model.logits(&input).unwrap());
    assert!(
        got == want,
        "{}: not the resident logits",
        model.backend().info().backend
    );
    let st = model.take_stream_stats().expect("streamed");
    assert_eq!(st.full_layer_passes, cfg.layers.len() as u64, "{st:?}");
    assert_eq!(st.waits, 0, "a full-layer pass waited for its ids: {st:?}");
    assert_eq!(
        st.bytes,
        // (slot counts differ by whole experts: their slot tables cancel)
        (ck.device_weight_bytes(Some(cfg.experts)) - ck.device_weight_bytes(Some(cfg.top_k)))
            * cfg.experts as u64
            / (cfg.experts - cfg.top_k) as u64,
        "every layer's experts written once"
    );
    model.into_backend()
}

#[test]
fn cpu_full_layer_passes_read_no_ids_back() {
    full_layer_without_readback(CpuBackend::new());
}

#[test]
fn wgpu_full_layer_passes_read_no_ids_back() {
    if let Some(be) = common::wgpu_backend() {
        full_layer_without_readback(be);
    }
}

/// A prefill past the slots through the full-layer stacks holds a layer's
/// experts only while it runs: the device holds the same bytes after it as
/// before, and held at least a layer's experts beyond the slots during it.
#[test]
fn full_layer_stacks_are_let_go_after_the_pass() {
    let Some(be) = common::wgpu_backend() else {
        return;
    };
    let dir = fixture("tiny-text-q4");
    let ck = Checkpoint::open(&dir).unwrap();
    let (toks, _) = tokens(&dir);
    let cfg = ck.config().clone();
    let input = long_prompt(&toks, &cfg);
    let mut model = OneSequence::load(be, &ck, options(Some(cfg.top_k), Policy::Lfu, 512)).unwrap();
    // (the first pass makes the batch scratch, which stays)
    model.logits(&input).unwrap();
    model.reset();
    let _ = model.take_stream_stats();
    let held = model.backend().memory().0;
    model.backend().reset_peak_memory();
    model.logits(&input).unwrap();
    let (after, peak) = model.backend().memory();
    let st = model.take_stream_stats().expect("streamed");
    assert!(st.full_layer_passes > 0, "{st:?}");
    assert_eq!(after, held, "the full-layer stacks outlived the pass");
    let layer = (ck.device_weight_bytes(None) - ck.device_weight_bytes(Some(cfg.top_k)))
        / cfg.layers.len() as u64;
    assert!(
        peak - held >= layer,
        "the pass held {} bytes past the slots, a layer's experts past them are {layer}",
        peak - held
    );
}

/// Routing by a trace (`Model::route_by`): the router's own recorded
/// routing, replayed, gives the resident run's logits bit for bit; a trace
/// that sends every token to the same experts misses only on the first
/// token and hits from then on; a trace that does not fit, or a model with
/// resident experts, is refused by name.
#[test]
fn a_sequence_routes_by_a_trace() {
    use turbospark::model::experts::Trace;
    use turbospark::model::Model;
    let dir = fixture("tiny-text");
    let ck = Checkpoint::open(&dir).unwrap();
    let (toks, _) = tokens(&dir);
    let resident = Model::load(CpuBackend::new(), &ck, options(None, Policy::Lfu, 4)).unwrap();
    let mut r = resident.new_sequence().unwrap();
    r.record_routing(true);
    let want = resident.logits(&mut r, &toks).unwrap();
    let trace = r.take_routing().unwrap();
    assert_eq!(trace.tokens.len(), toks.len());

    let streamed = Model::load(CpuBackend::new(), &ck, options(Some(3), Policy::Lfu, 4)).unwrap();
    let mut s = streamed.new_sequence().unwrap();
    streamed.route_by(&mut s, Some(trace.clone())).unwrap();
    let got = streamed.logits(&mut s, &toks).unwrap();
    assert_eq!(got, want, "the router's own routing, replayed");

    // Every token to experts 0 and 1 (top_k 2): the first token's pass
    // loads them in every layer, every later token hits.
    let cfg = streamed.config();
    let fixed = Trace {
        experts: cfg.experts,
        tokens: vec![vec![vec![0, 1]; cfg.layers.len()]],
    };
    let mut f = streamed.new_sequence().unwrap();
    streamed.route_by(&mut f, Some(fixed.clone())).unwrap();
    streamed.logits(&mut f, &toks[..1]).unwrap();
    let first = f.take_stream_stats();
    streamed.logits(&mut f, &toks[1..6]).unwrap();
    let later = f.take_stream_stats();
    assert!(first.counts.misses > 0, "{:?}", first.counts);
    assert_eq!(later.counts.misses, 0, "{:?}", later.counts);
    // (a pass looks each of its distinct experts up once: 5 tokens in
    // batches of 4 are two passes, each of experts 0 and 1 in each layer)
    assert_eq!(later.counts.hits, (2 * 2 * cfg.layers.len()) as u64);
    // The trace's ids are the host's before the pass: a pass of one row
    // (a decode step) waits for no readback, misses or not.
    s.take_stream_stats();
    for &t in &toks[6..9] {
        streamed.logits(&mut s, &[t]).unwrap();
        streamed.logits(&mut f, &[t]).unwrap();
    }
    for st in [s.take_stream_stats(), f.take_stream_stats()] {
        assert_eq!((st.waits, st.optimistic), (0, 0), "{st:?}");
    }

    let mut wrong = fixed.clone();
    wrong.tokens[0][0] = vec![0, 0];
    let e = streamed
        .route_by(&mut f, Some(wrong))
        .unwrap_err()
        .to_string();
    assert!(e.contains("not 2 distinct experts"), "{e}");
    let e = resident
        .route_by(&mut r, Some(fixed))
        .unwrap_err()
        .to_string();
    assert!(e.contains("needs streamed experts"), "{e}");
}

/// The resident run's logits (as bits) of `toks` decoded one row at a
/// time, and its routing.
fn resident_rows<B: ComputeBackend>(
    backend: B,
    src: &dyn TensorSource,
    toks: &[u32],
) -> (Vec<Vec<u32>>, turbospark::model::experts::Trace, B) {
    use turbospark::model::Model;
    let resident = Model::load(backend, src, options(None, Policy::Lfu, 512)).unwrap();
    let mut r = resident.new_sequence().unwrap();
    r.record_routing(true);
    let rows = toks
        .iter()
        .map(|&t| {
            let row = resident.logits(&mut r, &[t]).unwrap().remove(0);
            row.into_iter().map(f32::to_bits).collect()
        })
        .collect();
    let trace = r.take_routing().unwrap();
    (rows, trace, resident.into_backend())
}

/// Optimistic decode passes (`Optimism::Always`, one row a pass) against
/// the resident rows bit for bit, and each pass's counters against the
/// slot policy replayed on the router's own ids: the same hits and misses
/// a token (placement and LFU counts as the per-layer path's), a pass that
/// stands exactly where every expert hit, a rerun of exactly the layers
/// from the first that missed (one wait for the log, one per rerun layer).
/// Which cases the passes met: every expert missing, every expert hitting,
/// a miss in the last layer only, a rerun layer whose experts differ from
/// the optimistic pass's (its input computed from a wrong expert's slot).
fn optimistic_passes_settle<B: ComputeBackend>(
    mut backend: B,
    src: &dyn TensorSource,
    toks: &[u32],
    (name, path): (&str, SlotWrite),
) -> ([bool; 4], B) {
    use turbospark::model::Model;
    let cfg = src.config().clone();
    let (k, e, n) = (cfg.top_k, cfg.experts, cfg.layers.len());
    let (want, trace, b) = resident_rows(backend, src, toks);
    backend = b;
    let mut seen = [false; 4];
    for slots in k..=e {
        for policy in [Policy::Lfu, Policy::Lru] {
            let what = format!("{name}, {slots} slots, {}", policy.name());
            let o = ModelOptions {
                expert_optimism: Optimism::Always,
                ..options(Some(slots), policy, 512)
            };
            let model = Model::load(backend, src, o).unwrap();
            let mut seq = model.new_sequence().unwrap();
            let mut caches: Vec<SlotCache> = (0..n)
                .map(|_| SlotCache::new(e, slots, policy).unwrap())
                .collect();
            for (t, &tok) in toks.iter().enumerate() {
                let row = model.logits(&mut seq, &[tok]).unwrap().remove(0);
                let got: Vec<u32> = row.into_iter().map(f32::to_bits).collect();
                assert!(got == want[t], "{what}: token {t}'s logits differ");
                let st = seq.take_stream_stats();
                let (mut c, mut first) = (Counts::default(), None);
                for (li, cache) in caches.iter_mut().enumerate() {
                    let loads = cache.place(&trace.tokens[t][li]).unwrap().loads.len() as u64;
                    c.hits += k as u64 - loads;
                    c.misses += loads;
                    if loads > 0 && first.is_none() {
                        first = Some(li);
                    }
                }
                let what = format!("{what}, token {t}: {st:?}");
                assert_eq!(st.counts, c, "{what}");
                let took = (c.misses > 0).then_some(path);
                assert_eq!(st.write_path, took, "{what}");
                assert_eq!(st.optimistic, 1, "{what}");
                assert_eq!(st.stood, u64::from(first.is_none()), "{what}");
                let rerun = first.map_or(0, |f| (n - f) as u64);
                assert_eq!(st.rerun_layers, rerun, "{what}");
                assert_eq!(st.waits, 1 + rerun, "{what}");
                seen[0] |= c.hits == 0;
                seen[1] |= first.is_none();
                seen[2] |= first == Some(n - 1);
                seen[3] |= st.rerouted_layers > 0;
            }
            backend = model.into_backend();
        }
    }
    (seen, backend)
}

/// [`optimistic_passes_settle`] on fixture `name`'s tokens, repeated to 60:
/// over the slot counts and policies the passes meet every case.
fn optimistic_passes_settle_as_the_policy<B: ComputeBackend>(
    backend: B,
    (name, path): (&str, SlotWrite),
) -> B {
    let dir = fixture(name);
    let ck = Checkpoint::open(&dir).unwrap();
    let toks: Vec<u32> = tokens(&dir).0.into_iter().cycle().take(60).collect();
    let (seen, backend) = optimistic_passes_settle(backend, &ck, &toks, (name, path));
    assert_eq!(
        seen, [true; 4],
        "{name}: all missed, all hit, last layer only, rerouted"
    );
    backend
}

#[test]
fn cpu_optimistic_passes_settle_as_the_policy() {
    let mut be = CpuBackend::new();
    for name in ["tiny-text", "tiny-text-q4"] {
        be = optimistic_passes_settle_as_the_policy(be, (name, SlotWrite::Host));
    }
}

/// A backend of primitives only takes `slot_lookup`'s default body (the
/// ids read back and looked up on the host): the same passes.
#[test]
fn primitives_only_optimistic_passes_settle_as_the_policy() {
    let be = primitives_only::PrimitivesOnly::new();
    optimistic_passes_settle_as_the_policy(be, ("tiny-text", SlotWrite::Host));
}

/// Slot stacks in tile order (`common::wgpu_with_tiled_experts`),
/// synthetic weights.
#[test]
fn wgpu_optimistic_passes_settle_on_tiled_slots() {
    let Some((be, cfg)) = common::wgpu_with_tiled_experts() else {
        return;
    };
    let src = turbospark::model::SyntheticSource::new(cfg.clone(), 7).unwrap();
    let mut rng = turbospark::rng::Rng::new(3);
    let toks: Vec<u32> = (0..40)
        .map(|_| rng.below(cfg.vocab as u64) as u32)
        .collect();
    let path = common::slot_write(&be);
    let (seen, _) = optimistic_passes_settle(be, &src, &toks, ("tiled synthetic", path));
    assert!(
        seen[0] && seen[1],
        "tiled: a pass missed and one hit: {seen:?}"
    );
}

#[test]
fn wgpu_optimistic_passes_settle_as_the_policy() {
    let Some(mut be) = common::wgpu_backend() else {
        return;
    };
    // (moe_inter 64 and 32: streamed experts sum in route order, bit for
    // bit the resident run)
    let path = common::slot_write(&be);
    for name in ["tiny-text-q4", "tiny-multimodal-g32"] {
        be = optimistic_passes_settle_as_the_policy(be, (name, path));
    }
}

/// Pipelined greedy decode with every expert in its slot (the slots warmed
/// by another sequence routed over every expert): no step waits for
/// anything, every optimistic pass stands, the tokens are the resident
/// run's. Stopped early by the caller, the steps recorded past the stop
/// are settled as the per-layer path placed them.
fn greedy_steps_that_hit_wait_for_nothing<B: ComputeBackend>(mut backend: B, name: &str) -> B {
    use std::ops::ControlFlow;
    use turbospark::model::experts::Trace;
    use turbospark::model::Model;
    let dir = fixture(name);
    let ck = Checkpoint::open(&dir).unwrap();
    let (toks, prompt) = tokens(&dir);
    let cfg = ck.config().clone();
    let (k, e, n) = (cfg.top_k, cfg.experts, cfg.layers.len());
    let greedy = |m: &Model<B>, seq: &mut turbospark::model::Sequence<B>, stop: usize| {
        m.logits(seq, &toks[..prompt - 1]).unwrap();
        let mut seen = 0;
        m.generate_streaming(
            seq,
            &toks[prompt - 1..prompt],
            &GenerateOptions {
                max_new_tokens: 12,
                ..Default::default()
            },
            |_| {
                seen += 1;
                if seen == stop {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            },
        )
        .unwrap()
        .tokens
    };
    let resident = Model::load(backend, &ck, options(None, Policy::Lfu, 512)).unwrap();
    let mut r = resident.new_sequence().unwrap();
    let want = greedy(&resident, &mut r, 0);
    backend = resident.into_backend();
    // Every expert of every layer, top_k a token.
    let all = Trace {
        experts: e,
        tokens: (0..e / k)
            .map(|t| vec![(t * k..(t + 1) * k).map(|x| x as u32).collect(); n])
            .collect(),
    };
    let mut counts = Vec::new();
    for optimism in [Optimism::Never, Optimism::Always] {
        let o = ModelOptions {
            expert_optimism: optimism,
            ..options(Some(e), Policy::Lfu, 512)
        };
        let model = Model::load(backend, &ck, o).unwrap();
        let mut w = model.new_sequence().unwrap();
        model.route_by(&mut w, Some(all.clone())).unwrap();
        model.logits(&mut w, &toks[..e / k]).unwrap();
        let mut seq = model.new_sequence().unwrap();
        let got = greedy(&model, &mut seq, 0);
        assert_eq!(got, want, "{name}, {}: greedy tokens", optimism.name());
        let st = seq.take_stream_stats();
        assert_eq!(st.counts.misses, 0, "{st:?}");
        if optimism == Optimism::Always {
            // The prompt's batch waits a layer (the per-layer path); the
            // first token's pass is the prompt's last (settled at once:
            // one wait); the other 11 are pipelined and wait for nothing.
            assert_eq!((st.optimistic, st.stood), (12, 12), "{st:?}");
            assert_eq!(st.waits, n as u64 + 1, "{name}: {st:?}");
        }
        // Stopped after 3 tokens: the steps run past the stop are settled
        // as the per-layer path placed them when it recorded them (hits,
        // here: the same count either way).
        let mut stopped = model.new_sequence().unwrap();
        let got = greedy(&model, &mut stopped, 3);
        assert_eq!(got, want[..3], "{name}, {}: stopped", optimism.name());
        counts.push(stopped.take_stream_stats());
        backend = model.into_backend();
    }
    assert_eq!(
        (counts[0].counts, counts[0].bytes),
        (counts[1].counts, counts[1].bytes),
        "{name}: the slots after a stop: {counts:?}"
    );
    backend
}

#[test]
fn cpu_greedy_steps_that_hit_wait_for_nothing() {
    let be = CpuBackend::new();
    greedy_steps_that_hit_wait_for_nothing(be, "tiny-text");
}

#[test]
fn wgpu_greedy_steps_that_hit_wait_for_nothing() {
    let Some(be) = common::wgpu_backend() else {
        return;
    };
    greedy_steps_that_hit_wait_for_nothing(be, "tiny-text-q4");
}

/// Dispatches a greedy decode step records (from two runs of different
/// lengths) on a model of `ck` with `o`, every expert placed first where
/// it streams them; and the tokens of the longer run.
fn dispatches_a_step(
    backend: turbospark_wgpu::WgpuBackend,
    ck: &Checkpoint,
    o: ModelOptions,
) -> (u64, Vec<u32>, turbospark_wgpu::WgpuBackend) {
    use turbospark::model::experts::Trace;
    use turbospark::model::Model;
    let cfg = ck.config().clone();
    let (k, e, n) = (cfg.top_k, cfg.experts, cfg.layers.len());
    let streamed = o.expert_slots.is_some();
    let model = Model::load(backend, ck, o).unwrap();
    if streamed {
        // (every expert of every layer placed, top_k a token)
        let all = Trace {
            experts: e,
            tokens: (0..e / k)
                .map(|t| vec![(t * k..(t + 1) * k).map(|x| x as u32).collect(); n])
                .collect(),
        };
        let mut w = model.new_sequence().unwrap();
        model.route_by(&mut w, Some(all)).unwrap();
        model.logits(&mut w, &vec![1; e / k]).unwrap();
    }
    let run = |steps: usize| {
        let mut seq = model.new_sequence().unwrap();
        let before = model.backend().counters().0;
        let opts = GenerateOptions {
            max_new_tokens: steps,
            stop_at_eos: false,
            ..Default::default()
        };
        let g = model.generate(&mut seq, &[2, 3, 4], &opts).unwrap();
        if streamed {
            assert_eq!(seq.take_stream_stats().counts.misses, 0);
        }
        (model.backend().counters().0 - before, g.tokens)
    };
    run(2); // every pipeline compiled first
    let (d2, _) = run(2);
    let (d8, tokens) = run(8);
    ((d8 - d2) / 6, tokens, model.into_backend())
}

/// A decode step whose experts all hit, recorded optimistically, takes
/// as many dispatches as the resident step: the slot lookup rides in the
/// routed gate_up pair's launch (`post_attention_gate_up_slots`), the
/// same tokens.
#[test]
fn wgpu_all_hit_steps_dispatch_as_resident() {
    let Some(be) = common::wgpu_backend() else {
        return;
    };
    let ck = Checkpoint::open(&fixture("tiny-text-q4")).unwrap();
    let e = ck.config().experts;
    let (resident, want, be) = dispatches_a_step(be, &ck, options(None, Policy::Lfu, 512));
    let o = ModelOptions {
        expert_optimism: Optimism::Always,
        ..options(Some(e), Policy::Lfu, 512)
    };
    let (streamed, got, _) = dispatches_a_step(be, &ck, o);
    assert_eq!(got, want, "the streamed tokens");
    assert_eq!(
        streamed, resident,
        "dispatches a step: streamed at all hits against resident"
    );
}
