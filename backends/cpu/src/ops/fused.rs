//! The fused decoder steps, written as the unfused reference ops they stand
//! for, in the same order (so the GPU's one-kernel versions are checked
//! against exactly the arithmetic of the separate steps).

use turbospark::ops::{KvAppend, PostAttention, PostFfn, QkvPost, RmsNorm, Rope};

use super::{kv_append, rms_norm, rope, CacheElem, Weights};

/// `r = x + rmsnorm(o) * w_post`, `ff = rmsnorm(r) * w_ff`, and
/// `moe.1 = rmsnorm(r) * moe.0` when given.
#[allow(clippy::too_many_arguments)]
pub fn post_attention(
    o: &[f32],
    x: &[f32],
    w_post: &Weights<'_>,
    w_ff: &Weights<'_>,
    r: &mut [f32],
    ff: &mut [f32],
    moe: Option<(&Weights<'_>, &mut [f32])>,
    p: PostAttention,
) {
    let n = p.norm();
    rms_norm(o, Some(w_post), Some(x), r, n);
    rms_norm(r, Some(w_ff), None, ff, n);
    if let Some((w, out)) = moe {
        rms_norm(r, Some(w), None, out, n);
    }
}

/// See [`PostFfn`].
#[allow(clippy::too_many_arguments)]
pub fn post_ffn(
    dense: &[f32],
    w_dense: &Weights<'_>,
    moe: Option<(&[f32], &Weights<'_>, &Weights<'_>)>,
    r: &[f32],
    x: &mut [f32],
    next: Option<(&Weights<'_>, &mut [f32])>,
    p: PostFfn,
) {
    let len = p.rows * p.dim;
    let n = p.norm();
    // The branch's last norm takes the residual and the layer scalar:
    // x = (r + rmsnorm(..) * w) * scale.
    let last = RmsNorm {
        scale: p.scale,
        ..n
    };
    match moe {
        Some((e, w_moe, w_sum)) => {
            // dense norm, + rmsnorm(e) * w_moe, then the sum's norm
            let mut h = vec![0.0f32; len];
            rms_norm(dense, Some(w_dense), None, &mut h, n);
            let mut sum = vec![0.0f32; len];
            rms_norm(e, Some(w_moe), Some(&h), &mut sum, n);
            rms_norm(&sum, Some(w_sum), Some(r), x, last);
        }
        None => rms_norm(dense, Some(w_dense), Some(r), x, last),
    }
    if let Some((w, normed)) = next {
        rms_norm(x, Some(w), None, normed, n);
    }
}

/// See [`QkvPost`]: the per-head norms, RoPE and cache append of the raw
/// q|k|v rows.
#[allow(clippy::too_many_arguments)]
pub fn qkv_post<T: CacheElem>(
    raw: &[f32],
    w_q: &Weights<'_>,
    w_k: &Weights<'_>,
    positions: &[u32],
    q: &mut [f32],
    k_cache: &mut [T],
    v_cache: &mut [T],
    p: QkvPost,
) {
    let (d, row) = (p.head_dim, p.raw_row());
    let (qd, kd) = (p.heads * d, p.kv_heads * d);
    let take = |off: usize, len: usize| -> Vec<f32> {
        (0..p.m)
            .flat_map(|t| raw[t * row + off..t * row + off + len].iter().copied())
            .collect()
    };
    let (q_raw, k_raw) = (take(0, qd), take(qd, kd));
    let v_raw = if p.v_from_k {
        k_raw.clone()
    } else {
        take(qd + kd, kd)
    };
    let rope_p = |heads| Rope {
        m: p.m,
        heads,
        head_dim: d,
        rot_pairs: p.rot_pairs,
        theta: p.theta,
    };
    rms_norm(
        &q_raw,
        Some(w_q),
        None,
        q,
        RmsNorm::unscaled(p.m * p.heads, d, p.eps),
    );
    rope(q, positions, rope_p(p.heads));
    let mut k = vec![0.0f32; p.m * kd];
    let mut v = vec![0.0f32; p.m * kd];
    rms_norm(
        &k_raw,
        Some(w_k),
        None,
        &mut k,
        RmsNorm::unscaled(p.m * p.kv_heads, d, p.eps),
    );
    rope(&mut k, positions, rope_p(p.kv_heads));
    rms_norm(
        &v_raw,
        None,
        None,
        &mut v,
        RmsNorm::unscaled(p.m * p.kv_heads, d, p.eps),
    );
    let kv = KvAppend {
        m: p.m,
        kv_heads: p.kv_heads,
        head_dim: d,
        capacity: p.capacity,
    };
    kv_append(&k, k_cache, positions, kv);
    kv_append(&v, v_cache, positions, kv);
}
