//! Streamed experts' device slots: one expert written into its slot of a
//! stack (`ComputeBackend::write_expert`), straight from the checkpoint's
//! mapped bytes into wgpu's staging memory (`Queue::write_buffer_with`),
//! one host copy, or two where the stack is in tile order (the expert is
//! tiled on the host first).

use turbospark::{DType, Error, ExpertBytes, ExpertStack, Result};

use crate::buffer::WgpuBuffer;
use crate::gpu::Gpu;
use crate::{expert_tiles, quant};

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

/// One copy of a write: `len` bytes of part `part` of write `w`'s expert,
/// from byte `lo` of the part, to `at` in `buffer`.
struct SlotCopy<'a> {
    buffer: &'a wgpu::Buffer,
    at: u64,
    w: usize,
    part: usize,
    lo: usize,
    len: usize,
}

/// Experts into their slots of one stack (`ComputeBackend::write_experts`):
/// checked, then every copy's staging view taken and filled, the views
/// filled on several threads (a miss's bytes are a host copy each, and a
/// layer's misses are many).
pub(crate) fn write_experts(
    gpu: &Gpu,
    buf: &WgpuBuffer,
    dtype: DType,
    stack: ExpertStack,
    (rows, cols): (usize, usize),
    writes: &[(usize, ExpertBytes<'_>)],
) -> Result<()> {
    const OP: &str = "write_experts";
    let all = stack.check_writes((buf.dtype, buf.len), dtype, (rows, cols), writes)?;
    if buf.tiles.is_some_and(|t| t != stack) {
        return Err(Error::shape(
            OP,
            format!("a tile-ordered stack of {:?} is not {stack:?}", buf.tiles),
        ));
    }
    let per = rows / stack.experts;
    let rb = row_bytes(dtype, cols);
    let mut copies = Vec::new();
    // Tile-ordered experts are tiled on the host first (in parallel below).
    let mut tiled: Vec<Vec<u8>> = Vec::new();
    for (w, ((slot, _), ranges)) in writes.iter().zip(&all).enumerate() {
        if buf.tiled() {
            let c = buf.single().ok_or_else(|| {
                Error::shape(OP, "a tile-ordered stack is one binding".to_string())
            })?;
            copies.push(SlotCopy {
                buffer: c,
                at: ranges[0].start as u64,
                w,
                part: 0,
                lo: 0,
                len: ranges[0].len(),
            });
            continue;
        }
        let r0 = slot * per;
        for c in buf.chunks.iter() {
            let (a0, a1) = (r0.max(c.row_start), (r0 + per).min(c.row_start + c.rows));
            if a0 >= a1 {
                continue;
            }
            let bases = part_bases(dtype, c.rows, cols);
            for part in 0..3 {
                if rb[part] == 0 {
                    continue;
                }
                let at = bases[part] + (a0 - c.row_start) * rb[part];
                let len = (a1 - a0) * rb[part];
                if !at.is_multiple_of(4) || !len.is_multiple_of(4) {
                    return Err(Error::Unsupported {
                        backend: "wgpu".into(),
                        op: format!("{OP} ({dtype})"),
                        reason: format!(
                            "part {part} of slot {slot} is {len} bytes at byte {at}: device \
                             writes take whole 4-byte words"
                        ),
                    });
                }
                copies.push(SlotCopy {
                    buffer: &c.buffer,
                    at: at as u64,
                    w,
                    part,
                    lo: (a0 - r0) * rb[part],
                    len,
                });
            }
        }
    }
    if buf.tiled() {
        let bytes = writes.iter().map(|w| w.1.len()).sum();
        tiled = parallel(writes.len(), bytes, |w| {
            let mut src = Vec::new();
            writes[w].1.gather(0, &mut src);
            expert_tiles::tile_order(
                &src,
                ExpertStack {
                    experts: 1,
                    gate_up: stack.gate_up,
                },
                per,
                cols,
            )
        });
    }
    // Ops recorded earlier read the slots' old experts: submit them first.
    gpu.flush()?;
    let mut views = Vec::with_capacity(copies.len());
    for c in &copies {
        let size = std::num::NonZeroU64::new(c.len as u64)
            .ok_or_else(|| Error::shape(OP, "an empty copy".to_string()))?;
        let view = gpu
            .queue
            .write_buffer_with(c.buffer, c.at, size)
            .ok_or_else(|| Error::Gpu(format!("{OP}: no staging memory for {} bytes", c.len)))?;
        views.push(view);
    }
    let fill = |vs: &mut [wgpu::QueueWriteBufferView], cs: &[SlotCopy<'_>]| {
        for (view, c) in vs.iter_mut().zip(cs) {
            if !tiled.is_empty() {
                view.slice(..).copy_from_slice(&tiled[c.w]);
                continue;
            }
            for (at, piece) in pieces(&writes[c.w].1.parts[c.part], c.lo, c.len) {
                view.slice(at..at + piece.len()).copy_from_slice(piece);
            }
        }
    };
    let bytes: usize = copies.iter().map(|c| c.len).sum();
    let each = copies.len().div_ceil(threads_for(bytes)).max(1);
    if each >= copies.len() {
        fill(&mut views, &copies);
        return Ok(());
    }
    std::thread::scope(|s| {
        for (vs, cs) in views.chunks_mut(each).zip(copies.chunks(each)) {
            s.spawn(|| fill(vs, cs));
        }
    });
    Ok(())
}

/// Threads to copy `bytes` on: one a MiB, at most 8 (starting a thread is
/// worth it for copies of that size, not for the tiny fixtures' few KB; a
/// miss on the 26B-A4B is 3.35 MB).
fn threads_for(bytes: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (bytes >> 20).clamp(1, cores.min(8))
}

/// `f(0..n)` on several threads (`bytes` in all), in order.
fn parallel<T: Send>(n: usize, bytes: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let each = n.div_ceil(threads_for(bytes)).max(1);
    if each >= n {
        return (0..n).map(f).collect();
    }
    let f = &f;
    std::thread::scope(|s| {
        let parts: Vec<_> = (0..n)
            .step_by(each)
            .map(|a| s.spawn(move || (a..(a + each).min(n)).map(f).collect::<Vec<T>>()))
            .collect();
        parts
            .into_iter()
            .flat_map(|h| h.join().expect("a tiling thread panicked"))
            .collect()
    })
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
