//! Seeded random bf16 weights for any [`ModelConfig`]: tests on tiny shapes,
//! and the full-size benchmark without a 52 GB download.
//!
//! Each tensor is generated on demand from `(seed, name)` alone, so the
//! result does not depend on the order tensors are asked for, and the full
//! model never sits in host memory at once: the loader uploads a tensor and
//! drops its host copy (an anonymous memory map) before asking for the next.
//!
//! Scales keep activations sane through many layers: projections are uniform
//! with standard deviation `1/sqrt(fan_in)`, the embedding `1/sqrt(hidden)`
//! (it is multiplied by `sqrt(hidden)`), norms and scales near 1 but not at 1
//! (so a missing `* w` would show).

use std::collections::HashMap;
use std::sync::Arc;

use crate::backend::HostBytes;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::model::config::ModelConfig;
use crate::model::tensor_ref::TensorRef;
use crate::model::tensors::WeightBytes;
use crate::model::weights::TensorSource;
use crate::quant::{Affine, ScaleType};
use crate::rng::Rng;

/// How a tensor's values are drawn.
#[derive(Clone, Copy, Debug)]
enum Init {
    /// Uniform with this standard deviation around 0.
    Centered(f32),
    /// Uniform in `[lo, hi)`.
    Range(f32, f32),
}

/// A [`TensorSource`] of seeded random bf16 weights, or with
/// [`SyntheticSource::quantized`] MLX affine ones.
pub struct SyntheticSource {
    cfg: ModelConfig,
    seed: u64,
    tensors: HashMap<String, (Vec<usize>, Init)>,
    quant: Option<SyntheticQuant>,
}

/// A synthetic model's quantization, in mlx-community's layout (what
/// mlx-lm's `quantize_model` writes for Gemma 4): every projection, the
/// experts and the embedding at `bits` and `group` with bf16 scales and
/// biases, the router at 8 bits group 64, and a matrix whose rows the group
/// does not divide left in bf16.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyntheticQuant {
    pub bits: u8,
    pub group: u16,
}

impl SyntheticQuant {
    /// The format of tensor `name` (`shape`, rows last), or None for bf16.
    pub fn format_of(&self, name: &str, shape: &[usize]) -> Option<Affine> {
        let quantized = name.ends_with("_proj.weight")
            || name.ends_with("router.proj.weight")
            || name.ends_with("experts.gate_up_proj")
            || name.ends_with("experts.down_proj")
            || name == "embed_tokens.weight";
        if !quantized {
            return None;
        }
        let (bits, group) = if name.ends_with("router.proj.weight") {
            (8, 64)
        } else {
            (self.bits as u32, self.group as u32)
        };
        let a = Affine::new(bits, group, ScaleType::BF16).ok()?;
        a.fits_cols(*shape.last()?).then_some(a)
    }
}

impl SyntheticSource {
    pub fn new(cfg: ModelConfig, seed: u64) -> Result<Self> {
        cfg.validate()?;
        let tensors = inventory(&cfg);
        Ok(SyntheticSource {
            cfg,
            seed,
            tensors,
            quant: None,
        })
    }

    /// The same model with its weights quantized as `q` says: random
    /// packed values and scales and biases that keep each weight's spread
    /// (no bf16 model is made and quantized, so a 26B one loads as fast).
    pub fn quantized(cfg: ModelConfig, seed: u64, q: SyntheticQuant) -> Result<Self> {
        Affine::new(q.bits as u32, q.group as u32, ScaleType::BF16)?;
        let mut s = SyntheticSource::new(cfg, seed)?;
        s.quant = Some(q);
        Ok(s)
    }

    /// The stored dtype of tensor `name`.
    fn dtype_of(&self, name: &str, shape: &[usize]) -> DType {
        self.quant
            .and_then(|q| q.format_of(name, shape))
            .map_or(DType::BF16, DType::Affine)
    }

    /// Bytes of the tensors as stored, by the checkpoint's rule.
    fn stored_bytes(&self) -> WeightBytes {
        let mut b = WeightBytes::default();
        for (name, (shape, _)) in &self.tensors {
            let n: usize = shape.iter().product();
            b.add(name, self.dtype_of(name, shape).bytes_for(n) as u64);
        }
        b
    }

    /// Weight bytes a decoded token reads (`Checkpoint::bytes_per_token`'s
    /// rule).
    pub fn bytes_per_token(&self) -> u64 {
        self.stored_bytes().per_token(&self.cfg)
    }

    /// Bytes of one routed expert (gate_up and down) as stored: what a
    /// streamed expert's miss uploads.
    pub fn expert_bytes(&self) -> u64 {
        let n = (self.cfg.experts * self.cfg.layers.len()) as u64;
        self.stored_bytes().experts.checked_div(n).unwrap_or(0)
    }

    /// Weight bytes of the whole model as stored.
    pub fn weight_bytes(&self) -> u64 {
        self.stored_bytes().total
    }

    /// Names and shapes of every tensor this source produces.
    pub fn names(&self) -> Vec<(String, Vec<usize>)> {
        let mut v: Vec<_> = self
            .tensors
            .iter()
            .map(|(n, (s, _))| (n.clone(), s.clone()))
            .collect();
        v.sort();
        v
    }
}

fn inventory(cfg: &ModelConfig) -> HashMap<String, (Vec<usize>, Init)> {
    let h = cfg.hidden;
    let fan = |n: usize| Init::Centered(1.0 / (n as f32).sqrt());
    let norm = Init::Range(0.7, 1.3);
    let mut t = HashMap::new();
    let mut add = |name: String, shape: Vec<usize>, init: Init| {
        t.insert(name, (shape, init));
    };
    add("embed_tokens.weight".into(), vec![cfg.vocab, h], fan(h));
    add("norm.weight".into(), vec![h], norm);
    for (i, l) in cfg.layers.iter().enumerate() {
        let p = format!("layers.{i}.");
        let (qd, kd) = (cfg.heads * l.head_dim, l.kv_heads * l.head_dim);
        for n in [
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        ] {
            add(format!("{p}{n}.weight"), vec![h], norm);
        }
        add(format!("{p}self_attn.q_proj.weight"), vec![qd, h], fan(h));
        add(format!("{p}self_attn.k_proj.weight"), vec![kd, h], fan(h));
        if !l.k_eq_v {
            add(format!("{p}self_attn.v_proj.weight"), vec![kd, h], fan(h));
        }
        add(format!("{p}self_attn.o_proj.weight"), vec![h, qd], fan(qd));
        add(
            format!("{p}self_attn.q_norm.weight"),
            vec![l.head_dim],
            norm,
        );
        add(
            format!("{p}self_attn.k_norm.weight"),
            vec![l.head_dim],
            norm,
        );
        let inter = cfg.intermediate;
        add(format!("{p}mlp.gate_proj.weight"), vec![inter, h], fan(h));
        add(format!("{p}mlp.up_proj.weight"), vec![inter, h], fan(h));
        add(
            format!("{p}mlp.down_proj.weight"),
            vec![h, inter],
            fan(inter),
        );
        add(format!("{p}layer_scalar"), vec![1], Init::Range(0.5, 1.0));
        if cfg.enable_moe {
            let (e, mi) = (cfg.experts, cfg.moe_inter);
            for n in [
                "post_feedforward_layernorm_1",
                "pre_feedforward_layernorm_2",
                "post_feedforward_layernorm_2",
            ] {
                add(format!("{p}{n}.weight"), vec![h], norm);
            }
            add(format!("{p}router.proj.weight"), vec![e, h], fan(h));
            add(format!("{p}router.scale"), vec![h], Init::Range(0.5, 1.5));
            add(
                format!("{p}router.per_expert_scale"),
                vec![e],
                Init::Range(0.5, 1.5),
            );
            add(
                format!("{p}experts.gate_up_proj"),
                vec![e, 2 * mi, h],
                fan(h),
            );
            add(format!("{p}experts.down_proj"), vec![e, h, mi], fan(mi));
        }
    }
    t
}

/// FNV-1a of the name: each tensor's stream depends only on (seed, name).
fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// [`fill_bf16`] over all cores: SplitMix64's state after `d` draws is the
/// seed plus `d` steps, so each thread starts its slice's stream exactly
/// where a single pass would be; the bytes do not depend on the core count.
fn fill_bf16_parallel(out: &mut [u8], init: Init, seed: u64) {
    const MIN_SLICE: usize = 8 << 20;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per = (out.len().div_ceil(threads).div_ceil(8) * 8).max(MIN_SLICE);
    fill_bf16_sliced(out, init, seed, per);
}

/// The parallel fill with slices of `per` bytes (a multiple of 8), one
/// thread each: slice i starts its generator where the sequential stream
/// would be after `i * per / 8` draws.
fn fill_bf16_sliced(out: &mut [u8], init: Init, seed: u64, per: usize) {
    std::thread::scope(|s| {
        for (i, slice) in out.chunks_mut(per).enumerate() {
            let draws = (i * per / 8) as u64;
            s.spawn(move || {
                let mut rng = Rng::new(seed.wrapping_add(draws.wrapping_mul(Rng::GAMMA)));
                fill_bf16(slice, init, &mut rng);
            });
        }
    });
}

/// Uniform random bits over all cores, sliced as [`fill_bf16_parallel`].
fn fill_bits_parallel(out: &mut [u8], seed: u64) {
    const MIN_SLICE: usize = 8 << 20;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per = (out.len().div_ceil(threads).div_ceil(8) * 8).max(MIN_SLICE);
    std::thread::scope(|s| {
        for (i, slice) in out.chunks_mut(per).enumerate() {
            let draws = (i * per / 8) as u64;
            s.spawn(move || {
                let mut rng = Rng::new(seed.wrapping_add(draws.wrapping_mul(Rng::GAMMA)));
                for chunk in slice.chunks_mut(8) {
                    let r = rng.next_u64().to_le_bytes();
                    chunk.copy_from_slice(&r[..chunk.len()]);
                }
            });
        }
    });
}

/// A quantized tensor's buffer (`out`, `a.layout(n)`): random packed values
/// and per group a scale and bias drawn so that the values spread as
/// `init` does (a centered weight: q uniform over its range, scale about
/// 2a / (2^bits - 1) and bias about -a for a uniform [-a, a)).
fn fill_affine(out: &mut [u8], a: Affine, n: usize, init: Init, seed: u64) {
    let (lo, hi) = match init {
        Init::Centered(std) => (-std * 3f32.sqrt(), std * 3f32.sqrt()),
        Init::Range(lo, hi) => (lo, hi),
    };
    let levels = ((1u32 << a.bits) - 1) as f32;
    let s0 = (hi - lo) / levels;
    let l = a.layout(n);
    let part = n / a.group as usize * a.scales.size();
    fill_bits_parallel(&mut out[..l.words * 4], seed);
    let (scales, biases) = out[l.scales..].split_at_mut(l.biases - l.scales);
    fill_bf16_parallel(
        &mut scales[..part],
        Init::Range(0.9 * s0, 1.1 * s0),
        seed ^ 1,
    );
    let (b_lo, b_hi) = (lo - 0.1 * lo.abs(), lo + 0.1 * lo.abs());
    fill_bf16_parallel(&mut biases[..part], Init::Range(b_lo, b_hi), seed ^ 2);
}

/// Fill `out` (bf16 little-endian) with values drawn by `init`, four values
/// per 64-bit draw (16 bits of uniform each).
fn fill_bf16(out: &mut [u8], init: Init, rng: &mut Rng) {
    let (lo, width) = match init {
        // Uniform on [-a, a) has standard deviation a / sqrt(3).
        Init::Centered(std) => (-std * 3f32.sqrt(), 2.0 * std * 3f32.sqrt()),
        Init::Range(lo, hi) => (lo, hi - lo),
    };
    for chunk in out.chunks_mut(8) {
        let r = rng.next_u64();
        for (j, pair) in chunk.chunks_mut(2).enumerate() {
            let u = ((r >> (16 * j)) & 0xffff) as f32 / 65536.0;
            let bits = half::bf16::from_f32(lo + width * u).to_bits().to_le_bytes();
            pair.copy_from_slice(&bits[..pair.len()]);
        }
    }
}

impl TensorSource for SyntheticSource {
    fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    fn tensor(&self, name: &str) -> Result<TensorRef> {
        let (shape, init) = self.tensors.get(name).ok_or_else(|| Error::Checkpoint {
            path: "synthetic".into(),
            detail: format!("tensor `{name}` is not part of this config"),
        })?;
        let n = shape.iter().product::<usize>();
        let dtype = self.dtype_of(name, shape);
        let len = dtype.bytes_for(n);
        // An anonymous map, so the bytes can travel as `HostBytes::Mapped`
        // (owned, 'static) and be freed once the upload drops its reference.
        let mut map = memmap2::MmapMut::map_anon(len.max(1))
            .map_err(|e| Error::io(format!("synthetic tensor {name}"), e))?;
        let seed = self.seed ^ name_hash(name);
        match dtype {
            DType::Affine(a) => fill_affine(&mut map[..len], a, n, *init, seed),
            _ => fill_bf16_parallel(&mut map[..len], *init, seed),
        }
        let map = map
            .make_read_only()
            .map_err(|e| Error::io(format!("synthetic tensor {name}"), e))?;
        Ok(TensorRef {
            name: name.to_string(),
            dtype,
            shape: shape.clone(),
            bytes: HostBytes::Mapped {
                map: Arc::new(map),
                offset: 0,
                len,
            },
        })
    }
}

/// Configs a synthetic model can be asked for by name (`--synthetic NAME`):
/// `gemma-4-26b-a4b` (the flagship shape) and `tiny` ([`tiny_config`]).
pub fn named_config(name: &str) -> Result<ModelConfig> {
    match name {
        "gemma-4-26b-a4b" => Ok(ModelConfig::gemma4_26b_a4b()),
        "gemma-4-26b-a4b-narrow" => Ok(narrow_26b_config()),
        "tiny" => Ok(tiny_config()),
        other => Err(Error::InvalidInput(format!(
            "unknown synthetic model {other:?} (known: gemma-4-26b-a4b, gemma-4-26b-a4b-narrow, tiny)"
        ))),
    }
}

/// Gemma 4 26B-A4B's routing at a width a CPU runs quickly: its 30 layers
/// (every sixth full, keys equal values there), 128 experts, top-8 and
/// softcap, 256 wide with a vocabulary of 8192. What the random full-size
/// model does with rounding (a router near-tie flipped in one of 30
/// layers) shows here too, in seconds.
pub fn narrow_26b_config() -> ModelConfig {
    let mut cfg = ModelConfig::gemma4_26b_a4b();
    for l in &mut cfg.layers {
        let full = l.kind == crate::model::config::LayerKind::Full;
        l.head_dim = if full { 128 } else { 64 };
        l.kv_heads = if full { 1 } else { 2 };
        l.rot_pairs = if full { 16 } else { 32 };
    }
    ModelConfig {
        hidden: 256,
        heads: 4,
        intermediate: 192,
        moe_inter: 64,
        vocab: 8192,
        ..cfg
    }
}

/// A small config with every feature on (both layer types, k_eq_v full
/// layers, MoE, softcap, a window shorter than test sequences): for tests.
pub fn tiny_config() -> ModelConfig {
    use crate::model::config::{LayerKind, LayerSpec};
    let sliding = LayerSpec {
        kind: LayerKind::Sliding,
        head_dim: 16,
        kv_heads: 2,
        rope_theta: 1e4,
        rot_pairs: 8,
        k_eq_v: false,
    };
    let full = LayerSpec {
        kind: LayerKind::Full,
        head_dim: 32,
        kv_heads: 1,
        rope_theta: 1e6,
        rot_pairs: 4,
        k_eq_v: true,
    };
    ModelConfig {
        hidden: 48,
        heads: 4,
        layers: vec![sliding.clone(), sliding, full],
        intermediate: 40,
        enable_moe: true,
        experts: 6,
        top_k: 2,
        moe_inter: 12,
        vocab: 97,
        sliding_window: 5,
        final_softcap: Some(30.0),
        eps: 1e-6,
        tie_embeddings: true,
        eos_token_ids: vec![1],
        quantization: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_narrow_26b_keeps_its_routing_and_layers() {
        let (n, full) = (
            named_config("gemma-4-26b-a4b-narrow").unwrap(),
            named_config("gemma-4-26b-a4b").unwrap(),
        );
        n.validate().unwrap();
        assert_eq!(
            (n.experts, n.top_k, n.layers.len(), n.final_softcap),
            (
                full.experts,
                full.top_k,
                full.layers.len(),
                full.final_softcap
            )
        );
        let kinds = |c: &ModelConfig| {
            c.layers
                .iter()
                .map(|l| (l.kind, l.k_eq_v))
                .collect::<Vec<_>>()
        };
        assert_eq!(kinds(&n), kinds(&full));
        assert!(n.hidden < full.hidden && n.vocab < full.vocab);
    }

    #[test]
    fn parallel_fill_is_the_sequential_stream() {
        // Slices of a fixed size whatever the machine's core count (the
        // real slice size depends on it): four, the last one short and
        // ending mid-draw.
        let len = 3 * 4096 + 1030;
        let init = Init::Centered(0.02);
        let mut a = vec![0u8; len];
        fill_bf16(&mut a, init, &mut Rng::new(42));
        for per in [4096, len] {
            let mut b = vec![0u8; len];
            fill_bf16_sliced(&mut b, init, 42, per);
            assert!(
                a == b,
                "slices of {per} bytes differ from the sequential stream"
            );
        }
        let mut c = vec![0u8; len];
        fill_bf16_parallel(&mut c, init, 42);
        assert!(a == c, "parallel fill differs from the sequential stream");
    }

    /// The bytes a token reads follow the stored format by the checkpoint's
    /// rule: the config's count in bf16, less at 4 bits (the tiny model's
    /// rows the group does not divide stay bf16).
    #[test]
    fn bytes_per_token_follows_the_format() {
        let cfg = super::tiny_config();
        let bf16 = SyntheticSource::new(cfg.clone(), 1).unwrap();
        assert_eq!(bf16.bytes_per_token(), cfg.bytes_per_token(DType::BF16));
        let q = SyntheticQuant { bits: 4, group: 32 };
        let q4 = SyntheticSource::quantized(cfg, 1, q).unwrap();
        assert!(q4.bytes_per_token() < bf16.bytes_per_token());
        assert!(q4.weight_bytes() < bf16.weight_bytes());
    }
}
