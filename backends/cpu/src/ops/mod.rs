//! Reference ops on plain slices, one function per op, each named after its
//! WGSL twin in `kernels/`. f32 accumulation throughout.

mod attention;
mod elementwise;
mod fused;
mod matmul;
mod moe;
mod norm;

pub use attention::{attention, kv_append, rope, CacheElem};
pub use elementwise::{add, argmax, embed, gelu_mul, scale, softcap};
pub use fused::{post_attention, post_ffn, qkv_post};
pub use matmul::matmul;
pub use moe::{moe_down, moe_gate_up, router};
pub use norm::rms_norm;

use std::borrow::Cow;

use turbospark::dtype::decode_f32;
use turbospark::DType;

/// A read-only view of a weight tensor in its stored dtype.
pub struct Weights<'a> {
    pub dtype: DType,
    pub bytes: &'a [u8],
    /// Each value rounded to f16 as it is decoded (a tensor-core GEMM's
    /// view of the weight, `turbospark::GemmRounding`).
    pub f16: bool,
    /// Each value as the two f16 parts that sum to it ([`split_half`]): a
    /// quantized weight on the tensor cores at `Precision::Exact`
    /// (kernels/gemm_coop.wgsl's WSPLIT).
    pub split: bool,
    /// Elements held (a quantized weight's layout depends on it).
    len: usize,
}

impl<'a> Weights<'a> {
    pub fn new(dtype: DType, bytes: &'a [u8]) -> Self {
        Weights {
            dtype,
            bytes,
            f16: false,
            split: false,
            len: dtype.elements_in(bytes.len()).unwrap_or(0),
        }
    }

    /// The same weight, rounded to f16 as decoded when `on`.
    pub fn rounded_to_f16(self, on: bool) -> Self {
        Weights {
            f16: on,
            split: false,
            ..self
        }
    }

    /// The same weight as a tensor-core GEMM whose activations reach it
    /// rounded by `r` takes it: each value one f16, but a quantized one
    /// (not exact in one f16) split in two where `r` splits the
    /// activations too.
    pub fn rounded_as(self, r: Rounding) -> Self {
        let split = r == Rounding::Split && self.dtype.is_quantized();
        Weights {
            f16: r.rounds() && !split,
            split,
            ..self
        }
    }

    /// Whether every value is within f16's range (finite, |w| <= 65504):
    /// the check the GPU makes at upload before it lets a weight reach the
    /// tensor cores.
    pub fn fits_f16(&self) -> bool {
        (0..self.len()).all(|i| self.stored(i).abs() <= 65504.0)
    }

    /// Elements held.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` as stored, decoded (a quantized one dequantised).
    #[inline]
    fn stored(&self, i: usize) -> f32 {
        match self.dtype {
            DType::Affine(a) => a.get(self.bytes, self.len, i),
            d => decode_f32(d, self.bytes, i),
        }
    }

    #[inline]
    pub fn get(&self, i: usize) -> f32 {
        if self.split {
            return split_half(self.stored(i));
        }
        to_f16_if(self.stored(i), self.f16)
    }

    /// Decode `out.len()` elements starting at element `start`.
    pub fn decode_into(&self, start: usize, out: &mut [f32]) {
        self.decode_stored(start, out);
        if self.f16 {
            for o in out.iter_mut() {
                *o = to_f16_if(*o, true);
            }
        }
        if self.split {
            for o in out.iter_mut() {
                *o = split_half(*o);
            }
        }
    }

    fn decode_stored(&self, start: usize, out: &mut [f32]) {
        if let DType::Affine(a) = self.dtype {
            for (k, o) in out.iter_mut().enumerate() {
                *o = a.get(self.bytes, self.len, start + k);
            }
            return;
        }
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
            DType::F32 | DType::U32 | DType::Affine(_) => {
                for (i, o) in out.iter_mut().enumerate() {
                    *o = decode_f32(self.dtype, src, i);
                }
            }
        }
    }
}

#[inline]
pub(crate) fn to_f16_if(v: f32, on: bool) -> f32 {
    if on {
        half::f16::from_f32(v).to_f32()
    } else {
        v
    }
}

/// How an activation reaches the matrix units (`turbospark::GemmRounding`,
/// `turbospark::Precision`): as it is (f32 arithmetic), rounded once to
/// f16, or split into two f16 parts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rounding {
    F32,
    /// One f16 rounding (`Precision::Fast`).
    Half,
    /// `hi + lo` ([`split_half`], `Precision::Exact`).
    Split,
}

impl Rounding {
    /// `v` as this rounding leaves it (before any row scale is taken off).
    #[inline]
    pub fn apply(self, v: f32) -> f32 {
        match self {
            Rounding::F32 => v,
            Rounding::Half => to_f16_if(v, true),
            Rounding::Split => split_half(v),
        }
    }

    pub fn rounds(self) -> bool {
        self != Rounding::F32
    }
}

/// `v` as the two f16 parts a split product takes it, summed: `hi` = `v`
/// rounded to f16, `lo` = the rest (`v - hi`, exact in f32) rounded to
/// f16, both to nearest even with f16's subnormals kept
/// (kernels/f16_round.wgsl's half_grid computes the same values). `hi + lo`
/// is exact in f32 and within 2^-22 |v| of `v` (|v - hi| <= 2^-11 |v|,
/// then |rest - lo| <= 2^-11 |rest|), or within 2^-25 absolute where `lo`
/// is subnormal: 2^-39 of the largest |x| of a row at the GEMM's scale.
#[inline]
pub fn split_half(v: f32) -> f32 {
    let hi = to_f16_if(v, true);
    if !hi.is_finite() {
        return hi;
    }
    hi + to_f16_if(v - hi, true)
}

/// x's rows of `k` as a tensor-core GEMM sees them under `r`
/// (`turbospark::GemmRounding`, kernels/gemm_prep.wgsl): each row scaled by
/// the power of two that puts its largest |x| in [2^14, 2^15), rounded
/// (once, or split in two parts) and scaled back (both scalings exact);
/// x itself for [`Rounding::F32`].
pub fn f16_rows(x: &[f32], k: usize, r: Rounding) -> Cow<'_, [f32]> {
    if !r.rounds() {
        return Cow::Borrowed(x);
    }
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(k) {
        let (s, inv) = turbospark::dtype::f16_row_scale(row);
        out.extend(row.iter().map(|v| r.apply(v * s) * inv));
    }
    Cow::Owned(out)
}

/// Dot product with f32 accumulation.
#[inline]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use turbospark::dtype::encode_f32;

    /// Each row keeps 11 significant bits after its own power-of-two scale
    /// (a value within the row's range rounds to nearest at that precision),
    /// values exact in f16 stay exact, and nothing changes when off.
    #[test]
    fn f16_rows_round_each_row_at_its_own_scale() {
        let x = [
            3.0f32,
            1.0 + 2f32.powi(-12),
            -7.5,
            1e-3,
            // a second row, 2^20 larger: the same relative rounding
            3.0 * 2f32.powi(20),
            (1.0 + 2f32.powi(-12)) * 2f32.powi(20),
            -7.5 * 2f32.powi(20),
            1e-3 * 2f32.powi(20),
        ];
        let r = f16_rows(&x, 4, Rounding::Half);
        assert_eq!(r[0], 3.0);
        assert_eq!(r[1], 1.0, "2^-12 above 1 is half an ulp: to even");
        assert_eq!(r[2], -7.5);
        assert!((r[3] - 1e-3).abs() <= 1e-3 * 2f32.powi(-11));
        assert_ne!(r[3], 1e-3, "1e-3 is not an f16");
        for i in 0..4 {
            assert_eq!(r[4 + i], r[i] * 2f32.powi(20), "row 2, element {i}");
        }
        assert!(matches!(f16_rows(&x, 4, Rounding::F32), Cow::Borrowed(_)));
    }

    /// A split keeps 22 or more significant bits: within 2^-22 of each
    /// value at the GEMM's scale (2^-25 absolute where its low part is
    /// subnormal), exact for values of 22 bits, inf / NaN unchanged.
    #[test]
    fn split_rows_keep_twice_the_bits() {
        let mut rng = turbospark::rng::Rng::new(11);
        let x = rng.vec_normal(4096, 3.0);
        let (s, inv) = turbospark::dtype::f16_row_scale(&x);
        assert_eq!(inv * s, 1.0);
        let r = f16_rows(&x, 4096, Rounding::Split);
        let mut worst = 0f64;
        for (a, b) in r.iter().zip(&x) {
            let err = ((a - b) * s).abs() as f64;
            assert!(err <= (2f64.powi(-22) * (b * s).abs() as f64).max(2f64.powi(-25)));
            worst = worst.max(err / (b * s).abs() as f64);
        }
        assert!(worst > 0.0, "f32 normals with 24 bits do not all fit 22");
        // 22 significant bits survive whole; at the GEMM's scale a rest
        // of 12 bits rounds (7 + 2^-9: a tie, to even)
        let v = 1.0 + 2f32.powi(-21);
        assert_eq!(split_half(v), v);
        assert_eq!(split_half(16384.0 + 7.0 + 2f32.powi(-9)), 16391.0);
        // a subnormal low part is kept to f16's grid (2^-24)
        assert_eq!(split_half(1.0 + 2f32.powi(-20)), 1.0 + 2f32.powi(-20));
        assert_eq!(split_half(1.0 + 2f32.powi(-26)), 1.0);
        assert!(split_half(f32::NAN).is_nan());
        assert_eq!(split_half(f32::INFINITY), f32::INFINITY);
    }

    /// bf16 weights keep their value in f16's normal range; below it the
    /// absolute error stays under 2^-25; past 65504 a weight does not fit.
    #[test]
    fn weights_round_to_f16_as_decoded() {
        let tiny = 2f32.powi(-20) * (1.0 + 2f32.powi(-7));
        let vals = [1.0 + 2f32.powi(-7), -304.0, tiny, 65280.0];
        let bytes = encode_f32(DType::BF16, &vals);
        let w = Weights::new(DType::BF16, &bytes);
        assert!(w.fits_f16());
        let w = w.rounded_to_f16(true);
        let mut out = [0f32; 4];
        w.decode_into(0, &mut out);
        assert_eq!(&out[..2], &vals[..2]);
        assert_eq!(out[3], 65280.0, "the largest bf16 within f16's range");
        assert!(out[2] != tiny && (out[2] - tiny).abs() < 2f32.powi(-25));
        assert_eq!(w.get(2), out[2]);
        let big = encode_f32(DType::BF16, &[1.0, 65536.0]);
        assert!(!Weights::new(DType::BF16, &big).fits_f16());
    }
}
