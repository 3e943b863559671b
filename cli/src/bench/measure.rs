//! Timing an op on one backend, and each backend's bandwidth ceiling.

use std::time::Instant;

use turbospark::parity::{Case as _, Op, OutSpec};
use turbospark::{ComputeBackend, DType, Error, Result, Support};
use turbospark_cpu::CpuBackend;
use turbospark_wgpu::{WgpuBackend, WgpuBuffer};

use super::cases::{Case, HostSets, Variant};

/// Timing figures over repeated calls, in seconds.
#[derive(Clone, Debug)]
pub struct Stats {
    pub median: f64,
    pub p10: f64,
    pub p90: f64,
    pub min: f64,
    pub max: f64,
    pub mean: f64,
    pub n: usize,
}

impl Stats {
    pub fn of(samples: &[f64]) -> Stats {
        let mut v = samples.to_vec();
        v.sort_by(f64::total_cmp);
        let q = |p: f64| {
            let x = p * (v.len() - 1) as f64;
            let (lo, hi) = (x.floor() as usize, x.ceil() as usize);
            v[lo] + (v[hi] - v[lo]) * (x - lo as f64)
        };
        Stats {
            median: q(0.5),
            p10: q(0.1),
            p90: q(0.9),
            min: v[0],
            max: v[v.len() - 1],
            mean: v.iter().sum::<f64>() / v.len() as f64,
            n: v.len(),
        }
    }
}

/// How one case ended on one backend.
#[derive(Clone, Debug)]
pub enum Outcome {
    Measured {
        stats: Stats,
        method: &'static str,
        sets: usize,
        warm: WarmUp,
    },
    Unsupported(String),
    Skipped(String),
    Failed(String),
}

/// The measured bandwidth ceiling of one backend.
#[derive(Clone, Debug)]
pub struct Ceiling {
    pub bytes: u64,
    pub stats: Stats,
    pub method: &'static str,
    /// What was streamed, by what.
    pub how: String,
    /// Streaming reads of buffers of a single op's size, timed as an op is
    /// (one dependent dispatch a call, rotating over buffers that together
    /// exceed the caches), by the same kernel and by one whose threads
    /// issue all their loads at once: what a plain streaming kernel reaches
    /// at that size, launch and drain included. Empty where not measured
    /// (the CPU reference, whose ceiling is one thread's).
    pub at_sizes: Vec<SizedStream>,
    /// The host-to-device copy ceiling beside it ([`Upload`]).
    pub upload: Option<Upload>,
}

/// The host-to-device copy ceiling: writes of `bytes` from host memory into
/// a device buffer through the backend's `write_f32` (on wgpu,
/// `Queue::write_buffer`: a copy into staging memory, then the device's
/// transfer), each timed to the device's idle: what a streamed expert's
/// miss can move at best. None where the measurement failed.
#[derive(Clone, Debug)]
pub struct Upload {
    pub bytes: u64,
    pub stats: Stats,
}

impl Upload {
    pub fn gbps(&self) -> f64 {
        gbps(self.bytes, self.stats.median)
    }
}

/// Bytes a host-to-device sample writes (within WebGPU's smallest largest
/// binding, 128 MiB).
pub const UPLOAD_BYTES: usize = 64 << 20;

/// [`Upload`] on `be`: one untimed write, then `reps` timed ones.
pub fn host_to_device<B: ComputeBackend + ?Sized>(be: &B, reps: usize) -> Result<Upload> {
    let n = UPLOAD_BYTES / 4;
    let buf = be.alloc(DType::F32, n, "host to device probe")?;
    let data = vec![1.0f32; n];
    be.write_f32(&buf, 0, &data)?;
    be.sync()?;
    let mut samples = Vec::with_capacity(reps.max(1));
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        be.write_f32(&buf, 0, &data)?;
        be.sync()?;
        samples.push(t.elapsed().as_secs_f64());
    }
    Ok(Upload {
        bytes: UPLOAD_BYTES as u64,
        stats: Stats::of(&samples),
    })
}

/// Experts [`slot_writes`] writes a sample.
const SLOT_PROBE_EXPERTS: usize = 32;

/// [`Upload`] through the path a streamed expert's miss takes
/// (`ComputeBackend::write_experts`): 32 4-bit experts of Gemma 4
/// 26B-A4B's gate_up shape (2.2 MB each, their own bytes) into adjacent
/// slots in one call, as a prefill layer writes its experts (the copy
/// threads, one staging view a part), each timed to the device's idle.
pub fn slot_writes<B: ComputeBackend + ?Sized>(be: &B, reps: usize) -> Result<Upload> {
    use turbospark::dtype::{Affine, ScaleType};
    use turbospark::{ExpertBytes, ExpertStack};
    let dtype = DType::Affine(Affine::new(4, 64, ScaleType::BF16)?);
    let stack = ExpertStack {
        experts: SLOT_PROBE_EXPERTS,
        gate_up: true,
    };
    let shape = (SLOT_PROBE_EXPERTS * 2 * 704, 2816);
    let buf = be.alloc_experts(dtype, stack, shape, "slot write probe")?;
    let lens = stack.part_ranges(dtype, shape, 0)?.map(|r| r.len());
    let per: usize = lens.iter().sum();
    let host: Vec<u8> = (0..SLOT_PROBE_EXPERTS * per)
        .map(|i| (i * 31 % 251) as u8)
        .collect();
    let writes: Vec<(usize, ExpertBytes<'_>)> = host
        .chunks_exact(per)
        .enumerate()
        .map(|(slot, e)| {
            let (a, rest) = e.split_at(lens[0]);
            let (b, c) = rest.split_at(lens[1]);
            (
                slot,
                ExpertBytes {
                    parts: [vec![a], vec![b], vec![c]],
                },
            )
        })
        .collect();
    be.write_experts(&buf, dtype, stack, shape, &writes)?;
    be.sync()?;
    let mut samples = Vec::with_capacity(reps.max(1));
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        be.write_experts(&buf, dtype, stack, shape, &writes)?;
        be.sync()?;
        samples.push(t.elapsed().as_secs_f64());
    }
    Ok(Upload {
        bytes: host.len() as u64,
        stats: Stats::of(&samples),
    })
}

/// A streaming kernel over `bytes` a call, rotating over `sets` buffers.
#[derive(Clone, Debug)]
pub struct SizedStream {
    /// `grid-stride` (the ceiling's) or `fixed` (8 loads a thread at once).
    pub kernel: &'static str,
    pub bytes: u64,
    pub sets: usize,
    pub stats: Stats,
}

/// GB/s of `bytes` moved in `s` seconds.
pub fn gbps(bytes: u64, s: f64) -> f64 {
    bytes as f64 / s / 1e9
}

impl SizedStream {
    pub fn gbps(&self) -> f64 {
        gbps(self.bytes, self.stats.median)
    }
}

impl Ceiling {
    pub fn gbps(&self) -> f64 {
        gbps(self.bytes, self.stats.median)
    }

    /// `gbps` as a percentage of this ceiling.
    pub fn pct(&self, gbps: f64) -> f64 {
        100.0 * gbps / self.gbps()
    }

    /// The streaming read at an op of `bytes`: the faster kernel at the
    /// smallest measured size at or above it. An op reads less than that
    /// stream, so its share of the stream's rate is a lower bound on how
    /// close it is to what one dispatch of its size can reach. `None` past
    /// the largest size (the ceiling itself is then the measure) and under
    /// an eighth of the smallest (the dispatch's fixed cost is all there is
    /// to see).
    pub fn stream_at(&self, bytes: u64) -> Option<&SizedStream> {
        let smallest = self.at_sizes.iter().map(|z| z.bytes).min()?;
        if bytes < smallest / 8 {
            return None;
        }
        let size = self
            .at_sizes
            .iter()
            .map(|z| z.bytes)
            .filter(|&b| b >= bytes)
            .min()?;
        self.at_sizes
            .iter()
            .filter(|z| z.bytes == size)
            .max_by(|a, b| a.gbps().total_cmp(&b.gbps()))
    }
}

/// Repetition budget of one case on one backend.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    /// Time to aim for over all repetitions of a case, in seconds.
    pub seconds: f64,
    pub min_reps: usize,
    pub max_reps: usize,
    /// Bytes one pass over all rotation sets should cover, and their cap.
    pub rotate_bytes: u64,
    pub max_sets: usize,
    /// Bytes of the ceiling's streamed buffer (clamped to what the device allows).
    pub ceiling_bytes: u64,
    /// Bytes a call of the streaming kernels also reads at op sizes
    /// ([`Ceiling::at_sizes`]).
    pub stream_sizes: &'static [u64],
    /// Time with the wall clock even where the GPU has timestamps.
    pub wall_clock: bool,
    /// Seconds of back-to-back calls before a case is timed, so the device
    /// is at its working clocks rather than idle ones.
    pub warmup_seconds: f64,
}

/// How a case's clock warm-up went, kept beside its figures so that a slow
/// reading can be laid against the clock log (`clocks.csv` on the H200):
/// when the timing began (UTC, milliseconds), the warm-up's seconds, and
/// whether two short samples agreed before its cap.
#[derive(Clone, Debug)]
pub struct WarmUp {
    pub timed_at: String,
    pub seconds: f64,
    pub settled: bool,
}

/// Clock warm-up before timing: calls of `f` back to back for at least
/// `seconds` (one call takes `once`), then on until two short timed samples
/// agree within 3% (at most 10x `seconds`). The H200 idles at 345 MHz and
/// under load ramps to 1980 MHz in anything from 0.2 s to several seconds
/// (clocks.csv in docs/bench/); a mid-size kernel timed before the ramp ends
/// reads 2-4x slow. The calls go in batches of about 20 ms with a wait after
/// each, so the device is busy the whole time.
fn warm_up<B: Bench>(
    b: &B,
    budget: &Budget,
    once: f64,
    f: &mut dyn FnMut(usize) -> Result<()>,
) -> Result<WarmUp> {
    let seconds = budget.warmup_seconds;
    let start = Instant::now();
    let done = |settled: bool| WarmUp {
        timed_at: super::clock::utc_now_ms(),
        seconds: start.elapsed().as_secs_f64(),
        settled,
    };
    if seconds <= 0.0 {
        return Ok(done(true));
    }
    let batch = ((0.02 / once.max(1e-7)) as usize).clamp(1, 2_000);
    let mut i = 0;
    let mut last: Option<f64> = None;
    loop {
        for _ in 0..batch {
            f(i)?;
            i += 1;
        }
        b.sync()?;
        let t = start.elapsed().as_secs_f64();
        if t < seconds {
            continue;
        }
        if t > 10.0 * seconds {
            return Ok(done(false));
        }
        let (mut v, _) = b.time(batch.clamp(10, 200), budget, &mut *f)?;
        v.sort_by(f64::total_cmp);
        let now = v[v.len() / 2];
        if last.is_some_and(|l| (now - l).abs() <= 0.03 * l) {
            return Ok(done(true));
        }
        last = Some(now);
    }
}

/// What the bench needs of a backend beyond [`ComputeBackend`].
pub trait Bench: ComputeBackend<Buffer: Clone> {
    /// `cpu` or `wgpu`.
    fn name(&self) -> &'static str;
    /// Seconds per call of each of `reps` calls of `f` (which records one
    /// op), and how they were taken.
    fn time(
        &self,
        reps: usize,
        budget: &Budget,
        f: &mut dyn FnMut(usize) -> Result<()>,
    ) -> Result<(Vec<f64>, &'static str)>;
    /// Stream a buffer larger than the caches; bytes read per second.
    fn ceiling(&self, budget: &Budget) -> Result<Ceiling>;
}

impl Bench for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn time(
        &self,
        reps: usize,
        _budget: &Budget,
        f: &mut dyn FnMut(usize) -> Result<()>,
    ) -> Result<(Vec<f64>, &'static str)> {
        let mut v = Vec::with_capacity(reps);
        for i in 0..reps {
            let t = Instant::now();
            f(i)?;
            self.sync()?;
            v.push(t.elapsed().as_secs_f64());
        }
        Ok((v, "wall clock per call"))
    }

    fn ceiling(&self, budget: &Budget) -> Result<Ceiling> {
        // The CPU reference runs on one thread, so its ceiling is one
        // thread's read bandwidth.
        let words = (budget.ceiling_bytes / 8) as usize;
        let buf: Vec<u64> = (0..words as u64)
            .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .collect();
        let read = || {
            let mut acc = [0u64; 8];
            for c in buf.chunks_exact(8) {
                for (a, x) in acc.iter_mut().zip(c) {
                    *a ^= *x;
                }
            }
            std::hint::black_box(acc);
        };
        read();
        let t = Instant::now();
        read();
        let reps = ((budget.seconds / t.elapsed().as_secs_f64().max(1e-9)) as usize)
            .clamp(3, budget.max_reps);
        let samples: Vec<f64> = (0..reps)
            .map(|_| {
                let t = Instant::now();
                read();
                t.elapsed().as_secs_f64()
            })
            .collect();
        Ok(Ceiling {
            bytes: words as u64 * 8,
            stats: Stats::of(&samples),
            method: "wall clock per pass",
            how: format!(
                "one thread folding {} MiB of u64 (the CPU reference is single-threaded)",
                (words * 8) >> 20
            ),
            at_sizes: Vec::new(),
            upload: upload(self),
        })
    }
}

impl Bench for WgpuBackend {
    fn name(&self) -> &'static str {
        "wgpu"
    }

    fn time(
        &self,
        reps: usize,
        budget: &Budget,
        f: &mut dyn FnMut(usize) -> Result<()>,
    ) -> Result<(Vec<f64>, &'static str)> {
        if !budget.wall_clock {
            if let Some(v) = self.time_ops(reps, &mut *f)? {
                return Ok((v, "gpu timestamps around a pass of consecutive calls"));
            }
        }
        // No timestamps: batches of calls in one submit, a blocking wait
        // around each; a sample is the batch's time over its calls.
        self.sync()?;
        let batches = reps.clamp(1, 10);
        let per = reps.div_ceil(batches);
        let mut v = Vec::with_capacity(batches);
        for b in 0..batches {
            let t = Instant::now();
            for j in 0..per {
                f(b * per + j)?;
            }
            self.sync()?;
            v.push(t.elapsed().as_secs_f64() / per as f64);
        }
        Ok((v, "wall clock over batched calls"))
    }

    fn ceiling(&self, budget: &Budget) -> Result<Ceiling> {
        let bytes = budget.ceiling_bytes.min(self.max_stream_bytes()) & !15;
        let words = (bytes / 4) as usize;
        let src = stream_buffer(self, words)?;
        let sink = self.alloc(DType::U32, 256, "bench sink")?;
        let (samples, method) = time_stream(self, budget, &[src], false, &sink)?;
        let mut at_sizes = Vec::new();
        // (best effort: a size the device cannot hold is left out, not the
        // ceiling every case is read against)
        for &size in budget.stream_sizes {
            match sized_streams(self, budget, size, &sink) {
                Ok(z) => at_sizes.extend(z),
                Err(e) => eprintln!("bench: the stream at {} MiB: {e}", size >> 20),
            }
        }
        Ok(Ceiling {
            bytes,
            stats: Stats::of(&samples),
            method,
            how: format!(
                "kernels/bench.wgsl stream_read: grid-stride vec4<u32> read of {} MiB",
                bytes >> 20
            ),
            at_sizes,
            upload: upload(self),
        })
    }
}

/// A u32 buffer of `words` filled with a pattern (zero pages could be
/// special-cased by a driver).
/// [`host_to_device`] over 5 writes, or None (said) where it fails: the
/// read ceiling stands without it.
fn upload<B: ComputeBackend>(be: &B) -> Option<Upload> {
    host_to_device(be, 5)
        .map_err(|e| eprintln!("bench: the host-to-device copy: {e}"))
        .ok()
}

fn stream_buffer(b: &WgpuBackend, words: usize) -> Result<WgpuBuffer> {
    let src = b.alloc(DType::U32, words, "bench stream")?;
    let chunk = (16usize << 20).min(words);
    let pattern: Vec<u32> = (0..chunk as u32)
        .map(|i| i.wrapping_mul(0x9E37_79B9))
        .collect();
    let mut off = 0;
    while off < words {
        let n = chunk.min(words - off);
        b.write_u32(&src, off, &pattern[..n])?;
        off += n;
    }
    Ok(src)
}

/// Both streaming kernels (the ceiling's grid-stride `stream_read`, then
/// `stream_read_fixed`) over `size` bytes a call, as an op is timed: calls
/// rotate over enough buffers to cover the budget's rotation bytes, so each
/// call reads from memory rather than cache. The two share the buffers and
/// the clock warm-up (the second follows the first at once).
fn sized_streams(
    b: &WgpuBackend,
    budget: &Budget,
    size: u64,
    sink: &WgpuBuffer,
) -> Result<[SizedStream; 2]> {
    let size = size.min(b.max_stream_bytes()).max(16) & !15;
    let sets = (budget.rotate_bytes.div_ceil(size) as usize).clamp(2, budget.max_sets.max(2));
    let bufs = (0..sets)
        .map(|_| stream_buffer(b, (size / 4) as usize))
        .collect::<Result<Vec<_>>>()?;
    let warm = Budget {
        warmup_seconds: 0.0,
        ..*budget
    };
    let timed = |fixed: bool, budget: &Budget| -> Result<SizedStream> {
        let (samples, _) = time_stream(b, budget, &bufs, fixed, sink)?;
        Ok(SizedStream {
            kernel: if fixed { "fixed" } else { "grid-stride" },
            bytes: size,
            sets,
            stats: Stats::of(&samples),
        })
    };
    Ok([timed(false, budget)?, timed(true, &warm)?])
}

/// Seconds per call of a streaming read (`stream_read`, or, `fixed`,
/// `stream_read_fixed`) rotating over `bufs`, timed as an op is: a clock
/// warm-up first, repetitions for the budget's seconds.
fn time_stream(
    b: &WgpuBackend,
    budget: &Budget,
    bufs: &[WgpuBuffer],
    fixed: bool,
    sink: &WgpuBuffer,
) -> Result<(Vec<f64>, &'static str)> {
    let mut call = |i: usize| {
        let src = &bufs[i % bufs.len()];
        if fixed {
            b.stream_read_fixed(src, sink)
        } else {
            b.stream_read(src, sink)
        }
    };
    call(0)?;
    b.sync()?;
    let t = Instant::now();
    for i in 0..bufs.len() {
        call(i)?;
    }
    b.sync()?;
    let once = t.elapsed().as_secs_f64() / bufs.len() as f64;
    let reps =
        ((budget.seconds / once.max(1e-9)) as usize).clamp(budget.min_reps.max(3), budget.max_reps);
    warm_up(b, budget, once, &mut call)?;
    b.time(reps, budget, &mut call)
}

/// The rotation sets' inputs (one list per set) and the one set of outputs
/// every call writes.
type Sets<Buf> = (Vec<Vec<Buf>>, Vec<Buf>);

/// Every rotation set's inputs on the device, and the outputs.
fn device_sets<B: Bench>(
    b: &B,
    op: &Op,
    host: &HostSets,
    max_sets: usize,
) -> Result<Sets<B::Buffer>> {
    let outputs = op
        .outputs()
        .iter()
        .filter_map(|o| match o {
            OutSpec::F32(n) => Some(b.alloc(DType::F32, *n, "out")),
            OutSpec::U32(n) => Some(b.alloc(DType::U32, *n, "out")),
            OutSpec::InPlace(..) => None,
        })
        .collect::<Result<Vec<_>>>()?;
    let first = host
        .first
        .iter()
        .enumerate()
        .map(|(i, t)| t.upload(b, &format!("set0 in{i}")))
        .collect::<Result<Vec<_>>>()?;
    let mut sets = vec![first];
    for (s, variants) in host
        .others
        .iter()
        .take(max_sets.saturating_sub(1))
        .enumerate()
    {
        let ins = variants
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                Variant::Share => Ok(sets[0][i].clone()),
                Variant::Copy => host.first[i].upload(b, &format!("set{} in{i}", s + 1)),
                Variant::Replace(t) => t.upload(b, &format!("set{} in{i}", s + 1)),
            })
            .collect::<Result<Vec<_>>>()?;
        sets.push(ins);
    }
    Ok((sets, outputs))
}

/// Whether a case will run on `b` without building its inputs.
pub fn precheck<B: Bench>(b: &B, case: &Case, cpu_all: bool) -> Option<Outcome> {
    if let Support::No(why) = b.supports(&case.op.kind()) {
        return Some(Outcome::Unsupported(why));
    }
    match case.cpu_skip {
        Some(why) if b.name() == "cpu" && !cpu_all => {
            Some(Outcome::Skipped(format!("{why}; --cpu-all runs it")))
        }
        _ => None,
    }
}

/// Time one case on one backend.
pub fn run_case<B: Bench>(b: &B, case: &Case, host: &HostSets, budget: &Budget) -> Outcome {
    let (sets, outs) = match device_sets(b, &case.op, host, budget.max_sets) {
        Ok(s) => s,
        Err(e) => return Outcome::Failed(format!("inputs: {e}")),
    };
    let n = sets.len();
    // Inputs rotate; every call writes the same outputs, so on a GPU
    // consecutive calls depend on each other as a decode step's do (a
    // dispatch waits for the one before it instead of overlapping it).
    let record = |i: usize| case.op.record(b, &sets[i % n], &outs);
    // Warm up (compiles pipelines), then size the repetitions from one call.
    let warm = (|| -> Result<f64> {
        record(0)?;
        b.sync()?;
        let t = Instant::now();
        record(1)?;
        b.sync()?;
        Ok(t.elapsed().as_secs_f64())
    })();
    let once = match warm {
        Ok(t) => t,
        Err(Error::Unsupported { reason, .. }) => return Outcome::Unsupported(reason),
        Err(e) => return Outcome::Failed(e.to_string()),
    };
    let reps = ((budget.seconds / once.max(1e-9)) as usize).clamp(budget.min_reps, budget.max_reps);
    let warm = match warm_up(b, budget, once, &mut |i| record(i)) {
        Ok(w) => w,
        Err(e) => return Outcome::Failed(e.to_string()),
    };
    match b.time(reps, budget, &mut |i| record(i + 2)) {
        Ok((samples, method)) => Outcome::Measured {
            stats: Stats::of(&samples),
            method,
            sets: n,
            warm,
        },
        Err(Error::Unsupported { reason, .. }) => Outcome::Unsupported(reason),
        Err(e) => Outcome::Failed(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ceiling_with(sizes: &[u64]) -> Ceiling {
        Ceiling {
            bytes: 1 << 30,
            stats: Stats::of(&[1e-3, 1e-3, 1e-3]),
            method: "test",
            how: String::new(),
            upload: None,
            at_sizes: sizes
                .iter()
                .map(|&b| SizedStream {
                    kernel: "grid-stride",
                    bytes: b,
                    sets: 2,
                    stats: Stats::of(&[1e-5, 1e-5, 1e-5]),
                })
                .collect(),
        }
    }

    /// An op is held to the smallest measured stream at least its size;
    /// none past the largest, under an eighth of the smallest, or where
    /// nothing was measured at op sizes (the CPU reference).
    #[test]
    fn stream_at_takes_the_next_size_up() {
        let mib = 1u64 << 20;
        let c = ceiling_with(&[32 * mib, 8 * mib, 64 * mib]);
        let at = |b: u64| c.stream_at(b).map(|z| z.bytes / mib);
        assert_eq!(at(31_753_000), Some(32));
        assert_eq!(at(32 * mib), Some(32));
        assert_eq!(at(32 * mib + 1), Some(64));
        assert_eq!(at(2 * mib), Some(8));
        assert_eq!(at(mib - 1), None);
        assert_eq!(at(64 * mib + 1), None);
        assert!(ceiling_with(&[]).stream_at(32 * mib).is_none());
        // Of two kernels at that size, the faster.
        let mut c = ceiling_with(&[32 * mib, 64 * mib]);
        c.at_sizes.push(SizedStream {
            kernel: "fixed",
            bytes: 32 * mib,
            sets: 2,
            stats: Stats::of(&[5e-6, 5e-6, 5e-6]),
        });
        assert_eq!(c.stream_at(20 * mib).map(|z| z.kernel), Some("fixed"));
        assert_eq!(c.stream_at(40 * mib).map(|z| z.kernel), Some("grid-stride"));
    }
}
