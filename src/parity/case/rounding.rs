//! The NMSE that rounding a product's inputs to f16 adds: the limits of
//! the cases a device runs on tensor cores (`Case::limit_on`).

use crate::backend::ComputeBackend;
use crate::ops::OpKind;

/// NMSE of a dot product whose x was rounded to f16 (11 significant bits,
/// after a per-row power-of-two scale that keeps it in range), against f32:
/// each x_i carries a relative error |d_i| <= 2^-11, so the error
/// sum(w_i x_i d_i) of uncorrelated terms has NMSE at most max d^2 = 2^-22
/// (about a third of that on average, for uniform rounding errors). Weights
/// are exact in f16 (the backend takes only those that fit) but for bf16
/// values below f16's normal range, whose absolute error (2^-25) is far
/// below this.
pub const F16_INPUT_NMSE: f64 = 1.0 / (1u64 << 22) as f64;

/// NMSE of a dot product whose x was split into two f16 parts after the
/// same scale (`Precision::Exact`): `hi = f16(x)` leaves a rest of at most
/// 2^-11 |x|, exact in f32, and `lo = f16(rest)` is within 2^-11 of it, so
/// `hi + lo` carries a relative error |d_i| <= 2^-22 (a subnormal `lo`, at
/// the row's scale 2^-39 of its largest, adds less); the weights are the
/// single f16 values above, and each partial product (`hi w`, `lo w`) is
/// exact in f32. By [`F16_INPUT_NMSE`]'s argument the NMSE is at most
/// 2^-44, far under an f32 GEMM's own limit ([`super::Case::limit`], 1e-9):
/// a split GEMM is held to that limit, as if it were f32.
pub const SPLIT_INPUT_NMSE: f64 = 1.0 / (1u64 << 44) as f64;

/// NMSE of a dot product whose x and w were each rounded once to f16: a
/// quantized weight at `Precision::Fast`, whose dequantised values
/// `scale * q + bias` are not in general exact in f16
/// (kernels/gemm_coop.wgsl). A product carries (1 + d_x)(1 + d_w) with
/// |d_x|, |d_w| <= 2^-11, a relative error of at most 2^-10 + 2^-22, so by
/// [`F16_INPUT_NMSE`]'s argument the NMSE is at most its square (values of
/// w below f16's normal range have an absolute error under 2^-25 instead,
/// as in [`SPLIT_INPUT_NMSE`]).
pub const AFFINE_F16_NMSE: f64 =
    (1.0 / 1024.0 + 1.0 / 4194304.0) * (1.0 / 1024.0 + 1.0 / 4194304.0);

/// NMSE of a dot product whose x and quantized w were each split into two
/// f16 parts (`Precision::Exact`; kernels/gemm_coop.wgsl's WSPLIT), three
/// partial products `x_hi w_hi + x_hi w_lo + x_lo w_hi`, each exact in f32:
/// `x_hi + x_lo` and `w_hi + w_lo` are each within 2^-22 of their value,
/// and the product left out, `x_lo w_lo`, is under 2^-22 of the term, so a
/// term's relative error is under 3 * 2^-22 (and a hair) and the NMSE at
/// most 9 * 2^-44. A `w_lo` below f16's normal range (|w| under about
/// 2^-3) is within 2^-25 absolute instead: over weights of rms `r` that
/// adds about 2^-50 / r^2 (7e-12 at the parity cases' smallest, 1 /
/// sqrt(8192)). Both far under the f32 GEMM's limit ([`super::Case::limit`],
/// 1e-9), which such a GEMM keeps.
pub const AFFINE_SPLIT_NMSE: f64 = 9.0 * SPLIT_INPUT_NMSE;

/// NMSE between two computations of an attention that each round its
/// probabilities to f16 (tensor cores, `turbospark::GemmRounding`) from f32
/// values that differ only by reduction order: a probability whose two f32
/// values (relative difference delta) straddle an f16 rounding boundary, a
/// chance of delta / 2^-11, lands one ulp (2^-11 relative) apart, so the
/// outputs' NMSE is about delta * 2^-11. The scores' f32 sums over up to
/// 512 dims and the exp / sum put delta up to about 2^-16: 2^-27. (The H200
/// measured 2.3e-9 at head_dim 512 with 8 query heads per kv head, over
/// 1e-9, the limit of the same kernel with no rounding.)
pub const F16_PROBABILITY_NMSE: f64 = 1.0 / (1u64 << 27) as f64;

/// Probability roundings ([`F16_PROBABILITY_NMSE`]'s flips) a case too
/// small for their average may show, in units of 2^-22 of NMSE over the
/// case's rows: a flip moves one output row by one f16 step of one term,
/// about 2^-11 of the row (2^-10 at most, more where the row's terms
/// cancel). A case of 80 rows (m = 20, 4 heads, 32 keys) measured on the
/// H200 over 25 seeds (2026-12-01 at ea1d5e7, run 05): no flip (NMSE near
/// 1e-13) or about 4e-9 a flip (2^-22 / 80 is 3e-9), up to 1.16e-8, three
/// flips; three of the 25 over the 2^-27 average. Eight units, 2.4e-8
/// there, hold about six flips of that size.
pub const PROBABILITY_FLIPS: f64 = 8.0;

/// The NMSE limit of a rounded attention over `rows` output rows (tokens x
/// query heads): the average [`F16_PROBABILITY_NMSE`], or
/// [`PROBABILITY_FLIPS`] units of 2^-22 / rows where the rows are few
/// (fewer than 256).
pub fn rounded_attention_nmse(rows: usize) -> f64 {
    let one_flip = 1.0 / (1u64 << 22) as f64 / rows.max(1) as f64;
    F16_PROBABILITY_NMSE.max(PROBABILITY_FLIPS * one_flip)
}

/// Whether `device` runs `kind` over `m` rows of `k` from f16-rounded
/// inputs: at `Precision::Fast` where it rounds them
/// ([`ComputeBackend::rounds_gemm_inputs`]).
pub(super) fn rounds<B: ComputeBackend + ?Sized>(
    device: &B,
    precision: crate::Precision,
    kind: &OpKind,
    (m, k): (usize, usize),
) -> bool {
    precision == crate::Precision::Fast && device.rounds_gemm_inputs(kind, m, k)
}

/// The NMSE of one product from f16-rounded inputs (`Precision::Fast`) over
/// a weight of dtype `w`: x's rounding alone, or with a quantized weight's
/// own ([`AFFINE_F16_NMSE`]).
pub(super) fn rounded_nmse(w: crate::DType) -> f64 {
    if w.is_quantized() {
        AFFINE_F16_NMSE
    } else {
        F16_INPUT_NMSE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The quantized weights' rounding limits: a single rounding of both
    /// operands above x's alone, the split's under the f32 GEMM's limit.
    #[test]
    fn affine_limits_follow_their_roundings() {
        const {
            assert!(AFFINE_F16_NMSE > 4.0 * F16_INPUT_NMSE);
            assert!(AFFINE_F16_NMSE < 4.01 * F16_INPUT_NMSE);
        }
        let subnormal_lo = 2f64.powi(-50) * 8192.0;
        assert!(AFFINE_SPLIT_NMSE + subnormal_lo < 1e-10);
    }

    /// A few rows' rounded attention allows a few flips; many rows hold the
    /// average.
    #[test]
    fn rounded_attention_limit_covers_a_few_flips_in_small_cases() {
        // the H200's worst over 25 seeds of an 80-row case
        assert!(rounded_attention_nmse(80) > 1.164e-8);
        assert!(rounded_attention_nmse(80) < 1e-7);
        assert_eq!(rounded_attention_nmse(512 * 16), F16_PROBABILITY_NMSE);
    }
}
