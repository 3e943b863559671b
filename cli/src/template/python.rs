//! Values written as Python writes them, since Hugging Face templates are
//! rendered by Python's jinja2: `str()` for `{{ value }}` (`None`, `True`,
//! `['a', 1]`), `repr()` inside containers, and `json.dumps` for `tojson`.

use std::fmt::Write;

use minijinja::value::{Value, ValueKind};
use minijinja::{Error, ErrorKind};

/// Python's `str(value)`: what jinja2 prints for `{{ value }}`.
pub fn py_str(v: &Value) -> String {
    match v.kind() {
        ValueKind::String => v.as_str().unwrap_or_default().to_string(),
        ValueKind::Undefined => String::new(),
        _ => {
            let mut s = String::new();
            repr(v, &mut s);
            s
        }
    }
}

/// Python's `repr(value)` appended to `out`.
fn repr(v: &Value, out: &mut String) {
    match v.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if v.is_true() { "True" } else { "False" }),
        ValueKind::Number => number(v, out),
        ValueKind::String => str_repr(v.as_str().unwrap_or_default(), out),
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            if let Ok(items) = v.try_iter() {
                for (i, item) in items.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    repr(&item, out);
                }
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            if let Ok(keys) = v.try_iter() {
                for (i, key) in keys.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    repr(&key, out);
                    out.push_str(": ");
                    repr(&v.get_item(&key).unwrap_or_default(), out);
                }
            }
            out.push('}');
        }
        // (bytes, objects: minijinja's own spelling)
        _ => {
            let _ = write!(out, "{v}");
        }
    }
}

fn number(v: &Value, out: &mut String) {
    if v.is_integer() {
        let _ = write!(out, "{v}");
    } else {
        match f64::try_from(v.clone()) {
            Ok(f) => out.push_str(&float_repr(f)),
            Err(_) => {
                let _ = write!(out, "{v}");
            }
        }
    }
}

/// Python's `repr(float)`: the shortest digits that round-trip, fixed
/// notation for exponents -4 to 15 (with `.0` when whole), else `1e+20`.
pub fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf" } else { "-inf" }.into();
    }
    // Rust's `{:e}` gives the same shortest round-trip digits: "d.ddde-7"
    let sci = format!("{:e}", f.abs());
    let (mantissa, exp) = sci.split_once('e').expect("{:e} writes an exponent");
    let exp: i32 = exp.parse().expect("{:e} writes a decimal exponent");
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let sign = if f.is_sign_negative() { "-" } else { "" };
    if !(-4..16).contains(&exp) {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let esign = if exp < 0 { '-' } else { '+' };
        return format!("{sign}{first}{frac}e{esign}{:02}", exp.abs());
    }
    if exp < 0 {
        let zeros = "0".repeat((-exp - 1) as usize);
        return format!("{sign}0.{zeros}{digits}");
    }
    let int_len = exp as usize + 1;
    if digits.len() <= int_len {
        let zeros = "0".repeat(int_len - digits.len());
        format!("{sign}{digits}{zeros}.0")
    } else {
        let (i, frac) = digits.split_at(int_len);
        format!("{sign}{i}.{frac}")
    }
}

/// Python's `repr(str)`: single quotes unless the text has one and no
/// double quote; backslashes, the quote and unprintable characters escaped.
fn str_repr(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if !printable(c) => {
                let n = c as u32;
                let _ = match n {
                    0..=0xff => write!(out, "\\x{n:02x}"),
                    0x100..=0xffff => write!(out, "\\u{n:04x}"),
                    _ => write!(out, "\\U{n:08x}"),
                };
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// Python's `str.isprintable` for the characters text carries: controls,
/// separators other than the space, and format characters are not.
fn printable(c: char) -> bool {
    !matches!(c as u32,
        0..=0x1f | 0x7f..=0xa0 | 0xad | 0x1680 | 0x2000..=0x200f | 0x2028..=0x202f
        | 0x205f..=0x206f | 0x3000 | 0xfeff | 0xd800..=0xdfff | 0xe000..=0xf8ff)
}

/// `json.dumps` options, as transformers' `tojson` filter takes them.
#[derive(Clone, Debug, Default)]
pub struct PyJson {
    /// Non-ASCII as `\uXXXX` (transformers' default: false).
    pub ensure_ascii: bool,
    /// Indentation a level: `None` writes one line.
    pub indent: Option<String>,
    /// Item and key separators; default `", "`, `": "` (`","` with an indent).
    pub separators: Option<(String, String)>,
    /// Map keys sorted.
    pub sort_keys: bool,
}

impl PyJson {
    /// `v` as `json.dumps` writes it; an error for what JSON cannot hold
    /// (an undefined value, a map key that is a list).
    pub fn dumps(&self, v: &Value) -> Result<String, Error> {
        let mut out = String::new();
        self.write(v, 0, &mut out)?;
        Ok(out)
    }

    fn seps(&self) -> (&str, &str) {
        match (&self.separators, &self.indent) {
            (Some((a, b)), _) => (a, b),
            (None, Some(_)) => (",", ": "),
            (None, None) => (", ", ": "),
        }
    }

    fn newline(&self, level: usize, out: &mut String) {
        if let Some(ind) = &self.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(ind);
            }
        }
    }

    fn write(&self, v: &Value, level: usize, out: &mut String) -> Result<(), Error> {
        let (item_sep, key_sep) = self.seps();
        match v.kind() {
            ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number => {
                if v.is_integer() {
                    let _ = write!(out, "{v}");
                } else {
                    let f = f64::try_from(v.clone())?;
                    out.push_str(&match f {
                        f if f.is_nan() => "NaN".into(),
                        f if f.is_infinite() => {
                            if f > 0.0 { "Infinity" } else { "-Infinity" }.into()
                        }
                        f => float_repr(f),
                    });
                }
            }
            ValueKind::String => self.string(v.as_str().unwrap_or_default(), out),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = v.try_iter()?.collect();
                if items.is_empty() {
                    out.push_str("[]");
                    return Ok(());
                }
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(item_sep);
                    }
                    self.newline(level + 1, out);
                    self.write(item, level + 1, out)?;
                }
                self.newline(level, out);
                out.push(']');
            }
            ValueKind::Map => {
                let mut keys: Vec<Value> = v.try_iter()?.collect();
                if keys.is_empty() {
                    out.push_str("{}");
                    return Ok(());
                }
                if self.sort_keys {
                    keys.sort();
                }
                out.push('{');
                for (i, key) in keys.iter().enumerate() {
                    if i > 0 {
                        out.push_str(item_sep);
                    }
                    self.newline(level + 1, out);
                    self.key(key, out)?;
                    out.push_str(key_sep);
                    self.write(&v.get_item(key)?, level + 1, out)?;
                }
                self.newline(level, out);
                out.push('}');
            }
            k => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson: a value of type {k} is not JSON serializable"),
                ))
            }
        }
        Ok(())
    }

    /// A map key: json.dumps writes strings, numbers, booleans and None as
    /// strings.
    fn key(&self, key: &Value, out: &mut String) -> Result<(), Error> {
        let text = match key.kind() {
            ValueKind::String => key.as_str().unwrap_or_default().to_string(),
            ValueKind::None => "null".into(),
            ValueKind::Bool => if key.is_true() { "true" } else { "false" }.into(),
            ValueKind::Number => {
                let mut s = String::new();
                number(key, &mut s);
                s
            }
            k => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson: keys must be strings, numbers, booleans or None, not {k}"),
                ))
            }
        };
        self.string(&text, out);
        Ok(())
    }

    fn string(&self, s: &str, out: &mut String) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ensure_ascii && !c.is_ascii()) => {
                    let mut buf = [0u16; 2];
                    for unit in c.encode_utf16(&mut buf) {
                        let _ = write!(out, "\\u{unit:04x}");
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Python's own repr of these floats (checked with CPython 3.11).
    #[test]
    fn floats_print_as_python_does() {
        for (f, want) in [
            (1.0, "1.0"),
            (2.5, "2.5"),
            (-0.0, "-0.0"),
            (1e20, "1e+20"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (123456.789, "123456.789"),
            (1e-7, "1e-07"),
            (0.0001, "0.0001"),
            (0.00001234, "1.234e-05"),
            (47.37, "47.37"),
            (-3.5, "-3.5"),
            (1.5e300, "1.5e+300"),
            (0.1 + 0.2, "0.30000000000000004"),
        ] {
            assert_eq!(float_repr(f), want, "{f:e}");
        }
    }

    #[test]
    fn values_print_as_python_does() {
        let v = |s: &str| crate::template::json(s).unwrap();
        assert_eq!(py_str(&v("null")), "None");
        assert_eq!(py_str(&v("[true, false]")), "[True, False]");
        assert_eq!(
            py_str(&v(r#"{"a": ["x", "it's", "\"q\"", "a\\b", 1, 2.0]}"#)),
            r#"{'a': ['x', "it's", '"q"', 'a\\b', 1, 2.0]}"#
        );
        assert_eq!(
            py_str(&v(r#"["tab\there", "\u0001", "é"]"#)),
            r"['tab\there', '\x01', 'é']"
        );
    }

    #[test]
    fn json_dumps_as_python_does() {
        let v = crate::template::json(r#"{"b": [1, 2.0, {}], "a": "ü\u0001", "c": []}"#).unwrap();
        let dumps = |o: PyJson| o.dumps(&v).unwrap();
        assert_eq!(
            dumps(PyJson::default()),
            r#"{"b": [1, 2.0, {}], "a": "ü\u0001", "c": []}"#
        );
        assert_eq!(
            dumps(PyJson {
                ensure_ascii: true,
                sort_keys: true,
                ..Default::default()
            }),
            r#"{"a": "\u00fc\u0001", "b": [1, 2.0, {}], "c": []}"#
        );
        assert_eq!(
            dumps(PyJson {
                indent: Some("  ".into()),
                ..Default::default()
            }),
            "{\n  \"b\": [\n    1,\n    2.0,\n    {}\n  ],\n  \"a\": \"ü\\u0001\",\n  \"c\": []\n}"
        );
        let undefined = PyJson::default().dumps(&Value::UNDEFINED);
        assert!(undefined
            .unwrap_err()
            .to_string()
            .contains("not JSON serializable"));
    }
}
