//! The crate API in one page: open a Hugging Face checkpoint, load it on
//! the best GPU (the CPU reference where there is none), and stream a
//! greedy continuation as it is generated.
//!
//! `cargo run --release --example generate -- [DIR] [--tokens 2,10,11] [--kv-cache-f16]`
//! (DIR defaults to the bundled tiny Gemma 4, `tests/fixtures/tiny-text`;
//! the `turbospark` CLI adds a tokenizer, sampling flags and chat turns.)

use std::io::Write;
use std::ops::ControlFlow;
use std::path::PathBuf;

use turbospark::model::{Checkpoint, GenerateOptions, Generation, Model, ModelOptions};
use turbospark::{ComputeBackend, DType};
use turbospark_cpu::CpuBackend;
use turbospark_wgpu::{WgpuBackend, WgpuOptions};

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dir = args
        .iter()
        .find(|a| !a.starts_with("--") && !a.contains(','))
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-text")
        });
    let prompt: Vec<u32> = match args.iter().position(|a| a == "--tokens") {
        Some(i) => args
            .get(i + 1)
            .ok_or("--tokens needs a list of ids")?
            .split(',')
            .map(|t| t.trim().parse())
            .collect::<Result<_, _>>()?,
        None => vec![2, 10, 11, 12],
    };
    let opts = ModelOptions {
        max_context: 256,
        // f16 KV caches: half their memory (needs the shader-f16 feature on a GPU)
        kv_cache: if args.iter().any(|a| a == "--kv-cache-f16") {
            DType::F16
        } else {
            DType::F32
        },
        ..Default::default()
    };
    let checkpoint = Checkpoint::open(&dir)?;
    let g = match WgpuBackend::new(&WgpuOptions::default()) {
        Ok(gpu) => stream(Model::load(gpu, &checkpoint, opts)?, &prompt)?,
        Err(e) => {
            eprintln!("no GPU ({e}): the CPU reference runs it");
            stream(Model::load(CpuBackend::new(), &checkpoint, opts)?, &prompt)?
        }
    };
    eprintln!(
        "{} new tokens; prefill {:.1} tok/s, decode {:.1} tok/s",
        g.tokens.len(),
        g.prefill_tok_s,
        g.decode_tok_s
    );
    Ok(())
}

/// Generate 16 greedy tokens after `prompt`, printing each id as it comes
/// (the model is written once against the backend trait: any backend).
fn stream<B: ComputeBackend>(model: Model<B>, prompt: &[u32]) -> turbospark::Result<Generation> {
    eprintln!("on {}", model.backend().info().device_name);
    let opts = GenerateOptions {
        max_new_tokens: 16,
        ..Default::default()
    };
    // The model is shared; the conversation's caches and position are the
    // sequence's (a model serves any number of them).
    let mut seq = model.new_sequence()?;
    let g = model.generate_streaming(&mut seq, prompt, &opts, |id| {
        print!("{id} ");
        let _ = std::io::stdout().flush();
        ControlFlow::Continue(())
    })?;
    println!();
    Ok(g)
}
