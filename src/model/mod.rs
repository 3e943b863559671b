//! The Gemma 4 MoE model, written once against [`crate::ComputeBackend`].
//!
//! - [`config`]: the model's shape, parsed from `config.json`;
//! - [`checkpoint`]: safetensors weights by name;
//! - [`weights`]: per-layer device state built once at open;
//! - [`decoder`]: prefill, decode and logits on any backend;
//! - [`sampling`]: greedy / temperature / top-k / top-p on the host;
//! - [`synthetic`]: seeded random weights for any config (tests, benchmarks).

// Interim copies of the loader's modules so this branch builds on its own; the
// loader branch's `config.rs` / `checkpoint.rs` replace them at merge (drop the
// `#[path]` lines and the `interim_*` files).
#[path = "interim_checkpoint.rs"]
pub mod checkpoint;
#[path = "interim_config.rs"]
pub mod config;

pub mod decoder;
pub mod sampling;
pub mod synthetic;
pub mod weights;

pub use checkpoint::{Checkpoint, TensorRef};
pub use config::{LayerKind, LayerSpec, ModelConfig};
pub use decoder::{GenerateOptions, Generation, Model, ModelOptions, MAX_PREFILL_BATCH};
pub use sampling::Sampling;
pub use synthetic::SyntheticSource;
pub use weights::TensorSource;
