//! Argmax picks the first index of the largest value and never a NaN (a row
//! with nothing else gives `ops::NO_ARGMAX`), on both backends, including when equal maxima fall in different chunks of the GPU
//! kernel's two-phase reduction (the random parity inputs never tie).

mod common;

use turbospark::{ComputeBackend, DType, HostBytes};
use turbospark_cpu::CpuBackend;

fn rows() -> (Vec<f32>, usize, Vec<u32>) {
    let n = 9000;
    let mut v = Vec::new();
    let mut want = Vec::new();
    // Row 0: the max twice, far apart (different chunks): the first wins.
    let mut r: Vec<f32> = (0..n).map(|i| (i % 97) as f32 * 0.01).collect();
    r[6001] = 5.0;
    r[2500] = 5.0;
    want.push(2500);
    v.extend(&r);
    // Row 1: NaNs everywhere but never winning, the max at the very end.
    let mut r: Vec<f32> = (0..n)
        .map(|i| if i % 3 == 0 { f32::NAN } else { -1.0 })
        .collect();
    r[n - 1] = 2.0;
    want.push((n - 1) as u32);
    v.extend(&r);
    // Row 2: all equal: index 0.
    v.extend(std::iter::repeat_n(0.25f32, n));
    want.push(0);
    // Rows 3 and 4: every value NaN, every value NaN or -inf: no index
    // (the decoder reports non-finite logits instead of emitting id 0).
    v.extend(std::iter::repeat_n(f32::NAN, n));
    want.push(turbospark::ops::NO_ARGMAX);
    v.extend((0..n).map(|i| {
        if i % 2 == 0 {
            f32::NEG_INFINITY
        } else {
            f32::NAN
        }
    }));
    want.push(turbospark::ops::NO_ARGMAX);
    // Row 5: -inf everywhere but one value at the floor, which counts.
    let mut r = vec![f32::NEG_INFINITY; n];
    r[4321] = turbospark::ops::ARGMAX_FLOOR;
    want.push(4321);
    v.extend(&r);
    (v, n, want)
}

fn check<B: ComputeBackend>(b: &B) {
    let (v, n, want) = rows();
    let x = b
        .upload(DType::F32, HostBytes::Slice(bytemuck::cast_slice(&v)), "x")
        .unwrap();
    let out = b.alloc(DType::U32, want.len(), "arg").unwrap();
    b.argmax(&x, &out, want.len(), n).unwrap();
    assert_eq!(b.download_u32(&out).unwrap(), want);
}

#[test]
fn cpu_argmax_ties_and_nan() {
    check(&CpuBackend::new());
}

#[test]
fn wgpu_argmax_ties_and_nan() {
    if let Some(b) = common::wgpu_backend() {
        check(&b);
    }
}
