//! Bad calls are errors that name the op, the same on both backends.

mod common;

use turbospark::ops::{PostAttention, PostFfn};
use turbospark::{ComputeBackend, DType, Error, HostBytes};
use turbospark_cpu::CpuBackend;

fn bad_calls<B: ComputeBackend>(b: &B) {
    let v: Vec<f32> = (0..8).map(|i| i as f32 + 0.5).collect();
    let a = b
        .upload(DType::F32, HostBytes::Slice(bytemuck::cast_slice(&v)), "a")
        .unwrap();
    let c = b
        .upload(DType::F32, HostBytes::Slice(bytemuck::cast_slice(&v)), "c")
        .unwrap();
    // An output aliasing an input.
    let e = b.add(&a, &c, &a, 8).unwrap_err();
    assert!(
        matches!(&e, Error::Shape { op: "add", .. }) && e.to_string().contains("aliases"),
        "{e}"
    );
    // A buffer too short for the shape.
    let e = b.add(&a, &c, &c, 9).unwrap_err();
    assert!(
        matches!(&e, Error::Shape { op: "add", .. }) && e.to_string().contains("needs 9"),
        "{e}"
    );
    // A dtype the op does not take.
    let ids = b.alloc(DType::U32, 8, "ids").unwrap();
    let e = b.scale(&ids, &c, 8, 2.0).unwrap_err();
    assert!(e.to_string().contains("dtype u32"), "{e}");
    // Fused ops: two outputs that are one buffer, an output over an input.
    let w = b
        .upload(DType::F32, HostBytes::Slice(bytemuck::cast_slice(&v)), "w")
        .unwrap();
    let out = b.alloc(DType::F32, 8, "out").unwrap();
    let p = PostAttention {
        rows: 1,
        dim: 8,
        eps: 1e-6,
    };
    let e = b
        .post_attention(&a, &c, &w, &w, &out, &out, None, p)
        .unwrap_err();
    assert!(
        matches!(
            &e,
            Error::Shape {
                op: "post_attention",
                ..
            }
        ) && e.to_string().contains("aliases"),
        "{e}"
    );
    let p = PostFfn {
        rows: 1,
        dim: 8,
        eps: 1e-6,
        scale: 1.0,
    };
    let e = b.post_ffn(&a, &w, None, &c, &c, None, p).unwrap_err();
    assert!(
        matches!(&e, Error::Shape { op: "post_ffn", .. }) && e.to_string().contains("aliases"),
        "{e}"
    );
}

#[test]
fn cpu_rejects_bad_calls() {
    bad_calls(&CpuBackend::new());
}

#[test]
fn wgpu_rejects_bad_calls() {
    if let Some(b) = common::wgpu_backend() {
        bad_calls(&b);
    }
}
