//! The routes: OpenAI's chat and text completions (whole, or streamed as
//! server-sent events), the model list, and llama-server's health,
//! tokenize, detokenize and apply-template.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Map, Value};
use tokio::sync::mpsc::{self, error::TrySendError, UnboundedReceiver};
use turbospark::model::GenerateOptions;
use turbospark_cli::reply::{parse_reply, Delta, Reply, ReplyParser};

use super::engine::{Done, Event, Job};
use super::prompt::Renderer;
use super::request::{self, kind, ApiError, ApiResult, Common};

/// What every handler shares.
pub struct App {
    pub tok: Arc<tokenizers::Tokenizer>,
    /// The tokenizer's vocabulary with its added tokens, counted once
    /// (`get_vocab_size(true)` copies the whole vocabulary: 262144 entries
    /// for Gemma 4, a tenth of a second a request).
    pub vocab: usize,
    pub renderer: Renderer,
    pub jobs: mpsc::Sender<Job>,
    /// The name `/v1/models` lists and responses carry.
    pub model_name: String,
    pub max_context: usize,
    /// Tokens that end a chat reply besides the model's end of sequence.
    pub chat_stop_ids: Vec<u32>,
    /// When the server started (the model's `created`).
    pub started: u64,
}

type Shared = State<Arc<App>>;
type Body_ = Result<Bytes, BytesRejection>;

pub fn router(app: Arc<App>, body_limit: usize) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/models", get(models))
        .route("/health", get(health))
        .route("/v1/health", get(health))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/apply-template", post(apply_template))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::extract::DefaultBodyLimit::max(body_limit))
        .with_state(app)
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A response id, unique in this process.
fn response_id(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{prefix}-{:x}{:04x}",
        now(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

async fn not_found(method: Method, uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found_error",
        "not_found",
        format!("no route {method} {}", uri.path()),
    )
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        "method_not_allowed",
        format!("{} does not take {method}", uri.path()),
    )
}

async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

async fn models(State(app): Shared) -> Json<Value> {
    Json(json!({"object": "list", "data": [{
        "id": app.model_name,
        "object": "model",
        "created": app.started,
        "owned_by": "turbospark",
        "meta": {"n_ctx": app.max_context},
    }]}))
}

/// The body as a JSON object; a body past the limit is a 413.
fn body_object(body: Body_) -> ApiResult<Map<String, Value>> {
    let bytes = body.map_err(|r| {
        let status = r.status();
        let text = r.body_text();
        match status {
            StatusCode::PAYLOAD_TOO_LARGE => {
                ApiError::new(status, "invalid_request_error", "request_too_large", text)
            }
            _ => ApiError::bad_request(text),
        }
    })?;
    request::object(&bytes)
}

fn respond(r: ApiResult<Response>) -> Response {
    r.unwrap_or_else(IntoResponse::into_response)
}

async fn tokenize(State(app): Shared, body: Body_) -> Response {
    respond((|| {
        let m = body_object(body)?;
        let content = match request::field(&m, "content") {
            Some(Value::String(s)) => s,
            Some(v) => {
                return Err(ApiError::invalid(
                    "content",
                    format!("content must be a string, not {}", kind(v)),
                ))
            }
            None => return Err(ApiError::invalid("content", "content is required")),
        };
        let special = request::bool_field(&m, "add_special")?.unwrap_or(false);
        let tokens = encode(&app.tok, content, special)?;
        Ok(Json(json!({"tokens": tokens})).into_response())
    })())
}

async fn detokenize(State(app): Shared, body: Body_) -> Response {
    respond((|| {
        let m = body_object(body)?;
        let tokens = token_list(&app, request::field(&m, "tokens"), "tokens")?;
        let content = app
            .tok
            .decode(&tokens, false)
            .map_err(|e| ApiError::invalid("tokens", format!("detokenizing: {e}")))?;
        Ok(Json(json!({"content": content})).into_response())
    })())
}

async fn apply_template(State(app): Shared, body: Body_) -> Response {
    respond((|| {
        let m = body_object(body)?;
        let chat = request::chat(&m)?;
        let r = app.renderer.render(&chat)?;
        Ok(Json(json!({"prompt": r.text})).into_response())
    })())
}

fn encode(tok: &tokenizers::Tokenizer, text: &str, special: bool) -> ApiResult<Vec<u32>> {
    tok.encode(text, special)
        .map(|e| e.get_ids().to_vec())
        .map_err(|e| ApiError::bad_request(format!("tokenizing: {e}")))
}

/// A list of token ids in the vocabulary (`param` names it).
fn token_list(app: &App, v: Option<&Value>, param: &str) -> ApiResult<Vec<u32>> {
    let vocab = app.vocab;
    let Some(Value::Array(list)) = v else {
        return Err(ApiError::invalid(
            param,
            format!("{param} must be a list of token ids"),
        ));
    };
    list.iter()
        .enumerate()
        .map(|(i, t)| match t.as_u64() {
            Some(id) if (id as usize) < vocab => Ok(id as u32),
            _ => Err(ApiError::invalid(
                param,
                format!("{param}[{i}] ({t}) is not a token id (the vocabulary has {vocab})"),
            )),
        })
        .collect()
}

/// `prompt` queued on the engine: its events, or why not (too long for
/// the context: 413; the queue full: 429).
fn submit(
    app: &App,
    prompt: Vec<u32>,
    c: &Common,
    special: bool,
    stop_ids: Vec<u32>,
) -> ApiResult<UnboundedReceiver<Event>> {
    if prompt.is_empty() {
        return Err(ApiError::invalid("prompt", "the prompt holds no tokens"));
    }
    let ctx = app.max_context;
    let too_long = |message: String| {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            "context_length_exceeded",
            message,
        )
    };
    if prompt.len() >= ctx {
        return Err(too_long(format!(
            "the prompt's {} tokens leave no room in the {ctx}-token context",
            prompt.len()
        )));
    }
    let max = c.max_tokens.unwrap_or(ctx - prompt.len());
    if prompt.len().saturating_add(max) > ctx {
        return Err(too_long(format!(
            "the prompt's {} tokens and max_tokens {max} pass the {ctx}-token context",
            prompt.len()
        )));
    }
    let (events, rx) = mpsc::unbounded_channel();
    let job = Job {
        prompt,
        opts: GenerateOptions {
            max_new_tokens: max,
            sampling: c.sampling.clone(),
            stop_at_eos: true,
        },
        stops: c.stop.clone(),
        stop_ids,
        special,
        events,
    };
    match app.jobs.try_send(job) {
        Ok(()) => Ok(rx),
        Err(TrySendError::Full(_)) => Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            "queue_full",
            "the server's queue is full: try again later",
        )),
        Err(TrySendError::Closed(_)) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "shutting_down",
            "the server is shutting down",
        )),
    }
}

fn usage(d: &Done) -> Value {
    json!({
        "prompt_tokens": d.prompt_tokens,
        "completion_tokens": d.completion_tokens,
        "total_tokens": d.prompt_tokens + d.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": d.cached_tokens},
    })
}

fn finish_reason(d: &Done) -> &'static str {
    if d.stopped {
        "stop"
    } else {
        "length"
    }
}

fn engine_error(message: String) -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "server_error",
        "generation_failed",
        message,
    )
}

/// A whole generation's text and how it ended.
async fn collect(mut rx: UnboundedReceiver<Event>) -> ApiResult<(String, Done)> {
    let mut text = String::new();
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Text(t) => text.push_str(&t),
            Event::Done(d) => return Ok((text, d)),
            Event::Error(e) => return Err(engine_error(e)),
        }
    }
    Err(engine_error(
        "the engine stopped before the reply ended".into(),
    ))
}

/// `values` as server-sent events, and `[DONE]` after them at the end.
fn events(values: &[Value], end: bool) -> Bytes {
    let mut s = String::new();
    for v in values {
        s.push_str(&format!("data: {v}\n\n"));
    }
    if end {
        s.push_str("data: [DONE]\n\n");
    }
    Bytes::from(s)
}

/// A streamed response: `first`, then what `map` makes of each event
/// (its chunks, and whether the stream ends). The stream owns the events'
/// receiver: a client that goes drops it, which the engine sees.
fn sse<F>(rx: UnboundedReceiver<Event>, first: Vec<Value>, map: F) -> Response
where
    F: FnMut(Event) -> (Vec<Value>, bool) + Send + 'static,
{
    let state = (rx, map, Some(first), false);
    let stream =
        futures_util::stream::unfold(state, |(mut rx, mut map, first, ended)| async move {
            if let Some(first) = first {
                return Some((
                    Ok::<_, Infallible>(events(&first, false)),
                    (rx, map, None, ended),
                ));
            }
            if ended {
                return None;
            }
            loop {
                let (out, end) = match rx.recv().await {
                    Some(ev) => map(ev),
                    None => (
                        vec![
                            engine_error("the engine stopped before the reply ended".into()).body(),
                        ],
                        true,
                    ),
                };
                if !out.is_empty() || end {
                    return Some((Ok(events(&out, end)), (rx, map, None, end)));
                }
            }
        });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|e| engine_error(e.to_string()).into_response())
}

async fn chat_completions(State(app): Shared, body: Body_) -> Response {
    respond(chat_inner(app, body).await)
}

fn call_id(index: usize) -> String {
    format!("call_{}", response_id(&index.to_string()))
}

/// A whole reply as OpenAI's assistant message, and its finish reason.
fn message(reply: Reply, done: &Done) -> (Value, &'static str) {
    let mut message = json!({
        "role": "assistant",
        // (null beside tool calls, as OpenAI writes it)
        "content": if reply.content.is_empty() && !reply.tool_calls.is_empty() {
            Value::Null
        } else {
            Value::String(reply.content)
        },
    });
    if !reply.reasoning_content.is_empty() {
        message["reasoning_content"] = Value::String(reply.reasoning_content);
    }
    if reply.tool_calls.is_empty() {
        return (message, finish_reason(done));
    }
    let calls: Vec<Value> = reply
        .tool_calls
        .iter()
        .enumerate()
        .map(|(i, t)| {
            json!({"id": call_id(i), "type": "function",
                   "function": {"name": t.name, "arguments": t.arguments}})
        })
        .collect();
    message["tool_calls"] = Value::Array(calls);
    (message, "tool_calls")
}

/// A streamed reply's delta as a chunk's `delta` (none for empty text);
/// `calls` counts the tool calls begun.
fn delta(d: Delta, calls: &mut usize) -> Option<Value> {
    Some(match d {
        Delta::Content(s) if !s.is_empty() => json!({"content": s}),
        Delta::Reasoning(s) if !s.is_empty() => json!({"reasoning_content": s}),
        Delta::Content(_) | Delta::Reasoning(_) => return None,
        Delta::ToolCallStart { index, name } => {
            *calls += 1;
            json!({"tool_calls": [{"index": index, "id": call_id(index),
                "type": "function", "function": {"name": name, "arguments": ""}}]})
        }
        Delta::ToolCallArguments { index, arguments } => {
            json!({"tool_calls": [{"index": index, "function": {"arguments": arguments}}]})
        }
    })
}

async fn chat_inner(app: Arc<App>, body: Body_) -> ApiResult<Response> {
    let m = body_object(body)?;
    let c = request::common(&m)?;
    let chat = request::chat(&m)?;
    let rendered = app.renderer.render(&chat)?;
    let prompt = encode(&app.tok, &rendered.text, rendered.add_special)?;
    let rx = submit(&app, prompt, &c, true, app.chat_stop_ids.clone())?;
    let id = response_id("chatcmpl");
    let created = now();
    let model = app.model_name.clone();
    if !c.stream {
        let (text, done) = collect(rx).await?;
        let (message, finish) = message(parse_reply(&text), &done);
        return Ok(Json(json!({
            "id": id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": usage(&done),
        }))
        .into_response());
    }
    let chunk = move |delta: Value, finish: Option<&str>| {
        json!({
            "id": id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        })
    };
    let first = vec![chunk(json!({"role": "assistant", "content": ""}), None)];
    let mut parser = ReplyParser::new();
    let mut calls = 0;
    let to_chunks = |deltas: Vec<Delta>, calls: &mut usize| -> Vec<Value> {
        deltas.into_iter().filter_map(|d| delta(d, calls)).collect()
    };
    let include_usage = c.include_usage;
    let make = chunk;
    Ok(sse(rx, first, move |ev| match ev {
        Event::Text(t) => {
            let deltas = to_chunks(parser.push(&t), &mut calls);
            (deltas.into_iter().map(|d| make(d, None)).collect(), false)
        }
        Event::Done(done) => {
            let deltas = to_chunks(parser.finish(), &mut calls);
            let mut out: Vec<Value> = deltas.into_iter().map(|d| make(d, None)).collect();
            let finish = if calls > 0 {
                "tool_calls"
            } else {
                finish_reason(&done)
            };
            out.push(make(json!({}), Some(finish)));
            if include_usage {
                let mut last = make(json!({}), None);
                last["choices"] = json!([]);
                last["usage"] = usage(&done);
                out.push(last);
            }
            (out, true)
        }
        Event::Error(e) => (vec![engine_error(e).body()], true),
    }))
}

async fn completions(State(app): Shared, body: Body_) -> Response {
    respond(completions_inner(app, body).await)
}

/// `/v1/completions`' prompt: a string, token ids, or a list of one of
/// either.
fn completion_prompt(app: &App, m: &Map<String, Value>) -> ApiResult<Vec<u32>> {
    let p = request::field(m, "prompt");
    match p {
        None => Err(ApiError::invalid("prompt", "prompt is required")),
        Some(Value::String(s)) => encode(&app.tok, s, true),
        Some(Value::Array(list)) if list.iter().all(Value::is_number) && !list.is_empty() => {
            token_list(app, p, "prompt")
        }
        Some(Value::Array(list)) if list.len() == 1 => match &list[0] {
            Value::String(s) => encode(&app.tok, s, true),
            one @ Value::Array(_) => token_list(app, Some(one), "prompt"),
            v => Err(ApiError::invalid(
                "prompt",
                format!("prompt[0] must be a string or token ids, not {}", kind(v)),
            )),
        },
        Some(Value::Array(_)) => Err(ApiError::invalid(
            "prompt",
            "prompt must be one string or one list of token ids (one prompt a request)",
        )),
        Some(v) => Err(ApiError::invalid(
            "prompt",
            format!("prompt must be a string or token ids, not {}", kind(v)),
        )),
    }
}

async fn completions_inner(app: Arc<App>, body: Body_) -> ApiResult<Response> {
    let m = body_object(body)?;
    let c = request::common(&m)?;
    let prompt = completion_prompt(&app, &m)?;
    let rx = submit(&app, prompt, &c, false, Vec::new())?;
    let id = response_id("cmpl");
    let created = now();
    let model = app.model_name.clone();
    let chunk = move |text: &str, finish: Option<&str>| {
        json!({
            "id": id,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": null, "finish_reason": finish}],
        })
    };
    if !c.stream {
        let (text, done) = collect(rx).await?;
        let mut out = chunk(&text, Some(finish_reason(&done)));
        out["usage"] = usage(&done);
        return Ok(Json(out).into_response());
    }
    let include_usage = c.include_usage;
    Ok(sse(rx, Vec::new(), move |ev| match ev {
        Event::Text(t) => (vec![chunk(&t, None)], false),
        Event::Done(done) => {
            let mut out = vec![chunk("", Some(finish_reason(&done)))];
            if include_usage {
                let mut last = chunk("", None);
                last["choices"] = json!([]);
                last["usage"] = usage(&done);
                out.push(last);
            }
            (out, true)
        }
        Event::Error(e) => (vec![engine_error(e).body()], true),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DONE: Done = Done {
        stopped: true,
        prompt_tokens: 3,
        completion_tokens: 9,
        cached_tokens: 0,
        widest_batch: 1,
    };

    /// Gemma 4's thinking and tool calls become OpenAI's
    /// reasoning_content and tool_calls, whole and streamed alike.
    #[test]
    fn thinking_and_tool_calls_are_openais() {
        let text = "<|channel>thought\nLook it up.<channel|>\
                    <|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}<tool_call|>\
                    <|tool_response>";
        let (m, finish) = message(parse_reply(text), &DONE);
        assert_eq!(finish, "tool_calls");
        assert_eq!(m["content"], Value::Null, "{m}");
        assert_eq!(m["reasoning_content"], "Look it up.", "{m}");
        let call = &m["tool_calls"][0];
        assert_eq!(call["type"], "function");
        assert_eq!(call["function"]["name"], "get_weather");
        let args: Value =
            serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(args, json!({"city": "Paris"}));
        assert!(call["id"].as_str().unwrap().starts_with("call_"));

        // The same text streamed a few bytes at a time adds up to it.
        let mut p = ReplyParser::new();
        let mut calls = 0;
        let mut deltas = Vec::new();
        let bytes: Vec<char> = text.chars().collect();
        for piece in bytes.chunks(5) {
            let piece: String = piece.iter().collect();
            deltas.extend(
                p.push(&piece)
                    .into_iter()
                    .filter_map(|d| delta(d, &mut calls)),
            );
        }
        deltas.extend(p.finish().into_iter().filter_map(|d| delta(d, &mut calls)));
        assert_eq!(calls, 1);
        let reasoning: String = deltas
            .iter()
            .filter_map(|d| d["reasoning_content"].as_str())
            .collect();
        assert_eq!(reasoning, "Look it up.");
        let args: String = deltas
            .iter()
            .filter_map(|d| d["tool_calls"][0]["function"]["arguments"].as_str())
            .collect();
        assert_eq!(
            serde_json::from_str::<Value>(&args).unwrap(),
            json!({"city": "Paris"})
        );
        assert!(
            deltas.iter().all(|d| d.get("content").is_none()),
            "{deltas:?}"
        );
    }

    /// Plain text: content, and the finish reason of how generation ended.
    #[test]
    fn plain_replies_end_by_stop_or_length() {
        let (m, finish) = message(parse_reply("Hello."), &DONE);
        assert_eq!((m["content"].as_str(), finish), (Some("Hello."), "stop"));
        assert!(m.get("tool_calls").is_none() && m.get("reasoning_content").is_none());
        let cut = Done {
            stopped: false,
            ..DONE
        };
        assert_eq!(message(parse_reply("Hel"), &cut).1, "length");
    }
}
