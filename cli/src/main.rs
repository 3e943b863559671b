//! `turbospark`: the command line. A thin dispatcher: each subcommand lives
//! in its own module (`cli/src/<cmd>.rs`) with its clap arguments and `run`.
//! With no arguments it runs the main job on the bundled default checkpoint.

mod bench;
mod chat;
mod common;
mod default_job;
mod generate;
mod info;
mod kernels;
mod logits;
mod mapped;
mod quantize;
mod serve;
mod stream;

mod turns;

use clap::{Parser, Subcommand};

/// Mixture-of-Experts inference (Gemma 4) on any GPU through wgpu, checked
/// against a CPU reference.
#[derive(Parser)]
#[command(name = "turbospark", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// GPU adapters, their features and limits; with --model, what a run needs.
    Info(info::Args),
    /// Generate text (or token ids) from a prompt.
    Generate(generate::Args),
    /// A conversation with a Gemma 4 chat model on stdin, each reply
    /// streamed as it is generated.
    Chat(chat::Args),
    /// Teacher-forced logits of a token sequence, written to a safetensors file.
    Logits(logits::Args),
    /// Per-op timings at Gemma 4 26B-A4B's shapes, per backend, against the
    /// bandwidth ceiling measured in the same run.
    Bench(bench::Args),
    /// Quantize a Hugging Face checkpoint to MLX's affine format, tensor for
    /// tensor as mlx-lm's convert writes it.
    Quantize(quantize::Args),
    /// Write each WGSL module as the wgpu backend composes it, with a
    /// manifest of entry points, features and override sets.
    Kernels(kernels::Args),
    /// An OpenAI-compatible HTTP server: chat and text completions
    /// (streamed or whole), models, tokenize and detokenize.
    Serve(serve::Args),
}

/// Mesa's drivers (lavapipe among them) print `XDG_RUNTIME_DIR is invalid`
/// on every device they open when it is unset or not a directory: point it,
/// for this process only, at a private directory of its own, before any
/// thread or device exists.
fn quiet_xdg_runtime_dir() {
    let valid =
        std::env::var_os("XDG_RUNTIME_DIR").is_some_and(|d| std::path::Path::new(&d).is_dir());
    if valid {
        return;
    }
    // (one per user, reused by every run)
    let user = std::env::var("USER").unwrap_or_else(|_| "user".into());
    let dir = std::env::temp_dir().join(format!("turbospark-xdg-{user}"));
    #[cfg(unix)]
    let made = {
        use std::os::unix::fs::DirBuilderExt;
        dir.is_dir() || std::fs::DirBuilder::new().mode(0o700).create(&dir).is_ok()
    };
    #[cfg(not(unix))]
    let made = dir.is_dir() || std::fs::create_dir(&dir).is_ok();
    if made {
        // (single-threaded here: nothing else reads the environment yet)
        std::env::set_var("XDG_RUNTIME_DIR", &dir);
    }
}

fn main() {
    quiet_xdg_runtime_dir();
    mapped::install_fault_handler();
    let cli = Cli::parse();
    let result = match cli.command {
        None => default_job::run(),
        Some(Command::Info(a)) => info::run(a),
        Some(Command::Generate(a)) => generate::run(a),
        Some(Command::Chat(a)) => chat::run(a),
        Some(Command::Logits(a)) => logits::run(a),
        Some(Command::Quantize(a)) => quantize::run(a),
        Some(Command::Kernels(a)) => kernels::run(a),
        Some(Command::Serve(a)) => serve::run(a),
        Some(Command::Bench(a)) => {
            let code = bench::main(a);
            if code != std::process::ExitCode::SUCCESS {
                std::process::exit(1);
            }
            Ok(())
        }
    };
    if let Err(e) = result {
        common::print_error_chain(e.as_ref());
        std::process::exit(1);
    }
}
