//! `turbospark chat`: a conversation on stdin, each reply streamed as it is
//! generated, the context kept from turn to turn (only the new turn is
//! prefilled). The turns' text: the checkpoint's chat template where it
//! has one, else `turns.rs`'s.

use std::io::{BufRead, Read, Write};
use std::ops::ControlFlow;
use std::path::PathBuf;

use turbospark::model::{GenerateOptions, Generation};

use crate::common::{encode_with, tokenizer, CliResult};
use crate::generate::{AnyModel, RunArgs, SamplingArgs};
use crate::stream::Stream;
use crate::turns::{next_turn, turn_end_id, Conversation, NextPrompt, Turns};

#[derive(clap::Args)]
pub struct Args {
    /// Checkpoint directory (config.json + safetensors + tokenizer.json).
    #[arg(long)]
    model: PathBuf,
    /// A system turn at the start of the conversation.
    #[arg(long)]
    system: Option<String>,
    /// Most new tokens a reply may take.
    #[arg(long, default_value_t = 512, allow_negative_numbers = true)]
    max_new_tokens: usize,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    run: RunArgs,
}

pub fn run(a: Args) -> CliResult {
    let opts = GenerateOptions {
        max_new_tokens: a.max_new_tokens,
        sampling: a.sampling.sampling(),
        stop_at_eos: true,
    };
    // (at startup: a bad flag is not found only at the first message)
    opts.sampling.validate()?;
    let tok = tokenizer(&a.model)?.ok_or_else(|| {
        format!(
            "{} has no tokenizer.json, which chat needs",
            a.model.display()
        )
    })?;
    // (before the weights are loaded: a tokenizer without turns, or a
    // template that does not compile, says so now)
    turn_end_id(&tok)?;
    let turns = Turns::of(&a.model)?;
    let (mut model, device) = a.run.load(&a.model)?;
    eprintln!("{device}: type a message; /reset starts over; an empty line or end of input quits");
    let stdin = std::io::stdin();
    converse(
        &mut model,
        &tok,
        &turns,
        a.system.as_deref(),
        &opts,
        stdin.lock(),
        std::io::stdout().lock(),
        std::io::stderr(),
    )?;
    Ok(())
}

/// What a conversation needs of a model: [`AnyModel`], or a scripted one
/// in the tests.
pub trait Generator {
    fn generate_streaming(
        &mut self,
        prompt: &[u32],
        opts: &GenerateOptions,
        on_token: &mut dyn FnMut(u32) -> ControlFlow<()>,
    ) -> turbospark::Result<Generation>;
    /// An empty context.
    fn reset(&mut self);
    /// Positions left in the context.
    fn room(&self) -> usize;
}

impl Generator for AnyModel {
    fn generate_streaming(
        &mut self,
        prompt: &[u32],
        opts: &GenerateOptions,
        on_token: &mut dyn FnMut(u32) -> ControlFlow<()>,
    ) -> turbospark::Result<Generation> {
        // The CPU backend reads its weights from the checkpoint's maps: a
        // file changed since the last turn is an error, not a fault.
        crate::mapped::check_unchanged()?;
        AnyModel::generate_streaming(self, prompt, opts, on_token)
    }
    fn reset(&mut self) {
        AnyModel::reset(self)
    }
    fn room(&self) -> usize {
        AnyModel::room(self)
    }
}

/// A line that starts the conversation over (an empty context).
pub const RESET: &str = "/reset";

/// Most bytes of one input line: far more than a message a person types;
/// a stream without line breaks (`/dev/zero`) is not read until memory
/// runs out.
pub const LINE_MAX_BYTES: u64 = 16 << 20;

/// One conversation: a user message a line of `input`, each reply streamed
/// to `out`, the prompt marker and notices to `prompt`. Ends at an empty
/// line or the end of input; returns the replies' tokens. Through a
/// template, each turn renders the whole conversation and the model takes
/// what the context does not hold yet (all of it, the context emptied,
/// where the rendering does not extend it). With the fixed turns, a reply
/// cut at `opts.max_new_tokens` is closed with `<turn|>` before the next
/// user turn. A reply is cut short where the context ends, and a turn that does
/// not fit is refused with a notice ([`RESET`] starts over). A line that
/// is not UTF-8 is skipped with a notice. An error when every turn was
/// refused (no reply at all: a `system` turn that fills the context), or
/// a line is longer than [`LINE_MAX_BYTES`].
#[allow(clippy::too_many_arguments)]
pub fn converse(
    model: &mut impl Generator,
    tok: &tokenizers::Tokenizer,
    turns: &Turns,
    system: Option<&str>,
    opts: &GenerateOptions,
    input: impl BufRead,
    mut out: impl Write,
    mut prompt: impl Write,
) -> CliResult<Vec<Vec<u32>>> {
    let turn_end = turn_end_id(tok)?;
    let mut replies: Vec<Vec<u32>> = Vec::new();
    // The last reply's last token, which the context does not hold yet
    // (None: a new conversation).
    let mut last: Option<u32> = None;
    let mut conversation = Conversation::new(system);
    let mut input = input;
    let (mut line_no, mut refused) = (0usize, 0usize);
    let mut bytes = Vec::new();
    loop {
        write!(prompt, "> ")?;
        prompt.flush()?;
        bytes.clear();
        let n = (&mut input)
            .take(LINE_MAX_BYTES + 1)
            .read_until(b'\n', &mut bytes)
            .map_err(|e| format!("reading the conversation's input: {e}"))?;
        if n == 0 {
            break;
        }
        line_no += 1;
        if bytes.len() as u64 > LINE_MAX_BYTES {
            return Err(format!(
                "input line {line_no}: more than the limit of {LINE_MAX_BYTES} bytes \
                 without a line break"
            )
            .into());
        }
        let line = match std::str::from_utf8(&bytes) {
            Ok(l) => l,
            Err(e) => {
                writeln!(
                    prompt,
                    "(line {line_no} is not UTF-8 text ({e}): skipped; the conversation goes on)"
                )?;
                continue;
            }
        };
        let user = line.trim_end();
        if user.is_empty() {
            break;
        }
        if user == RESET {
            model.reset();
            last = None;
            conversation.reset();
            writeln!(prompt, "(a new conversation)")?;
            continue;
        }
        // The new turn's tokens. With the fixed turns: the last reply's
        // last token is not in the context yet (generate leaves it to the
        // next call): it leads, and a reply that did not end its turn gets
        // its <turn|> here.
        let next = match turns {
            Turns::Template(t) => {
                let next = conversation.user_turn(t, tok, user)?;
                if next.restart {
                    model.reset();
                }
                next
            }
            Turns::Fixed => NextPrompt {
                tokens: match last {
                    None => turns.first(tok, system, user)?,
                    Some(last) => {
                        let mut t = vec![last];
                        if last != turn_end {
                            t.push(turn_end);
                        }
                        t.extend(encode_with(tok, &next_turn(user), false)?);
                        t
                    }
                },
                restart: false,
            },
        };
        let tokens = &next.tokens;
        // The turn and at least one new token must fit; the reply takes
        // what is left of the context, up to its limit.
        let room = model.room();
        if tokens.len() > room {
            writeln!(
                prompt,
                "(the turn's {} tokens do not fit the {room} left of the context: \
                 {RESET} starts a new conversation)",
                tokens.len()
            )?;
            conversation.refuse();
            refused += 1;
            continue;
        }
        let opts = GenerateOptions {
            max_new_tokens: opts.max_new_tokens.min(room - tokens.len() + 1),
            ..opts.clone()
        };
        let mut stream = Stream::new(&mut out, Some(tok));
        let g = model.generate_streaming(tokens, &opts, &mut |id| {
            if id == turn_end {
                return ControlFlow::Break(());
            }
            stream.take(id)
        })?;
        stream.finish()?;
        if let Turns::Template(t) = turns {
            conversation.replied(t, tok, &next, &g.tokens, turn_end)?;
        }
        last = g.tokens.last().copied();
        replies.push(g.tokens);
    }
    if replies.is_empty() && refused > 0 {
        return Err(format!(
            "no turn of the conversation fit the context ({refused} refused): a \
             --system prompt that fills it, or a --max-context too small"
        )
        .into());
    }
    Ok(replies)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::turns::first_turn;
    use turbospark::model::{Checkpoint, ModelOptions, OneSequence};
    use turbospark_cpu::CpuBackend;

    fn fixture() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tiny-text")
    }

    /// The tiny fixture's word-level tokenizer with Gemma 4's two turn
    /// tokens, `<|turn>` 500 and `<turn|>` 501
    /// (scripts/make_chat_tokenizer.py).
    fn chat_tokenizer() -> tokenizers::Tokenizer {
        let path = fixture().join("../tiny-text-chat/tokenizer.json");
        tokenizers::Tokenizer::from_file(path).unwrap()
    }

    fn model() -> AnyModel {
        model_of(128)
    }

    fn model_of(max_context: usize) -> AnyModel {
        let ck = Checkpoint::open(&fixture()).unwrap();
        let opts = ModelOptions {
            max_context,
            ..Default::default()
        };
        AnyModel::Cpu(Box::new(
            OneSequence::load(CpuBackend::new(), &ck, opts).unwrap(),
        ))
    }

    fn greedy(n: usize) -> GenerateOptions {
        GenerateOptions {
            max_new_tokens: n,
            stop_at_eos: true,
            ..Default::default()
        }
    }

    #[test]
    fn a_tokenizer_without_turns_is_refused() {
        let tok = crate::common::tokenizer(&fixture()).unwrap().unwrap();
        let e = turn_end_id(&tok).unwrap_err().to_string();
        assert!(
            e.contains("<|turn>") && e.contains("not a Gemma 4 chat"),
            "{e}"
        );
    }

    /// Two turns: the second reply is the one a fresh model gives to the
    /// whole conversation at once (the context was kept, and the first
    /// reply, cut at the token limit, was closed with <turn|>); each reply
    /// is printed as its text and a line break.
    #[test]
    fn a_conversation_keeps_its_context() {
        let tok = chat_tokenizer();
        let mut m = model();
        let mut out = Vec::new();
        let replies = converse(
            &mut m,
            &tok,
            &Turns::Fixed,
            Some("w7"),
            &greedy(6),
            "w10 w11\nw12 w13 w14\n\nw15\n".as_bytes(),
            &mut out,
            std::io::sink(),
        )
        .unwrap();
        assert_eq!(replies.len(), 2, "ends at the empty line");
        assert!(replies.iter().all(|r| r.len() == 6), "{replies:?}");
        let text = |ids: &[u32]| tok.decode(ids, true).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            format!("{}\n{}\n", text(&replies[0]), text(&replies[1]))
        );
        let mut all = encode_with(&tok, &first_turn(Some("w7"), "w10 w11"), true).unwrap();
        all.extend(&replies[0]);
        all.push(501);
        all.extend(encode_with(&tok, &next_turn("w12 w13 w14"), false).unwrap());
        let mut fresh = model();
        let g = fresh.generate_streaming(&all, &greedy(6), |_| ControlFlow::Continue(()));
        assert_eq!(g.unwrap().tokens, replies[1]);
    }

    /// A model that writes `script` (up to the token limit, or until the
    /// callback breaks) and records each prompt.
    struct Scripted {
        script: Vec<u32>,
        prompts: Vec<Vec<u32>>,
        resets: usize,
    }

    impl Generator for Scripted {
        fn generate_streaming(
            &mut self,
            prompt: &[u32],
            opts: &GenerateOptions,
            on_token: &mut dyn FnMut(u32) -> ControlFlow<()>,
        ) -> turbospark::Result<Generation> {
            self.prompts.push(prompt.to_vec());
            let mut tokens = Vec::new();
            for &t in self.script.iter().take(opts.max_new_tokens) {
                tokens.push(t);
                if on_token(t).is_break() {
                    break;
                }
            }
            Ok(Generation {
                tokens,
                prefill_tok_s: 1.0,
                decode_tok_s: 1.0,
            })
        }
        fn reset(&mut self) {
            self.resets += 1;
        }
        fn room(&self) -> usize {
            1 << 20
        }
    }

    /// A reply ends where the model writes <turn|>, which is not printed;
    /// the next turn starts from that token, without a second one.
    #[test]
    fn a_reply_ends_at_turn_end() {
        let tok = chat_tokenizer();
        let mut m = Scripted {
            script: vec![7, 8, 501, 9],
            prompts: Vec::new(),
            resets: 0,
        };
        let mut out = Vec::new();
        let replies = converse(
            &mut m,
            &tok,
            &Turns::Fixed,
            None,
            &greedy(6),
            "w10 w11\nw12\n".as_bytes(),
            &mut out,
            std::io::sink(),
        )
        .unwrap();
        assert_eq!(replies, [vec![7, 8, 501], vec![7, 8, 501]]);
        assert_eq!(String::from_utf8(out).unwrap(), "w7 w8\nw7 w8\n");
        let mut second = vec![501];
        second.extend(encode_with(&tok, &next_turn("w12"), false).unwrap());
        assert_eq!(m.prompts[1], second);
        assert_eq!(
            m.prompts[0],
            encode_with(&tok, &first_turn(None, "w10 w11"), true).unwrap()
        );
    }

    /// Turns fill the context: the reply that reaches its end is cut
    /// there, a turn that does not fit is refused with a notice (the
    /// conversation goes on), and /reset starts over, its first reply the
    /// same as the very first.
    #[test]
    fn a_full_context_is_said_and_reset_starts_over() {
        let tok = chat_tokenizer();
        let mut m = model_of(24);
        let mut notices = Vec::new();
        let replies = converse(
            &mut m,
            &tok,
            &Turns::Fixed,
            None,
            &greedy(6),
            "w10 w11\nw12 w13\nw14 w15 w16 w17 w18 w19 w20\n/reset\nw10 w11\n".as_bytes(),
            std::io::sink(),
            &mut notices,
        )
        .unwrap();
        let notices = String::from_utf8(notices).unwrap();
        // 24 positions: the first turn and its whole reply fit, the second
        // reply is cut where the context ends, the third turn is refused
        // (no reply), then /reset and the first turn again.
        assert_eq!(replies[0].len(), 6, "{replies:?}");
        assert!(
            replies[1].len() < 6,
            "cut at the context's end: {replies:?}"
        );
        assert!(notices.contains("do not fit"), "{notices}");
        assert!(notices.contains("(a new conversation)"), "{notices}");
        assert_eq!(replies.len(), 3, "{replies:?}");
        assert_eq!(replies[2], replies[0], "after /reset, the same first reply");
    }

    /// A template that writes the fixed turns.
    const FIXED_TURNS: &str = "{%- for m in messages -%}\
        {{ '<|turn>' + ('model' if m.role == 'assistant' else m.role) + '\\n' + m.content + '<turn|>\\n' }}\
        {%- endfor -%}{%- if add_generation_prompt %}{{ '<|turn>model\\n' }}{% endif -%}";

    fn template(src: &str) -> Turns {
        let t = turbospark_cli::template::ChatTemplate::new(src, "test").unwrap();
        Turns::Template(Box::new(t))
    }

    /// Through a template that writes the fixed turns, a conversation is
    /// the fixed one: the same replies from the tiny model, and each later
    /// turn prefills only what the context lacks (the reply's text
    /// re-rendered gives back its tokens).
    #[test]
    fn a_template_conversation_keeps_its_context() {
        let tok = chat_tokenizer();
        let input = "w10 w11\nw12 w13 w14\nw15\n";
        let run = |turns: &Turns| {
            let mut m = model();
            converse(
                &mut m,
                &tok,
                turns,
                Some("w7"),
                &greedy(6),
                input.as_bytes(),
                std::io::sink(),
                std::io::sink(),
            )
            .unwrap()
        };
        let fixed = run(&Turns::Fixed);
        assert_eq!(fixed.len(), 3);
        assert_eq!(run(&template(FIXED_TURNS)), fixed);

        let mut m = Scripted {
            script: vec![7, 8, 501],
            prompts: Vec::new(),
            resets: 0,
        };
        let turns = template(FIXED_TURNS);
        converse(
            &mut m,
            &tok,
            &turns,
            None,
            &greedy(6),
            "w10\nw11\n".as_bytes(),
            std::io::sink(),
            std::io::sink(),
        )
        .unwrap();
        assert_eq!(m.resets, 0);
        let mut second = vec![501];
        second.extend(encode_with(&tok, &next_turn("w11"), false).unwrap());
        assert_eq!(m.prompts[1], second, "only the new turn");
    }

    /// A template whose rendering of the earlier turns differs from what
    /// the context holds (Gemma 4's: the reply's turn without the generation
    /// prompt's empty thinking) starts the context over with the whole
    /// conversation.
    #[test]
    fn a_template_that_rewrites_history_restarts_the_context() {
        let tok = chat_tokenizer();
        let src = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/chat-template/gemma4.jinja"
        ))
        .unwrap();
        let mut m = Scripted {
            script: vec![7, 8, 501],
            prompts: Vec::new(),
            resets: 0,
        };
        converse(
            &mut m,
            &tok,
            &template(&src),
            None,
            &greedy(6),
            "w10\nw11\n".as_bytes(),
            std::io::sink(),
            std::io::sink(),
        )
        .unwrap();
        assert_eq!(m.resets, 1);
        let t = turbospark_cli::template::ChatTemplate::new(&src, "t").unwrap();
        let whole = t
            .render(&turbospark_cli::template::RenderInput {
                messages: turbospark_cli::template::json(
                    r#"[{"role": "user", "content": "w10"}, {"role": "assistant", "content": "w7 w8"},
                        {"role": "user", "content": "w11"}]"#,
                )
                .unwrap(),
                add_generation_prompt: true,
                ..Default::default()
            })
            .unwrap();
        assert_eq!(m.prompts[1], encode_with(&tok, &whole, false).unwrap());
    }
}
