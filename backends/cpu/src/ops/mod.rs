//! Reference ops on plain slices, one function per op, each named after its
//! WGSL twin in `kernels/`. f32 accumulation throughout.

mod attention;
mod elementwise;
mod fused;
mod matmul;
mod moe;
mod norm;

pub use attention::{attention, kv_append, rope};
pub use elementwise::{add, argmax, embed, gelu_mul, scale, softcap};
pub use fused::{post_attention, post_ffn, qkv_post};
pub use matmul::matmul;
pub use moe::{moe_down, moe_gate_up, router};
pub use norm::rms_norm;

use turbospark::dtype::decode_f32;
use turbospark::DType;

/// A read-only view of a weight tensor in its stored dtype.
pub struct Weights<'a> {
    pub dtype: DType,
    pub bytes: &'a [u8],
}

impl<'a> Weights<'a> {
    pub fn new(dtype: DType, bytes: &'a [u8]) -> Self {
        Weights { dtype, bytes }
    }

    #[inline]
    pub fn get(&self, i: usize) -> f32 {
        decode_f32(self.dtype, self.bytes, i)
    }

    /// Decode `out.len()` elements starting at element `start`.
    pub fn decode_into(&self, start: usize, out: &mut [f32]) {
        let s = self.dtype.size();
        let src = &self.bytes[start * s..(start + out.len()) * s];
        match self.dtype {
            DType::BF16 => {
                for (o, c) in out.iter_mut().zip(src.chunks_exact(2)) {
                    *o = f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16);
                }
            }
            DType::F16 => {
                for (o, c) in out.iter_mut().zip(src.chunks_exact(2)) {
                    *o = half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
                }
            }
            DType::F32 | DType::U32 => {
                for (i, o) in out.iter_mut().enumerate() {
                    *o = decode_f32(self.dtype, src, i);
                }
            }
        }
    }
}

/// Dot product with f32 accumulation.
#[inline]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}
