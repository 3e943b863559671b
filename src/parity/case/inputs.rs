//! The random inputs several families draw alike: weights (plain,
//! quantized, expert stacks), norm weights, expert ids and KV caches.

use crate::backend::ExpertStack;
use crate::dtype::{encode_f32, kv_half};
use crate::parity::HostTensor;
use crate::rng::Rng;
use crate::DType;

/// A random KV cache of `kv`: f32 as drawn, or each value as an f16 cache
/// stores it (`kv_half`).
pub(super) fn cache_tensor(values: Vec<f32>, kv: DType) -> HostTensor {
    match kv {
        DType::F16 => HostTensor::F16(values.into_iter().map(kv_half).collect()),
        _ => HostTensor::F32(values),
    }
}

/// A case name's mark for f16 caches (f32 ones, the default, have none).
pub(super) fn kv_suffix(kv: DType) -> &'static str {
    if kv == DType::F16 {
        ",kv=f16"
    } else {
        ""
    }
}

/// An RMSNorm weight away from 1 (so a missing multiply shows).
pub(super) fn norm_weight(rng: &mut Rng, dtype: DType, dim: usize) -> HostTensor {
    HostTensor::Weight {
        dtype,
        rows: 1,
        cols: dim,
        bytes: encode_f32(dtype, &rng.vec_range(dim, 0.2, 1.8)),
        experts: None,
    }
}

/// A random weight; a quantized one is random values quantized by mlx's
/// rule (`quant::quantize`), so its scales take both signs as in real
/// checkpoints.
pub(super) fn weight(
    rng: &mut Rng,
    dtype: DType,
    rows: usize,
    cols: usize,
    std: f32,
) -> HostTensor {
    let v = rng.vec_normal(rows * cols, std);
    let bytes = match dtype {
        DType::Affine(a) => {
            let q = crate::quant::quantize(&v, a.bits, a.group as usize);
            let sd = a.scales.dtype();
            a.assemble(
                v.len(),
                bytemuck::cast_slice(&q.words),
                &encode_f32(sd, &q.scales),
                &encode_f32(sd, &q.biases),
            )
        }
        _ => encode_f32(dtype, &v),
    };
    HostTensor::Weight {
        dtype,
        rows,
        cols,
        bytes,
        experts: None,
    }
}

/// An MoE op's expert stack: `weight`, uploaded as experts (a backend may
/// store it in an order of its own).
pub(super) fn experts(
    rng: &mut Rng,
    dtype: DType,
    stack: ExpertStack,
    (rows, cols): (usize, usize),
    std: f32,
) -> HostTensor {
    let mut t = weight(rng, dtype, rows, cols, std);
    if let HostTensor::Weight { experts, .. } = &mut t {
        *experts = Some(stack);
    }
    t
}

/// `inputs` with its expert weight (input 1) a plain weight: the dense MLP
/// that decode runs as problem a of a pair op, uploaded as the decoder
/// uploads it.
pub(super) fn as_dense(mut inputs: Vec<HostTensor>) -> Vec<HostTensor> {
    if let HostTensor::Weight { experts, .. } = &mut inputs[1] {
        *experts = None;
    }
    inputs
}

/// Distinct expert ids per token.
pub(super) fn expert_ids(rng: &mut Rng, m: usize, k: usize, e: usize) -> Vec<u32> {
    let mut ids = Vec::with_capacity(m * k);
    for _ in 0..m {
        let mut chosen: Vec<u32> = Vec::new();
        while chosen.len() < k {
            let c = rng.below(e as u64) as u32;
            if !chosen.contains(&c) {
                chosen.push(c);
            }
        }
        ids.extend(chosen);
    }
    ids
}

/// `0..n` in a random order (Fisher-Yates).
pub(super) fn shuffled(rng: &mut Rng, n: usize) -> Vec<u32> {
    let mut v: Vec<u32> = (0..n as u32).collect();
    for i in (1..n).rev() {
        v.swap(i, rng.below(i as u64 + 1) as usize);
    }
    v
}
