//! Per-layer device state, built once when a model is opened.
//!
//! Everything the decoder needs per layer is prepared here so a forward pass
//! does no host work: projections and experts uploaded as weights, norms as
//! they are stored (the rms_norm op decodes any float dtype), the dense MLP's
//! gate and up projections fused into one `[2 * inter, hidden]` matrix (one
//! matmul + `gelu_mul` instead of two matmuls), the router's effective scale
//! `router.scale / sqrt(hidden)` folded on the host in f32 (as the seed does),
//! `per_expert_scale` decoded to f32 and `layer_scalar` kept on the host (it
//! is a parameter of the final rms_norm op, not a buffer).

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};

use crate::backend::{ComputeBackend, ExpertStack, HostBytes};
use crate::dtype::{decode_f32, encode_f32, DType};
use crate::error::{Error, Result};
use crate::model::checkpoint::Checkpoint;
use crate::model::config::ModelConfig;
use crate::model::expert_stream::StoredExperts;
use crate::model::tensor_ref::TensorRef;

/// Where weights come from: a checkpoint on disk or a synthetic generator.
///
/// Names are without the checkpoint prefix (`"layers.3.self_attn.q_proj.weight"`).
/// A source may produce each tensor on demand: the loader uploads it and drops
/// the host copy before asking for the next one.
pub trait TensorSource {
    fn config(&self) -> &ModelConfig;
    fn tensor(&self, name: &str) -> Result<TensorRef>;
    /// An error naming the file when bytes this source handed out (memory
    /// maps of its files) may no longer be what they were: a file
    /// truncated or rewritten since open. Cheap (a `fstat` a file); call
    /// it before reading a tensor's bytes again after load (streamed
    /// experts before each read, the CPU backend's mapped weights before a
    /// forward pass): a read past a truncated file's end kills the process
    /// with SIGBUS. Sources whose bytes cannot change (owned or anonymous
    /// memory) keep the default, `Ok(())`.
    fn check_unchanged(&self) -> Result<()> {
        Ok(())
    }
    /// A layer's expert stack (`layers.N.experts.gate_up_proj` or
    /// `.down_proj`) kept where the source holds it, for streamed experts.
    /// By default the whole tensor; a checkpoint maps it without copying.
    fn stored_experts(&self, name: &str) -> Result<StoredExperts> {
        StoredExperts::whole(&self.tensor(name)?)
    }
}

impl TensorSource for Checkpoint {
    fn config(&self) -> &ModelConfig {
        Checkpoint::config(self)
    }
    fn tensor(&self, name: &str) -> Result<TensorRef> {
        Checkpoint::tensor(self, name)
    }
    fn check_unchanged(&self) -> Result<()> {
        Checkpoint::check_unchanged(self)
    }
    fn stored_experts(&self, name: &str) -> Result<StoredExperts> {
        Checkpoint::stored_experts(self, name)
    }
}

/// The routed-expert half of a layer.
pub struct MoeWeights<B: ComputeBackend> {
    pub router_proj: B::Buffer,
    /// f32 `[hidden]`: `router.scale * hidden^-1/2`.
    pub eff_scale: B::Buffer,
    /// f32 `[experts]`.
    pub per_expert_scale: B::Buffer,
    /// `[E * 2 * moe_inter, hidden]` (gate rows then up rows per expert).
    pub gate_up: B::Buffer,
    /// `[E * hidden, moe_inter]`.
    pub down: B::Buffer,
    /// With streamed experts, `gate_up` and `down` are stacks of slots and
    /// these the stacks (gate_up, down) in the source.
    pub stored: Option<(StoredExperts, StoredExperts)>,
    pub pre_norm: B::Buffer,
    pub post_norm: B::Buffer,
}

/// One decoder layer's device state.
pub struct LayerWeights<B: ComputeBackend> {
    pub input_norm: B::Buffer,
    /// q_proj, k_proj and v_proj stacked by rows, `[q | k | v]`; on
    /// `attention_k_eq_v` layers `[q | k]` (V is the raw K projection).
    pub qkv: B::Buffer,
    pub o_proj: B::Buffer,
    pub q_norm: B::Buffer,
    pub k_norm: B::Buffer,
    pub post_attn_norm: B::Buffer,
    pub pre_ff_norm: B::Buffer,
    /// `[2 * intermediate, hidden]`: gate rows, then up rows.
    pub mlp_gate_up: B::Buffer,
    pub mlp_down: B::Buffer,
    /// `post_feedforward_layernorm_1`; None without MoE (then the dense branch
    /// goes straight into `post_feedforward_layernorm`).
    pub post_ff1_norm: Option<B::Buffer>,
    pub moe: Option<MoeWeights<B>>,
    pub post_ff_norm: B::Buffer,
    pub layer_scalar: f32,
}

/// All device state of a model's weights.
pub struct Weights<B: ComputeBackend> {
    /// `[vocab, hidden]`: the embedding table and the tied LM head.
    pub embed: B::Buffer,
    pub embed_dtype: DType,
    pub final_norm: B::Buffer,
    pub layers: Vec<LayerWeights<B>>,
}

fn checkpoint_err(name: &str, detail: String) -> Error {
    Error::Checkpoint {
        path: name.to_string(),
        detail,
    }
}

/// Fetch a tensor and check its shape and byte length against what the config implies.
fn fetch(src: &dyn TensorSource, name: &str, shape: &[usize]) -> Result<TensorRef> {
    let t = src.tensor(name)?;
    if t.shape != shape {
        return Err(checkpoint_err(
            name,
            format!("shape {:?}, expected {:?}", t.shape, shape),
        ));
    }
    if !t.dtype.is_float() {
        return Err(checkpoint_err(
            name,
            format!("dtype {}, expected a float type", t.dtype),
        ));
    }
    let want = t.dtype.bytes_for(shape.iter().product::<usize>());
    if t.bytes.as_slice().len() != want {
        return Err(checkpoint_err(
            name,
            format!("{} bytes, expected {want}", t.bytes.as_slice().len()),
        ));
    }
    Ok(t)
}

/// Decode a (checked) tensor to f32 on the host.
fn to_f32(t: &TensorRef) -> Vec<f32> {
    let b = t.bytes.as_slice();
    let n = t.numel();
    match t.dtype {
        DType::Affine(a) => (0..n).map(|i| a.get(b, n, i)).collect(),
        d => (0..n).map(|i| decode_f32(d, b, i)).collect(),
    }
}

/// Uploads with a progress bar on a terminal (hidden otherwise).
struct Loader<'a, B: ComputeBackend> {
    backend: &'a B,
    src: &'a dyn TensorSource,
    bar: ProgressBar,
}

impl<B: ComputeBackend> Loader<'_, B> {
    fn weight(&self, name: &str, rows: usize, cols: usize) -> Result<B::Buffer> {
        let t = fetch(self.src, name, &[rows, cols])?;
        let buf = self
            .backend
            .upload_weight(t.dtype, rows, cols, t.bytes.clone(), name)?;
        self.bar.inc(t.bytes.as_slice().len() as u64);
        Ok(buf)
    }

    /// A layer's `[experts, rows, cols]` expert stack: uploaded whole
    /// (`upload_experts`), or with `slots` a device stack of that many
    /// slots (`alloc_experts`) and the stack left in the source.
    fn experts(
        &self,
        name: &str,
        [e, rows, cols]: [usize; 3],
        gate_up: bool,
        slots: Option<usize>,
    ) -> Result<(B::Buffer, Option<StoredExperts>)> {
        let Some(n) = slots else {
            let t = fetch(self.src, name, &[e, rows, cols])?;
            let stack = ExpertStack {
                experts: e,
                gate_up,
            };
            let buf = self.backend.upload_experts(
                t.dtype,
                stack,
                (e * rows, cols),
                t.bytes.clone(),
                name,
            )?;
            self.bar.inc(t.bytes.as_slice().len() as u64);
            return Ok((buf, None));
        };
        let st = self.src.stored_experts(name)?;
        if [st.experts, st.rows, st.cols] != [e, rows, cols] || !st.dtype.is_float() {
            return Err(checkpoint_err(
                name,
                format!(
                    "{} experts of {} x {} {}, expected {e} of {rows} x {cols}",
                    st.experts, st.rows, st.cols, st.dtype
                ),
            ));
        }
        let stack = ExpertStack {
            experts: n,
            gate_up,
        };
        let label = format!("{name} ({n} slots)");
        let buf = self
            .backend
            .alloc_experts(st.dtype, stack, (n * rows, cols), &label)?;
        Ok((buf, Some(st)))
    }

    fn norm(&self, name: &str, dim: usize) -> Result<B::Buffer> {
        let t = fetch(self.src, name, &[dim])?;
        let buf = self.backend.upload(t.dtype, t.bytes.clone(), name)?;
        self.bar.inc(t.bytes.as_slice().len() as u64);
        Ok(buf)
    }

    fn host_f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let t = fetch(self.src, name, shape)?;
        self.bar.inc(t.bytes.as_slice().len() as u64);
        Ok(to_f32(&t))
    }

    fn upload_f32(&self, values: &[f32], label: &str) -> Result<B::Buffer> {
        self.backend.upload(
            DType::F32,
            HostBytes::Slice(bytemuck::cast_slice(values)),
            label,
        )
    }

    /// Several `[rows_i, cols]` tensors stacked by rows into one weight (one
    /// GEMV reads them all): gate|up of the MLP, q|k|v of attention.
    fn stacked(&self, parts: &[(String, usize)], cols: usize, label: &str) -> Result<B::Buffer> {
        let tensors = parts
            .iter()
            .map(|(name, rows)| fetch(self.src, name, &[*rows, cols]))
            .collect::<Result<Vec<_>>>()?;
        let rows: usize = parts.iter().map(|p| p.1).sum();
        let dtype = tensors[0].dtype;
        // Mixed dtypes (a mixed quantization, or float parts that differ)
        // are widened to f32 rather than refused.
        let (dtype, bytes) =
            if let (DType::Affine(a), true) = (dtype, tensors.iter().all(|t| t.dtype == dtype)) {
                let parts: Vec<(&[u8], usize)> = tensors
                    .iter()
                    .map(|t| (t.bytes.as_slice(), t.numel()))
                    .collect();
                (dtype, a.stack(&parts))
            } else if tensors.iter().all(|t| t.dtype == dtype) {
                let mut b = Vec::with_capacity(rows * cols * dtype.size());
                for t in &tensors {
                    b.extend_from_slice(t.bytes.as_slice());
                }
                (dtype, b)
            } else {
                let v: Vec<f32> = tensors.iter().flat_map(to_f32).collect();
                (DType::F32, encode_f32(DType::F32, &v))
            };
        let buf = self
            .backend
            .upload_weight(dtype, rows, cols, HostBytes::Slice(&bytes), label)?;
        self.bar.inc(
            tensors
                .iter()
                .map(|t| t.bytes.as_slice().len() as u64)
                .sum(),
        );
        Ok(buf)
    }
}

/// A progress bar over `total` bytes, drawn only when stderr is a terminal.
pub fn progress_bar(total: u64, what: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    if let Ok(style) = ProgressStyle::with_template(
        "{msg} [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta})",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(what.to_string());
    bar
}

/// Bytes of weights a config reads at load (for the progress bar's total).
fn weight_bytes_estimate(cfg: &ModelConfig) -> u64 {
    // parameter_count is exact up to the dtype; assume 2-byte weights for the bar.
    cfg.parameter_count() * 2
}

impl<B: ComputeBackend> Weights<B> {
    /// Upload every weight of `src`, checking each tensor's shape against the config.
    /// With `expert_slots`, each MoE layer's experts get that many device
    /// slots and stay in `src` ([`MoeWeights::stored`]).
    pub fn load(backend: &B, src: &dyn TensorSource, expert_slots: Option<usize>) -> Result<Self> {
        let cfg = src.config().clone();
        cfg.validate()?;
        if !cfg.tie_embeddings {
            return Err(Error::Config {
                path: "config".into(),
                detail: "untied LM head (tie_word_embeddings = false) is not supported; \
                         Gemma 4 ties it to embed_tokens"
                    .into(),
            });
        }
        let bar = progress_bar(weight_bytes_estimate(&cfg), "uploading weights");
        let ld = Loader { backend, src, bar };
        let h = cfg.hidden;
        let embed_t = fetch(src, "embed_tokens.weight", &[cfg.vocab, h])?;
        let embed_dtype = embed_t.dtype;
        let embed = backend.upload_weight(
            embed_t.dtype,
            cfg.vocab,
            h,
            embed_t.bytes.clone(),
            "embed_tokens.weight",
        )?;
        ld.bar.inc(embed_t.bytes.as_slice().len() as u64);
        drop(embed_t);
        let final_norm = ld.norm("norm.weight", h)?;
        let inv_sqrt_h = 1.0 / (h as f32).sqrt();

        let mut layers = Vec::with_capacity(cfg.layers.len());
        for (i, spec) in cfg.layers.iter().enumerate() {
            let p = format!("layers.{i}.");
            let (hd, kvh) = (spec.head_dim, spec.kv_heads);
            let qd = cfg.heads * hd;
            let kd = kvh * hd;
            let a = format!("{p}self_attn.");
            let mut qkv = vec![
                (format!("{a}q_proj.weight"), qd),
                (format!("{a}k_proj.weight"), kd),
            ];
            if !spec.k_eq_v {
                qkv.push((format!("{a}v_proj.weight"), kd));
            }
            let moe = if cfg.enable_moe {
                let (e, mi) = (cfg.experts, cfg.moe_inter);
                let scale = ld.host_f32(&format!("{p}router.scale"), &[h])?;
                let eff: Vec<f32> = scale.iter().map(|s| s * inv_sqrt_h).collect();
                let pes = ld.host_f32(&format!("{p}router.per_expert_scale"), &[e])?;
                let (gate_up, stored_gu) = ld.experts(
                    &format!("{p}experts.gate_up_proj"),
                    [e, 2 * mi, h],
                    true,
                    expert_slots,
                )?;
                let (down, stored_down) = ld.experts(
                    &format!("{p}experts.down_proj"),
                    [e, h, mi],
                    false,
                    expert_slots,
                )?;
                Some(MoeWeights {
                    router_proj: ld.weight(&format!("{p}router.proj.weight"), e, h)?,
                    eff_scale: ld.upload_f32(&eff, &format!("{p}router.eff_scale"))?,
                    per_expert_scale: ld
                        .upload_f32(&pes, &format!("{p}router.per_expert_scale"))?,
                    gate_up,
                    down,
                    stored: stored_gu.zip(stored_down),
                    pre_norm: ld.norm(&format!("{p}pre_feedforward_layernorm_2.weight"), h)?,
                    post_norm: ld.norm(&format!("{p}post_feedforward_layernorm_2.weight"), h)?,
                })
            } else {
                None
            };
            let layer_scalar = ld
                .host_f32(&format!("{p}layer_scalar"), &[1])?
                .first()
                .copied()
                .unwrap_or(1.0);
            layers.push(LayerWeights {
                input_norm: ld.norm(&format!("{p}input_layernorm.weight"), h)?,
                qkv: ld.stacked(&qkv, h, &format!("{a}qkv_proj"))?,
                o_proj: ld.weight(&format!("{a}o_proj.weight"), h, qd)?,
                q_norm: ld.norm(&format!("{a}q_norm.weight"), hd)?,
                k_norm: ld.norm(&format!("{a}k_norm.weight"), hd)?,
                post_attn_norm: ld.norm(&format!("{p}post_attention_layernorm.weight"), h)?,
                pre_ff_norm: ld.norm(&format!("{p}pre_feedforward_layernorm.weight"), h)?,
                mlp_gate_up: ld.stacked(
                    &[
                        (format!("{p}mlp.gate_proj.weight"), cfg.intermediate),
                        (format!("{p}mlp.up_proj.weight"), cfg.intermediate),
                    ],
                    h,
                    &format!("{p}mlp.gate_up"),
                )?,
                mlp_down: ld.weight(&format!("{p}mlp.down_proj.weight"), h, cfg.intermediate)?,
                post_ff1_norm: if cfg.enable_moe {
                    Some(ld.norm(&format!("{p}post_feedforward_layernorm_1.weight"), h)?)
                } else {
                    None
                },
                moe,
                post_ff_norm: ld.norm(&format!("{p}post_feedforward_layernorm.weight"), h)?,
                layer_scalar,
            });
        }
        ld.bar.finish_and_clear();
        Ok(Weights {
            embed,
            embed_dtype,
            final_norm,
            layers,
        })
    }
}
