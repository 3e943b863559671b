//! A layer's attention block ([`AttentionBlock`]): `o = o_proj(attention(q,
//! k, v))` of the layer's normed input, on its sequence's KV cache.

use super::pass::Pass;
use super::sequence::KvCache;
use crate::backend::ComputeBackend;
use crate::error::Result;
use crate::model::config::{LayerKind, LayerSpec, ModelConfig};
use crate::model::scratch::AttentionScratch;
use crate::model::weights::Loader;
use crate::ops::{Matmul, QkvPost};

/// The attention half of a layer: its projections and norms, and its shape.
pub(super) struct AttentionBlock<B: ComputeBackend> {
    /// q_proj, k_proj and v_proj stacked by rows, `[q | k | v]`; on
    /// `attention_k_eq_v` layers `[q | k]` (V is the raw K projection).
    qkv: B::Buffer,
    o_proj: B::Buffer,
    q_norm: B::Buffer,
    k_norm: B::Buffer,
    spec: LayerSpec,
    /// Query heads.
    heads: usize,
    /// Positions a query attends back to (0: all, a full layer).
    window: usize,
}

impl<B: ComputeBackend> AttentionBlock<B> {
    /// Layer `i`'s attention weights from `ld`.
    pub fn load(ld: &Loader<'_, B>, cfg: &ModelConfig, i: usize) -> Result<Self> {
        let spec = cfg.layers[i].clone();
        let (h, hd) = (cfg.hidden, spec.head_dim);
        let qd = cfg.heads * hd;
        let kd = spec.kv_heads * hd;
        let a = format!("layers.{i}.self_attn.");
        let mut qkv = vec![
            (format!("{a}q_proj.weight"), qd),
            (format!("{a}k_proj.weight"), kd),
        ];
        if !spec.k_eq_v {
            qkv.push((format!("{a}v_proj.weight"), kd));
        }
        let window = match spec.kind {
            LayerKind::Sliding => cfg.sliding_window,
            LayerKind::Full => 0,
        };
        Ok(AttentionBlock {
            qkv: ld.stacked(&qkv, h, &format!("{a}qkv_proj"))?,
            o_proj: ld.weight(&format!("{a}o_proj.weight"), h, qd)?,
            q_norm: ld.norm(&format!("{a}q_norm.weight"), hd)?,
            k_norm: ld.norm(&format!("{a}k_norm.weight"), hd)?,
            spec,
            heads: cfg.heads,
            window,
        })
    }

    /// The block on `normed` (the layer's normed input, at the positions
    /// in `pos`) into `s.out`. q|k|v in one matmul, then the queries' and
    /// keys' norms, RoPE, the cache append and the attention in one call
    /// (`qkv_post_attention`).
    pub fn record(
        &self,
        p: &Pass<'_, B>,
        normed: &B::Buffer,
        pos: &B::Buffer,
        s: &AttentionScratch<B::Buffer>,
        cache: &KvCache<B>,
    ) -> Result<()> {
        let (be, m, h) = (p.be, p.m, p.hidden);
        let (nh, spec) = (self.heads, &self.spec);
        let hd = spec.head_dim;
        be.matmul(
            &self.qkv,
            normed,
            &s.qkv,
            Matmul {
                m,
                n: spec.qkv_rows(nh),
                k: h,
                precision: p.precision,
            },
        )?;
        let qp = QkvPost {
            m,
            heads: nh,
            kv_heads: spec.kv_heads,
            head_dim: hd,
            rot_pairs: spec.rot_pairs,
            theta: spec.rope_theta,
            eps: p.eps,
            capacity: cache.capacity,
            // attention_k_eq_v: V is the raw K projection, before k_norm.
            v_from_k: spec.k_eq_v,
        };
        // (q_norm and k_norm take the place of 1/sqrt(head_dim): scale 1)
        let ap = qp.attention(self.window, 1.0, p.precision);
        be.qkv_post_attention(
            &s.qkv,
            &self.q_norm,
            &self.k_norm,
            pos,
            &s.q,
            &cache.k,
            &cache.v,
            &s.heads,
            qp,
            ap,
        )?;
        be.matmul(
            &self.o_proj,
            &s.heads,
            &s.out,
            Matmul {
                m,
                n: h,
                k: nh * hd,
                precision: p.precision,
            },
        )
    }
}
