use turbospark::ops::{gelu_tanh, Embed};
use turbospark::{Error, Result};

use super::Weights;

pub fn add(a: &[f32], b: &[f32], out: &mut [f32]) {
    for ((o, x), y) in out.iter_mut().zip(a).zip(b) {
        *o = x + y;
    }
}

pub fn scale(x: &[f32], out: &mut [f32], s: f32) {
    for (o, v) in out.iter_mut().zip(x) {
        *o = v * s;
    }
}

/// `out[r, i] = gelu_tanh(x[r, i]) * x[r, n + i]` for x `[rows, 2n]`.
pub fn gelu_mul(x: &[f32], out: &mut [f32], rows: usize, n: usize) {
    for r in 0..rows {
        for i in 0..n {
            out[r * n + i] = gelu_tanh(x[r * 2 * n + i]) * x[r * 2 * n + n + i];
        }
    }
}

pub fn softcap(x: &[f32], out: &mut [f32], cap: f32) {
    for (o, v) in out.iter_mut().zip(x) {
        *o = cap * (v / cap).tanh();
    }
}

/// `out[i] = table[ids[i]] * scale`.
pub fn embed(ids: &[u32], table: &Weights<'_>, out: &mut [f32], p: Embed) -> Result<()> {
    for t in 0..p.m {
        let id = ids[t] as usize;
        if id >= p.vocab {
            return Err(Error::InvalidInput(format!(
                "token id {id} is past the vocabulary of {}",
                p.vocab
            )));
        }
        let o = &mut out[t * p.hidden..(t + 1) * p.hidden];
        table.decode_into(id * p.hidden, o);
        for v in o.iter_mut() {
            *v *= p.scale;
        }
    }
    Ok(())
}

/// First index of the largest value of each row (NaN never wins).
pub fn argmax(x: &[f32], out: &mut [u32], rows: usize, n: usize) {
    for r in 0..rows {
        let row = &x[r * n..(r + 1) * n];
        // NaN never wins (a NaN at index 0 must not block every later value),
        // nor a value below the floor (-inf); ties keep the first index; a
        // row with no candidate gives NO_ARGMAX.
        let mut best: Option<(usize, f32)> = None;
        for (i, &v) in row.iter().enumerate() {
            if v >= turbospark::ops::ARGMAX_FLOOR && best.is_none_or(|(_, b)| v > b) {
                best = Some((i, v));
            }
        }
        out[r] = best.map_or(turbospark::ops::NO_ARGMAX, |(i, _)| i as u32);
    }
}
