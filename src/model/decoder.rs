//! The Gemma 4 MoE decoder, written once against [`ComputeBackend`].
//!
//! One forward pass over `m` tokens (a prefill batch, or one decode
//! token) records, per layer (6 ops, 8 dispatches on a GPU, when decoding
//! with experts):
//!
//! ```text
//! y   = input_layernorm(x)                   (the previous layer's post_ffn)
//! qkv = [q_proj | k_proj | v_proj] y         (one matmul over stacked weights)
//! q = rope(q_norm q); k = rope(k_norm k); v = rmsnorm_noweight(v)
//!       (k_eq_v layers: v from the RAW k), k and v appended to the cache
//! a   = attention(q, cache, scale 1, window on sliding layers)
//!                                            (both: qkv_post_attention;
//!                                            decode: one split launch and
//!                                            the combine)
//! r   = x + post_attention_layernorm(o_proj a);
//!       ff = pre_ff(r); moe_in = pre_ff_2(r); with experts the router on r
//!                                            (post_attention_router; decode:
//!                                            with both branches' gate_up,
//!                                            post_attention_gate_up)
//! h1  = down(gelu(gate ff) * up ff)          (decode: a one-expert MoE)
//! h2  = moe(moe_in, the router's choice)     (decode: the down phases as
//!                                            one pair)
//! x   = (r + post_feedforward_layernorm(post_ff_1 h1 + post_ff_2 h2))
//!       * layer_scalar, and the next layer's input norm of x
//!                                            (post_ffn)
//! ```
//!
//! then the tied LM head (the last post_ffn applied the final norm) and the
//! softcap. Ops never alias their inputs, so every stage writes its own
//! scratch buffer; the residual stream needs no ping-pong because post_ffn
//! reads `r`, not `x`.
//!
//! A layer (`layer`) is its input norm and two blocks that own their
//! weights: attention (`attention`) and feed-forward (`feed_forward`,
//! with the routed experts of `model::experts` beside its dense MLP). Each
//! block reads its named view of the activation scratch (`model::scratch`); the
//! residual stream goes from layer to layer as an argument. The generation
//! loops over these passes (greedy, pipelined on the device, and sampled on
//! the host) are in `decoder/generate.rs`; a decode step of several
//! sequences in one pass (each row's attention on its own sequence's
//! caches) in `decoder/batch.rs`.

use std::cell::{Cell, OnceCell};
use std::time::Instant;

use crate::backend::{ComputeBackend, Support};
use crate::dtype::{round_to, DType};
use crate::error::{Error, Result};
use crate::model::config::{LayerKind, ModelConfig};
use crate::model::experts::slot_cache::Policy;
use crate::model::experts::streaming::{ExpertStore, Optimism, StreamPrefill};
pub use crate::model::scratch::{scratch_bytes, stream_scratch_bytes};
use crate::model::scratch::{widest_layer, Scratch};
use crate::model::weights::{Loader, TensorSource};
use crate::ops::{Embed, Matmul, OpKind};

mod attention;
mod batch;
mod batch_ahead;
mod feed_forward;
mod generate;
mod layer;
mod one_sequence;
mod optimistic;
mod pass;
mod sequence;
mod shared_state;
use attention::Kv;
pub use batch_ahead::BatchAhead;
pub use generate::{GenerateOptions, Generation};
use layer::Layer;
pub use one_sequence::OneSequence;
use optimistic::Unsettled;
use pass::Pass;
pub use sequence::Sequence;

/// Tokens one prefill batch carries by default. Large enough that each
/// expert of Gemma 4 26B-A4B sees a full GEMM tile of tokens per batch
/// (512 x top-8 / 128 experts = 32), so a batch reads the weights once for
/// many tokens; the batch's activations cost ~0.3 GB at that size.
pub const DEFAULT_PREFILL_BATCH: usize = 512;

/// Most tokens a prefill batch may carry (`ModelOptions::prefill_batch`).
pub const MAX_PREFILL_BATCH: usize = 4096;

/// Rows of one LM head slice of [`Model::logits`]: the head's output is
/// `vocab` wide (1 MiB per row for Gemma 4), so teacher forcing runs the
/// layers in prefill batches and the head over at most this many rows of
/// the batch at a time.
pub const LOGITS_BATCH: usize = 16;

/// How a model is opened.
#[derive(Clone, Debug)]
pub struct ModelOptions {
    /// Longest sequence (prompt plus generated tokens) the KV caches hold;
    /// they are sized for it up front, and a request past it is an error.
    pub max_context: usize,
    /// Most prompt tokens one prefill pass carries (1..=[`MAX_PREFILL_BATCH`]).
    /// Larger batches read the weights fewer times per prompt and keep the
    /// GPU's GEMM tiles full; they cost activation memory and sliding-window
    /// cache slots (see [`Model::load`]).
    pub prefill_batch: usize,
    /// The KV caches' element type: f32 (the default, and what the
    /// transformers fixtures are reproduced with), or f16, which halves the
    /// caches' memory and what a decode step's attention reads, as
    /// llama.cpp's default does. An f16 cache rounds each key and value to
    /// 11 significant bits on append (`dtype::kv_half`); the wgpu backend
    /// needs the device's shader-f16 feature for it.
    pub kv_cache: DType,
    /// Routed experts streamed from the source through this many device
    /// slots per layer (at least top_k; past the expert count, the expert
    /// count), instead of all of them resident
    /// (None, the default). Logits are bit-identical either way
    /// (`model::experts`).
    pub expert_slots: Option<usize>,
    /// Which slot a streamed expert evicts.
    pub expert_policy: Policy,
    /// Where a streamed expert's miss is copied from ([`ExpertStore`]):
    /// the checkpoint's mapping (the default) or a host copy of every
    /// expert the device reads.
    pub expert_store: ExpertStore,
    /// When a decode pass of streamed experts looks its slots up on the
    /// device instead of waiting for each layer's ids ([`Optimism`]).
    pub expert_optimism: Optimism,
    /// How a prefill batch whose routed experts exceed a streamed layer's
    /// slots runs ([`StreamPrefill`]): through full-layer stacks made for
    /// the pass (the default), or in waves of tokens through the slots.
    pub stream_prefill: StreamPrefill,
    /// The arithmetic of the tensor-core products (prefill GEMMs and
    /// attention; [`crate::Precision`]): exact (the default, the f32 floor)
    /// or fast (activations rounded once to f16). The model's own, passed
    /// with each op that has such products.
    pub precision: crate::Precision,
}

impl Default for ModelOptions {
    fn default() -> Self {
        ModelOptions {
            max_context: 4096,
            prefill_batch: DEFAULT_PREFILL_BATCH,
            kv_cache: DType::F32,
            expert_slots: None,
            expert_policy: Policy::Lfu,
            expert_store: ExpertStore::Mapping,
            expert_optimism: Optimism::AfterHit,
            stream_prefill: StreamPrefill::FullLayer,
            precision: crate::Precision::Exact,
        }
    }
}

/// What a recorded forward pass ends with after its last layer.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Tail {
    /// Nothing: prefill, which only fills the KV caches.
    Layers,
    /// The final norm, into the scratch's `normed` (the head runs after it
    /// on gathered rows: teacher forcing's slices, generate's last row).
    FinalNorm,
    /// The final norm, the LM head and the softcap, into the logits.
    Head,
}

/// A Gemma 4 MoE model on one backend: its weights and settings, shared
/// by any number of [`Sequence`]s, each with its own KV caches and
/// position. Passes run one at a time (the activation scratch is the
/// model's), in any order of sequences.
pub struct Model<B: ComputeBackend> {
    /// Tells its sequences apart from another model's.
    id: u64,
    backend: B,
    cfg: ModelConfig,
    /// `[vocab, hidden]`: the embedding table and the tied LM head.
    embed: B::Buffer,
    final_norm: B::Buffer,
    layers: Vec<Layer<B>>,
    /// One-row scratch: decode, and prefill of a single token.
    single: Scratch<B::Buffer>,
    /// `prefill_batch`-row scratch for batched prefill, created on first
    /// use so a decode-only run allocates none of it.
    batch: OnceCell<Scratch<B::Buffer>>,
    /// One position a row of a batched decode step ([`Model::decode_batch`]),
    /// each row's attention reading its own; created on first use.
    row_positions: OnceCell<Vec<B::Buffer>>,
    prefill_batch: usize,
    max_context: usize,
    kv_cache: DType,
    /// The tensor-core products' arithmetic, passed with each op that has
    /// them (prefill GEMMs and attention).
    precision: crate::Precision,
    embed_scale: f32,
    /// Expert slots per layer, when `ModelOptions::expert_slots` streams
    /// the experts (each layer's slot cache is its experts' own: a cache
    /// of weights every sequence's passes share).
    expert_slots: Option<usize>,
    expert_optimism: Optimism,
    stream_prefill: StreamPrefill,
    /// Whether the last pass found every expert in its slot (with
    /// `Optimism::AfterHit`, the next decode pass is optimistic).
    hit_last: Cell<bool>,
}

impl<B: ComputeBackend> Model<B> {
    /// Upload the weights of `source` and size the KV caches for `opts.max_context`.
    ///
    /// Cache capacity per layer: full-attention layers keep every position,
    /// `max_context` slots. Sliding layers keep a ring of
    /// `sliding_window + prefill_batch - 1` slots, not `sliding_window`: a
    /// batch of m tokens appends all m keys before any of its queries
    /// attend, and the first query (position p) still needs keys back to
    /// `p + 1 - window` while the last append writes `p + m - 1`; the ring
    /// must hold that span of `window + m - 1` positions so no append
    /// overwrites a key an earlier query of the same batch reads. (Never more
    /// than `max_context` slots: a ring that never wraps is a linear cache.)
    pub fn load(backend: B, source: &dyn TensorSource, opts: ModelOptions) -> Result<Self> {
        let cfg = source.config().clone();
        cfg.validate()?;
        if opts.max_context == 0 {
            return Err(Error::InvalidInput("max_context must be positive".into()));
        }
        if !(1..=MAX_PREFILL_BATCH).contains(&opts.prefill_batch) {
            return Err(Error::InvalidInput(format!(
                "prefill_batch {} is outside 1..={MAX_PREFILL_BATCH}",
                opts.prefill_batch
            )));
        }
        if u32::try_from(opts.max_context).is_err() {
            return Err(Error::InvalidInput(format!(
                "max_context {} does not fit u32 positions",
                opts.max_context
            )));
        }
        if !crate::ops::CACHES.contains(&opts.kv_cache) {
            return Err(Error::InvalidInput(format!(
                "kv_cache {}: the KV caches are f32 or f16",
                opts.kv_cache
            )));
        }
        // Before a weight is uploaded: a device that cannot run f16 caches
        // says so now, not at the first token.
        if let Support::No(reason) = backend.supports(&OpKind::KvCache {
            dtype: opts.kv_cache,
        }) {
            return Err(Error::Unsupported {
                backend: backend.info().backend.clone(),
                op: format!("{} KV caches", opts.kv_cache),
                reason,
            });
        }
        // A batch never holds more tokens than the context.
        let prefill_batch = opts.prefill_batch.min(opts.max_context);
        check_batch_fits(&cfg, prefill_batch, backend.info().limits.max_binding_bytes)?;
        // Before any allocation: a context the backend cannot hold is an
        // error with the figure and the limit, not an abort.
        check_runtime_fits(
            backend.info(),
            &cfg,
            (opts.max_context, prefill_batch, opts.kv_cache),
        )?;
        let slots = check_expert_slots(&cfg, opts.expert_slots)?;
        let ld = Loader::new(&backend, source)?;
        let (embed, embed_dtype) = ld.embedding(cfg.vocab, cfg.hidden)?;
        let final_norm = ld.norm("norm.weight", cfg.hidden)?;
        let layers = (0..cfg.layers.len())
            .map(|i| {
                let streamed = slots.map(|n| (n, opts.expert_policy, opts.expert_store));
                Layer::load(&ld, &cfg, i, streamed)
            })
            .collect::<Result<Vec<_>>>()?;
        ld.finish();
        let single = Scratch::new(&backend, &cfg, (1, 1), slots.is_some())?;
        let embed_scale = round_to(embed_dtype, (cfg.hidden as f32).sqrt());
        Ok(Model {
            id: sequence::next_model_id(),
            backend,
            cfg,
            embed,
            final_norm,
            layers,
            single,
            batch: OnceCell::new(),
            row_positions: OnceCell::new(),
            prefill_batch,
            max_context: opts.max_context,
            kv_cache: opts.kv_cache,
            precision: opts.precision,
            embed_scale,
            expert_slots: slots,
            expert_optimism: opts.expert_optimism,
            stream_prefill: opts.stream_prefill,
            hit_last: Cell::new(false),
        })
    }

    /// KV cache slots of a layer of `kind` ([`cache_capacity`]).
    fn cache_capacity(&self, kind: LayerKind) -> usize {
        cache_capacity(&self.cfg, kind, self.max_context, self.prefill_batch)
    }

    /// Expert slots per layer, when the experts are streamed.
    pub fn expert_slots(&self) -> Option<usize> {
        self.expert_slots
    }

    /// The arithmetic of the model's tensor-core products.
    pub fn precision(&self) -> crate::Precision {
        self.precision
    }

    /// Run the tensor-core products at `precision` from now on (this
    /// model's only: it goes with each op, not into the backend).
    pub fn set_precision(&mut self, precision: crate::Precision) {
        self.precision = precision;
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The backend back, the model's buffers released (to open another
    /// model on the same device without creating it again).
    pub fn into_backend(self) -> B {
        self.backend
    }

    pub fn max_context(&self) -> usize {
        self.max_context
    }

    /// Most tokens one prefill pass carries (`ModelOptions::prefill_batch`,
    /// at most the context).
    pub fn prefill_batch(&self) -> usize {
        self.prefill_batch
    }

    /// Whether the batched-prefill scratch has been allocated.
    pub fn has_batch_scratch(&self) -> bool {
        self.batch.get().is_some()
    }

    /// Teacher-forced logits of `tokens`, appended to the current context:
    /// one row of `vocab` final (softcapped) logits per token. The layers
    /// run in prefill batches (on a GPU the prefill GEMM and attn_prefill);
    /// the LM head, `vocab` wide, in slices of at most [`LOGITS_BATCH`] rows
    /// of the batch's final hidden state, each read back before the next.
    pub fn logits(&self, seq: &mut Sequence<B>, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        self.check_owned(seq)?;
        self.check_request(seq, tokens, 0)?;
        let mut rows = Vec::with_capacity(tokens.len());
        for chunk in tokens.chunks(self.prefill_batch) {
            let m = chunk.len();
            let tail = if m <= head_batch(self.prefill_batch) {
                Tail::Head
            } else {
                Tail::FinalNorm
            };
            self.forward_chunk(seq, chunk, tail)?;
            let s = self.scratch(m)?;
            if tail == Tail::Head {
                rows.extend(self.read_logits(s, m)?);
            } else {
                for r0 in (0..m).step_by(s.head_rows) {
                    let n = s.head_rows.min(m - r0);
                    self.head_slice(s, r0, n)?;
                    rows.extend(self.read_logits(s, n)?);
                }
            }
            seq.advance(chunk);
        }
        Ok(rows)
    }

    /// The LM head (and softcap) for rows `r0 .. r0 + n` of the batch's
    /// final hidden state, into the batch's logits.
    fn head_slice(&self, s: &Scratch<B::Buffer>, r0: usize, n: usize) -> Result<()> {
        self.head_rows_into(s, s, r0, n)
    }

    /// The LM head (and softcap) for rows `r0 .. r0 + n` of `src`'s final
    /// hidden state into `dst`'s logits: the rows gathered into
    /// `dst.head.x` through `embed` (a row gather; times 1.0, exact), then
    /// the head as for a pass.
    fn head_rows_into(
        &self,
        src: &Scratch<B::Buffer>,
        dst: &Scratch<B::Buffer>,
        r0: usize,
        n: usize,
    ) -> Result<()> {
        let be = &self.backend;
        let ids: Vec<u32> = (r0..r0 + n).map(|r| r as u32).collect();
        be.write_u32(&dst.head.ids, 0, &ids)?;
        be.embed(
            &dst.head.ids,
            &src.residual.normed,
            &dst.head.x,
            Embed {
                m: n,
                hidden: self.cfg.hidden,
                vocab: src.rows,
                scale: 1.0,
            },
        )?;
        self.record_head(dst, &dst.head.x, n)
    }

    /// The first `m` rows of the final logits, read back.
    fn read_logits(&self, s: &Scratch<B::Buffer>, m: usize) -> Result<Vec<Vec<f32>>> {
        let v = self.cfg.vocab;
        let flat = self
            .backend
            .download_f32_range(self.final_logits(s), 0, m * v)?;
        Ok(flat.chunks(v).map(<[f32]>::to_vec).collect())
    }

    /// Ids inside the vocabulary, and room in the context for `tokens` plus
    /// `extra` positions; checked on the host before anything is uploaded.
    fn check_request(&self, seq: &Sequence<B>, tokens: &[u32], extra: usize) -> Result<()> {
        if let Some((i, t)) = tokens
            .iter()
            .enumerate()
            .find(|(_, &t)| t as usize >= self.cfg.vocab)
        {
            return Err(Error::InvalidInput(format!(
                "token id {t} at index {i} is past the vocabulary of {}",
                self.cfg.vocab
            )));
        }
        let need = seq.pos + tokens.len() + extra;
        if need > self.max_context {
            return Err(Error::InvalidInput(format!(
                "{} context tokens + {} new + {extra} to generate = {need} exceeds the \
                 maximum context of {} (raise --max-context)",
                seq.pos,
                tokens.len(),
                self.max_context
            )));
        }
        Ok(())
    }

    /// Run the non-empty `prompt` through every layer in batches, and the
    /// LM head for its last token only (the layers submitted a layer at a
    /// time, the head left recorded). The last token rides in the last batch, so the first new token costs the
    /// batch one row more and the head, not a whole decode step's weight
    /// reads after it. The last token's logits end in `single`'s, as a
    /// decode step's do (its final-normed row gathered from the batch, or
    /// the decode path itself where the last batch is that one token).
    fn prefill_with_head(&self, seq: &mut Sequence<B>, prompt: &[u32]) -> Result<()> {
        let last = (prompt.len() - 1) / self.prefill_batch * self.prefill_batch;
        self.prefill(seq, &prompt[..last])?;
        let chunk = &prompt[last..];
        let m = chunk.len();
        if m == 1 {
            self.forward_chunk(seq, chunk, Tail::Head)?;
        } else {
            self.forward_chunk(seq, chunk, Tail::FinalNorm)?;
            self.head_rows_into(self.scratch(m)?, &self.single, m - 1, 1)?;
        }
        seq.advance(chunk);
        Ok(())
    }

    /// The scratch for an `m`-token pass (the batched one created on first use).
    fn scratch(&self, m: usize) -> Result<&Scratch<B::Buffer>> {
        if m == 1 {
            return Ok(&self.single);
        }
        self.batch
            .get()
            .ok_or_else(|| Error::InvalidInput("batched scratch not allocated".into()))
    }

    /// The `prefill_batch`-row scratch, created on first use.
    fn batch_scratch(&self) -> Result<&Scratch<B::Buffer>> {
        if self.batch.get().is_none() {
            let batch = Scratch::new(
                &self.backend,
                &self.cfg,
                (self.prefill_batch, head_batch(self.prefill_batch)),
                self.expert_slots.is_some(),
            )?;
            // (set just above when empty: the cell is never full here)
            let _ = self.batch.set(batch);
        }
        self.scratch(2)
    }

    /// Write ids and positions for `chunk` at `seq`'s position and record
    /// its pass (the caller advances `seq` past it).
    fn forward_chunk(&self, seq: &mut Sequence<B>, chunk: &[u32], tail: Tail) -> Result<()> {
        let m = chunk.len();
        if m > 1 {
            self.batch_scratch()?;
        }
        let s = self.scratch(m)?;
        let positions: Vec<u32> = (seq.pos..seq.pos + m).map(|p| p as u32).collect();
        self.backend.write_u32(&s.ids, 0, chunk)?;
        self.backend.write_u32(&s.pos, 0, &positions)?;
        self.record_forward(seq, s, &s.ids, m, tail)
    }

    /// The buffer holding the final logits after the head ran.
    fn final_logits<'a>(&self, s: &'a Scratch<B::Buffer>) -> &'a B::Buffer {
        if self.cfg.final_softcap.is_some() {
            &s.head.capped
        } else {
            &s.head.logits
        }
    }

    /// Record embedding, every layer and `tail` for the `m` tokens whose ids
    /// and positions are in `s` (an optimistic pass settled before it
    /// returns).
    fn record_forward(
        &self,
        seq: &mut Sequence<B>,
        s: &Scratch<B::Buffer>,
        ids: &B::Buffer,
        m: usize,
        tail: Tail,
    ) -> Result<()> {
        self.record_pass(seq, s, ids, m, tail, None).map(drop)
    }

    /// [`Self::record_forward`]; an optimistic pass with `ahead` =
    /// Some(half) (pipelined greedy decode) uses that half of the chain,
    /// records its head unsettled and comes back to be settled later
    /// (`optimistic::Unsettled`).
    fn record_pass(
        &self,
        seq: &mut Sequence<B>,
        s: &Scratch<B::Buffer>,
        ids: &B::Buffer,
        m: usize,
        tail: Tail,
        ahead: Option<usize>,
    ) -> Result<Option<Unsettled>> {
        debug_assert!(m <= s.rows && (tail != Tail::Head || m <= s.head_rows));
        let (be, cfg) = (&self.backend, &self.cfg);
        let p = Pass {
            be,
            m,
            hidden: cfg.hidden,
            eps: cfg.eps,
            precision: self.precision,
        };
        let tracing = cfg.enable_moe && seq.routing.is_some();
        // One decode row of streamed experts, routed by the router: the
        // whole pass at once, slots looked up on the device, where the
        // policy says so.
        let chain = if self.optimistic_for(seq, m) {
            self.chain(s, ahead.unwrap_or(0))
        } else {
            None
        };
        // (a pass through full-layer stacks placed nothing in the slots: the
        // next step does not count as following hits)
        let unhit = |seq: &Sequence<B>| (seq.stream.counts.misses, seq.stream.full_layer_passes);
        let before = unhit(seq);
        seq.written = seq.written.max(seq.pos + m);
        let input = chain.map_or(&s.residual, |c| &c[0]);
        self.record_embedding(&p, input, ids)?;
        let mut pass: Vec<Vec<Vec<u32>>> = vec![Vec::new(); if tracing { m } else { 0 }];
        let mut layers = || -> Result<()> {
            for li in 0..self.layers.len() {
                self.record_layer(seq, s, &p, li, (chain, tail), chain.is_some())?;
                if tracing {
                    // (the readback rides after the layer's recorded ops)
                    let ids = be.download_u32(&s.experts.ids)?;
                    for (t, row) in pass.iter_mut().enumerate() {
                        row.push(ids[t * cfg.top_k..(t + 1) * cfg.top_k].to_vec());
                    }
                }
                // A prefill batch goes to the device a layer at a time, so
                // the GPU runs each layer while the host records the next
                // (one submit at the end left it idle for the whole
                // recording); a decode step (m = 1) stays one submit.
                if m > 1 {
                    be.flush()?;
                }
            }
            Ok(())
        };
        let recorded = layers();
        // (let go on a failed pass too)
        Self::drop_full_layer(s);
        recorded?;
        if let (true, Some(trace)) = (tracing, seq.routing.as_mut()) {
            trace.extend(pass);
        }
        seq.computed += m as u64;
        if let Some((t, row)) = seq.route_by.as_mut() {
            *row = (*row + m) % t.tokens.len();
        }
        let unsettled = match (chain, ahead) {
            (Some(_), Some(half)) => Some(self.unsettled(seq, s, half)?),
            (Some(chain), None) => {
                let t0 = Instant::now();
                let log = be.download_u32(&Self::waves(s)?.log)?;
                seq.stream.host_wait += t0.elapsed();
                seq.stream.waits += 1;
                self.settle(seq, s, chain, tail, &log)?;
                None
            }
            (None, _) => None,
        };
        if unsettled.is_none() && self.expert_slots.is_some() {
            self.hit_last.set(unhit(seq) == before);
        }
        if tail == Tail::Head {
            self.record_head(s, &s.residual.normed, m)?;
        }
        Ok(unsettled)
    }

    /// Let a pass's full-layer stacks go (the device keeps them until the
    /// work recorded on them is done): they hold a layer's experts only
    /// while a prefill pass needs them.
    fn drop_full_layer(s: &Scratch<B::Buffer>) {
        if let Some(ws) = &s.experts.waves {
            ws.full_layer.borrow_mut().take();
        }
    }

    /// The embedding of the pass's `ids` into `res.x` and layer 0's input
    /// norm of it into `res.normed` (a config has at least one layer; every
    /// later norm of the residual stream, the next layer's input norm or
    /// the final norm, ends the layer before it).
    fn record_embedding(
        &self,
        p: &Pass<'_, B>,
        res: &crate::model::scratch::Residual<B::Buffer>,
        ids: &B::Buffer,
    ) -> Result<()> {
        let (be, cfg) = (&self.backend, &self.cfg);
        be.embed(
            ids,
            &self.embed,
            &res.x,
            Embed {
                m: p.m,
                hidden: cfg.hidden,
                vocab: cfg.vocab,
                scale: self.embed_scale,
            },
        )?;
        be.rms_norm(
            &res.x,
            Some(&self.layers[0].input_norm),
            None,
            &res.normed,
            p.norm(cfg.hidden),
        )
    }

    /// The norm a layer's post_ffn leaves in `normed` after layer `li`:
    /// the next layer's input norm, after the last the final norm (where
    /// the pass ends with `tail` other than [`Tail::Layers`]), else none.
    fn norm_after(&self, li: usize, tail: Tail) -> Option<&B::Buffer> {
        match self.layers.get(li + 1) {
            Some(next) => Some(&next.input_norm),
            None if tail != Tail::Layers => Some(&self.final_norm),
            None => None,
        }
    }

    /// The tied LM head and the softcap for the `m` final-normed rows of `x`
    /// into `s`'s logits.
    fn record_head(&self, s: &Scratch<B::Buffer>, x: &B::Buffer, m: usize) -> Result<()> {
        let (be, cfg) = (&self.backend, &self.cfg);
        be.matmul(
            &self.embed,
            x,
            &s.head.logits,
            Matmul {
                m,
                n: cfg.vocab,
                k: cfg.hidden,
                precision: self.precision,
            },
        )?;
        if let Some(cap) = cfg.final_softcap {
            be.softcap(&s.head.logits, &s.head.capped, m * cfg.vocab, cap)?;
        }
        Ok(())
    }
}

/// The expert slots `requested`, checked against the config: at least
/// top_k, on a model with routed experts; past the expert count, the expert
/// count (every expert gets a slot, filled as it is first used).
fn check_expert_slots(cfg: &ModelConfig, requested: Option<usize>) -> Result<Option<usize>> {
    let Some(n) = requested else {
        return Ok(None);
    };
    if !cfg.enable_moe {
        return Err(Error::InvalidInput(format!(
            "{n} expert slots: the model has no routed experts to stream"
        )));
    }
    if n < cfg.top_k {
        return Err(Error::InvalidInput(format!(
            "{n} expert slots: a token needs its top_k = {} experts at once, so at least {}",
            cfg.top_k, cfg.top_k
        )));
    }
    Ok(Some(n.min(cfg.experts)))
}

/// Tokens per pass of [`Model::logits`] (rows of the batch scratch's logits):
/// [`LOGITS_BATCH`], or the whole batch where that is smaller.
fn head_batch(prefill_batch: usize) -> usize {
    LOGITS_BATCH.min(prefill_batch)
}

/// The widest activation a prefill batch keeps, `(f32 per token, name)`:
/// each batch buffer is one binding, so a batch of `rows` tokens must fit the
/// device's largest binding.
fn widest_row(cfg: &ModelConfig) -> (usize, &'static str) {
    let (max_hd, max_qkv) = widest_layer(cfg);
    let (k, mi) = if cfg.enable_moe {
        (cfg.top_k, cfg.moe_inter)
    } else {
        (1, 1)
    };
    [
        (cfg.hidden, "hidden"),
        (max_qkv, "q|k|v"),
        (cfg.heads * max_hd, "attention output"),
        (2 * cfg.intermediate, "dense gate|up"),
        (k * mi, "expert activations"),
    ]
    .into_iter()
    .max_by_key(|w| w.0)
    .unwrap_or((0, "hidden"))
}

/// A clear error when `prefill_batch` tokens of the widest activation
/// would not fit one binding of `max_binding` bytes.
fn check_batch_fits(cfg: &ModelConfig, prefill_batch: usize, max_binding: u64) -> Result<()> {
    let (width, name) = widest_row(cfg);
    let bytes = (prefill_batch * width * 4) as u64;
    if bytes > max_binding {
        let fits = max_binding / (width.max(1) as u64 * 4);
        return Err(Error::InvalidInput(format!(
            "prefill_batch {prefill_batch} needs a {bytes}-byte {name} buffer, over the \
             device's largest binding of {max_binding} bytes (at most {fits} tokens fit)"
        )));
    }
    Ok(())
}

/// Refuses KV caches and scratch ([`runtime_bytes`]) the backend cannot
/// hold: a cache buffer past its largest buffer or binding, caches past
/// what one allocation can address, or, where buffers are host memory (the
/// CPU reference, a software GPU), more than the machine has free.
fn check_runtime_fits(
    info: &crate::backend::BackendInfo,
    cfg: &ModelConfig,
    (max_context, prefill_batch, kv_cache): (usize, usize, DType),
) -> Result<()> {
    let what = |s: &str| {
        format!(
            "{s} at max_context {max_context} ({kv_cache} KV caches, \
             prefill_batch {prefill_batch})"
        )
    };
    let limit = |bytes: u128, limit: u64, what: String, limit_name: &'static str| {
        if bytes > limit as u128 {
            Err(Error::DeviceLimit {
                what,
                bytes: u64::try_from(bytes).unwrap_or(u64::MAX),
                limit,
                limit_name,
            })
        } else {
            Ok(())
        }
    };
    // (in u128: a huge context times a config at its bounds overflows u64)
    let cache = |l: &crate::model::config::LayerSpec| {
        let slots = cache_capacity(cfg, l.kind, max_context, prefill_batch);
        l.kv_heads as u128 * l.head_dim as u128 * slots as u128 * kv_cache.size() as u128
    };
    let largest = cfg.layers.iter().map(cache).max().unwrap_or(0);
    let l = &info.limits;
    let (per_buffer, name) = if l.max_binding_bytes <= l.max_buffer_bytes {
        (l.max_binding_bytes, "the backend's largest binding")
    } else {
        (l.max_buffer_bytes, "the backend's largest buffer")
    };
    limit(largest, per_buffer, what("a KV cache buffer"), name)?;
    let caches: u128 = cfg.layers.iter().map(|l| 2 * cache(l)).sum();
    limit(
        caches,
        isize::MAX as u64,
        what("the KV caches"),
        "isize::MAX, what one allocation can address",
    )?;
    // (caches within isize::MAX: runtime_bytes cannot overflow)
    let total = runtime_bytes(cfg, max_context, prefill_batch, kv_cache);
    if matches!(
        info.device_type,
        crate::backend::DeviceType::Cpu | crate::backend::DeviceType::SoftwareGpu
    ) {
        if let Some(free) = host_memory_free() {
            limit(
                total as u128,
                free,
                what("the KV caches and scratch"),
                "MemAvailable + SwapFree of /proc/meminfo",
            )?;
        }
    }
    Ok(())
}

/// Bytes the machine can still give (`MemAvailable` + `SwapFree`), where
/// /proc/meminfo is readable.
fn host_memory_free() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib = |name: &str| {
        text.lines().find_map(|line| {
            let v = line.strip_prefix(name)?.strip_prefix(':')?;
            v.trim().strip_suffix("kB")?.trim().parse::<u64>().ok()
        })
    };
    let free = kib("MemAvailable")?.saturating_add(kib("SwapFree").unwrap_or(0));
    Some(free.saturating_mul(1024))
}

/// KV cache slots of a layer (see [`Model::load`] for why sliding layers
/// get `prefill_batch - 1` extra).
pub fn cache_capacity(
    cfg: &ModelConfig,
    kind: LayerKind,
    max_context: usize,
    prefill_batch: usize,
) -> usize {
    match kind {
        LayerKind::Full => max_context,
        LayerKind::Sliding => (cfg.sliding_window + prefill_batch - 1).min(max_context),
    }
}

/// Device bytes a run needs beyond the weights: KV caches (of `kv_cache`),
/// both scratches ([`scratch_bytes`]), and the per-pair rows a GPU's MoE
/// down phase keeps in its own scratch.
pub fn runtime_bytes(
    cfg: &ModelConfig,
    max_context: usize,
    prefill_batch: usize,
    kv_cache: DType,
) -> u64 {
    let prefill_batch = prefill_batch.min(max_context);
    let kv: usize = cfg
        .layers
        .iter()
        .map(|l| {
            2 * l.kv_heads * l.head_dim * cache_capacity(cfg, l.kind, max_context, prefill_batch)
        })
        .sum();
    let scratch =
        scratch_bytes(cfg, 1, 1) + scratch_bytes(cfg, prefill_batch, head_batch(prefill_batch));
    let moe_pairs = cfg.top_k * cfg.hidden * 4 * (1 + prefill_batch);
    (kv * kv_cache.size() + moe_pairs) as u64 + scratch
}

#[cfg(all(test, feature = "tools"))]
mod tests {
    use super::*;
    use crate::model::synthetic::{named_config, tiny_config};

    #[test]
    fn a_batch_over_the_largest_binding_is_named() {
        let cfg = named_config("gemma-4-26b-a4b").unwrap();
        let (width, name) = widest_row(&cfg);
        // Full layers' q|k: 16 x 512 + 2 x 512 rows.
        assert_eq!((width, name), (9216, "q|k|v"));
        // 128 MiB (lavapipe, WebGPU's default): 512 tokens fit, 4096 do not.
        let limit = 128 << 20;
        assert!(check_batch_fits(&cfg, 512, limit).is_ok());
        let e = check_batch_fits(&cfg, 4096, limit).unwrap_err().to_string();
        assert!(
            e.contains("prefill_batch 4096") && e.contains("at most 3640 tokens fit"),
            "{e}"
        );
        assert!(check_batch_fits(&tiny_config(), MAX_PREFILL_BATCH, limit).is_ok());
    }

    #[test]
    fn runtime_bytes_counts_a_batch_of_at_most_the_context() {
        let cfg = tiny_config();
        let f32s = |ctx, batch| runtime_bytes(&cfg, ctx, batch, DType::F32);
        assert_eq!(f32s(64, 512), f32s(64, 64));
        assert!(f32s(64, 32) < f32s(64, 64));
        // f16 caches: the caches' half less
        let caches: usize = cfg
            .layers
            .iter()
            .map(|l| 2 * l.kv_heads * l.head_dim * cache_capacity(&cfg, l.kind, 64, 64))
            .sum();
        assert_eq!(
            f32s(64, 64) - runtime_bytes(&cfg, 64, 64, DType::F16),
            2 * caches as u64
        );
    }
}
