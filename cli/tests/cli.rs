//! The CLI's contract on bad input: a clear message and a non-zero exit,
//! never a panic. Runs the CPU backend on the bundled tiny fixture.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{fixture, generate_on_cpu, logits, logits_with, turbospark};

fn model() -> String {
    fixture().display().to_string()
}

/// Asserts a zero exit (showing stderr otherwise); returns stdout.
fn succeeds(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn fails_with(out: &Output, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected failure, stderr: {err}");
    assert!(err.contains(needle), "stderr lacks {needle:?}: {err}");
    assert!(!err.contains("panicked"), "panicked: {err}");
}

#[test]
fn generate_greedy_on_cpu_matches_the_fixture() {
    let out = generate_on_cpu(&[
        "--max-new-tokens",
        "8",
        "--tokens",
        "429,92,412,358,75,470,508,444,157,469",
    ]);
    // The fixture's tokenizer spells id N as "wN".
    let text = succeeds(&out);
    assert_eq!(text.trim(), "w469 w469 w190 w310 w23 w278 w278 w485");
    assert!(String::from_utf8_lossy(&out.stderr).contains("tok/s"));
}

/// A prompt of several prefill batches on the CPU runs its batches before
/// the last one by one under a progress bar: the same tokens as in one batch.
#[test]
fn a_prompt_of_many_batches_generates_the_same_tokens() {
    let ids = "429,92,412,358,75,470,508,444,157,469";
    let run = |batch: &str| {
        succeeds(&generate_on_cpu(&[
            "--max-new-tokens",
            "8",
            "--prefill-batch",
            batch,
            "--tokens",
            ids,
        ]))
    };
    let text = run("2");
    assert_eq!(text.trim(), "w469 w469 w190 w310 w23 w278 w278 w485");
    assert_eq!(text, run("16"));
}

/// `bench --stream-slots --route-by-trace`: the streamed run routes as the
/// trace says (every token to experts 0 and 1: after the prompt, every
/// decode lookup hits); a trace that does not fit the model is named.
#[test]
fn bench_streams_routed_by_a_trace() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("route-by-trace");
    std::fs::create_dir_all(&dir).unwrap();
    // The tiny synthetic model: 6 experts, top-2, 3 MoE layers.
    let trace = dir.join("trace.txt");
    std::fs::write(&trace, "experts 6\n0,1;0,1;0,1\n").unwrap();
    let json = dir.join("stream.json");
    let run = |trace: &Path| {
        turbospark(&[
            "bench",
            "--backend",
            "cpu",
            "--synthetic",
            "tiny",
            "--stream-slots",
            "3",
            "--route-by-trace",
            trace.to_str().unwrap(),
            "--prompt-tokens",
            "8",
            "--decode-tokens",
            "4",
            "--json",
            json.to_str().unwrap(),
        ])
    };
    succeeds(&run(&trace));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let streamed = v["points"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["expert_slots"] == 3)
        .expect("the 3-slot point");
    assert_eq!(streamed["decode_hit_rate"], 1.0, "{streamed}");
    assert_eq!(streamed["decode_misses_per_token"], 0.0, "{streamed}");
    // (the trace's ids are the host's before each pass: no readback)
    assert_eq!(streamed["decode_host_waits_per_token"], 0.0, "{streamed}");
    assert!(v["host_to_device_gbps"].as_f64().unwrap() > 0.0, "{v}");
    // (the ceiling is the faster of a plain write and the slot path's)
    let (one, slot) = (
        v["one_write_gbps"].as_f64().unwrap(),
        v["slot_path_write_gbps"].as_f64().unwrap(),
    );
    assert!(one > 0.0 && slot > 0.0, "{v}");
    assert_eq!(
        v["host_to_device_gbps"].as_f64().unwrap(),
        one.max(slot),
        "{v}"
    );

    std::fs::write(&trace, "experts 8\n0,1;0,1;0,1\n").unwrap();
    fails_with(&run(&trace), "routing trace: 8 experts, the model has 6");
}

/// `bench --stream-slots --expert-optimism always`: every decode step of
/// the streamed runs is optimistic, and the report counts them, those that
/// stood, the host's waits and the bytes against the copy ceiling.
#[test]
fn bench_streams_optimistically() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("stream-optimism");
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("stream.json");
    let out = turbospark(&[
        "bench",
        "--backend",
        "cpu",
        "--synthetic",
        "tiny",
        "--stream-slots",
        "3,6",
        "--expert-optimism",
        "always",
        "--prompt-tokens",
        "8",
        "--decode-tokens",
        "6",
        "--json",
        json.to_str().unwrap(),
    ]);
    succeeds(&out);
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["expert_optimism"], "always", "{v}");
    for slots in [3, 6] {
        let p = v["points"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["expert_slots"] == slots)
            .unwrap_or_else(|| panic!("the {slots}-slot point: {v}"));
        // (the decode run's passes: its first token's and each step's)
        assert_eq!(p["optimistic_passes"], 6, "{p}");
        let (stood, waits) = (
            p["optimistic_stood"].as_u64().unwrap(),
            p["decode_host_waits_per_token"].as_f64().unwrap(),
        );
        assert!(stood <= 6 && waits >= 0.0, "{p}");
        assert!(p["decode_stream_over_copy_ceiling"].is_number(), "{p}");
    }
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        err.contains("host waits a token") && err.contains("copy ceiling"),
        "{err}"
    );
}

/// `bench --make-trace`: a generated trace of the synthetic model's shape,
/// its parameters and LFU hit rate printed; without --synthetic, named.
#[test]
fn bench_makes_a_trace() {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("made-trace.txt");
    let out = turbospark(&[
        "bench",
        "--make-trace",
        path.to_str().unwrap(),
        "--synthetic",
        "tiny",
        "--trace-tokens",
        "20",
        "--trace-skew",
        "1.5",
        "--trace-reuse",
        "0.25",
    ]);
    let text = succeeds(&out);
    assert!(
        text.contains("20 tokens x 3 layers, top-2 of 6 experts, skew 1.5, reuse 0.25")
            && text.contains("LFU hit rate at 6 slots"),
        "{text}"
    );
    let trace = std::fs::read_to_string(&path).unwrap();
    assert!(trace.starts_with("experts 6\n"), "{trace}");
    assert_eq!(trace.lines().count(), 21);
    fails_with(
        &turbospark(&["bench", "--make-trace", path.to_str().unwrap()]),
        "takes the model's shape from --synthetic",
    );
}

#[test]
fn token_past_vocabulary_is_an_error() {
    let out = generate_on_cpu(&["--tokens", "1,512"]);
    fails_with(&out, "past the vocabulary");
}

#[test]
fn prompt_past_context_is_an_error() {
    let out = generate_on_cpu(&["--tokens", "1,2,3,4,5", "--max-context", "4"]);
    fails_with(&out, "maximum context");
}

#[test]
fn bad_token_list_and_missing_model_are_errors() {
    fails_with(
        &logits_with(&fixture(), "1,x", Path::new("/dev/null")),
        "bad token id",
    );
    fails_with(
        &turbospark(&[
            "generate",
            "--model",
            "/nonexistent",
            "--backend",
            "cpu",
            "--tokens",
            "1",
        ]),
        "/nonexistent",
    );
}

#[test]
fn logits_writes_one_row_per_token() {
    let dir = std::env::temp_dir().join(format!("turbospark-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("logits.safetensors");
    let out = logits(&fixture(), &path);
    succeeds(&out);
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor("logits").unwrap();
    assert_eq!(t.dtype(), safetensors::Dtype::F32);
    assert_eq!(t.shape(), &[3, 512]);
    std::fs::remove_dir_all(&dir).ok();
}

/// A bad synthetic model or layer cut fails before any case runs, naming it.
#[test]
fn bench_synthetic_errors_name_the_argument() {
    let bench = |extra: &[&str]| {
        let mut a = vec!["bench", "--backend", "cpu", "--quick", "--filter", "none"];
        a.extend_from_slice(extra);
        turbospark(&a)
    };
    fails_with(
        &bench(&["--synthetic", "nosuch"]),
        "unknown synthetic model \"nosuch\"",
    );
    fails_with(
        &bench(&["--synthetic", "tiny", "--layers", "9"]),
        "--layers 9: tiny has 3 decoder layers",
    );
    fails_with(
        &bench(&["--synthetic", "tiny", "--layers", "0"]),
        "--layers 0",
    );
    fails_with(&bench(&["--layers", "2"]), "pass --synthetic too");
}

/// A prompt read from a file gives what the same text on the command line
/// gives; a file that cannot be read is named in the error.
#[test]
fn prompt_file_reads_the_prompt() {
    let text = "w429 w92 w412 w358 w75";
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("prompt.txt");
    std::fs::write(&path, text).unwrap();
    let run = |input: [&str; 2]| {
        let out = generate_on_cpu(&["--max-new-tokens", "6", input[0], input[1]]);
        succeeds(&out)
    };
    let from_file = run(["--prompt-file", path.to_str().unwrap()]);
    assert_eq!(from_file, run(["--prompt", text]));
    assert!(!from_file.trim().is_empty());
    let missing = generate_on_cpu(&["--prompt-file", "/no/such/prompt.txt"]);
    fails_with(&missing, "--prompt-file /no/such/prompt.txt");
}

/// `--chat` and `chat` need a tokenizer with Gemma 4's turn tokens: the
/// fixture's word-level one has none, which they say before loading.
#[test]
fn chat_without_turn_tokens_is_an_error() {
    let out = generate_on_cpu(&["--chat", "--prompt", "w5"]);
    fails_with(&out, "not a Gemma 4 chat tokenizer");
    let m = model();
    let out = turbospark(&["chat", "--model", &m, "--backend", "cpu"]);
    fails_with(&out, "not a Gemma 4 chat tokenizer");
}

/// `--stop` ends generation once the text holds the string (printed with
/// it); it needs text, so a tokenizer, and a non-empty string.
#[test]
fn stop_strings_end_generation() {
    let prompt = "429,92,412,358,75,470,508,444,157,469";
    let out = generate_on_cpu(&[
        "--max-new-tokens",
        "8",
        "--tokens",
        prompt,
        "--stop",
        "w190",
    ]);
    // (the whole run: "w469 w469 w190 w310 w23 w278 w278 w485")
    assert_eq!(succeeds(&out).trim(), "w469 w469 w190");
    let out = generate_on_cpu(&["--tokens", prompt, "--stop", ""]);
    fails_with(&out, "--stop needs a non-empty string");
}

/// The tiny fixture with Gemma 4's turn tokens in its tokenizer
/// (tests/fixtures/tiny-text-chat, scripts/make_chat_tokenizer.py), in a
/// directory of its own.
fn chat_fixture() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("chat-fixture");
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture().join(f), dir.join(f)).unwrap();
    }
    let chat = fixture().join("../tiny-text-chat/tokenizer.json");
    std::fs::copy(chat, dir.join("tokenizer.json")).unwrap();
    dir
}

/// `turbospark chat` end to end: two turns on stdin, a reply a line on
/// stdout; `generate --chat` on the same checkpoint gives the first reply.
#[test]
fn chat_converses_on_stdin() {
    use std::io::Write;
    let dir = chat_fixture();
    let m = dir.display().to_string();
    // (the same model and settings for `chat` and `generate --chat`)
    let run = ["--model", &m, "--backend", "cpu", "--max-new-tokens", "4"];
    let mut child = Command::new(env!("CARGO_BIN_EXE_turbospark"))
        .arg("chat")
        .args(run)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"w10 w11\nw12\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("type a message"), "{err}");
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text:?}");
    assert!(lines.iter().all(|l| l.starts_with('w')), "{text:?}");
    let one = turbospark(&[&["generate"][..], &run, &["--chat", "--prompt", "w10 w11"]].concat());
    assert_eq!(succeeds(&one).trim(), lines[0]);
}

/// `generate --chat` renders the checkpoint's chat_template.jinja with
/// tokenizer_config.json's tokens: a template writing the fixed turns after
/// a BOS gives what the fixed turns give after that token; one that does not
/// compile is an error naming it, before the weights load.
#[test]
fn generate_chat_renders_the_checkpoints_template() {
    // (a directory of its own: tests run at once, and chat_fixture's is shared)
    let templated = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("chat-fixture-template");
    std::fs::create_dir_all(&templated).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture().join(f), templated.join(f)).unwrap();
    }
    let chat = fixture().join("../tiny-text-chat/tokenizer.json");
    std::fs::copy(chat, templated.join("tokenizer.json")).unwrap();
    let _ = std::fs::remove_file(templated.join("chat_template.jinja"));
    let _ = std::fs::remove_file(templated.join("tokenizer_config.json"));
    let t = templated.display().to_string();
    let run_t = ["--model", &t, "--backend", "cpu", "--max-new-tokens", "4"];
    let fixed = turbospark(
        &[
            &["generate"][..],
            &run_t,
            &["--chat", "--prompt", "w10 w11"],
        ]
        .concat(),
    );
    let fixed = succeeds(&fixed).trim().to_string();
    std::fs::write(
        templated.join("chat_template.jinja"),
        "{{ bos_token }}{% for m in messages %}<|turn>{{ m.role }}\n{{ m.content }}<turn|>\n{% endfor %}\
         {% if add_generation_prompt %}<|turn>model\n{% endif %}",
    )
    .unwrap();
    // (an empty BOS: the tiny tokenizer adds none to the fixed turns either)
    std::fs::write(
        templated.join("tokenizer_config.json"),
        r#"{"bos_token": ""}"#,
    )
    .unwrap();
    let same = turbospark(
        &[
            &["generate"][..],
            &run_t,
            &["--chat", "--prompt", "w10 w11"],
        ]
        .concat(),
    );
    assert_eq!(succeeds(&same).trim(), fixed);

    std::fs::write(
        templated.join("chat_template.jinja"),
        "{% for m in messages %}",
    )
    .unwrap();
    let out = turbospark(
        &[
            &["generate"][..],
            &run_t,
            &["--chat", "--prompt", "w10 w11"],
        ]
        .concat(),
    );
    fails_with(
        &out,
        "chat_template.jinja: the chat template does not compile",
    );
    std::fs::remove_file(templated.join("chat_template.jinja")).unwrap();
    std::fs::write(
        templated.join("tokenizer_config.json"),
        r#"{"chat_template": "{{ raise_exception('no system turns here') }}"}"#,
    )
    .unwrap();
    let out = turbospark(&[&["generate"][..], &run_t, &["--chat", "--prompt", "w10"]].concat());
    fails_with(&out, "no system turns here");
}

/// `info --model` on a quantized checkpoint: the bytes a token reads as
/// stored (not zero for a format with no per-element size) and the Macs
/// whose GPU holds the run.
#[test]
fn info_sizes_a_quantized_checkpoint_for_macs() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tiny-text-q4");
    let out = turbospark(&["info", "--model", &dir.display().to_string()]);
    let text = succeeds(&out);
    let line = text
        .lines()
        .find(|l| l.contains("bytes read per decoded token"))
        .expect("a bytes-per-token line");
    assert!(line.contains("q4g64") && line.contains("KiB"), "{line}");
    assert!(
        text.contains("Macs whose GPU holds it")
            && text.contains("16 GB, 24 GB, 36 GB, 48 GB, 64 GB"),
        "{text}"
    );
    // With streamed experts: the full-layer stacks a prefill past the slots
    // holds, a layer's experts; none where every expert has a slot.
    let m = dir.display().to_string();
    let text = succeeds(&turbospark(&["info", "--model", &m, "--expert-slots", "2"]));
    let line = text
        .lines()
        .find(|l| l.contains("also holds a layer's 8 experts"))
        .unwrap_or_else(|| panic!("no full-layer line: {text}"));
    assert!(line.contains("token-waves holds none"), "{line}");
    // (--expert-store host: every layer's experts, twice one layer's here)
    let layer = line.split('(').nth(1).and_then(|t| t.split(')').next());
    let store = text
        .lines()
        .find(|l| l.contains("--expert-store host also holds"))
        .unwrap_or_else(|| panic!("no host store line: {text}"));
    assert_eq!(layer, Some("54.00 KiB"), "{line}");
    assert!(store.contains("108.00 KiB"), "{store}");
    let all = succeeds(&turbospark(&["info", "--model", &m, "--expert-slots", "8"]));
    assert!(!all.contains("also holds"), "every expert a slot: {all}");
    let out = turbospark(&[
        "generate",
        "--model",
        &m,
        "--expert-slots",
        "2",
        "--expert-store",
        "disk",
    ]);
    fails_with(&out, "mapping or host");
}

/// `turbospark` with no arguments runs the bundled model from inside the
/// binary (an installed or copied binary has no source tree to read it
/// from), from any directory, and leaves no unpacked copy behind.
#[test]
fn the_main_job_runs_the_built_in_model_from_anywhere() {
    let cwd = std::env::temp_dir().join(format!("turbospark-cwd-{}", std::process::id()));
    std::fs::create_dir_all(&cwd).unwrap();
    let tmp = cwd.join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_turbospark"))
        .current_dir(&cwd)
        // (its unpacked copy goes to TMPDIR: here, a directory to look in)
        .env("TMPDIR", &tmp)
        // (a valid runtime directory of the test's: without one the CLI
        // makes its private one in TMPDIR, which is not what is counted)
        .env("XDG_RUNTIME_DIR", &cwd)
        .env("WGPU_BACKEND", "no-such-backend")
        .output()
        .expect("the turbospark binary runs");
    let text = succeeds(&out);
    assert!(text.contains("built in") && text.contains("ok:"), "{text}");
    assert!(
        !text.contains(env!("CARGO_MANIFEST_DIR")),
        "no source-tree path: {text}"
    );
    let left: Vec<_> = std::fs::read_dir(&tmp).unwrap().collect();
    assert!(left.is_empty(), "the unpacked model is removed: {left:?}");
    let _ = std::fs::remove_dir_all(&cwd);
}

/// `--draft-model`: the same greedy tokens as without it, the drafts'
/// counters under --stats; a drafter for another model, or --draft-tokens
/// without one, is refused by name.
#[test]
fn generate_with_a_drafter_gives_the_same_tokens() {
    let root = fixture().parent().unwrap().to_path_buf();
    let drafter = root.join("tiny-text-assistant").display().to_string();
    let out = generate_on_cpu(&[
        "--max-new-tokens",
        "8",
        "--draft-model",
        &drafter,
        "--draft-tokens",
        "3",
        "--stats",
        "--tokens",
        "429,92,412,358,75,470,508,444,157,469",
    ]);
    let text = succeeds(&out);
    assert_eq!(text.trim(), "w469 w469 w190 w310 w23 w278 w278 w485");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("drafts accepted"), "{err}");
    let out = generate_on_cpu(&["--draft-model", &model(), "--tokens", "5,6"]);
    fails_with(&out, "gemma4_assistant");
    let out = generate_on_cpu(&["--draft-tokens", "2", "--tokens", "5,6"]);
    fails_with(&out, "--draft-model");
}

/// `bench --speculative` on the tiny synthetic model: verification
/// against a decode step, and decode at each forced acceptance rate, every
/// token plain decode's (the CPU reference's m-row products add in the
/// one-row order).
#[test]
fn bench_speculative_runs_on_the_tiny_model() {
    let out = turbospark(&[
        "bench",
        "--synthetic",
        "tiny",
        "--speculative",
        "--backend",
        "cpu",
        "--prompt-tokens",
        "8",
        "--decode-tokens",
        "24",
        "--draft-layers",
        "2",
        "--draft-hidden",
        "32",
    ]);
    succeeds(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    for want in ["verify 5 tokens", "forced rate 0.5", "forced rate 0.9"] {
        assert!(err.contains(want), "{want}: {err}");
    }
    let same = "the first 24 of 24 tokens as plain decode's";
    assert_eq!(err.matches(same).count(), 3, "{err}");
    let settled = "proposals were the verification's own tokens after 1 run(s)";
    assert_eq!(err.matches(settled).count(), 3, "{err}");
    assert!(err.contains("first token: prompt whole -> "), "{err}");
}
