//! Typed reads of `config.json` fields that name the field on failure.
//!
//! Every read goes through [`Fields`], so a wrong type or a missing field
//! becomes an [`Error::Config`] that says which field (with its
//! `text_config.` prefix for multimodal configs) and what was found, instead
//! of a panic or a silent default.

use serde_json::{Map, Value};

use crate::error::Error;
use crate::Result;

/// A JSON object plus what error messages need: the file and the key prefix.
pub(crate) struct Fields<'a> {
    pub map: &'a Map<String, Value>,
    pub path: &'a str,
    /// `""` at the top level, `"text_config."` inside the multimodal nesting.
    pub prefix: String,
}

/// An [`Error::Config`] for `path`.
pub(crate) fn config_err(path: &str, detail: impl Into<String>) -> Error {
    Error::Config {
        path: path.to_string(),
        detail: detail.into(),
    }
}

/// A short rendering of a JSON value for error messages.
pub(crate) fn show(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 80 {
        let cut = (0..=77).rev().find(|&i| s.is_char_boundary(i)).unwrap_or(0);
        format!("{}...", &s[..cut])
    } else {
        s
    }
}

impl<'a> Fields<'a> {
    pub fn new(map: &'a Map<String, Value>, path: &'a str, prefix: impl Into<String>) -> Self {
        Fields {
            map,
            path,
            prefix: prefix.into(),
        }
    }

    /// The full dotted name of `key`, as messages print it.
    pub fn name(&self, key: &str) -> String {
        format!("{}{}", self.prefix, key)
    }

    pub fn err(&self, key: &str, detail: impl std::fmt::Display) -> Error {
        config_err(self.path, format!("field `{}`: {detail}", self.name(key)))
    }

    /// The value of `key`, treating JSON `null` like an absent field.
    pub fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    pub fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        v.as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| {
                self.err(
                    key,
                    format!("expected a non-negative integer, found {}", show(v)),
                )
            })
    }

    pub fn req_usize(&self, key: &str) -> Result<usize> {
        self.opt_usize(key)?
            .ok_or_else(|| self.err(key, "missing (required for Gemma 4)"))
    }

    pub fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        v.as_f64()
            .filter(|x| x.is_finite())
            .map(Some)
            .ok_or_else(|| self.err(key, format!("expected a number, found {}", show(v))))
    }

    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        v.as_bool()
            .map(Some)
            .ok_or_else(|| self.err(key, format!("expected true or false, found {}", show(v))))
    }

    pub fn opt_str(&self, key: &str) -> Result<Option<&'a str>> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        v.as_str()
            .map(Some)
            .ok_or_else(|| self.err(key, format!("expected a string, found {}", show(v))))
    }

    pub fn opt_object(&self, key: &str) -> Result<Option<&'a Map<String, Value>>> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        v.as_object()
            .map(Some)
            .ok_or_else(|| self.err(key, format!("expected an object, found {}", show(v))))
    }

    pub fn opt_array(&self, key: &str) -> Result<Option<&'a Vec<Value>>> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        v.as_array()
            .map(Some)
            .ok_or_else(|| self.err(key, format!("expected an array, found {}", show(v))))
    }

    /// A nested object's fields, with this key appended to the prefix.
    pub fn nested(&self, key: &str, map: &'a Map<String, Value>) -> Fields<'a> {
        Fields::new(map, self.path, format!("{}{}.", self.prefix, key))
    }
}
