//! A layer's attention block ([`AttentionBlock`]): `o = o_proj(attention(q,
//! k, v))` of the layer's normed input, on its sequence's KV cache.

use super::pass::Pass;
use super::sequence::KvCache;
use crate::backend::ComputeBackend;
use crate::error::Result;
use crate::model::config::{LayerKind, LayerSpec, ModelConfig};
use crate::model::scratch::AttentionScratch;
use crate::model::weights::Loader;
use crate::ops::{Attention, Matmul, QkvPost};

/// Where a pass's attention keeps its keys and values.
pub(super) enum Kv<'a, B: ComputeBackend> {
    /// One sequence's cache: the pass's rows are its tokens, at the
    /// positions in the pass's `pos`.
    One(&'a KvCache<B>),
    /// Row i is the next token of a sequence of its own (a batched decode
    /// step): `caches[i]` is that sequence's cache of this layer and
    /// `positions[i]` a one-element buffer holding its position; each row
    /// attends alone (`qkv_post_attention_row`), with the one-row scratch
    /// `row` for a backend that moves a row out and back.
    Rows {
        caches: &'a [&'a KvCache<B>],
        positions: &'a [B::Buffer],
        row: &'a AttentionScratch<B::Buffer>,
    },
}

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
    /// (`qkv_post_attention`) on `kv`: the pass's one cache, or each row's
    /// own, then o_proj over every row.
    pub fn record(
        &self,
        p: &Pass<'_, B>,
        normed: &B::Buffer,
        pos: &B::Buffer,
        s: &AttentionScratch<B::Buffer>,
        kv: &Kv<'_, B>,
    ) -> Result<()> {
        let (be, m, h) = (p.be, p.m, p.hidden);
        let (nh, spec) = (self.heads, &self.spec);
        let hd = spec.head_dim;
        let qkv_rows = spec.qkv_rows(nh);
        be.matmul(
            &self.qkv,
            normed,
            &s.qkv,
            Matmul {
                m,
                n: qkv_rows,
                k: h,
                precision: p.precision,
            },
        )?;
        match kv {
            Kv::One(cache) => self.attend(p, m, (&s.qkv, pos, &s.q, &s.heads), cache)?,
            Kv::Rows {
                caches,
                positions,
                row,
            } => {
                // One attention a row, each on its own sequence's cache at
                // its own position: the rows' caches are apart, so no one
                // launch reads them all (the weights are still read once a
                // pass). Each reads its row of q|k|v and writes its row of
                // the heads where the backend addresses rows in place, else
                // through the one-row scratch.
                for (i, (cache, at)) in caches.iter().zip(positions.iter()).enumerate() {
                    let (qp, ap) = self.op(p, 1, cache);
                    be.qkv_post_attention_row(
                        i,
                        &s.qkv,
                        &self.q_norm,
                        &self.k_norm,
                        at,
                        &row.q,
                        &cache.k,
                        &cache.v,
                        &s.heads,
                        (&row.qkv, &row.heads),
                        qp,
                        ap,
                    )?;
                }
            }
        }
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

    /// The one op this layer's attention is on `cache` for `m` rows:
    /// qkv_post's and the attention's parameters.
    fn op(&self, p: &Pass<'_, B>, m: usize, cache: &KvCache<B>) -> (QkvPost, Attention) {
        let (nh, spec) = (self.heads, &self.spec);
        let qp = QkvPost {
            m,
            heads: nh,
            kv_heads: spec.kv_heads,
            head_dim: spec.head_dim,
            rot_pairs: spec.rot_pairs,
            theta: spec.rope_theta,
            eps: p.eps,
            capacity: cache.capacity,
            // attention_k_eq_v: V is the raw K projection, before k_norm.
            v_from_k: spec.k_eq_v,
        };
        // (q_norm and k_norm take the place of 1/sqrt(head_dim): scale 1)
        let ap = qp.attention(self.window, 1.0, p.precision);
        (qp, ap)
    }

    /// `qkv_post_attention` of `m` rows of q|k|v in `qkv` at the positions
    /// in `pos` on `cache`, the queries through `q`, the heads into `heads`.
    fn attend(
        &self,
        p: &Pass<'_, B>,
        m: usize,
        (qkv, pos, q, heads): (&B::Buffer, &B::Buffer, &B::Buffer, &B::Buffer),
        cache: &KvCache<B>,
    ) -> Result<()> {
        let (qp, ap) = self.op(p, m, cache);
        p.be.qkv_post_attention(
            qkv,
            &self.q_norm,
            &self.k_norm,
            pos,
            q,
            &cache.k,
            &cache.v,
            heads,
            qp,
            ap,
        )
    }
}
