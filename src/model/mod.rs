//! The Gemma 4 model description: its configuration ([`config`]), the tensors
//! it implies ([`expected_tensors`]) and the memory-mapped checkpoint that
//! supplies them ([`checkpoint`]).

pub mod checkpoint;
pub mod config;
mod json;
pub mod layer_state;
mod shard;
mod tensors;

pub use checkpoint::{Checkpoint, TensorRef};
pub use config::{LayerKind, LayerSpec, ModelConfig};
pub use layer_state::LayerHostState;
pub use tensors::expected_tensors;
