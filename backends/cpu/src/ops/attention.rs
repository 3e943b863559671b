use turbospark::ops::{rope_inv_freq, Attention, KvAppend, Rope};
use turbospark::{Error, Result};

use std::borrow::Cow;

use super::{dot, f16_rows, to_f16_if, Rounding};

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

/// A KV cache's element: f32, or f16 as `turbospark::dtype::kv_half`
/// rounds it.
pub trait CacheElem: Copy {
    fn store(x: f32) -> Self;
}

impl CacheElem for f32 {
    fn store(x: f32) -> f32 {
        x
    }
}

impl CacheElem for half::f16 {
    fn store(x: f32) -> half::f16 {
        turbospark::dtype::kv_half(x)
    }
}

/// Write `m` rows of `[kv_heads, head_dim]` into a `[kv_heads, capacity, head_dim]` cache.
pub fn kv_append<T: CacheElem>(src: &[f32], cache: &mut [T], positions: &[u32], p: KvAppend) {
    let d = p.head_dim;
    for t in 0..p.m {
        let slot = positions[t] as usize % p.capacity;
        for g in 0..p.kv_heads {
            let from = &src[(t * p.kv_heads + g) * d..(t * p.kv_heads + g + 1) * d];
            let to = &mut cache[(g * p.capacity + slot) * d..(g * p.capacity + slot + 1) * d];
            for (c, &x) in to.iter_mut().zip(from) {
                *c = T::store(x);
            }
        }
    }
}

/// Softmax attention of each query over cached keys `lo..=pos` (see
/// `ComputeBackend::attention`). Errors when the window needs more keys than
/// the cache holds, rather than reading overwritten slots.
///
/// `r`: as a tensor-core backend computes it (`turbospark::GemmRounding`,
/// kernels/attention_coop.wgsl). [`Rounding::Half`]: queries and keys
/// rounded to f16 by row with the GEMM's power-of-two scale ([`f16_rows`]),
/// values by `f16_value_rows` (below), and each probability (times its
/// value row's factor) rounded to f16 before it multiplies; the sums stay
/// f32. [`Rounding::Split`]: each of those values split instead into
/// `hi = f16(v)` and `lo = f16(v - hi)` (subnormals kept) and each product
/// taken as three, `hi hi' + hi lo' + lo hi'` (the matrix units' `lo lo'`,
/// at most 2^-22 of the product, is left out, as the kernel leaves it).
pub fn attention(
    q: &[f32],
    kc: &[f32],
    vc: &[f32],
    positions: &[u32],
    out: &mut [f32],
    p: Attention,
    r: Rounding,
) -> Result<()> {
    let d = p.head_dim;
    let group = p.heads / p.kv_heads;
    let split = r == Rounding::Split;
    let (q, ql) = split_rows(q, d, r);
    let (kc, kl) = split_rows(kc, d, r);
    let (vc, vl, vfac) = if r.rounds() {
        let (v, f) = f16_value_rows(vc, d, r);
        let (vh, vl) = v.iter().map(|&x| parts(x, r)).unzip();
        (Cow::Owned(vh), vl, Some(f))
    } else {
        (Cow::Borrowed(vc), Vec::new(), None)
    };
    let mut scores = Vec::new();
    for (t, &pos) in positions.iter().enumerate().take(p.m) {
        let pos = pos as usize;
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
            let qi = (t * p.heads + h) * d..(t * p.heads + h + 1) * d;
            let row = |j: usize| g * p.capacity + j % p.capacity;
            let ki = |j: usize| row(j) * d..(row(j) + 1) * d;
            scores.clear();
            if split {
                scores.extend((lo..=pos).map(|j| {
                    p.scale * dot3(&q[qi.clone()], &ql[qi.clone()], &kc[ki(j)], &kl[ki(j)])
                }));
            } else {
                scores.extend((lo..=pos).map(|j| p.scale * dot(&q[qi.clone()], &kc[ki(j)])));
            }
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0.0;
            for s in scores.iter_mut() {
                *s = (*s - max).exp();
                sum += *s;
            }
            let o = &mut out[qi.clone()];
            o.fill(0.0);
            for (s, j) in scores.iter().zip(lo..=pos) {
                let (w, wl) = parts(s / sum * vfac.as_ref().map_or(1.0, |f| f[row(j)]), r);
                let vv = &vc[ki(j)];
                if split {
                    let vlo = &vl[ki(j)];
                    for i in 0..d {
                        o[i] += w * vv[i] + w * vlo[i] + wl * vv[i];
                    }
                } else {
                    for i in 0..d {
                        o[i] += w * vv[i];
                    }
                }
            }
        }
    }
    Ok(())
}

/// `v` as the two f16 parts a product under `r` takes it: `(hi, lo)` for
/// [`Rounding::Split`] (`hi = f16(v)`, `lo = f16(v - hi)`, subnormals kept,
/// as kernels/f16_round.wgsl's half_grid rounds), `(f16(v), 0)` for
/// [`Rounding::Half`], `(v, 0)` for f32.
fn parts(v: f32, r: Rounding) -> (f32, f32) {
    match r {
        Rounding::Split => {
            let hi = to_f16_if(v, true);
            if !hi.is_finite() {
                return (hi, 0.0);
            }
            (hi, to_f16_if(v - hi, true))
        }
        _ => (r.apply(v), 0.0),
    }
}

/// Rows of `d` rounded as [`f16_rows`] rounds them, as the parts
/// ([`parts`]) with the row's scale taken off: `(hi, lo)`, `lo` empty but
/// for [`Rounding::Split`].
fn split_rows(x: &[f32], d: usize, r: Rounding) -> (Cow<'_, [f32]>, Vec<f32>) {
    if r != Rounding::Split {
        return (f16_rows(x, d, r), Vec::new());
    }
    let (mut hi, mut lo) = (Vec::with_capacity(x.len()), Vec::with_capacity(x.len()));
    for row in x.chunks(d) {
        let (s, inv) = turbospark::dtype::f16_row_scale(row);
        for v in row {
            let (h, l) = parts(v * s, r);
            hi.push(h * inv);
            lo.push(l * inv);
        }
    }
    (Cow::Owned(hi), lo)
}

/// `sum(ah bh + ah bl + al bh)` in f32: a split product's three terms.
#[inline]
fn dot3(ah: &[f32], al: &[f32], bh: &[f32], bl: &[f32]) -> f32 {
    let mut s = 0.0;
    for i in 0..ah.len() {
        s += ah[i] * bh[i] + ah[i] * bl[i] + al[i] * bh[i];
    }
    s
}

/// Value rows of `d` as the tensor-core attention takes them under `r`
/// (before they are rounded or split, [`parts`]): a row whose largest |v|
/// is below 2^15 as it is; a larger one first scaled down by the power of
/// two that puts its largest in [2^14, 2^15) (kept scaled). Returns the
/// rows, rounded once for [`Rounding::Half`], and each row's factor (1, or
/// the inverse of its scale), which multiplies the probabilities of that
/// row instead.
pub fn f16_value_rows(v: &[f32], d: usize, r: Rounding) -> (Vec<f32>, Vec<f32>) {
    let mut out = Vec::with_capacity(v.len());
    let mut fac = Vec::with_capacity(v.len() / d);
    let once = if r == Rounding::Half {
        r
    } else {
        Rounding::F32
    };
    for row in v.chunks(d) {
        let (s, inv) = turbospark::dtype::f16_row_scale(row);
        // (s < 1 exactly when the largest |v| is 2^15 or more)
        let (s, inv) = if s < 1.0 { (s, inv) } else { (1.0, 1.0) };
        out.extend(row.iter().map(|x| once.apply(x * s)));
        fac.push(inv);
    }
    (out, fac)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows below 2^15 round as they are (factor 1); a larger row is scaled
    /// down by a power of two to [2^14, 2^15) and its factor undoes it.
    #[test]
    fn value_rows_scale_down_only_past_f16s_range() {
        let v = [1.0f32, -0.3, 2.5e-3, 7.0, 40000.0, -1.5, 3.0e5, 0.25];
        let (r, f) = f16_value_rows(&v, 4, Rounding::Half);
        assert_eq!(f, vec![1.0, 16.0]);
        for (a, b) in r[..4].iter().zip(&v[..4]) {
            assert_eq!(*a, half::f16::from_f32(*b).to_f32());
        }
        for (a, b) in r[4..].iter().zip(&v[4..]) {
            assert!(
                (a * 16.0 - b).abs() <= b.abs() * 1e-3,
                "{a} * 16 against {b}"
            );
            assert!(a.abs() < 32768.0);
        }
    }

    /// `turbospark::parity::F16_PROBABILITY_NMSE` bounds what f32 reduction
    /// order alone does to the rounded arithmetic: the same attention with
    /// each head's dims in another order (the dot products equal in exact
    /// arithmetic, summed in another f32 order; each row's scale unchanged)
    /// at the parity case the H200 measured at 2.3e-9 (head_dim 512, 8 query
    /// heads per kv head, the parity suite's input sizes). The unrounded
    /// arithmetic sits far below it: the rounding's flips are what the limit
    /// allows for.
    #[test]
    fn reduction_order_moves_rounded_attention_within_its_limit() {
        let p = Attention {
            m: 40,
            heads: 16,
            kv_heads: 2,
            head_dim: 512,
            capacity: 2048,
            window: 0,
            scale: 1.0,
            precision: turbospark::Precision::Exact,
        };
        let d = p.head_dim;
        let cache = p.capacity * p.kv_heads * d;
        let mut rng = turbospark::rng::Rng::new(7);
        let q = rng.vec_normal(p.m * p.heads * d, 0.25);
        let k = rng.vec_normal(cache, 0.25);
        let v = rng.vec_normal(cache, 1.0);
        let pos: Vec<u32> = (100..140).collect();
        // Each head's dims reversed in q and k (v and the output keep theirs).
        let rev =
            |x: &[f32]| -> Vec<f32> { x.chunks(d).flat_map(|r| r.iter().rev().copied()).collect() };
        let nmse = |r: Rounding| {
            let mut a = vec![0.0; q.len()];
            let mut b = vec![0.0; q.len()];
            attention(&q, &k, &v, &pos, &mut a, p, r).unwrap();
            attention(&rev(&q), &rev(&k), &v, &pos, &mut b, p, r).unwrap();
            turbospark::parity::nmse(&a, &b)
        };
        let (plain, rounded) = (nmse(Rounding::F32), nmse(Rounding::Half));
        let limit = turbospark::parity::F16_PROBABILITY_NMSE;
        assert!(rounded < limit, "rounded: NMSE {rounded:e} over {limit:e}");
        assert!(plain < rounded / 10.0, "f32 {plain:e}, rounded {rounded:e}");
        // Split, the order moves it as little as f32's own (1e-9, the
        // limit of the unrounded kernel): no probability flips an f16 step.
        let split = nmse(Rounding::Split);
        assert!(split < 1e-9, "split: NMSE {split:e}");
    }

    /// The tensor-core rounding moves attention by about f16's precision and
    /// no more: against f32 on random inputs (scores of size about 1), with
    /// and without value rows past f16's range, its NMSE sits between 1e-9
    /// and 1e-5.
    #[test]
    fn rounded_attention_stays_near_f32() {
        let p = Attention {
            m: 9,
            heads: 4,
            kv_heads: 2,
            head_dim: 32,
            capacity: 40,
            window: 0,
            scale: 1.0,
            precision: turbospark::Precision::Exact,
        };
        let mut s = 12345u32;
        let mut rnd = || {
            s = s.wrapping_mul(1664525).wrapping_add(1013904223);
            (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        };
        let q: Vec<f32> = (0..p.m * p.heads * 32).map(|_| rnd()).collect();
        let k: Vec<f32> = (0..2 * 40 * 32).map(|_| rnd()).collect();
        let v: Vec<f32> = (0..2 * 40 * 32).map(|_| rnd()).collect();
        let pos: Vec<u32> = (20..29).collect();
        // Also with value rows past f16's range (scaled down, their
        // probabilities up): the same closeness.
        let mut big = v.clone();
        for row in big.chunks_mut(32).step_by(3) {
            row.iter_mut().for_each(|x| *x *= 262144.0);
        }
        for v in [&v, &big] {
            let mut exact = vec![0.0; q.len()];
            let mut rounded = vec![0.0; q.len()];
            attention(&q, &k, v, &pos, &mut exact, p, Rounding::F32).unwrap();
            attention(&q, &k, v, &pos, &mut rounded, p, Rounding::Half).unwrap();
            let nmse = turbospark::parity::nmse(&exact, &rounded);
            assert!(nmse > 1e-9 && nmse < 1e-5, "NMSE {nmse:e}");
        }
    }

    /// Split attention sits at the f32 floor: against f32 on the same
    /// inputs as the rounded test above (value rows past f16's range too),
    /// NMSE under 1e-11 (each value keeps 22 bits: 2^-44 per product).
    #[test]
    fn split_attention_stays_at_the_f32_floor() {
        let p = Attention {
            m: 9,
            heads: 4,
            kv_heads: 2,
            head_dim: 32,
            capacity: 40,
            window: 0,
            scale: 1.0,
            precision: turbospark::Precision::Exact,
        };
        let mut rng = turbospark::rng::Rng::new(3);
        let q = rng.vec_normal(p.m * p.heads * 32, 0.5);
        let k = rng.vec_normal(2 * 40 * 32, 0.5);
        let mut v = rng.vec_normal(2 * 40 * 32, 1.0);
        for row in v.chunks_mut(32).step_by(3) {
            row.iter_mut().for_each(|x| *x *= 262144.0);
        }
        let pos: Vec<u32> = (20..29).collect();
        let mut exact = vec![0.0; q.len()];
        let mut split = vec![0.0; q.len()];
        attention(&q, &k, &v, &pos, &mut exact, p, Rounding::F32).unwrap();
        attention(&q, &k, &v, &pos, &mut split, p, Rounding::Split).unwrap();
        let nmse = turbospark::parity::nmse(&exact, &split);
        assert!(nmse > 0.0 && nmse < 1e-11, "NMSE {nmse:e}");
    }
}
