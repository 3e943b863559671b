//! Where weights come from ([`TensorSource`]) and how they reach the device
//! (`Loader`), once when a model is opened: each block of the model loads
//! its own weights through the loader.
//!
//! Everything the decoder needs per layer is prepared at load so a forward
//! pass does no host work: projections and experts uploaded as weights, norms as
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
use crate::model::experts::stored::StoredExperts;
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

/// Uploads with a progress bar on a terminal (hidden otherwise): each
/// block of the model loads its own weights through it.
pub(crate) struct Loader<'a, B: ComputeBackend> {
    pub backend: &'a B,
    src: &'a dyn TensorSource,
    bar: ProgressBar,
}

impl<'a, B: ComputeBackend> Loader<'a, B> {
    /// A loader of `src`'s weights onto `backend`, after the checks every
    /// model's weights pass: a valid config, the LM head tied.
    pub fn new(backend: &'a B, src: &'a dyn TensorSource) -> Result<Self> {
        let cfg = src.config();
        cfg.validate()?;
        if !cfg.tie_embeddings {
            return Err(Error::Config {
                path: "config".into(),
                detail: "untied LM head (tie_word_embeddings = false) is not supported; \
                         Gemma 4 ties it to embed_tokens"
                    .into(),
            });
        }
        let bar = progress_bar(weight_bytes_estimate(cfg), "uploading weights");
        Ok(Loader { backend, src, bar })
    }

    /// The tied embedding table and LM head, and its dtype.
    pub fn embedding(&self, vocab: usize, hidden: usize) -> Result<(B::Buffer, DType)> {
        let name = "embed_tokens.weight";
        let t = fetch(self.src, name, &[vocab, hidden])?;
        let buf = self
            .backend
            .upload_weight(t.dtype, vocab, hidden, t.bytes.clone(), name)?;
        self.bar.inc(t.bytes.as_slice().len() as u64);
        Ok((buf, t.dtype))
    }

    /// The progress bar cleared: every weight is up.
    pub fn finish(self) {
        self.bar.finish_and_clear();
    }

    pub fn weight(&self, name: &str, rows: usize, cols: usize) -> Result<B::Buffer> {
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
    pub fn experts(
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

    pub fn norm(&self, name: &str, dim: usize) -> Result<B::Buffer> {
        let t = fetch(self.src, name, &[dim])?;
        let buf = self.backend.upload(t.dtype, t.bytes.clone(), name)?;
        self.bar.inc(t.bytes.as_slice().len() as u64);
        Ok(buf)
    }

    pub fn host_f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let t = fetch(self.src, name, shape)?;
        self.bar.inc(t.bytes.as_slice().len() as u64);
        Ok(to_f32(&t))
    }

    pub fn upload_f32(&self, values: &[f32], label: &str) -> Result<B::Buffer> {
        self.backend.upload(
            DType::F32,
            HostBytes::Slice(bytemuck::cast_slice(values)),
            label,
        )
    }

    /// Several `[rows_i, cols]` tensors stacked by rows into one weight (one
    /// GEMV reads them all): gate|up of the MLP, q|k|v of attention.
    pub fn stacked(
        &self,
        parts: &[(String, usize)],
        cols: usize,
        label: &str,
    ) -> Result<B::Buffer> {
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
