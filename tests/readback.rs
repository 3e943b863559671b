//! Reads begun without waiting return the data as it was when each began,
//! on both backends, with later work recorded in between (pipelined decode).

mod common;
#[path = "common/primitives_only.rs"]
mod primitives_only;

use turbospark::{ComputeBackend, DType, HostBytes};
use turbospark_cpu::CpuBackend;

fn check<B: ComputeBackend>(b: &B) {
    let v: Vec<u32> = (0..5).collect();
    let a = b
        .upload(DType::U32, HostBytes::Slice(bytemuck::cast_slice(&v)), "a")
        .unwrap();
    let first = b.begin_read_u32(&a).unwrap();
    b.write_u32(&a, 0, &[40, 41]).unwrap();
    let second = b.begin_read_u32(&a).unwrap();
    b.write_u32(&a, 3, &[93]).unwrap();
    let third = b.begin_read_u32(&a).unwrap();
    assert_eq!(b.finish_read_u32(second).unwrap(), vec![40, 41, 2, 3, 4]);
    assert_eq!(b.finish_read_u32(first).unwrap(), vec![0, 1, 2, 3, 4]);
    assert_eq!(b.finish_read_u32(third).unwrap(), vec![40, 41, 2, 93, 4]);
    // A ticket is used once.
    let again = b.begin_read_u32(&a).unwrap();
    let id = again.0;
    b.finish_read_u32(again).unwrap();
    let e = b.finish_read_u32(turbospark::ReadTicket(id)).unwrap_err();
    assert!(e.to_string().contains("ticket"), "{e}");
}

#[test]
fn cpu_reads_in_flight() {
    check(&CpuBackend::new());
}

#[test]
fn wgpu_reads_in_flight() {
    if let Some(b) = common::wgpu_backend() {
        check(&b);
    }
}

/// `download_f32_range` gives exactly the elements the whole download has
/// there, f32 and f16 (odd starts and ends inside a word included), and
/// refuses a range past the end by name.
fn check_ranges<B: ComputeBackend>(b: &B, seed: u64) {
    let mut rng = turbospark::rng::Rng::new(seed);
    let n = 37;
    let vals = rng.vec_normal(n, 3.0);
    let f16: Vec<u8> = vals
        .iter()
        .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
        .collect();
    for (dtype, bytes) in [
        (DType::F32, bytemuck::cast_slice(&vals).to_vec()),
        (DType::F16, f16),
    ] {
        let buf = b.upload(dtype, HostBytes::Slice(&bytes), "ranged").unwrap();
        let all = b.download_f32(&buf).unwrap();
        for _ in 0..40 {
            let start = rng.below(n as u64 + 1) as usize;
            let len = rng.below((n - start) as u64 + 1) as usize;
            let got = b.download_f32_range(&buf, start, len).unwrap();
            assert_eq!(
                got,
                all[start..start + len],
                "{dtype} elements {start}..+{len}, seed {seed}"
            );
        }
        for (start, len) in [(0, n + 1), (n, 1), (usize::MAX, 2)] {
            let e = b.download_f32_range(&buf, start, len).unwrap_err();
            assert!(e.to_string().contains("past the buffer"), "{e}");
        }
    }
}

fn seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(7, |d| d.as_nanos() as u64)
}

#[test]
fn cpu_reads_ranges() {
    check_ranges(&CpuBackend::new(), seed());
}

#[test]
fn default_body_reads_ranges() {
    check_ranges(&primitives_only::PrimitivesOnly::new(), seed());
}

#[test]
fn wgpu_reads_ranges() {
    if let Some(b) = common::wgpu_backend() {
        check_ranges(&b, seed());
    }
}
