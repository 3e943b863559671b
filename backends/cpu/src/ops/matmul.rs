use turbospark::ops::Matmul;

use super::{dot, Weights};

/// `out[i, r] = sum_c w[r, c] * x[i, c]`.
pub fn matmul(w: &Weights<'_>, x: &[f32], out: &mut [f32], p: Matmul) {
    let mut row = vec![0f32; p.k];
    for r in 0..p.n {
        w.decode_into(r * p.k, &mut row);
        for i in 0..p.m {
            out[i * p.n + r] = dot(&row, &x[i * p.k..(i + 1) * p.k]);
        }
    }
}
