use turbospark::ops::{gelu_tanh, Moe, Router};
use turbospark::{Error, Result};

use super::{dot, Weights};

/// Gemma 4 router: see `ComputeBackend::router`. Output rows are ordered by
/// descending probability, ties to the lower expert id.
pub fn router(
    x: &[f32],
    eff_scale: &[f32],
    proj: &Weights<'_>,
    pes: &[f32],
    ids: &mut [u32],
    weights: &mut [f32],
    p: Router,
) {
    let h = p.hidden;
    let mut z = vec![0f32; h];
    let mut row = vec![0f32; h];
    let mut logits = vec![0f32; p.experts];
    for t in 0..p.m {
        let xt = &x[t * h..(t + 1) * h];
        let inv = 1.0 / (xt.iter().map(|v| v * v).sum::<f32>() / h as f32 + p.eps).sqrt();
        for i in 0..h {
            z[i] = xt[i] * inv * eff_scale[i];
        }
        for (e, l) in logits.iter_mut().enumerate() {
            proj.decode_into(e * h, &mut row);
            *l = dot(&row, &z);
        }
        // Top-k by logit; softmax over all E then renormalising over the k is
        // the softmax over the k selected logits.
        let mut order: Vec<usize> = (0..p.experts).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        let top = &order[..p.top_k];
        let max = logits[top[0]];
        let sum: f32 = top.iter().map(|&e| (logits[e] - max).exp()).sum();
        for (j, &e) in top.iter().enumerate() {
            ids[t * p.top_k + j] = e as u32;
            weights[t * p.top_k + j] = (logits[e] - max).exp() / sum * pes[e];
        }
    }
}

fn expert_of(ids: &[u32], i: usize, experts: usize, op: &'static str) -> Result<usize> {
    let e = ids[i] as usize;
    if e >= experts {
        return Err(Error::shape(
            op,
            format!("expert id {e} at slot {i} is past {experts} experts"),
        ));
    }
    Ok(e)
}

/// Phase 1: `act[t, j] = gelu_tanh(gate_e x_t) * up_e x_t` for e = ids[t, j].
pub fn moe_gate_up(
    x: &[f32],
    gate_up: &Weights<'_>,
    ids: &[u32],
    act: &mut [f32],
    p: Moe,
) -> Result<()> {
    let (h, n) = (p.hidden, p.inter);
    let mut row = vec![0f32; h];
    for t in 0..p.m {
        let xt = &x[t * h..(t + 1) * h];
        for j in 0..p.top_k {
            let e = expert_of(ids, t * p.top_k + j, p.experts, "moe_gate_up")?;
            let base = e * 2 * n * h;
            for i in 0..n {
                gate_up.decode_into(base + i * h, &mut row);
                let g = dot(&row, xt);
                gate_up.decode_into(base + (n + i) * h, &mut row);
                let u = dot(&row, xt);
                act[(t * p.top_k + j) * n + i] = gelu_tanh(g) * u;
            }
        }
    }
    Ok(())
}

/// Phase 2: `out[t] = sum_j weights[t, j] * down_e act[t, j]`.
pub fn moe_down(
    act: &[f32],
    down: &Weights<'_>,
    ids: &[u32],
    weights: &[f32],
    out: &mut [f32],
    p: Moe,
) -> Result<()> {
    let (h, n) = (p.hidden, p.inter);
    let mut row = vec![0f32; n];
    for t in 0..p.m {
        let o = &mut out[t * h..(t + 1) * h];
        o.fill(0.0);
        for j in 0..p.top_k {
            let s = t * p.top_k + j;
            let e = expert_of(ids, s, p.experts, "moe_down")?;
            let a = &act[s * n..(s + 1) * n];
            for (r, o) in o.iter_mut().enumerate() {
                down.decode_into((e * h + r) * n, &mut row);
                *o += weights[s] * dot(&row, a);
            }
        }
    }
    Ok(())
}
