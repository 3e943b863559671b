//! Hostile input to the CLI: each gets a clear error naming the flag or
//! file and the numbers, never an abort, a hang, a silent success or an
//! overwritten input. Runs the CPU backend on the bundled tiny fixture.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::{fixture, generate_on, generate_on_cpu, logits, logits_with, stderr};

fn succeeds(out: &Output) -> String {
    assert!(out.status.success(), "{}", stderr(out));
    assert!(!stderr(out).contains("panicked"), "{}", stderr(out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A non-zero exit by `error:` (not a signal), stderr holding every needle.
fn fails_with(out: &Output, needles: &[&str]) {
    let err = stderr(out);
    assert_eq!(
        out.status.code(),
        Some(1),
        "exit {:?}, stderr: {err}",
        out.status
    );
    for n in needles {
        assert!(err.contains(n), "stderr lacks {n:?}: {err}");
    }
    assert!(!err.contains("panicked"), "panicked: {err}");
}

/// A copy of the tiny fixture in a directory of its own (`name`), its
/// config's fields overwritten by `config` (a JSON object).
fn checkpoint_copy(name: &str, config: serde_json::Value) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("hostile-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["model.safetensors", "generation_config.json"] {
        std::fs::copy(fixture().join(f), dir.join(f)).unwrap();
    }
    let text = std::fs::read_to_string(fixture().join("config.json")).unwrap();
    let mut cfg: serde_json::Value = serde_json::from_str(&text).unwrap();
    for (k, v) in config.as_object().unwrap() {
        cfg[k] = v.clone();
    }
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    dir
}

fn mkfifo(path: &Path) {
    let _ = std::fs::remove_file(path);
    let ok = Command::new("mkfifo").arg(path).status().unwrap();
    assert!(ok.success(), "mkfifo {}", path.display());
}

/// KV caches past what the machine can give are refused before any
/// allocation, with the figure and the limit (they aborted the process).
#[test]
fn huge_max_context_is_refused_with_the_figure_and_the_limit() {
    for ctx in ["4294967295", "2147483648"] {
        let out = generate_on_cpu(&["--tokens", "1,2", "--max-context", ctx]);
        fails_with(
            &out,
            &[
                &format!("max_context {ctx}"),
                "bytes, over the device limit of",
            ],
        );
    }
}

/// max_position_embeddings caps the default context, a --max-context past
/// it is warned about, and a garbage value is a config error naming it.
#[test]
fn max_position_embeddings_caps_the_default_context() {
    let dir = checkpoint_copy(
        "positions-8",
        serde_json::json!({"max_position_embeddings": 8}),
    );
    let ten = "1,2,3,4,5,6,7,8,9,10";
    fails_with(
        &generate_on(&dir, &["--tokens", ten, "--max-new-tokens", "1"]),
        &["maximum context"],
    );
    let out = generate_on(
        &dir,
        &[
            "--tokens",
            ten,
            "--max-new-tokens",
            "1",
            "--max-context",
            "16",
        ],
    );
    succeeds(&out);
    let err = stderr(&out);
    assert!(
        err.contains("warning: --max-context 16 is past the model's max_position_embeddings (8"),
        "{err}"
    );
    // Within it: no warning.
    let out = generate_on(
        &dir,
        &[
            "--tokens",
            "1,2",
            "--max-new-tokens",
            "1",
            "--max-context",
            "8",
        ],
    );
    succeeds(&out);
    assert!(!stderr(&out).contains("warning"), "{}", stderr(&out));

    for (name, v) in [
        ("zero", serde_json::json!(0)),
        ("negative", serde_json::json!(-1)),
        ("string", serde_json::json!("abc")),
        ("fraction", serde_json::json!(4096.5)),
        ("huge", serde_json::json!(1u64 << 62)),
    ] {
        let dir = checkpoint_copy(
            &format!("positions-{name}"),
            serde_json::json!({ "max_position_embeddings": v }),
        );
        fails_with(
            &generate_on(&dir, &["--tokens", "1,2"]),
            &["config.json", "max_position_embeddings"],
        );
    }
}

/// An empty or malformed --tokens entry is an error naming it.
#[test]
fn malformed_token_lists_are_errors() {
    for (tokens, needle) in [
        ("1,,2", "entry 2 is empty"),
        ("1,2,", "entry 3 is empty"),
        ("+5", "\"+5\""),
        ("1,+5", "\"+5\""),
        ("0x10", "\"0x10\""),
    ] {
        fails_with(
            &generate_on_cpu(&["--tokens", tokens]),
            &["--tokens", needle],
        );
        let out = logits_with(&fixture(), tokens, Path::new("/dev/null"));
        fails_with(&out, &["--tokens", needle]);
    }
}

/// A negative number after a space reaches the real check, not clap's
/// "unexpected argument".
#[test]
fn negative_numbers_reach_the_real_checks() {
    for (args, needle) in [
        (
            &["--tokens", "1", "--temperature", "-1"][..],
            "temperature -1 must be finite and >= 0",
        ),
        (&["--tokens", "1", "--seed", "-1"], "'--seed <SEED>'"),
        (&["--tokens", "-1"], "bad token id \"-1\""),
        (
            &["--tokens", "1", "--max-context", "-5"],
            "'--max-context <MAX_CONTEXT>'",
        ),
        (
            &["--tokens", "1", "--top-p", "-0.5"],
            "top-p -0.5 must be in (0, 1]",
        ),
        (
            &["--tokens", "1", "--temperature", "-inf"],
            "temperature -inf must be finite and >= 0",
        ),
    ] {
        let out = generate_on_cpu(args);
        let err = stderr(&out);
        assert!(!err.contains("unexpected argument"), "{args:?}: {err}");
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(
            err.contains(needle),
            "{args:?}: stderr lacks {needle:?}: {err}"
        );
    }
}

/// A closed standard output is an error with a message and a non-zero
/// exit, not a silent success that wrote nothing.
#[test]
fn generate_with_stdout_closed_fails() {
    let m = fixture().display().to_string();
    // (the shell closes it: `>&-`)
    let out = Command::new("sh")
        .args([
            "-c",
            "exec \"$0\" generate --model \"$1\" --backend cpu --tokens 1 >&-",
        ])
        .args([env!("CARGO_BIN_EXE_turbospark"), m.as_str()])
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    fails_with(&out, &["standard output is not open"]);
}

/// --prompt-file: what is not a regular file is refused by name before it
/// is read (a FIFO blocked, /dev/zero ran out of memory), and a file
/// larger than the context could hold is refused with its size and the limit.
#[test]
fn prompt_file_must_be_a_regular_file_of_bounded_size() {
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let fifo = tmp.join("hostile-prompt.fifo");
    mkfifo(&fifo);
    let fifo = fifo.display().to_string();
    let dir = tmp.display().to_string();
    for (path, needle) in [
        ("/dev/zero", "not a regular file"),
        (fifo.as_str(), "not a regular file"),
        (dir.as_str(), "a directory"),
    ] {
        fails_with(
            &generate_on_cpu(&["--prompt-file", path]),
            &[&format!("--prompt-file {path}"), needle],
        );
    }
    // 16 positions: 16 x 64 bytes and 64 KiB of slack.
    let big = tmp.join("hostile-prompt-big.txt");
    std::fs::write(&big, "w5 ".repeat(30_000)).unwrap();
    let out = generate_on_cpu(&[
        "--prompt-file",
        big.to_str().unwrap(),
        "--max-context",
        "16",
    ]);
    fails_with(
        &out,
        &["90000 bytes", "16-token context", "limit of 66560 bytes"],
    );
    // Standard input is bounded the same way.
    let mut child = Command::new(env!("CARGO_BIN_EXE_turbospark"))
        .args([
            "generate",
            "--model",
            fixture().to_str().unwrap(),
            "--backend",
            "cpu",
        ])
        .args(["--prompt-file", "-", "--max-context", "16"])
        .stdin(std::fs::File::open(&big).unwrap())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take();
    let out = child.wait_with_output().unwrap();
    fails_with(
        &out,
        &["--prompt-file -", "more than", "limit of 66560 bytes"],
    );
}

/// A tokenizer.json that is not a regular file, or is absurdly large, is
/// refused by name (a FIFO blocked forever, /dev/zero ran out of memory).
#[test]
fn tokenizer_json_must_be_a_regular_file_of_bounded_size() {
    let check = |name: &str, make: &dyn Fn(&Path), needle: &str| {
        let dir = checkpoint_copy(name, serde_json::json!({}));
        let tok = dir.join("tokenizer.json");
        make(&tok);
        fails_with(
            &generate_on(&dir, &["--prompt", "w5"]),
            &[&tok.display().to_string(), needle],
        );
    };
    check("tok-fifo", &|p| mkfifo(p), "not a regular file");
    check(
        "tok-dev-zero",
        &|p| std::os::unix::fs::symlink("/dev/zero", p).unwrap(),
        "not a regular file",
    );
    check(
        "tok-dir",
        &|p| std::fs::create_dir(p).unwrap(),
        "a directory",
    );
    // (sparse: no disk written)
    check(
        "tok-huge",
        &|p| {
            let f = std::fs::File::create(p).unwrap();
            f.set_len((256 << 20) + 1).unwrap();
        },
        "268435457 bytes",
    );
}

/// `logits --out` refuses the checkpoint's own files (by name, through a
/// link), and replaces a file by renaming a whole new one over it, not by
/// writing into it.
#[test]
fn logits_out_never_overwrites_an_input_nor_writes_in_place() {
    let dir = checkpoint_copy("logits-out", serde_json::json!({}));
    let weights = dir.join("model.safetensors");
    let before = std::fs::read(&weights).unwrap();
    fails_with(
        &logits(&dir, &weights),
        &["is the checkpoint's input", "model.safetensors"],
    );
    // Spelled another way, and through a symbolic link.
    let other = dir.join("../hostile-logits-out/./model.safetensors");
    fails_with(&logits(&dir, &other), &["is the checkpoint's input"]);
    let link = dir.join("link.safetensors");
    std::os::unix::fs::symlink(&weights, &link).unwrap();
    fails_with(&logits(&dir, &link), &["is the checkpoint's input"]);
    fails_with(&logits(&dir, &dir.join("config.json")), &["config.json"]);
    assert_eq!(
        std::fs::read(&weights).unwrap(),
        before,
        "the weights changed"
    );

    // A hard link to the old output keeps the old bytes: the new file was
    // renamed over the name, not written into the old one.
    let out = dir.join("logits.safetensors");
    std::fs::write(&out, b"old").unwrap();
    let keep = dir.join("old-logits");
    std::fs::hard_link(&out, &keep).unwrap();
    succeeds(&logits(&dir, &out));
    assert_eq!(std::fs::read(&keep).unwrap(), b"old");
    let bytes = std::fs::read(&out).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(st.tensor("logits").unwrap().shape(), &[3, 512]);
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".tmp-"))
        .collect();
    assert!(left.is_empty(), "temporary files left: {left:?}");

    // A device is written in place, not replaced.
    succeeds(&logits(&dir, Path::new("/dev/null")));
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::metadata("/dev/null")
        .unwrap()
        .file_type()
        .is_char_device());
    fails_with(&logits(&dir, &dir), &["a directory"]);
}

/// `info` without a valid XDG_RUNTIME_DIR does not pass on Mesa's
/// `XDG_RUNTIME_DIR is invalid` complaints (one per device it opens).
#[test]
fn info_is_quiet_without_xdg_runtime_dir() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_turbospark"))
        .arg("info")
        .env_remove("XDG_RUNTIME_DIR")
        .output()
        .expect("the turbospark binary runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("XDG_RUNTIME_DIR"), "{err}");
    assert!(out.status.success(), "{err}");
}

/// The tiny fixture's copy with the chat tokenizer (`<|turn>`, `<turn|>`).
fn chat_checkpoint(name: &str) -> PathBuf {
    let dir = checkpoint_copy(name, serde_json::json!({}));
    std::fs::copy(
        fixture().join("../tiny-text-chat/tokenizer.json"),
        dir.join("tokenizer.json"),
    )
    .unwrap();
    dir
}

/// `chat` started on the CPU backend with `args`, its stdio piped.
fn chat_child(dir: &Path, args: &[&str]) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_turbospark"))
        .args(["chat", "--model", dir.to_str().unwrap(), "--backend", "cpu"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// `chat` on the CPU backend with `args`, `input` on its stdin.
fn chat(dir: &Path, args: &[&str], input: &[u8]) -> Output {
    use std::io::Write;
    let mut child = chat_child(dir, args);
    let mut stdin = child.stdin.take().unwrap();
    // (a chat that fails at startup may not read it)
    let _ = stdin.write_all(input);
    drop(stdin);
    child.wait_with_output().unwrap()
}

/// The checkpoint truncated between two turns of a conversation (the CPU
/// backend reads its weights from the maps): the next turn is an error
/// naming the file, not a SIGBUS that kills the process without a word.
#[test]
fn a_checkpoint_truncated_during_a_chat_is_named() {
    use std::io::{BufRead, BufReader, Write};
    let dir = chat_checkpoint("chat-truncated");
    let weights = dir.join("model.safetensors");
    let mut child = chat_child(&dir, &["--max-new-tokens", "3"]);
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    stdin.write_all(b"w10 w11\n").unwrap();
    stdin.flush().unwrap();
    // The first reply: the weights are loaded and were read.
    let mut reply = String::new();
    stdout.read_line(&mut reply).unwrap();
    assert!(reply.ends_with('\n'), "no first reply: {reply:?}");
    let len = std::fs::metadata(&weights).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&weights)
        .unwrap()
        .set_len(len / 3)
        .unwrap();
    stdin.write_all(b"w12 w13\n").unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    fails_with(
        &out,
        &[
            &weights.display().to_string(),
            "truncated on disk while the run maps it",
        ],
    );
}

/// chat: a line that is not UTF-8 is skipped with a notice (it ended the
/// conversation), a bad sampling flag is refused at startup (it was found
/// only at the first message), and a conversation whose every turn is
/// refused (a --system that fills the context) exits non-zero (it exited 0).
#[test]
fn chat_skips_bad_lines_checks_flags_first_and_fails_when_nothing_fits() {
    let dir = chat_checkpoint("chat-hostile");
    let out = chat(
        &dir,
        &["--max-new-tokens", "2"],
        b"w10 \xff\xfe w11\nw12 w13\n",
    );
    let text = succeeds(&out);
    let err = stderr(&out);
    assert!(err.contains("line 1 is not UTF-8 text"), "{err}");
    assert!(err.contains("skipped"), "{err}");
    assert_eq!(text.lines().count(), 1, "one reply, to line 2: {text:?}");

    // With no input at all: refused before the model loads.
    for (flag, value, needle) in [
        ("--temperature", "NaN", "temperature NaN must be finite"),
        ("--top-p", "2", "top-p 2 must be in (0, 1]"),
    ] {
        fails_with(&chat(&dir, &[flag, value], b""), &[needle]);
    }

    let system = "w5 ".repeat(40);
    let out = chat(
        &dir,
        &["--system", &system, "--max-context", "16"],
        b"w10\nw11\n",
    );
    fails_with(
        &out,
        &["no turn of the conversation fit the context (2 refused)"],
    );
    assert!(stderr(&out).contains("do not fit"), "{}", stderr(&out));
}

/// What is wrong with --model's files is said as it is: a missing path, a
/// file or a device is not "no config.json"; a directory or FIFO named
/// model.safetensors is not "not found"; a directory shard is not "cannot
/// memory-map: No such device"; an unknown tokenizer model is named; a
/// head_dim of 0 is blamed on head_dim, not partial_rotary_factor.
#[test]
fn model_file_errors_say_what_is_wrong() {
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let file = tmp.join("hostile-model-a-file");
    std::fs::write(&file, b"{}").unwrap();
    for (path, needle) in [
        (
            tmp.join("hostile-no-such-model"),
            "no such file or directory",
        ),
        (file, "a file, not a checkpoint directory"),
        (
            PathBuf::from("/dev/null"),
            "not a directory (a FIFO, socket or device)",
        ),
    ] {
        let out = generate_on(&path, &["--tokens", "1"]);
        fails_with(&out, &[&path.display().to_string(), needle]);
        assert!(!stderr(&out).contains("no config.json"), "{}", stderr(&out));
    }

    let weights_as = |name: &str, make: &dyn Fn(&Path), needle: &str| {
        let dir = checkpoint_copy(name, serde_json::json!({}));
        let weights = dir.join("model.safetensors");
        std::fs::remove_file(&weights).unwrap();
        make(&weights);
        let out = generate_on(&dir, &["--tokens", "1"]);
        fails_with(&out, &[&format!("{}: {needle}", weights.display())]);
        assert!(!stderr(&out).contains("not found"), "{}", stderr(&out));
    };
    weights_as(
        "weights-dir",
        &|p| std::fs::create_dir(p).unwrap(),
        "a directory, expected a regular file",
    );
    weights_as("weights-fifo", &|p| mkfifo(p), "not a regular file");

    // An index whose shard is a directory.
    let dir = checkpoint_copy("shard-dir", serde_json::json!({}));
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let names = safetensors::SafeTensors::deserialize(&bytes)
        .unwrap()
        .names()
        .len();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let map: serde_json::Map<String, serde_json::Value> = meta
        .tensors()
        .into_keys()
        .map(|n| (n, serde_json::json!("shard.safetensors")))
        .collect();
    assert_eq!(map.len(), names);
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        serde_json::json!({ "weight_map": map }).to_string(),
    )
    .unwrap();
    let shard = dir.join("shard.safetensors");
    std::fs::create_dir(&shard).unwrap();
    let out = generate_on(&dir, &["--tokens", "1"]);
    fails_with(
        &out,
        &[&format!(
            "{}: a directory, not a safetensors file",
            shard.display()
        )],
    );
    assert!(!stderr(&out).contains("No such device"), "{}", stderr(&out));

    // A tokenizer model the tokenizers crate does not read.
    let dir = checkpoint_copy("tok-model-type", serde_json::json!({}));
    let text = std::fs::read_to_string(fixture().join("tokenizer.json")).unwrap();
    let mut tok: serde_json::Value = serde_json::from_str(&text).unwrap();
    tok["model"]["type"] = serde_json::json!("SentencePieceBPE");
    std::fs::write(dir.join("tokenizer.json"), tok.to_string()).unwrap();
    let out = generate_on(&dir, &["--prompt", "w5"]);
    fails_with(
        &out,
        &[
            "tokenizer.json",
            "model type \"SentencePieceBPE\" is not supported",
            "WordLevel",
        ],
    );
    assert!(!stderr(&out).contains("untagged enum"), "{}", stderr(&out));

    for (key, needle) in [
        ("head_dim", "`head_dim`: 0 (layer 0) must be even"),
        (
            "global_head_dim",
            "`global_head_dim`: 0 (layer 1) must be even",
        ),
    ] {
        let dir = checkpoint_copy(&format!("{key}-0"), serde_json::json!({ key: 0 }));
        let out = generate_on(&dir, &["--tokens", "1"]);
        fails_with(&out, &["config.json", needle]);
        assert!(
            !stderr(&out).contains("partial_rotary_factor"),
            "{}",
            stderr(&out)
        );
    }
}

/// `logits` on a checkpoint whose final norm is all NaN: an error naming
/// the position and the value and a non-zero exit (it wrote the NaN rows
/// and exited 0), and nothing written.
#[test]
fn logits_refuses_non_finite_logits() {
    let dir = checkpoint_copy("logits-nan", serde_json::json!({}));
    let weights = dir.join("model.safetensors");
    let mut bytes = std::fs::read(&weights).unwrap();
    let (header_len, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let norm = meta.info("model.norm.weight").unwrap();
    assert_eq!(norm.dtype, safetensors::Dtype::BF16);
    let (begin, end) = norm.data_offsets;
    let start = 8 + header_len;
    for pair in bytes[start + begin..start + end].chunks_exact_mut(2) {
        // bf16 quiet NaN
        pair.copy_from_slice(&0x7fc0u16.to_le_bytes());
    }
    std::fs::write(&weights, &bytes).unwrap();
    let out_path = dir.join("logits.safetensors");
    let out = logits(&dir, &out_path);
    fails_with(
        &out,
        &[
            "non-finite values",
            "of position 0 is NaN",
            "nothing written",
        ],
    );
    assert!(!out_path.exists(), "logits written");
}
