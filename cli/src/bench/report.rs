//! The bench's output: a table on stdout, JSON with every figure, an SVG chart.

use std::fmt::Write as _;

use serde_json::{json, Value};

use super::cases::Case;
use super::clock::utc_now;
use super::measure::{gbps, Outcome, Stats};
use super::{Args, Run};
use turbospark::parity::Case as _;

pub struct Report<'a> {
    pub args: &'a Args,
    pub cases: &'a [Case],
    /// Bytes each case must move, in case order.
    pub bytes: &'a [u64],
    pub runs: &'a [Run],
    pub notes: &'a [String],
    pub end_to_end: Value,
}

/// A duration in the unit that suits it.
pub fn fmt_time(s: f64) -> String {
    if s < 1e-6 {
        format!("{:.0} ns", s * 1e9)
    } else if s < 1e-3 {
        format!("{:.1} us", s * 1e6)
    } else if s < 1.0 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{:.2} s", s)
    }
}

/// A rate of floating-point operations per second, in TFLOPS or GFLOPS.
fn fmt_flops(per_s: f64) -> String {
    if per_s >= 1e12 {
        format!("{:.2} TFLOPS", per_s / 1e12)
    } else {
        format!("{:.1} GFLOPS", per_s / 1e9)
    }
}

/// One line of progress for stderr.
pub fn outcome_brief(o: &Outcome, bytes: u64) -> String {
    match o {
        Outcome::Measured { stats, .. } => format!(
            "{} ({:.2} GB/s)",
            fmt_time(stats.median),
            gbps(bytes, stats.median)
        ),
        Outcome::Unsupported(w) => format!("unsupported: {w}"),
        Outcome::Skipped(w) => format!("skipped: {w}"),
        Outcome::Failed(w) => format!("FAILED: {w}"),
    }
}

fn first_line_with(path: &str, key: &str) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_once([':', '=']))
        .map(|(_, v)| v.trim().trim_matches('"').to_string())
}

/// The host: name, OS, CPU.
pub fn machine() -> Value {
    json!({
        "hostname": std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|s| s.trim().to_string())
            .unwrap_or_default(),
        "os": first_line_with("/etc/os-release", "PRETTY_NAME")
            .unwrap_or_else(|| std::env::consts::OS.to_string()),
        "arch": std::env::consts::ARCH,
        "cpu": first_line_with("/proc/cpuinfo", "model name").unwrap_or_default(),
        "cpu_threads": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
    })
}

/// Whether `case` runs at a prefill batch's size, where the GPU's GEMMs are
/// bound by arithmetic (FLOPS shown) rather than by bandwidth.
fn prefill_sized(case: &Case) -> bool {
    case.m >= turbospark_wgpu::PREFILL_MIN_M
}

fn stats_json(s: &Stats) -> Value {
    json!({
        "median_s": s.median, "p10_s": s.p10, "p90_s": s.p90,
        "min_s": s.min, "max_s": s.max, "mean_s": s.mean, "samples": s.n,
    })
}

impl Report<'_> {
    fn ceiling_gbps(&self, r: &Run) -> Option<f64> {
        r.ceiling.as_ref().ok().map(|c| c.gbps())
    }

    /// `g` GB/s as a percentage of `r`'s ceiling.
    fn pct_of_ceiling(&self, r: &Run, g: f64) -> Option<f64> {
        r.ceiling.as_ref().ok().map(|c| c.pct(g))
    }

    /// The bare stream a bandwidth-bound `case` (below the prefill size:
    /// prefill batches are bound by arithmetic) is read against, on `r`.
    fn stream_at<'r>(
        &self,
        r: &'r Run,
        case: &Case,
        bytes: u64,
    ) -> Option<&'r super::measure::SizedStream> {
        if prefill_sized(case) {
            return None;
        }
        r.ceiling.as_ref().ok().and_then(|c| c.stream_at(bytes))
    }

    fn header(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "turbospark bench{} at {}",
            if self.args.quick { " --quick" } else { "" },
            utc_now()
        );
        for r in self.runs {
            let i = &r.info;
            let ceiling = match &r.ceiling {
                Ok(c) => format!(
                    "ceiling {:.1} GB/s read ({}; {}); host to device {}",
                    c.gbps(),
                    c.how,
                    c.method,
                    c.upload
                        .as_ref()
                        .map_or("not measured".into(), |u| format!("{:.1} GB/s", u.gbps()))
                ),
                Err(e) => format!("ceiling FAILED: {e}"),
            };
            let _ = writeln!(
                s,
                "  {:<5} {} [{}{}{}] {}",
                r.name,
                i.device_name,
                i.api,
                if i.driver.is_empty() { "" } else { ", " },
                i.driver,
                ceiling
            );
            if let Ok(c) = &r.ceiling {
                for (kernel, what) in [
                    ("grid-stride", "the same kernel"),
                    ("fixed", "8 loads a thread at once"),
                ] {
                    let sizes: Vec<String> = c
                        .at_sizes
                        .iter()
                        .filter(|z| z.kernel == kernel)
                        .map(|z| {
                            format!(
                                "{} MiB {} ({:.0} GB/s, {:.0}%)",
                                z.bytes >> 20,
                                fmt_time(z.stats.median),
                                z.gbps(),
                                c.pct(z.gbps())
                            )
                        })
                        .collect();
                    if !sizes.is_empty() {
                        let _ = writeln!(
                            s,
                            "        {what} at op sizes, one dependent dispatch a call: {}",
                            sizes.join(", ")
                        );
                    }
                }
            }
        }
        for n in self.notes {
            let _ = writeln!(s, "  note: {n}");
        }
        s
    }

    pub fn table(&self) -> String {
        let mut s = self.header();
        let _ = writeln!(
            s,
            "\n{:<28} {:<5} {:>10} {:>21} {:>10} {:>9} {:>6}  notes",
            "case", "back", "median", "p10 .. p90", "MB moved", "GB/s", "%ceil"
        );
        for (ci, case) in self.cases.iter().enumerate() {
            let bytes = self.bytes[ci];
            for (ri, r) in self.runs.iter().enumerate() {
                let label = if ri == 0 { case.label.as_str() } else { "" };
                let mut notes = Vec::new();
                let line = match &r.outcomes[ci] {
                    Outcome::Measured {
                        stats, sets, warm, ..
                    } => {
                        let g = gbps(bytes, stats.median);
                        if !warm.settled {
                            notes.push(format!(
                                "clock warm-up did not settle in {:.1} s",
                                warm.seconds
                            ));
                        }
                        let pct = self
                            .pct_of_ceiling(r, g)
                            .map(|p| format!("{p:.1}%"))
                            .unwrap_or_else(|| "-".into());
                        if *sets > 1 {
                            notes.push(format!("{sets} input sets"));
                        }
                        if let (Some(t), "wgpu") = (case.target_us, r.name) {
                            notes.push(format!("target <= {t} us on the H200"));
                        }
                        if let Some(z) = self.stream_at(r, case, bytes) {
                            notes.push(format!(
                                "{:.0}% of a bare stream of {} MiB ({})",
                                100.0 * g / z.gbps(),
                                z.bytes >> 20,
                                z.kernel
                            ));
                        }
                        // (prefill batches are bound by arithmetic)
                        if let (Some(fl), true) = (case.op.flops(), prefill_sized(case)) {
                            notes.push(fmt_flops(fl as f64 / stats.median));
                        }
                        format!(
                            "{:>10} {:>21} {:>10.3} {:>9.2} {:>6}",
                            fmt_time(stats.median),
                            format!("{} .. {}", fmt_time(stats.p10), fmt_time(stats.p90)),
                            bytes as f64 / 1e6,
                            g,
                            pct
                        )
                    }
                    other => {
                        notes.push(outcome_brief(other, bytes));
                        format!(
                            "{:>10} {:>21} {:>10.3} {:>9} {:>6}",
                            "-",
                            "-",
                            bytes as f64 / 1e6,
                            "-",
                            "-"
                        )
                    }
                };
                let _ = writeln!(
                    s,
                    "{:<28} {:<5} {line}  {}",
                    label,
                    r.name,
                    notes.join("; ")
                );
            }
        }
        let _ = writeln!(
            s,
            "\nMB moved: each input read once, each output written once (MoE: the selected \
             experts only; attention: the keys in the window, {} KV caches). %ceil is GB/s over the \
             backend's ceiling; over 100% means the data came from a cache (inputs rotate over \
             the input sets shown, still within cache for the smallest ops).\n\
             end to end: {}",
            self.args.kv_cache.dtype(),
            self.end_to_end["note"].as_str().unwrap_or("-")
        );
        let _ = writeln!(s, "precision: {}", self.args.precision.get());
        for f in self.end_to_end["fidelity"].as_array().into_iter().flatten() {
            let _ = writeln!(s, "fidelity: {}", f["note"].as_str().unwrap_or("-"));
        }
        s
    }

    pub fn json(&self) -> Value {
        let backends: Vec<Value> = self
            .runs
            .iter()
            .map(|r| {
                let i = &r.info;
                json!({
                    "name": r.name,
                    "adapter": i.device_name,
                    "api": i.api,
                    "driver": i.driver,
                    "device_type": format!("{:?}", i.device_type),
                    "capabilities": i
                        .capabilities
                        .iter()
                        .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
                        .collect::<serde_json::Map<_, _>>(),
                    "limits": {
                        "max_binding_bytes": i.limits.max_binding_bytes,
                        "max_buffer_bytes": i.limits.max_buffer_bytes,
                        "max_workgroups_per_dim": i.limits.max_workgroups_per_dim,
                    },
                    "budget": {
                        "seconds_per_case": r.budget.seconds,
                        "min_reps": r.budget.min_reps,
                        "max_reps": r.budget.max_reps,
                        "rotate_bytes": r.budget.rotate_bytes,
                        "max_sets": r.budget.max_sets,
                    },
                    "ceiling": match &r.ceiling {
                        Ok(c) => json!({
                            "status": "ok",
                            "bytes": c.bytes,
                            "gbps": c.gbps(),
                            "best_gbps": c.bytes as f64 / c.stats.min / 1e9,
                            "timing": stats_json(&c.stats),
                            "method": c.method,
                            "how": c.how,
                            "host_to_device": c.upload.as_ref().map(|u| json!({
                                "bytes": u.bytes,
                                "gbps": u.gbps(),
                                "timing": stats_json(&u.stats),
                            })),
                            "at_sizes": c.at_sizes.iter().map(|z| json!({
                                "kernel": z.kernel,
                                "bytes": z.bytes,
                                "sets": z.sets,
                                "gbps": z.gbps(),
                                "pct_of_ceiling": c.pct(z.gbps()),
                                "timing": stats_json(&z.stats),
                            })).collect::<Vec<_>>(),
                        }),
                        Err(e) => json!({ "status": "failed", "error": e }),
                    },
                    "extra": r.extra,
                })
            })
            .collect();
        let cases: Vec<Value> = self
            .cases
            .iter()
            .enumerate()
            .map(|(ci, c)| {
                let bytes = self.bytes[ci];
                let mut results = serde_json::Map::new();
                for r in self.runs {
                    let v = match &r.outcomes[ci] {
                        Outcome::Measured {
                            stats,
                            method,
                            sets,
                            warm,
                        } => {
                            let g = gbps(bytes, stats.median);
                            json!({
                                "status": "ok",
                                "timing": stats_json(stats),
                                "gbps": g,
                                "gbps_p10_time": gbps(bytes, stats.p10),
                                "gbps_p90_time": gbps(bytes, stats.p90),
                                "pct_of_ceiling": self.pct_of_ceiling(r, g),
                                // against the faster streaming kernel at the
                                // next measured size up (`Ceiling::stream_at`;
                                // bandwidth-bound cases only)
                                "pct_of_stream_at_size": self.stream_at(r, c, bytes).map(|z| json!({
                                    "pct": 100.0 * g / z.gbps(),
                                    "stream_bytes": z.bytes,
                                    "stream_kernel": z.kernel,
                                })),
                                "tflops": c.op.flops().map(|fl| fl as f64 / stats.median / 1e12),
                                "method": method,
                                "input_sets": sets,
                                "warmup": {
                                    "timed_at_utc": warm.timed_at,
                                    "seconds": warm.seconds,
                                    "settled": warm.settled,
                                },
                            })
                        }
                        Outcome::Unsupported(w) => json!({"status": "unsupported", "reason": w}),
                        Outcome::Skipped(w) => json!({"status": "skipped", "reason": w}),
                        Outcome::Failed(w) => json!({"status": "failed", "error": w}),
                    };
                    results.insert(r.name.to_string(), v);
                }
                json!({
                    "label": c.label,
                    "group": c.group,
                    "op": c.op.name(),
                    "m": c.m,
                    "bytes": bytes,
                    "target_us_h200": c.target_us,
                    "results": results,
                })
            })
            .collect();
        json!({
            "tool": "turbospark bench",
            "version": env!("CARGO_PKG_VERSION"),
            "date": utc_now(),
            "command_line": std::env::args().collect::<Vec<_>>(),
            "mode": if self.args.quick { "quick" } else { "full" },
            "seed": self.args.seed,
            "kv_cache": self.args.kv_cache.dtype().name(),
            // the tensor-core products' arithmetic of the cases and the
            // end-to-end model (turbospark::Precision)
            "precision": self.args.precision.get().as_str(),
            "machine": machine(),
            "backends": backends,
            "cases": cases,
            "notes": self.notes,
            "end_to_end": self.end_to_end,
        })
    }

    /// Achieved GB/s per case, one panel per backend on its own linear scale,
    /// each with its ceiling as a dashed line.
    pub fn svg(&self) -> String {
        const LABEL_W: f64 = 230.0;
        const PANEL_W: f64 = 380.0;
        const GAP: f64 = 50.0;
        const ROW_H: f64 = 18.0;
        const TOP: f64 = 86.0;
        const BOTTOM: f64 = 40.0;
        let n = self.cases.len().max(1) as f64;
        let panels = self.runs.len().max(1) as f64;
        let width = (LABEL_W + panels * (PANEL_W + GAP) + 10.0).max(960.0);
        let height = TOP + n * ROW_H + BOTTOM;
        let mut s = String::new();
        let _ = writeln!(
            s,
            r##"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">"##
        );
        let _ = writeln!(
            s,
            r##"<rect width="100%" height="100%" fill="white"/><text x="10" y="20" font-size="15" font-weight="bold">turbospark bench{}: achieved GB/s per op against the measured ceiling</text>"##,
            if self.args.quick { " --quick" } else { "" }
        );
        let _ = writeln!(
            s,
            r##"<text x="10" y="38" fill="#555">{}; bytes = each input read once and each output written once (selected experts only for MoE); bar colour: green &gt;= 85%, orange &gt;= 50%, red below</text>"##,
            esc(&utc_now())
        );
        for (ci, c) in self.cases.iter().enumerate() {
            let y = TOP + ci as f64 * ROW_H;
            let _ = writeln!(
                s,
                r##"<text x="{}" y="{}" text-anchor="end">{}</text>"##,
                LABEL_W - 8.0,
                y + ROW_H * 0.7,
                esc(&c.label)
            );
        }
        for (ri, r) in self.runs.iter().enumerate() {
            let x0 = LABEL_W + ri as f64 * (PANEL_W + GAP);
            let ceiling = self.ceiling_gbps(r);
            let best = r
                .outcomes
                .iter()
                .zip(self.bytes)
                .filter_map(|(o, b)| match o {
                    Outcome::Measured { stats, .. } => Some(gbps(*b, stats.median)),
                    _ => None,
                })
                .fold(ceiling.unwrap_or(0.0), f64::max);
            let (step, top) = nice_axis(best.max(1e-3));
            let sx = |g: f64| x0 + PANEL_W * (g / top).min(1.0);
            let _ = writeln!(
                s,
                r##"<text x="{x0}" y="{}" font-weight="bold">{} — {}</text>"##,
                TOP - 30.0,
                esc(r.name),
                esc(&r.info.device_name)
            );
            if let Some(c) = ceiling {
                let _ = writeln!(
                    s,
                    r##"<text x="{x0}" y="{}" fill="#1f4e99">ceiling {c:.1} GB/s ({})</text>"##,
                    TOP - 16.0,
                    esc(r.ceiling.as_ref().map(|c| c.method).unwrap_or(""))
                );
            }
            // Grid and axis.
            let y_end = TOP + n * ROW_H;
            let mut t = 0.0;
            while t <= top * 1.0001 {
                let x = sx(t);
                let _ = writeln!(
                    s,
                    r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{y_end}" stroke="#ddd"/><text x="{x:.1}" y="{}" text-anchor="middle" fill="#555">{}</text>"##,
                    y_end + 14.0,
                    fmt_num(t)
                );
                t += step;
            }
            let _ = writeln!(
                s,
                r##"<text x="{}" y="{}" text-anchor="middle" fill="#555">GB/s</text>"##,
                x0 + PANEL_W / 2.0,
                y_end + 30.0
            );
            for (ci, o) in r.outcomes.iter().enumerate() {
                let y = TOP + ci as f64 * ROW_H;
                match o {
                    Outcome::Measured { stats, .. } => {
                        let g = gbps(self.bytes[ci], stats.median);
                        let pct = self.pct_of_ceiling(r, g);
                        let colour = match pct {
                            Some(p) if p >= 85.0 => "#2e8b57",
                            Some(p) if p >= 50.0 => "#e69500",
                            _ => "#c0392b",
                        };
                        let w = (sx(g) - x0).max(1.0);
                        let _ = writeln!(
                            s,
                            r##"<rect x="{x0}" y="{:.1}" width="{w:.1}" height="{:.1}" fill="{colour}"><title>{}: {} {} ({:.2} GB/s)</title></rect>"##,
                            y + 3.0,
                            ROW_H - 6.0,
                            esc(&self.cases[ci].label),
                            esc(r.name),
                            fmt_time(stats.median),
                            g
                        );
                        let label = match pct {
                            Some(p) => format!("{} · {:.1}%", fmt_num(g), p),
                            None => fmt_num(g),
                        };
                        let lx = (x0 + w + 4.0).min(x0 + PANEL_W - 70.0);
                        let _ = writeln!(
                            s,
                            r##"<text x="{lx:.1}" y="{:.1}" fill="#222">{}</text>"##,
                            y + ROW_H * 0.7,
                            esc(&label)
                        );
                    }
                    other => {
                        let word = match other {
                            Outcome::Unsupported(_) => "unsupported",
                            Outcome::Skipped(_) => "skipped",
                            _ => "FAILED",
                        };
                        let _ = writeln!(
                            s,
                            r##"<text x="{:.1}" y="{:.1}" fill="#999" font-style="italic">{word}</text>"##,
                            x0 + 4.0,
                            y + ROW_H * 0.7
                        );
                    }
                }
            }
            if let Some(c) = ceiling {
                let x = sx(c);
                let _ = writeln!(
                    s,
                    r##"<line x1="{x:.1}" y1="{}" x2="{x:.1}" y2="{y_end}" stroke="#1f4e99" stroke-width="1.5" stroke-dasharray="5,3"/>"##,
                    TOP - 4.0
                );
            }
        }
        s.push_str("</svg>\n");
        s
    }
}

/// Tick step and axis end for values up to `max`.
fn nice_axis(max: f64) -> (f64, f64) {
    let raw = max / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|k| k * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    (step, (max / step).ceil() * step)
}

fn fmt_num(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

fn esc(t: &str) -> String {
    t.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
