//! MLX's affine quantisation (mlx `quantize` with `mode="affine"`), the
//! format of mlx-community's quantized checkpoints (docs/mlx-quantization.md).
//!
//! A quantized `[rows, cols]` matrix keeps, per group of `group` consecutive
//! elements of a row, a scale and a bias: `w = scale * q + bias` with `q`
//! an unsigned `bits`-bit integer. The values are packed least significant
//! bits first into a stream of little-endian u32 words (4-bit: eight a word,
//! element 0 in bits 0-3; 3-, 5- and 6-bit values run across word edges as
//! mlx packs them into 3- or 5-byte units, which is the same stream).
//!
//! On a device a quantized weight is ONE buffer of dtype
//! [`DType::Affine`](crate::DType::Affine) whose `len` is the matrix's
//! element count, laid out as [`Affine::layout`] says: the packed words,
//! then the scales, then the biases, each part padded to a whole word, so
//! every op that reads a weight takes a quantized one unchanged in shape.

use crate::dtype::decode_f32;
pub use crate::dtype::{Affine, ScaleType};
use crate::error::{Error, Result};

/// The bit widths mlx quantizes to.
pub const BITS: [u8; 6] = [2, 3, 4, 5, 6, 8];
/// The group sizes mlx quantizes with.
pub const GROUPS: [u16; 3] = [32, 64, 128];

/// Byte offsets of a quantized buffer's parts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Packed words: `len * bits / 32` of them from offset 0.
    pub words: usize,
    /// Byte offset of the scales (`len / group` of them).
    pub scales: usize,
    /// Byte offset of the biases.
    pub biases: usize,
    /// Total bytes.
    pub bytes: usize,
}

fn word_pad(n: usize) -> usize {
    n.div_ceil(4) * 4
}

impl Affine {
    /// A format mlx can write: bits in [`BITS`], group in [`GROUPS`].
    pub fn new(bits: u32, group: u32, scales: ScaleType) -> Result<Affine> {
        let b = u8::try_from(bits).ok().filter(|b| BITS.contains(b));
        let g = u16::try_from(group).ok().filter(|g| GROUPS.contains(g));
        match (b, g) {
            (Some(bits), Some(group)) => Ok(Affine {
                bits,
                group,
                scales,
            }),
            (None, _) => Err(Error::Config {
                path: "quantization".into(),
                detail: format!("bits {bits}: mlx quantizes to 2, 3, 4, 5, 6 or 8 bits"),
            }),
            (_, None) => Err(Error::Config {
                path: "quantization".into(),
                detail: format!("group_size {group}: mlx groups 32, 64 or 128 values"),
            }),
        }
    }

    /// Short name, as in parity case names: `q4g64` (bf16 scales implied;
    /// others suffixed, `q4g64s32`).
    pub fn name(&self) -> String {
        let s = match self.scales {
            ScaleType::BF16 => "",
            ScaleType::F16 => "s16",
            ScaleType::F32 => "s32",
        };
        format!("q{}g{}{s}", self.bits, self.group)
    }

    /// Packed u32 words a row of `cols` takes: `cols * bits / 32`, when
    /// whole (always, for a `cols` the group divides).
    pub fn row_words(&self, cols: usize) -> Option<usize> {
        let bits = cols * self.bits as usize;
        (cols % self.group as usize == 0 && bits % 32 == 0).then_some(bits / 32)
    }

    /// Whether rows of `cols` can be held: the group divides them (so the
    /// packed words of a row are whole, groups being multiples of 32).
    pub fn fits_cols(&self, cols: usize) -> bool {
        cols > 0 && self.row_words(cols).is_some()
    }

    /// Where the parts of a buffer of `len` elements lie (`len` a multiple
    /// of the group).
    pub fn layout(&self, len: usize) -> Layout {
        let words = len * self.bits as usize / 32;
        let groups = len / self.group as usize;
        let part = word_pad(groups * self.scales.size());
        let scales = words * 4;
        Layout {
            words,
            scales,
            biases: scales + part,
            bytes: scales + 2 * part,
        }
    }

    /// The buffer of a matrix from its three checkpoint tensors, as
    /// [`Affine::layout`] places them. Each part's byte length must be what
    /// `len` elements take.
    pub fn assemble(&self, len: usize, words: &[u8], scales: &[u8], biases: &[u8]) -> Vec<u8> {
        let l = self.layout(len);
        let mut out = vec![0u8; l.bytes];
        out[..words.len()].copy_from_slice(words);
        out[l.scales..l.scales + scales.len()].copy_from_slice(scales);
        out[l.biases..l.biases + biases.len()].copy_from_slice(biases);
        out
    }

    /// A buffer's three parts (words, scales, biases), without padding.
    pub fn split<'a>(&self, bytes: &'a [u8], len: usize) -> (&'a [u8], &'a [u8], &'a [u8]) {
        let l = self.layout(len);
        let part = len / self.group as usize * self.scales.size();
        (
            &bytes[..l.words * 4],
            &bytes[l.scales..l.scales + part],
            &bytes[l.biases..l.biases + part],
        )
    }

    /// Matrices of this format with the same columns, stacked by rows into
    /// one buffer: `parts` are (buffer, elements) in row order.
    pub fn stack(&self, parts: &[(&[u8], usize)]) -> Vec<u8> {
        let len: usize = parts.iter().map(|p| p.1).sum();
        let (mut w, mut s, mut b) = (Vec::new(), Vec::new(), Vec::new());
        for &(bytes, n) in parts {
            let (pw, ps, pb) = self.split(bytes, n);
            w.extend_from_slice(pw);
            s.extend_from_slice(ps);
            b.extend_from_slice(pb);
        }
        self.assemble(len, &w, &s, &b)
    }

    /// A `[rows, cols]` buffer cut by columns at `at` into its `[rows, at]`
    /// and `[rows, cols - at]` halves; None unless the group divides both
    /// (a cut through a group would need requantizing).
    pub fn split_cols(
        &self,
        bytes: &[u8],
        rows: usize,
        cols: usize,
        at: usize,
    ) -> Option<(Vec<u8>, Vec<u8>)> {
        let g = self.group as usize;
        if at == 0 || at >= cols || at % g != 0 || cols % g != 0 {
            return None;
        }
        let (rw, aw) = (self.row_words(cols)? * 4, self.row_words(at)? * 4);
        let ss = self.scales.size();
        let (rs, as_) = (cols / g * ss, at / g * ss);
        let (w, s, b) = self.split(bytes, rows * cols);
        let cut = |part: &[u8], row: usize, edge: usize| {
            let (mut l, mut r) = (Vec::new(), Vec::new());
            for chunk in part.chunks_exact(row) {
                l.extend_from_slice(&chunk[..edge]);
                r.extend_from_slice(&chunk[edge..]);
            }
            (l, r)
        };
        let (wl, wr) = cut(w, rw, aw);
        let (sl, sr) = cut(s, rs, as_);
        let (bl, br) = cut(b, rs, as_);
        Some((
            self.assemble(rows * at, &wl, &sl, &bl),
            self.assemble(rows * (cols - at), &wr, &sr, &br),
        ))
    }

    /// The unsigned value of element `i` of the packed stream.
    #[inline]
    pub fn q(&self, bytes: &[u8], i: usize) -> u32 {
        let bits = self.bits as usize;
        let bit = i * bits;
        let (w, s) = (bit / 32, bit % 32);
        let word = |k: usize| {
            u32::from_le_bytes([
                bytes[4 * k],
                bytes[4 * k + 1],
                bytes[4 * k + 2],
                bytes[4 * k + 3],
            ])
        };
        let mask = (1u64 << bits) - 1;
        let lo = word(w) as u64 >> s;
        let v = if s + bits > 32 {
            lo | ((word(w + 1) as u64) << (32 - s))
        } else {
            lo
        };
        (v & mask) as u32
    }

    /// Element `i` of a buffer of `len` elements, dequantised to f32:
    /// `scale * q + bias` (one rounding for the product, one for the sum,
    /// as mlx's own kernels compute it in f32).
    #[inline]
    pub fn get(&self, bytes: &[u8], len: usize, i: usize) -> f32 {
        let l = self.layout(len);
        let g = i / self.group as usize;
        let dt = self.scales.dtype();
        let s = decode_f32(dt, &bytes[l.scales..], g);
        let b = decode_f32(dt, &bytes[l.biases..], g);
        s * self.q(bytes, i) as f32 + b
    }
}

/// One matrix quantized by mlx's rule (`mx.quantize`, mode "affine"),
/// before its scales and biases are cast to their stored type.
pub struct Quantized {
    pub words: Vec<u32>,
    pub scales: Vec<f32>,
    pub biases: Vec<f32>,
}

/// `values` (rows of a multiple of `group`) quantized exactly as mlx does,
/// in f32: per group, the end of larger magnitude is the `edge` (it gets
/// q = 0 or q = 2^bits - 1 exactly); `scale = (max - min) / (2^bits - 1)`
/// (at least 1e-7), negative when the edge is the maximum; the scale is
/// then nudged to `edge / round(edge / scale)` so that the edge is hit
/// exactly; `bias = edge` (0 when the edge itself rounds to q = 0);
/// `q = clamp(round((w - bias) / scale))`, ties to
/// even. The q values come from the f32 scale and bias, before their cast
/// (checked bit for bit against mlx 0.32.4 for every bits and group: tests/mlx_quantize.rs).
pub fn quantize(values: &[f32], bits: u8, group: usize) -> Quantized {
    let n_bins = ((1u32 << bits) - 1) as f32;
    let groups = values.len() / group;
    let (mut scales, mut biases) = (Vec::with_capacity(groups), Vec::with_capacity(groups));
    let mut q = Vec::with_capacity(values.len());
    for g in values.chunks_exact(group) {
        let w_max = g.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let w_min = g.iter().copied().fold(f32::INFINITY, f32::min);
        let min_is_edge = w_min.abs() > w_max.abs();
        let mut scale = ((w_max - w_min) / n_bins).max(1e-7);
        if !min_is_edge {
            scale = -scale;
        }
        let edge = if min_is_edge { w_min } else { w_max };
        let q0 = (edge / scale).round_ties_even();
        // A group whose edge rounds to q = 0 (a constant group within
        // 5e-8 of zero) keeps its scale and a zero bias.
        let bias = if q0 != 0.0 {
            scale = edge / q0;
            edge
        } else {
            0.0
        };
        q.extend(
            g.iter()
                .map(|&w| ((w - bias) / scale).round_ties_even().clamp(0.0, n_bins) as u32),
        );
        scales.push(scale);
        biases.push(bias);
    }
    Quantized {
        words: pack(&q, bits),
        scales,
        biases,
    }
}

/// Pack unsigned `bits`-bit values into the stream [`Affine::q`] reads.
pub fn pack(values: &[u32], bits: u8) -> Vec<u32> {
    let bits = bits as usize;
    let mut out = vec![0u32; (values.len() * bits).div_ceil(32)];
    for (i, &v) in values.iter().enumerate() {
        let bit = i * bits;
        let (w, s) = (bit / 32, bit % 32);
        let v = v as u64 & ((1u64 << bits) - 1);
        out[w] |= (v << s) as u32;
        if s + bits > 32 {
            out[w + 1] |= (v >> (32 - s)) as u32;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::{encode_f32, DType};

    #[test]
    fn pack_and_read_back_every_width() {
        let mut rng = crate::rng::Rng::new(11);
        for bits in BITS {
            let f = Affine::new(bits as u32, 32, ScaleType::F32).unwrap();
            let vals: Vec<u32> = (0..96)
                .map(|_| (rng.uniform() * (1u32 << bits) as f32) as u32 % (1 << bits))
                .collect();
            let words = pack(&vals, bits);
            assert_eq!(words.len(), 96 * bits as usize / 32);
            let bytes: Vec<u8> = bytemuck::cast_slice(&words).to_vec();
            for (i, &v) in vals.iter().enumerate() {
                assert_eq!(f.q(&bytes, i), v, "bits {bits} element {i}");
            }
        }
        // 4-bit: element 0 in bits 0-3, element 7 in bits 28-31.
        assert_eq!(pack(&[1, 0, 0, 0, 0, 0, 0, 15], 4), vec![0xf000_0001]);
    }

    #[test]
    fn dequantises_through_the_layout() {
        let f = Affine::new(4, 32, ScaleType::BF16).unwrap();
        let q: Vec<u32> = (0..64).map(|i| i % 16).collect();
        let words: Vec<u8> = bytemuck::cast_slice(&pack(&q, 4)).to_vec();
        let scales = encode_f32(DType::BF16, &[0.5, -2.0]);
        let biases = encode_f32(DType::BF16, &[1.0, 3.0]);
        let buf = f.assemble(64, &words, &scales, &biases);
        assert_eq!(buf.len(), f.layout(64).bytes);
        assert_eq!(f.get(&buf, 64, 3), 0.5 * 3.0 + 1.0);
        assert_eq!(f.get(&buf, 64, 32 + 5), -2.0 * 5.0 + 3.0);
    }

    #[test]
    fn stacks_by_rows() {
        let f = Affine::new(8, 32, ScaleType::BF16).unwrap();
        let make = |q0: u32, s: f32| {
            let q: Vec<u32> = (0..32).map(|i| (i + q0) % 256).collect();
            let w: Vec<u8> = bytemuck::cast_slice(&pack(&q, 8)).to_vec();
            f.assemble(
                32,
                &w,
                &encode_f32(DType::BF16, &[s]),
                &encode_f32(DType::BF16, &[-1.0]),
            )
        };
        let (a, b) = (make(0, 0.25), make(100, 2.0));
        let st = f.stack(&[(&a, 32), (&b, 32)]);
        for i in 0..32 {
            assert_eq!(f.get(&st, 64, i), f.get(&a, 32, i));
            assert_eq!(f.get(&st, 64, 32 + i), f.get(&b, 32, i));
        }
    }

    #[test]
    fn splits_by_columns_at_a_group_edge() {
        let mut rng = crate::rng::Rng::new(17);
        let (rows, cols, at) = (3, 192, 128);
        for bits in BITS {
            let v = rng.vec_normal(rows * cols, 0.05);
            let qz = quantize(&v, bits, 64);
            let f = Affine::new(bits as u32, 64, ScaleType::F16).unwrap();
            let buf = f.assemble(
                rows * cols,
                bytemuck::cast_slice(&qz.words),
                &encode_f32(DType::F16, &qz.scales),
                &encode_f32(DType::F16, &qz.biases),
            );
            let (l, r) = f.split_cols(&buf, rows, cols, at).unwrap();
            let w = cols - at;
            for row in 0..rows {
                for c in 0..cols {
                    let want = f.get(&buf, rows * cols, row * cols + c);
                    let got = match c < at {
                        true => f.get(&l, rows * at, row * at + c),
                        false => f.get(&r, rows * w, row * w + c - at),
                    };
                    assert_eq!(got.to_bits(), want.to_bits(), "bits {bits} ({row}, {c})");
                }
            }
            // a cut through a group, or at an end, is refused
            assert!(f.split_cols(&buf, rows, cols, 96).is_none());
            assert!(f.split_cols(&buf, rows, cols, 0).is_none());
            assert!(f.split_cols(&buf, rows, cols, cols).is_none());
        }
    }

    /// The rule's own properties: the edge is hit exactly, a constant group
    /// quantizes to its value, every value within a step.
    #[test]
    fn quantize_hits_the_edge_and_stays_in_range() {
        let mut rng = crate::rng::Rng::new(5);
        for bits in BITS {
            let v = rng.vec_normal(128, 0.05);
            let qz = quantize(&v, bits, 64);
            let f = Affine::new(bits as u32, 64, ScaleType::F32).unwrap();
            let words: Vec<u8> = bytemuck::cast_slice(&qz.words).to_vec();
            let buf = f.assemble(
                128,
                &words,
                &encode_f32(DType::F32, &qz.scales),
                &encode_f32(DType::F32, &qz.biases),
            );
            for g in 0..2 {
                let grp = &v[g * 64..(g + 1) * 64];
                let (mx, mn) = grp
                    .iter()
                    .fold((f32::MIN, f32::MAX), |(a, b), &x| (a.max(x), b.min(x)));
                let edge = if mn.abs() > mx.abs() { mn } else { mx };
                let at = grp.iter().position(|&x| x == edge).unwrap();
                assert_eq!(f.get(&buf, 128, g * 64 + at), edge, "bits {bits}");
                let step = qz.scales[g].abs();
                for (i, &x) in grp.iter().enumerate() {
                    let d = (f.get(&buf, 128, g * 64 + i) - x).abs();
                    // Half a step from rounding, up to half a step more at
                    // the far end when the nudged scale no longer reaches it.
                    assert!(d <= step + 1e-6, "bits {bits}: {d} > a step {step}");
                }
            }
        }
        // A constant group: every q is 0 and reads back as the value.
        let flat = quantize(&[0.25f32; 32], 4, 32);
        let f = Affine::new(4, 32, ScaleType::F32).unwrap();
        let buf = f.assemble(
            32,
            bytemuck::cast_slice(&flat.words),
            &encode_f32(DType::F32, &flat.scales),
            &encode_f32(DType::F32, &flat.biases),
        );
        for i in 0..32 {
            assert_eq!(f.q(&buf, i), 0);
            assert_eq!(f.get(&buf, 32, i), 0.25);
        }
    }

    #[test]
    fn refuses_formats_mlx_does_not_write() {
        assert!(Affine::new(7, 64, ScaleType::BF16).is_err());
        assert!(Affine::new(4, 48, ScaleType::BF16).is_err());
        let f = Affine::new(3, 64, ScaleType::BF16).unwrap();
        assert!(f.fits_cols(128) && !f.fits_cols(96) && !f.fits_cols(0));
    }
}
