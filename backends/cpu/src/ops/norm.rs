use turbospark::ops::RmsNorm;

use super::Weights;

/// `out[r] = (residual[r] + x[r] * (mean(x[r]^2) + eps)^-1/2 * w) * scale`.
/// Gemma 4 has no `(1 + w)` offset.
pub fn rms_norm(
    x: &[f32],
    w: Option<&Weights<'_>>,
    residual: Option<&[f32]>,
    out: &mut [f32],
    p: RmsNorm,
) {
    let d = p.dim;
    for r in 0..p.rows {
        let row = &x[r * d..(r + 1) * d];
        let ms = row.iter().map(|v| v * v).sum::<f32>() / d as f32;
        let inv = 1.0 / (ms + p.eps).sqrt();
        for i in 0..d {
            let mut y = row[i] * inv;
            if let Some(w) = w {
                y *= w.get(i);
            }
            if let Some(res) = residual {
                y += res[r * d + i];
            }
            out[r * d + i] = y * p.scale;
        }
    }
}
