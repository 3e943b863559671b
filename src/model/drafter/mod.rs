//! Gemma 4's drafter ("assistant", transformers' `Gemma4AssistantForCausalLM`)
//! and speculative decoding with it.
//!
//! A drafter is a few dense decoder layers that own no keys or values: each
//! layer attends to the target's caches (its sliding layers to the target's
//! last sliding layer, its full layers to the target's last full layer).
//! One draft step at position p, the first position the target has not run:
//!
//! ```text
//! x = pre_projection([embed_target(token) * sqrt(hidden_target), h])   h: the target's final hidden
//!                                                                      state at p - 1, or the last
//!                                                                      step's projected state
//! per layer: q = rope(q_norm(q_proj(norm(x))), p)
//!            a = attention(q, target keys/values of positions < p)    sliding: the last window + 1
//!            x = residual, dense MLP and layer_scalar as a target layer
//! y = norm(x); h' = post_projection(y); logits = embed_drafter · y       (or the centroid-masked head)
//! ```
//!
//! Every step of a round drafts at the same position p over the same
//! caches; only the token and h change. The forward is written once against
//! [`ComputeBackend`] from existing ops; the centroid-masked head picks its
//! clusters on the host (a `centroids`-wide row read back) and scores their
//! tokens on the device (their rows gathered with `embed`, then `matmul`).

mod config;
mod speculative;
#[cfg(feature = "tools")]
mod synthetic;

use std::borrow::Cow;
use std::path::Path;
use std::sync::Arc;

pub use config::{Centroids, DrafterConfig};
pub use speculative::{accept_rule, SpeculativeOptions, SpeculativeStats, DEFAULT_DRAFT_TOKENS};

use crate::backend::{ComputeBackend, HostBytes};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::model::config::LayerKind;
use crate::model::decoder::{Model, Sequence};
use crate::model::mlx_layout::affine_format;
use crate::model::quantization::Quantization;
use crate::ops::PostFfnArgs;
use crate::ops::{Attention, Embed, Matmul, PostAttention, PostFfn, RmsNorm, Rope};
use crate::Precision;

/// One drafter layer's device state.
struct DraftLayer<T> {
    input_norm: T,
    q_proj: T,
    q_norm: T,
    o_proj: T,
    post_attn_norm: T,
    pre_ff_norm: T,
    /// `[2 * intermediate, hidden]`: gate rows, then up rows.
    gate_up: T,
    down: T,
    post_ff_norm: T,
    layer_scalar: f32,
    /// The target layer whose caches it reads.
    source: usize,
}

/// One-row activations of a draft step.
struct DraftScratch<T> {
    ids: T,
    /// The drafting position p (RoPE) and p - 1 (the last key attended).
    pos_rope: T,
    pos_attn: T,
    /// Row index of the target's final hidden state to gather.
    row: T,
    emb: T,
    h_target: T,
    h_proj: T,
    pre_e: T,
    pre_h: T,
    x: T,
    normed: T,
    q: T,
    qn: T,
    attn: T,
    o: T,
    r: T,
    ff: T,
    gate_up: T,
    act: T,
    dense: T,
    /// Plain head: `[vocab]`; centroid head: `[centroids]`.
    head: T,
    /// The plain head's argmax.
    arg: T,
    /// Centroid head: the scored tokens' ids, rows and logits.
    sel_ids: Option<T>,
    sel_rows: Option<T>,
    sel_logits: Option<T>,
}

/// A drafter loaded for one target model (on that model's backend).
pub struct Drafter<B: ComputeBackend> {
    cfg: DrafterConfig,
    pre_e: B::Buffer,
    pre_h: B::Buffer,
    post_projection: B::Buffer,
    final_norm: B::Buffer,
    /// `[vocab, hidden]`: the tied head.
    embed: B::Buffer,
    centroids: Option<B::Buffer>,
    /// Cluster c holds tokens `token_ordering[c * per .. (c + 1) * per]`.
    token_ordering: Vec<u32>,
    layers: Vec<DraftLayer<B::Buffer>>,
    s: DraftScratch<B::Buffer>,
    precision: Precision,
}

/// A stored tensor: its dtype, shape and byte range in the file.
type Stored = (safetensors::Dtype, Vec<usize>, (usize, usize));

/// A checkpoint's tensors, read whole (a drafter is small).
struct DraftTensors {
    bytes: Arc<Vec<u8>>,
    path: String,
    index: std::collections::HashMap<String, Stored>,
}

impl DraftTensors {
    fn open(dir: &Path) -> Result<Self> {
        let file = dir.join("model.safetensors");
        let path = file.display().to_string();
        if !file.exists() && dir.join("model.safetensors.index.json").exists() {
            return Err(Error::Checkpoint {
                path,
                detail: "a sharded drafter is not supported: give one model.safetensors".into(),
            });
        }
        let bytes = std::fs::read(&file).map_err(|e| Error::io(&path, e))?;
        let parsed = std::panic::catch_unwind(|| {
            safetensors::SafeTensors::deserialize(&bytes).map(|st| {
                st.tensors()
                    .into_iter()
                    .map(|(name, view)| {
                        let start = view.data().as_ptr() as usize - bytes.as_ptr() as usize;
                        let range = (start, start + view.data().len());
                        (name, (view.dtype(), view.shape().to_vec(), range))
                    })
                    .collect()
            })
        });
        let index = match parsed {
            Ok(Ok(index)) => index,
            Ok(Err(e)) => {
                return Err(Error::Checkpoint {
                    path,
                    detail: format!("not a safetensors file: {e}"),
                })
            }
            Err(_) => {
                return Err(Error::Checkpoint {
                    path,
                    detail: "not a safetensors file (its header does not parse)".into(),
                })
            }
        };
        Ok(DraftTensors {
            bytes: Arc::new(bytes),
            path,
            index,
        })
    }

    fn err(&self, detail: String) -> Error {
        Error::Checkpoint {
            path: self.path.clone(),
            detail,
        }
    }

    /// A float tensor of exactly `shape`: its dtype and bytes.
    fn float(&self, name: &str, shape: &[usize]) -> Result<(DType, &[u8])> {
        let Some((dt, got, (a, b))) = self.index.get(name) else {
            return Err(self.err(format!("tensor `{name}` is missing")));
        };
        if got != shape {
            return Err(self.err(format!(
                "tensor `{name}` has shape {got:?}, expected {shape:?}"
            )));
        }
        let dtype = DType::from_safetensors(*dt)
            .filter(|d| matches!(d, DType::F32 | DType::F16 | DType::BF16))
            .ok_or_else(|| {
                self.err(format!(
                    "tensor `{name}` is {dt:?}: a drafter's weights are bf16, f16 or f32"
                ))
            })?;
        Ok((dtype, &self.bytes[*a..*b]))
    }

    /// The `[rows, cols]` matrix of module `path` (its name without
    /// `.weight`): a float `.weight`, or MLX's quantized triple
    /// (`.weight` packed, `.scales`, `.biases`) assembled as
    /// [`Affine::layout`](crate::quant::Affine::layout) lays it out, its
    /// bits and group from `quant`.
    fn matrix(
        &self,
        path: &str,
        rows: usize,
        cols: usize,
        quant: Option<&Quantization>,
    ) -> Result<(DType, Cow<'_, [u8]>)> {
        let name = format!("{path}.weight");
        let scales = format!("{path}.scales");
        let packed = matches!(self.index.get(&name), Some((safetensors::Dtype::U32, ..)));
        if !self.index.contains_key(&scales) {
            if packed {
                return Err(self.err(format!(
                    "tensor `{name}` is packed U32 but `{scales}` is missing"
                )));
            }
            let (dtype, bytes) = self.float(&name, &[rows, cols])?;
            return Ok((dtype, Cow::Borrowed(bytes)));
        }
        let part = |n: &str| -> Result<(DType, &[usize], &[u8])> {
            let Some((dt, shape, (a, b))) = self.index.get(n) else {
                return Err(self.err(format!("tensor `{n}` is missing")));
            };
            let dtype = DType::from_safetensors(*dt)
                .ok_or_else(|| self.err(format!("tensor `{n}` is {dt:?}")))?;
            Ok((dtype, shape.as_slice(), &self.bytes[*a..*b]))
        };
        let [w, s, b] = [name.as_str(), &scales, &format!("{path}.biases")].map(part);
        let (w, s, b) = (w?, s?, b?);
        let (f, shape) = affine_format(path, [(w.0, w.1), (s.0, s.1), (b.0, b.1)], quant, |d| {
            self.err(d)
        })?;
        if shape != [rows, cols] {
            return Err(self.err(format!(
                "`{path}` holds a {shape:?} matrix, expected [{rows}, {cols}]"
            )));
        }
        // (the shapes checked above fix every part's length)
        Ok((
            DType::Affine(f),
            Cow::Owned(f.assemble(rows * cols, w.2, s.2, b.2)),
        ))
    }

    fn host_f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let (dtype, bytes) = self.float(name, shape)?;
        let n: usize = shape.iter().product();
        Ok((0..n)
            .map(|i| crate::dtype::decode_f32(dtype, bytes, i))
            .collect())
    }

    /// `token_ordering`: integers, a permutation of `0..vocab`.
    fn ordering(&self, name: &str, vocab: usize) -> Result<Vec<u32>> {
        let Some((dt, shape, (a, b))) = self.index.get(name) else {
            return Err(self.err(format!("tensor `{name}` is missing")));
        };
        if shape != &[vocab] {
            return Err(self.err(format!(
                "tensor `{name}` has shape {shape:?}, expected [{vocab}]"
            )));
        }
        let raw = &self.bytes[*a..*b];
        let ids: Vec<i64> = match dt {
            safetensors::Dtype::I64 => raw
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                .collect(),
            safetensors::Dtype::I32 => raw
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().unwrap_or([0; 4])) as i64)
                .collect(),
            other => {
                return Err(self.err(format!(
                    "tensor `{name}` is {other:?}, expected integers (I64 or I32)"
                )))
            }
        };
        let mut seen = vec![false; vocab];
        for &id in &ids {
            let ok =
                (0..vocab as i64).contains(&id) && !std::mem::replace(&mut seen[id as usize], true);
            if !ok {
                return Err(self.err(format!(
                    "tensor `{name}` is not a permutation of 0..{vocab} (id {id})"
                )));
            }
        }
        Ok(ids.into_iter().map(|i| i as u32).collect())
    }
}

impl<B: ComputeBackend> Drafter<B> {
    /// Load the drafter in `dir` (config.json, model.safetensors) for
    /// `target`, on its backend; an error names what does not fit.
    pub fn load(target: &Model<B>, dir: &Path) -> Result<Self> {
        let cfg = DrafterConfig::from_dir(dir)?;
        cfg.fit(target.config())?;
        let t = DraftTensors::open(dir)?;
        Self::build(target, cfg, &t)
    }

    /// The drafter of `cfg` from tensors `t` (checked against it).
    fn build(target: &Model<B>, cfg: DrafterConfig, t: &DraftTensors) -> Result<Self> {
        let sources = cfg.fit(target.config())?;
        let be = target.backend();
        let c = &cfg.text;
        let (h, bh, v) = (c.hidden, cfg.backbone_hidden, c.vocab);
        let quant = c.quantization.as_ref();
        let matrix = |name: &str, rows: usize, cols: usize| {
            let path = name.strip_suffix(".weight").unwrap_or(name);
            t.matrix(path, rows, cols, quant)
        };
        let weight = |name: &str, rows: usize, cols: usize| -> Result<B::Buffer> {
            let (dtype, bytes) = matrix(name, rows, cols)?;
            be.upload_weight(dtype, rows, cols, HostBytes::Slice(&bytes), name)
        };
        let norm = |name: &str, n: usize| -> Result<B::Buffer> {
            let (dtype, bytes) = t.float(name, &[n])?;
            be.upload(dtype, HostBytes::Slice(bytes), name)
        };
        // pre_projection [hidden, 2 * backbone] split by columns into the
        // embedding's half and the hidden state's half: two products and an
        // add, so neither input needs copying next to the other.
        // Quantized in groups that straddle the halves' edge (possible at
        // group 128 where the backbone is not a multiple of it), it is
        // dequantised to f32 first: the same values, the cut then exact.
        let (dtype, pre) = matrix("pre_projection.weight", h, 2 * bh)?;
        let (dtype, (pre_e, pre_h)) = match dtype {
            DType::Affine(f) => match f.split_cols(&pre, h, 2 * bh, bh) {
                Some(halves) => (dtype, halves),
                None => {
                    let n = h * 2 * bh;
                    let values: Vec<f32> = (0..n).map(|i| f.get(&pre, n, i)).collect();
                    let bytes = crate::dtype::encode_f32(DType::F32, &values);
                    (DType::F32, split_cols(DType::F32, &bytes, 2 * bh, bh))
                }
            },
            _ => (dtype, split_cols(dtype, &pre, 2 * bh, bh)),
        };
        let half = |bytes: Vec<u8>, label: &str| {
            be.upload_weight(dtype, h, bh, HostBytes::Owned(Arc::new(bytes)), label)
        };
        let pre_e = half(pre_e, "pre_projection.embed")?;
        let pre_h = half(pre_h, "pre_projection.hidden")?;
        let mut layers = Vec::with_capacity(c.layers.len());
        for (i, l) in c.layers.iter().enumerate() {
            let p = format!("model.layers.{i}.");
            let qd = c.heads * l.head_dim;
            if c.heads % l.kv_heads != 0 {
                return Err(Error::InvalidInput(format!(
                    "the drafter's {} query heads are not a multiple of layer {i}'s {} KV heads",
                    c.heads, l.kv_heads
                )));
            }
            let (gdt, gate) = matrix(&format!("{p}mlp.gate_proj.weight"), c.intermediate, h)?;
            let (udt, up) = matrix(&format!("{p}mlp.up_proj.weight"), c.intermediate, h)?;
            if gdt != udt {
                return Err(t.err(format!("layer {i}'s gate_proj is {gdt}, its up_proj {udt}")));
            }
            let gate_up = match gdt {
                DType::Affine(f) => {
                    let n = c.intermediate * h;
                    f.stack(&[(&gate, n), (&up, n)])
                }
                _ => [gate, up].concat(),
            };
            let scalar = match t.index.contains_key(&format!("{p}layer_scalar")) {
                true => t.host_f32(&format!("{p}layer_scalar"), &[1])?[0],
                false => 1.0,
            };
            layers.push(DraftLayer {
                input_norm: norm(&format!("{p}input_layernorm.weight"), h)?,
                q_proj: weight(&format!("{p}self_attn.q_proj.weight"), qd, h)?,
                q_norm: norm(&format!("{p}self_attn.q_norm.weight"), l.head_dim)?,
                o_proj: weight(&format!("{p}self_attn.o_proj.weight"), h, qd)?,
                post_attn_norm: norm(&format!("{p}post_attention_layernorm.weight"), h)?,
                pre_ff_norm: norm(&format!("{p}pre_feedforward_layernorm.weight"), h)?,
                gate_up: be.upload_weight(
                    gdt,
                    2 * c.intermediate,
                    h,
                    HostBytes::Owned(Arc::new(gate_up)),
                    &format!("{p}mlp.gate_up"),
                )?,
                down: weight(&format!("{p}mlp.down_proj.weight"), h, c.intermediate)?,
                post_ff_norm: norm(&format!("{p}post_feedforward_layernorm.weight"), h)?,
                layer_scalar: scalar,
                source: sources[i],
            });
        }
        let (centroids, token_ordering) = match cfg.centroids {
            Some(cc) => (
                Some(weight(
                    "masked_embedding.centroids.weight",
                    cc.centroids,
                    h,
                )?),
                t.ordering("masked_embedding.token_ordering", v)?,
            ),
            None => (None, Vec::new()),
        };
        let s = DraftScratch::new(be, &cfg)?;
        Ok(Drafter {
            pre_e,
            pre_h,
            post_projection: weight("post_projection.weight", bh, h)?,
            final_norm: norm("model.norm.weight", h)?,
            embed: weight("model.embed_tokens.weight", v, h)?,
            centroids,
            token_ordering,
            layers,
            s,
            precision: target.precision(),
            cfg,
        })
    }

    pub fn config(&self) -> &DrafterConfig {
        &self.cfg
    }

    /// Draft one token's logits at position `p` of `seq` (whose caches hold
    /// positions `..p`): the input is `target`'s embedding of `token` and
    /// `hidden`: [`DraftInput::Target`], row `row` of the target's final
    /// hidden state from its last pass of `m` tokens, or
    /// [`DraftInput::Previous`], this drafter's last projected state. The
    /// logits come back for the whole vocabulary (the centroid head's
    /// unscored tokens at its lowest score less 1, as transformers fills
    /// them).
    pub fn step(
        &self,
        target: &Model<B>,
        seq: &Sequence<B>,
        p: usize,
        token: u32,
        hidden: DraftInput,
    ) -> Result<Vec<f32>> {
        self.record_step(target, seq, p, token, hidden)?;
        self.head(target.backend())
    }

    /// [`Drafter::step`]'s argmax (first index on ties): the plain head's
    /// on the device, 4 bytes read back.
    pub fn step_greedy(
        &self,
        target: &Model<B>,
        seq: &Sequence<B>,
        p: usize,
        token: u32,
        hidden: DraftInput,
    ) -> Result<u32> {
        self.record_step(target, seq, p, token, hidden)?;
        if let Some((ids, scored)) = self.selected_logits(target.backend())? {
            // The full row's argmax without building it: the largest
            // selected logit, the lowest id among equals (the row's own
            // order); the row decides where none is above the fill (every
            // logit NaN or -inf).
            let best = ids
                .iter()
                .zip(&scored)
                .filter(|(_, x)| !x.is_nan())
                .max_by(|a, b| a.1.total_cmp(b.1).then(b.0.cmp(a.0)));
            return Ok(match best {
                Some((&id, &x)) if x > f32::NEG_INFINITY => id,
                _ => crate::model::sampling::argmax(&full_row(&ids, &scored, self.cfg.text.vocab)),
            });
        }
        let (be, s) = (target.backend(), &self.s);
        self.plain_head(be)?;
        be.argmax(&s.head, &s.arg, 1, self.cfg.text.vocab)?;
        Ok(be.download_u32(&s.arg)?[0])
    }

    /// The tied head over the whole vocabulary into `s.head`.
    fn plain_head(&self, be: &B) -> Result<()> {
        let (c, s) = (&self.cfg.text, &self.s);
        be.matmul(
            &self.embed,
            &s.normed,
            &s.head,
            Matmul {
                m: 1,
                n: c.vocab,
                k: c.hidden,
                precision: self.precision,
            },
        )
    }

    /// Record a draft step up to the final norm (`s.normed`) and the
    /// projected state (`s.h_proj`).
    fn record_step(
        &self,
        target: &Model<B>,
        seq: &Sequence<B>,
        p: usize,
        token: u32,
        hidden: DraftInput,
    ) -> Result<()> {
        let be = target.backend();
        let (c, s) = (&self.cfg.text, &self.s);
        let (h, bh) = (c.hidden, self.cfg.backbone_hidden);
        if p == 0 || p > seq.position() {
            return Err(Error::InvalidInput(format!(
                "drafting at position {p}: the sequence holds {} tokens (a draft reads the keys before it)",
                seq.position()
            )));
        }
        if token as usize >= c.vocab {
            return Err(Error::InvalidInput(format!(
                "token id {token} is past the vocabulary of {}",
                c.vocab
            )));
        }
        be.write_u32(&s.ids, 0, &[token])?;
        be.write_u32(&s.pos_rope, 0, &[p as u32])?;
        be.write_u32(&s.pos_attn, 0, &[p as u32 - 1])?;
        let (table, scale) = target.embedding();
        be.embed(
            &s.ids,
            table,
            &s.emb,
            Embed {
                m: 1,
                hidden: bh,
                vocab: c.vocab,
                scale,
            },
        )?;
        let h_in = match hidden {
            DraftInput::Target { m, row } => {
                let (normed, rows) = target.final_hidden(m)?;
                if row >= m || row >= rows {
                    return Err(Error::InvalidInput(format!(
                        "hidden row {row} of a pass of {m} tokens"
                    )));
                }
                be.write_u32(&s.row, 0, &[row as u32])?;
                be.embed(
                    &s.row,
                    normed,
                    &s.h_target,
                    Embed {
                        m: 1,
                        hidden: bh,
                        vocab: rows,
                        scale: 1.0,
                    },
                )?;
                &s.h_target
            }
            DraftInput::Previous => &s.h_proj,
        };
        let mm = |w: &B::Buffer, x: &B::Buffer, out: &B::Buffer, n: usize, k: usize| {
            be.matmul(
                w,
                x,
                out,
                Matmul {
                    m: 1,
                    n,
                    k,
                    precision: self.precision,
                },
            )
        };
        mm(&self.pre_e, &s.emb, &s.pre_e, h, bh)?;
        mm(&self.pre_h, h_in, &s.pre_h, h, bh)?;
        be.add(&s.pre_e, &s.pre_h, &s.x, h)?;
        let norm = |rows: usize, dim: usize| RmsNorm {
            rows,
            dim,
            eps: c.eps,
            scale: 1.0,
        };
        be.rms_norm(
            &s.x,
            Some(&self.layers[0].input_norm),
            None,
            &s.normed,
            norm(1, h),
        )?;
        for (i, (l, spec)) in self.layers.iter().zip(&c.layers).enumerate() {
            let hd = spec.head_dim;
            let qd = c.heads * hd;
            mm(&l.q_proj, &s.normed, &s.q, qd, h)?;
            be.rms_norm(&s.q, Some(&l.q_norm), None, &s.qn, norm(c.heads, hd))?;
            be.rope(
                &s.qn,
                &s.pos_rope,
                Rope {
                    m: 1,
                    heads: c.heads,
                    head_dim: hd,
                    rot_pairs: spec.rot_pairs,
                    theta: spec.rope_theta,
                },
            )?;
            let cache = target.cache_view(seq, l.source)?;
            // transformers' flipped bidirectional sliding mask keeps
            // |0 - kv| <= window over the keys reversed: window + 1 keys.
            let window = match spec.kind {
                LayerKind::Sliding => c.sliding_window + 1,
                LayerKind::Full => 0,
            };
            be.attention(
                &s.qn,
                cache.k,
                cache.v,
                &s.pos_attn,
                &s.attn,
                Attention {
                    m: 1,
                    heads: c.heads,
                    kv_heads: spec.kv_heads,
                    head_dim: hd,
                    capacity: cache.capacity,
                    window,
                    scale: 1.0,
                    precision: self.precision,
                },
            )?;
            mm(&l.o_proj, &s.attn, &s.o, h, qd)?;
            be.post_attention(
                &s.o,
                &s.x,
                &l.post_attn_norm,
                &l.pre_ff_norm,
                &s.r,
                &s.ff,
                None,
                PostAttention {
                    rows: 1,
                    dim: h,
                    eps: c.eps,
                },
            )?;
            mm(&l.gate_up, &s.ff, &s.gate_up, 2 * c.intermediate, h)?;
            be.gelu_mul(&s.gate_up, &s.act, 1, c.intermediate)?;
            mm(&l.down, &s.act, &s.dense, h, c.intermediate)?;
            let next = match self.layers.get(i + 1) {
                Some(n) => &n.input_norm,
                None => &self.final_norm,
            };
            be.post_ffn(PostFfnArgs {
                dense: &s.dense,
                w_dense: &l.post_ff_norm,
                moe: None,
                r: &s.r,
                x: &s.x,
                next: Some((next, &s.normed)),
                p: PostFfn {
                    rows: 1,
                    dim: h,
                    eps: c.eps,
                    scale: l.layer_scalar,
                },
            })?;
        }
        mm(&self.post_projection, &s.normed, &s.h_proj, bh, h)
    }

    /// The head on the final-normed row: the whole vocabulary's logits.
    fn head(&self, be: &B) -> Result<Vec<f32>> {
        let (c, s) = (&self.cfg.text, &self.s);
        if let Some((ids, scored)) = self.selected_logits(be)? {
            return Ok(full_row(&ids, &scored, c.vocab));
        }
        self.plain_head(be)?;
        be.download_f32(&s.head)
    }

    /// With centroids: the tokens of the top centroids and their logits,
    /// read back (None for the plain head).
    fn selected_logits(&self, be: &B) -> Result<Option<(Vec<u32>, Vec<f32>)>> {
        let (c, s) = (&self.cfg.text, &self.s);
        let (h, v) = (c.hidden, c.vocab);
        let mm = |w: &B::Buffer, x: &B::Buffer, out: &B::Buffer, n: usize| {
            be.matmul(
                w,
                x,
                out,
                Matmul {
                    m: 1,
                    n,
                    k: h,
                    precision: self.precision,
                },
            )
        };
        let (Some(cc), Some(cent), Some(sel_ids), Some(sel_rows), Some(sel_logits)) = (
            self.cfg.centroids,
            &self.centroids,
            &s.sel_ids,
            &s.sel_rows,
            &s.sel_logits,
        ) else {
            return Ok(None);
        };
        mm(cent, &s.normed, &s.head, cc.centroids)?;
        let scores = be.download_f32(&s.head)?;
        let per = cc.per_cluster(v);
        let ids: Vec<u32> = top_k(&scores, cc.top_k)
            .into_iter()
            .flat_map(|c| self.token_ordering[c * per..(c + 1) * per].iter().copied())
            .collect();
        be.write_u32(sel_ids, 0, &ids)?;
        let n = ids.len();
        be.embed(
            sel_ids,
            &self.embed,
            sel_rows,
            Embed {
                m: n,
                hidden: h,
                vocab: v,
                scale: 1.0,
            },
        )?;
        mm(sel_rows, &s.normed, sel_logits, n)?;
        let scored = be.download_f32(sel_logits)?;
        Ok(Some((ids, scored)))
    }

    /// The projected state of the last step (`[backbone_hidden]`), read back.
    pub fn projected(&self, be: &B) -> Result<Vec<f32>> {
        be.download_f32(&self.s.h_proj)
    }
}

/// Where a draft step's hidden-state input comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DraftInput {
    /// Row `row` of the target's final hidden state after its last pass of `m` tokens.
    Target { m: usize, row: usize },
    /// The drafter's projected state from its previous step.
    Previous,
}

/// A float matrix of `cols` columns (`dtype`'s elements) cut by columns
/// at `at`: its left and right halves.
fn split_cols(dtype: DType, bytes: &[u8], cols: usize, at: usize) -> (Vec<u8>, Vec<u8>) {
    let es = dtype.size();
    let (mut l, mut r) = (Vec::new(), Vec::new());
    for row in bytes.chunks_exact(cols * es) {
        let (a, b) = row.split_at(at * es);
        l.extend_from_slice(a);
        r.extend_from_slice(b);
    }
    (l, r)
}

/// A vocabulary-wide row of the selected tokens' logits, the others below
/// them all (the tokens outside the top centroids are never drawn).
fn full_row(ids: &[u32], scored: &[f32], vocab: usize) -> Vec<f32> {
    let low = scored.iter().copied().fold(f32::INFINITY, f32::min) - 1.0;
    let mut logits = vec![low; vocab];
    for (&id, &x) in ids.iter().zip(scored) {
        logits[id as usize] = x;
    }
    logits
}

/// Indices of the `k` largest values, largest first (the lower index first
/// among equals).
fn top_k(x: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..x.len()).collect();
    idx.sort_by(|&a, &b| x[b].total_cmp(&x[a]).then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

impl<T> DraftScratch<T> {
    fn new<B: ComputeBackend<Buffer = T>>(be: &B, cfg: &DrafterConfig) -> Result<Self> {
        let c = &cfg.text;
        let (h, bh) = (c.hidden, cfg.backbone_hidden);
        let qd = c.heads * c.layers.iter().map(|l| l.head_dim).max().unwrap_or(0);
        let f = |n: usize, label: &str| be.alloc(DType::F32, n, label);
        let u = |n: usize, label: &str| be.alloc(DType::U32, n, label);
        let sel = cfg.centroids.map(|cc| cc.scored(c.vocab));
        Ok(DraftScratch {
            ids: u(1, "draft.ids")?,
            pos_rope: u(1, "draft.pos_rope")?,
            pos_attn: u(1, "draft.pos_attn")?,
            row: u(1, "draft.row")?,
            emb: f(bh, "draft.emb")?,
            h_target: f(bh, "draft.h_target")?,
            h_proj: f(bh, "draft.h_proj")?,
            pre_e: f(h, "draft.pre_e")?,
            pre_h: f(h, "draft.pre_h")?,
            x: f(h, "draft.x")?,
            normed: f(h, "draft.normed")?,
            q: f(qd, "draft.q")?,
            qn: f(qd, "draft.qn")?,
            attn: f(qd, "draft.attn")?,
            o: f(h, "draft.o")?,
            r: f(h, "draft.r")?,
            ff: f(h, "draft.ff")?,
            gate_up: f(2 * c.intermediate, "draft.gate_up")?,
            act: f(c.intermediate, "draft.act")?,
            dense: f(h, "draft.dense")?,
            head: f(
                cfg.centroids.map_or(c.vocab, |cc| cc.centroids),
                "draft.head",
            )?,
            arg: u(1, "draft.arg")?,
            sel_ids: sel.map(|n| u(n, "draft.sel_ids")).transpose()?,
            sel_rows: sel.map(|n| f(n * h, "draft.sel_rows")).transpose()?,
            sel_logits: sel.map(|n| f(n, "draft.sel_logits")).transpose()?,
        })
    }
}
