//! A checkpoint's own chat template, rendered as Hugging Face transformers
//! renders it (`apply_chat_template`): Jinja2 with `trim_blocks`,
//! `lstrip_blocks` and loop controls, transformers' `tojson`,
//! `raise_exception`, `strftime_now` and `namespace`, Python's string and
//! dict methods, and Python's printing of values (`None`, `True`, lists).
//! The template comes from `chat_template.jinja` in the model folder, else
//! `tokenizer_config.json`'s `chat_template` (a string, or a list of named
//! ones), else `chat_template.json`.
//!
//! No printing here: `chat`, `generate --chat` and a server share it
//! (the library half of the CLI package, `turbospark_cli`).

pub mod clock;
mod python;

use std::fmt;
use std::path::Path;

use minijinja::value::{Kwargs, Rest, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind};

pub use python::{py_str, PyJson};

/// Most bytes of a template file, or of the tokenizer config that holds one
/// (a tokenizer config lists every added token, megabytes at most).
pub const TEMPLATE_FILE_MAX_BYTES: u64 = 64 << 20;

/// The name transformers gives the template used when none is named.
pub const DEFAULT_NAME: &str = "default";

/// What went wrong finding, compiling or rendering a template; the message
/// names the file, template or value at fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateError(pub String);

impl fmt::Display for TemplateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TemplateError {}

type Result<T, E = TemplateError> = std::result::Result<T, E>;

fn err<T>(msg: impl Into<String>) -> Result<T> {
    Err(TemplateError(msg.into()))
}

/// A compiled chat template and the special tokens it is rendered with.
pub struct ChatTemplate {
    env: Environment<'static>,
    /// Where it came from, for messages (`DIR/chat_template.jinja`, ...).
    origin: String,
    /// `bos_token`, `eos_token`, ... as the tokenizer config names them:
    /// variables of every render (transformers' special tokens map).
    special_tokens: Vec<(String, String)>,
}

/// What a render takes besides the template: the conversation, tools, and
/// the variables transformers passes.
#[derive(Clone, Debug, Default)]
pub struct RenderInput {
    /// A list of messages (`{role, content, ...}` maps), as OpenAI's and
    /// transformers' APIs take them; [`json`] parses one keeping key order.
    pub messages: Value,
    /// Tool declarations (OpenAI's `{type: function, function: {...}}`).
    pub tools: Option<Value>,
    /// Open the model's turn after the conversation.
    pub add_generation_prompt: bool,
    /// `enable_thinking`, when given (undefined in the template otherwise).
    pub enable_thinking: Option<bool>,
    /// Further template variables (`chat_template_kwargs`): a map, or none.
    /// They override the special tokens and `enable_thinking`.
    pub kwargs: Option<Value>,
}

/// `text` (JSON) as a template value, maps keeping their key order.
pub fn json(text: &str) -> Result<Value> {
    serde_json::from_str::<Value>(text).map_err(|e| TemplateError(format!("invalid JSON: {e}")))
}

/// A `{role, content}` message.
pub fn message(role: &str, content: &str) -> Value {
    Value::from_iter([("role", role), ("content", content)])
}

impl ChatTemplate {
    /// `source` compiled; `origin` names it in errors. A syntax error is an
    /// error naming the line.
    pub fn new(source: &str, origin: &str) -> Result<Self> {
        let mut env = Environment::new();
        // transformers: jinja2.Environment(trim_blocks=True,
        // lstrip_blocks=True, extensions=[loopcontrols]), no autoescape, a
        // template's one trailing newline dropped (jinja2's default)
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(|out, _state, value| {
            out.write_str(&py_str(value))
                .map_err(|e| Error::new(ErrorKind::WriteFailure, e.to_string()))
        });
        env.add_filter("tojson", tojson);
        env.add_filter("string", |v: &Value| py_str(v));
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| {
                TemplateError(format!(
                    "{origin}: the chat template does not compile: {}",
                    describe(&e)
                ))
            })?;
        Ok(ChatTemplate {
            env,
            origin: origin.to_string(),
            special_tokens: Vec::new(),
        })
    }

    /// This template rendered with these special tokens (`bos_token`, ...).
    pub fn with_special_tokens(mut self, tokens: Vec<(String, String)>) -> Self {
        self.special_tokens = tokens;
        self
    }

    /// Where the template came from.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The special tokens a render sees.
    pub fn special_tokens(&self) -> &[(String, String)] {
        &self.special_tokens
    }

    /// One special token's text (`"bos_token"`, `"eos_token"`, ...).
    pub fn special_token(&self, name: &str) -> Option<&str> {
        self.special_tokens
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t.as_str())
    }

    /// The conversation rendered: the prompt text, special tokens included
    /// as text (tokenize it without adding a BOS: the template writes its
    /// own). An error names what the template rejected: a
    /// `raise_exception` message, an undefined value, a bad operation.
    pub fn render(&self, input: &RenderInput) -> Result<String> {
        if input.messages.kind() != ValueKind::Seq {
            return err(format!(
                "the messages must be a list, not {}",
                input.messages.kind()
            ));
        }
        let messages = alias_reasoning(&input.messages)?;
        // transformers: render(messages=, tools=, documents=,
        // add_generation_prompt=, **special_tokens, **kwargs); tools and
        // documents are there (none) when not given
        let mut vars: Vec<(String, Value)> = vec![
            ("messages".into(), messages),
            (
                "tools".into(),
                input.tools.clone().unwrap_or(Value::from(())),
            ),
            ("documents".into(), Value::from(())),
            (
                "add_generation_prompt".into(),
                Value::from(input.add_generation_prompt),
            ),
        ];
        for (name, token) in &self.special_tokens {
            set(&mut vars, name, Value::from(token.as_str()));
        }
        if let Some(on) = input.enable_thinking {
            set(&mut vars, "enable_thinking", Value::from(on));
        }
        if let Some(kwargs) = &input.kwargs {
            match kwargs.kind() {
                ValueKind::Map => {
                    for key in kwargs
                        .try_iter()
                        .map_err(|e| TemplateError(e.to_string()))?
                    {
                        let Some(name) = key.as_str() else {
                            return err(format!(
                                "a template variable's name must be a string, not {key}"
                            ));
                        };
                        let v = kwargs
                            .get_item(&key)
                            .map_err(|e| TemplateError(e.to_string()))?;
                        set(&mut vars, name, v);
                    }
                }
                ValueKind::None | ValueKind::Undefined => {}
                k => return err(format!("chat_template_kwargs must be a map, not {k}")),
            }
        }
        let ctx: Value = vars.into_iter().collect();
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| TemplateError(e.to_string()))?;
        tmpl.render(ctx).map_err(|e| {
            TemplateError(format!(
                "{}: rendering the chat template: {}",
                self.origin,
                describe(&e)
            ))
        })
    }
}

fn set(vars: &mut Vec<(String, Value)>, name: &str, v: Value) {
    match vars.iter_mut().find(|(n, _)| n == name) {
        Some(slot) => slot.1 = v,
        None => vars.push((name.to_string(), v)),
    }
}

/// A minijinja error and its causes in one line (a raise_exception
/// message, the line it failed at).
fn describe(e: &Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(cause) = src {
        s.push_str(&format!(": {cause}"));
        src = cause.source();
    }
    s
}

/// transformers' `_alias_reasoning_fields`: a message's reasoning, under
/// any of `reasoning_content`, `thinking` or `reasoning`, is given as
/// `thinking` (first, unless the message has its own) and
/// `reasoning_content` too.
fn alias_reasoning(messages: &Value) -> Result<Value> {
    const FIELDS: [&str; 3] = ["reasoning_content", "thinking", "reasoning"];
    let iter = messages
        .try_iter()
        .map_err(|e| TemplateError(e.to_string()))?;
    let mut out = Vec::new();
    for (i, m) in iter.enumerate() {
        if m.kind() != ValueKind::Map {
            return err(format!(
                "message {i} must be a map with a role, not {}",
                py_str(&m)
            ));
        }
        let get = |k: &str| m.get_attr(k).ok().filter(|v| !v.is_undefined());
        let reasoning = FIELDS.iter().find_map(|f| get(f).filter(|v| !v.is_none()));
        let Some(reasoning) = reasoning else {
            out.push(m);
            continue;
        };
        let mut pairs: Vec<(Value, Value)> = vec![(Value::from("thinking"), reasoning.clone())];
        for key in m.try_iter().map_err(|e| TemplateError(e.to_string()))? {
            let v = m.get_item(&key).map_err(|e| TemplateError(e.to_string()))?;
            match pairs.iter_mut().find(|(k, _)| *k == key) {
                Some(slot) => slot.1 = v,
                None => pairs.push((key, v)),
            }
        }
        let rc = Value::from("reasoning_content");
        match pairs.iter_mut().find(|(k, _)| *k == rc) {
            Some(slot) => slot.1 = reasoning,
            None => pairs.push((rc, reasoning)),
        }
        out.push(pairs.into_iter().collect());
    }
    Ok(Value::from(out))
}

/// transformers' `tojson`: `json.dumps(x, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`, no HTML escaping.
fn tojson(v: &Value, args: Rest<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    const NAMES: [&str; 4] = ["ensure_ascii", "indent", "separators", "sort_keys"];
    if args.len() > NAMES.len() {
        return Err(Error::new(
            ErrorKind::TooManyArguments,
            "tojson takes at most ensure_ascii, indent, separators, sort_keys",
        ));
    }
    let pick = |name: &str| -> Result<Option<Value>, Error> {
        let kw: Option<Value> = kwargs.get(name)?;
        let pos = NAMES
            .iter()
            .position(|n| *n == name)
            .and_then(|i| args.get(i).cloned());
        Ok(kw.or(pos).filter(|v| !v.is_none() && !v.is_undefined()))
    };
    let (ensure_ascii, indent, separators, sort_keys) = (
        pick(NAMES[0])?,
        pick(NAMES[1])?,
        pick(NAMES[2])?,
        pick(NAMES[3])?,
    );
    let mut opts = PyJson::default();
    if let Some(a) = ensure_ascii {
        opts.ensure_ascii = a.is_true();
    }
    if let Some(i) = indent {
        opts.indent = Some(match (i.as_i64(), i.as_str()) {
            (Some(n), _) => " ".repeat(n.max(0) as usize),
            (None, Some(s)) => s.to_string(),
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson: indent must be a number or a string, not {i}"),
                ))
            }
        });
    }
    if let Some(s) = separators {
        let parts: Vec<Value> = s.try_iter()?.collect();
        match parts.as_slice() {
            [a, b] if a.as_str().is_some() && b.as_str().is_some() => {
                opts.separators = Some((a.as_str().unwrap().into(), b.as_str().unwrap().into()));
            }
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: separators must be two strings",
                ))
            }
        }
    }
    if let Some(s) = sort_keys {
        opts.sort_keys = s.is_true();
    }
    kwargs.assert_all_used()?;
    Ok(Value::from(opts.dumps(v)?))
}

/// transformers' `raise_exception(message)`: the render fails with it.
fn raise_exception(message: &Value) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, py_str(message)))
}

/// transformers' `strftime_now(format)`: the local time, as Python's
/// `datetime.now().strftime` writes it.
fn strftime_now(format: &str) -> String {
    clock::strftime(format, &clock::now_local())
}

/// The template files of a checkpoint folder, in transformers' order.
pub const TEMPLATE_FILE: &str = "chat_template.jinja";
/// Named templates beside [`TEMPLATE_FILE`]: `additional_chat_templates/NAME.jinja`.
pub const NAMED_TEMPLATE_DIR: &str = "additional_chat_templates";

/// `dir`'s chat template (`name`: a named one; `None`: the default) with
/// the tokenizer config's special tokens, or `None` where the checkpoint has
/// no template (and no name was asked for). An unreadable file, a template
/// that does not compile, or a name the checkpoint lacks is an error.
pub fn load(dir: &Path, name: Option<&str>) -> Result<Option<ChatTemplate>> {
    let config_path = dir.join("tokenizer_config.json");
    let config = read_json(&config_path)?;
    let special = config.as_ref().map(special_tokens).unwrap_or_default();
    let wanted = name.filter(|n| *n != DEFAULT_NAME);
    let found = match wanted {
        None => find_default(dir, config.as_ref(), &config_path)?,
        Some(n) => Some(find_named(dir, config.as_ref(), &config_path, n)?),
    };
    let Some((source, origin)) = found else {
        return match name {
            Some(n) => err(format!(
                "{} has no chat template, so none named {n:?}",
                dir.display()
            )),
            None => Ok(None),
        };
    };
    Ok(Some(
        ChatTemplate::new(&source, &origin)?.with_special_tokens(special),
    ))
}

fn find_default(
    dir: &Path,
    config: Option<&serde_json::Value>,
    config_path: &Path,
) -> Result<Option<(String, String)>> {
    let jinja = dir.join(TEMPLATE_FILE);
    if exists(&jinja) {
        return Ok(Some((read_text(&jinja)?, jinja.display().to_string())));
    }
    if let Some(t) = config.and_then(|c| c.get("chat_template")) {
        let origin = format!("{} (chat_template)", config_path.display());
        return match t {
            serde_json::Value::String(s) => Ok(Some((s.clone(), origin))),
            serde_json::Value::Array(list) => match pick_named(list, DEFAULT_NAME, &origin)? {
                Some(s) => Ok(Some((s, format!("{origin}, {DEFAULT_NAME:?}")))),
                None => err(format!(
                    "{origin}: a list of templates without one named {DEFAULT_NAME:?} (it has {})",
                    names(list).join(", ")
                )),
            },
            serde_json::Value::Null => Ok(None),
            _ => err(format!(
                "{origin}: must be a string or a list of {{name, template}}"
            )),
        };
    }
    // (a processor's template file, as some multimodal checkpoints have it)
    let processor = dir.join("chat_template.json");
    if let Some(v) = read_json(&processor)? {
        return match v.get("chat_template") {
            Some(serde_json::Value::String(s)) => Ok(Some((
                s.clone(),
                format!("{} (chat_template)", processor.display()),
            ))),
            _ => err(format!(
                "{}: no chat_template string in it",
                processor.display()
            )),
        };
    }
    Ok(None)
}

fn find_named(
    dir: &Path,
    config: Option<&serde_json::Value>,
    config_path: &Path,
    name: &str,
) -> Result<(String, String)> {
    if name.is_empty() || name.contains(['/', '\\']) || name.starts_with('.') {
        return err(format!("{name:?} is not a template name"));
    }
    let file = dir.join(NAMED_TEMPLATE_DIR).join(format!("{name}.jinja"));
    if exists(&file) {
        return Ok((read_text(&file)?, file.display().to_string()));
    }
    let origin = format!("{} (chat_template)", config_path.display());
    let list = match config.and_then(|c| c.get("chat_template")) {
        Some(serde_json::Value::Array(list)) => list.as_slice(),
        _ => &[],
    };
    match pick_named(list, name, &origin)? {
        Some(s) => Ok((s, format!("{origin}, {name:?}"))),
        None => {
            let mut have = names(list);
            if let Ok(rd) = std::fs::read_dir(dir.join(NAMED_TEMPLATE_DIR)) {
                have.extend(rd.filter_map(|e| {
                    let n = e.ok()?.file_name().into_string().ok()?;
                    n.strip_suffix(".jinja").map(str::to_string)
                }));
            }
            err(format!(
                "{} has no chat template named {name:?} (it has: {})",
                dir.display(),
                if have.is_empty() {
                    "none by name".to_string()
                } else {
                    have.join(", ")
                }
            ))
        }
    }
}

/// `name`'s template in a `[{name, template}]` list.
fn pick_named(list: &[serde_json::Value], name: &str, origin: &str) -> Result<Option<String>> {
    for (i, entry) in list.iter().enumerate() {
        let (Some(n), Some(t)) = (
            entry.get("name").and_then(|v| v.as_str()),
            entry.get("template").and_then(|v| v.as_str()),
        ) else {
            return err(format!(
                "{origin}: entry {i} is not a {{name, template}} pair of strings"
            ));
        };
        if n == name {
            return Ok(Some(t.to_string()));
        }
    }
    Ok(None)
}

fn names(list: &[serde_json::Value]) -> Vec<String> {
    list.iter()
        .filter_map(|e| e.get("name")?.as_str().map(str::to_string))
        .collect()
}

/// The special tokens transformers passes to a template (its special
/// tokens map), as the tokenizer config spells them: a string, or an added
/// token's `{content: ...}`.
fn special_tokens(config: &serde_json::Value) -> Vec<(String, String)> {
    const NAMES: [&str; 7] = [
        "bos_token",
        "eos_token",
        "unk_token",
        "sep_token",
        "pad_token",
        "cls_token",
        "mask_token",
    ];
    NAMES
        .iter()
        .filter_map(|&n| {
            let v = config.get(n)?;
            let text = v
                .as_str()
                .or_else(|| v.get("content").and_then(|c| c.as_str()))?;
            Some((n.to_string(), text.to_string()))
        })
        .collect()
}

fn exists(path: &Path) -> bool {
    // (symlink_metadata: a dangling link is there, and an error when read)
    std::fs::symlink_metadata(path).is_ok()
}

/// A regular file's text, of at most [`TEMPLATE_FILE_MAX_BYTES`].
fn read_text(path: &Path) -> Result<String> {
    use std::io::Read;
    let what = path.display();
    let file = std::fs::File::open(path).map_err(|e| TemplateError(format!("{what}: {e}")))?;
    // (the metadata of the file opened: the path may have changed since)
    let meta = file
        .metadata()
        .map_err(|e| TemplateError(format!("{what}: {e}")))?;
    if !meta.is_file() {
        return err(format!("{what}: not a regular file"));
    }
    if meta.len() > TEMPLATE_FILE_MAX_BYTES {
        return err(format!(
            "{what}: {} bytes, more than the {TEMPLATE_FILE_MAX_BYTES} a chat template is read for",
            meta.len()
        ));
    }
    let mut bytes = Vec::new();
    file.take(TEMPLATE_FILE_MAX_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| TemplateError(format!("{what}: {e}")))?;
    String::from_utf8(bytes).map_err(|e| TemplateError(format!("{what}: not UTF-8 text ({e})")))
}

fn read_json(path: &Path) -> Result<Option<serde_json::Value>> {
    if !exists(path) {
        return Ok(None);
    }
    let text = read_text(path)?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| TemplateError(format!("{}: {e}", path.display())))
}

#[cfg(test)]
mod tests;
