use std::path::{Path, PathBuf};

use super::*;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/chat-template")
}

/// Every case of tests/fixtures/chat-template/cases.json
/// (scripts/make_template_fixtures.py) renders to transformers' bytes, or
/// fails with its raise_exception message.
#[test]
fn renders_as_transformers_does() {
    let text = std::fs::read_to_string(fixtures().join("cases.json")).unwrap();
    let cases = json(&text).unwrap();
    let mut n = 0;
    for case in cases.try_iter().unwrap() {
        let field = |k: &str| case.get_attr(k).ok().filter(|v| !v.is_undefined());
        let name = field("name").unwrap().to_string();
        let file = field("template").unwrap().to_string();
        let source = std::fs::read_to_string(fixtures().join(&file)).unwrap();
        let tokens = ["bos_token", "eos_token"]
            .iter()
            .map(|t| (t.to_string(), field(t).unwrap().to_string()))
            .collect();
        let tmpl = ChatTemplate::new(&source, &file)
            .unwrap()
            .with_special_tokens(tokens);
        // (every other field of a case is a template variable, as the
        // script passes it)
        const FIXED: [&str; 9] = [
            "name",
            "template",
            "bos_token",
            "eos_token",
            "messages",
            "tools",
            "add_generation_prompt",
            "expected",
            "error",
        ];
        let kwargs: Value = case
            .try_iter()
            .unwrap()
            .filter(|k| !FIXED.contains(&k.as_str().unwrap()))
            .map(|k| (k.clone(), case.get_item(&k).unwrap()))
            .collect();
        let input = RenderInput {
            messages: field("messages").unwrap(),
            tools: field("tools"),
            add_generation_prompt: field("add_generation_prompt").is_some_and(|v| v.is_true()),
            enable_thinking: None,
            kwargs: Some(kwargs),
        };
        let got = tmpl.render(&input);
        match (field("expected"), field("error")) {
            (Some(want), None) => {
                let got = got.unwrap_or_else(|e| panic!("{name}: {e}"));
                assert_eq!(got, want.as_str().unwrap(), "{name}");
            }
            (None, Some(msg)) => {
                let e = got.expect_err(&name).to_string();
                assert!(e.contains(msg.as_str().unwrap()), "{name}: {e}");
            }
            _ => panic!("{name}: neither expected nor error"),
        }
        n += 1;
    }
    assert!(n >= 20, "{n} cases");
}

fn gemma_source() -> String {
    std::fs::read_to_string(fixtures().join("gemma4.jinja")).unwrap()
}

/// A fresh folder under the test target's temporary directory.
fn folder(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("turbospark-template-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write(dir: &Path, file: &str, text: &str) {
    let path = dir.join(file);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn hi() -> RenderInput {
    RenderInput {
        messages: Value::from(vec![message("user", "Hi")]),
        add_generation_prompt: true,
        ..Default::default()
    }
}

/// chat_template.jinja wins over tokenizer_config.json's, whose special
/// tokens (a string or an added token's content) the render sees.
#[test]
fn loads_the_jinja_file_first_with_the_configs_tokens() {
    let dir = folder("jinja-first");
    write(&dir, "chat_template.jinja", &gemma_source());
    write(
        &dir,
        "tokenizer_config.json",
        r#"{"chat_template": "not this one", "bos_token": "<bos>",
            "eos_token": {"content": "<eos>", "special": true}, "pad_token": null}"#,
    );
    let t = load(&dir, None).unwrap().unwrap();
    assert!(
        t.origin().ends_with("chat_template.jinja"),
        "{}",
        t.origin()
    );
    assert_eq!(t.special_token("bos_token"), Some("<bos>"));
    assert_eq!(t.special_token("eos_token"), Some("<eos>"));
    assert_eq!(t.special_token("pad_token"), None);
    assert_eq!(
        t.render(&hi()).unwrap(),
        "<bos><|turn>user\nHi<turn|>\n<|turn>model\n<|channel>thought\n<channel|>"
    );
}

/// tokenizer_config.json's chat_template: a string, or a list whose
/// `default` is taken unless another is named; named files beside.
#[test]
fn loads_the_configs_templates_by_name() {
    let dir = folder("config");
    write(
        &dir,
        "tokenizer_config.json",
        r#"{"chat_template": [{"name": "default", "template": "D{{ messages[0].content }}"},
                              {"name": "tool_use", "template": "T{{ tools is none }}"}]}"#,
    );
    write(
        &dir,
        "additional_chat_templates/rag.jinja",
        "R{{ documents }}",
    );
    let render = |name: Option<&str>| load(&dir, name).unwrap().unwrap().render(&hi()).unwrap();
    assert_eq!(render(None), "DHi");
    assert_eq!(render(Some("default")), "DHi");
    assert_eq!(render(Some("tool_use")), "TTrue");
    assert_eq!(render(Some("rag")), "RNone");
    let e = load(&dir, Some("nope")).err().unwrap().to_string();
    assert!(
        e.contains("no chat template named \"nope\"")
            && e.contains("tool_use")
            && e.contains("rag"),
        "{e}"
    );
    let e = load(&dir, Some("../x")).err().unwrap().to_string();
    assert!(e.contains("not a template name"), "{e}");

    let plain = folder("config-string");
    write(
        &plain,
        "tokenizer_config.json",
        r#"{"chat_template": "S{{ add_generation_prompt }}"}"#,
    );
    assert_eq!(
        load(&plain, None).unwrap().unwrap().render(&hi()).unwrap(),
        "STrue"
    );
}

/// No template: None, unless one was named; bad files are errors naming them.
#[test]
fn a_missing_or_bad_template_is_said() {
    let dir = folder("none");
    assert!(load(&dir, None).unwrap().is_none());
    let e = load(&dir, Some("tool_use")).err().unwrap().to_string();
    assert!(e.contains("has no chat template"), "{e}");

    write(&dir, "tokenizer_config.json", r#"{"chat_template": 7}"#);
    let e = load(&dir, None).err().unwrap().to_string();
    assert!(e.contains("must be a string or a list"), "{e}");
    write(
        &dir,
        "tokenizer_config.json",
        r#"{"chat_template": [{"name": "x", "template": "y"}]}"#,
    );
    let e = load(&dir, None).err().unwrap().to_string();
    assert!(
        e.contains("without one named \"default\"") && e.contains('x'),
        "{e}"
    );
    write(&dir, "tokenizer_config.json", "{not json");
    let e = load(&dir, None).err().unwrap().to_string();
    assert!(e.contains("tokenizer_config.json"), "{e}");

    std::fs::remove_file(dir.join("tokenizer_config.json")).unwrap();
    write(
        &dir,
        "chat_template.jinja",
        "{% for m in messages %}{{ m.content }",
    );
    let e = load(&dir, None).err().unwrap().to_string();
    assert!(
        e.contains("chat_template.jinja")
            && e.contains("does not compile")
            && e.contains("syntax error"),
        "{e}"
    );
}

/// Render errors name what failed; bad inputs are errors, not panics.
#[test]
fn render_errors_are_said() {
    let t = |src: &str| ChatTemplate::new(src, "t").unwrap();
    let e = t("{{ raise_exception('System role not supported') }}")
        .render(&hi())
        .unwrap_err()
        .to_string();
    assert!(e.contains("System role not supported"), "{e}");
    let e = t("{{ messages[5].content }}")
        .render(&hi())
        .unwrap_err()
        .to_string();
    assert!(e.contains("rendering the chat template"), "{e}");
    let not_a_list = RenderInput {
        messages: Value::from("Hi"),
        ..Default::default()
    };
    let e = t("x").render(&not_a_list).unwrap_err().to_string();
    assert!(e.contains("must be a list"), "{e}");
    let bad_message = RenderInput {
        messages: json(r#"["Hi"]"#).unwrap(),
        ..Default::default()
    };
    let e = t("x").render(&bad_message).unwrap_err().to_string();
    assert!(e.contains("message 0 must be a map"), "{e}");
    let bad_kwargs = RenderInput {
        kwargs: Some(Value::from(3)),
        ..hi()
    };
    let e = t("x").render(&bad_kwargs).unwrap_err().to_string();
    assert!(e.contains("must be a map"), "{e}");
    let e = t("{{ messages | tojson(indent=[1]) }}")
        .render(&hi())
        .unwrap_err()
        .to_string();
    assert!(e.contains("indent must be"), "{e}");
    assert!(json("{").is_err());
}

/// Variables: enable_thinking is undefined unless given, kwargs override
/// it and the special tokens; strftime_now writes today's date.
#[test]
fn variables_reach_the_template() {
    let t = ChatTemplate::new(
        "{{ enable_thinking is defined }}/{{ enable_thinking }}/{{ bos_token }}/{{ x }}",
        "t",
    )
    .unwrap()
    .with_special_tokens(vec![("bos_token".into(), "<bos>".into())]);
    assert_eq!(t.render(&hi()).unwrap(), "False//<bos>/");
    let on = RenderInput {
        enable_thinking: Some(true),
        ..hi()
    };
    assert_eq!(t.render(&on).unwrap(), "True/True/<bos>/");
    let kw = RenderInput {
        enable_thinking: Some(true),
        kwargs: Some(
            json(r#"{"enable_thinking": false, "bos_token": "B", "x": [1, null]}"#).unwrap(),
        ),
        ..hi()
    };
    assert_eq!(t.render(&kw).unwrap(), "True/False/B/[1, None]");

    let date = ChatTemplate::new("{{ strftime_now('%Y-%m-%d') }}", "t")
        .unwrap()
        .render(&hi())
        .unwrap();
    let now = clock::now_local();
    let want = format!("{}-{:02}-{:02}", now.year, now.month, now.day);
    // (a render just before midnight may see the next day)
    assert!(
        date == want || date.len() == want.len(),
        "{date} against {want}"
    );
}
