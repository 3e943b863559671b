use super::*;

fn args(call: &ToolCall) -> serde_json::Value {
    serde_json::from_str(&call.arguments)
        .unwrap_or_else(|e| panic!("{}: not JSON ({e})", call.arguments))
}

/// `text` fed in pieces of `n` characters: the deltas, which must add up
/// to parse_reply's reply.
fn streamed(text: &str, n: usize) -> Vec<Delta> {
    let chars: Vec<char> = text.chars().collect();
    let mut p = ReplyParser::new();
    let mut deltas = Vec::new();
    for piece in chars.chunks(n) {
        deltas.extend(p.push(&piece.iter().collect::<String>()));
    }
    deltas.extend(p.finish());
    let mut reply = Reply::default();
    for d in deltas.clone() {
        reply.apply(d);
    }
    assert_eq!(reply, parse_reply(text), "{text:?} in pieces of {n}");
    deltas
}

const MARKERS: [&str; 7] = [
    CHANNEL_OPEN,
    CHANNEL_CLOSE,
    TOOL_CALL_OPEN,
    TOOL_CALL_CLOSE,
    QUOTE,
    TURN_END,
    TOOL_RESPONSE_OPEN,
];

#[test]
fn plain_text_is_content() {
    let r = parse_reply("Hello, world. 2 < 3 and 4 > 1.");
    assert_eq!(r.content, "Hello, world. 2 < 3 and 4 > 1.");
    assert_eq!(r.reasoning_content, "");
    assert!(r.tool_calls.is_empty());
}

#[test]
fn thinking_is_reasoning() {
    let r = parse_reply("<|channel>thought\nThe user greets.\nGreet back.<channel|>Hello!");
    assert_eq!(r.reasoning_content, "The user greets.\nGreet back.");
    assert_eq!(r.content, "Hello!");
    // (a channel without the name, and one cut short)
    assert_eq!(
        parse_reply("<|channel>plan<channel|>x").reasoning_content,
        "plan"
    );
    let cut = parse_reply("<|channel>thought\nstill thinking");
    assert_eq!(
        (cut.reasoning_content.as_str(), cut.content.as_str()),
        ("still thinking", "")
    );
    assert_eq!(parse_reply("<|channel>thou").reasoning_content, "");
}

/// Every kind of value, with markup and separators inside quoted strings.
#[test]
fn tool_calls_become_json_arguments() {
    let text = "<|tool_call>call:get_weather{city:<|\"|>Zürich, CH {x}<|\"|>,days:3,\
                metric:true,off:false,note:null,py:None,t:True,ratio:-2.5e-3,\
                where:{lat:47.37,lon:-8.5,<|\"|>quoted key<|\"|>:[]},\
                tags:[<|\"|>a<|\"|>,<|\"|>b}<tool_call|><|\"|>,1,[2,{}]],\
                json:\"say \\\"hi\\\"\",word: plain words ,empty:{}}<tool_call|>";
    let r = parse_reply(text);
    assert_eq!(r.content, "");
    assert_eq!(r.tool_calls.len(), 1);
    assert_eq!(r.tool_calls[0].name, "get_weather");
    assert_eq!(
        args(&r.tool_calls[0]),
        serde_json::json!({
            "city": "Zürich, CH {x}", "days": 3, "metric": true, "off": false,
            "note": null, "py": null, "t": true, "ratio": -2.5e-3,
            "where": {"lat": 47.37, "lon": -8.5, "quoted key": []},
            "tags": ["a", "b}<tool_call|>", 1, [2, {}]],
            "json": "say \"hi\"", "word": "plain words", "empty": {}
        })
    );
    // (the model's key order kept)
    assert!(
        r.tool_calls[0].arguments.starts_with("{\"city\":"),
        "{}",
        r.tool_calls[0].arguments
    );
}

/// Calls with text between them; the reply ends where the model waits for
/// the responses (or ends its turn), what follows ignored.
#[test]
fn several_calls_and_the_end_of_the_reply() {
    let text = "<|channel>thought\nTwo lookups.<channel|>Checking.\
                <|tool_call>call:a{x:1}<tool_call|> and <|tool_call>call:b.v2{}<tool_call|>\
                <|tool_response>response:a{value:1}<tool_response|>ignored";
    let r = parse_reply(text);
    assert_eq!(r.reasoning_content, "Two lookups.");
    assert_eq!(r.content, "Checking. and ");
    let names: Vec<&str> = r.tool_calls.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["a", "b.v2"]);
    assert_eq!(r.tool_calls[1].arguments, "{}");
    assert_eq!(
        parse_reply("Done.<turn|>\n<|turn>user\nmore").content,
        "Done."
    );
    let mut p = ReplyParser::new();
    p.push("Done.<tu");
    assert!(!p.ended());
    p.push("rn|>");
    assert!(p.ended());
    assert!(p.push("more").is_empty());
}

/// Malformed output is content, as written, never a panic.
#[test]
fn malformed_calls_are_content() {
    for text in [
        "<|tool_call>call:f{a:1",                              // never closed
        "<|tool_call>call:f{a:<|\"|>open string}<tool_call|>", // quote never closed
        "<|tool_call>f{a:1}<tool_call|>",                      // no call:
        "<|tool_call>call:{a:1}<tool_call|>",                  // no name
        "<|tool_call>call:bad name{a:1}<tool_call|>",
        "<|tool_call>call:f{a:1,}<tool_call|>",
        "<|tool_call>call:f{a:1}trailing<tool_call|>",
        "<|tool_call>call:f{a 1}<tool_call|>",
        "<|tool_call>call:f[1]x<tool_call|>",
        "<|tool_call>call:f{a:}<tool_call|>",
        "<|tool_call>call:f{:1}<tool_call|>",
        "<|tool_call>call:f{a:\"unterminated}<tool_call|>",
    ] {
        let r = parse_reply(text);
        assert!(r.tool_calls.is_empty(), "{text}: {r:?}");
        assert_eq!(r.content, text, "{text}");
        streamed(text, 1);
    }
    let deep = format!(
        "<|tool_call>call:f{{a:{}1{}}}<tool_call|>",
        "[".repeat(200),
        "]".repeat(200)
    );
    assert!(parse_reply(&deep).tool_calls.is_empty());
    assert_eq!(parse_reply(&deep).content, deep);
    // (a turn that ends inside a call: the call as written, then the end)
    let r = parse_reply("ok <|tool_call>call:f{a:1<turn|>more");
    assert_eq!(
        (r.content.as_str(), r.tool_calls.len()),
        ("ok <|tool_call>call:f{a:1", 0)
    );
}

/// Streamed one character (or a few) at a time: the same reply, and no
/// marker, nor the start of one, ever given out as content or reasoning.
#[test]
fn streaming_holds_markers_back() {
    let texts = [
        "Hello <|tool_call>call:f{a:<|\"|>x<|\"|>}<tool_call|> bye<turn|>",
        "<|channel>thought\nhmm <|chan<channel|>answer <channel| not a close",
        "a < b <| c <|tool <|x",
        "Zürich 🙂 <|channel>thought\n日本<channel|>語<|tool_response>",
        "<|tool_call>call:f{a:1}<tool_call|><|tool_call>call:g{b:[1,2]}<tool_call|>",
    ];
    for text in texts {
        for n in [1, 2, 3, 5, 1000] {
            for d in streamed(text, n) {
                if let Delta::Content(s) | Delta::Reasoning(s) = &d {
                    for m in MARKERS {
                        assert!(!s.contains(m), "{text:?}/{n}: {d:?} holds {m}");
                    }
                }
            }
        }
    }
    // held back until it cannot be a marker, then let out whole
    let mut p = ReplyParser::new();
    assert_eq!(p.push("a <|tool"), [Delta::Content("a ".into())]);
    assert_eq!(p.push("s"), [Delta::Content("<|tools".into())]);
    assert_eq!(p.push(" <"), [Delta::Content(" ".into())]);
    assert_eq!(p.finish(), [Delta::Content("<".into())]);
    // a call is given out when it closes: its start, then its arguments
    let mut p = ReplyParser::new();
    assert!(p.push("<|tool_call>call:f{a:").is_empty());
    assert_eq!(
        p.push("1}<tool_call|>"),
        [
            Delta::ToolCallStart {
                index: 0,
                name: "f".into()
            },
            Delta::ToolCallArguments {
                index: 0,
                arguments: "{\"a\":1}".into()
            },
        ]
    );
}

/// The fixture template's own tool call, parsed back: the arguments it
/// was given.
#[test]
fn the_templates_call_parses_back() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/chat-template/cases.json"
    );
    let cases: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let case = cases
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "tool_call")
        .unwrap();
    let text = case["expected"].as_str().unwrap();
    let model = &text[text.rfind("<|turn>model\n").unwrap() + "<|turn>model\n".len()..];
    let r = parse_reply(model);
    let call = &case["messages"][1]["tool_calls"][0]["function"];
    assert_eq!(r.tool_calls.len(), 1, "{model}");
    assert_eq!(r.tool_calls[0].name, call["name"].as_str().unwrap());
    assert_eq!(args(&r.tool_calls[0]), call["arguments"]);
    assert_eq!(r.content, "");
}
