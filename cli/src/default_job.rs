//! `turbospark` with no arguments: the main job on the bundled default
//! checkpoint (`tests/fixtures/tiny-text`, a tiny Gemma 4 MoE with
//! transformers' expected output, about 590 KB, inside the binary so that an
//! installed or copied binary runs it too). Generates on the best wgpu
//! adapter (the CPU reference alone, said out loud, when there is none),
//! checks the tokens against the CPU reference and the fixture, prints
//! throughput.

use std::path::{Path, PathBuf};

use turbospark::model::{GenerateOptions, Generation, ModelOptions, OneSequence, Sampling};
use turbospark::{ComputeBackend, Error};
use turbospark_cpu::CpuBackend;

use crate::common::{open_checkpoint, open_wgpu, CliResult};

/// The bundled checkpoint's files, as built into the binary.
const BUNDLED: &[(&str, &[u8])] = &[
    (
        "config.json",
        include_bytes!("../../tests/fixtures/tiny-text/config.json"),
    ),
    (
        "generation_config.json",
        include_bytes!("../../tests/fixtures/tiny-text/generation_config.json"),
    ),
    (
        "expected.json",
        include_bytes!("../../tests/fixtures/tiny-text/expected.json"),
    ),
    (
        "tokenizer.json",
        include_bytes!("../../tests/fixtures/tiny-text/tokenizer.json"),
    ),
    (
        "model.safetensors",
        include_bytes!("../../tests/fixtures/tiny-text/model.safetensors"),
    ),
];

/// The bundled checkpoint written out to a directory of its own (the
/// loader memory-maps files), removed when dropped.
struct Unpacked(PathBuf);

impl Unpacked {
    fn new() -> CliResult<Unpacked> {
        let dir = std::env::temp_dir().join(format!(
            "turbospark-default-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        ));
        let write =
            |e: std::io::Error| format!("unpacking the bundled model into {}: {e}", dir.display());
        std::fs::create_dir(&dir).map_err(write)?;
        let u = Unpacked(dir.clone());
        for (name, bytes) in BUNDLED {
            std::fs::write(dir.join(name), bytes).map_err(write)?;
        }
        Ok(u)
    }
}

impl Drop for Unpacked {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The fixture's prompt and expected continuation (`expected.json`).
fn expected(dir: &Path) -> CliResult<(Vec<u32>, Vec<u32>)> {
    let path = dir.join("expected.json");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let j: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let bad = || format!("{}: needs prompt_len and tokens", path.display());
    let p = j["prompt_len"].as_u64().ok_or_else(bad)? as usize;
    let tokens: Vec<u32> = j["tokens"]
        .as_array()
        .ok_or_else(bad)?
        .iter()
        .map(|t| t.as_u64().and_then(|v| u32::try_from(v).ok()))
        .collect::<Option<_>>()
        .ok_or_else(bad)?;
    if p == 0 || p > tokens.len() {
        return Err(bad().into());
    }
    Ok((tokens[..p].to_vec(), tokens[p..].to_vec()))
}

fn generate_on<B: ComputeBackend>(
    backend: B,
    dir: &Path,
    prompt: &[u32],
    n: usize,
) -> CliResult<Generation> {
    let ck = open_checkpoint(dir)?;
    let mut model = OneSequence::load(
        backend,
        &ck,
        ModelOptions {
            max_context: 256,
            ..Default::default()
        },
    )?;
    let opts = GenerateOptions {
        max_new_tokens: n,
        sampling: Sampling::Greedy,
        // A fixed length: compared (or timed) token for token.
        stop_at_eos: false,
    };
    // The first run compiles the GPU pipelines; time the second.
    model.generate(prompt, &opts)?;
    model.reset();
    Ok(model.generate(prompt, &opts)?)
}

fn report(what: &str, g: &Generation) {
    println!(
        "{what}: {:?}\n  prefill {:.1} tok/s, decode {:.1} tok/s",
        g.tokens, g.prefill_tok_s, g.decode_tok_s
    );
}

pub fn run() -> CliResult {
    let unpacked = Unpacked::new()?;
    let dir = unpacked.0.clone();
    println!(
        "turbospark: the bundled tiny Gemma 4 (tests/fixtures/tiny-text, built in) \
         (see `turbospark --help` for generate, chat, logits, info, quantize, bench)"
    );
    let (prompt, want) = expected(&dir)?;
    let n = want.len();
    println!("prompt {prompt:?}, generating {n} tokens greedily");

    let cpu = generate_on(CpuBackend::new(), &dir, &prompt, n)?;
    report("cpu reference", &cpu);
    if cpu.tokens != want {
        return Err(format!(
            "CPU reference {:?} differs from transformers' {want:?}",
            cpu.tokens
        )
        .into());
    }

    match open_wgpu(None) {
        Ok(gpu) => {
            let name = format!("wgpu {} ({})", gpu.info().device_name, gpu.info().api);
            let g = generate_on(gpu, &dir, &prompt, n).map_err(|e| {
                let unsupported = e
                    .downcast_ref::<Error>()
                    .is_some_and(|e| matches!(e, Error::Unsupported { .. }));
                if unsupported {
                    format!("{name} cannot run the model yet: {e}").into()
                } else {
                    e
                }
            })?;
            report(&name, &g);
            if g.tokens != cpu.tokens {
                return Err(format!(
                    "{name} generated {:?}, the CPU reference {:?}",
                    g.tokens, cpu.tokens
                )
                .into());
            }
            println!("ok: {name} matches the CPU reference and transformers token for token");
        }
        Err(e) => {
            println!("no GPU adapter ({e}); ran on the CPU reference only");
            println!("ok: the CPU reference matches transformers token for token");
        }
    }
    Ok(())
}
