//! A model paired with one sequence of its own: what a program with one
//! conversation at a time holds (the CLI's `generate`, `chat` and `logits`,
//! the benchmarks). Every call goes through [`Model`]'s sequence API.

use std::ops::ControlFlow;

use super::{GenerateOptions, Generation, Model, ModelOptions, Sequence};
use crate::backend::ComputeBackend;
use crate::error::Result;
use crate::model::config::ModelConfig;
use crate::model::experts::streaming::StreamStats;
use crate::model::experts::trace::Trace;
use crate::model::weights::TensorSource;

/// A [`Model`] and one [`Sequence`] on it.
pub struct OneSequence<B: ComputeBackend> {
    model: Model<B>,
    seq: Sequence<B>,
}

impl<B: ComputeBackend> OneSequence<B> {
    /// [`Model::load`], and a sequence on it.
    pub fn load(backend: B, source: &dyn TensorSource, opts: ModelOptions) -> Result<Self> {
        Self::new(Model::load(backend, source, opts)?)
    }

    /// `model` with a new sequence of its own.
    pub fn new(model: Model<B>) -> Result<Self> {
        let seq = model.new_sequence()?;
        Ok(OneSequence { model, seq })
    }

    pub fn model(&self) -> &Model<B> {
        &self.model
    }

    pub fn sequence(&self) -> &Sequence<B> {
        &self.seq
    }

    /// The model and its sequence, for the sequence API's other calls.
    pub fn parts(&mut self) -> (&Model<B>, &mut Sequence<B>) {
        (&self.model, &mut self.seq)
    }

    /// [`Model::generate`] on the sequence.
    pub fn generate(&mut self, prompt: &[u32], opts: &GenerateOptions) -> Result<Generation> {
        self.model.generate(&mut self.seq, prompt, opts)
    }

    /// [`Model::generate_streaming`] on the sequence.
    pub fn generate_streaming(
        &mut self,
        prompt: &[u32],
        opts: &GenerateOptions,
        on_token: impl FnMut(u32) -> ControlFlow<()>,
    ) -> Result<Generation> {
        self.model
            .generate_streaming(&mut self.seq, prompt, opts, on_token)
    }

    /// [`Model::logits`] on the sequence.
    pub fn logits(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        self.model.logits(&mut self.seq, tokens)
    }

    /// Forget the context: the next call starts at position 0.
    pub fn reset(&mut self) {
        self.seq.clear()
    }

    /// Tokens in the context.
    pub fn position(&self) -> usize {
        self.seq.position()
    }

    pub fn max_context(&self) -> usize {
        self.model.max_context()
    }

    pub fn config(&self) -> &ModelConfig {
        self.model.config()
    }

    pub fn backend(&self) -> &B {
        self.model.backend()
    }

    /// The backend back, the model's and the sequence's buffers released.
    pub fn into_backend(self) -> B {
        drop(self.seq);
        self.model.into_backend()
    }

    /// [`Model::set_precision`].
    pub fn set_precision(&mut self, precision: crate::Precision) {
        self.model.set_precision(precision)
    }

    /// [`Sequence::record_routing`].
    pub fn record_routing(&mut self, on: bool) {
        self.seq.record_routing(on)
    }

    /// [`Sequence::take_routing`].
    pub fn take_routing(&mut self) -> Option<Trace> {
        self.seq.take_routing()
    }

    /// The streamed experts' counters since the last call (None when the
    /// experts are resident), which start again from zero.
    pub fn take_stream_stats(&mut self) -> Option<StreamStats> {
        self.model.expert_slots()?;
        Some(self.seq.take_stream_stats())
    }

    /// Expert slots per layer, when the experts are streamed.
    pub fn expert_slots(&self) -> Option<usize> {
        self.model.expert_slots()
    }

    /// Whether the batched-prefill scratch has been allocated.
    pub fn has_batch_scratch(&self) -> bool {
        self.model.has_batch_scratch()
    }
}
