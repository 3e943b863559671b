//! The parity harness: every op of a device backend against the CPU
//! reference, in the spirit of llama.cpp's `test-backend-ops`.
//!
//! For each case: fresh seeded random inputs (never zeros), outputs poisoned
//! with NaN (u32 outputs with `u32::MAX`) before the run, a guard region past
//! every output checked afterwards, a NaN/Inf check, then a per-op metric
//! (NMSE against a limit as tight as the arithmetic allows; router outputs
//! compared as expert sets plus sorted weights, with ties handled).
//! Written generic over two backends, so `cargo test` (tests/parity.rs) and
//! the side-by-side tool (`cargo run --release --example parity`) run the
//! same code.

pub mod case;
mod cases;
mod compare;
mod quantized_cases;

pub use case::{
    rounded_attention_nmse, Case, Op, AFFINE_F16_NMSE, AFFINE_SPLIT_NMSE, F16_INPUT_NMSE,
    F16_PROBABILITY_NMSE, SPLIT_INPUT_NMSE,
};
pub use cases::{all_cases, ci_cases};
pub use compare::{nmse, Verdict};

use crate::backend::{ComputeBackend, ExpertStack, Support};
use crate::rng::Rng;
use crate::{DType, HostBytes, Result};

/// Elements of poison after every output, checked after the run.
pub const GUARD: usize = 1024;

/// How a case ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Status {
    Pass,
    Fail(String),
    /// The device backend reports the case unsupported: a distinct status.
    Unsupported(String),
}

/// The result of one case.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub name: String,
    pub family: &'static str,
    pub seed: u64,
    pub status: Status,
    /// Largest NMSE over the case's outputs (0 for exact comparisons).
    pub nmse: f64,
    pub limit: f64,
}

impl Outcome {
    pub fn passed(&self) -> bool {
        self.status == Status::Pass
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.status {
            Status::Pass => write!(
                f,
                "ok   {} nmse={:.3e} (limit {:.0e})",
                self.name, self.nmse, self.limit
            ),
            Status::Fail(m) => write!(f, "FAIL {} (seed {}): {m}", self.name, self.seed),
            Status::Unsupported(m) => write!(f, "not supported {}: {m}", self.name),
        }
    }
}

/// A host tensor: an input to upload, or an output read back.
#[derive(Clone, Debug)]
pub enum HostTensor {
    F32(Vec<f32>),
    /// An f16 KV cache.
    F16(Vec<half::f16>),
    U32(Vec<u32>),
    /// A weight in its stored dtype (`values` are exactly the decoded bytes).
    Weight {
        dtype: DType,
        rows: usize,
        cols: usize,
        bytes: Vec<u8>,
        /// An MoE op's expert stack (uploaded through `upload_experts`,
        /// which a backend may reorder), else None.
        experts: Option<ExpertStack>,
    },
}

/// What an output is, for allocation and comparison.
#[derive(Clone, Debug)]
pub enum OutSpec {
    /// A fresh buffer of `len` f32, poisoned before the run.
    F32(usize),
    /// A fresh buffer of `len` u32, poisoned before the run.
    U32(usize),
    /// Input number `i` (f32, or an f16 cache; `len` elements) modified in
    /// place, read back as f32.
    InPlace(usize, usize),
}

impl OutSpec {
    /// Bytes the output writes, at four an element (an in-place one: its
    /// whole span).
    pub fn bytes(&self) -> u64 {
        match self {
            OutSpec::F32(n) | OutSpec::U32(n) | OutSpec::InPlace(_, n) => *n as u64 * 4,
        }
    }
}

impl HostTensor {
    /// Its size as uploaded, in bytes.
    pub fn bytes(&self) -> u64 {
        match self {
            HostTensor::F32(v) => v.len() as u64 * 4,
            HostTensor::U32(v) => v.len() as u64 * 4,
            HostTensor::F16(v) => v.len() as u64 * 2,
            HostTensor::Weight { bytes, .. } => bytes.len() as u64,
        }
    }

    /// Upload to a backend as it is (weights through `upload_weight`,
    /// expert stacks through `upload_experts`).
    pub fn upload<B: ComputeBackend>(&self, b: &B, label: &str) -> Result<B::Buffer> {
        match self {
            HostTensor::F32(v) => {
                b.upload(DType::F32, HostBytes::Slice(bytemuck::cast_slice(v)), label)
            }
            HostTensor::F16(v) => {
                b.upload(DType::F16, HostBytes::Slice(bytemuck::cast_slice(v)), label)
            }
            HostTensor::U32(v) => {
                b.upload(DType::U32, HostBytes::Slice(bytemuck::cast_slice(v)), label)
            }
            HostTensor::Weight {
                dtype,
                rows,
                cols,
                bytes,
                experts,
            } => {
                let bytes = HostBytes::Slice(bytes);
                match experts {
                    None => b.upload_weight(*dtype, *rows, *cols, bytes, label),
                    Some(stack) => b.upload_experts(*dtype, *stack, (*rows, *cols), bytes, label),
                }
            }
        }
    }
}

/// Upload an input; an in-place one gets a poisoned guard region after it.
fn upload<B: ComputeBackend>(b: &B, t: &HostTensor, guard: bool, label: &str) -> Result<B::Buffer> {
    match t {
        HostTensor::F32(v) if guard => {
            let mut w = v.clone();
            w.extend(std::iter::repeat_n(f32::NAN, GUARD));
            HostTensor::F32(w).upload(b, label)
        }
        HostTensor::F16(v) if guard => {
            let mut w = v.clone();
            w.extend(std::iter::repeat_n(half::f16::NAN, GUARD));
            HostTensor::F16(w).upload(b, label)
        }
        _ => t.upload(b, label),
    }
}

/// Run `op` on one backend with the given inputs (outputs poisoned with NaN
/// first); returns every output with its guard region still attached. For
/// tests that judge the outputs themselves.
pub fn run_on<B: ComputeBackend, C: Case + ?Sized>(
    b: &B,
    op: &C,
    inputs: &[HostTensor],
) -> Result<Vec<HostTensor>> {
    let outs = op.outputs();
    let in_place: Vec<usize> = outs
        .iter()
        .filter_map(|o| {
            if let OutSpec::InPlace(i, _) = o {
                Some(*i)
            } else {
                None
            }
        })
        .collect();
    let ins = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| upload(b, t, in_place.contains(&i), &format!("input{i}")))
        .collect::<Result<Vec<_>>>()?;
    let mut fresh = Vec::new();
    for (i, o) in outs.iter().enumerate() {
        match o {
            OutSpec::F32(n) => {
                let buf = b.alloc(DType::F32, n + GUARD, &format!("output{i}"))?;
                b.write_f32(&buf, 0, &vec![f32::NAN; n + GUARD])?;
                fresh.push(buf);
            }
            OutSpec::U32(n) => {
                let buf = b.alloc(DType::U32, n + GUARD, &format!("output{i}"))?;
                b.write_u32(&buf, 0, &vec![u32::MAX; n + GUARD])?;
                fresh.push(buf);
            }
            OutSpec::InPlace(..) => {}
        }
    }
    op.record(b, &ins, &fresh)?;
    b.sync()?;
    let mut fresh_iter = fresh.iter();
    outs.iter()
        .map(|o| match o {
            OutSpec::F32(_) => Ok(HostTensor::F32(
                b.download_f32(fresh_iter.next().expect("one buffer per output"))?,
            )),
            OutSpec::U32(_) => Ok(HostTensor::U32(
                b.download_u32(fresh_iter.next().expect("one buffer per output"))?,
            )),
            OutSpec::InPlace(i, _) => Ok(HostTensor::F32(b.download_f32(&ins[*i])?)),
        })
        .collect()
}

/// Run one case on both backends with inputs from `seed` and judge it.
pub fn run_case<R: ComputeBackend, D: ComputeBackend, C: Case + ?Sized>(
    reference: &R,
    device: &D,
    op: &C,
    seed: u64,
) -> Outcome {
    let name = op.name();
    let mut out = Outcome {
        name,
        family: op.family(),
        seed,
        status: Status::Pass,
        nmse: 0.0,
        limit: op.limit_on(device),
    };
    if let Support::No(why) = device.supports(&op.kind()) {
        out.status = Status::Unsupported(why);
        return out;
    }
    let inputs = op.inputs(&mut Rng::new(seed));
    let r = match run_on(reference, op, &inputs) {
        Ok(r) => r,
        Err(e) => {
            out.status = Status::Fail(format!("reference backend failed: {e}"));
            return out;
        }
    };
    let d = match run_on(device, op, &inputs) {
        Ok(d) => d,
        Err(crate::Error::Unsupported { reason, .. }) => {
            out.status = Status::Unsupported(reason);
            return out;
        }
        Err(e) => {
            out.status = Status::Fail(format!("device backend failed: {e}"));
            return out;
        }
    };
    let mut r = r;
    if let Some((j, again, on)) = op.on_device_outputs(&inputs, &d) {
        match run_on(reference, &again, &on) {
            Ok(mut o) => r[j] = o.swap_remove(0),
            Err(e) => {
                out.status = Status::Fail(format!("reference backend failed: {e}"));
                return out;
            }
        }
    }
    match case::judge(op, out.limit, &inputs, &r, &d) {
        Ok(nmse) => out.nmse = nmse,
        Err((nmse, msg)) => {
            out.nmse = nmse;
            out.status = Status::Fail(msg);
        }
    }
    out
}

/// Run every case whose name contains `filter` (all when empty); the seed
/// of case i is `base_seed + i`.
pub fn run_cases<R: ComputeBackend, D: ComputeBackend, C: Case>(
    reference: &R,
    device: &D,
    cases: &[C],
    filter: &str,
    base_seed: u64,
    mut each: impl FnMut(&Outcome),
) -> Vec<Outcome> {
    cases
        .iter()
        .enumerate()
        .filter(|(_, c)| filter.is_empty() || c.name().contains(filter))
        .map(|(i, c)| {
            let o = run_case(reference, device, c, base_seed.wrapping_add(i as u64));
            each(&o);
            o
        })
        .collect()
}

/// A seed for this run: `TURBOSPARK_SEED` when set (to replay a failure),
/// else fresh from the clock.
pub fn seed_from_env() -> u64 {
    std::env::var("TURBOSPARK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0x5eed)
        })
}
