//! Reads begun without waiting return the data as it was when each began,
//! on both backends, with later work recorded in between (pipelined decode).

mod common;

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
