//! What `Precision::Fast` costs in fidelity against `Precision::Exact`: the
//! same tokens through one model at both precisions, teacher-forced, with
//! each MoE layer's expert choices recorded; the logits' NMSE, how many
//! rows keep their argmax, and how many (token, layer) choices of experts
//! differ. `--fidelity DIR,..` runs it on checkpoints with an
//! `expected.json` (the transformers fixtures: also each precision's NMSE
//! against transformers' logits and how far its greedy continuation keeps
//! the reference's); the end-to-end run on its synthetic prompt.

use std::path::Path;

use serde_json::{json, Value};
use turbospark::model::{Checkpoint, GenerateOptions, ModelOptions, OneSequence, Sampling};
use turbospark::{ComputeBackend, Precision, Result};

/// One precision's pass over the tokens: the logits and each token's
/// experts per MoE layer.
pub struct Pass {
    pub logits: Vec<Vec<f32>>,
    pub routing: Vec<Vec<Vec<u32>>>,
}

/// `tokens` teacher-forced from position 0 at `precision` (set on the
/// model), the routing recorded.
pub fn pass<B: ComputeBackend>(
    model: &mut OneSequence<B>,
    tokens: &[u32],
    precision: Precision,
) -> Result<Pass> {
    model.set_precision(precision);
    model.reset();
    model.record_routing(true);
    let logits = model.logits(tokens)?;
    let routing = model.take_routing().map(|t| t.tokens).unwrap_or_default();
    model.record_routing(false);
    model.reset();
    Ok(Pass { logits, routing })
}

/// NMSE of `got` against `want` over every row together.
pub fn nmse(got: &[Vec<f32>], want: &[Vec<f32>]) -> f64 {
    let (mut err, mut energy) = (0.0f64, 0.0f64);
    for (g, w) in got.iter().zip(want) {
        for (a, b) in g.iter().zip(w) {
            err += (*a as f64 - *b as f64).powi(2);
            energy += (*b as f64).powi(2);
        }
    }
    if energy > 0.0 {
        err / energy
    } else {
        err
    }
}

fn argmax(row: &[f32]) -> usize {
    row.iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &v)| {
            if v > bv {
                (i, v)
            } else {
                (bi, bv)
            }
        })
        .0
}

/// Rows whose argmax agrees.
pub fn argmax_agree(a: &[Vec<f32>], b: &[Vec<f32>]) -> usize {
    a.iter()
        .zip(b)
        .filter(|(x, y)| argmax(x) == argmax(y))
        .count()
}

/// (token, layer) expert choices that differ as sets, and how many there
/// are in all.
pub fn routing_differs(a: &[Vec<Vec<u32>>], b: &[Vec<Vec<u32>>]) -> (usize, usize) {
    let (mut differ, mut all) = (0, 0);
    for (ta, tb) in a.iter().zip(b) {
        for (la, lb) in ta.iter().zip(tb) {
            let (mut x, mut y) = (la.clone(), lb.clone());
            x.sort_unstable();
            y.sort_unstable();
            differ += usize::from(x != y);
            all += 1;
        }
    }
    (differ, all)
}

/// Fast against exact over the same tokens, as JSON.
pub fn compare(exact: &Pass, fast: &Pass) -> Value {
    let (differ, choices) = routing_differs(&fast.routing, &exact.routing);
    json!({
        "rows": exact.logits.len(),
        "fast_vs_exact_nmse": nmse(&fast.logits, &exact.logits),
        "argmax_agree": argmax_agree(&fast.logits, &exact.logits),
        "routing_choices": choices,
        "routing_choices_differ": differ,
    })
}

/// One line of [`compare`]'s figures.
pub fn brief(v: &Value) -> String {
    format!(
        "fast against exact: logits NMSE {:.3e}, argmax agrees on {} of {} rows, {} of {} \
         (token, layer) expert choices differ",
        v["fast_vs_exact_nmse"].as_f64().unwrap_or(f64::NAN),
        v["argmax_agree"],
        v["rows"],
        v["routing_choices_differ"],
        v["routing_choices"],
    )
}

/// A fixture's tokens, prompt length and reference rows (where present).
type Expected = (Vec<u32>, usize, Option<Vec<Vec<f32>>>);

/// A fixture's `expected.json` tokens and prompt length, and its
/// `logits.safetensors` rows where present.
fn expected(dir: &Path) -> std::result::Result<Expected, String> {
    let path = dir.join("expected.json");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let j: Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let bad = || format!("{}: no prompt_len and tokens", path.display());
    let prompt_len = j["prompt_len"].as_u64().ok_or_else(bad)? as usize;
    let tokens: Vec<u32> = j["tokens"]
        .as_array()
        .ok_or_else(bad)?
        .iter()
        .map(|t| t.as_u64().map(|v| v as u32))
        .collect::<Option<_>>()
        .ok_or_else(bad)?;
    if prompt_len == 0 || prompt_len > tokens.len() {
        return Err(bad());
    }
    let logits = std::fs::read(dir.join("logits.safetensors"))
        .ok()
        .and_then(|bytes| {
            let st = safetensors::SafeTensors::deserialize(&bytes).ok()?;
            let t = st.tensor("logits").ok()?;
            let vocab = *t.shape().get(1)?;
            let v: Vec<f32> = t
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            Some(v.chunks(vocab).map(<[f32]>::to_vec).collect())
        });
    Ok((tokens, prompt_len, logits))
}

/// How many of `want`'s tokens a greedy continuation of `prompt` keeps
/// before it first differs.
fn greedy_kept<B: ComputeBackend>(
    model: &mut OneSequence<B>,
    prompt: &[u32],
    want: &[u32],
) -> Result<usize> {
    model.reset();
    let g = model.generate(
        prompt,
        &GenerateOptions {
            max_new_tokens: want.len(),
            sampling: Sampling::Greedy,
            stop_at_eos: false,
        },
    )?;
    model.reset();
    Ok(g.tokens
        .iter()
        .zip(want)
        .take_while(|(a, b)| a == b)
        .count())
}

/// The fixture in `dir` on `backend` at both precisions.
pub fn fixture<B: ComputeBackend>(backend: B, dir: &Path) -> Value {
    let name = dir.display().to_string();
    match fixture_on(backend, dir) {
        Ok(v) => v,
        Err(e) => json!({ "fixture": name, "status": "failed", "note": e }),
    }
}

fn fixture_on<B: ComputeBackend>(backend: B, dir: &Path) -> std::result::Result<Value, String> {
    let name = dir.display().to_string();
    let (tokens, prompt_len, reference) = expected(dir)?;
    let ck = Checkpoint::open(dir).map_err(|e| e.to_string())?;
    let mut model = OneSequence::load(
        backend,
        &ck,
        ModelOptions {
            max_context: tokens.len(),
            ..Default::default()
        },
    )
    .map_err(|e| e.to_string())?;
    let mut per = serde_json::Map::new();
    let mut passes = Vec::new();
    for p in Precision::ALL {
        let s = pass(&mut model, &tokens, p).map_err(|e| e.to_string())?;
        let kept = greedy_kept(&mut model, &tokens[..prompt_len], &tokens[prompt_len..])
            .map_err(|e| e.to_string())?;
        per.insert(
            p.as_str().into(),
            json!({
                "nmse_vs_reference": reference.as_ref().map(|r| nmse(&s.logits, r)),
                "argmax_agree_with_reference": reference.as_ref().map(|r| argmax_agree(&s.logits, r)),
                "greedy_tokens_kept": kept,
                "greedy_tokens": tokens.len() - prompt_len,
            }),
        );
        passes.push(s);
    }
    let mut v = compare(&passes[0], &passes[1]);
    v["fixture"] = name.clone().into();
    v["status"] = "measured".into();
    v["by_precision"] = Value::Object(per);
    let line = format!(
        "{name}: {}; {}",
        brief(&v),
        Precision::ALL
            .iter()
            .map(|p| {
                let q = &v["by_precision"][p.as_str()];
                format!(
                    "{p}: NMSE {} against the reference, greedy keeps {} of {} tokens",
                    q["nmse_vs_reference"]
                        .as_f64()
                        .map_or("-".into(), |x| format!("{x:.3e}")),
                    q["greedy_tokens_kept"],
                    q["greedy_tokens"]
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    );
    eprintln!("bench: fidelity: {line}");
    v["note"] = line.into();
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_count_what_differs() {
        let a = vec![vec![1.0, 2.0, 0.0], vec![3.0, 1.0, 0.0]];
        let b = vec![vec![1.0, 2.5, 0.0], vec![0.0, 1.0, 4.0]];
        assert_eq!(argmax_agree(&a, &b), 1);
        assert_eq!(nmse(&a, &a), 0.0);
        assert!(nmse(&b, &a) > 0.0);
        let r1 = vec![vec![vec![1, 2], vec![3, 4]], vec![vec![5, 6], vec![7, 8]]];
        let r2 = vec![vec![vec![2, 1], vec![3, 5]], vec![vec![5, 6], vec![7, 8]]];
        // (the order within a layer's choice does not count)
        assert_eq!(routing_differs(&r1, &r2), (1, 4));
    }
}
