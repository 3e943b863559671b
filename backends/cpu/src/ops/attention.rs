use turbospark::ops::{rope_inv_freq, Attention, KvAppend, Rope};
use turbospark::{Error, Result};

use super::dot;

/// NeoX RoPE in place: dim d pairs with d + D/2 and turns by
/// `pos * inv_freq[d]` (see `rope_inv_freq`) for d < rot_pairs (the exponent divides by the full
/// head_dim, also for Gemma 4's proportional RoPE); other dims pass through.
pub fn rope(x: &mut [f32], positions: &[u32], p: Rope) {
    let (d, half) = (p.head_dim, p.head_dim / 2);
    let inv_freq = rope_inv_freq(p.theta, d, p.rot_pairs);
    for t in 0..p.m {
        let pos = positions[t] as f32;
        for h in 0..p.heads {
            let v = &mut x[(t * p.heads + h) * d..(t * p.heads + h + 1) * d];
            for (i, f) in inv_freq.iter().enumerate() {
                let (s, c) = (pos * f).sin_cos();
                let (a, b) = (v[i], v[i + half]);
                v[i] = a * c - b * s;
                v[i + half] = b * c + a * s;
            }
        }
    }
}

/// Write `m` rows of `[kv_heads, head_dim]` into a `[kv_heads, capacity, head_dim]` cache.
pub fn kv_append(src: &[f32], cache: &mut [f32], positions: &[u32], p: KvAppend) {
    let d = p.head_dim;
    for t in 0..p.m {
        let slot = positions[t] as usize % p.capacity;
        for g in 0..p.kv_heads {
            let from = &src[(t * p.kv_heads + g) * d..(t * p.kv_heads + g + 1) * d];
            cache[(g * p.capacity + slot) * d..(g * p.capacity + slot + 1) * d]
                .copy_from_slice(from);
        }
    }
}

/// Softmax attention of each query over cached keys `lo..=pos` (see
/// `ComputeBackend::attention`). Errors when the window needs more keys than
/// the cache holds, rather than reading overwritten slots.
pub fn attention(
    q: &[f32],
    kc: &[f32],
    vc: &[f32],
    positions: &[u32],
    out: &mut [f32],
    p: Attention,
) -> Result<()> {
    let d = p.head_dim;
    let group = p.heads / p.kv_heads;
    let mut scores = Vec::new();
    for t in 0..p.m {
        let pos = positions[t] as usize;
        let lo = if p.window > 0 {
            (pos + 1).saturating_sub(p.window)
        } else {
            0
        };
        if pos + 1 - lo > p.capacity {
            return Err(Error::shape(
                "attention",
                format!(
                    "query at position {pos} needs {} keys but the cache holds {}",
                    pos + 1 - lo,
                    p.capacity
                ),
            ));
        }
        for h in 0..p.heads {
            let g = h / group;
            let qv = &q[(t * p.heads + h) * d..(t * p.heads + h + 1) * d];
            let key = |j: usize| (g * p.capacity + j % p.capacity) * d;
            scores.clear();
            scores.extend((lo..=pos).map(|j| p.scale * dot(qv, &kc[key(j)..key(j) + d])));
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0.0;
            for s in scores.iter_mut() {
                *s = (*s - max).exp();
                sum += *s;
            }
            let o = &mut out[(t * p.heads + h) * d..(t * p.heads + h + 1) * d];
            o.fill(0.0);
            for (s, j) in scores.iter().zip(lo..=pos) {
                let vv = &vc[key(j)..key(j) + d];
                for i in 0..d {
                    o[i] += s / sum * vv[i];
                }
            }
        }
    }
    Ok(())
}
