//! Gemma 4's replies parsed into OpenAI message parts: the thinking
//! between `<|channel>thought` and `<channel|>` as `reasoning_content`,
//! each `<|tool_call>call:NAME{key:value,...}<tool_call|>` as a tool call
//! whose arguments are JSON, the rest as `content`. The reply ends at
//! `<turn|>` (the model's turn closed) or `<|tool_response>` (the model
//! waits for a tool's answer); what follows is not part of it.
//!
//! The text must be decoded with its special tokens (the markers are
//! special tokens that a decode skipping them drops). [`ReplyParser`] takes
//! it piece by piece as tokens arrive and never lets a marker, or the start
//! of one, out as content or reasoning; [`parse_reply`] is the same parser
//! over a whole text, so the deltas of a stream add up to it.
//!
//! Arguments: strings quoted `<|"|>...<|"|>` (or JSON's `"..."`), numbers,
//! `true`/`false`/`null` (and Python's `True`/`False`/`None`, as templates
//! print them), `{key:value}` objects with bare or quoted keys, `[...]`
//! arrays; any other bare word is taken as a string. A call whose body does
//! not parse, or that never closes, is kept as content, as written.

use std::fmt::Write;

/// Opens a channel (`<|channel>thought\n`: the model's thinking).
pub const CHANNEL_OPEN: &str = "<|channel>";
/// Closes a channel.
pub const CHANNEL_CLOSE: &str = "<channel|>";
/// The thinking channel's name, after [`CHANNEL_OPEN`] (a line break follows).
pub const THOUGHT: &str = "thought";
/// Opens a tool call: `call:NAME{...}` follows.
pub const TOOL_CALL_OPEN: &str = "<|tool_call>";
/// Closes a tool call.
pub const TOOL_CALL_CLOSE: &str = "<tool_call|>";
/// Quotes a string in a tool call, on both sides.
pub const QUOTE: &str = "<|\"|>";
/// Ends the model's turn.
pub const TURN_END: &str = "<turn|>";
/// Opens a tool's response: the model wrote its calls and waits.
pub const TOOL_RESPONSE_OPEN: &str = "<|tool_response>";

/// Where a reply ends: generation may stop at either.
pub const STOP_MARKERS: [&str; 2] = [TURN_END, TOOL_RESPONSE_OPEN];

/// Deepest nesting of objects and arrays in a call's arguments (deeper is
/// malformed: kept as content).
pub const MAX_DEPTH: usize = 64;

/// A whole reply's parts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reply {
    /// The thinking (empty: none).
    pub reasoning_content: String,
    /// The text for the user.
    pub content: String,
    /// The tool calls, in order.
    pub tool_calls: Vec<ToolCall>,
}

/// One tool call: the function's name and its arguments as a JSON object's
/// text (OpenAI's `function.arguments`). Ids are the caller's to give.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ToolCall {
    pub name: String,
    pub arguments: String,
}

/// What a piece of streamed text adds to the reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Delta {
    /// More thinking.
    Reasoning(String),
    /// More content.
    Content(String),
    /// Tool call `index` (0, 1, ...) begins: its name.
    ToolCallStart { index: usize, name: String },
    /// More of tool call `index`'s arguments (JSON text).
    ToolCallArguments { index: usize, arguments: String },
}

impl Reply {
    /// The reply with `delta` applied.
    pub fn apply(&mut self, delta: Delta) {
        match delta {
            Delta::Reasoning(s) => self.reasoning_content.push_str(&s),
            Delta::Content(s) => self.content.push_str(&s),
            Delta::ToolCallStart { name, .. } => self.tool_calls.push(ToolCall {
                name,
                arguments: String::new(),
            }),
            Delta::ToolCallArguments { index, arguments } => {
                if let Some(call) = self.tool_calls.get_mut(index) {
                    call.arguments.push_str(&arguments);
                }
            }
        }
    }
}

/// `text`, a whole reply, in its parts.
pub fn parse_reply(text: &str) -> Reply {
    let mut p = ReplyParser::new();
    let mut reply = Reply::default();
    for d in p.push(text).into_iter().chain(p.finish()) {
        reply.apply(d);
    }
    reply
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Content,
    /// In a channel; `named`: its name (`thought\n`) is behind.
    Reasoning {
        named: bool,
    },
    /// In a tool call, its text held until it closes.
    ToolCall,
    /// The reply is over.
    Ended,
}

/// The reply parser for text that comes in pieces.
#[derive(Clone, Debug)]
pub struct ReplyParser {
    state: State,
    /// Text not yet given out: a possible marker's start, or a tool call's
    /// body.
    held: String,
    calls: usize,
}

impl Default for ReplyParser {
    fn default() -> Self {
        Self::new()
    }
}

impl ReplyParser {
    pub fn new() -> Self {
        ReplyParser {
            state: State::Content,
            held: String::new(),
            calls: 0,
        }
    }

    /// Whether the reply has ended (`<turn|>` or `<|tool_response>` seen):
    /// what comes after is ignored, and generation may stop.
    pub fn ended(&self) -> bool {
        self.state == State::Ended
    }

    /// The next piece of text; what it adds, holding back what may be a
    /// marker's start.
    pub fn push(&mut self, piece: &str) -> Vec<Delta> {
        let mut out = Vec::new();
        if self.state == State::Ended {
            return out;
        }
        self.held.push_str(piece);
        loop {
            match self.state {
                State::Ended => {
                    self.held.clear();
                    break;
                }
                State::Content => {
                    const MARKS: [&str; 4] =
                        [CHANNEL_OPEN, TOOL_CALL_OPEN, TURN_END, TOOL_RESPONSE_OPEN];
                    match earliest(&self.held, &MARKS) {
                        Some((i, mark)) => {
                            emit(&mut out, Delta::Content, &self.held[..i]);
                            self.held.drain(..i + mark.len());
                            self.state = match mark {
                                CHANNEL_OPEN => State::Reasoning { named: false },
                                TOOL_CALL_OPEN => State::ToolCall,
                                _ => State::Ended,
                            };
                        }
                        None => {
                            self.release(&mut out, Delta::Content, &MARKS);
                            break;
                        }
                    }
                }
                State::Reasoning { named: false } => {
                    let name = format!("{THOUGHT}\n");
                    if name.starts_with(self.held.as_str()) {
                        break; // (the name may be coming)
                    }
                    let skip = if self.held.starts_with(&name) {
                        name.len()
                    } else if self.held.starts_with(THOUGHT) {
                        THOUGHT.len()
                    } else {
                        0
                    };
                    self.held.drain(..skip);
                    self.state = State::Reasoning { named: true };
                }
                State::Reasoning { named: true } => {
                    const MARKS: [&str; 2] = [CHANNEL_CLOSE, TURN_END];
                    match earliest(&self.held, &MARKS) {
                        Some((i, mark)) => {
                            emit(&mut out, Delta::Reasoning, &self.held[..i]);
                            self.held.drain(..i + mark.len());
                            self.state = if mark == TURN_END {
                                State::Ended
                            } else {
                                State::Content
                            };
                        }
                        None => {
                            self.release(&mut out, Delta::Reasoning, &MARKS);
                            break;
                        }
                    }
                }
                State::ToolCall => match call_end(&self.held) {
                    CallEnd::Open => break,
                    CallEnd::Closed(end) => {
                        let body = self.held[..end].to_string();
                        self.held.drain(..end + TOOL_CALL_CLOSE.len());
                        match parse_call(&body) {
                            Ok((name, arguments)) => {
                                let index = self.calls;
                                self.calls += 1;
                                out.push(Delta::ToolCallStart { index, name });
                                out.push(Delta::ToolCallArguments { index, arguments });
                            }
                            Err(()) => {
                                let raw = format!("{TOOL_CALL_OPEN}{body}{TOOL_CALL_CLOSE}");
                                out.push(Delta::Content(raw));
                            }
                        }
                        self.state = State::Content;
                    }
                    CallEnd::TurnEnded(end) => {
                        // (the turn ended inside the call: it never closed)
                        let raw = format!("{TOOL_CALL_OPEN}{}", &self.held[..end]);
                        out.push(Delta::Content(raw));
                        self.state = State::Ended;
                    }
                },
            }
        }
        out
    }

    /// The end of the text: what was held back, given out as what it is
    /// (an unclosed tool call as content).
    pub fn finish(&mut self) -> Vec<Delta> {
        let mut out = Vec::new();
        let held = std::mem::take(&mut self.held);
        match self.state {
            State::Content => emit(&mut out, Delta::Content, &held),
            State::Reasoning { named } => {
                // (a channel cut short in its name: the name is dropped)
                let thinking = if !named && format!("{THOUGHT}\n").starts_with(held.as_str()) {
                    ""
                } else {
                    held.as_str()
                };
                emit(&mut out, Delta::Reasoning, thinking);
            }
            State::ToolCall => out.push(Delta::Content(format!("{TOOL_CALL_OPEN}{held}"))),
            State::Ended => {}
        }
        self.state = State::Ended;
        out
    }

    /// Gives out the held text but the longest end that may start one of
    /// `marks`.
    fn release(&mut self, out: &mut Vec<Delta>, kind: fn(String) -> Delta, marks: &[&str]) {
        let keep = partial_marker(&self.held, marks);
        let give = self.held.len() - keep;
        emit(out, kind, &self.held[..give]);
        self.held.drain(..give);
    }
}

fn emit(out: &mut Vec<Delta>, kind: fn(String) -> Delta, text: &str) {
    if !text.is_empty() {
        out.push(kind(text.to_string()));
    }
}

/// The first of `marks` in `text`: where, and which.
fn earliest<'m>(text: &str, marks: &[&'m str]) -> Option<(usize, &'m str)> {
    marks
        .iter()
        .filter_map(|m| text.find(m).map(|i| (i, *m)))
        .min_by_key(|(i, _)| *i)
}

/// The length of the longest end of `text` that is a proper start of one of
/// `marks` (ASCII, so the cut is on a character boundary).
fn partial_marker(text: &str, marks: &[&str]) -> usize {
    marks
        .iter()
        .flat_map(|m| (1..m.len()).filter(move |&k| text.ends_with(&m[..k])))
        .max()
        .unwrap_or(0)
}

enum CallEnd {
    /// Not closed yet.
    Open,
    /// `<tool_call|>` at this offset (outside quoted strings).
    Closed(usize),
    /// `<turn|>` at this offset, before any close.
    TurnEnded(usize),
}

/// Where a tool call's body ends; a marker inside `<|"|>` quotes is text.
fn call_end(body: &str) -> CallEnd {
    let mut quoted = false;
    let mut i = 0;
    while i < body.len() {
        let rest = &body[i..];
        if rest.starts_with(QUOTE) {
            quoted = !quoted;
            i += QUOTE.len();
            continue;
        }
        if !quoted && rest.starts_with(TOOL_CALL_CLOSE) {
            return CallEnd::Closed(i);
        }
        if !quoted && rest.starts_with(TURN_END) {
            return CallEnd::TurnEnded(i);
        }
        i += rest.chars().next().map_or(1, char::len_utf8);
    }
    CallEnd::Open
}

/// `call:NAME{...}`: the name and the arguments as JSON text.
fn parse_call(body: &str) -> Result<(String, String), ()> {
    let rest = body.trim_start().strip_prefix("call:").ok_or(())?;
    let brace = rest.find('{').ok_or(())?;
    let name = rest[..brace].trim();
    let name_ok = |c: char| c.is_alphanumeric() || "_-.:/".contains(c);
    if name.is_empty() || !name.chars().all(name_ok) {
        return Err(());
    }
    let mut p = Args {
        s: &rest[brace..],
        pos: 0,
    };
    let mut json = String::new();
    p.value(&mut json, 0)?;
    p.ws();
    if p.pos != p.s.len() {
        return Err(());
    }
    Ok((name.to_string(), json))
}

/// A cursor over a tool call's arguments, writing them as JSON.
struct Args<'a> {
    s: &'a str,
    pos: usize,
}

impl Args<'_> {
    fn rest(&self) -> &str {
        &self.s[self.pos..]
    }

    fn ws(&mut self) {
        let r = self.rest();
        self.pos += r.len() - r.trim_start().len();
    }

    fn eat(&mut self, lit: &str) -> bool {
        if self.rest().starts_with(lit) {
            self.pos += lit.len();
            true
        } else {
            false
        }
    }

    fn value(&mut self, out: &mut String, depth: usize) -> Result<(), ()> {
        if depth > MAX_DEPTH {
            return Err(());
        }
        self.ws();
        if self.eat("{") {
            out.push('{');
            self.ws();
            if !self.eat("}") {
                loop {
                    self.ws();
                    let key = self.key()?;
                    json_string(&key, out);
                    out.push(':');
                    self.value(out, depth + 1)?;
                    self.ws();
                    if self.eat(",") {
                        out.push(',');
                    } else if self.eat("}") {
                        break;
                    } else {
                        return Err(());
                    }
                }
            }
            out.push('}');
        } else if self.eat("[") {
            out.push('[');
            self.ws();
            if !self.eat("]") {
                loop {
                    self.value(out, depth + 1)?;
                    self.ws();
                    if self.eat(",") {
                        out.push(',');
                    } else if self.eat("]") {
                        break;
                    } else {
                        return Err(());
                    }
                }
            }
            out.push(']');
        } else if let Some(s) = self.string()? {
            json_string(&s, out);
        } else {
            let word = self.bare();
            if word.is_empty() {
                return Err(());
            }
            out.push_str(&literal(word));
        }
        Ok(())
    }

    /// A quoted string (`<|"|>` or JSON's `"`), or None where none starts.
    fn string(&mut self) -> Result<Option<String>, ()> {
        if self.eat(QUOTE) {
            let end = self.rest().find(QUOTE).ok_or(())?;
            let s = self.rest()[..end].to_string();
            self.pos += end + QUOTE.len();
            return Ok(Some(s));
        }
        if self.rest().starts_with('"') {
            let mut de = serde_json::Deserializer::from_str(self.rest()).into_iter::<String>();
            let s = de.next().ok_or(())?.map_err(|_| ())?;
            self.pos += de.byte_offset();
            return Ok(Some(s));
        }
        Ok(None)
    }

    /// An object's key: quoted, or bare up to its `:`.
    fn key(&mut self) -> Result<String, ()> {
        let key = match self.string()? {
            Some(k) => k,
            None => {
                let end = self.rest().find(':').ok_or(())?;
                let k = self.rest()[..end].trim().to_string();
                self.pos += end;
                if k.is_empty() || k.contains([',', '{', '}', '[', ']']) {
                    return Err(());
                }
                k
            }
        };
        self.ws();
        if !self.eat(":") {
            return Err(());
        }
        Ok(key)
    }

    /// A bare word up to the next `,`, `}` or `]`, trimmed.
    fn bare(&mut self) -> &str {
        let r = self.rest();
        let end = r.find([',', '}', ']']).unwrap_or(r.len());
        let start = self.pos;
        self.pos += end;
        self.s[start..start + end].trim()
    }
}

/// A bare word as JSON: a literal, a number, else a string.
fn literal(word: &str) -> String {
    match word {
        "true" | "True" => return "true".into(),
        "false" | "False" => return "false".into(),
        "null" | "None" => return "null".into(),
        _ => {}
    }
    if let Ok(serde_json::Value::Number(_)) = serde_json::from_str::<serde_json::Value>(word) {
        return word.to_string();
    }
    if let Ok(f) = word.parse::<f64>() {
        if f.is_finite() && word.bytes().any(|b| b.is_ascii_digit()) {
            return serde_json::Number::from_f64(f)
                .map_or_else(|| "null".into(), |n| n.to_string());
        }
    }
    let mut s = String::new();
    json_string(word, &mut s);
    s
}

fn json_string(s: &str, out: &mut String) {
    let _ = write!(out, "{}", serde_json::Value::from(s));
}

#[cfg(test)]
mod tests;
