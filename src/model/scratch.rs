//! The decoder's activation scratch, listed once: [`Scratch::build`] names
//! every buffer (its label, dtype and length) and both allocates them
//! ([`Scratch::new`]) and sizes them ([`scratch_bytes`],
//! [`stream_scratch_bytes`]), so the bytes a run is checked against at load
//! are the buffers it holds.

use std::convert::Infallible;

use crate::backend::{ComputeBackend, HostBytes};
use crate::dtype::DType;
use crate::error::Result;
use crate::model::config::ModelConfig;

/// One scratch buffer as [`Scratch::build`] lists it.
pub(crate) struct Spec {
    label: &'static str,
    dtype: DType,
    len: usize,
    /// Every element's bits, uploaded; None: allocated (the ops write it
    /// before they read it).
    fill: Option<u32>,
}

impl Spec {
    fn bytes(&self) -> u64 {
        self.dtype.bytes_for(self.len) as u64
    }
}

/// Activation scratch for up to `rows` tokens at once (logits for up to
/// `head_rows` of them); `T` is a backend's buffer. Each block of a layer
/// has its named view ([`AttentionScratch`], [`FfnScratch`],
/// [`ExpertScratch`]); the residual stream ([`Residual`]) goes from layer
/// to layer.
pub(crate) struct Scratch<T> {
    pub rows: usize,
    pub head_rows: usize,
    pub ids: T,
    /// The other id buffer of pipelined greedy decode: step n embeds one and
    /// its argmax writes the other.
    pub ids_next: T,
    pub pos: T,
    pub residual: Residual<T>,
    pub attention: AttentionScratch<T>,
    pub ffn: FfnScratch<T>,
    pub experts: ExpertScratch<T>,
    pub head: HeadScratch<T>,
}

/// The residual stream between layers.
pub(crate) struct Residual<T> {
    /// The stream itself.
    pub x: T,
    /// The current layer's normed input (then the final norm's output).
    pub normed: T,
}

/// The attention block's activations.
pub(crate) struct AttentionScratch<T> {
    /// The fused q|k|v projection.
    pub qkv: T,
    /// The queries after their norm and RoPE.
    pub q: T,
    /// The heads' attention output.
    pub heads: T,
    /// The block's output, o_proj of `heads`.
    pub out: T,
}

/// The feed-forward block's activations, the dense MLP's among them.
pub(crate) struct FfnScratch<T> {
    /// `x + post_attention_layernorm(o)`: what post_ffn adds to.
    pub r: T,
    /// The dense MLP's input, `pre_feedforward_layernorm(r)`.
    pub ff_in: T,
    pub gate_up: T,
    pub act: T,
    /// The dense MLP's output.
    pub dense: T,
    /// Expert id 0 for every row: the dense MLP run as a one-expert MoE.
    pub zero_ids: T,
    /// Weight 1.0 for every row: the dense down projection as a one-expert
    /// MoE phase 2 (multiplying by 1 is exact).
    pub one_w: T,
}

/// The routed experts' activations.
pub(crate) struct ExpertScratch<T> {
    /// The experts' input, `pre_feedforward_layernorm_2(r)`.
    pub x: T,
    /// The router's choice: `top_k` expert ids and weights a row.
    pub ids: T,
    pub weights: T,
    pub act: T,
    /// The weighted sum of the experts' outputs.
    pub out: T,
    /// With streamed experts: the routes' slot ids, and a wave's routing
    /// weights, output and running sum (`model::experts`).
    pub waves: Option<WaveScratch<T>>,
}

/// The LM head's rows and logits.
pub(crate) struct HeadScratch<T> {
    pub logits: T,
    /// The logits after the final softcap.
    pub capped: T,
    /// Rows of a final-normed batch gathered for the head (`ids`, 0.. into
    /// a batch's `normed`) into `x`: teacher forcing's head slices, and
    /// generate's last prompt row (into `single`'s).
    pub ids: T,
    pub x: T,
}

pub(crate) struct WaveScratch<T> {
    pub slot_ids: T,
    pub weights: T,
    pub out: T,
    pub sum: T,
    /// One-row scratch only: each layer's input residual of a decode pass
    /// recorded with its slots looked up on the device (layer i reads
    /// `chain[i]` and writes `chain[i + 1]`, the last layer the scratch's
    /// own), so a pass that missed in layer i reruns from there; two such
    /// chains, one after the other.
    pub chain: Vec<Residual<T>>,
    /// Every layer's routed ids of such a pass, a miss flagged
    /// (`ComputeBackend::slot_lookup`'s log), read back once a pass.
    pub log: T,
    /// A prefill pass's full-layer stacks (every expert of a layer, for
    /// the layers whose batch does not fit the slots), made when the
    /// first such layer needs them and let go at the pass's end
    /// (`model::experts::streaming`).
    pub full_layer: std::cell::RefCell<Option<FullLayer<T>>>,
}

/// Stacks of every expert of a layer, in the slot stacks' format, that a
/// prefill pass refills for each layer whose experts exceed its slots.
pub(crate) struct FullLayer<T> {
    pub gate_up: T,
    pub down: T,
    /// Each stack's format: a layer of another format makes new ones.
    pub dtypes: [DType; 2],
}

impl<T> Scratch<T> {
    /// The scratch on `be`.
    pub fn new<B: ComputeBackend<Buffer = T>>(
        be: &B,
        cfg: &ModelConfig,
        rows: (usize, usize),
        streamed: bool,
    ) -> Result<Self> {
        Self::build(cfg, rows, streamed, |b| match b.fill {
            None => be.alloc(b.dtype, b.len, b.label),
            Some(bits) => be.upload(
                b.dtype,
                HostBytes::Slice(bytemuck::cast_slice(&vec![bits; b.len])),
                b.label,
            ),
        })
    }

    /// Every buffer of the scratch for `rows` tokens with logits for
    /// `head_rows` of them, each made by `make` from its [`Spec`], in order.
    fn build<E>(
        cfg: &ModelConfig,
        (rows, head_rows): (usize, usize),
        streamed: bool,
        mut make: impl FnMut(Spec) -> std::result::Result<T, E>,
    ) -> std::result::Result<Self, E> {
        let h = cfg.hidden;
        let (max_hd, max_qkv) = widest_layer(cfg);
        let qd = cfg.heads * max_hd;
        // Buffers of a disabled branch still need one element to be valid.
        let (k_, mi) = moe_widths(cfg);
        let f = |n: usize, label| per_row(DType::F32, rows, n, label);
        let u = |n: usize, label| per_row(DType::U32, rows, n, label);
        let logits = |label| Spec {
            label,
            dtype: DType::F32,
            len: head_rows * cfg.vocab.max(1),
            fill: None,
        };
        let filled = |dtype, bits, label| Spec {
            fill: Some(bits),
            ..per_row(dtype, rows, 1, label)
        };
        // (made in the order listed: the labels' order on the device)
        let ids = make(u(1, "ids"))?;
        let ids_next = make(u(1, "ids_next"))?;
        let pos = make(u(1, "positions"))?;
        let residual = Residual {
            x: make(f(h, "x"))?,
            normed: make(f(h, "normed"))?,
        };
        let attention = AttentionScratch {
            qkv: make(f(max_qkv, "qkv"))?,
            q: make(f(qd, "q"))?,
            heads: make(f(qd, "attn"))?,
            out: make(f(h, "o"))?,
        };
        let (r, ff_in) = (make(f(h, "r"))?, make(f(h, "ff_in"))?);
        let gate_up = make(f(2 * cfg.intermediate, "mlp_gate_up"))?;
        let act = make(f(cfg.intermediate, "mlp_act"))?;
        let dense = make(f(h, "dense"))?;
        let moe_in = make(f(h, "moe_in"))?;
        let route_ids = make(u(k_, "route_ids"))?;
        let route_w = make(f(k_, "route_w"))?;
        let ffn = FfnScratch {
            r,
            ff_in,
            gate_up,
            act,
            dense,
            zero_ids: make(filled(DType::U32, 0, "zero_ids"))?,
            one_w: make(filled(DType::F32, 1.0f32.to_bits(), "one_w"))?,
        };
        let (moe_act, moe_out) = (make(f(k_ * mi, "moe_act"))?, make(f(h, "moe_out"))?);
        let head = HeadScratch {
            logits: make(logits("logits"))?,
            capped: make(logits("logits_capped"))?,
            ids: make(Spec {
                label: "head_ids",
                dtype: DType::U32,
                len: head_rows,
                fill: None,
            })?,
            x: make(Spec {
                label: "head_x",
                dtype: DType::F32,
                len: head_rows * h,
                fill: None,
            })?,
        };
        let experts = ExpertScratch {
            x: moe_in,
            ids: route_ids,
            weights: route_w,
            act: moe_act,
            out: moe_out,
            waves: if streamed {
                Some(WaveScratch::build(cfg, rows, &mut make)?)
            } else {
                None
            },
        };
        Ok(Scratch {
            rows,
            head_rows,
            ids,
            ids_next,
            pos,
            residual,
            attention,
            ffn,
            experts,
            head,
        })
    }
}

impl<T> WaveScratch<T> {
    /// The streamed experts' buffers of a scratch of `rows` rows, each made
    /// by `make` from its [`Spec`], in order.
    fn build<E>(
        cfg: &ModelConfig,
        rows: usize,
        make: &mut impl FnMut(Spec) -> std::result::Result<T, E>,
    ) -> std::result::Result<Self, E> {
        let (k_, _) = moe_widths(cfg);
        let f = |n: usize, label| per_row(DType::F32, rows, n, label);
        let (slot_ids, weights) = (
            make(per_row(DType::U32, rows, k_, "slot_ids"))?,
            make(f(k_, "wave_weights"))?,
        );
        let (out, sum) = (
            make(f(cfg.hidden, "wave_out"))?,
            make(f(cfg.hidden, "wave_sum"))?,
        );
        let mut chain = Vec::new();
        if rows == 1 {
            // (two halves: pipelined decode records a pass before the one
            // ahead of it is settled)
            for _ in 0..2 * cfg.layers.len() {
                chain.push(Residual {
                    x: make(f(cfg.hidden, "chain_x"))?,
                    normed: make(f(cfg.hidden, "chain_normed"))?,
                });
            }
        }
        let log = make(per_row(DType::U32, 1, cfg.layers.len() * k_, "slot_log"))?;
        Ok(WaveScratch {
            slot_ids,
            weights,
            out,
            sum,
            chain,
            log,
            full_layer: std::cell::RefCell::new(None),
        })
    }
}

/// A buffer of `n` (at least one) elements a row.
fn per_row(dtype: DType, rows: usize, n: usize, label: &'static str) -> Spec {
    Spec {
        label,
        dtype,
        len: rows * n.max(1),
        fill: None,
    }
}

/// Routes per token and the experts' intermediate width; 1 and 1 without
/// experts.
fn moe_widths(cfg: &ModelConfig) -> (usize, usize) {
    if cfg.enable_moe {
        (cfg.top_k, cfg.moe_inter)
    } else {
        (1, 1)
    }
}

/// The largest head_dim and q|k|v row count over the layers.
pub(crate) fn widest_layer(cfg: &ModelConfig) -> (usize, usize) {
    let max_hd = cfg.layers.iter().map(|l| l.head_dim).max().unwrap_or(0);
    let max_qkv = cfg
        .layers
        .iter()
        .map(|l| l.qkv_rows(cfg.heads))
        .max()
        .unwrap_or(0);
    (max_hd, max_qkv)
}

/// Device bytes of the scratch of a pass over up to `rows` tokens with
/// logits for up to `head_rows` of them, without streamed experts' (a
/// model holds one of 1 and 1 rows, and for batched prefill one of
/// `prefill_batch` and `LOGITS_BATCH.min(prefill_batch)`).
pub fn scratch_bytes(cfg: &ModelConfig, rows: usize, head_rows: usize) -> u64 {
    let mut bytes = 0;
    let Ok(_) = Scratch::<()>::build::<Infallible>(cfg, (rows, head_rows), false, |b| {
        bytes += b.bytes();
        Ok(())
    });
    bytes
}

/// Device bytes of the scratch streamed experts add to a scratch of `rows`
/// rows (`WaveScratch`: slot ids and a wave's weights per route, a wave's
/// output and the waves' sum per row, the slot lookups' log and, for one
/// row, each layer's input residual).
pub fn stream_scratch_bytes(cfg: &ModelConfig, rows: usize) -> u64 {
    let mut bytes = 0;
    let Ok(_) = WaveScratch::<()>::build::<Infallible>(cfg, rows, &mut |b| {
        bytes += b.bytes();
        Ok(())
    });
    bytes
}
