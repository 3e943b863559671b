//! The engine thread: it owns the model (not `Sync`: its activation
//! scratch is shared by every pass) and runs the requests of a bounded
//! queue one at a time, streaming each one's text back as it is generated.
//! It keeps the sequences of recent requests (a prompt cache): a prompt
//! that extends one's tokens starts from a copy of it and prefills only
//! what is new.

use std::ops::ControlFlow;
use std::sync::Arc;

use tokio::sync::mpsc;
use turbospark::model::drafter::{Drafter, SpeculativeOptions};
use turbospark::model::{GenerateOptions, Model, Sequence};
use turbospark::ComputeBackend;

use crate::common::CliResult;

/// One generation to run.
pub struct Job {
    /// The whole prompt: the cache decides how much of it is prefilled.
    pub prompt: Vec<u32>,
    pub opts: GenerateOptions,
    /// Stop strings: the text is cut before the first one and generation ends.
    pub stops: Vec<String>,
    /// Tokens besides the model's end-of-sequence ones that end the reply
    /// (a chat's `<turn|>`); like those, not part of the text.
    pub stop_ids: Vec<u32>,
    /// Decode keeping special tokens (a chat reply's markers, which the
    /// reply parser reads), or dropping them (plain completions, as
    /// `generate` prints them).
    pub special: bool,
    /// Where the text goes; closed when the client has gone.
    pub events: mpsc::UnboundedSender<Event>,
}

/// What a job sends back: text as it comes, then one `Done` or `Error`.
#[derive(Debug)]
pub enum Event {
    Text(String),
    Done(Done),
    Error(String),
}

/// How a generation ended, and its token counts.
#[derive(Clone, Copy, Debug)]
pub struct Done {
    /// Ended by an end-of-sequence token or a stop string (else the token
    /// limit).
    pub stopped: bool,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens taken from a cached sequence, not run again.
    pub cached_tokens: usize,
}

/// Serve `jobs` with `model` (and `drafter`, speculative decoding, where
/// given) until the queue closes; `cache_size` sequences are kept for
/// later prompts.
pub fn serve<B: ComputeBackend>(
    model: Model<B>,
    drafter: Option<(Drafter<B>, SpeculativeOptions)>,
    tok: Arc<tokenizers::Tokenizer>,
    cache_size: usize,
    mut jobs: mpsc::Receiver<Job>,
) {
    let mut cache = PromptCache {
        seqs: Vec::new(),
        size: cache_size,
    };
    let eos = model.config().eos_token_ids.clone();
    while let Some(job) = jobs.blocking_recv() {
        // (a client that left while its request waited)
        if job.events.is_closed() {
            eprintln!("request skipped: the client went while it waited");
            continue;
        }
        // A panic (a bug, never bad input: requests are checked before they
        // queue) fails its request, not the server; the cached sequences
        // may be half written and go with it.
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            run(&model, drafter.as_ref(), &mut cache, &tok, &eos, &job)
        }));
        let ran = ran.unwrap_or_else(|_| {
            cache.seqs.clear();
            Err("the engine failed on this request (a panic): see the server's log".into())
        });
        let event = match ran {
            Ok(done) => {
                let how = if job.events.is_closed() {
                    "the client went"
                } else if done.stopped {
                    "stop"
                } else {
                    "length"
                };
                eprintln!(
                    "request: {} prompt tokens ({} cached), {} new; {how}",
                    done.prompt_tokens, done.cached_tokens, done.completion_tokens
                );
                Event::Done(done)
            }
            Err(e) => {
                eprintln!("request failed: {e}");
                Event::Error(e.to_string())
            }
        };
        let _ = job.events.send(event);
    }
}

/// The sequences of recent requests, the most recently used last.
struct PromptCache<B: ComputeBackend> {
    seqs: Vec<Sequence<B>>,
    size: usize,
}

impl<B: ComputeBackend> PromptCache<B> {
    /// A sequence to run `prompt` on, holding the longest prefix of it any
    /// cached sequence holds (all but its last token at most: a generation
    /// starts from a token of its own), and how many tokens that prefix is.
    fn take(&mut self, model: &Model<B>, prompt: &[u32]) -> CliResult<(Sequence<B>, usize)> {
        let limit = prompt.len().saturating_sub(1);
        let best = self
            .seqs
            .iter()
            .enumerate()
            .map(|(i, s)| (i, common_prefix(s.tokens(), prompt).min(limit)))
            .max_by_key(|&(i, n)| (n, i));
        match best {
            Some((i, n)) if n > 0 => {
                if self.seqs[i].position() == n {
                    // (all it holds is the prefix: taken, not copied)
                    return Ok((self.seqs.remove(i), n));
                }
                let seq = model.fork(&self.seqs[i], n)?;
                // (used again: the last to be evicted)
                let src = self.seqs.remove(i);
                self.seqs.push(src);
                // A fork whose source's sliding windows had moved on ran
                // the prefix again: only what it did not run is cached.
                let cached = n.saturating_sub(seq.computed_tokens() as usize);
                Ok((seq, cached))
            }
            _ => Ok((model.new_sequence()?, 0)),
        }
    }

    /// `seq` kept for later prompts, the least recently used dropped past
    /// the size.
    fn put(&mut self, seq: Sequence<B>) {
        if self.size == 0 {
            return;
        }
        // (a sequence whose tokens the new one holds is of no more use)
        self.seqs
            .retain(|s| common_prefix(s.tokens(), seq.tokens()) < s.position());
        self.seqs.push(seq);
        while self.seqs.len() > self.size {
            self.seqs.remove(0);
        }
    }
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

fn run<B: ComputeBackend>(
    model: &Model<B>,
    drafter: Option<&(Drafter<B>, SpeculativeOptions)>,
    cache: &mut PromptCache<B>,
    tok: &tokenizers::Tokenizer,
    eos: &[u32],
    job: &Job,
) -> CliResult<Done> {
    // The CPU backend reads its weights from the checkpoint's maps: a file
    // changed since the server started is an error, not a fault.
    crate::mapped::check_unchanged()?;
    let (mut seq, cached) = cache.take(model, &job.prompt)?;
    let mut text = TextOut::new(tok, job.special, &job.stops);
    let mut stopped = false;
    let mut failed = None;
    let on_token = |id| {
        if eos.contains(&id) || job.stop_ids.contains(&id) {
            stopped = true;
            return ControlFlow::Break(());
        }
        match text.push(id) {
            Ok(delta) => {
                if !delta.is_empty() && job.events.send(Event::Text(delta)).is_err() {
                    return ControlFlow::Break(());
                }
            }
            Err(e) => {
                failed = Some(e);
                return ControlFlow::Break(());
            }
        }
        if text.stopped {
            stopped = true;
            return ControlFlow::Break(());
        }
        // (the client has gone: its generation ends here)
        if job.events.is_closed() {
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    };
    let prompt = &job.prompt[cached..];
    let g = match drafter {
        Some((d, spec)) => d
            .generate(model, &mut seq, prompt, &job.opts, spec, on_token)
            .map(|(g, st)| {
                eprintln!(
                    "speculative: {} of {} drafts accepted, {:.2} tokens a target pass",
                    st.accepted,
                    st.drafted,
                    st.tokens_per_pass()
                );
                g
            }),
        None => model.generate_streaming(&mut seq, prompt, &job.opts, on_token),
    };
    // (on an error the sequence may be half written: dropped, not cached)
    let g = g?;
    if let Some(e) = failed {
        return Err(e);
    }
    let rest = text.finish()?;
    if !rest.is_empty() {
        let _ = job.events.send(Event::Text(rest));
    }
    cache.put(seq);
    Ok(Done {
        stopped: stopped || text.stopped,
        prompt_tokens: job.prompt.len(),
        completion_tokens: g.tokens.len(),
        cached_tokens: cached,
    })
}

/// Generated tokens to text given out in pieces: a piece is only ever
/// appended to, a character split over tokens waits for its last byte, and
/// text that may be the start of a stop string waits until it is not.
struct TextOut<'a> {
    tok: &'a tokenizers::Tokenizer,
    special: bool,
    stops: &'a [String],
    /// The text of the lines before `line`, decoded.
    done: String,
    /// The tokens since the last line break (decoded again at each token,
    /// so a decode costs a line, not the whole reply).
    line: Vec<u32>,
    /// The text so far (`done` and the line's decode).
    text: String,
    /// Bytes of `text` given out.
    sent: usize,
    /// A stop string was found: `text` is cut before it.
    stopped: bool,
}

impl<'a> TextOut<'a> {
    fn new(tok: &'a tokenizers::Tokenizer, special: bool, stops: &'a [String]) -> Self {
        TextOut {
            tok,
            special,
            stops,
            done: String::new(),
            line: Vec::new(),
            text: String::new(),
            sent: 0,
            stopped: false,
        }
    }

    fn decode(&self, ids: &[u32]) -> CliResult<String> {
        self.tok
            .decode(ids, !self.special)
            .map_err(|e| format!("detokenizing: {e}").into())
    }

    /// The next token; the text it lets out.
    fn push(&mut self, id: u32) -> CliResult<String> {
        self.line.push(id);
        let line = self.decode(&self.line)?;
        if line.ends_with('\u{fffd}') {
            return Ok(String::new());
        }
        self.text = format!("{}{line}", self.done);
        if line.ends_with('\n') {
            self.done = self.text.clone();
            self.line.clear();
        }
        Ok(self.release(false))
    }

    /// The text not yet given out (a split character as it decodes), cut
    /// at a stop string.
    fn finish(&mut self) -> CliResult<String> {
        if !self.stopped && !self.line.is_empty() {
            let line = self.decode(&self.line)?;
            self.text = format!("{}{line}", self.done);
        }
        Ok(self.release(true))
    }

    /// The text that can go out now: up to a stop string (found: the end),
    /// else up to what may be one's start (all of it at the end).
    fn release(&mut self, end: bool) -> String {
        if self.stopped {
            return String::new();
        }
        let from = self.sent.min(self.text.len());
        let found = self
            .stops
            .iter()
            .filter_map(|s| {
                // (one that started before the text given out was held back)
                let start = floor(&self.text, from.saturating_sub(s.len()));
                self.text[start..].find(s.as_str()).map(|i| start + i)
            })
            .min();
        let until = match found {
            Some(i) => {
                self.stopped = true;
                self.text.truncate(i);
                i
            }
            None if end => self.text.len(),
            None => self.text.len() - self.held_back(),
        };
        let out = self.text.get(from..until).unwrap_or_default().to_string();
        self.sent = self.sent.max(until);
        out
    }

    /// Bytes at the end of the text that are a stop string's start.
    fn held_back(&self) -> usize {
        let t = &self.text;
        self.stops
            .iter()
            .flat_map(|s| (1..s.len()).rev().map(move |n| &s[..floor(s, n)]))
            .filter(|p| !p.is_empty() && t.ends_with(*p))
            .map(str::len)
            .max()
            .unwrap_or(0)
    }
}

/// `i`, or the char boundary before it.
fn floor(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokenizer() -> tokenizers::Tokenizer {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tiny-text");
        crate::common::tokenizer(&dir).unwrap().unwrap()
    }

    /// Streamed pieces add up to the whole decode, cut before a stop
    /// string, and a stop string's start is held back until it is not one.
    #[test]
    fn text_is_cut_at_stop_strings() {
        let tok = tokenizer();
        let ids = tok
            .encode("w10 w11 w12 w13", false)
            .unwrap()
            .get_ids()
            .to_vec();
        let whole = tok.decode(&ids, true).unwrap();
        for (stops, want) in [
            (vec![], whole.clone()),
            (
                vec!["w12".to_string()],
                whole[..whole.find("w12").unwrap()].to_string(),
            ),
            (vec!["w1".to_string()], String::new()),
            (
                vec!["zz".to_string(), "w13".into()],
                whole[..whole.find("w13").unwrap()].to_string(),
            ),
        ] {
            let mut out = TextOut::new(&tok, false, &stops);
            let mut got = String::new();
            for &id in &ids {
                got.push_str(&out.push(id).unwrap());
                if out.stopped {
                    break;
                }
            }
            got.push_str(&out.finish().unwrap());
            assert_eq!(got, want, "{stops:?}");
            assert_eq!(out.stopped, !want.eq(&whole), "{stops:?}");
        }
    }

    #[test]
    fn common_prefixes() {
        assert_eq!(common_prefix(&[1, 2, 3], &[1, 2, 4]), 2);
        assert_eq!(common_prefix(&[], &[1]), 0);
        assert_eq!(common_prefix(&[1, 2], &[1, 2, 3]), 2);
    }
}
