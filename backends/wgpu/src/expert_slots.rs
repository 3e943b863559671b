//! Streamed experts' device slots: a layer's misses written into their
//! slots of a stack (`ComputeBackend::write_experts`), each straight from
//! the checkpoint's mapped bytes with one host copy (two where the stack is
//! in tile order: the expert is tiled on the host first), either
//!
//! - into the slot itself, where the stack is mappable
//!   (`WgpuFeatures::mapped_slots`: unified memory): mapped, filled,
//!   unmapped, no staging and no device copy; or
//! - into wgpu's staging memory (`Queue::write_buffer_with`), which the
//!   device copies into the slot at the next submit.

use std::sync::mpsc::channel;

use turbospark::{DType, Error, ExpertBytes, ExpertStack, Result, SlotWrite};

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
/// from byte `lo` of the part, to `at` in `buffer` (the stack's chunk
/// `chunk`).
pub(crate) struct SlotCopy<'a> {
    pub buffer: &'a wgpu::Buffer,
    pub chunk: usize,
    pub at: u64,
    pub w: usize,
    pub part: usize,
    pub lo: usize,
    pub len: usize,
}

/// The copies that fill slots of `buf` (a stack of `dtype` experts of `per`
/// rows of `cols`): for each `(slot, range)` of `slots` (`range` its part
/// 0's bytes, all of a tile-ordered expert), its parts' pieces in each
/// chunk, `w` its index in `slots`. Each piece whole 4-byte words, as
/// device writes and copies take them.
pub(crate) fn slot_copies<'b>(
    op: &'static str,
    buf: &'b WgpuBuffer,
    dtype: DType,
    (per, cols): (usize, usize),
    slots: &[(usize, std::ops::Range<usize>)],
) -> Result<Vec<SlotCopy<'b>>> {
    let rb = row_bytes(dtype, cols);
    let mut copies = Vec::new();
    for (w, (slot, range)) in slots.iter().enumerate() {
        if buf.tiled() {
            let c = buf.single().ok_or_else(|| {
                Error::shape(op, "a tile-ordered stack is one binding".to_string())
            })?;
            copies.push(SlotCopy {
                buffer: c,
                chunk: 0,
                at: range.start as u64,
                w,
                part: 0,
                lo: 0,
                len: range.len(),
            });
            continue;
        }
        let r0 = slot * per;
        for (ci, c) in buf.chunks.iter().enumerate() {
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
                        op: format!("{op} ({dtype})"),
                        reason: format!(
                            "part {part} of slot {slot} is {len} bytes at byte {at}: device \
                             writes take whole 4-byte words"
                        ),
                    });
                }
                copies.push(SlotCopy {
                    buffer: &c.buffer,
                    chunk: ci,
                    at: at as u64,
                    w,
                    part,
                    lo: (a0 - r0) * rb[part],
                    len,
                });
            }
        }
    }
    Ok(copies)
}

/// Experts into their slots of one stack (`ComputeBackend::write_experts`):
/// checked, then each copy's destination (the mapped slot, else a staging
/// view) filled, on several threads (a miss's bytes are a host copy each,
/// and a layer's misses are many).
pub(crate) fn write_experts(
    gpu: &Gpu,
    buf: &WgpuBuffer,
    dtype: DType,
    stack: ExpertStack,
    (rows, cols): (usize, usize),
    writes: &[(usize, ExpertBytes<'_>)],
) -> Result<SlotWrite> {
    const OP: &str = "write_experts";
    let all = stack.check_writes((buf.dtype, buf.len), dtype, (rows, cols), writes)?;
    if buf.tiles.is_some_and(|t| t != stack) {
        return Err(Error::shape(
            OP,
            format!("a tile-ordered stack of {:?} is not {stack:?}", buf.tiles),
        ));
    }
    let per = rows / stack.experts;
    let slots: Vec<(usize, std::ops::Range<usize>)> = writes
        .iter()
        .zip(&all)
        .map(|((slot, _), ranges)| (*slot, ranges[0].clone()))
        .collect();
    let mut copies = slot_copies(OP, buf, dtype, (per, cols), &slots)?;
    // Tile-ordered experts are tiled on the host first (in parallel below).
    let mut tiled: Vec<Vec<u8>> = Vec::new();
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
    let src = Sources {
        tiled: &tiled,
        writes,
    };
    if buf.mappable() {
        write_mapped(gpu, copies, &src)?;
        return Ok(SlotWrite::Mapped);
    }
    // Ops recorded earlier read the slots' old experts: submit them first.
    gpu.flush()?;
    // Copies whose destinations follow each other in one buffer (a layer's
    // experts written whole, slot after slot) share one staging view.
    copies.sort_by_key(|c| (c.chunk, c.at));
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for (i, c) in copies.iter().enumerate() {
        match runs.last_mut() {
            Some((first, n))
                if copies[*first].chunk == c.chunk
                    && copies[i - 1].at + copies[i - 1].len as u64 == c.at =>
            {
                *n += 1
            }
            _ => runs.push((i, 1)),
        }
    }
    let mut views = Vec::with_capacity(runs.len());
    for &(first, n) in &runs {
        let run = &copies[first..first + n];
        let len: usize = run.iter().map(|c| c.len).sum();
        let size = std::num::NonZeroU64::new(len as u64)
            .ok_or_else(|| Error::shape(OP, "an empty copy".to_string()))?;
        let view = gpu
            .queue
            .write_buffer_with(run[0].buffer, run[0].at, size)
            .ok_or_else(|| Error::Gpu(format!("{OP}: no staging memory for {len} bytes")))?;
        views.push(view);
    }
    let mut pieces = Vec::with_capacity(copies.len());
    for (view, &(first, n)) in views.iter_mut().zip(&runs) {
        let mut rest = view.slice(..);
        for c in &copies[first..first + n] {
            let (head, tail) = rest.split_at(c.len);
            pieces.push(Piece(head));
            rest = tail;
        }
    }
    let bytes: usize = copies.iter().map(|c| c.len).sum();
    on_threads(&mut pieces, &copies, bytes, |v, c| {
        src.fill(v.0.slice(..), c)
    });
    Ok(SlotWrite::Staged)
}

/// One copy's bytes of a staging or mapped view, split from it, for a
/// copy thread.
pub(crate) struct Piece<'a>(pub wgpu::WriteOnly<'a, [u8]>);

// SAFETY: a piece is write access to bytes no other piece covers (each is
// split off its view with `split_at`), borrowed from a view that is itself
// `Send` and outlives the threads (`on_threads` scopes them); wgpu makes
// `WriteOnly<T>` `Send` for every sized `T: Send`, and `[u8]` misses that
// only by the implicit `Sized` bound, as `&mut [u8]` is `Send`.
unsafe impl Send for Piece<'_> {}

/// Where the copies' bytes come from: the writes' parts, or (a stack in
/// tile order) each write's expert tiled on the host.
struct Sources<'s, 'a> {
    tiled: &'s [Vec<u8>],
    writes: &'s [(usize, ExpertBytes<'a>)],
}

impl Sources<'_, '_> {
    /// Copy `c`'s bytes into `dst` (its `len` bytes).
    fn fill(&self, mut dst: wgpu::WriteOnly<'_, [u8]>, c: &SlotCopy<'_>) {
        if !self.tiled.is_empty() {
            dst.copy_from_slice(&self.tiled[c.w]);
            return;
        }
        for (at, piece) in pieces(&self.writes[c.w].1.parts[c.part], c.lo, c.len) {
            dst.slice(at..at + piece.len()).copy_from_slice(piece);
        }
    }
}

/// `f(dst, job)` for each pair of `dsts` and `jobs` (`bytes` in all), on
/// several threads.
pub(crate) fn on_threads<D: Send, J: Sync>(
    dsts: &mut [D],
    jobs: &[J],
    bytes: usize,
    f: impl Fn(&mut D, &J) + Sync,
) {
    let each = jobs.len().div_ceil(threads_for(bytes)).max(1);
    let run = |ds: &mut [D], js: &[J]| ds.iter_mut().zip(js).for_each(|(d, j)| f(d, j));
    if each >= jobs.len() {
        return run(dsts, jobs);
    }
    let run = &run;
    std::thread::scope(|s| {
        for (ds, js) in dsts.chunks_mut(each).zip(jobs.chunks(each)) {
            s.spawn(move || run(ds, js));
        }
    });
}

/// A byte range of a mapped buffer taken as a view of its own (its start
/// aligned to `wgpu::MAP_ALIGNMENT`), and the copies into it.
struct Segment<'c, 'a> {
    lo: u64,
    hi: u64,
    copies: Vec<&'c SlotCopy<'a>>,
}

/// The mapped path: the slots' buffers mapped where the copies land, the
/// bytes copied straight in, unmapped. The batch stays locked throughout,
/// so nothing is recorded (and nothing submitted) while a slot is mapped.
fn write_mapped(gpu: &Gpu, mut copies: Vec<SlotCopy<'_>>, src: &Sources<'_, '_>) -> Result<()> {
    const OP: &str = "write_experts";
    let mut batch = gpu.batch_lock();
    // Ops recorded earlier read the slots' old experts, and writes queued
    // to the stack (its zeros) wait for a submit: both submitted, so the
    // maps below wait for them.
    batch.submit(&gpu.submit());
    gpu.queue.submit([]);
    gpu.check_errors()?;
    copies.sort_by_key(|c| (c.chunk, c.at));
    if let Some(w) = copies
        .windows(2)
        .find(|w| w[0].chunk == w[1].chunk && w[0].at + w[0].len as u64 > w[1].at)
    {
        return Err(Error::shape(
            OP,
            format!("two copies overlap at byte {} of a slot stack", w[1].at),
        ));
    }
    let align = |at: u64| at - at % wgpu::MAP_ALIGNMENT;
    // A copy whose aligned start falls before the last one's end shares its
    // view (two views of a mapping may not overlap).
    let mut segments: Vec<Segment<'_, '_>> = Vec::new();
    for c in &copies {
        let end = c.at + c.len as u64;
        match segments.last_mut() {
            Some(s) if s.copies[0].chunk == c.chunk && align(c.at) < s.hi => {
                s.hi = end;
                s.copies.push(c);
            }
            _ => segments.push(Segment {
                lo: align(c.at),
                hi: end,
                copies: vec![c],
            }),
        }
    }
    // One mapping a buffer (wgpu maps one range of a buffer at a time):
    // its segments' span.
    let mut maps: Vec<(&wgpu::Buffer, u64, u64)> = Vec::new();
    for s in &segments {
        let b = s.copies[0].buffer;
        match maps.last_mut() {
            Some(m) if m.0 == b => m.2 = s.hi,
            _ => maps.push((b, s.lo, s.hi)),
        }
    }
    let pending: Vec<_> = maps
        .iter()
        .map(|&(b, lo, hi)| {
            let (tx, rx) = channel();
            b.map_async(wgpu::MapMode::Write, lo..hi, move |r| {
                let _ = tx.send(r);
            });
            rx
        })
        .collect();
    // A map waits for the submissions that used its buffer: on the
    // per-layer path the router's readback has waited for them already, so
    // a poll finds them done; else the device is waited for.
    let mut failed = gpu
        .device
        .poll(wgpu::PollType::Poll)
        .err()
        .map(|e| Error::Gpu(format!("poll: {e}")));
    let mut got: Vec<_> = pending.iter().map(|rx| rx.try_recv().ok()).collect();
    if failed.is_none() && got.iter().any(Option::is_none) {
        failed = gpu.wait_for(None).err();
        for (g, rx) in got.iter_mut().zip(&pending) {
            if g.is_none() {
                *g = rx.try_recv().ok();
            }
        }
    }
    if failed.is_none() {
        if let Some((i, r)) = got
            .iter()
            .enumerate()
            .find(|(_, r)| !matches!(r, Some(Ok(()))))
        {
            failed = Some(Error::Gpu(format!(
                "{OP}: mapping {} bytes of a slot stack: {}",
                maps[i].2 - maps[i].1,
                match r {
                    Some(Err(e)) => e.to_string(),
                    _ => "the map never completed".into(),
                }
            )));
        }
    }
    let written = match failed {
        Some(e) => Err(e),
        None => fill_segments(&segments, src),
    };
    // Every map made or still pending (which this cancels) is undone
    // before anything is recorded again; a failed one left nothing mapped.
    for (&(b, ..), g) in maps.iter().zip(&got) {
        if !matches!(g, Some(Err(_))) {
            b.unmap();
        }
    }
    drop(batch);
    written?;
    gpu.check_errors()
}

/// Each segment's view of its mapped buffer, filled with its copies, on
/// several threads.
fn fill_segments(segments: &[Segment<'_, '_>], src: &Sources<'_, '_>) -> Result<()> {
    let mut views = segments
        .iter()
        .map(|s| {
            s.copies[0]
                .buffer
                .get_mapped_range_mut(s.lo..s.hi)
                .map_err(|e| Error::Gpu(format!("write_experts: a mapped slot range: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    // (each copy its own piece of its segment's view, so that threads share
    // the copies, not the segments: a layer's experts written whole make a
    // segment a part)
    let mut pieces = Vec::new();
    let mut jobs = Vec::new();
    for (v, seg) in views.iter_mut().zip(segments) {
        let (mut rest, mut at) = (v.slice(..), seg.lo);
        for c in &seg.copies {
            let (_, from) = rest.split_at((c.at - at) as usize);
            let (head, tail) = from.split_at(c.len);
            pieces.push(Piece(head));
            jobs.push(*c);
            (rest, at) = (tail, c.at + c.len as u64);
        }
    }
    let bytes = jobs.iter().map(|c| c.len).sum();
    on_threads(&mut pieces, &jobs, bytes, |v, c| src.fill(v.0.slice(..), c));
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
    use crate::{LimitsProfile, WgpuBackend, WgpuBuffer, WgpuOptions};
    use turbospark::quant::{Affine, ScaleType};
    use turbospark::rng::Rng;
    use turbospark::SlotWrite;
    use turbospark::{ComputeBackend, DType, DeviceType, ExpertBytes, ExpertStack, HostBytes};

    /// Every byte of a single-binding buffer, as the device holds it.
    fn device_bytes(be: &WgpuBackend, b: &WgpuBuffer) -> Vec<u8> {
        let t = be.gpu.begin_read(b, "test").unwrap();
        be.gpu.finish_read_bytes(t).unwrap()
    }

    /// A slot stack's shape: its format, experts and whole-stack shape.
    struct Case {
        name: &'static str,
        dtype: DType,
        stack: ExpertStack,
        shape: (usize, usize),
    }

    /// The stack's device bytes after two rounds of writes (the second
    /// overwriting a slot of the first, its slots out of order), and a copy
    /// of the stack recorded between them (F16: a copy the device makes),
    /// which must hold the first round's experts; each round checked
    /// against an upload of the same experts.
    fn write_rounds(be: &WgpuBackend, c: &Case, seed: u64, path: SlotWrite) -> Vec<u8> {
        let what = format!("{} on the {} path (seed {seed})", c.name, path.name());
        let slots = be
            .alloc_experts(c.dtype, c.stack, c.shape, "slots")
            .unwrap();
        assert_eq!(slots.mappable(), path == SlotWrite::Mapped, "{what}");
        assert_eq!(slots.tiles.is_some(), c.name.contains("tiled"), "{what}");
        let mut host = vec![0u8; c.dtype.bytes_for(c.shape.0 * c.shape.1)];
        let mut rng = Rng::new(seed);
        let mut snap = None;
        for round in [&[0usize, 2][..], &[3, 2, 1]] {
            let experts: Vec<[Vec<u8>; 3]> = round
                .iter()
                .map(|&slot| {
                    let r = c.stack.part_ranges(c.dtype, c.shape, slot).unwrap();
                    r.map(|r| (0..r.len()).map(|_| rng.below(256) as u8).collect())
                })
                .collect();
            let writes: Vec<(usize, ExpertBytes<'_>)> = round
                .iter()
                .zip(&experts)
                .map(|(&slot, parts)| {
                    // (the words part in two slices: a gate and an up tensor)
                    let (a, b) = parts[0].split_at(parts[0].len() / 2);
                    let bytes = ExpertBytes {
                        parts: [vec![a, b], vec![&parts[1][..]], vec![&parts[2][..]]],
                    };
                    (slot, bytes)
                })
                .collect();
            for (&slot, parts) in round.iter().zip(&experts) {
                let r = c.stack.part_ranges(c.dtype, c.shape, slot).unwrap();
                for (r, p) in r.into_iter().zip(parts) {
                    host[r].copy_from_slice(p);
                }
            }
            let took = be
                .write_experts(&slots, c.dtype, c.stack, c.shape, &writes)
                .unwrap();
            assert_eq!(took, path, "{what}");
            let want = be
                .upload_experts(c.dtype, c.stack, c.shape, HostBytes::Slice(&host), "want")
                .unwrap();
            let want = device_bytes(be, &want);
            if c.dtype == DType::F16 && snap.is_none() && slots.tiles.is_none() {
                let s = be.alloc_experts(c.dtype, c.stack, c.shape, "snap").unwrap();
                be.copy_buffer(&slots, &s).unwrap();
                snap = Some((s, want.clone()));
                continue;
            }
            assert!(device_bytes(be, &slots) == want, "{what}: round {round:?}");
        }
        if let Some((s, want)) = snap {
            assert!(
                device_bytes(be, &s) == want,
                "{what}: a copy recorded before a write saw it"
            );
        }
        device_bytes(be, &slots)
    }

    /// A backend that maps its slots and one that stages, both with expert
    /// tiles `tiles`; None (skip) where the adapter maps none, except under
    /// `CI=true` on a software or integrated adapter (lavapipe), where that
    /// fails. Under the WebGPU profile mapped slots are refused by name
    /// (checked) and None.
    fn both_paths(tiles: bool) -> Option<(WgpuBackend, WgpuBackend)> {
        let first = crate::tests::backend()?;
        let unified = matches!(
            first.info().device_type,
            DeviceType::SoftwareGpu | DeviceType::IntegratedGpu
        );
        let open = |mapped: bool| {
            WgpuBackend::new(&WgpuOptions {
                mapped_slots: Some(mapped),
                expert_tiles: Some(tiles),
                ..Default::default()
            })
        };
        if LimitsProfile::or_env(None).unwrap() == LimitsProfile::WebGpu {
            let e = open(true).err().expect("mapped slots under WebGPU");
            assert!(e.to_string().contains("WebGPU"), "{e}");
            return None;
        }
        let ci = std::env::var("CI").is_ok_and(|v| v == "true");
        let mapped = match open(true) {
            Ok(b) => b,
            Err(e) => {
                let name = &first.info().device_name;
                assert!(!(ci && unified), "CI: {name} must map its slots: {e}");
                eprintln!("skipping: {e}");
                return None;
            }
        };
        drop(first);
        assert!(mapped.features().mapped_slots);
        let staged = open(false).unwrap();
        assert!(!staged.features().mapped_slots);
        Some((mapped, staged))
    }

    /// Random experts written through the mapped path and through staging
    /// land byte for byte as an upload of them does, in float, affine and
    /// tile-ordered stacks.
    #[test]
    fn mapped_and_staged_writes_land_alike() {
        let (Some((m0, s0)), Some((m1, s1))) = (both_paths(false), both_paths(true)) else {
            return;
        };
        let (mapped, staged) = ([m0, m1], [s0, s1]);
        let q4 = DType::Affine(Affine::new(4, 32, ScaleType::BF16).unwrap());
        let cases = [
            Case {
                name: "f16",
                dtype: DType::F16,
                stack: ExpertStack {
                    experts: 4,
                    gate_up: false,
                },
                shape: (4 * 6, 40),
            },
            Case {
                name: "q4 gate_up",
                dtype: q4,
                stack: ExpertStack {
                    experts: 4,
                    gate_up: true,
                },
                shape: (4 * 8, 64),
            },
            Case {
                name: "f16 tiled gate_up",
                dtype: DType::F16,
                stack: ExpertStack {
                    experts: 4,
                    gate_up: true,
                },
                shape: (4 * 64, 32),
            },
        ];
        let seed = turbospark::parity::seed_from_env();
        eprintln!("seed {seed} (TURBOSPARK_SEED={seed} replays it)");
        for (i, c) in cases.iter().enumerate() {
            let tiles = usize::from(c.name.contains("tiled"));
            let m = write_rounds(&mapped[tiles], c, seed ^ i as u64, SlotWrite::Mapped);
            let s = write_rounds(&staged[tiles], c, seed ^ i as u64, SlotWrite::Staged);
            assert!(m == s, "{}: the two paths differ (seed {seed})", c.name);
        }
        // A slot twice in one call is refused on both paths.
        let c = &cases[0];
        for be in [&mapped[0], &staged[0]] {
            let slots = be
                .alloc_experts(c.dtype, c.stack, c.shape, "slots")
                .unwrap();
            let r = c.stack.part_ranges(c.dtype, c.shape, 1).unwrap();
            let bytes = vec![7u8; r[0].len()];
            let w = || ExpertBytes {
                parts: [vec![&bytes[..]], vec![], vec![]],
            };
            let e = be
                .write_experts(&slots, c.dtype, c.stack, c.shape, &[(1, w()), (1, w())])
                .unwrap_err();
            assert!(e.to_string().contains("slot 1 again"), "{e}");
        }
    }

    #[test]
    fn a_range_spans_slices() {
        let (a, b, c) = ([1u8, 2, 3], [4u8], [5u8, 6]);
        let got = pieces(&[&a, &b, &c], 1, 4);
        assert_eq!(got, vec![(0, &a[1..]), (2, &b[..]), (3, &c[..1])]);
    }

    /// A layer's misses at the 26B-A4B's size (8 gate_up experts of 16
    /// slots, q4 group 64: 2.2 MB each) through both paths, five layers'
    /// worth: the same bytes in the slots, those of an upload; each path's
    /// copy rate printed (the time in `write_experts`, as `StreamStats`
    /// counts it, and to the device's idle, which adds the staged path's
    /// device copy).
    #[test]
    fn full_size_misses_land_alike_on_both_paths() {
        let Some((mapped, staged)) = both_paths(false) else {
            return;
        };
        let dtype = DType::Affine(Affine::new(4, 64, ScaleType::BF16).unwrap());
        let stack = ExpertStack {
            experts: 16,
            gate_up: true,
        };
        let shape = (16 * 2 * 704, 2816);
        let seed = turbospark::parity::seed_from_env();
        let mut rng = Rng::new(seed);
        let mut random = |n: usize| -> Vec<u8> {
            (0..n.div_ceil(8))
                .flat_map(|_| rng.next_u64().to_le_bytes())
                .take(n)
                .collect()
        };
        let rounds: Vec<Vec<(usize, [Vec<u8>; 3])>> = (0..5)
            .map(|r| {
                (0..8)
                    .map(|i| {
                        let slot = (r * 5 + i * 2) % 16;
                        let ranges = stack.part_ranges(dtype, shape, slot).unwrap();
                        (slot, ranges.map(|r| random(r.len())))
                    })
                    .collect()
            })
            .collect();
        let paths = [(&mapped, SlotWrite::Mapped), (&staged, SlotWrite::Staged)];
        let stacks: Vec<WgpuBuffer> = paths
            .iter()
            .map(|(be, _)| be.alloc_experts(dtype, stack, shape, "slots").unwrap())
            .collect();
        // Best of three, the paths taking turns (a shared host's noise).
        let mut best = [(0.0f64, 0.0f64); 2];
        let mut bytes = 0;
        for _ in 0..3 {
            for (i, (be, path)) in paths.iter().enumerate() {
                be.sync().unwrap();
                bytes = 0;
                let (mut write, mut done) = (0.0, 0.0);
                for round in &rounds {
                    let writes: Vec<(usize, ExpertBytes<'_>)> = round
                        .iter()
                        .map(|(slot, p)| {
                            let parts = [vec![&p[0][..]], vec![&p[1][..]], vec![&p[2][..]]];
                            (*slot, ExpertBytes { parts })
                        })
                        .collect();
                    bytes += writes.iter().map(|w| w.1.len()).sum::<usize>();
                    let t0 = std::time::Instant::now();
                    let took = be.write_experts(&stacks[i], dtype, stack, shape, &writes);
                    write += t0.elapsed().as_secs_f64();
                    assert_eq!(took.unwrap(), *path, "seed {seed}");
                    // (a submit carries the staged path's device copies)
                    be.gpu.queue.submit([]);
                    be.sync().unwrap();
                    done += t0.elapsed().as_secs_f64();
                }
                let rate = |s: f64| bytes as f64 / s / 1e9;
                best[i] = (best[i].0.max(rate(write)), best[i].1.max(rate(done)));
            }
        }
        for ((be, path), (write, done)) in paths.iter().zip(best) {
            eprintln!(
                "{} on {}: {:.1} MB of misses, {write:.2} GB/s in write_experts, \
                 {done:.2} GB/s to the device's idle (best of 3)",
                path.name(),
                be.info().device_name,
                bytes as f64 / 1e6,
            );
        }
        let got: Vec<Vec<u8>> = paths
            .iter()
            .zip(&stacks)
            .map(|((be, _), s)| device_bytes(be, s))
            .collect();
        assert!(got[0] == got[1], "the two paths differ (seed {seed})");
        // (and both hold what an upload of the same experts holds)
        let mut host = vec![0u8; dtype.bytes_for(shape.0 * shape.1)];
        for (slot, parts) in rounds.iter().flatten() {
            let ranges = stack.part_ranges(dtype, shape, *slot).unwrap();
            for (r, p) in ranges.into_iter().zip(parts) {
                host[r].copy_from_slice(p);
            }
        }
        let want = staged
            .upload_experts(dtype, stack, shape, HostBytes::Slice(&host), "want")
            .unwrap();
        assert!(
            device_bytes(&staged, &want) == got[0],
            "the slots differ from an upload (seed {seed})"
        );
    }
}
