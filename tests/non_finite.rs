//! A model that computes NaN logits is an error, not a run of id 0: greedy
//! generation (the device's argmax finds no candidate) and sampling (the
//! host's check of the row) both say so, on both backends.

mod common;

use std::sync::Arc;

use turbospark::model::synthetic::tiny_config;
use turbospark::model::{
    GenerateOptions, ModelConfig, ModelOptions, OneSequence, Sampling, SyntheticSource, TensorRef,
    TensorSource,
};
use turbospark::{ComputeBackend, DType, Error, HostBytes};
use turbospark_cpu::CpuBackend;

/// The tiny synthetic model with every final-norm weight NaN.
struct NanFinalNorm(SyntheticSource);

impl TensorSource for NanFinalNorm {
    fn config(&self) -> &ModelConfig {
        self.0.config()
    }
    fn tensor(&self, name: &str) -> turbospark::Result<TensorRef> {
        let mut t = self.0.tensor(name)?;
        if name == "norm.weight" {
            let n: usize = t.shape.iter().product();
            let bytes = turbospark::dtype::encode_f32(DType::BF16, &vec![f32::NAN; n]);
            t.dtype = DType::BF16;
            t.bytes = HostBytes::Owned(Arc::new(bytes));
        }
        Ok(t)
    }
}

fn check<B: ComputeBackend>(backend: B) {
    let src = NanFinalNorm(SyntheticSource::new(tiny_config(), 5).unwrap());
    let opts = ModelOptions {
        max_context: 64,
        ..Default::default()
    };
    let mut m = OneSequence::load(backend, &src, opts).unwrap();
    for sampling in [
        Sampling::Greedy,
        Sampling::Random {
            temperature: 0.8,
            top_k: None,
            top_p: None,
            min_p: None,
            repetition_penalty: None,
            seed: 3,
        },
    ] {
        m.reset();
        let g = GenerateOptions {
            max_new_tokens: 4,
            sampling,
            stop_at_eos: false,
        };
        match m.generate(&[1, 2, 3], &g) {
            Err(Error::NonFinite(why)) => assert!(why.contains("NaN"), "{why}"),
            other => panic!("NaN logits gave {other:?}"),
        }
    }
}

#[test]
fn cpu_nan_logits_are_an_error() {
    check(CpuBackend::new());
}

#[test]
fn wgpu_nan_logits_are_an_error() {
    if let Some(b) = common::wgpu_backend() {
        check(b);
    }
}
