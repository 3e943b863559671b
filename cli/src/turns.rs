//! A conversation's prompt text: the checkpoint's own chat template where
//! it has one (`turbospark_cli::template`), else Gemma 4's turns written
//! here: a turn is `<|turn>ROLE\n TEXT <turn|>\n` (its prompt format, with
//! the roles `system`, `user` and `model`); the model's reply follows an
//! open `<|turn>model\n` and ends with its own `<turn|>`. `generate --chat`
//! opens one conversation, `chat` holds one.

use std::path::Path;

use minijinja::Value;
use turbospark_cli::reply::parse_reply;
use turbospark_cli::template::{self, ChatTemplate, RenderInput};

use crate::common::{encode_with, CliResult};

/// How a conversation becomes tokens: the checkpoint's template, or the
/// turns written here for a checkpoint without one.
pub enum Turns {
    Template(Box<ChatTemplate>),
    Fixed,
}

impl Turns {
    /// `dir`'s template where it has one (a broken one is an error).
    pub fn of(dir: &Path) -> CliResult<Turns> {
        Ok(match template::load(dir, None)? {
            Some(t) => Turns::Template(Box::new(t)),
            None => Turns::Fixed,
        })
    }

    /// The tokens of a conversation's opening: a system turn where given,
    /// the user's turn, and the model's turn opened for the reply. The
    /// template writes its own BOS; the fixed turns take the tokenizer's.
    pub fn first(
        &self,
        tok: &tokenizers::Tokenizer,
        system: Option<&str>,
        user: &str,
    ) -> CliResult<Vec<u32>> {
        match self {
            Turns::Template(t) => {
                let mut messages = Vec::new();
                if let Some(s) = system {
                    messages.push(template::message("system", s));
                }
                messages.push(template::message("user", user));
                encode_with(tok, &render(t, &messages)?, false)
            }
            Turns::Fixed => encode_with(tok, &first_turn(system, user), true),
        }
    }
}

/// `messages` through the template, the model's turn opened.
fn render(t: &ChatTemplate, messages: &[Value]) -> CliResult<String> {
    Ok(t.render(&RenderInput {
        messages: Value::from(messages.to_vec()),
        add_generation_prompt: true,
        ..Default::default()
    })?)
}

/// A conversation held through a template: its messages, and the tokens
/// the model's context holds, so that a turn whose rendering extends them
/// prefills only what is new. A rendering that does not (a template that
/// writes earlier turns otherwise once a reply is in: thinking stripped,
/// a generation prompt the reply's turn lacks) starts the context over.
pub struct Conversation {
    messages: Vec<Value>,
    /// The tokens given to and taken from the model, in order.
    history: Vec<u32>,
    /// How many of them the context holds (the last reply's last token is
    /// not in it until the next call).
    in_context: usize,
    system: Option<String>,
}

/// A turn's tokens to generate from, and whether the context was emptied
/// for it.
pub struct NextPrompt {
    pub tokens: Vec<u32>,
    pub restart: bool,
}

impl Conversation {
    pub fn new(system: Option<&str>) -> Self {
        let mut c = Conversation {
            messages: Vec::new(),
            history: Vec::new(),
            in_context: 0,
            system: system.map(str::to_string),
        };
        c.reset();
        c
    }

    /// An empty conversation (the system turn kept), the context empty.
    pub fn reset(&mut self) {
        self.messages.clear();
        if let Some(s) = &self.system {
            self.messages.push(template::message("system", s));
        }
        self.history.clear();
        self.in_context = 0;
    }

    /// The user's turn added: the tokens the model is to take next (the
    /// whole conversation when the context must start over).
    pub fn user_turn(
        &mut self,
        t: &ChatTemplate,
        tok: &tokenizers::Tokenizer,
        user: &str,
    ) -> CliResult<NextPrompt> {
        self.messages.push(template::message("user", user));
        let all = match render(t, &self.messages).and_then(|text| encode_with(tok, &text, false)) {
            Ok(all) => all,
            Err(e) => {
                self.messages.pop();
                return Err(e);
            }
        };
        let kept = &self.history[..self.in_context];
        Ok(if self.in_context > 0 && all.starts_with(kept) {
            NextPrompt {
                tokens: all[self.in_context..].to_vec(),
                restart: false,
            }
        } else {
            // (the caller empties the model's context)
            let restart = self.in_context > 0;
            self.history.clear();
            self.in_context = 0;
            NextPrompt {
                tokens: all,
                restart,
            }
        })
    }

    /// The last user turn taken back (it did not fit).
    pub fn refuse(&mut self) {
        self.messages.pop();
    }

    /// The model took `prompt` and replied `reply`, whose text (special tokens kept, the turn's
    /// end and `eos` dropped) becomes the model's message.
    pub fn replied(
        &mut self,
        t: &ChatTemplate,
        tok: &tokenizers::Tokenizer,
        prompt: &NextPrompt,
        reply: &[u32],
        turn_end: u32,
    ) -> CliResult {
        self.history.truncate(self.in_context);
        self.history.extend(&prompt.tokens);
        self.history.extend(reply);
        self.in_context = self.history.len() - usize::from(!reply.is_empty());
        let text_ids = reply.strip_suffix(&[turn_end]).unwrap_or(reply);
        // (with its special tokens: the reply's markup is made of them)
        let text = tok
            .decode(text_ids, false)
            .map_err(|e| format!("detokenizing the reply: {e}"))?;
        let r = parse_reply(&text);
        let mut content = r.content;
        if let Some(eos) = t.special_token("eos_token").filter(|s| !s.is_empty()) {
            if let Some(c) = content.strip_suffix(eos) {
                content = c.to_string();
            }
        }
        let mut pairs = vec![
            ("role", Value::from("assistant")),
            ("content", Value::from(content)),
        ];
        if !r.reasoning_content.is_empty() {
            pairs.push(("reasoning_content", Value::from(r.reasoning_content)));
        }
        self.messages.push(pairs.into_iter().collect());
        Ok(())
    }
}

/// Opens a turn; a role and a newline follow.
pub const TURN_START: &str = "<|turn>";
/// Closes a turn (the model's reply ends with it).
pub const TURN_END: &str = "<turn|>";

/// The text of a conversation's opening: a system turn where given, the
/// user's turn, and the model's turn opened for the reply.
pub fn first_turn(system: Option<&str>, user: &str) -> String {
    let system = system
        .map(|s| format!("{TURN_START}system\n{s}{TURN_END}\n"))
        .unwrap_or_default();
    format!("{system}{TURN_START}user\n{user}{TURN_END}\n{TURN_START}model\n")
}

/// The text of a later user turn, after the model's reply and its
/// `<turn|>`: the line break that follows a turn, the user's turn and the
/// model's opened.
pub fn next_turn(user: &str) -> String {
    format!("\n{TURN_START}user\n{user}{TURN_END}\n{TURN_START}model\n")
}

/// The id of `<turn|>`; an error naming the tokenizer's lack of it (a
/// checkpoint that is not a Gemma 4 chat model).
pub fn turn_end_id(tok: &tokenizers::Tokenizer) -> CliResult<u32> {
    for t in [TURN_START, TURN_END] {
        if tok.token_to_id(t).is_none() {
            return Err(
                format!("the tokenizer has no {t} token: not a Gemma 4 chat tokenizer").into(),
            );
        }
    }
    Ok(tok.token_to_id(TURN_END).expect("checked above"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turns_are_gemma_4s() {
        assert_eq!(
            first_turn(Some("Be brief."), "Hi"),
            "<|turn>system\nBe brief.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n"
        );
        assert_eq!(
            first_turn(None, "Hi"),
            "<|turn>user\nHi<turn|>\n<|turn>model\n"
        );
        assert_eq!(
            next_turn("Bye"),
            "\n<|turn>user\nBye<turn|>\n<|turn>model\n"
        );
    }
}
