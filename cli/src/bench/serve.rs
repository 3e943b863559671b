//! `bench --serve`: what the server costs a stream. The `--synthetic`
//! model generates `--decode-tokens` greedy tokens after a random prompt of
//! `--prompt-tokens`, first through `Model::generate_streaming` (what
//! `generate` runs), then as one streamed `/v1/completions` request to a
//! server on the same loaded model in this process (`serve`'s engine and
//! HTTP tasks on 127.0.0.1), read over TCP as a client reads it. Time to
//! first token and decode tok/s of each, the median of a few runs after a
//! warm-up, side by side.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use turbospark::model::{GenerateOptions, Model, Sampling};
use turbospark::rng::Rng;
use turbospark::{ComputeBackend, Error};

use super::Args;

/// Timed runs of each path (the median is reported), after one warm-up.
const REPS: usize = 3;
/// Longest a server response may take.
const READ_TIMEOUT: Duration = Duration::from_secs(600);

/// A stream's times: to its first token, and its decode rate after it
/// (None where every token came in one read: a client slower than a small
/// model, as on a loaded CPU, sees no span to divide by).
#[derive(Clone, Copy)]
struct Timing {
    ttft_ms: f64,
    decode_tok_s: Option<f64>,
    /// From the start to the last token.
    total_ms: f64,
}

pub fn run<B>(backend: B, name: &str, args: &Args) -> turbospark::Result<Value>
where
    B: ComputeBackend + 'static,
    Model<B>: Send,
{
    let (prompt_len, decode) = (args.prompt_tokens.max(1), args.decode_tokens.max(2));
    let device = backend.info().device_name.clone();
    let (cfg, model) =
        super::e2e::load_model(backend, name, args, prompt_len + decode + 8, "serve")?;
    let mut rng = Rng::new(args.seed);
    let prompt: Vec<u32> = (0..prompt_len)
        .map(|_| rng.below(cfg.vocab as u64) as u32)
        .collect();
    let opts = GenerateOptions {
        max_new_tokens: decode,
        sampling: Sampling::Greedy,
        stop_at_eos: false,
    };

    let mut direct = Vec::new();
    let mut tokens = Vec::new();
    for rep in 0..=REPS {
        let mut seq = model.new_sequence()?;
        let t0 = Instant::now();
        let mut stamps = Vec::with_capacity(decode);
        let g = model.generate_streaming(&mut seq, &prompt, &opts, |_| {
            stamps.push(t0.elapsed());
            ControlFlow::Continue(())
        })?;
        tokens = g.tokens;
        if rep > 0 {
            direct.push(timing(&stamps)?);
        }
    }
    let direct = median(&direct);
    eprintln!(
        "generate: first token {:.2} ms, decode {}, last token {:.2} ms",
        direct.ttft_ms,
        direct
            .decode_tok_s
            .map_or("not measured".into(), |d| format!("{d:.1} tok/s")),
        direct.total_ms
    );

    let tok = Arc::new(synthetic_tokenizer(cfg.vocab)?);
    let server = crate::serve::local(model, tok, (name, 1)).map_err(other)?;
    let body = json!({
        "model": name,
        "prompt": prompt,
        "max_tokens": decode,
        "temperature": 0.0,
        "stream": true,
    })
    .to_string();
    let mut served = Vec::new();
    for rep in 0..=REPS {
        let (stamps, text) = stream(&server.addr, &body)?;
        let want = tokens
            .iter()
            .map(|t| format!("t{t}"))
            .collect::<Vec<_>>()
            .join(" ");
        if text.trim() != want {
            return Err(Error::InvalidInput(format!(
                "the server's reply is not generate's: {:.80} against {:.80}",
                text.trim(),
                want
            )));
        }
        if rep > 0 {
            served.push(timing(&stamps)?);
        }
    }
    let served = median(&served);
    let direct_decode = direct.decode_tok_s.unwrap_or(0.0);
    let decode_ratio = served.decode_tok_s.map(|d| d / direct_decode.max(1e-9));
    eprintln!(
        "serve: first token {:.2} ms ({:.3}x generate's), decode {}, last token {:.2} ms \
         ({:.3}x generate's)",
        served.ttft_ms,
        served.ttft_ms / direct.ttft_ms.max(1e-9),
        match (served.decode_tok_s, decode_ratio) {
            (Some(d), Some(r)) => format!("{d:.1} tok/s ({r:.3}x generate's)"),
            _ => "not measured (each run's tokens came in one read)".into(),
        },
        served.total_ms,
        served.total_ms / direct.total_ms.max(1e-9)
    );
    Ok(json!({
        "model": name,
        "device": device,
        "prompt_tokens": prompt_len,
        "decode_tokens": decode,
        "runs": REPS,
        "generate": {
            "ttft_ms": direct.ttft_ms,
            "decode_tok_s": direct.decode_tok_s,
            "last_token_ms": direct.total_ms,
        },
        "serve": {
            "ttft_ms": served.ttft_ms,
            "decode_tok_s": served.decode_tok_s,
            "last_token_ms": served.total_ms,
        },
        "serve_over_generate": {
            "ttft": served.ttft_ms / direct.ttft_ms.max(1e-9),
            "decode": decode_ratio,
            "last_token": served.total_ms / direct.total_ms.max(1e-9),
        },
    }))
}

fn other(e: impl std::fmt::Display) -> Error {
    Error::InvalidInput(format!("serve: {e}"))
}

/// Times from the start to each token: to the first, and the rate of the
/// ones after it.
fn timing(stamps: &[Duration]) -> turbospark::Result<Timing> {
    let (Some(first), Some(last)) = (stamps.first(), stamps.last()) else {
        return Err(Error::InvalidInput("no token came".into()));
    };
    let span = (*last - *first).as_secs_f64();
    Ok(Timing {
        ttft_ms: first.as_secs_f64() * 1e3,
        total_ms: last.as_secs_f64() * 1e3,
        decode_tok_s: (stamps.len() > 1 && span > 0.0).then(|| (stamps.len() - 1) as f64 / span),
    })
}

fn median(runs: &[Timing]) -> Timing {
    let pick = |f: fn(&Timing) -> f64| {
        let mut v: Vec<f64> = runs.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    // (the decode rate over the runs that had one)
    let mut decode: Vec<f64> = runs.iter().filter_map(|t| t.decode_tok_s).collect();
    decode.sort_by(f64::total_cmp);
    Timing {
        ttft_ms: pick(|t| t.ttft_ms),
        decode_tok_s: decode.get(decode.len() / 2).copied(),
        total_ms: pick(|t| t.total_ms),
    }
}

/// One streamed request to `addr`, read as it comes: the time from the
/// request's sending to the read that brought each token's text, and the
/// text.
fn stream(addr: &std::net::SocketAddr, body: &str) -> turbospark::Result<(Vec<Duration>, String)> {
    let io = |e: std::io::Error| Error::InvalidInput(format!("serve: the connection: {e}"));
    let mut c = TcpStream::connect(addr).map_err(io)?;
    c.set_nodelay(true).map_err(io)?;
    c.set_read_timeout(Some(READ_TIMEOUT)).map_err(io)?;
    let req = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let t0 = Instant::now();
    c.write_all(req.as_bytes()).map_err(io)?;
    let (mut raw, mut buf) = (Vec::new(), [0u8; 16384]);
    // (`done`: bytes of `raw` up to the last whole line read so far)
    let (mut stamps, mut text, mut done) = (Vec::new(), String::new(), 0);
    loop {
        let n = c.read(&mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
        let now = t0.elapsed();
        let Some(end) = raw[done..].iter().rposition(|&b| b == b'\n') else {
            continue;
        };
        // (events are whole lines of the body; a chunk's size line never
        // starts with "data: ")
        let fresh = String::from_utf8_lossy(&raw[done..done + end]).into_owned();
        done += end + 1;
        for line in fresh.split('\n') {
            let Some(event) = line.trim_end_matches('\r').strip_prefix("data: ") else {
                continue;
            };
            if event == "[DONE]" {
                continue;
            }
            let v: Value = serde_json::from_str(event)
                .map_err(|e| other(format!("an event that is not JSON ({e}): {event:.120}")))?;
            if let Some(err) = v.get("error") {
                return Err(other(format!("the server answered an error: {err}")));
            }
            let delta = v["choices"][0]["text"].as_str().unwrap_or_default();
            // (a token is a word of the synthetic tokenizer's: an event
            // holding several came together)
            for _ in delta.split_whitespace() {
                stamps.push(now);
            }
            text.push_str(delta);
        }
    }
    let head = String::from_utf8_lossy(&raw[..raw.len().min(64)]).into_owned();
    if !head.starts_with("HTTP/1.1 200") {
        return Err(other(format!("the server answered {head:.64}")));
    }
    Ok((stamps, text))
}

/// A word-level tokenizer of `vocab` tokens `t0`, `t1`, ...: the
/// synthetic model's ids to text and back, one word each.
fn synthetic_tokenizer(vocab: usize) -> turbospark::Result<tokenizers::Tokenizer> {
    let words: serde_json::Map<String, Value> =
        (0..vocab).map(|i| (format!("t{i}"), json!(i))).collect();
    let spec = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": { "type": "WhitespaceSplit" },
        "post_processor": null,
        "decoder": null,
        "model": { "type": "WordLevel", "vocab": words, "unk_token": "t0" },
    });
    spec.to_string()
        .parse()
        .map_err(|e| other(format!("the synthetic tokenizer: {e}")))
}
