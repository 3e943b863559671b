//! MLX-layout checkpoints (what mlx-lm's `convert` writes, as
//! mlx-community publishes them), seen through the runtime's tensor names.
//!
//! mlx-lm stores the routed experts as
//! `layers.N.experts.switch_glu.{gate_proj,up_proj,down_proj}.weight`
//! (gate and up apart, where Hugging Face fuses `experts.gate_up_proj`),
//! and a quantized linear `P` as `P.weight` (U32, packed), `P.scales` and
//! `P.biases` ([`crate::quant`]). This module answers the runtime's names
//! (`layers.N.experts.gate_up_proj`, `...q_proj.weight`) from those: the
//! shapes and formats checked against the config at open
//! ([`Checkpoint::resolve_mlx`]), the bytes assembled at upload.

use super::checkpoint::Checkpoint;
use super::tensor_ref::TensorRef;
use crate::backend::HostBytes;
use crate::dtype::{decode_f32, encode_f32, DType};
use crate::model::experts::stored::StoredExperts;
use crate::model::quantization::Quantization;
use crate::quant::{Affine, ScaleType};
use crate::{Error, Result};

/// One stored module: a float `.weight`, or a quantized triple.
pub(crate) struct Module {
    /// `[.., out, in]`: the logical shape.
    pub shape: Vec<usize>,
    pub dtype: DType,
    /// The stored tensors: `[weight]` or `[weight, scales, biases]`.
    parts: Vec<TensorRef>,
}

impl Module {
    fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The module's bytes in the runtime's layout (a quantized one
    /// assembled, [`Affine::assemble`]).
    fn bytes(&self) -> HostBytes<'static> {
        match self.dtype {
            DType::Affine(a) => {
                let [w, s, b] = [0, 1, 2].map(|i| self.parts[i].bytes.as_slice());
                HostBytes::Owned(a.assemble(self.numel(), w, s, b).into())
            }
            _ => self.parts[0].bytes.clone(),
        }
    }

    /// Expert `e` of a stack of `experts`: its (words, scales, biases), or
    /// its bytes and two empty slices for a float stack.
    fn expert(&self, e: usize, experts: usize) -> [&[u8]; 3] {
        let cut = |i: usize| -> &[u8] {
            let b = self.parts[i].bytes.as_slice();
            let n = b.len() / experts;
            &b[e * n..(e + 1) * n]
        };
        match self.dtype {
            DType::Affine(_) => [cut(0), cut(1), cut(2)],
            _ => [cut(0), &[], &[]],
        }
    }

    /// Every value dequantised or decoded to f32.
    fn to_f32(&self) -> Vec<f32> {
        let n = self.numel();
        match self.dtype {
            DType::Affine(a) => {
                let b = self.bytes();
                (0..n).map(|i| a.get(b.as_slice(), n, i)).collect()
            }
            d => {
                let b = self.parts[0].bytes.as_slice();
                (0..n).map(|i| decode_f32(d, b, i)).collect()
            }
        }
    }
}

impl Checkpoint {
    /// Whether the file is in MLX's layout (its experts under `switch_glu`,
    /// or any `.scales`).
    pub(crate) fn is_mlx_layout(&self) -> bool {
        self.has_tensor_where(|n| n.contains(".switch_glu.") || n.ends_with(".scales"))
    }

    /// The stored module at `path` (a name without prefix and without
    /// `.weight`), checked: a float weight, or a quantized triple whose
    /// shapes agree with each other and with the config's bits and group.
    pub(crate) fn module(&self, path: &str) -> Result<Module> {
        let weight = self.raw_tensor(&format!("{path}.weight"))?;
        let scales_name = format!("{path}.scales");
        if !self.has_raw(&scales_name) {
            if weight.dtype == DType::U32 {
                return Err(self.err(format!(
                    "tensor `{}.weight` is packed U32 but `{}` is missing",
                    self.full_name(path),
                    self.full_name(&scales_name)
                )));
            }
            return Ok(Module {
                shape: weight.shape.clone(),
                dtype: weight.dtype,
                parts: vec![weight],
            });
        }
        let scales = self.raw_tensor(&scales_name)?;
        let biases = self.raw_tensor(&format!("{path}.biases"))?;
        let full = self.full_name(path);
        let (f, shape) = affine_format(
            &full,
            [&weight, &scales, &biases].map(|t| (t.dtype, t.shape.as_slice())),
            self.config().quantization.as_ref(),
            |d| self.err(d),
        )?;
        Ok(Module {
            shape,
            dtype: DType::Affine(f),
            parts: vec![weight, scales, biases],
        })
    }

    /// The runtime's tensor `name` in an MLX-layout file, when it is stored
    /// differently there: the fused expert `gate_up_proj`, the experts'
    /// `down_proj`, a quantized linear's `.weight`. None: stored as named.
    /// Only the headers are read; [`Stored::tensor`] assembles the bytes.
    pub(crate) fn resolve_mlx(&self, name: &str) -> Result<Option<Stored>> {
        if let Some(layer) = name.strip_suffix(".experts.gate_up_proj") {
            let gate = self.module(&format!("{layer}.experts.switch_glu.gate_proj"))?;
            let up = self.module(&format!("{layer}.experts.switch_glu.up_proj"))?;
            if gate.shape != up.shape || gate.shape.len() != 3 {
                return Err(self.err(format!(
                    "`{}`: gate_proj {:?} and up_proj {:?} differ",
                    self.full_name(&format!("{layer}.experts.switch_glu")),
                    gate.shape,
                    up.shape
                )));
            }
            return Ok(Some(Stored::GateUp(gate, up)));
        }
        if let Some(layer) = name.strip_suffix(".experts.down_proj") {
            let m = self.module(&format!("{layer}.experts.switch_glu.down_proj"))?;
            return Ok(Some(Stored::Module(m)));
        }
        if let Some(path) = name.strip_suffix(".weight") {
            // A packed weight without its scales goes through `module` too,
            // which names what is missing.
            let packed = self.raw_tensor(name).is_ok_and(|t| t.dtype == DType::U32);
            if packed || self.has_raw(&format!("{path}.scales")) {
                return Ok(Some(Stored::Module(self.module(path)?)));
            }
        }
        Ok(None)
    }
}

/// The format and logical shape (`[.., out, in]`) of the quantized module
/// `full` (its path in the file, without `.weight`) from its stored
/// (dtype, shape) parts `[weight, scales, biases]`, checked against each
/// other and `quant`'s bits and group for it; the error names what does
/// not fit.
pub(crate) fn affine_format(
    full: &str,
    [weight, scales, biases]: [(DType, &[usize]); 3],
    quant: Option<&Quantization>,
    err: impl Fn(String) -> Error,
) -> Result<(Affine, Vec<usize>)> {
    let Some(q) = quant else {
        return Err(err(format!(
            "`{full}` is quantized (it has `.scales`) but config.json has no `quantization`"
        )));
    };
    let Some(p) = q.params(full) else {
        return Err(err(format!(
            "`{full}` has `.scales` but config.json's quantization keeps it in float"
        )));
    };
    let st = ScaleType::from_dtype(scales.0).filter(|_| scales.0.is_float());
    let Some(st) = st else {
        return Err(err(format!(
            "`{full}.scales`: dtype {}, expected bf16, f16 or f32",
            scales.0
        )));
    };
    if biases != scales {
        return Err(err(format!(
            "`{full}.biases` ({} {:?}) does not match `{full}.scales` ({} {:?})",
            biases.0, biases.1, scales.0, scales.1
        )));
    }
    if weight.0 != DType::U32 {
        return Err(err(format!(
            "`{full}.weight`: dtype {} beside `.scales`, expected packed U32",
            weight.0
        )));
    }
    let f = Affine::new(p.bits, p.group, st)?;
    let (ws, ss) = (weight.1, scales.1);
    let cols = ss.last().copied().unwrap_or(0) * p.group as usize;
    let packed = cols * p.bits as usize / 32;
    let lead_ok = ws.len() == ss.len() && ws.len() >= 2 && ws[..ws.len() - 1] == ss[..ss.len() - 1];
    if !lead_ok || ws.last() != Some(&packed) || cols == 0 {
        return Err(err(format!(
            "`{full}`: weight {ws:?} and scales {ss:?} do not fit {} bits in groups of {} \
             (scales imply {cols} columns, so {packed} packed words a row)",
            p.bits, p.group
        )));
    }
    let mut shape = ws.to_vec();
    *shape.last_mut().expect("two or more dims") = cols;
    Ok((f, shape))
}

/// A runtime tensor as an MLX-layout file stores it.
pub(crate) enum Stored {
    /// One module (a quantized triple or a float weight).
    Module(Module),
    /// The experts' gate and up stacks, fused by the runtime.
    GateUp(Module, Module),
}

impl Stored {
    /// The runtime's dtype: the module's, or f32 where gate and up differ
    /// (a mixed conversion), which widens them.
    pub fn dtype(&self) -> DType {
        match self {
            Stored::Module(m) => m.dtype,
            Stored::GateUp(g, u) if g.dtype == u.dtype => g.dtype,
            Stored::GateUp(..) => DType::F32,
        }
    }

    /// The runtime's shape.
    pub fn shape(&self) -> Vec<usize> {
        match self {
            Stored::Module(m) => m.shape.clone(),
            Stored::GateUp(g, _) => {
                let mut s = g.shape.clone();
                s[1] *= 2;
                s
            }
        }
    }

    /// The tensor with its bytes in the runtime's layout.
    pub fn tensor(&self, name: &str) -> TensorRef {
        let bytes = match self {
            Stored::Module(m) => m.bytes(),
            Stored::GateUp(g, u) if g.dtype == u.dtype => interleave(g, u),
            Stored::GateUp(g, u) => interleave_f32(g, u),
        };
        TensorRef {
            name: name.to_string(),
            dtype: self.dtype(),
            shape: self.shape(),
            bytes,
        }
    }
}

impl Stored {
    /// An expert stack left in the mapping, one expert at a time
    /// (streamed experts): nothing assembled.
    pub fn stored_experts(&self, name: &str) -> Result<StoredExperts> {
        let parts = |ms: &[&Module]| -> [Vec<HostBytes<'static>>; 3] {
            let n = if matches!(ms[0].dtype, DType::Affine(_)) {
                3
            } else {
                1
            };
            std::array::from_fn(|i| {
                if i < n {
                    ms.iter().map(|m| m.parts[i].bytes.clone()).collect()
                } else {
                    Vec::new()
                }
            })
        };
        let shape = <[usize; 3]>::try_from(self.shape().as_slice()).map_err(|_| {
            crate::Error::Checkpoint {
                path: name.to_string(),
                detail: format!(
                    "shape {:?}: an expert stack is [experts, rows, cols]",
                    self.shape()
                ),
            }
        })?;
        match self {
            Stored::Module(m) => StoredExperts::from_parts(m.dtype, shape, parts(&[m])),
            Stored::GateUp(g, u) if g.dtype == u.dtype => {
                StoredExperts::from_parts(g.dtype, shape, parts(&[g, u]))
            }
            Stored::GateUp(g, u) => Err(crate::Error::Checkpoint {
                path: name.to_string(),
                detail: format!(
                    "gate_proj is {} and up_proj {}: streamed experts need one format",
                    g.dtype, u.dtype
                ),
            }),
        }
    }
}

/// `[E, 2 * rows, cols]` from two `[E, rows, cols]` stacks of one format:
/// each expert's gate rows, then its up rows.
fn interleave(gate: &Module, up: &Module) -> HostBytes<'static> {
    let e = gate.shape[0];
    match gate.dtype {
        DType::Affine(a) => {
            let (mut w, mut s, mut b) = (Vec::new(), Vec::new(), Vec::new());
            for i in 0..e {
                for m in [gate, up] {
                    let [pw, ps, pb] = m.expert(i, e);
                    w.extend_from_slice(pw);
                    s.extend_from_slice(ps);
                    b.extend_from_slice(pb);
                }
            }
            HostBytes::Owned(a.assemble(2 * gate.numel(), &w, &s, &b).into())
        }
        _ => {
            let mut out = Vec::new();
            for i in 0..e {
                for m in [gate, up] {
                    out.extend_from_slice(m.expert(i, e)[0]);
                }
            }
            HostBytes::Owned(out.into())
        }
    }
}

fn interleave_f32(gate: &Module, up: &Module) -> HostBytes<'static> {
    let e = gate.shape[0];
    let per = gate.numel() / e;
    let (g, u) = (gate.to_f32(), up.to_f32());
    let mut out = Vec::with_capacity(2 * gate.numel());
    for i in 0..e {
        out.extend_from_slice(&g[i * per..(i + 1) * per]);
        out.extend_from_slice(&u[i * per..(i + 1) * per]);
    }
    HostBytes::Owned(encode_f32(DType::F32, &out).into())
}
