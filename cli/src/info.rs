//! `turbospark info`: the adapters wgpu finds and the chosen one's features
//! and limits; with --model, the config summary, parameter count, bytes read
//! per decoded token and the device memory a run will need.

use std::path::PathBuf;

use turbospark::model::decoder::{runtime_bytes, stream_scratch_bytes, DEFAULT_PREFILL_BATCH};
use turbospark::model::{LayerKind, ModelConfig};
use turbospark::{ComputeBackend, DType};
use turbospark_wgpu::WgpuBackend;

use crate::common::{human_bytes, open_checkpoint, open_wgpu, resolve_context, CliResult, KvCache};

#[derive(clap::Args)]
pub struct Args {
    /// Checkpoint directory to describe.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Case-insensitive substring of the adapter name to describe.
    #[arg(long)]
    adapter: Option<String>,
    /// Context length to size the KV caches for (default: 4096, or the
    /// model's max_position_embeddings where smaller).
    #[arg(long, allow_negative_numbers = true)]
    max_context: Option<usize>,
    /// Prompt tokens per prefill pass to size the batch activations for.
    #[arg(long, default_value_t = DEFAULT_PREFILL_BATCH, allow_negative_numbers = true)]
    prefill_batch: usize,
    /// The KV caches' element type to size them for.
    #[arg(long, value_enum, default_value = "f32")]
    kv_cache: KvCache,
    /// Also size a run whose routed experts are streamed through N device
    /// slots a layer (`generate --expert-slots N`).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    expert_slots: Option<usize>,
}

pub fn run(a: Args) -> CliResult {
    let adapters = turbospark_wgpu::list_adapters();
    println!("adapters ({}):", adapters.len());
    for ad in &adapters {
        println!(
            "  {} [{} {:?}] {}",
            ad.name, ad.api, ad.device_type, ad.driver
        );
    }
    match open_wgpu(a.adapter.clone()) {
        Ok(b) => print_backend(&b),
        Err(e) => println!("no usable wgpu adapter: {e}"),
    }
    if let Some(dir) = &a.model {
        let ck = open_checkpoint(dir)?;
        let max_context = resolve_context(dir, a.max_context)?;
        let dtype = ck.dtype_of("embed_tokens.weight").unwrap_or(DType::BF16);
        print_model(
            ck.config(),
            dtype,
            (ck.total_bytes(), ck.bytes_per_token()),
            (max_context, a.prefill_batch, a.kv_cache.dtype()),
        );
        if let Some(n) = a.expert_slots {
            let cfg = ck.config();
            if !cfg.enable_moe || !(cfg.top_k..=cfg.experts).contains(&n) {
                return Err(format!(
                    "--expert-slots {n}: from top_k = {} to the {} experts of a layer{}",
                    cfg.top_k,
                    cfg.experts,
                    if cfg.enable_moe {
                        ""
                    } else {
                        " (the model has none)"
                    }
                )
                .into());
            }
            let batch = a.prefill_batch.min(max_context);
            let weights = ck.device_weight_bytes(Some(n));
            let run = runtime_bytes(cfg, max_context, batch, a.kv_cache.dtype())
                + stream_scratch_bytes(cfg, 1)
                + stream_scratch_bytes(cfg, batch);
            println!(
                "  with --expert-slots {n} ({n} of {} experts a layer on the device, the rest \
                 streamed from the checkpoint): {} weights + {} KV caches and scratch = {}",
                cfg.experts,
                human_bytes(weights),
                human_bytes(run),
                human_bytes(weights + run)
            );
            // A prefill batch past the slots holds a layer's experts in
            // full-layer stacks while it runs: weights at every expert a
            // slot less weights at n are every layer's E - n experts (the
            // slot tables, one size at any n, cancel).
            let full = if n < cfg.experts {
                (ck.device_weight_bytes(Some(cfg.experts)) - weights) * cfg.experts as u64
                    / (cfg.layers.len() * (cfg.experts - n)) as u64
            } else {
                0
            };
            if full > 0 {
                println!(
                    "  a prefill batch whose experts exceed the slots also holds a layer's {} \
                     experts ({}) while it runs: {} at its peak (--stream-prefill token-waves \
                     holds none, and is slower)",
                    cfg.experts,
                    human_bytes(full),
                    human_bytes(weights + run + full)
                );
            }
            println!("  {}", mac_fit(weights + run + full));
            if full > 0 {
                println!(
                    "  --expert-store host also holds every layer's experts in host memory: {} \
                     (besides the checkpoint's pages)",
                    human_bytes(full * cfg.layers.len() as u64)
                );
            }
        }
    }
    Ok(())
}

fn print_backend(b: &WgpuBackend) {
    let i = b.info();
    println!(
        "chosen: {} ({} on {}, {:?}) driver {}",
        i.device_name, i.backend, i.api, i.device_type, i.driver
    );
    let f = b.features();
    println!(
        "  features: shader_f16={} subgroups={} (sizes {}..{}) timestamps={} cooperative_matrix={}",
        f.shader_f16,
        f.subgroups,
        f.subgroup_min_size,
        f.subgroup_max_size,
        f.timestamps,
        if f.cooperative_matrix.is_empty() {
            "none".to_string()
        } else {
            f.cooperative_matrix.join(", ")
        }
    );
    println!(
        "  prefill GEMM: {}",
        if f.tensor_core_gemm {
            "tensor cores (f16 x with per-row scale, f32 accumulation)"
        } else {
            "f32 units"
        }
    );
    println!(
        "  precision: {} (default; --precision on generate, chat, logits and bench): {}",
        turbospark::Precision::default(),
        if f.tensor_core_gemm {
            "exact splits each tensor-core activation in two f16 parts (the f32 floor), \
             fast rounds it once"
        } else {
            "no tensor cores here: both compute in f32"
        }
    );
    println!(
        "  MoE expert weights: {}",
        if f.expert_tiles {
            "tile order where the shape allows (TURBOSPARK_EXPERT_TILES=0 turns it off)"
        } else {
            "as in the checkpoint"
        }
    );
    println!(
        "  coherent storage: {}",
        if f.coherent_storage {
            "yes (decode attention combines in its last workgroup; TURBOSPARK_TAILS=0 turns it off)"
        } else {
            "no"
        }
    );
    println!(
        "  streamed experts' misses: {}",
        if f.mapped_slots {
            "copied into their mapped slots (unified memory; TURBOSPARK_MAPPED_SLOTS=0 stages them)"
        } else {
            "copied into staging, then by the device into their slots"
        }
    );
    let l = &i.limits;
    println!(
        "  limits: max binding {}, max buffer {}, max workgroups/dim {}",
        human_bytes(l.max_binding_bytes),
        human_bytes(l.max_buffer_bytes),
        l.max_workgroups_per_dim
    );
}

fn print_model(
    cfg: &ModelConfig,
    dtype: DType,
    (weight_bytes, per_token): (u64, u64),
    (max_context, prefill_batch, kv_cache): (usize, usize, DType),
) {
    let full = cfg
        .layers
        .iter()
        .filter(|l| l.kind == LayerKind::Full)
        .count();
    println!("model:");
    println!(
        "  hidden {}, {} layers ({} sliding, {} full), {} heads, vocab {}",
        cfg.hidden,
        cfg.layers.len(),
        cfg.layers.len() - full,
        full,
        cfg.heads,
        cfg.vocab
    );
    if let (Some(s), Some(f)) = (
        cfg.layers.iter().find(|l| l.kind == LayerKind::Sliding),
        cfg.layers.iter().find(|l| l.kind == LayerKind::Full),
    ) {
        println!(
            "  sliding: head_dim {}, kv_heads {}, window {}, theta {}; full: head_dim {}, kv_heads {}, theta {}, rotated pairs {}, k_eq_v {}",
            s.head_dim, s.kv_heads, cfg.sliding_window, s.rope_theta, f.head_dim, f.kv_heads, f.rope_theta, f.rot_pairs, f.k_eq_v
        );
    }
    println!(
        "  dense MLP {}; MoE {}: {} experts, top-{}, expert inter {}; softcap {:?}",
        cfg.intermediate, cfg.enable_moe, cfg.experts, cfg.top_k, cfg.moe_inter, cfg.final_softcap
    );
    println!("  parameters: {}", cfg.parameter_count());
    println!(
        "  bytes read per decoded token (weights as stored, {dtype} embedding): {}",
        human_bytes(per_token)
    );
    let run = runtime_bytes(cfg, max_context, prefill_batch, kv_cache);
    println!(
        "  memory for a run at --max-context {max_context} (prefill batches of \
         {prefill_batch}, {kv_cache} KV caches): {} weights + {} KV caches and scratch = {}",
        human_bytes(weight_bytes),
        human_bytes(run),
        human_bytes(weight_bytes + run)
    );
    println!("  {}", mac_fit(weight_bytes + run));
}

/// Unified memory sizes of common Apple Silicon Macs, in GB.
const MAC_GB: [u64; 5] = [16, 24, 36, 48, 64];

/// Which common Mac sizes hold `bytes` on the GPU. macOS lets a process's
/// Metal buffers take about three quarters of unified memory by default
/// (the device's `recommendedMaxWorkingSetSize`, as llama.cpp and mlx
/// users report it; `sysctl iogpu.wired_limit_mb` raises it): an estimate,
/// not a measurement.
fn mac_fit(bytes: u64) -> String {
    let fits: Vec<String> = MAC_GB
        .iter()
        .filter(|&&gb| bytes <= gb * 1_000_000_000 / 4 * 3)
        .map(|gb| format!("{gb} GB"))
        .collect();
    let held = if fits.is_empty() {
        "none of 16, 24, 36, 48, 64 GB".to_string()
    } else {
        fits.join(", ")
    };
    format!(
        "Macs whose GPU holds it (about 3/4 of unified memory, macOS's default \
         working-set limit): {held}"
    )
}
