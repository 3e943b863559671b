//! The `quantization` block of an MLX checkpoint's `config.json` (mlx-lm
//! writes it at the top level, beside `text_config` where there is one, and
//! a copy as `quantization_config`): a default `bits` / `group_size` /
//! `mode`, and per-module entries keyed by the module's full path in the
//! file (`"model.layers.0.router.proj": {"bits": 8, "group_size": 64}`, or
//! `false` for a module left in float). Whether a module is quantized is
//! decided by its tensors (a `.scales` beside its `.weight`); its bits and
//! group by this block.

use std::collections::HashMap;

use serde_json::{Map, Value};

use super::json::{show, Fields};
use crate::error::Result;

/// Bits and group of one module, as the config gives them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuantParams {
    pub bits: u32,
    pub group: u32,
}

/// The quantization a config declares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Quantization {
    pub default: QuantParams,
    /// Per-module entries by full path: `None` for a module the config
    /// keeps in float.
    pub modules: HashMap<String, Option<QuantParams>>,
}

impl Quantization {
    /// The bits and group of the module at `path` (its full name in the
    /// file, without `.weight`); `None` when the config keeps it in float.
    pub fn params(&self, path: &str) -> Option<QuantParams> {
        match self.modules.get(path) {
            Some(p) => *p,
            None => Some(self.default),
        }
    }
}

const MODES: [&str; 1] = ["affine"];

fn params(f: &Fields<'_>, default: Option<QuantParams>) -> Result<QuantParams> {
    if let Some(mode) = f.opt_str("mode")? {
        if !MODES.contains(&mode) {
            return Err(f.err(
                "mode",
                format!(
                    "quantization mode \"{mode}\" is not supported (only mlx's \"affine\" is, for now)"
                ),
            ));
        }
    }
    let bits = f.opt_usize("bits")?;
    let group = f.opt_usize("group_size")?;
    let (bits, group) = match (bits, group, default) {
        (Some(b), Some(g), _) => (b, g),
        (b, g, Some(d)) => (b.unwrap_or(d.bits as usize), g.unwrap_or(d.group as usize)),
        (None, _, None) => return Err(f.err("bits", "missing")),
        (_, None, None) => return Err(f.err("group_size", "missing")),
    };
    if !crate::quant::BITS.contains(&(bits.min(255) as u8)) {
        return Err(f.err(
            "bits",
            format!("{bits}: mlx quantizes to 2, 3, 4, 5, 6 or 8 bits"),
        ));
    }
    if !crate::quant::GROUPS.contains(&(group.min(65535) as u16)) {
        return Err(f.err(
            "group_size",
            format!("{group}: mlx groups 32, 64 or 128 values"),
        ));
    }
    Ok(QuantParams {
        bits: bits as u32,
        group: group as u32,
    })
}

/// The `quantization` (else `quantization_config`) block of the root
/// object, when there is one.
pub(crate) fn parse(root: &Fields<'_>) -> Result<Option<Quantization>> {
    let key = if root.get("quantization").is_some() {
        "quantization"
    } else {
        "quantization_config"
    };
    let Some(map) = root.opt_object(key)? else {
        return Ok(None);
    };
    let f = root.nested(key, map);
    // A transformers quantization_config (bitsandbytes, GPTQ, ...) names
    // its method; refuse it by name rather than misread it.
    if let Some(method) = f.opt_str("quant_method")? {
        return Err(f.err(
            "quant_method",
            format!("\"{method}\" checkpoints are not supported; MLX affine quantization is"),
        ));
    }
    let default = params(&f, None)?;
    let mut modules = HashMap::new();
    for (k, v) in map {
        match v {
            Value::Object(m) => {
                let sub: &Map<String, Value> = m;
                modules.insert(k.clone(), Some(params(&f.nested(k, sub), Some(default))?));
            }
            Value::Bool(false) => {
                modules.insert(k.clone(), None);
            }
            Value::Bool(true) => {
                modules.insert(k.clone(), Some(default));
            }
            _ if matches!(k.as_str(), "bits" | "group_size" | "mode") => {}
            other => {
                return Err(f.err(
                    k,
                    format!(
                        "expected a module's {{\"bits\", \"group_size\"}} or false, found {}",
                        show(other)
                    ),
                ))
            }
        }
    }
    Ok(Some(Quantization { default, modules }))
}
