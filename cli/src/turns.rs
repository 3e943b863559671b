//! Gemma 4's chat turns: a turn is `<|turn>ROLE\n TEXT <turn|>\n` (its
//! prompt format, with the roles `system`, `user` and `model`); the model's
//! reply follows an open `<|turn>model\n` and ends with its own `<turn|>`.
//! `generate --chat` opens one conversation, `chat` holds one.

use crate::common::CliResult;

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
