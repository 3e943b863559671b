#!/usr/bin/env python3
"""tests/fixtures/chat-template/cases.json: chat templates rendered as Hugging
Face transformers renders them, for the byte-for-byte test of turbospark's
renderer (cli/src/template, `cargo test -p turbospark-cli template`).

Each case names a template of the folder, its inputs (messages, tools,
add_generation_prompt, bos/eos tokens, extra template variables such as
enable_thinking) and what transformers' own `render_jinja_template` (the
function under `apply_chat_template`: jinja2's sandbox with trim_blocks,
lstrip_blocks and loop controls, its tojson, raise_exception and namespace)
returns: `expected`, or `error` for a template that raises.

The templates:

- gemma4.jinja is Gemma 4's chat format written for these fixtures, not
  Google's published file (Google revises that file; the checkpoints' own copy
  is what turbospark renders at run time). It produces the published
  template's markup for the constructs covered here: the system turn with
  `<|think|>` and `<|tool>declaration:...<tool|>` declarations, user and model
  turns (`<|turn>ROLE\\n...<turn|>\\n`), thinking stripped from earlier model
  turns, tool calls `<|tool_call>call:NAME{key:value}<tool_call|>` with
  `<|"|>`-quoted strings, tool responses `<|tool_response>response:NAME{...}
  <tool_response|>` continuing the model's turn, and the generation prompt
  (`<|channel>thought\\n<channel|>` when thinking is off).
- compat.jinja exercises what other Hugging Face templates use: tags without
  whitespace control, Python string and dict methods, tojson's options,
  namespace, break/continue, Python's printing of None, booleans, lists and
  dicts, and raise_exception.

    pip install jinja2 transformers   # (no model or torch needed)
    python3 scripts/make_template_fixtures.py

Rerunning reproduces identical bytes (no case prints the time).
"""
import json
import pathlib

from transformers.utils.chat_template_utils import render_jinja_template

DIR = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "chat-template"

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather at a place, now or in the next days.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "days": {"type": "integer", "description": "Days ahead"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "tags": {"type": "array", "items": {"type": "string"}},
                "where": {
                    "type": "object",
                    "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
                },
            },
            "required": ["city"],
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {"name": "now", "description": "The time now.",
                 "parameters": {"type": "object", "properties": {}}},
}
CALL = {
    "id": "call_0",
    "type": "function",
    "function": {
        "name": "get_weather",
        "arguments": {"city": "Zürich", "days": 3, "metric": True, "note": None,
                      "where": {"lat": 47.37, "lon": 8.54}, "tags": ["rain", "wind"]},
    },
}

GEMMA = [
    ("plain", dict(messages=[{"role": "user", "content": "Hello!"}], add_generation_prompt=True)),
    ("plain_no_generation_prompt", dict(messages=[{"role": "user", "content": "Hello!"}])),
    ("system", dict(messages=[{"role": "system", "content": "  You are terse.\n"},
                              {"role": "user", "content": " Hi \n"}], add_generation_prompt=True)),
    ("developer_role", dict(messages=[{"role": "developer", "content": "Answer in French."},
                                      {"role": "user", "content": "Hi"}], add_generation_prompt=True)),
    ("multi_turn", dict(messages=[
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4."},
        {"role": "user", "content": "And 3+3?"},
    ], add_generation_prompt=True)),
    ("multi_turn_thinking_stripped", dict(messages=[
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "<|channel>thought\nSimple sum.<channel|>It is 4."},
        {"role": "user", "content": "Thanks"},
    ], add_generation_prompt=True)),
    ("thinking_on", dict(messages=[{"role": "user", "content": "Why is the sky blue?"}],
                         add_generation_prompt=True, enable_thinking=True)),
    ("thinking_on_with_system", dict(messages=[{"role": "system", "content": "Be brief."},
                                               {"role": "user", "content": "Why?"}],
                                     add_generation_prompt=True, enable_thinking=True)),
    ("thinking_off", dict(messages=[{"role": "user", "content": "Why is the sky blue?"}],
                          add_generation_prompt=True, enable_thinking=False)),
    ("tools_declared", dict(messages=[{"role": "user", "content": "Weather in Zürich?"}],
                            tools=[WEATHER, CLOCK], add_generation_prompt=True)),
    ("tool_call", dict(messages=[
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
    ], tools=[WEATHER])),
    ("tool_call_string_arguments", dict(messages=[
        {"role": "user", "content": "Time?"},
        {"role": "assistant", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "now", "arguments": "zone:<|\"|>UTC<|\"|>"}}]},
    ])),
    ("tool_response", dict(messages=[
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_0", "name": "get_weather",
         "content": {"temperature": -3.5, "sky": "clear", "wind": [10, 20]}},
    ], tools=[WEATHER], add_generation_prompt=True)),
    ("tool_response_string_then_answer", dict(messages=[
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_0", "name": "get_weather", "content": "{\"temp\": -3}"},
        {"role": "assistant", "content": "It is -3 °C."},
        {"role": "user", "content": "Thanks!"},
    ], tools=[WEATHER], add_generation_prompt=True, enable_thinking=True)),
    ("non_ascii", dict(messages=[
        {"role": "system", "content": "Réponds en français — s'il te plaît."},
        {"role": "user", "content": "日本語で？ 🙂 «ok» \\ \"quotes\" \t tab"},
        {"role": "assistant", "content": "はい 🙂"},
        {"role": "user", "content": "Ünïcödé"},
    ], add_generation_prompt=True)),
    ("content_parts", dict(messages=[
        {"role": "user", "content": [{"type": "text", "text": "Part one."}, {"type": "text", "text": " Part two. "}]},
    ], add_generation_prompt=True)),
    ("reasoning_field_ignored", dict(messages=[
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello", "reasoning_content": "greet back"},
        {"role": "user", "content": "Bye"},
    ], add_generation_prompt=True)),
]

COMPAT = [
    ("compat_basic", dict(messages=[
        {"role": "system", "content": " padded system "},
        {"role": "user", "content": "two words", "name": "ann", "flag": True, "none": None,
         "n": 3, "x": 2.5, "big": 1e20, "small": 1e-7, "list": ["a", 1, None, False], "map": {"k": "v", "it's": [1.0]}},
        {"role": "skip", "content": "never shown"},
        {"role": "assistant", "content": "Zürich 🙂 \"q\" \\ <tag> & 'x'", "meta": {"é": "ü", "tab": "a\tb\n"}},
        {"role": "stop", "content": "ends the loop"},
        {"role": "user", "content": "not reached"},
    ], add_generation_prompt=True)),
    ("compat_tojson", dict(messages=[{"role": "user", "content": "x"}],
                           tools=[WEATHER, CLOCK], extra={"b": [1, 2.0, {"c": None}], "a": "ü"})),
    ("compat_reasoning_aliases", dict(messages=[
        {"role": "assistant", "content": "a", "reasoning": "r1"},
        {"role": "assistant", "content": "b", "thinking": "r2"},
    ])),
    ("compat_raise", dict(messages=[{"role": "user", "content": "ok"}, {"role": "bad", "content": "x"}])),
]


def render(template, inputs):
    inputs = json.loads(json.dumps(inputs))  # what the JSON fixture holds
    text = (DIR / template).read_text()
    messages = inputs.pop("messages")
    tools = inputs.pop("tools", None)
    add_generation_prompt = inputs.pop("add_generation_prompt", False)
    try:
        rendered, _ = render_jinja_template(
            conversations=[messages], tools=tools, chat_template=text,
            add_generation_prompt=add_generation_prompt,
            bos_token="<bos>", eos_token="<eos>", **inputs)
        return {"expected": rendered[0]}
    except Exception as e:  # raise_exception: jinja2's TemplateError
        return {"error": str(e)}


def main():
    cases = []
    for template, group in [("gemma4.jinja", GEMMA), ("compat.jinja", COMPAT)]:
        for name, inputs in group:
            case = {"name": name, "template": template, "bos_token": "<bos>", "eos_token": "<eos>"}
            case.update(json.loads(json.dumps(inputs)))
            case.update(render(template, inputs))
            cases.append(case)
    out = DIR / "cases.json"
    out.write_text(json.dumps(cases, ensure_ascii=False, indent=1) + "\n")
    print(f"{len(cases)} cases into {out}")


if __name__ == "__main__":
    main()
