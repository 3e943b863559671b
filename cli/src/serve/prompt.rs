//! A chat request's messages to prompt text: the checkpoint's own chat
//! template where it has one, else Gemma 4's turns as `generate --chat`
//! writes them (a checkpoint whose tokenizer has the turn tokens).

use std::path::Path;

use serde_json::Value;
use turbospark_cli::template::{self, ChatTemplate, RenderInput};

use super::request::{kind, ApiError, ApiResult, Chat};
use crate::common::CliResult;
use crate::turns::{TURN_END, TURN_START};

pub enum Renderer {
    Template(Box<ChatTemplate>),
    /// Gemma 4's turns (`turns.rs`): no tools, text content only.
    Turns,
    /// Neither: chat requests are refused.
    None,
}

/// A rendered prompt and whether tokenizing it adds the tokenizer's own
/// special tokens (a template writes its BOS itself; the turns do not).
#[derive(Debug)]
pub struct Rendered {
    pub text: String,
    pub add_special: bool,
}

impl Renderer {
    pub fn load(dir: &Path, tok: &tokenizers::Tokenizer) -> CliResult<Self> {
        if let Some(t) = template::load(dir, None)? {
            return Ok(Renderer::Template(Box::new(t)));
        }
        let turns = [TURN_START, TURN_END]
            .iter()
            .all(|t| tok.token_to_id(t).is_some());
        Ok(if turns {
            Renderer::Turns
        } else {
            Renderer::None
        })
    }

    pub fn describe(&self) -> String {
        match self {
            Renderer::Template(t) => format!("chat template {}", t.origin()),
            Renderer::Turns => "no chat template: Gemma 4's turns".into(),
            Renderer::None => "no chat template: chat completions refused".into(),
        }
    }

    pub fn render(&self, chat: &Chat) -> ApiResult<Rendered> {
        match self {
            Renderer::Template(t) => render_template(t, chat),
            Renderer::Turns => render_turns(chat),
            Renderer::None => Err(ApiError::bad_request(
                "the model has no chat template (and its tokenizer no Gemma turn tokens): \
                 use /v1/completions",
            )),
        }
    }
}

fn to_template(v: &Value) -> ApiResult<minijinja::Value> {
    template::json(&v.to_string()).map_err(|e| ApiError::bad_request(e.to_string()))
}

fn render_template(t: &ChatTemplate, chat: &Chat) -> ApiResult<Rendered> {
    let kwargs = chat.kwargs.as_ref();
    let enable_thinking = match kwargs.and_then(|k| k.get("enable_thinking")) {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(v) => {
            return Err(ApiError::invalid(
                "chat_template_kwargs.enable_thinking",
                format!("enable_thinking must be a boolean, not {}", kind(v)),
            ))
        }
    };
    let input = RenderInput {
        messages: to_template(&chat.messages)?,
        tools: chat.tools.as_ref().map(to_template).transpose()?,
        add_generation_prompt: chat.add_generation_prompt,
        enable_thinking,
        kwargs: kwargs
            .map(|k| to_template(&Value::Object(k.clone())))
            .transpose()?,
    };
    let text = t
        .render(&input)
        .map_err(|e| ApiError::invalid("messages", e.to_string()))?;
    Ok(Rendered {
        text,
        add_special: false,
    })
}

/// `<|turn>ROLE\nTEXT<turn|>\n` a message (the assistant's role is
/// `model`), and `<|turn>model\n` to open the reply: the text
/// `turns::first_turn` and `next_turn` write.
fn render_turns(chat: &Chat) -> ApiResult<Rendered> {
    if chat.tools.is_some() {
        return Err(ApiError::invalid(
            "tools",
            "tools need the checkpoint's chat template, which this model lacks",
        ));
    }
    let Value::Array(messages) = &chat.messages else {
        return Err(ApiError::invalid("messages", "messages must be a list"));
    };
    let mut text = String::new();
    for (i, m) in messages.iter().enumerate() {
        let role = match m.get("role").and_then(Value::as_str) {
            Some("system" | "developer") => "system",
            Some("user") => "user",
            Some("assistant") => "model",
            Some(r) => {
                return Err(ApiError::invalid(
                    &format!("messages[{i}].role"),
                    format!(
                        "role {r:?} needs the checkpoint's chat template (without one: \
                         system, user, assistant)"
                    ),
                ))
            }
            None => {
                return Err(ApiError::invalid(
                    &format!("messages[{i}].role"),
                    "a message needs a string role",
                ))
            }
        };
        let content = content_text(m.get("content"))
            .map_err(|e| ApiError::invalid(&format!("messages[{i}].content"), e))?;
        text.push_str(&format!("{TURN_START}{role}\n{content}{TURN_END}\n"));
    }
    if chat.add_generation_prompt {
        text.push_str(&format!("{TURN_START}model\n"));
    }
    Ok(Rendered {
        text,
        add_special: true,
    })
}

/// A message's content as text: a string, or a list of `{type: text}` parts.
fn content_text(content: Option<&Value>) -> Result<String, String> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => parts
            .iter()
            .map(|p| match (p.get("type"), p.get("text")) {
                (Some(Value::String(t)), Some(Value::String(s))) if t == "text" => Ok(s.as_str()),
                _ => Err("only text parts ({\"type\": \"text\", \"text\": ...}) are taken".into()),
            })
            .collect::<Result<Vec<_>, String>>()
            .map(|v| v.concat()),
        Some(v) => Err(format!(
            "content must be a string or a list of parts, not {}",
            kind(v)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::turns::{first_turn, next_turn};
    use serde_json::json;

    fn chat(messages: Value) -> Chat {
        Chat {
            messages,
            tools: None,
            add_generation_prompt: true,
            kwargs: None,
        }
    }

    /// The turns are `generate --chat`'s and `chat`'s text.
    #[test]
    fn turns_are_the_clis() {
        let one = chat(json!([{"role": "system", "content": "Be brief."},
                              {"role": "user", "content": [{"type": "text", "text": "Hi"}]}]));
        assert_eq!(
            render_turns(&one).unwrap().text,
            first_turn(Some("Be brief."), "Hi")
        );
        let two = chat(json!([{"role": "user", "content": "Hi"},
                              {"role": "assistant", "content": "Hello"},
                              {"role": "user", "content": "Bye"}]));
        assert_eq!(
            render_turns(&two).unwrap().text,
            format!(
                "{}Hello{TURN_END}{}",
                first_turn(None, "Hi"),
                next_turn("Bye")
            )
        );
        let tool = chat(json!([{"role": "tool", "content": "1"}]));
        let e = render_turns(&tool).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].role"), "{e:?}");
    }
}
