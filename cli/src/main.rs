//! The turbospark command line.

mod bench;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "turbospark", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Per-op timings at Gemma 4 26B-A4B's shapes, per backend, against the
    /// bandwidth ceiling measured in the same run.
    Bench(bench::Args),
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Bench(a) => bench::main(a),
    }
}
