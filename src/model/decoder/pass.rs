//! What every block of one forward pass shares: the backend, the pass's
//! token count and the settings its ops take.

use crate::backend::ComputeBackend;
use crate::ops::{PostAttention, RmsNorm};
use crate::Precision;

/// One forward pass of `m` tokens on `be`.
pub(super) struct Pass<'a, B: ComputeBackend> {
    pub be: &'a B,
    /// Tokens of the pass (rows of every activation).
    pub m: usize,
    pub hidden: usize,
    pub eps: f32,
    /// The tensor-core products' arithmetic, the model's.
    pub precision: Precision,
}

impl<B: ComputeBackend> Pass<'_, B> {
    /// An rms_norm over the pass's rows of `dim` elements.
    pub fn norm(&self, dim: usize) -> RmsNorm {
        RmsNorm {
            rows: self.m,
            dim,
            eps: self.eps,
            scale: 1.0,
        }
    }

    /// `r = x + post_attention_layernorm(o)` over the pass's rows.
    pub fn post_attention(&self) -> PostAttention {
        PostAttention {
            rows: self.m,
            dim: self.hidden,
            eps: self.eps,
        }
    }
}
