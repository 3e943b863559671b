//! `turbospark serve`: an OpenAI-compatible HTTP server (axum on tokio).
//! One engine thread owns the model and runs the requests of a bounded
//! queue, up to `--parallel` at once in batched decode steps (`engine.rs`);
//! the HTTP side renders and tokenizes prompts, checks requests and
//! streams the replies (`http.rs`).

mod engine;
mod http;
mod prompt;
mod request;

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use turbospark::model::Model;
use turbospark::ComputeBackend;
use turbospark_cpu::CpuBackend;

use turbospark::model::drafter::{Drafter, SpeculativeOptions, DEFAULT_DRAFT_TOKENS};

use crate::common::{open_wgpu, tokenizer, BackendKind, CliResult};
use crate::generate::{RunArgs, PROMPT_BYTES_PER_TOKEN, PROMPT_SLACK_BYTES};

#[derive(clap::Args)]
pub struct Args {
    /// Checkpoint directory (config.json + safetensors + tokenizer.json).
    #[arg(long)]
    model: PathBuf,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free one; the address is printed).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Requests that may wait while --parallel run; past that a request
    /// gets 429.
    #[arg(long, default_value_t = 16)]
    queue: usize,
    /// Generations run at once (continuous batching): each decode step is
    /// one pass over them all, reading the weights once; a request joins
    /// after its prompt's prefill and leaves when it ends. Default 4; with
    /// --draft-model 1, the only value it takes (speculative decoding runs
    /// one request at a time).
    #[arg(long, value_name = "N")]
    parallel: Option<usize>,
    /// Sequences of recent requests kept, for prompts that extend them (a
    /// conversation's next turn, a shared system prompt): 0 keeps none.
    #[arg(long, default_value_t = 4)]
    cache_sequences: usize,
    /// Seconds a SIGINT or SIGTERM waits for the responses in flight.
    #[arg(long, default_value_t = 30)]
    shutdown_timeout: u64,
    /// Speculative decoding with this Gemma 4 drafter ("assistant")
    /// checkpoint: the model's own replies, the model checking the
    /// drafter's proposals in one pass each round.
    #[arg(long, value_name = "DIR")]
    draft_model: Option<PathBuf>,
    /// Tokens the drafter proposes a round, with --draft-model (default 4).
    #[arg(
        long,
        value_name = "K",
        requires = "draft_model",
        allow_negative_numbers = true
    )]
    draft_tokens: Option<usize>,
    #[command(flatten)]
    run: RunArgs,
}

pub fn run(a: Args) -> CliResult {
    if a.queue == 0 {
        return Err("--queue must be at least 1".into());
    }
    let parallel = parallel(&a)?;
    let tok = Arc::new(tokenizer(&a.model)?.ok_or_else(|| {
        format!(
            "{} has no tokenizer.json, which serve needs",
            a.model.display()
        )
    })?);
    let renderer = prompt::Renderer::load(&a.model, &tok)?;
    let max_context = a.run.context(&a.model)?;
    let (jobs, queue) = mpsc::channel(a.queue);
    let device = start_engine(&a, (max_context, parallel), tok.clone(), queue)?;
    let chat_stop_ids = turbospark_cli::reply::STOP_MARKERS
        .iter()
        .filter_map(|t| tok.token_to_id(t))
        .collect();
    let model_name = a.model.file_name().map_or_else(
        || a.model.display().to_string(),
        |n| n.to_string_lossy().into(),
    );
    eprintln!(
        "{device}: {model_name}, {max_context}-token context, {parallel} at once; {}",
        renderer.describe()
    );
    let app = Arc::new(http::App {
        vocab: tok.get_vocab_size(true),
        tok,
        renderer,
        jobs,
        model_name,
        max_context,
        chat_stop_ids,
        started: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    });
    // A body as long as the longest prompt `generate --prompt-file` takes,
    // twice over for JSON's escapes and the messages' structure.
    let body_limit = (max_context as u64)
        .saturating_mul(PROMPT_BYTES_PER_TOKEN)
        .saturating_add(PROMPT_SLACK_BYTES)
        .saturating_mul(2);
    let body_limit = usize::try_from(body_limit).unwrap_or(usize::MAX);
    let router = http::router(app, body_limit);
    let grace = Duration::from_secs(a.shutdown_timeout);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(listen(&a.host, a.port, router, grace))
}

/// Generations run at once: `--parallel` (4 by default), 1 with a drafter,
/// which runs one request at a time and refuses more by name.
fn parallel(a: &Args) -> CliResult<usize> {
    match (a.parallel, &a.draft_model) {
        (Some(0), _) => Err("--parallel must be at least 1".into()),
        (Some(n), Some(_)) if n > 1 => Err(format!(
            "--parallel {n} with --draft-model: speculative decoding runs one request at a \
             time (leave --parallel out, or 1)"
        )
        .into()),
        (Some(n), _) => Ok(n),
        (None, Some(_)) => Ok(1),
        (None, None) => Ok(DEFAULT_PARALLEL),
    }
}

/// Generations `serve` runs at once unless told.
const DEFAULT_PARALLEL: usize = 4;

/// Load the model on the engine thread (it stays there: `Model` is not
/// `Sync`) and start serving `queue` there; the device's name once loaded.
fn start_engine(
    a: &Args,
    (max_context, parallel): (usize, usize),
    tok: Arc<tokenizers::Tokenizer>,
    queue: mpsc::Receiver<engine::Job>,
) -> CliResult<String> {
    let (ready, loaded) = std::sync::mpsc::channel::<CliResult<String>>();
    let run = a.run.clone();
    let dir = a.model.clone();
    let cache = a.cache_sequences;
    let draft = a.draft_model.clone().map(|d| {
        let spec = SpeculativeOptions {
            draft_tokens: a.draft_tokens.unwrap_or(DEFAULT_DRAFT_TOKENS),
            forced: None,
        };
        (d, spec)
    });
    std::thread::Builder::new()
        .name("engine".into())
        .spawn(move || {
            fn go<B: ComputeBackend>(
                loaded: CliResult<(Model<B>, String)>,
                (ready, draft): (
                    std::sync::mpsc::Sender<CliResult<String>>,
                    Option<(PathBuf, SpeculativeOptions)>,
                ),
                tok: Arc<tokenizers::Tokenizer>,
                (cache_size, parallel): (usize, usize),
                queue: mpsc::Receiver<engine::Job>,
            ) {
                let loaded = loaded.and_then(|(model, device)| {
                    let drafter = match draft {
                        Some((dir, spec)) => Some((Drafter::load(&model, &dir)?, spec)),
                        None => None,
                    };
                    Ok((model, drafter, device))
                });
                match loaded {
                    Ok((model, drafter, device)) => {
                        let _ = ready.send(Ok(device));
                        let e = engine::Engine {
                            model,
                            drafter,
                            tok,
                            cache_size,
                            parallel,
                        };
                        engine::serve(e, queue);
                    }
                    Err(e) => {
                        let _ = ready.send(Err(e));
                    }
                }
            }
            match run.backend {
                BackendKind::Cpu => go(
                    run.load_model(CpuBackend::new(), &dir, max_context),
                    (ready, draft),
                    tok,
                    (cache, parallel),
                    queue,
                ),
                BackendKind::Wgpu => match open_wgpu(run.adapter.clone()) {
                    Ok(b) => go(
                        run.load_model(b, &dir, max_context),
                        (ready, draft),
                        tok,
                        (cache, parallel),
                        queue,
                    ),
                    Err(e) => {
                        let _ = ready.send(Err(e));
                    }
                },
            }
        })?;
    loaded
        .recv()
        .map_err(|_| "the engine thread ended while loading the model")?
}

/// A server on a model loaded in this process (`bench --serve`): the
/// engine thread and the HTTP tasks as `serve` runs them, on 127.0.0.1 at a
/// free port, with no prompt cache (every request prefills its whole
/// prompt, as `generate` does). Dropping it stops the HTTP tasks, which
/// closes the engine's queue, and waits for the engine thread to end (its
/// model, and the device, released before the process goes on to exit).
pub struct Local {
    pub addr: std::net::SocketAddr,
    runtime: Option<tokio::runtime::Runtime>,
    engine: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Local {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_secs(5));
        }
        if let Some(engine) = self.engine.take() {
            let _ = engine.join();
        }
    }
}

pub fn local<B>(
    model: Model<B>,
    tok: Arc<tokenizers::Tokenizer>,
    (model_name, parallel): (&str, usize),
) -> CliResult<Local>
where
    B: ComputeBackend + 'static,
    Model<B>: Send,
{
    let max_context = model.max_context();
    let (jobs, queue) = mpsc::channel(DEFAULT_QUEUE);
    let engine_tok = tok.clone();
    let engine = std::thread::Builder::new()
        .name("engine".into())
        .spawn(move || {
            let e = engine::Engine {
                model,
                drafter: None,
                tok: engine_tok,
                cache_size: 0,
                parallel,
            };
            engine::serve(e, queue)
        })?;
    let app = Arc::new(http::App {
        vocab: tok.get_vocab_size(true),
        tok,
        renderer: prompt::Renderer::None,
        jobs,
        model_name: model_name.into(),
        max_context,
        chat_stop_ids: Vec::new(),
        started: 0,
    });
    let router = http::router(app, usize::MAX);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let listener = runtime.block_on(tokio::net::TcpListener::bind(("127.0.0.1", 0)))?;
    let addr = listener.local_addr()?;
    runtime.spawn(async move { axum::serve(no_delay(listener), router).await });
    Ok(Local {
        addr,
        runtime: Some(runtime),
        engine: Some(engine),
    })
}

/// `listener` with Nagle's algorithm off on each connection, so that a
/// streamed token's chunk leaves when written rather than waiting for the
/// previous one's acknowledgement (which on a delayed-ack peer held a fast
/// model's tokens back and sent them together).
fn no_delay(
    listener: tokio::net::TcpListener,
) -> impl axum::serve::Listener<Io = tokio::net::TcpStream, Addr = std::net::SocketAddr> {
    use axum::serve::ListenerExt;
    listener.tap_io(|tcp| {
        // (a connection that refuses it still works, only later)
        let _ = tcp.set_nodelay(true);
    })
}

/// Requests a [`local`] server's queue holds.
const DEFAULT_QUEUE: usize = 16;

/// Serve `router` on `host:port` until SIGINT or SIGTERM, then stop
/// accepting and wait up to `grace` for the responses in flight.
async fn listen(host: &str, port: u16, router: axum::Router, grace: Duration) -> CliResult {
    let listener = tokio::net::TcpListener::bind((host, port))
        .await
        .map_err(|e| format!("listening on {host}:{port}: {e}"))?;
    let addr = listener.local_addr()?;
    // (on stdout, the one line there: a script or test reads the port)
    let mut out = std::io::stdout().lock();
    writeln!(out, "listening on http://{addr}")?;
    out.flush()?;
    drop(out);
    // (the handlers installed before the address is out: a signal sent
    // as soon as it is read is caught)
    let signalled = signalled()?;
    let (stop, stopping) = watch::channel(false);
    tokio::spawn(async move {
        signalled.await;
        eprintln!("stopping: no new connections; finishing the responses in flight");
        let _ = stop.send(true);
    });
    let mut on_signal = stopping.clone();
    let server = axum::serve(no_delay(listener), router).with_graceful_shutdown(async move {
        let _ = on_signal.wait_for(|s| *s).await;
    });
    let mut timer = stopping;
    tokio::select! {
        r = async move { server.await } => r?,
        _ = async move {
            let _ = timer.wait_for(|s| *s).await;
            tokio::time::sleep(grace).await;
        } => eprintln!("stopping: responses still in flight after {} s dropped", grace.as_secs()),
    }
    Ok(())
}

/// A future that ends at SIGINT (Ctrl-C) or, on Unix, SIGTERM; the
/// handlers are installed now.
#[cfg(unix)]
fn signalled() -> CliResult<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    Ok(async move {
        tokio::select! {
            _ = int.recv() => {},
            _ = term.recv() => {},
        }
    })
}

#[cfg(not(unix))]
fn signalled() -> CliResult<impl std::future::Future<Output = ()>> {
    Ok(async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    })
}
