//! `generate`'s output as it comes: each new token printed once the host
//! has it (text through the tokenizer, else comma-separated ids).

use std::io::Write;
use std::ops::ControlFlow;

use crate::common::{decode, CliError, CliResult};

/// Prints a growing continuation. The text since the last line break
/// printed is decoded again at each token and only what it adds is
/// printed, so what is on the screen is only ever appended to: a token that
/// ends inside a multi-byte character (decoded as U+FFFD until its last
/// byte comes) waits for the next one. Starting over at a line break (as
/// transformers' TextStreamer does) keeps a token's decode as long as its
/// line, not as the whole reply.
pub struct Stream<'a, W: Write> {
    out: W,
    tok: Option<&'a tokenizers::Tokenizer>,
    /// Tokens taken.
    count: usize,
    /// With a tokenizer: the tokens since the last line break printed.
    line: Vec<u32>,
    /// Their decoded text already written.
    shown: String,
    /// All the text written.
    printed: String,
    /// The first write or decode that failed (`take` stopped there).
    failed: Option<CliError>,
}

impl<'a, W: Write> Stream<'a, W> {
    pub fn new(out: W, tok: Option<&'a tokenizers::Tokenizer>) -> Self {
        Stream {
            out,
            tok,
            count: 0,
            line: Vec::new(),
            shown: String::new(),
            printed: String::new(),
            failed: None,
        }
    }

    /// [`Self::push`] as a generation callback: `Break` (stop generating)
    /// once a write fails, the error kept for [`Self::finish`].
    pub fn take(&mut self, id: u32) -> ControlFlow<()> {
        match self.push(id) {
            Ok(()) => ControlFlow::Continue(()),
            Err(e) => {
                self.failed = Some(e);
                ControlFlow::Break(())
            }
        }
    }

    /// Take the next token and print what it adds.
    pub fn push(&mut self, id: u32) -> CliResult {
        self.count += 1;
        match self.tok {
            None => {
                let sep = if self.count > 1 { "," } else { "" };
                write!(self.out, "{sep}{id}")?;
            }
            Some(t) => {
                self.line.push(id);
                let text = decode(t, &self.line)?;
                if !text.ends_with('\u{fffd}') {
                    self.show(&text)?;
                    if text.ends_with('\n') {
                        self.line.clear();
                        self.shown.clear();
                    }
                }
            }
        }
        Ok(self.out.flush()?)
    }

    /// The text printed so far (empty for ids).
    pub fn printed(&self) -> &str {
        &self.printed
    }

    /// Print what is left (a trailing partial character as it decodes) and
    /// end the line; or the error that stopped [`Self::take`].
    pub fn finish(mut self) -> CliResult {
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        if let Some(t) = self.tok {
            let text = decode(t, &self.line)?;
            self.show(&text)?;
        }
        writeln!(self.out)?;
        Ok(self.out.flush()?)
    }

    /// Write the part of `text` past what is shown. A decoder that changes
    /// earlier text (it may drop a leading space once more follows) cannot
    /// be unprinted: the part past the longest common prefix is written.
    fn show(&mut self, text: &str) -> CliResult {
        let common = self
            .shown
            .char_indices()
            .zip(text.chars())
            .find(|((_, a), b)| a != b)
            .map_or(self.shown.len().min(text.len()), |((i, _), _)| i);
        if text.len() > common {
            write!(self.out, "{}", &text[common..])?;
            self.printed.push_str(&text[common..]);
        }
        self.shown = text.to_string();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ids are written as they come, comma-separated, and the line ended.
    #[test]
    fn ids_stream_comma_separated() {
        let mut buf = Vec::new();
        let mut s = Stream::new(&mut buf, None);
        for id in [5, 17, 42] {
            s.push(id).unwrap();
        }
        s.finish().unwrap();
        assert_eq!(String::from_utf8(buf).unwrap(), "5,17,42\n");
    }

    /// A write that fails (stdout closed) stops generation, and finish
    /// reports it.
    #[test]
    fn a_failed_write_stops_and_is_reported() {
        struct Closed;
        impl Write for Closed {
            fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
                Err(std::io::ErrorKind::BrokenPipe.into())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut s = Stream::new(Closed, None);
        assert!(s.take(5).is_break());
        let e = s.finish().unwrap_err();
        assert!(e.to_string().to_lowercase().contains("pipe"), "{e}");
    }

    /// A byte-fallback tokenizer: `a` 0, `b` 1, the bytes of U+4E16 (3
    /// tokens, 2-4) and of a line break (5).
    fn byte_tokenizer() -> tokenizers::Tokenizer {
        let json = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],
            "normalizer":null,"pre_tokenizer":null,"post_processor":null,
            "decoder":{"type":"Sequence","decoders":[{"type":"ByteFallback"},{"type":"Fuse"}]},
            "model":{"type":"BPE","dropout":null,"unk_token":null,"continuing_subword_prefix":null,
            "end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":true,
            "vocab":{"a":0,"b":1,"<0xE4>":2,"<0xB8>":3,"<0x96>":4,"<0x0A>":5},"merges":[]}}"#;
        json.parse().unwrap()
    }

    /// A character split over byte tokens (byte fallback) is printed once
    /// its last byte comes, never as U+FFFD.
    #[test]
    fn a_split_character_waits_for_its_last_byte() {
        let tok = byte_tokenizer();
        let mut buf = Vec::new();
        let mut s = Stream::new(&mut buf, Some(&tok));
        let mut seen = Vec::new();
        for id in [0, 2, 3, 4, 1] {
            s.push(id).unwrap();
            seen.push(String::from_utf8(s.out.clone()).unwrap());
        }
        s.finish().unwrap();
        assert_eq!(seen, ["a", "a", "a", "a\u{4e16}", "a\u{4e16}b"]);
        assert_eq!(String::from_utf8(buf).unwrap(), "a\u{4e16}b\n");
    }

    /// After a line break the decode starts over from the next token; the
    /// text printed is still the whole decode, and `printed` all of it.
    #[test]
    fn lines_start_the_decode_over() {
        let tok = byte_tokenizer();
        let ids = [0, 5, 2, 3, 4, 1, 5, 5, 0];
        let mut buf = Vec::new();
        let mut s = Stream::new(&mut buf, Some(&tok));
        for id in ids {
            s.push(id).unwrap();
        }
        assert!(s.line.len() == 1, "the last line only: {:?}", s.line);
        let whole = decode(&tok, &ids).unwrap();
        assert_eq!(whole, "a\n\u{4e16}b\n\na");
        assert_eq!(s.printed(), whole);
        s.finish().unwrap();
        assert_eq!(String::from_utf8(buf).unwrap(), format!("{whole}\n"));
    }

    /// Text streamed a token at a time prints exactly the whole decode.
    #[test]
    fn text_streams_to_the_whole_decode() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tiny-text");
        let tok = crate::common::tokenizer(&dir)
            .unwrap()
            .expect("the fixture's tokenizer");
        let ids = crate::common::encode(&tok, "Grüße, 世界! A plain line, then émoji 🦀 and more.")
            .unwrap();
        let mut buf = Vec::new();
        let mut s = Stream::new(&mut buf, Some(&tok));
        let mut partial = Vec::new();
        for &id in &ids {
            s.push(id).unwrap();
            partial.push(String::from_utf8(s.out.clone()).unwrap());
        }
        s.finish().unwrap();
        let whole = decode(&tok, &ids).unwrap();
        assert_eq!(String::from_utf8(buf).unwrap(), format!("{whole}\n"));
        // (what is printed only ever grows, and never shows U+FFFD)
        for w in partial.windows(2) {
            assert!(w[1].starts_with(&w[0]), "{:?} -> {:?}", w[0], w[1]);
        }
        assert!(!partial.iter().any(|p| p.contains('\u{fffd}')));
    }
}
