//! Corpus of Qwen tool-call outputs, well-formed and broken. The broken shapes are the ones
//! reported against other servers' parsers (ollama #16686 and #17914, sglang #27337,
//! ninfer #138). Every case is also fed in small pieces: streaming must give the same result.

use serde_json::{json, Value};

use super::*;

/// A whole answer, parsed at once: the text and the calls as `(name, arguments JSON)`.
fn parse_all(tools: &[Value], text: &str) -> (String, Vec<(String, String)>) {
    let mut p = ToolCallParser::new(tools);
    let mut events = p.push(text);
    events.extend(p.finish());
    collect(events)
}

/// The events of `text` fed to the parser `size` characters at a time.
fn parse_in_pieces(tools: &[Value], text: &str, size: usize) -> Vec<ToolEvent> {
    let mut p = ToolCallParser::new(tools);
    let chars: Vec<char> = text.chars().collect();
    let mut events: Vec<ToolEvent> = chars
        .chunks(size)
        .flat_map(|piece| p.push(&piece.iter().collect::<String>()))
        .collect();
    events.extend(p.finish());
    events
}

/// Folds events into text and `(name, arguments)` pairs.
fn collect(events: Vec<ToolEvent>) -> (String, Vec<(String, String)>) {
    let mut text = String::new();
    let mut calls: Vec<(String, String)> = Vec::new();
    for e in events {
        match e {
            ToolEvent::Text(t) => text.push_str(&t),
            ToolEvent::Start { name, .. } => calls.push((name, String::new())),
            ToolEvent::Args { index, delta } => calls[index].1.push_str(&delta),
            ToolEvent::End { .. } => {}
        }
    }
    (text, calls)
}

fn tools() -> Vec<Value> {
    json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
            "threshold": {"type": "number"}, "tags": {"type": "array"}, "opts": {"type": "object"}}}}},
        {"type": "function", "function": {"name": "Glob", "parameters": {"type": "object", "properties": {"pattern": {"type": "string"}}}}},
        {"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}},
        {"type": "function", "function": {"name": "list_files", "parameters": {"type": "object", "properties": {}}}},
        {"name": "write_file", "input_schema": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}}}}
    ])
    .as_array()
    .unwrap()
    .clone()
}

fn check(text: &str, want_text: &str, want_calls: &[(&str, Value)]) {
    let tools = tools();
    let (got_text, got_calls) = parse_all(&tools, text);
    assert_eq!(got_text, want_text, "text of {text:?}");
    let parsed: Vec<(String, Value)> = got_calls
        .iter()
        .map(|(n, a)| {
            (
                n.clone(),
                serde_json::from_str(a)
                    .unwrap_or_else(|e| panic!("arguments {a:?} are not JSON: {e}")),
            )
        })
        .collect();
    let want: Vec<(String, Value)> = want_calls
        .iter()
        .map(|(n, a)| (n.to_string(), a.clone()))
        .collect();
    assert_eq!(parsed, want, "calls of {text:?}");
    for size in [1, 2, 3, 7, 16] {
        assert_eq!(
            collect(parse_in_pieces(&tools, text, size)),
            (got_text.clone(), got_calls.clone()),
            "streamed in pieces of {size}: {text:?}"
        );
    }
}

#[test]
fn one_call_after_text() {
    check(
        "I'll check the weather.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
        "I'll check the weather.",
        &[("get_weather", json!({"city": "Paris", "days": 3}))],
    );
}

#[test]
fn several_calls_in_one_turn() {
    check(
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nTokyo\n</parameter>\n</function>\n</tool_call>",
        "",
        &[("get_weather", json!({"city": "Paris"})), ("get_weather", json!({"city": "Tokyo"}))],
    );
}

#[test]
fn values_follow_the_schema_types() {
    check(
        "<tool_call>\n<function=get_weather>\n<parameter=city>\n123\n</parameter>\n<parameter=days>\n 7 \n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n<parameter=threshold>\n0.5\n</parameter>\n<parameter=tags>\n[\"a\", \"b\"]\n</parameter>\n<parameter=opts>\n{\"x\": 1}\n</parameter>\n</function>\n</tool_call>",
        "",
        &[("get_weather", json!({"city": "123", "days": 7, "metric": true, "threshold": 0.5, "tags": ["a", "b"], "opts": {"x": 1}}))],
    );
    // A value that does not fit its type stays a string rather than being lost.
    check(
        "<tool_call>\n<function=get_weather>\n<parameter=days>\na week\n</parameter>\n</function>\n</tool_call>",
        "",
        &[("get_weather", json!({"days": "a week"}))],
    );
}

#[test]
fn missing_parameter_close_tag() {
    // ollama #17914: under long context the model stops emitting </parameter>.
    check(
        "<tool_call>\n<function=write_file>\n<parameter=path>\n/tmp/a.txt\n<parameter=content>\nhello\nworld\n</function>\n</tool_call>",
        "",
        &[("write_file", json!({"path": "/tmp/a.txt", "content": "hello\nworld"}))],
    );
}

#[test]
fn missing_tool_call_open_tag() {
    // ollama #16686: `<tool_call>` dropped, orphan `</tool_call>` kept.
    check(
        "I'll use the Glob tool to list all markdown files in the current directory.\n\n<function=Glob>\n<parameter=pattern>\n*.md\n</parameter>\n</function>\n</tool_call>",
        "I'll use the Glob tool to list all markdown files in the current directory.",
        &[("Glob", json!({"pattern": "*.md"}))],
    );
    // An undeclared name in prose is text, not a call.
    check(
        "Write <function=foo> in the file.",
        "Write <function=foo> in the file.",
        &[],
    );
}

#[test]
fn damaged_parameter_close_tags() {
    // sglang #27337: `</parameter/>`, `</parameter1>`.
    check(
        "<tool_call>\n<function=get_weather>\n<parameter=city>\n上海\n</parameter/>\n<parameter=days>\n2\n</parameter1>\n</function>\n</tool_call>",
        "",
        &[("get_weather", json!({"city": "上海", "days": 2}))],
    );
}

#[test]
fn closing_tag_inside_a_string_value() {
    // ninfer #138: a command that prints tool-call markup.
    check(
        "<tool_call>\n<function=bash>\n<parameter=command>\npython3 - <<'PY'\nimport re\npattern = r'<parameter=edits>\\n(.*?)\\n</parameter>'\nprint(pattern)\nPY\n</parameter>\n</function>\n</tool_call>",
        "",
        &[("bash", json!({"command": "python3 - <<'PY'\nimport re\npattern = r'<parameter=edits>\\n(.*?)\\n</parameter>'\nprint(pattern)\nPY"}))],
    );
}

#[test]
fn code_with_angle_brackets_and_quotes() {
    check(
        "<tool_call>\n<function=write_file>\n<parameter=path>\nsrc/lib.rs\n</parameter>\n<parameter=content>\nfn lt(a: i32, b: i32) -> bool {\n    a < b && \"<tag>\" != \"\\\"\"\n}\n</parameter>\n</function>\n</tool_call>",
        "",
        &[("write_file", json!({"path": "src/lib.rs", "content": "fn lt(a: i32, b: i32) -> bool {\n    a < b && \"<tag>\" != \"\\\"\"\n}"}))],
    );
}

#[test]
fn json_form() {
    check(
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Berlin\", \"days\": 1}}\n</tool_call>",
        "",
        &[("get_weather", json!({"city": "Berlin", "days": 1}))],
    );
    check(
        "<tool_call>{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Rome\\\"}\"}</tool_call>",
        "",
        &[("get_weather", json!({"city": "Rome"}))],
    );
}

#[test]
fn truncated_call_is_closed() {
    // The output budget ran out in the middle of a value.
    check(
        "Let me look.\n<tool_call>\n<function=write_file>\n<parameter=path>\nnotes.md\n</parameter>\n<parameter=content>\n# Notes\npartial",
        "Let me look.",
        &[("write_file", json!({"path": "notes.md", "content": "# Notes\npartial"}))],
    );
}

#[test]
fn call_without_parameters_and_missing_closers() {
    check(
        "<tool_call>\n<function=list_files>\n</function>\n</tool_call>",
        "",
        &[("list_files", json!({}))],
    );
    check(
        "<tool_call>\n<function=list_files>\n</tool_call>",
        "",
        &[("list_files", json!({}))],
    );
    check(
        "<tool_call>\n<function=list_files>",
        "",
        &[("list_files", json!({}))],
    );
}

#[test]
fn plain_text_passes_through() {
    check(
        "Hello, world! 1 < 2 and <b>bold</b>.",
        "Hello, world! 1 < 2 and <b>bold</b>.",
        &[],
    );
    check(
        "Ends with a tag prefix <tool",
        "Ends with a tag prefix <tool",
        &[],
    );
}

#[test]
fn string_arguments_stream_before_the_value_ends() {
    let tools = tools();
    let mut p = ToolCallParser::new(&tools);
    let mut ev =
        p.push("<tool_call>\n<function=write_file>\n<parameter=content>\nline one\nline two");
    let args: String = ev
        .drain(..)
        .filter_map(|e| match e {
            ToolEvent::Args { delta, .. } => Some(delta),
            _ => None,
        })
        .collect();
    assert_eq!(args, "{\"content\": \"line one\\nline two");
}

/// Parses `text` whole and in pieces: both give the same text, calls and `closed` flags.
fn parse_cut(text: &str) -> (String, Vec<(String, String)>, Vec<bool>) {
    let tools = tools();
    let run = |size: usize| {
        let events = parse_in_pieces(&tools, text, size);
        let closed = events
            .iter()
            .filter_map(|e| match e {
                ToolEvent::End { closed, .. } => Some(*closed),
                _ => None,
            })
            .collect::<Vec<_>>();
        let (text, calls) = collect(events);
        (text, calls, closed)
    };
    let whole = run(text.len().max(1));
    for size in [1, 2, 5] {
        assert_eq!(run(size), whole, "in pieces of {size}: {text:?}");
    }
    whole
}

#[test]
fn json_form_call_cut_short_keeps_name_and_partial_arguments() {
    // A forced call in the JSON form, cut by max_tokens inside a string value.
    let (text, calls, closed) = parse_cut(
        "<tool_call>\n{\"name\": \"write_file\", \"arguments\": {\"path\": \"src/main.rs\", \"content\": \"fn ma",
    );
    assert_eq!(text, "");
    assert_eq!(
        calls,
        [(
            "write_file".to_string(),
            "{\"path\": \"src/main.rs\", \"content\": \"fn ma".to_string()
        )]
    );
    assert_eq!(closed, [false]);
    // Arguments complete, the object around them cut; arguments given as a JSON string.
    let (_, calls, _) = parse_cut(
        "<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"ls\"}\n</tool_",
    );
    assert_eq!(calls[0].1, "{\"command\":\"ls\"}");
    let (_, calls, _) =
        parse_cut("<tool_call>{\"name\": \"bash\", \"arguments\": \"{\\\"command\\\": \\\"l");
    assert_eq!(calls[0].1, "{\"command\": \"l");
    // Cut right after the name: a call without arguments yet.
    let (text, calls, closed) =
        parse_cut("Checking.\n<tool_call>\n{\"name\": \"list_files\", \"argu");
    assert_eq!(text, "Checking.");
    assert_eq!(calls, [("list_files".to_string(), String::new())]);
    assert_eq!(closed, [false]);
    // A complete call is closed.
    let (_, _, closed) = parse_cut(
        "<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call>",
    );
    assert_eq!(closed, [true]);
}

#[test]
fn markup_cut_short_never_becomes_text() {
    for text in [
        "<tool_call>\n{\"name\": \"write_fi",
        "<tool_call>\n{\"na",
        "<tool_call>\n",
        "<tool_call>\n<func",
        "<tool_call>\n<function=write_fi",
    ] {
        let (got, calls, _) = parse_cut(&format!("Let me look.\n{text}"));
        assert_eq!((got.as_str(), calls.len()), ("Let me look.", 0), "{text:?}");
    }
    // Cut inside a closing tag: the call is there, the partial tag is not in its value or text.
    for tail in [
        "\n</param",
        "\n</parameter>\n</func",
        "\n</parameter>\n</function>\n</tool_c",
    ] {
        let (got, calls, closed) = parse_cut(&format!(
            "<tool_call>\n<function=bash>\n<parameter=command>\nls -l{tail}"
        ));
        assert_eq!(got, "", "{tail:?}");
        assert_eq!(
            calls,
            [("bash".to_string(), "{\"command\": \"ls -l\"}".to_string())]
        );
        // Only `</function>` closes the call.
        assert_eq!(closed, [tail.contains("</function>")], "{tail:?}");
    }
}

#[test]
fn arguments_cut_short_read_as_an_object() {
    let cases = [
        ("{\"path\": \"src/ma", json!({"path": "src/ma"})),
        ("{\"path\": \"a\\\"b\\u00e", json!({"path": "a\"b"})),
        ("{\"path\": \"a\\", json!({"path": "a"})),
        ("{\"a\": 1, \"b\": [1, 2", json!({"a": 1, "b": [1, 2]})),
        ("{\"a\": 1, \"b\": tru", json!({"a": 1})),
        ("{\"a\": 1, \"b\": 12.", json!({"a": 1})),
        ("{\"a\": 1, \"pa", json!({"a": 1})),
        ("{\"a\": {\"b\": ", json!({"a": {}})),
        ("{\"a\": \"x, {y\"", json!({"a": "x, {y"})),
        ("{", json!({})),
        ("", json!({})),
        ("{\"done\": true}", json!({"done": true})),
    ];
    for (args, want) in cases {
        assert_eq!(arguments_value(args), want, "{args:?}");
    }
}
