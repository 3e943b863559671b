//! `turbospark kernels --emit DIR`: every WGSL module the wgpu backend may
//! compile, written exactly as it hands them to wgpu (directives, the common
//! prelude, the reduction helpers, the family's file and appendices), one
//! file per build ([`turbospark_wgpu::kernels::builds`]), and `manifest.json`
//! beside them: each module's WebGPU features, what in it only wgpu offers,
//! its override constants, and each entry point with the override sets to
//! compile it with. For kernel authors reading what runs, and for a second
//! WGSL compiler (scripts/tint-check.mjs feeds them to Dawn's Tint).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};
use turbospark_wgpu::kernels::{builds, Build, PIPELINE_LOG};

use crate::common::CliResult;

#[derive(clap::Args)]
pub struct Args {
    /// Directory to write the modules and manifest.json into (created if
    /// absent; files of the same names are replaced).
    #[arg(long)]
    emit: PathBuf,
    /// A pipeline log (a run's `TURBOSPARK_PIPELINE_LOG` file, one JSON
    /// object a line): the override sets the backend set on each entry
    /// point in that run go into the manifest (an entry point no log names
    /// gets one set: its declared defaults).
    #[arg(long)]
    pipelines: Vec<PathBuf>,
}

/// Override sets by (family, entry point), each as `name -> value`.
type Recorded = BTreeMap<(String, String), BTreeSet<BTreeMap<String, i64>>>;

pub fn run(a: Args) -> CliResult {
    let mut recorded = Recorded::new();
    for p in &a.pipelines {
        read_log(p, &mut recorded)?;
    }
    std::fs::create_dir_all(&a.emit)
        .map_err(|e| format!("cannot create {}: {e}", a.emit.display()))?;
    let mut modules = Vec::new();
    for b in builds() {
        let src = b.source();
        let path = a.emit.join(b.file_name());
        std::fs::write(&path, &src).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        modules.push(describe(&b, &src, &recorded)?);
    }
    let manifest = json!({
        "about": "Each WGSL module turbospark's wgpu backend may compile, as it composes \
                  them (turbospark kernels --emit). Per module: the WebGPU features a \
                  device needs for it; wgpu_only, where it uses what WebGPU has no \
                  equivalent for; its entry points, each with the override sets to \
                  compile it with: those the pipeline logs recorded (recorded: true), \
                  else one empty set, the declared defaults.",
        "pipeline_logs": a.pipelines.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
        "modules": modules,
    });
    let path = a.emit.join("manifest.json");
    let text = serde_json::to_string_pretty(&manifest)?;
    std::fs::write(&path, text + "\n")
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    eprintln!(
        "wrote {} modules and manifest.json to {}",
        modules.len(),
        a.emit.display()
    );
    Ok(())
}

/// A module's manifest entry.
fn describe(b: &Build, src: &str, recorded: &Recorded) -> CliResult<Value> {
    let module = naga::front::wgsl::parse_str(src)
        .map_err(|e| format!("{}: {}", b.file_name(), e.emit_to_string(src)))?;
    let overrides: Vec<&str> = module
        .overrides
        .iter()
        .filter_map(|(_, o)| o.name.as_deref())
        .collect();
    let entries: Vec<Value> = module
        .entry_points
        .iter()
        .filter(|e| e.stage == naga::ShaderStage::Compute)
        .map(|e| {
            let key = (b.family.to_string(), e.name.clone());
            let mut sets: Vec<Map<String, Value>> = recorded
                .get(&key)
                .into_iter()
                .flatten()
                .map(|set| set.iter().map(|(n, v)| (n.clone(), json!(v))).collect())
                .collect();
            let seen = !sets.is_empty();
            if !seen {
                sets.push(Map::new());
            }
            json!({ "name": e.name, "recorded": seen, "overrides": sets })
        })
        .collect();
    Ok(json!({
        "file": b.file_name(),
        "family": b.family,
        "subgroups": b.subgroups,
        "coherent": b.coherent,
        "features": b.features(),
        "wgpu_only": b.wgpu_only(),
        "override_constants": overrides,
        "entry_points": entries,
    }))
}

/// Add the override sets of a pipeline log's lines to `recorded`.
fn read_log(path: &Path, recorded: &mut Recorded) -> CliResult {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read pipeline log {}: {e}", path.display()))?;
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = |why: &str| {
            format!(
                "{}:{}: {why} (expected a {PIPELINE_LOG} line: \
                 {{\"family\":..,\"entry\":..,\"constants\":{{..}}}})",
                path.display(),
                i + 1
            )
        };
        let v: Value = serde_json::from_str(line).map_err(|e| bad(&e.to_string()))?;
        let field = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
        let (Some(family), Some(entry)) = (field("family"), field("entry")) else {
            return Err(bad("no family or entry").into());
        };
        let Some(constants) = v.get("constants").and_then(Value::as_object) else {
            return Err(bad("no constants object").into());
        };
        let mut set = BTreeMap::new();
        for (n, c) in constants {
            let c = c
                .as_i64()
                .ok_or_else(|| bad(&format!("constant {n} is not an integer")))?;
            set.insert(n.clone(), c);
        }
        recorded.entry((family, entry)).or_default().insert(set);
    }
    Ok(())
}
