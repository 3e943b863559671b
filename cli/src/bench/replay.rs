//! `bench --replay-trace FILE`: a routing trace replayed through each
//! expert-slot count and policy asked for, beside offline-optimal
//! replacement, without a GPU: what a user with a real checkpoint needs to
//! size the slots, and what a policy change would buy.

use std::io::BufReader;
use std::path::Path;

use serde_json::{json, Value};
use turbospark::model::experts::{optimal, replay, Policy, Trace};

/// The replay's table on stdout and its figures as JSON.
pub fn run(path: &Path, slots: &[usize], policies: &[String]) -> turbospark::Result<Value> {
    let file = std::fs::File::open(path)
        .map_err(|e| turbospark::Error::io(format!("routing trace {}", path.display()), e))?;
    let trace = Trace::read(BufReader::new(file), &path.display().to_string())?;
    let policies = policies
        .iter()
        .map(|p| Policy::parse(p))
        .collect::<turbospark::Result<Vec<_>>>()?;
    let slots: Vec<usize> = if slots.is_empty() {
        [8, 16, 32, 64]
            .into_iter()
            .filter(|&n| n <= trace.experts)
            .collect()
    } else {
        slots.to_vec()
    };
    println!(
        "routing trace {}: {} tokens, {} MoE layers, {} experts",
        path.display(),
        trace.tokens.len(),
        trace.layers(),
        trace.experts
    );
    let mut header = format!("{:>8}", "slots");
    for p in &policies {
        header.push_str(&format!("{:>10}", p.name()));
    }
    header.push_str(&format!("{:>10}", "optimal"));
    println!("{header}   (hit rate over every layer's lookups)");
    let mut rows = Vec::new();
    for &n in &slots {
        let best = optimal(&trace, n)?;
        let mut line = format!("{n:>8}");
        let mut by_policy = serde_json::Map::new();
        for &p in &policies {
            let c = replay(&trace, n, p)?;
            line.push_str(&format!("{:>9.1}%", 100.0 * c.hit_rate()));
            by_policy.insert(
                p.name().into(),
                json!({ "hits": c.hits, "misses": c.misses, "hit_rate": c.hit_rate() }),
            );
        }
        line.push_str(&format!("{:>9.1}%", 100.0 * best.hit_rate()));
        println!("{line}");
        rows.push(json!({
            "slots": n,
            "policies": by_policy,
            "optimal": { "hits": best.hits, "misses": best.misses, "hit_rate": best.hit_rate() },
        }));
    }
    Ok(json!({
        "trace": path.display().to_string(),
        "tokens": trace.tokens.len(),
        "layers": trace.layers(),
        "experts": trace.experts,
        "rows": rows,
    }))
}
