//! Element types of device buffers.

use std::fmt;

/// Element type of a buffer. Activations are `F32`; weights may be stored as
/// `BF16`, `F16` or `F32` and are decoded to f32 inside the kernels, or
/// quantized ([`DType::Affine`], dequantised the same way); `U32` holds
/// token ids, positions and expert ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
    U32,
    /// A quantized weight ([`crate::quant`]): one buffer holding the packed
    /// values, the scales and the biases; its `len` counts the matrix's
    /// elements.
    Affine(Affine),
}

impl DType {
    /// Bytes per element of a plain dtype; a quantized one has no whole
    /// number (see [`DType::bytes_for`]) and answers 0.
    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::U32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Affine(_) => 0,
        }
    }

    /// Bytes a buffer of `len` elements takes.
    pub fn bytes_for(self, len: usize) -> usize {
        match self {
            DType::Affine(a) => a.layout(len).bytes,
            d => len * d.size(),
        }
    }

    /// Elements in `nbytes` of this dtype, when whole: the inverse of
    /// [`DType::bytes_for`].
    pub fn elements_in(self, nbytes: usize) -> Option<usize> {
        match self {
            DType::Affine(a) => {
                let g = a.group as usize;
                // Bytes a group takes, without the parts' padding (at most
                // 6 bytes in all, less than any group's share).
                let per = g * a.bits as usize / 8 + 2 * a.scales.size();
                let len = nbytes / per * g;
                (a.layout(len).bytes == nbytes).then_some(len)
            }
            d => (nbytes % d.size() == 0).then(|| nbytes / d.size()),
        }
    }

    /// Whether this is one of the floating-point weight formats (plain or
    /// quantized).
    pub fn is_float(self) -> bool {
        !matches!(self, DType::U32)
    }

    /// Whether this is a quantized weight format.
    pub fn is_quantized(self) -> bool {
        matches!(self, DType::Affine(_))
    }

    /// Lower-case name, as used in parity case names (`w=bf16`, `w=q4g64`).
    pub fn name(self) -> String {
        match self {
            DType::F32 => "f32".into(),
            DType::F16 => "f16".into(),
            DType::BF16 => "bf16".into(),
            DType::U32 => "u32".into(),
            DType::Affine(a) => a.name(),
        }
    }

    /// The safetensors spelling of this dtype.
    pub fn from_safetensors(d: safetensors::Dtype) -> Option<DType> {
        match d {
            safetensors::Dtype::F32 => Some(DType::F32),
            safetensors::Dtype::F16 => Some(DType::F16),
            safetensors::Dtype::BF16 => Some(DType::BF16),
            safetensors::Dtype::U32 => Some(DType::U32),
            _ => None,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// Decode element `i` of a little-endian buffer of plain dtype `dtype` to
/// f32. The one place the host decodes plain weights; kernels mirror it in
/// WGSL. A quantized buffer is decoded by [`Affine::get`], which needs the
/// buffer's length; here it is an error of the caller's and decodes as NaN.
#[inline]
pub fn decode_f32(dtype: DType, bytes: &[u8], i: usize) -> f32 {
    match dtype {
        DType::Affine(_) => f32::NAN,
        DType::F32 => f32::from_le_bytes([
            bytes[4 * i],
            bytes[4 * i + 1],
            bytes[4 * i + 2],
            bytes[4 * i + 3],
        ]),
        // A bf16 is the high half of an f32: the decode is exact.
        DType::BF16 => {
            f32::from_bits((u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]) as u32) << 16)
        }
        DType::F16 => {
            half::f16::from_bits(u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]])).to_f32()
        }
        DType::U32 => u32::from_le_bytes([
            bytes[4 * i],
            bytes[4 * i + 1],
            bytes[4 * i + 2],
            bytes[4 * i + 3],
        ]) as f32,
    }
}

/// Encode f32 values into plain `dtype` bytes (round to nearest even for
/// bf16/f16); a quantized dtype is written by [`crate::quant`] and gives
/// nothing here.
pub fn encode_f32(dtype: DType, values: &[f32]) -> Vec<u8> {
    match dtype {
        DType::Affine(_) => Vec::new(),
        DType::F32 => bytemuck::cast_slice(values).to_vec(),
        DType::BF16 => values
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_bits().to_le_bytes())
            .collect(),
        DType::F16 => values
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_bits().to_le_bytes())
            .collect(),
        DType::U32 => values
            .iter()
            .flat_map(|&v| (v as u32).to_le_bytes())
            .collect(),
    }
}

/// Round an f32 to the nearest value representable in `dtype`.
pub fn round_to(dtype: DType, v: f32) -> f32 {
    match dtype {
        DType::BF16 => half::bf16::from_f32(v).to_f32(),
        DType::F16 => half::f16::from_f32(v).to_f32(),
        _ => v,
    }
}

/// The power-of-two scale a row of x takes before it is rounded to f16 for
/// a tensor-core GEMM (`GemmRounding`; kernels/gemm_prep.wgsl computes the
/// same): `(s, 1 / s)` with `s` putting the row's largest |x| in
/// [2^14, 2^15), so no element overflows and each keeps 11 significant
/// bits. Both are exact powers of two (the exponent is held at -112 or
/// above so they stay normal f32); an inf or NaN row gets an extreme scale
/// and stays inf or NaN.
pub fn f16_row_scale(row: &[f32]) -> (f32, f32) {
    let amax = row.iter().fold(0f32, |a, v| a.max(v.abs()));
    // amax in [2^e, 2^(e + 1))
    let e = (((amax.to_bits() >> 23) & 0xff) as i32 - 127).max(-112);
    let s = f32::from_bits(((127 + 14 - e) as u32) << 23);
    let inv = f32::from_bits(((127 - 14 + e) as u32) << 23);
    (s, inv)
}

/// An f32 as an f16 KV cache stores it (kernels/kv_f16.wgsl's `to_cache`
/// computes the same bits): to nearest, ties to even; finite values past
/// f16's largest (65504) held there rather than turned to inf (a cache row
/// with an inf key would make every later score NaN); below f16's smallest
/// normal (2^-14) a signed zero, because devices differ in whether they keep
/// f16 subnormals and the cache must hold the same bits on each. Inf and
/// NaN pass. Gemma 4 caches normed rows (|x| about 1 to 30), where neither
/// edge is reached.
pub fn kv_half(x: f32) -> half::f16 {
    const SIGN: u32 = 0x8000_0000;
    const MIN_NORMAL: u32 = 0x3880_0000; // 2^-14
    const MAX_HALF: u32 = 0x477f_e000; // 65504
    let b = x.to_bits();
    let mag = b & !SIGN;
    if mag >= 0x7f80_0000 {
        return half::f16::from_f32(x);
    }
    if mag < MIN_NORMAL {
        return half::f16::from_f32(f32::from_bits(b & SIGN));
    }
    // Round the low 13 mantissa bits away, to nearest even.
    let r = (b + 0xfff + ((b >> 13) & 1)) & 0xffff_e000;
    let r = if r & !SIGN > MAX_HALF {
        (b & SIGN) | MAX_HALF
    } else {
        r
    };
    half::f16::from_f32(f32::from_bits(r))
}

/// The float type of a quantized weight's scales and biases.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScaleType {
    F32,
    F16,
    BF16,
}

impl ScaleType {
    pub fn dtype(self) -> DType {
        match self {
            ScaleType::F32 => DType::F32,
            ScaleType::F16 => DType::F16,
            ScaleType::BF16 => DType::BF16,
        }
    }

    pub fn from_dtype(d: DType) -> Option<ScaleType> {
        match d {
            DType::F32 => Some(ScaleType::F32),
            DType::F16 => Some(ScaleType::F16),
            DType::BF16 => Some(ScaleType::BF16),
            _ => None,
        }
    }

    pub fn size(self) -> usize {
        match self {
            ScaleType::F32 => 4,
            ScaleType::F16 | ScaleType::BF16 => 2,
        }
    }
}

/// One quantized weight's format: bits per value, values per group, and
/// the type its scales and biases are stored in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Affine {
    pub bits: u8,
    pub group: u16,
    pub scales: ScaleType,
}

#[cfg(test)]
mod kv_half_tests {
    use super::kv_half;

    /// In f16's normal range the rule is round-to-nearest-even, as `half`'s
    /// own conversion; the edges flush and saturate.
    #[test]
    fn kv_half_rounds_to_nearest_and_holds_the_edges() {
        let mut rng = crate::rng::Rng::new(7);
        for _ in 0..100_000 {
            let x = rng.normal(40.0);
            if x.abs() >= 2f32.powi(-14) {
                assert_eq!(kv_half(x), half::f16::from_f32(x), "{x}");
            }
        }
        // ties: 1 + 2^-11 lies halfway between 1 and 1 + 2^-10 (even: 1)
        assert_eq!(kv_half(1.0 + 2f32.powi(-11)).to_f32(), 1.0);
        assert_eq!(
            kv_half(1.0 + 3.0 * 2f32.powi(-11)).to_f32(),
            1.0 + 2.0 * 2f32.powi(-10)
        );
        assert_eq!(kv_half(3.0e-5).to_f32(), 0.0);
        assert!(kv_half(-3.0e-5).is_sign_negative());
        assert_eq!(kv_half(1.0e6).to_f32(), 65504.0);
        assert_eq!(kv_half(-65530.0).to_f32(), -65504.0);
        assert_eq!(kv_half(f32::INFINITY).to_f32(), f32::INFINITY);
        assert!(kv_half(f32::NAN).is_nan());
    }
}
