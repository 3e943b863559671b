//! Streamed experts' device slots: one expert written into its slot of a
//! stack (`ComputeBackend::write_expert`), straight from the checkpoint's
//! mapped bytes into wgpu's staging memory (`Queue::write_buffer_with`),
//! one host copy, or two where the stack is in tile order (the expert is
//! tiled on the host first).

use turbospark::{DType, Error, ExpertBytes, ExpertStack, Result};

use crate::buffer::WgpuBuffer;
use crate::{expert_tiles, quant, WgpuBackend};

/// Bytes one row of the stack takes in each part: packed words, scales and
/// biases of an affine weight, or a float row and nothing.
fn row_bytes(dtype: DType, cols: usize) -> [usize; 3] {
    match dtype {
        DType::Affine(a) => {
            let sb = cols / a.group as usize * a.scales.size();
            [a.row_words(cols).unwrap_or(0) * 4, sb, sb]
        }
        d => [d.bytes_for(cols), 0, 0],
    }
}

/// Where each part begins in a chunk of `rows` rows of `cols`.
fn part_bases(dtype: DType, rows: usize, cols: usize) -> [usize; 3] {
    match dtype {
        DType::Affine(a) => {
            let l = a.layout(rows * cols);
            let h = 4 * quant::HEAD_WORDS;
            [h, h + l.scales, h + l.biases]
        }
        _ => [0; 3],
    }
}

/// The pieces of bytes `lo..lo + len` of `parts` laid end to end, each
/// with its offset from `lo`.
pub(crate) fn pieces<'a>(parts: &[&'a [u8]], mut lo: usize, len: usize) -> Vec<(usize, &'a [u8])> {
    let mut out = Vec::new();
    let mut at = 0;
    for s in parts {
        if at == len {
            break;
        }
        if lo >= s.len() {
            lo -= s.len();
            continue;
        }
        let n = (s.len() - lo).min(len - at);
        out.push((at, &s[lo..lo + n]));
        at += n;
        lo = 0;
    }
    out
}

pub(crate) fn write_expert(
    be: &WgpuBackend,
    buf: &WgpuBuffer,
    dtype: DType,
    stack: ExpertStack,
    (rows, cols): (usize, usize),
    slot: usize,
    bytes: &ExpertBytes<'_>,
) -> Result<()> {
    const OP: &str = "write_expert";
    if buf.dtype != dtype || buf.len != rows * cols || buf.tiles.is_some_and(|t| t != stack) {
        return Err(Error::shape(
            OP,
            format!(
                "a {} buffer of {} elements is not a {dtype} stack of {} experts, {rows} x {cols}",
                buf.dtype, buf.len, stack.experts
            ),
        ));
    }
    let ranges = stack.part_ranges(dtype, (rows, cols), slot)?;
    for (i, r) in ranges.iter().enumerate() {
        if bytes.part_len(i) != r.len() {
            return Err(Error::shape(
                OP,
                format!(
                    "part {i} of slot {slot}: {} bytes for {}",
                    bytes.part_len(i),
                    r.len()
                ),
            ));
        }
    }
    // Ops recorded earlier read the slot's old expert: submit them first.
    turbospark::ComputeBackend::flush(be)?;
    let per = rows / stack.experts;
    let r0 = slot * per;
    if buf.tiled() {
        let mut src = Vec::new();
        bytes.gather(0, &mut src);
        let tiled = expert_tiles::tile_order(
            &src,
            ExpertStack {
                experts: 1,
                gate_up: stack.gate_up,
            },
            per,
            cols,
        );
        let c = buf
            .single()
            .ok_or_else(|| Error::shape(OP, "a tile-ordered stack is one binding".to_string()))?;
        be.write_bytes(c, ranges[0].start as u64, &tiled);
        return Ok(());
    }
    let rb = row_bytes(dtype, cols);
    for c in buf.chunks.iter() {
        let (a0, a1) = (r0.max(c.row_start), (r0 + per).min(c.row_start + c.rows));
        if a0 >= a1 {
            continue;
        }
        let bases = part_bases(dtype, c.rows, cols);
        for i in 0..3 {
            if rb[i] == 0 {
                continue;
            }
            let at = bases[i] + (a0 - c.row_start) * rb[i];
            let len = (a1 - a0) * rb[i];
            if !at.is_multiple_of(4) || !len.is_multiple_of(4) {
                return Err(Error::Unsupported {
                    backend: "wgpu".into(),
                    op: format!("{OP} ({dtype})"),
                    reason: format!(
                        "part {i} of slot {slot} is {len} bytes at byte {at}: device writes \
                         take whole 4-byte words"
                    ),
                });
            }
            be.write_parts(
                &c.buffer,
                at as u64,
                &bytes.parts[i],
                (a0 - r0) * rb[i],
                len,
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::pieces;

    #[test]
    fn a_range_spans_slices() {
        let (a, b, c) = ([1u8, 2, 3], [4u8], [5u8, 6]);
        let got = pieces(&[&a, &b, &c], 1, 4);
        assert_eq!(got, vec![(0, &a[1..]), (2, &b[..]), (3, &c[..1])]);
    }
}
