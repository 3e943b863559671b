//! Choosing the next token from a row of logits.
//!
//! Greedy decoding runs on the device (the `argmax` op; 4 bytes come back).
//! Random sampling reads the logits row back and samples on the host, without
//! ever sorting the whole vocabulary (262144 entries on Gemma 4): top-k is a
//! `select_nth_unstable` then a sort of the k survivors; top-p alone grows a
//! bounded top-k selection until it holds the requested mass; plain
//! temperature sampling needs no ordering at all.

use crate::error::{Error, Result};
use crate::rng::Rng;

/// How to pick each new token.
#[derive(Clone, Debug, PartialEq)]
pub enum Sampling {
    /// Highest logit (first index on ties), computed on the device.
    Greedy,
    /// Softmax of `logits / temperature`, optionally restricted to the `top_k`
    /// highest, then to the smallest prefix holding `top_p` of the mass, then
    /// to the tokens at least `min_p` times as likely as the likeliest (the
    /// order transformers applies them in). `repetition_penalty` first
    /// divides the positive logits (multiplies the negative ones) of every
    /// token already seen in this call: the prompt and the tokens it
    /// generated. A temperature of 0 then takes the highest.
    Random {
        temperature: f32,
        top_k: Option<usize>,
        top_p: Option<f32>,
        min_p: Option<f32>,
        repetition_penalty: Option<f32>,
        seed: u64,
    },
}

impl Sampling {
    /// Whether this is greedy decoding (a temperature of 0 counts as greedy,
    /// unless a repetition penalty changes the logits first).
    pub fn is_greedy(&self) -> bool {
        match self {
            Sampling::Greedy => true,
            Sampling::Random {
                temperature,
                top_k,
                repetition_penalty,
                ..
            } => {
                (*temperature == 0.0 || *top_k == Some(1))
                    && repetition_penalty.is_none_or(|r| r == 1.0)
            }
        }
    }

    /// Rejects settings that cannot be sampled with.
    pub fn validate(&self) -> Result<()> {
        if let Sampling::Random {
            temperature,
            top_k,
            top_p,
            min_p,
            repetition_penalty,
            ..
        } = self
        {
            if !temperature.is_finite() || *temperature < 0.0 {
                return Err(Error::InvalidInput(format!(
                    "temperature {temperature} must be finite and >= 0"
                )));
            }
            if *top_k == Some(0) {
                return Err(Error::InvalidInput("top-k must be at least 1".into()));
            }
            if let Some(p) = top_p {
                if !(*p > 0.0 && *p <= 1.0) {
                    return Err(Error::InvalidInput(format!("top-p {p} must be in (0, 1]")));
                }
            }
            if let Some(p) = min_p {
                if !(0.0..=1.0).contains(p) {
                    return Err(Error::InvalidInput(format!("min-p {p} must be in [0, 1]")));
                }
            }
            if let Some(r) = repetition_penalty {
                if !(r.is_finite() && *r > 0.0) {
                    return Err(Error::InvalidInput(format!(
                        "repetition penalty {r} must be finite and > 0"
                    )));
                }
            }
        }
        Ok(())
    }
}

/// First index of the largest value (NaN sorts below everything).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in logits.iter().enumerate() {
        if v.total_cmp(&logits[best]).is_gt() && !v.is_nan() {
            best = i;
        }
    }
    best as u32
}

/// A seeded sampler; one per generation so results are reproducible.
pub struct Sampler {
    sampling: Sampling,
    rng: Rng,
    /// Reused candidate index buffer (avoids a vocab-sized allocation per token).
    idx: Vec<u32>,
    /// The tokens seen so far (`observe`d and sampled), for the repetition
    /// penalty.
    seen: std::collections::BTreeSet<u32>,
    /// Reused copy of the row the penalty changes.
    penalized: Vec<f32>,
}

/// Initial candidate count for top-p without top-k: enough for most peaked
/// distributions; doubled until the kept mass reaches top-p.
const TOP_P_FIRST_CUT: usize = 64;

impl Sampler {
    pub fn new(sampling: &Sampling) -> Result<Self> {
        sampling.validate()?;
        let seed = match sampling {
            Sampling::Random { seed, .. } => *seed,
            Sampling::Greedy => 0,
        };
        Ok(Sampler {
            sampling: sampling.clone(),
            rng: Rng::new(seed),
            idx: Vec::new(),
            seen: Default::default(),
            penalized: Vec::new(),
        })
    }

    /// Whether it picks the highest logit (what the device's argmax gives:
    /// [`Sampling::is_greedy`]).
    pub fn is_greedy(&self) -> bool {
        self.sampling.is_greedy()
    }

    /// Tokens already in the context (the prompt), which the repetition
    /// penalty counts as seen.
    pub fn observe(&mut self, ids: &[u32]) {
        self.seen.extend(ids);
    }

    /// Picks a token from one row of logits (and counts it as seen).
    pub fn sample(&mut self, logits: &[f32]) -> Result<u32> {
        if logits.is_empty() {
            return Err(Error::InvalidInput("empty logits row".into()));
        }
        // A NaN would poison the softmax, and a row of -inf has no token.
        if let Some(i) = logits.iter().position(|v| v.is_nan()) {
            return Err(Error::NonFinite(format!("logit {i} of the row is NaN")));
        }
        if logits.iter().all(|v| *v == f32::NEG_INFINITY) {
            return Err(Error::NonFinite("every logit of the row is -inf".into()));
        }
        let mut penalized = std::mem::take(&mut self.penalized);
        let logits = match self.sampling {
            Sampling::Random {
                repetition_penalty: Some(r),
                ..
            } if r != 1.0 => {
                penalized.clear();
                penalized.extend_from_slice(logits);
                for &i in self.seen.range(..logits.len() as u32) {
                    let l = &mut penalized[i as usize];
                    *l = if *l > 0.0 { *l / r } else { *l * r };
                }
                &penalized[..]
            }
            _ => logits,
        };
        let tok = self.pick(logits);
        self.penalized = penalized;
        self.seen.insert(tok);
        Ok(tok)
    }

    /// The token for a (penalized) row.
    fn pick(&mut self, logits: &[f32]) -> u32 {
        let (t, top_k, top_p, min_p) = match &self.sampling {
            Sampling::Random {
                temperature,
                top_k,
                top_p,
                min_p,
                ..
            } if *temperature != 0.0 && *top_k != Some(1) => {
                (*temperature, *top_k, *top_p, min_p.unwrap_or(0.0))
            }
            _ => return argmax(logits),
        };
        let n = logits.len();
        let max = logits[argmax(logits) as usize];
        let weight = |l: f32| {
            let w = ((l - max) / t).exp();
            if w.is_finite() {
                w
            } else {
                0.0
            }
        };
        let top_p = top_p.filter(|p| *p < 1.0);
        let k = top_k.map(|k| k.min(n));
        // min-p keeps a token whose weight (its probability over the
        // likeliest's) reaches it.
        let kept = |l: f32| {
            let w = weight(l);
            if w >= min_p {
                w
            } else {
                0.0
            }
        };
        if k.is_none() && top_p.is_none() {
            // Plain temperature: one pass for the total, one to find the draw.
            let total: f32 = logits.iter().map(|&l| kept(l)).sum();
            let mut u = self.rng.uniform() * total;
            for (i, &l) in logits.iter().enumerate() {
                u -= kept(l);
                if u < 0.0 {
                    return i as u32;
                }
            }
            return argmax(logits);
        }
        // Candidates: the k highest (all of them for top-p alone, grown in steps).
        let total_all: f32 = if k.is_none() {
            logits.iter().map(|&l| weight(l)).sum()
        } else {
            0.0
        };
        let mut cut = k.unwrap_or(TOP_P_FIRST_CUT.min(n));
        loop {
            self.top_sorted(logits, cut);
            let Some(p) = top_p else { break };
            if k.is_some() || cut == n {
                break;
            }
            let held: f32 = self.idx.iter().map(|&i| weight(logits[i as usize])).sum();
            if held >= p * total_all {
                break;
            }
            cut = (cut * 2).min(n);
        }
        // Mass of the candidate set: top-p is relative to it after top-k
        // (as transformers applies top-k, then top-p on the renormalised rest).
        let total: f32 = match k {
            Some(_) => self.idx.iter().map(|&i| weight(logits[i as usize])).sum(),
            None => total_all,
        };
        let mut keep = self.idx.len();
        if let Some(p) = top_p {
            let mut cum = 0.0;
            for (j, &i) in self.idx.iter().enumerate() {
                cum += weight(logits[i as usize]);
                if cum >= p * total {
                    keep = j + 1;
                    break;
                }
            }
        }
        let cands = &self.idx[..keep];
        let mass: f32 = cands.iter().map(|&i| kept(logits[i as usize])).sum();
        let mut u = self.rng.uniform() * mass;
        for &i in cands {
            u -= kept(logits[i as usize]);
            if u < 0.0 {
                return i;
            }
        }
        cands[0]
    }

    /// The probabilities [`Sampler::sample`] draws from for `logits`, with
    /// `extra_seen` counted as seen besides the tokens already seen (a
    /// speculative verification's later rows follow drafted tokens): one per
    /// vocabulary entry, summing to 1 (all on the highest logit for greedy
    /// settings). For the speculative-sampling rule, which needs both
    /// distributions whole.
    pub fn distribution(&mut self, logits: &[f32], extra_seen: &[u32]) -> Result<Vec<f32>> {
        if logits.is_empty() {
            return Err(Error::InvalidInput("empty logits row".into()));
        }
        if let Some(i) = logits.iter().position(|v| v.is_nan()) {
            return Err(Error::NonFinite(format!("logit {i} of the row is NaN")));
        }
        if logits.iter().all(|v| *v == f32::NEG_INFINITY) {
            return Err(Error::NonFinite("every logit of the row is -inf".into()));
        }
        let mut row = logits.to_vec();
        if let Sampling::Random {
            repetition_penalty: Some(r),
            ..
        } = self.sampling
        {
            if r != 1.0 {
                let n = row.len() as u32;
                let seen: std::collections::BTreeSet<u32> = self
                    .seen
                    .range(..n)
                    .copied()
                    .chain(extra_seen.iter().copied().filter(|&t| t < n))
                    .collect();
                for i in seen {
                    let l = &mut row[i as usize];
                    *l = if *l > 0.0 { *l / r } else { *l * r };
                }
            }
        }
        let mut probs = vec![0.0f32; row.len()];
        let (t, top_k, top_p, min_p) = match &self.sampling {
            Sampling::Random {
                temperature,
                top_k,
                top_p,
                min_p,
                ..
            } if *temperature != 0.0 && *top_k != Some(1) => {
                (*temperature, *top_k, *top_p, min_p.unwrap_or(0.0))
            }
            _ => {
                probs[argmax(&row) as usize] = 1.0;
                return Ok(probs);
            }
        };
        let n = row.len();
        let max = row[argmax(&row) as usize];
        let weight = |l: f32| {
            let w = ((l - max) / t).exp();
            if w.is_finite() {
                w
            } else {
                0.0
            }
        };
        let top_p = top_p.filter(|p| *p < 1.0);
        // The candidates as `pick` keeps them: the top k, then the top-p
        // prefix of those (relative to their mass), then min-p.
        let cands: Vec<u32> = if top_k.is_none() && top_p.is_none() {
            (0..n as u32).collect()
        } else {
            let k = top_k.map_or(n, |k| k.min(n));
            let total_all: f32 = row.iter().map(|&l| weight(l)).sum();
            self.top_sorted(&row, k);
            let total: f32 = match top_k {
                Some(_) => self.idx.iter().map(|&i| weight(row[i as usize])).sum(),
                None => total_all,
            };
            let mut keep = self.idx.len();
            if let Some(p) = top_p {
                let mut cum = 0.0;
                for (j, &i) in self.idx.iter().enumerate() {
                    cum += weight(row[i as usize]);
                    if cum >= p * total {
                        keep = j + 1;
                        break;
                    }
                }
            }
            self.idx[..keep].to_vec()
        };
        let mut mass = 0.0f64;
        for &i in &cands {
            let w = weight(row[i as usize]);
            if w >= min_p {
                probs[i as usize] = w;
                mass += w as f64;
            }
        }
        if mass <= 0.0 {
            probs[argmax(&row) as usize] = 1.0;
            return Ok(probs);
        }
        for p in &mut probs {
            *p = (*p as f64 / mass) as f32;
        }
        Ok(probs)
    }

    /// A draw from `probs` (non-negative, any total: drawn in proportion).
    pub fn draw(&mut self, probs: &[f32]) -> u32 {
        let total: f64 = probs.iter().map(|&p| p as f64).sum();
        let mut u = self.rng.uniform() as f64 * total;
        let mut last = 0;
        for (i, &p) in probs.iter().enumerate() {
            if p > 0.0 {
                last = i;
                u -= p as f64;
                if u < 0.0 {
                    return i as u32;
                }
            }
        }
        last as u32
    }

    /// A uniform draw in [0, 1) from this sampler's generator.
    pub fn uniform(&mut self) -> f32 {
        self.rng.uniform()
    }

    /// Count `t` as seen (a token chosen outside [`Sampler::sample`]).
    pub fn mark_seen(&mut self, t: u32) {
        self.seen.insert(t);
    }

    /// `self.idx` = indices of the `cut` highest logits, sorted descending
    /// (ties to the lower index). O(n) selection plus O(cut log cut).
    fn top_sorted(&mut self, logits: &[f32], cut: usize) {
        let order = |a: &u32, b: &u32| {
            logits[*b as usize]
                .total_cmp(&logits[*a as usize])
                .then(a.cmp(b))
        };
        self.idx.clear();
        self.idx.extend(0..logits.len() as u32);
        if cut < self.idx.len() {
            self.idx.select_nth_unstable_by(cut - 1, order);
            self.idx.truncate(cut);
        }
        self.idx.sort_unstable_by(order);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits(n: usize, seed: u64) -> Vec<f32> {
        let mut r = Rng::new(seed);
        r.vec_normal(n, 3.0)
    }

    fn random(t: f32, k: Option<usize>, p: Option<f32>, seed: u64) -> Sampling {
        Sampling::Random {
            temperature: t,
            top_k: k,
            top_p: p,
            min_p: None,
            repetition_penalty: None,
            seed,
        }
    }

    fn draw(s: &Sampling, l: &[f32], n: usize) -> Vec<u32> {
        let mut sm = Sampler::new(s).unwrap();
        (0..n).map(|_| sm.sample(l).unwrap()).collect()
    }

    #[test]
    fn same_seed_same_tokens() {
        let l = logits(5000, 1);
        for s in [
            random(0.8, None, None, 7),
            random(1.0, Some(40), None, 7),
            random(1.0, None, Some(0.9), 7),
            random(0.7, Some(50), Some(0.8), 7),
        ] {
            assert_eq!(draw(&s, &l, 50), draw(&s, &l, 50), "{s:?}");
        }
        let a = draw(&random(1.0, None, None, 1), &l, 50);
        let b = draw(&random(1.0, None, None, 2), &l, 50);
        assert_ne!(a, b, "different seeds should differ");
    }

    #[test]
    fn top_k_one_is_greedy() {
        let l = logits(3000, 3);
        let g = argmax(&l);
        assert!(draw(&random(1.5, Some(1), None, 9), &l, 20)
            .iter()
            .all(|&t| t == g));
        assert_eq!(draw(&Sampling::Greedy, &l, 1), vec![g]);
        assert_eq!(draw(&random(0.0, None, None, 9), &l, 1), vec![g]);
    }

    #[test]
    fn top_k_stays_in_the_top_k() {
        let l = logits(2000, 4);
        let mut sorted: Vec<u32> = (0..l.len() as u32).collect();
        sorted.sort_by(|a, b| l[*b as usize].total_cmp(&l[*a as usize]));
        let top: Vec<u32> = sorted[..5].to_vec();
        for t in draw(&random(3.0, Some(5), None, 11), &l, 200) {
            assert!(top.contains(&t));
        }
    }

    /// Every sampled token lies in the smallest prefix (by probability) whose
    /// mass reaches top-p, computed here with a full sort.
    #[test]
    fn top_p_mass_respected() {
        let l = logits(4000, 5);
        for (t, p) in [(1.0, 0.5), (0.5, 0.9), (2.0, 0.3)] {
            let max = l.iter().copied().fold(f32::MIN, f32::max);
            let w: Vec<f64> = l.iter().map(|&x| (((x - max) / t) as f64).exp()).collect();
            let total: f64 = w.iter().sum();
            let mut order: Vec<usize> = (0..l.len()).collect();
            order.sort_by(|&a, &b| w[b].total_cmp(&w[a]));
            let mut cum = 0.0;
            let mut allowed = Vec::new();
            for &i in &order {
                allowed.push(i as u32);
                cum += w[i] / total;
                if cum >= p as f64 {
                    break;
                }
            }
            let got = draw(&random(t, None, Some(p), 13), &l, 300);
            for tok in &got {
                assert!(
                    allowed.contains(tok),
                    "t={t} p={p}: {tok} outside the nucleus"
                );
            }
            // A nucleus of several tokens should be explored, not collapsed.
            if allowed.len() > 3 {
                let mut distinct = got.clone();
                distinct.sort();
                distinct.dedup();
                assert!(distinct.len() > 1);
            }
        }
    }

    /// Every sampled token is at least min-p times as likely as the
    /// likeliest (after the temperature), and more than one is drawn.
    #[test]
    fn min_p_keeps_the_likely_ones() {
        let l = logits(4000, 6);
        let max = l.iter().copied().fold(f32::MIN, f32::max);
        for (t, k, mp) in [(1.0, None, 0.1), (0.7, Some(50), 0.3), (2.0, None, 0.05)] {
            let s = Sampling::Random {
                temperature: t,
                top_k: k,
                top_p: None,
                min_p: Some(mp),
                repetition_penalty: None,
                seed: 17,
            };
            let got = draw(&s, &l, 300);
            for &tok in &got {
                let w = ((l[tok as usize] - max) / t).exp();
                assert!(w >= mp, "t={t} min_p={mp}: {tok} at {w}");
            }
            let mut distinct = got.clone();
            distinct.sort();
            distinct.dedup();
            assert!(distinct.len() > 1, "t={t} min_p={mp}");
        }
    }

    /// The penalty lowers the tokens seen (observed or sampled): at
    /// temperature 0 (host-side argmax, not the device's greedy path) a
    /// large one never picks a token twice, nor one of the prompt.
    #[test]
    fn repetition_penalty_lowers_what_was_seen() {
        let mut l = logits(1000, 8);
        // every logit positive, so dividing lowers each
        l.iter_mut().for_each(|x| *x = x.abs() + 1.0);
        let s = Sampling::Random {
            temperature: 0.0,
            top_k: None,
            top_p: None,
            min_p: None,
            repetition_penalty: Some(1e6),
            seed: 0,
        };
        assert!(!s.is_greedy());
        let mut sm = Sampler::new(&s).unwrap();
        let prompt = [argmax(&l), 3, 4];
        sm.observe(&prompt);
        let got: Vec<u32> = (0..20).map(|_| sm.sample(&l).unwrap()).collect();
        let mut distinct = got.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), got.len(), "{got:?}");
        assert!(!got.iter().any(|t| prompt.contains(t)), "{got:?}");
        // A penalty of 1 changes nothing: greedy.
        let one = Sampling::Random {
            temperature: 0.0,
            top_k: None,
            top_p: None,
            min_p: None,
            repetition_penalty: Some(1.0),
            seed: 0,
        };
        assert!(one.is_greedy());
        assert_eq!(draw(&one, &l, 3), vec![argmax(&l); 3]);
    }

    #[test]
    fn bad_settings_are_errors() {
        assert!(Sampler::new(&random(-1.0, None, None, 0)).is_err());
        assert!(Sampler::new(&random(f32::NAN, None, None, 0)).is_err());
        assert!(Sampler::new(&random(1.0, Some(0), None, 0)).is_err());
        assert!(Sampler::new(&random(1.0, None, Some(0.0), 0)).is_err());
        assert!(Sampler::new(&random(1.0, None, Some(1.5), 0)).is_err());
        let with = |min_p, repetition_penalty| Sampling::Random {
            temperature: 1.0,
            top_k: None,
            top_p: None,
            min_p,
            repetition_penalty,
            seed: 0,
        };
        assert!(Sampler::new(&with(Some(1.5), None)).is_err());
        assert!(Sampler::new(&with(Some(-0.1), None)).is_err());
        assert!(Sampler::new(&with(None, Some(0.0))).is_err());
        assert!(Sampler::new(&with(None, Some(f32::INFINITY))).is_err());
    }
}
