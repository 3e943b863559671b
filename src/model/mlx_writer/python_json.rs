//! JSON read and written as Python's `json` module does: mlx-lm passes
//! config.json through `json.load` and `json.dump(indent=4)`, so keys keep
//! their order, numbers print as Python prints them (`1e-06`, `1000000.0`)
//! and non-ASCII is escaped; reproducing that gives mlx-lm's bytes.

/// A JSON value that keeps key order and formats numbers as Python would
/// print them: config.json goes through Python's `json.load` and
/// `json.dump(indent=4)` in mlx-lm, and is reproduced byte for byte.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Json {
    Null,
    Bool(bool),
    /// Python's text for the number (`1e-06`, `1000000.0`, `42`).
    Num {
        text: String,
        int: bool,
    },
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

impl Json {
    pub(super) fn int(v: u64) -> Json {
        Json::Num {
            text: v.to_string(),
            int: true,
        }
    }

    pub(super) fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Obj(f) => f.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    pub(super) fn get_mut(&mut self, key: &str) -> Option<&mut Json> {
        match self {
            Json::Obj(f) => f.iter_mut().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// Python's `d[key] = v`: in place when present, else appended.
    pub(super) fn set(&mut self, key: &str, v: Json) {
        if let Some(slot) = self.get_mut(key) {
            *slot = v;
        } else if let Json::Obj(f) = self {
            f.push((key.to_string(), v));
        }
    }

    pub(super) fn remove(&mut self, key: &str) {
        if let Json::Obj(f) = self {
            f.retain(|(k, _)| k != key);
        }
    }

    pub(super) fn as_str(&self) -> Option<&str> {
        match self {
            Json::Str(s) => Some(s),
            _ => None,
        }
    }

    pub(super) fn as_u64(&self) -> Option<u64> {
        match self {
            Json::Num { text, int: true } => text.parse().ok(),
            _ => None,
        }
    }

    pub(super) fn truthy(&self) -> bool {
        match self {
            Json::Null => false,
            Json::Bool(b) => *b,
            Json::Num { text, .. } => !matches!(text.parse::<f64>(), Ok(v) if v == 0.0),
            Json::Str(s) => !s.is_empty(),
            Json::Arr(a) => !a.is_empty(),
            Json::Obj(o) => !o.is_empty(),
        }
    }

    pub(super) fn parse(text: &str) -> std::result::Result<Json, String> {
        let mut p = Parser {
            s: text.as_bytes(),
            i: 0,
        };
        p.ws();
        let v = p.value(0)?;
        p.ws();
        if p.i != p.s.len() {
            return Err(format!("trailing characters at byte {}", p.i));
        }
        Ok(v)
    }

    /// `json.dumps(v, indent=4)` (ensure_ascii, no trailing newline).
    pub(super) fn dump(&self) -> String {
        let mut out = String::new();
        self.dump_into(&mut out, 0);
        out
    }

    fn dump_into(&self, out: &mut String, level: usize) {
        let pad = |out: &mut String, l: usize| out.extend(std::iter::repeat_n(' ', 4 * l));
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Num { text, .. } => out.push_str(text),
            Json::Str(s) => python_str(s, out),
            Json::Arr(a) if a.is_empty() => out.push_str("[]"),
            Json::Obj(o) if o.is_empty() => out.push_str("{}"),
            Json::Arr(a) => {
                out.push('[');
                for (i, v) in a.iter().enumerate() {
                    out.push_str(if i == 0 { "\n" } else { ",\n" });
                    pad(out, level + 1);
                    v.dump_into(out, level + 1);
                }
                out.push('\n');
                pad(out, level);
                out.push(']');
            }
            Json::Obj(o) => {
                out.push('{');
                for (i, (k, v)) in o.iter().enumerate() {
                    out.push_str(if i == 0 { "\n" } else { ",\n" });
                    pad(out, level + 1);
                    python_str(k, out);
                    out.push_str(": ");
                    v.dump_into(out, level + 1);
                }
                out.push('\n');
                pad(out, level);
                out.push('}');
            }
        }
    }
}

/// A string as Python's `json.dumps` writes it with `ensure_ascii`.
fn python_str(s: &str, out: &mut String) {
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
            ' '..='~' => out.push(c),
            _ => {
                let mut buf = [0u16; 2];
                for u in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{u:04x}"));
                }
            }
        }
    }
    out.push('"');
}

/// Python's `repr(float)`: the shortest digits that round-trip, fixed
/// notation for decimal exponents -4..16, else `d.ddde+XX`.
fn python_float(v: f64) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    // Rust's `{:e}` gives the shortest round-trip digits too: `1.5e-7`.
    let e = format!("{v:e}");
    let (mant, exp) = e.split_once('e').expect("LowerExp has an exponent");
    let exp: i32 = exp.parse().expect("an integer exponent");
    let (neg, mant) = match mant.strip_prefix('-') {
        Some(m) => (true, m),
        None => (false, mant),
    };
    let digits: String = mant.chars().filter(|c| *c != '.').collect();
    let decpt = exp + 1;
    let nd = digits.len() as i32;
    let body = if decpt <= -4 || decpt > 16 {
        let rest = &digits[1..];
        let m = if rest.is_empty() {
            digits[..1].to_string()
        } else {
            format!("{}.{rest}", &digits[..1])
        };
        let x = decpt - 1;
        format!("{m}e{}{:02}", if x < 0 { '-' } else { '+' }, x.abs())
    } else if decpt <= 0 {
        format!("0.{}{digits}", "0".repeat((-decpt) as usize))
    } else if decpt >= nd {
        format!("{digits}{}.0", "0".repeat((decpt - nd) as usize))
    } else {
        format!(
            "{}.{}",
            &digits[..decpt as usize],
            &digits[decpt as usize..]
        )
    };
    if neg {
        format!("-{body}")
    } else {
        body
    }
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && matches!(self.s[self.i], b' ' | b'\t' | b'\n' | b'\r') {
            self.i += 1;
        }
    }

    fn eat(&mut self, lit: &str) -> bool {
        if self.s[self.i..].starts_with(lit.as_bytes()) {
            self.i += lit.len();
            true
        } else {
            false
        }
    }

    fn err<T>(&self, what: &str) -> std::result::Result<T, String> {
        Err(format!("{what} at byte {}", self.i))
    }

    fn value(&mut self, depth: usize) -> std::result::Result<Json, String> {
        if depth > 256 {
            return self.err("nested too deeply");
        }
        match self.s.get(self.i) {
            None => self.err("unexpected end"),
            Some(b'{') => {
                self.i += 1;
                let mut obj = Json::Obj(Vec::new());
                self.ws();
                if self.eat("}") {
                    return Ok(obj);
                }
                loop {
                    self.ws();
                    if self.s.get(self.i) != Some(&b'"') {
                        return self.err("expected a key");
                    }
                    let k = self.string()?;
                    self.ws();
                    if !self.eat(":") {
                        return self.err("expected ':'");
                    }
                    self.ws();
                    let v = self.value(depth + 1)?;
                    // Python keeps a repeated key's first place, last value.
                    obj.set(&k, v);
                    self.ws();
                    if self.eat("}") {
                        return Ok(obj);
                    }
                    if !self.eat(",") {
                        return self.err("expected ',' or '}'");
                    }
                }
            }
            Some(b'[') => {
                self.i += 1;
                let mut arr = Vec::new();
                self.ws();
                if self.eat("]") {
                    return Ok(Json::Arr(arr));
                }
                loop {
                    self.ws();
                    arr.push(self.value(depth + 1)?);
                    self.ws();
                    if self.eat("]") {
                        return Ok(Json::Arr(arr));
                    }
                    if !self.eat(",") {
                        return self.err("expected ',' or ']'");
                    }
                }
            }
            Some(b'"') => Ok(Json::Str(self.string()?)),
            Some(_) if self.eat("null") => Ok(Json::Null),
            Some(_) if self.eat("true") => Ok(Json::Bool(true)),
            Some(_) if self.eat("false") => Ok(Json::Bool(false)),
            Some(_) if self.eat("NaN") => Ok(Json::Num {
                text: "NaN".into(),
                int: false,
            }),
            Some(_) if self.eat("Infinity") => Ok(Json::Num {
                text: "Infinity".into(),
                int: false,
            }),
            Some(_) if self.eat("-Infinity") => Ok(Json::Num {
                text: "-Infinity".into(),
                int: false,
            }),
            Some(_) => self.number(),
        }
    }

    fn number(&mut self) -> std::result::Result<Json, String> {
        let start = self.i;
        let digits = |p: &mut Self| {
            let s = p.i;
            while p.i < p.s.len() && p.s[p.i].is_ascii_digit() {
                p.i += 1;
            }
            p.i > s
        };
        self.eat("-");
        if self.eat("0") {
        } else if !digits(self) {
            return self.err("unexpected character");
        }
        let mut int = true;
        if self.eat(".") {
            int = false;
            if !digits(self) {
                return self.err("expected digits after '.'");
            }
        }
        if self.eat("e") || self.eat("E") {
            int = false;
            if !self.eat("+") {
                self.eat("-");
            }
            if !digits(self) {
                return self.err("expected exponent digits");
            }
        }
        let raw = std::str::from_utf8(&self.s[start..self.i]).expect("ASCII");
        let text = if int {
            // Python's int(): "-0" prints as 0; anything else as written.
            if raw == "-0" {
                "0".to_string()
            } else {
                raw.to_string()
            }
        } else {
            python_float(
                raw.parse::<f64>()
                    .map_err(|e| format!("bad number {raw}: {e}"))?,
            )
        };
        Ok(Json::Num { text, int })
    }

    fn hex4(&mut self) -> std::result::Result<u32, String> {
        let h = self
            .s
            .get(self.i..self.i + 4)
            .ok_or("truncated \\u escape")?;
        let h = std::str::from_utf8(h).map_err(|_| "bad \\u escape")?;
        let v =
            u32::from_str_radix(h, 16).map_err(|_| format!("bad \\u escape at byte {}", self.i))?;
        self.i += 4;
        Ok(v)
    }

    fn string(&mut self) -> std::result::Result<String, String> {
        self.i += 1; // the opening quote
        let mut out = String::new();
        loop {
            let start = self.i;
            while self.i < self.s.len()
                && !matches!(self.s[self.i], b'"' | b'\\')
                && self.s[self.i] >= 0x20
            {
                self.i += 1;
            }
            out.push_str(std::str::from_utf8(&self.s[start..self.i]).map_err(|e| e.to_string())?);
            match self.s.get(self.i) {
                None => return self.err("unterminated string"),
                Some(b'"') => {
                    self.i += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    self.i += 1;
                    let c = self.s.get(self.i).copied();
                    self.i += 1;
                    match c {
                        Some(b'"') => out.push('"'),
                        Some(b'\\') => out.push('\\'),
                        Some(b'/') => out.push('/'),
                        Some(b'b') => out.push('\u{8}'),
                        Some(b'f') => out.push('\u{c}'),
                        Some(b'n') => out.push('\n'),
                        Some(b'r') => out.push('\r'),
                        Some(b't') => out.push('\t'),
                        Some(b'u') => {
                            let mut u = self.hex4()?;
                            if (0xd800..0xdc00).contains(&u) && self.eat("\\u") {
                                let lo = self.hex4()?;
                                if (0xdc00..0xe000).contains(&lo) {
                                    u = 0x10000 + ((u - 0xd800) << 10) + (lo - 0xdc00);
                                } else {
                                    return self.err("unpaired surrogate");
                                }
                            }
                            out.push(
                                char::from_u32(u).ok_or_else(|| {
                                    format!("unpaired surrogate at byte {}", self.i)
                                })?,
                            );
                        }
                        _ => return self.err("bad escape"),
                    }
                }
                Some(_) => return self.err("control character in a string"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_as_python_repr() {
        for (v, want) in [
            (1e-6, "1e-06"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (1_000_000.0, "1000000.0"),
            (30.0, "30.0"),
            (0.25, "0.25"),
            (0.02, "0.02"),
            (-0.0, "-0.0"),
            (1.5e-7, "1.5e-07"),
            (123456789012345678.0, "1.2345678901234568e+17"),
            (0.1 + 0.2, "0.30000000000000004"),
            (5e-324, "5e-324"),
            (f64::MAX, "1.7976931348623157e+308"),
        ] {
            assert_eq!(python_float(v), want);
        }
    }

    #[test]
    fn json_round_trips_in_python_style() {
        let v = Json::parse(
            r#"{"b": [1, 2.50, -0, {}], "a": {"x": "é\n\u00e9\ud83d\ude00"}, "b": 3, "c": []}"#,
        )
        .unwrap();
        assert_eq!(
            v.dump(),
            "{\n    \"b\": 3,\n    \"a\": {\n        \"x\": \"\\u00e9\\n\\u00e9\\ud83d\\ude00\"\n    },\n    \"c\": []\n}"
        );
        assert!(Json::parse("{\"a\": 1,}").is_err());
        assert!(Json::parse("[1] x").is_err());
    }
}
