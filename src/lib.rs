//! turbospark: Mixture-of-Experts language models (Gemma 4 first) on any GPU
//! through wgpu, with a CPU reference backend every kernel is checked against.
//!
//! This crate holds the backend seam ([`ComputeBackend`]), the op parameters
//! and their shape checks ([`ops`]), dtypes and errors, the parity harness
//! ([`parity`]) and the model code, written once against the trait.

pub mod backend;
mod device_buffer;
pub mod dtype;
pub mod error;
pub mod kernels;
pub mod model;
pub mod ops;
pub mod parity;
pub mod precision;
pub mod quant;
pub mod rng;

pub use backend::{
    BackendInfo, ComputeBackend, DeviceBuffer, DeviceType, ExpertBytes, ExpertStack, GemmRounding,
    HostBytes, ReadTicket, SlotWrite, Support,
};
pub use dtype::DType;
pub use error::{Error, Result};
pub use ops::{DownArgs, GateUpArgs, PostAttentionArgs, PostFfnArgs, RouterArgs, SlotArgs};
pub use precision::Precision;
