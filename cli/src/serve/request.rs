//! Request bodies read and checked, field by field, as the OpenAI API
//! defines them; every refusal an [`ApiError`] in OpenAI's shape naming
//! the field. Fields this server does not use are ignored, as clients send
//! many.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};
use turbospark::model::Sampling;

/// An error response: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    /// 400: an invalid value of `param`.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: Some(param.to_string()),
            code: None,
        }
    }

    /// 400, about the request as a whole.
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError {
            param: None,
            ..Self::invalid("", message)
        }
    }

    pub fn new(
        status: StatusCode,
        kind: &'static str,
        code: &'static str,
        message: impl Into<String>,
    ) -> Self {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: Some(code),
        }
    }

    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body())).into_response()
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

/// The body as a JSON object.
pub fn object(body: &[u8]) -> ApiResult<Map<String, Value>> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(other) => Err(ApiError::bad_request(format!(
            "the request body must be a JSON object, not {}",
            kind(&other)
        ))),
        Err(e) => Err(ApiError::bad_request(format!(
            "the request body is not valid JSON: {e}"
        ))),
    }
}

/// A JSON value's kind, for messages.
pub fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Field `name`, absent when missing or null (as OpenAI's SDKs send unset
/// fields).
pub fn field<'a>(m: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    m.get(name).filter(|v| !v.is_null())
}

pub fn bool_field(m: &Map<String, Value>, name: &str) -> ApiResult<Option<bool>> {
    match field(m, name) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(ApiError::invalid(
            name,
            format!("{name} must be a boolean, not {}", kind(v)),
        )),
    }
}

/// A finite number in `range` (its text for messages).
pub fn number_field(
    m: &Map<String, Value>,
    name: &str,
    ok: impl Fn(f64) -> bool,
    range: &str,
) -> ApiResult<Option<f32>> {
    match field(m, name) {
        None => Ok(None),
        Some(Value::Number(n)) => match n.as_f64() {
            // (as an f32: 1e300 is not a temperature)
            Some(x) if (x as f32).is_finite() && ok(x) => Ok(Some(x as f32)),
            _ => Err(ApiError::invalid(
                name,
                format!("{name} must be {range}, not {n}"),
            )),
        },
        Some(v) => Err(ApiError::invalid(
            name,
            format!("{name} must be a number, not {}", kind(v)),
        )),
    }
}

/// A whole number of at least `min`.
pub fn count_field(m: &Map<String, Value>, name: &str, min: u64) -> ApiResult<Option<u64>> {
    match field(m, name) {
        None => Ok(None),
        Some(Value::Number(n)) => match n.as_u64() {
            Some(x) if x >= min => Ok(Some(x)),
            _ => Err(ApiError::invalid(
                name,
                format!("{name} must be a whole number of at least {min}, not {n}"),
            )),
        },
        Some(v) => Err(ApiError::invalid(
            name,
            format!("{name} must be a whole number, not {}", kind(v)),
        )),
    }
}

/// What the completion endpoints share: sampling, limits, stops, streaming.
#[derive(Clone, Debug)]
pub struct Common {
    /// `max_completion_tokens` or `max_tokens` (None: the rest of the context).
    pub max_tokens: Option<usize>,
    pub sampling: Sampling,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
}

pub fn common(m: &Map<String, Value>) -> ApiResult<Common> {
    // (asked for and not done would be worse than refused)
    for name in ["logprobs", "echo"] {
        if bool_field(m, name)? == Some(true) {
            return Err(ApiError::invalid(name, format!("{name} is not supported")));
        }
    }
    if field(m, "top_logprobs").is_some_and(|v| v.as_u64() != Some(0)) {
        return Err(ApiError::invalid(
            "top_logprobs",
            "top_logprobs is not supported",
        ));
    }
    if let Some(f) = field(m, "response_format") {
        if f.get("type").and_then(Value::as_str) != Some("text") {
            return Err(ApiError::invalid(
                "response_format",
                "response_format: only {\"type\": \"text\"} is supported (no constrained output)",
            ));
        }
    }
    if let Some(n) = field(m, "n") {
        if n.as_u64() != Some(1) {
            return Err(ApiError::invalid(
                "n",
                format!("n must be 1 (one choice a request), not {n}"),
            ));
        }
    }
    let max_tokens = match count_field(m, "max_completion_tokens", 1)? {
        Some(n) => Some(n),
        None => count_field(m, "max_tokens", 1)?,
    }
    .map(|n| usize::try_from(n).unwrap_or(usize::MAX));
    let stop = match field(m, "stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(list)) => list
            .iter()
            .map(|v| match v {
                Value::String(s) => Ok(s.clone()),
                v => Err(ApiError::invalid(
                    "stop",
                    format!("stop must hold strings, not {}", kind(v)),
                )),
            })
            .collect::<ApiResult<_>>()?,
        Some(v) => Err(ApiError::invalid(
            "stop",
            format!(
                "stop must be a string or a list of strings, not {}",
                kind(v)
            ),
        ))?,
    };
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::invalid("stop", "stop strings must not be empty"));
    }
    let stream = bool_field(m, "stream")?.unwrap_or(false);
    let include_usage = match field(m, "stream_options") {
        None => false,
        Some(Value::Object(o)) => bool_field(o, "include_usage")
            .map_err(|e| ApiError::invalid("stream_options.include_usage", e.message))?
            .unwrap_or(false),
        Some(v) => {
            return Err(ApiError::invalid(
                "stream_options",
                format!("stream_options must be an object, not {}", kind(v)),
            ))
        }
    };
    Ok(Common {
        max_tokens,
        sampling: sampling(m)?,
        stop,
        stream,
        include_usage,
    })
}

/// The sampling fields as `generate`'s flags map them: none (or a
/// temperature of 0) is greedy decoding.
fn sampling(m: &Map<String, Value>) -> ApiResult<Sampling> {
    let temperature = number_field(m, "temperature", |x| x >= 0.0, "at least 0")?;
    let top_p = number_field(m, "top_p", |x| x > 0.0 && x <= 1.0, "in (0, 1]")?;
    let min_p = number_field(m, "min_p", |x| (0.0..=1.0).contains(&x), "in [0, 1]")?;
    let repetition_penalty = number_field(m, "repeat_penalty", |x| x > 0.0, "above 0")?;
    // (top_k 0: no limit, as llama-server takes it)
    let top_k = count_field(m, "top_k", 0)?
        .filter(|&k| k > 0)
        .map(|k| usize::try_from(k).unwrap_or(usize::MAX));
    let seed = match field(m, "seed") {
        None => 0,
        Some(Value::Number(n)) => match (n.as_u64(), n.as_i64()) {
            (Some(s), _) => s,
            // (a negative seed, as some clients send for "random": its bits)
            (None, Some(s)) => s as u64,
            _ => {
                return Err(ApiError::invalid(
                    "seed",
                    format!("seed must be a whole number, not {n}"),
                ))
            }
        },
        Some(v) => {
            return Err(ApiError::invalid(
                "seed",
                format!("seed must be a whole number, not {}", kind(v)),
            ))
        }
    };
    let random = top_k.is_some() || top_p.is_some() || min_p.is_some();
    let sampling = match temperature {
        None if !random && repetition_penalty.is_none() => Sampling::Greedy,
        t => Sampling::Random {
            temperature: t.unwrap_or(if random { 1.0 } else { 0.0 }),
            top_k,
            top_p,
            min_p,
            repetition_penalty,
            seed,
        },
    };
    // (what the sampler would refuse, refused here: never a failed generation)
    sampling
        .validate()
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    Ok(sampling)
}

/// A chat request's template inputs.
pub struct Chat {
    /// The messages, checked to be `{role: string, ...}` objects.
    pub messages: Value,
    /// Tool declarations (none when `tool_choice` is `"none"`).
    pub tools: Option<Value>,
    pub add_generation_prompt: bool,
    /// `chat_template_kwargs` (an object).
    pub kwargs: Option<Map<String, Value>>,
}

pub fn chat(m: &Map<String, Value>) -> ApiResult<Chat> {
    let messages = match field(m, "messages") {
        None => return Err(ApiError::invalid("messages", "messages is required")),
        Some(Value::Array(list)) if list.is_empty() => {
            return Err(ApiError::invalid("messages", "messages must not be empty"))
        }
        Some(Value::Array(list)) => {
            for (i, msg) in list.iter().enumerate() {
                let ok = msg
                    .as_object()
                    .and_then(|o| o.get("role"))
                    .is_some_and(Value::is_string);
                if !ok {
                    return Err(ApiError::invalid(
                        &format!("messages[{i}]"),
                        format!("messages[{i}] must be an object with a string role"),
                    ));
                }
            }
            Value::Array(list.clone())
        }
        Some(v) => {
            return Err(ApiError::invalid(
                "messages",
                format!("messages must be a list, not {}", kind(v)),
            ))
        }
    };
    let tool_choice = match field(m, "tool_choice") {
        None => None,
        Some(Value::String(s)) if ["none", "auto", "required"].contains(&s.as_str()) => {
            Some(s.as_str())
        }
        Some(Value::Object(_)) => Some("function"),
        Some(v) => {
            return Err(ApiError::invalid(
                "tool_choice",
                format!(
                    "tool_choice must be \"none\", \"auto\", \"required\" or an object, not {v}"
                ),
            ))
        }
    };
    let tools = match field(m, "tools") {
        None => None,
        Some(Value::Array(t)) if t.is_empty() => None,
        Some(t @ Value::Array(_)) => Some(t.clone()),
        Some(v) => {
            return Err(ApiError::invalid(
                "tools",
                format!("tools must be a list, not {}", kind(v)),
            ))
        }
    }
    .filter(|_| tool_choice != Some("none"));
    let kwargs = match field(m, "chat_template_kwargs") {
        None => None,
        Some(Value::Object(o)) => Some(o.clone()),
        Some(v) => {
            return Err(ApiError::invalid(
                "chat_template_kwargs",
                format!("chat_template_kwargs must be an object, not {}", kind(v)),
            ))
        }
    };
    Ok(Chat {
        messages,
        tools,
        add_generation_prompt: bool_field(m, "add_generation_prompt")?.unwrap_or(true),
        kwargs,
    })
}
