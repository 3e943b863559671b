//! Routing traces (each token's expert ids per MoE layer): recorded from
//! a run, read and written as text, generated with a chosen locality, and
//! replayed on a slot cache's policies or on offline-optimal replacement.

use std::io::{BufRead, Write};

use super::slot_cache::{Counts, Policy, SlotCache};
use crate::error::{Error, Result};

/// A routing trace: for each token, each MoE layer's expert ids.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Trace {
    pub experts: usize,
    pub tokens: Vec<Vec<Vec<u32>>>,
}

impl Trace {
    /// Layers per token (0 for an empty trace).
    pub fn layers(&self) -> usize {
        self.tokens.first().map_or(0, Vec::len)
    }

    /// The trace as text: a header line `experts E`, then a line per token,
    /// its layers' ids `,`-separated and the layers `;`-separated.
    pub fn write(&self, w: &mut impl Write) -> std::io::Result<()> {
        writeln!(w, "experts {}", self.experts)?;
        for t in &self.tokens {
            let layers: Vec<String> = t
                .iter()
                .map(|l| l.iter().map(u32::to_string).collect::<Vec<_>>().join(","))
                .collect();
            writeln!(w, "{}", layers.join(";"))?;
        }
        Ok(())
    }

    /// Read [`Trace::write`]'s text; `what` names the source in errors.
    pub fn read(r: impl BufRead, what: &str) -> Result<Trace> {
        let bad = |line: usize, detail: String| {
            Error::InvalidInput(format!("routing trace {what}, line {line}: {detail}"))
        };
        let mut lines = r.lines().enumerate();
        let experts = match lines.next() {
            Some((_, Ok(h))) => h
                .strip_prefix("experts ")
                .and_then(|n| n.trim().parse::<usize>().ok())
                .filter(|&n| n > 0)
                .ok_or_else(|| bad(1, format!("{h:?} is not `experts N`")))?,
            Some((_, Err(e))) => return Err(Error::io(format!("routing trace {what}"), e)),
            None => return Err(bad(1, "empty (no `experts N` header)".into())),
        };
        let mut tokens = Vec::new();
        for (i, line) in lines {
            let line = line.map_err(|e| Error::io(format!("routing trace {what}"), e))?;
            let n = i + 1;
            let mut layers = Vec::new();
            for part in line.split(';') {
                let ids = part
                    .split(',')
                    .map(|t| match t.trim().parse::<u32>() {
                        Ok(id) if (id as usize) < experts => Ok(id),
                        _ => Err(bad(n, format!("{t:?} is not an expert id below {experts}"))),
                    })
                    .collect::<Result<Vec<u32>>>()?;
                layers.push(ids);
            }
            if let Some(first) = tokens.first().map(Vec::len) {
                if layers.len() != first {
                    return Err(bad(
                        n,
                        format!("{} layers, the first token has {first}", layers.len()),
                    ));
                }
            }
            tokens.push(layers);
        }
        Ok(Trace { experts, tokens })
    }
}

/// The shape of a generated routing trace ([`Trace::generate`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TraceShape {
    pub tokens: usize,
    /// Zipf exponent of each layer's expert popularity: the expert of rank
    /// r (in a random order of the layer's own) is drawn in proportion to
    /// 1 / (r + 1)^skew; 0 is uniform.
    pub skew: f64,
    /// Chance that each of a token's experts in a layer is one of the
    /// previous token's there (temporal reuse); the rest are drawn by
    /// popularity.
    pub reuse: f64,
    pub seed: u64,
}

impl Trace {
    /// A routing trace of `shape` for a model of `experts` experts, `layers`
    /// MoE layers and `top_k` experts a token: per-layer popularity skew and
    /// temporal reuse, the two localities a slot cache lives on.
    pub fn generate(
        experts: usize,
        layers: usize,
        top_k: usize,
        shape: TraceShape,
    ) -> Result<Trace> {
        if top_k == 0 || top_k > experts || shape.tokens == 0 {
            return Err(Error::InvalidInput(format!(
                "a trace of {} tokens, top_k {top_k} of {experts} experts: needs tokens and \
                 1 <= top_k <= experts",
                shape.tokens
            )));
        }
        let fits =
            shape.skew >= 0.0 && shape.skew.is_finite() && (0.0..=1.0).contains(&shape.reuse);
        if !fits {
            return Err(Error::InvalidInput(format!(
                "trace skew {} must be finite and >= 0, reuse {} in [0, 1]",
                shape.skew, shape.reuse
            )));
        }
        let mut rng = crate::rng::Rng::new(shape.seed);
        let uniform = |rng: &mut crate::rng::Rng| rng.next_u64() as f64 / u64::MAX as f64;
        // Each layer's experts in a random order, and the cumulative Zipf
        // weights of the ranks.
        let orders: Vec<Vec<u32>> = (0..layers)
            .map(|_| {
                let mut o: Vec<u32> = (0..experts as u32).collect();
                for i in (1..o.len()).rev() {
                    o.swap(i, rng.below(i as u64 + 1) as usize);
                }
                o
            })
            .collect();
        let mut cumulative = Vec::with_capacity(experts);
        let mut total = 0.0;
        for r in 0..experts {
            total += 1.0 / ((r + 1) as f64).powf(shape.skew);
            cumulative.push(total);
        }
        let mut tokens: Vec<Vec<Vec<u32>>> = Vec::with_capacity(shape.tokens);
        for t in 0..shape.tokens {
            let mut row = Vec::with_capacity(layers);
            for (l, order) in orders.iter().enumerate() {
                let mut ids: Vec<u32> = Vec::with_capacity(top_k);
                let mut draws = 0;
                while ids.len() < top_k {
                    draws += 1;
                    if draws > 64 * top_k {
                        // (a steep skew keeps drawing the same few: take
                        // the most popular not yet chosen)
                        let e = order.iter().find(|e| !ids.contains(e)).copied();
                        ids.extend(e);
                        continue;
                    }
                    let prev = t.checked_sub(1).map(|p| &tokens[p][l]);
                    let e = match prev {
                        Some(prev) if uniform(&mut rng) < shape.reuse => {
                            prev[rng.below(prev.len() as u64) as usize]
                        }
                        _ => {
                            let u = uniform(&mut rng) * total;
                            let r = cumulative.partition_point(|&c| c < u).min(experts - 1);
                            order[r]
                        }
                    };
                    if !ids.contains(&e) {
                        ids.push(e);
                    }
                }
                row.push(ids);
            }
            tokens.push(row);
        }
        Ok(Trace { experts, tokens })
    }
}

/// Hits and misses of `policy` with `slots` slots a layer over the trace.
pub fn replay(trace: &Trace, slots: usize, policy: Policy) -> Result<Counts> {
    let mut total = Counts::default();
    for layer in 0..trace.layers() {
        let mut c = SlotCache::new(trace.experts, slots, policy)?;
        for t in &trace.tokens {
            c.place(&t[layer])?;
        }
        total.add(c.counts());
    }
    Ok(total)
}

/// Hits and misses of offline-optimal replacement (Belady: evict the
/// expert whose next use is furthest away; never one the token uses) with
/// `slots` slots a layer: the bound a policy could reach.
pub fn optimal(trace: &Trace, slots: usize) -> Result<Counts> {
    if slots == 0 || slots > trace.experts {
        return Err(Error::InvalidInput(format!(
            "{slots} expert slots for {} experts",
            trace.experts
        )));
    }
    let mut total = Counts::default();
    for layer in 0..trace.layers() {
        let seq: Vec<&[u32]> = trace.tokens.iter().map(|t| t[layer].as_slice()).collect();
        // next[t][e]: the first token after t that uses e (usize::MAX: none).
        let mut next_use = vec![usize::MAX; trace.experts];
        let mut next: Vec<Vec<usize>> = vec![Vec::new(); seq.len()];
        for t in (0..seq.len()).rev() {
            next[t] = next_use.clone();
            for &e in seq[t] {
                next_use[e as usize] = t;
            }
        }
        let mut held: Vec<u32> = Vec::with_capacity(slots);
        for (t, ids) in seq.iter().enumerate() {
            if ids.len() > slots {
                return Err(Error::InvalidInput(format!(
                    "token {t}: {} experts in {slots} slots",
                    ids.len()
                )));
            }
            for &e in ids.iter() {
                if held.contains(&e) {
                    total.hits += 1;
                    continue;
                }
                total.misses += 1;
                if held.len() < slots {
                    held.push(e);
                    continue;
                }
                let (victim, _) = held
                    .iter()
                    .enumerate()
                    .filter(|(_, h)| !ids.contains(h))
                    .max_by_key(|(_, h)| next[t][**h as usize])
                    .expect("a token that fits leaves an unpinned slot");
                held[victim] = e;
            }
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace(experts: usize, tokens: &[&[u32]]) -> Trace {
        Trace {
            experts,
            tokens: tokens.iter().map(|t| vec![t.to_vec()]).collect(),
        }
    }

    #[test]
    fn optimal_is_beladys_and_bounds_the_policies() {
        // Two slots, one expert a token: a b c a b c ...; Belady keeps
        // whichever is used soonest.
        let t = trace(4, &[&[0], &[1], &[2], &[0], &[1], &[2], &[0], &[1], &[2]]);
        let o = optimal(&t, 2).unwrap();
        assert_eq!(o.hits + o.misses, 9);
        // LRU misses every access of a cycle longer than its slots.
        let lru = replay(&t, 2, Policy::Lru).unwrap();
        assert_eq!(lru.hits, 0);
        assert!(o.hits >= 3, "{o:?}");
        let mut rng = crate::rng::Rng::new(3);
        let tokens: Vec<Vec<Vec<u32>>> = (0..200)
            .map(|_| {
                let mut ids = Vec::new();
                while ids.len() < 4 {
                    // a skewed routing, as real routers are
                    let e = (rng.below(16) * rng.below(16) / 15) as u32;
                    if !ids.contains(&e) {
                        ids.push(e);
                    }
                }
                vec![ids]
            })
            .collect();
        let t = Trace {
            experts: 16,
            tokens,
        };
        for slots in [4, 6, 8, 12, 16] {
            let o = optimal(&t, slots).unwrap();
            for p in [Policy::Lfu, Policy::Lru] {
                let c = replay(&t, slots, p).unwrap();
                assert_eq!(c.hits + c.misses, o.hits + o.misses);
                assert!(c.hits <= o.hits, "{p:?} at {slots}: {c:?} over {o:?}");
            }
        }
        // With a slot per expert only the first use of each misses.
        let mut seen: Vec<u32> = t.tokens.iter().flatten().flatten().copied().collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(optimal(&t, 16).unwrap().misses, seen.len() as u64);
    }

    #[test]
    fn traces_round_trip_and_bad_lines_are_named() {
        let t = Trace {
            experts: 8,
            tokens: vec![vec![vec![1, 2], vec![7, 0]], vec![vec![3, 4], vec![5, 6]]],
        };
        let mut buf = Vec::new();
        t.write(&mut buf).unwrap();
        assert_eq!(Trace::read(buf.as_slice(), "t").unwrap(), t);
        let bad = |s: &str| Trace::read(s.as_bytes(), "t").unwrap_err().to_string();
        assert!(bad("").contains("header"));
        assert!(bad("experts x\n").contains("line 1"));
        assert!(bad("experts 8\n1,9\n").contains("line 2"));
        assert!(bad("experts 8\n1;2\n3\n").contains("the first token has 2"));
        assert!(bad("experts 8\n1,,2\n").contains("line 2"));
    }
    /// A generated trace is valid routing, fixed by its seed, and its two
    /// localities show: full reuse repeats the first token's experts; a
    /// steep skew hits far more at a few slots than uniform routing.
    #[test]
    fn generated_traces_have_the_locality_asked() {
        let shape = |skew, reuse| TraceShape {
            tokens: 200,
            skew,
            reuse,
            seed: 7,
        };
        let t = Trace::generate(128, 4, 8, shape(1.0, 0.5)).unwrap();
        assert_eq!((t.tokens.len(), t.layers(), t.experts), (200, 4, 128));
        for row in &t.tokens {
            for ids in row {
                assert_eq!(ids.len(), 8);
                assert!(ids.iter().all(|&e| e < 128));
                assert!((1..8).all(|i| !ids[..i].contains(&ids[i])), "{ids:?}");
            }
        }
        assert_eq!(t, Trace::generate(128, 4, 8, shape(1.0, 0.5)).unwrap());
        let same = Trace::generate(128, 2, 8, shape(0.0, 1.0)).unwrap();
        for row in &same.tokens {
            for (l, ids) in row.iter().enumerate() {
                let mut a = ids.clone();
                let mut b = same.tokens[0][l].clone();
                a.sort_unstable();
                b.sort_unstable();
                assert_eq!(a, b);
            }
        }
        let hits = |skew| {
            let t = Trace::generate(128, 4, 8, shape(skew, 0.0)).unwrap();
            replay(&t, 16, Policy::Lfu).unwrap().hit_rate()
        };
        let (flat, steep) = (hits(0.0), hits(1.5));
        assert!(steep > flat + 0.3, "skew 1.5: {steep}, uniform: {flat}");
        // a skew so steep one expert is all it draws still fills the top_k
        let t = Trace::generate(16, 1, 4, shape(500.0, 0.0)).unwrap();
        assert!(t.tokens.iter().all(|r| r[0].len() == 4));
        assert!(Trace::generate(8, 1, 9, shape(1.0, 0.0)).is_err());
        assert!(Trace::generate(8, 1, 2, shape(f64::NAN, 0.0)).is_err());
    }
}
