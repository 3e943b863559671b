//! MLX affine-quantized weights on the device: each binding (a weight, or
//! one chunk of its rows) is its own `turbospark::quant` buffer of those
//! rows behind a 16-byte header of word offsets, which the kernels read
//! (kernels/affine.wgsl). The header spares every parameter block the
//! offsets, and a chunk of rows needs no offsets into another chunk.

use turbospark::dtype::decode_f32;
use turbospark::quant::Affine;

/// Header words before the packed values (`QHEAD` in kernels/affine.wgsl).
pub(crate) const HEAD_WORDS: usize = 4;

/// Device bytes of `rows` rows of `cols` in format `a`.
pub(crate) fn device_bytes(a: Affine, rows: usize, cols: usize) -> usize {
    4 * HEAD_WORDS + a.layout(rows * cols).bytes
}

/// Word offsets of the scales and the biases in a device buffer of `len`
/// elements (what its header holds): the one-row kernels take them as
/// parameters, so their loads need not wait on the header's.
pub(crate) fn offsets(a: Affine, len: usize) -> [u32; 2] {
    let l = a.layout(len);
    [
        (HEAD_WORDS + l.scales / 4) as u32,
        (HEAD_WORDS + l.biases / 4) as u32,
    ]
}

/// The header of a device buffer of `len` elements.
pub(crate) fn head(a: Affine, len: usize) -> [u32; HEAD_WORDS] {
    let [so, bo] = offsets(a, len);
    [so, bo, 0, 0]
}

/// The device buffer of rows `r0 .. r0 + n` of a `[rows, cols]` weight
/// whose host buffer (`turbospark::quant` layout) is `host`.
pub(crate) fn chunk(
    a: Affine,
    host: &[u8],
    (rows, cols): (usize, usize),
    r0: usize,
    n: usize,
) -> Vec<u8> {
    let (words, scales, biases) = a.split(host, rows * cols);
    let wpr = words.len() / rows;
    let spr = scales.len() / rows;
    let rows_of = |part: &[u8], per: usize| part[r0 * per..(r0 + n) * per].to_vec();
    let body = a.assemble(
        n * cols,
        &rows_of(words, wpr),
        &rows_of(scales, spr),
        &rows_of(biases, spr),
    );
    let head = head(a, n * cols);
    let mut out = Vec::with_capacity(4 * HEAD_WORDS + body.len());
    out.extend_from_slice(bytemuck::cast_slice(&head));
    out.extend_from_slice(&body);
    out
}

/// Whether every value `scale * q + bias` of a weight of `len` elements
/// (host layout `host`) is within f16's range, so that the tensor-core
/// GEMM may stage it as f16 (kernels/gemm_coop.wgsl): a value is linear in
/// its code, so a group's extremes are at q = 0 and q = 2^bits - 1, and the
/// check reads only the scales and biases. A NaN or inf fails it.
pub(crate) fn fits_f16(a: Affine, host: &[u8], len: usize) -> bool {
    let (_, scales, biases) = a.split(host, len);
    let dt = a.scales.dtype();
    let top = ((1u32 << a.bits) - 1) as f32;
    (0..len / a.group as usize).all(|g| {
        let (s, b) = (decode_f32(dt, scales, g), decode_f32(dt, biases, g));
        b.abs() <= 65504.0 && (s * top + b).abs() <= 65504.0
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use turbospark::quant::{quantize, ScaleType};
    use turbospark::DType;

    /// A chunk of rows reads back, through its header, the elements those
    /// rows hold in the whole buffer.
    #[test]
    fn a_chunk_holds_its_rows() {
        let a = Affine::new(3, 32, ScaleType::BF16).unwrap();
        let (rows, cols) = (5, 64);
        let mut rng = turbospark::rng::Rng::new(11);
        let v = rng.vec_normal(rows * cols, 1.0);
        let q = quantize(&v, 3, 32);
        let host = a.assemble(
            rows * cols,
            bytemuck::cast_slice(&q.words),
            &turbospark::dtype::encode_f32(DType::BF16, &q.scales),
            &turbospark::dtype::encode_f32(DType::BF16, &q.biases),
        );
        let c = chunk(a, &host, (rows, cols), 2, 3);
        assert_eq!(c.len(), device_bytes(a, 3, cols));
        let head: &[u32] = bytemuck::cast_slice(&c[..16]);
        assert_eq!(head[0] as usize * 4, 16 + a.layout(3 * cols).scales);
        assert_eq!(head[..2], offsets(a, 3 * cols));
        let body = &c[16..];
        for i in 0..3 * cols {
            assert_eq!(
                a.get(body, 3 * cols, i),
                a.get(&host, rows * cols, 2 * cols + i)
            );
        }
    }
}
