//! The Gemma 4 MoE model, written once against [`crate::ComputeBackend`].
//!
//! - [`config`]: the model's shape, parsed from `config.json`;
//! - [`checkpoint`]: the memory-mapped safetensors checkpoint, checked against
//!   the tensors the config implies ([`expected_tensors`]);
//! - [`weights`]: where weights come from and how they are uploaded, once
//!   at open;
//! - [`experts`]: the routed experts: stored, streamed through slots,
//!   routing traces;
//! - [`decoder`]: the model shared by its sequences ([`Sequence`]: one
//!   conversation's caches and position), its layers as attention and
//!   feed-forward blocks; prefill, decode and logits on any backend;
//! - [`drafter`]: Gemma 4's drafter and speculative decoding with it;
//! - [`sampling`]: greedy / temperature / top-k / top-p on the host;
//! - [`synthetic`]: seeded random weights for any config (tests, benchmarks).

pub mod checkpoint;
pub mod config;
pub mod decoder;
pub mod drafter;
pub mod experts;
mod json;
pub mod layer_state;
mod mlx_layout;
#[cfg(feature = "tools")]
pub mod mlx_writer;
pub mod quantization;
pub mod sampling;
pub(crate) mod scratch;
mod shard;
#[cfg(feature = "tools")]
pub mod synthetic;
mod tensor_ref;
mod tensors;
pub mod weights;

pub use checkpoint::Checkpoint;
pub use config::{LayerKind, LayerSpec, ModelConfig};
pub use decoder::{
    BatchAhead, GenerateOptions, Generation, Model, ModelOptions, OneSequence, Sequence,
    DEFAULT_PREFILL_BATCH, LOGITS_BATCH, MAX_PREFILL_BATCH,
};
pub use layer_state::LayerHostState;
pub use sampling::Sampling;
#[cfg(feature = "tools")]
pub use synthetic::SyntheticSource;
pub use tensor_ref::TensorRef;
pub use tensors::expected_tensors;
pub use weights::TensorSource;
