//! The engine thread: it owns the model (not `Sync`: its activation
//! scratch is shared by every pass) and runs the requests of a bounded
//! queue, streaming each one's text back as it is generated. Up to
//! `--parallel` generations run at once (continuous batching): a request
//! joins after its prompt's prefill, each step is one batched pass over
//! the active generations (`Model::decode_batch_ahead`: the next step
//! recorded while the device runs this one), and a generation leaves
//! between steps when it ends (its token limit, an end-of-sequence token, a
//! stop string, its client gone). A prompt that arrives while others
//! generate is prefilled one prefill batch between two of their steps (a
//! long prompt delays each running stream by a batch's prefill at a time,
//! not by all of it), at the same batch boundaries as alone, so its reply
//! is the same. Speculative
//! decoding runs one request at a time. The engine keeps the sequences of
//! recent requests (a prompt cache): a prompt that extends one's tokens
//! starts from a copy of it and prefills only what is new.

use std::ops::ControlFlow;
use std::sync::Arc;

use tokio::sync::mpsc;
use turbospark::model::drafter::{Drafter, SpeculativeOptions};
use turbospark::model::sampling::Sampler;
use turbospark::model::{BatchAhead, GenerateOptions, Model, Sequence};
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
    /// The most generations one decode step of this one carried.
    pub widest_batch: usize,
}

/// What the engine runs: the model, a drafter for speculative decoding
/// where given, the tokenizer, and how many generations run at once.
pub struct Engine<B: ComputeBackend> {
    pub model: Model<B>,
    pub drafter: Option<(Drafter<B>, SpeculativeOptions)>,
    pub tok: Arc<tokenizers::Tokenizer>,
    /// Sequences kept for later prompts.
    pub cache_size: usize,
    /// Generations stepped together (1 with a drafter).
    pub parallel: usize,
}

/// Serve `jobs` until the queue closes: with a drafter one request at a
/// time, else up to `parallel` generations batched.
pub fn serve<B: ComputeBackend>(e: Engine<B>, mut jobs: mpsc::Receiver<Job>) {
    let mut cache = PromptCache {
        seqs: Vec::new(),
        size: e.cache_size,
    };
    let eos = e.model.config().eos_token_ids.clone();
    let (model, tok) = (&e.model, &*e.tok);
    if e.drafter.is_some() {
        while let Some(job) = jobs.blocking_recv() {
            if skipped(&job) {
                continue;
            }
            let ran = guarded(&mut cache, |cache| {
                run(model, e.drafter.as_ref(), cache, tok, &eos, &job)
            });
            report(&job, ran);
        }
        return;
    }
    let mut active: Vec<Active<'_, B>> = Vec::new();
    // The batched steps run a step ahead on the device (where the rows
    // allow: greedy, one pass); without its two small buffers, they do not.
    let mut ahead = model
        .batch_ahead()
        .map_err(|e| eprintln!("batched steps not run ahead: {e}"))
        .ok();
    // A request whose prompt is being prefilled between steps (one at a time).
    let mut joining: Option<Joining<'_, B>> = None;
    loop {
        // Join: waiting for a request only while none runs.
        while joining.is_none() && active.len() < e.parallel.max(1) {
            let job = if active.is_empty() {
                match jobs.blocking_recv() {
                    Some(job) => job,
                    None => return,
                }
            } else {
                match jobs.try_recv() {
                    Ok(job) => job,
                    Err(_) => break,
                }
            };
            if skipped(&job) {
                continue;
            }
            if job.opts.max_new_tokens == 0 {
                // (a prefill alone: nothing to step)
                let ran = guarded(&mut cache, |cache| run(model, None, cache, tok, &eos, &job));
                report(&job, ran);
                continue;
            }
            if !active.is_empty() {
                // (others generate: the prompt goes in a batch between steps)
                match guarded(&mut cache, |cache| begin(model, cache, tok, &job)) {
                    Ok((gen, at)) => {
                        eprintln!(
                            "request joins {} running: {} prompt tokens to prefill, {} a step",
                            active.len(),
                            job.prompt.len() - at,
                            model.prefill_batch()
                        );
                        joining = Some(Joining { job, gen, at });
                    }
                    Err(err) => report(&job, Err(err)),
                }
                break;
            }
            // (alone, a greedy request decodes pipelined until another
            // waits to join it; with --parallel 1 none ever joins)
            let waiting = || e.parallel > 1 && !jobs.is_empty();
            let alone = active.is_empty().then_some(&waiting as &dyn Fn() -> bool);
            match guarded(&mut cache, |cache| {
                start(model, cache, (tok, &eos), &job, alone)
            }) {
                Ok((gen, false)) => active.push(Active { job, gen }),
                Ok((gen, true)) => {
                    let done = gen.finish(&job, &mut cache);
                    report(&job, done);
                }
                Err(err) => report(&job, Err(err)),
            }
        }
        if let Some(mut j) = joining.take() {
            let job = &j.job;
            let chunk = model.prefill_batch();
            match guarded(&mut cache, |_| {
                j.gen.prefill_piece(model, job, &mut j.at, chunk, &eos)
            }) {
                Ok(None) => joining = Some(j),
                Ok(Some(false)) => active.push(Active {
                    job: j.job,
                    gen: j.gen,
                }),
                Ok(Some(true)) => {
                    let done = j.gen.finish(&j.job, &mut cache);
                    report(&j.job, done);
                }
                Err(err) => report(&j.job, Err(err)),
            }
        }
        if !active.is_empty() {
            step(model, &mut active, &mut cache, &eos, ahead.as_mut());
        }
    }
}

/// A request joining running generations: its generation so far and how
/// much of its prompt the sequence holds.
struct Joining<'t, B: ComputeBackend> {
    job: Job,
    gen: Generating<'t, B>,
    /// Prompt tokens in the sequence (the cached prefix, then the batches
    /// prefilled so far).
    at: usize,
}

/// A request whose client left while it waited.
fn skipped(job: &Job) -> bool {
    let gone = job.events.is_closed();
    if gone {
        eprintln!("request skipped: the client went while it waited");
    }
    gone
}

/// `f` run so that a panic (a bug, never bad input: requests are checked
/// before they queue) fails its request, not the server; the cached
/// sequences may be half written and go with it.
fn guarded<B: ComputeBackend, T>(
    cache: &mut PromptCache<B>,
    f: impl FnOnce(&mut PromptCache<B>) -> CliResult<T>,
) -> CliResult<T> {
    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(cache)));
    ran.unwrap_or_else(|_| {
        cache.seqs.clear();
        Err("the engine failed on this request (a panic): see the server's log".into())
    })
}

/// The log line of a request and its last event.
fn report(job: &Job, ran: CliResult<Done>) {
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
                "request: {} prompt tokens ({} cached), {} new, up to {} at once; {how}",
                done.prompt_tokens, done.cached_tokens, done.completion_tokens, done.widest_batch
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

/// A request being generated: its job and where its generation stands.
struct Active<'t, B: ComputeBackend> {
    job: Job,
    gen: Generating<'t, B>,
}

/// A generation between steps: its sequence and its progress.
struct Generating<'t, B: ComputeBackend> {
    seq: Sequence<B>,
    p: Progress<'t>,
}

/// Where a generation stands, apart from its sequence.
struct Progress<'t> {
    sampler: Sampler,
    text: TextOut<'t>,
    cached: usize,
    /// Tokens generated so far.
    tokens: usize,
    /// The last of them: the next step's input.
    last: u32,
    /// Ended by an end-of-sequence or stop token.
    stopped: bool,
    /// The most generations a step of this one carried.
    widest: usize,
}

/// A request's start: its sequence (from the prompt cache where it can),
/// its prompt's prefill alone and its first token, handed over. The
/// generation, and whether it has ended already.
///
/// With `alone` (no other generation runs) a greedy request runs
/// `Model::generate_streaming`'s pipelined decode (a step recorded before
/// the previous one's token is read) until it ends or `alone` says a
/// request waits to join; then it goes on in batched steps from where it
/// stopped (the same tokens: the context holds all but its last).
fn start<'t, B: ComputeBackend>(
    model: &Model<B>,
    cache: &mut PromptCache<B>,
    (tok, eos): (&'t tokenizers::Tokenizer, &[u32]),
    job: &Job,
    alone: Option<&dyn Fn() -> bool>,
) -> CliResult<(Generating<'t, B>, bool)> {
    let (Generating { mut seq, mut p }, cached) = begin(model, cache, tok, job)?;
    let prompt = &job.prompt[cached..];
    if let Some(joins) = alone.filter(|_| job.opts.sampling.is_greedy()) {
        let (mut ends, mut failed) = (false, None);
        model.generate_streaming(&mut seq, prompt, &job.opts, |id| {
            match p.take(id, job, eos) {
                Ok(false) if !joins() => ControlFlow::Continue(()),
                // (a request waits: on in batched steps)
                Ok(false) => ControlFlow::Break(()),
                Ok(true) => {
                    ends = true;
                    ControlFlow::Break(())
                }
                Err(e) => {
                    failed = Some(e);
                    ControlFlow::Break(())
                }
            }
        })?;
        if let Some(e) = failed {
            return Err(e);
        }
        return Ok((Generating { seq, p }, ends));
    }
    let first = model.prefill_next(&mut seq, prompt, &mut p.sampler, job.opts.max_new_tokens)?;
    let ends = p.take(first, job, eos)?;
    Ok((Generating { seq, p }, ends))
}

/// A request's generation before its prompt runs: its sampler, its
/// sequence from the prompt cache where one holds a prefix of the prompt,
/// and how many prompt tokens that sequence holds already.
fn begin<'t, B: ComputeBackend>(
    model: &Model<B>,
    cache: &mut PromptCache<B>,
    tok: &'t tokenizers::Tokenizer,
    job: &Job,
) -> CliResult<(Generating<'t, B>, usize)> {
    // The CPU backend reads its weights from the checkpoint's maps: a file
    // changed since the server started is an error, not a fault.
    crate::mapped::check_unchanged()?;
    let mut sampler = Sampler::new(&job.opts.sampling)?;
    // (the whole prompt is seen, however much of it the cache held: a
    // reply does not depend on what ran before it)
    sampler.observe(&job.prompt);
    let (seq, cached) = cache.take(model, &job.prompt)?;
    let p = Progress {
        sampler,
        text: TextOut::new(tok, job.special, job.stops.clone()),
        cached,
        tokens: 0,
        last: 0,
        stopped: false,
        widest: 1,
    };
    Ok((Generating { seq, p }, cached))
}

/// One batched step of every active generation, the next run ahead where
/// `ahead` is given; those that end leave (each answered), the rest stay
/// for the next.
fn step<B: ComputeBackend>(
    model: &Model<B>,
    active: &mut Vec<Active<'_, B>>,
    cache: &mut PromptCache<B>,
    eos: &[u32],
    ahead: Option<&mut BatchAhead<B>>,
) {
    let last: Vec<u32> = active.iter().map(|a| a.gen.p.last).collect();
    for a in active.iter_mut() {
        a.gen.p.widest = a.gen.p.widest.max(last.len());
    }
    let (mut seqs, mut samplers): (Vec<_>, Vec<_>) = active
        .iter_mut()
        .map(|a| (&mut a.gen.seq, &mut a.gen.p.sampler))
        .unzip();
    let stepped = guarded(cache, |_| {
        Ok(match ahead {
            Some(a) => model.decode_batch_ahead(a, &mut seqs, &last, &mut samplers)?,
            None => model.decode_batch(&mut seqs, &last, &mut samplers)?,
        })
    });
    let ids = match stepped {
        Ok(ids) => ids,
        Err(e) => {
            // (every sequence of the pass may be half written: none is kept)
            let msg = e.to_string();
            for a in active.drain(..) {
                report(&a.job, Err(msg.clone().into()));
            }
            return;
        }
    };
    for (mut a, id) in std::mem::take(active).into_iter().zip(ids) {
        match a.gen.p.take(id, &a.job, eos) {
            Ok(false) => active.push(a),
            Ok(true) => {
                let done = a.gen.finish(&a.job, cache);
                report(&a.job, done);
            }
            Err(e) => report(&a.job, Err(e)),
        }
    }
}

impl Progress<'_> {
    /// Token `id` handed over (its text sent); whether generation ends
    /// after it, as `Model::generate_streaming` would end it.
    fn take(&mut self, id: u32, job: &Job, eos: &[u32]) -> CliResult<bool> {
        self.tokens += 1;
        self.last = id;
        let brk = self.hand_over(id, job, eos)?;
        Ok(brk
            || (job.opts.stop_at_eos && eos.contains(&id))
            || self.tokens >= job.opts.max_new_tokens)
    }

    /// What `run`'s callback does with a token: whether it breaks.
    fn hand_over(&mut self, id: u32, job: &Job, eos: &[u32]) -> CliResult<bool> {
        if eos.contains(&id) || job.stop_ids.contains(&id) {
            self.stopped = true;
            return Ok(true);
        }
        let delta = self.text.push(id)?;
        if !delta.is_empty() && job.events.send(Event::Text(delta)).is_err() {
            return Ok(true);
        }
        if self.text.stopped {
            self.stopped = true;
            return Ok(true);
        }
        // (the client has gone: its generation ends here)
        Ok(job.events.is_closed())
    }
}

impl<B: ComputeBackend> Generating<'_, B> {
    /// The next piece of the prompt from `*at`: `chunk` tokens (a multiple
    /// of the model's prefill batch, so the batches fall where a prefill of
    /// the whole would put them) while more than that remain, else the
    /// rest with the first new token picked and handed over. None while
    /// prompt remains; then whether the generation has ended already.
    fn prefill_piece(
        &mut self,
        model: &Model<B>,
        job: &Job,
        at: &mut usize,
        chunk: usize,
        eos: &[u32],
    ) -> CliResult<Option<bool>> {
        crate::mapped::check_unchanged()?;
        if job.events.is_closed() {
            // (the client has gone: nothing more to prefill for it)
            return Ok(Some(true));
        }
        let rest = &job.prompt[*at..];
        if rest.len() > chunk {
            model.prefill(&mut self.seq, &rest[..chunk])?;
            *at += chunk;
            return Ok(None);
        }
        let p = &mut self.p;
        let first =
            model.prefill_next(&mut self.seq, rest, &mut p.sampler, job.opts.max_new_tokens)?;
        *at = job.prompt.len();
        Ok(Some(p.take(first, job, eos)?))
    }

    /// The generation ended: the rest of its text sent, its sequence kept
    /// in the cache.
    fn finish(self, job: &Job, cache: &mut PromptCache<B>) -> CliResult<Done> {
        let Generating { seq, mut p } = self;
        let rest = p.text.finish()?;
        if !rest.is_empty() {
            let _ = job.events.send(Event::Text(rest));
        }
        cache.put(seq);
        Ok(Done {
            stopped: p.stopped || p.text.stopped,
            prompt_tokens: job.prompt.len(),
            completion_tokens: p.tokens,
            cached_tokens: p.cached,
            widest_batch: p.widest,
        })
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

/// A request run alone, start to end: speculative decoding with the
/// drafter, or a prompt's prefill without new tokens.
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
    let mut text = TextOut::new(tok, job.special, job.stops.clone());
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
        widest_batch: 1,
    })
}

/// Generated tokens to text given out in pieces: a piece is only ever
/// appended to, a character split over tokens waits for its last byte, and
/// text that may be the start of a stop string waits until it is not.
struct TextOut<'a> {
    tok: &'a tokenizers::Tokenizer,
    special: bool,
    stops: Vec<String>,
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
    fn new(tok: &'a tokenizers::Tokenizer, special: bool, stops: Vec<String>) -> Self {
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
            let mut out = TextOut::new(&tok, false, stops.clone());
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
