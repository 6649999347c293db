//! Tool calls in Qwen model output, parsed as the text streams.
//!
//! Qwen3.5/3.6 emit calls in an XML form, `<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n
//! </parameter>\n</function>\n</tool_call>`, and older checkpoints a JSON form,
//! `<tool_call>{"name": .., "arguments": {..}}</tool_call>`. [`ToolCallParser`] turns text into
//! [`ToolEvent`]s: plain text, and for each call its start, argument JSON fragments (string
//! parameters stream as they are generated) and end. Parameter values are converted by the
//! tool's JSON-schema types. Malformations seen in the wild are tolerated: a missing
//! `<tool_call>` before `<function=` (only for a declared tool), missing `</parameter>`,
//! `</function>` or `</tool_call>`, damaged closing tags (`</parameter/>`), Python booleans,
//! and a `</parameter>` that is part of a string value (it ends the value only when the next
//! tag follows). Markup never reaches the text, also when the output is cut short inside a
//! call: an XML call is closed with what it has, a JSON-form call keeps its name and the
//! arguments generated so far ([`ToolEvent::End`] says the call was not closed), and a call
//! cut before its name is complete is dropped.

use std::collections::HashMap;

use serde_json::{Map, Value};

use crate::ids::new_id;

const TOOL_CALL: &str = "<tool_call>";
const TOOL_CALL_END: &str = "</tool_call>";
const FUNCTION: &str = "<function=";
const FUNCTION_END: &str = "</function>";
const PARAMETER: &str = "<parameter=";
const PARAMETER_END: &str = "</parameter";

/// What the parser found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolEvent {
    /// Text outside any call.
    Text(String),
    /// A call begins; `index` counts calls from 0 across the whole answer.
    Start {
        index: usize,
        id: String,
        name: String,
    },
    /// The next piece of the call's arguments (the pieces concatenate to a JSON object).
    Args { index: usize, delta: String },
    /// The call ends; `closed`: its closing markup (or, in the JSON form, the whole object)
    /// was there, false when the text ended inside the call (cut by `max_tokens`).
    End { index: usize, closed: bool },
}

#[derive(Debug)]
struct Call {
    index: usize,
    name: String,
    params: usize,
}

#[derive(Debug)]
enum Mode {
    Text,
    /// After `<tool_call>`.
    Open,
    /// Inside `<tool_call>` with a JSON body.
    Json,
    /// After `<function=`, reading the name.
    Header,
    /// Between parameters of a call.
    Params(Call),
    /// Inside a parameter value; `string` values stream, others are converted at the end.
    /// `released`: part of the value was already streamed (the buffer no longer starts a line).
    Value {
        call: Call,
        key: String,
        string: bool,
        started: bool,
        released: bool,
    },
    /// After `</function>`, where `</tool_call>` may follow.
    After,
}

/// Streaming parser for one answer.
pub struct ToolCallParser {
    /// Tool name → its `parameters.properties`.
    tools: HashMap<String, Map<String, Value>>,
    buf: String,
    mode: Mode,
    next_index: usize,
}

impl ToolCallParser {
    /// A parser for calls to `tools` (OpenAI-style definitions, `{"type": "function",
    /// "function": {"name", "parameters"}}`, or bare `{"name", "parameters"}`).
    pub fn new(tools: &[Value]) -> Self {
        let tools = tools
            .iter()
            .filter_map(|t| {
                let f = t.get("function").unwrap_or(t);
                let name = f.get("name")?.as_str()?.to_string();
                let props = f
                    .pointer("/parameters/properties")
                    .or_else(|| f.pointer("/input_schema/properties"))
                    .and_then(Value::as_object)
                    .cloned()
                    .unwrap_or_default();
                Some((name, props))
            })
            .collect();
        Self {
            tools,
            buf: String::new(),
            mode: Mode::Text,
            next_index: 0,
        }
    }

    /// Feeds generated text.
    pub fn push(&mut self, text: &str) -> Vec<ToolEvent> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        self.run(false, &mut out);
        out
    }

    /// Ends the answer: closes an unfinished call and releases held text.
    pub fn finish(&mut self) -> Vec<ToolEvent> {
        let mut out = Vec::new();
        self.run(true, &mut out);
        out
    }

    fn run(&mut self, last: bool, out: &mut Vec<ToolEvent>) {
        while self.step(last, out) {}
    }

    /// Consumes what it can of the buffer; false when it needs more text (or is done).
    fn step(&mut self, last: bool, out: &mut Vec<ToolEvent>) -> bool {
        match std::mem::replace(&mut self.mode, Mode::Text) {
            Mode::Text => self.text(last, out),
            Mode::Open => {
                let rest = self.buf.trim_start();
                let skipped = self.buf.len() - rest.len();
                if rest.starts_with('{') {
                    self.buf.drain(..skipped);
                    self.mode = Mode::Json;
                } else if rest.starts_with(FUNCTION) {
                    self.buf.drain(..skipped + FUNCTION.len());
                    self.mode = Mode::Header;
                } else if !last && (rest.is_empty() || FUNCTION.starts_with(rest)) {
                    self.mode = Mode::Open;
                    return false;
                } else if last && FUNCTION.starts_with(rest) {
                    // Cut inside `<function=`: the markup is dropped.
                    self.buf.clear();
                } else {
                    // Not a call after all: carry on with the text.
                    self.buf.drain(..skipped);
                }
                true
            }
            Mode::Json => {
                let Some(end) =
                    self.buf
                        .find(TOOL_CALL_END)
                        .or(if last { Some(self.buf.len()) } else { None })
                else {
                    self.mode = Mode::Json;
                    return false;
                };
                let body: String = self.buf.drain(..end).collect();
                let closed = self.buf.starts_with(TOOL_CALL_END);
                self.consume_prefix(TOOL_CALL_END);
                self.json_call(body.trim(), closed, out);
                true
            }
            Mode::Header => match self.buf.find('>') {
                Some(gt) => {
                    let name = self.buf[..gt].trim().to_string();
                    self.buf.drain(..=gt);
                    self.start_call(name, out);
                    true
                }
                None if last => {
                    // Cut inside the name: without a name there is no call to return.
                    self.buf.clear();
                    true
                }
                None => {
                    self.mode = Mode::Header;
                    false
                }
            },
            Mode::Params(call) => self.params(call, last, out),
            Mode::Value {
                call,
                key,
                string,
                started,
                released,
            } => self.value(call, key, string, (started, released), last, out),
            Mode::After => {
                let rest = self.buf.trim_start();
                let skipped = self.buf.len() - rest.len();
                if rest.starts_with(TOOL_CALL_END) {
                    self.buf.drain(..skipped + TOOL_CALL_END.len());
                } else if !last && (rest.is_empty() || TOOL_CALL_END.starts_with(rest)) {
                    self.mode = Mode::After;
                    return false;
                } else if last && TOOL_CALL_END.starts_with(rest) {
                    // Cut inside `</tool_call>`.
                    self.buf.clear();
                } else {
                    self.buf.drain(..skipped);
                }
                true
            }
        }
    }

    fn text(&mut self, last: bool, out: &mut Vec<ToolEvent>) -> bool {
        let call_at = self.buf.find(TOOL_CALL);
        let bare_at = self
            .buf
            .find(FUNCTION)
            .filter(|&f| call_at.is_none_or(|c| f < c));
        if let Some(f) = bare_at {
            // `<function=NAME>` without `<tool_call>`: a call only if NAME is a declared tool.
            let after = &self.buf[f + FUNCTION.len()..];
            match after.find('>') {
                Some(gt) if self.tools.contains_key(after[..gt].trim()) => {
                    let before: String = self.buf.drain(..f).collect();
                    self.emit_text(before.trim_end(), out);
                    self.buf.drain(..FUNCTION.len());
                    self.mode = Mode::Header;
                    return true;
                }
                None if !last && after.len() < 128 && !after.contains('\n') => {
                    // Wait for the name; whitespace before the tag stays held too.
                    let cut = self.buf[..f].trim_end().len();
                    let before: String = self.buf.drain(..cut).collect();
                    self.emit_text(&before, out);
                    return false;
                }
                _ => {
                    // Plain text that happens to contain the tag.
                    let upto = f + FUNCTION.len();
                    let before: String = self.buf.drain(..upto).collect();
                    self.emit_text(&before, out);
                    return true;
                }
            }
        }
        if let Some(c) = call_at {
            let before: String = self.buf.drain(..c).collect();
            self.emit_text(before.trim_end(), out);
            self.buf.drain(..TOOL_CALL.len());
            self.mode = Mode::Open;
            return true;
        }
        if last {
            let rest = std::mem::take(&mut self.buf);
            self.emit_text(&rest, out);
            return false;
        }
        // Hold back whitespace (it may precede a call) and a tail that may begin a tag.
        let keep_tag = [TOOL_CALL, FUNCTION]
            .iter()
            .flat_map(|m| (1..m.len()).filter(|&n| self.buf.ends_with(&m[..n])))
            .max()
            .unwrap_or(0);
        let body = &self.buf[..self.buf.len() - keep_tag];
        let cut = body.trim_end().len();
        let now: String = self.buf.drain(..cut).collect();
        self.emit_text(&now, out);
        false
    }

    fn params(&mut self, call: Call, last: bool, out: &mut Vec<ToolEvent>) -> bool {
        let rest = self.buf.trim_start();
        let skipped = self.buf.len() - rest.len();
        if let Some(after) = rest.strip_prefix(PARAMETER) {
            if let Some(gt) = after.find('>') {
                let key = after[..gt].trim().to_string();
                self.buf.drain(..skipped + PARAMETER.len() + gt + 1);
                let string = self.is_string(&call.name, &key);
                self.mode = Mode::Value {
                    call,
                    key,
                    string,
                    started: false,
                    released: false,
                };
                return true;
            }
            if !last {
                self.mode = Mode::Params(call);
                return false;
            }
            self.buf.clear();
        } else if rest.starts_with(FUNCTION_END) {
            self.buf.drain(..skipped + FUNCTION_END.len());
            self.end_call(call, true, out);
            self.mode = Mode::After;
            return true;
        } else if rest.starts_with(TOOL_CALL_END) {
            self.buf.drain(..skipped + TOOL_CALL_END.len());
            self.end_call(call, true, out);
            return true;
        } else if !last
            && [PARAMETER, FUNCTION_END, TOOL_CALL_END]
                .iter()
                .any(|m| m.starts_with(rest))
        {
            self.mode = Mode::Params(call);
            return false;
        } else if !rest.is_empty() && !last {
            // Stray text between parameters: skip to the next tag.
            let next = rest.find('<').unwrap_or(rest.len()).max(1);
            self.buf.drain(..skipped + next);
            self.mode = Mode::Params(call);
            return true;
        }
        if last {
            self.buf.clear();
            self.end_call(call, false, out);
            return false;
        }
        self.mode = Mode::Params(call);
        false
    }

    fn value(
        &mut self,
        call: Call,
        key: String,
        string: bool,
        (started, released): (bool, bool),
        last: bool,
        out: &mut Vec<ToolEvent>,
    ) -> bool {
        // Qwen puts the value on its own lines: drop one leading newline.
        if !started {
            if self.buf.is_empty() && !last {
                self.mode = Mode::Value {
                    call,
                    key,
                    string,
                    started,
                    released,
                };
                return false;
            }
            if self.buf.starts_with('\n') {
                self.buf.drain(..1);
            }
            if string {
                let sep = if call.params == 0 { "{" } else { ", " };
                out.push(ToolEvent::Args {
                    index: call.index,
                    delta: format!("{sep}{}: \"", json_string(&key)),
                });
            }
        }
        let (end, release) = scan_value(&self.buf, !released, last);
        if string && release > 0 {
            let piece: String = self.buf.drain(..release).collect();
            out.push(ToolEvent::Args {
                index: call.index,
                delta: escape_json(&piece),
            });
        }
        let Some((value_end, consumed)) = end else {
            let released = released || (string && release > 0);
            self.mode = Mode::Value {
                call,
                key,
                string,
                started: true,
                released,
            };
            return false;
        };
        let (value_end, consumed) = if string {
            (value_end - release, consumed - release)
        } else {
            (value_end, consumed)
        };
        let raw: String = self.buf[..value_end]
            .strip_suffix('\n')
            .unwrap_or(&self.buf[..value_end])
            .to_string();
        self.buf.drain(..consumed);
        let mut call = call;
        if string {
            out.push(ToolEvent::Args {
                index: call.index,
                delta: format!("{}\"", escape_json(&raw)),
            });
        } else {
            let sep = if call.params == 0 { "{" } else { ", " };
            let v = self.convert(&call.name, &key, &raw);
            out.push(ToolEvent::Args {
                index: call.index,
                delta: format!("{sep}{}: {v}", json_string(&key)),
            });
        }
        call.params += 1;
        self.mode = Mode::Params(call);
        true
    }

    fn start_call(&mut self, name: String, out: &mut Vec<ToolEvent>) {
        let index = self.next_index;
        self.next_index += 1;
        out.push(ToolEvent::Start {
            index,
            id: new_id("call_"),
            name: name.clone(),
        });
        self.mode = Mode::Params(Call {
            index,
            name,
            params: 0,
        });
    }

    fn end_call(&mut self, call: Call, closed: bool, out: &mut Vec<ToolEvent>) {
        let close = if call.params == 0 { "{}" } else { "}" };
        out.push(ToolEvent::Args {
            index: call.index,
            delta: close.into(),
        });
        out.push(ToolEvent::End {
            index: call.index,
            closed,
        });
    }

    /// A JSON-form call; `closed`: `</tool_call>` followed (else the text ended first).
    fn json_call(&mut self, body: &str, closed: bool, out: &mut Vec<ToolEvent>) {
        let parsed: Option<(String, Value)> =
            serde_json::from_str::<Value>(body).ok().and_then(|v| {
                let name = v.get("name")?.as_str()?.to_string();
                let args = match v.get("arguments").or_else(|| v.get("parameters")) {
                    Some(Value::String(s)) => {
                        serde_json::from_str(s).unwrap_or(Value::String(s.clone()))
                    }
                    Some(a) => a.clone(),
                    None => Value::Object(Map::new()),
                };
                Some((name, args))
            });
        let (name, args, complete) = match parsed {
            Some((name, args)) => (name, args.to_string(), true),
            // Cut short: the name and the arguments generated so far.
            None if !closed => match partial_json_call(body) {
                Some((name, args)) => (name, args, false),
                // Cut before the name was complete: nothing to return, and no markup.
                None => return,
            },
            // Not a call we can read: keep the words, drop the markup.
            None => return self.emit_text(body, out),
        };
        let index = self.next_index;
        self.next_index += 1;
        out.push(ToolEvent::Start {
            index,
            id: new_id("call_"),
            name,
        });
        if !args.is_empty() {
            out.push(ToolEvent::Args { index, delta: args });
        }
        out.push(ToolEvent::End {
            index,
            closed: complete,
        });
    }

    fn emit_text(&mut self, text: &str, out: &mut Vec<ToolEvent>) {
        if text.is_empty() {
            return;
        }
        match out.last_mut() {
            Some(ToolEvent::Text(t)) => t.push_str(text),
            _ => out.push(ToolEvent::Text(text.to_string())),
        }
    }

    fn consume_prefix(&mut self, marker: &str) {
        if self.buf.starts_with(marker) {
            self.buf.drain(..marker.len());
        }
    }

    fn schema_type(&self, tool: &str, key: &str) -> Option<Vec<String>> {
        let prop = self.tools.get(tool)?.get(key)?;
        let types = match prop.get("type") {
            Some(Value::String(t)) => vec![t.clone()],
            Some(Value::Array(ts)) => ts
                .iter()
                .filter_map(|t| t.as_str().map(str::to_string))
                .collect(),
            _ => prop
                .get("anyOf")
                .or_else(|| prop.get("oneOf"))
                .and_then(Value::as_array)
                .map(|alts| {
                    alts.iter()
                        .filter_map(|a| a.get("type")?.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default(),
        };
        Some(types)
    }

    /// A value streams as a string when its schema says string only (or says nothing).
    fn is_string(&self, tool: &str, key: &str) -> bool {
        match self.schema_type(tool, key) {
            None => true,
            Some(types) => types.is_empty() || types.iter().all(|t| t == "string"),
        }
    }

    /// JSON text of a non-string value, by the schema's types; a string when nothing fits.
    fn convert(&self, tool: &str, key: &str, raw: &str) -> Value {
        let types = self.schema_type(tool, key).unwrap_or_default();
        let t = raw.trim();
        for ty in &types {
            let v = match ty.as_str() {
                "integer" => t.parse::<i64>().ok().map(Value::from),
                "number" => t.parse::<i64>().ok().map(Value::from).or_else(|| {
                    t.parse::<f64>()
                        .ok()
                        .filter(|f| f.is_finite())
                        .map(Value::from)
                }),
                "boolean" => match t.to_ascii_lowercase().as_str() {
                    "true" => Some(Value::Bool(true)),
                    "false" => Some(Value::Bool(false)),
                    _ => None,
                },
                "null" => (t == "null" || t == "None").then_some(Value::Null),
                "object" | "array" => serde_json::from_str::<Value>(t).ok().filter(|v| {
                    v.is_object() == (ty == "object") && v.is_array() == (ty == "array")
                }),
                _ => None,
            };
            if let Some(v) = v {
                return v;
            }
        }
        Value::String(raw.to_string())
    }
}

/// Where a parameter value ends in `text`: `(Some((value_end, consumed)), releasable)`, where
/// `value_end` is the end of the value, `consumed` the end of its closing tag, and
/// `releasable` how much of the value can be streamed now. `None` while the end is unknown.
/// `fresh`: `text` starts at the beginning of the value (so at the start of a line).
fn scan_value(text: &str, fresh: bool, last: bool) -> (Option<(usize, usize)>, usize) {
    const BOUNDARIES: [&str; 3] = [PARAMETER, FUNCTION_END, TOOL_CALL_END];
    let hold = |i: usize| if text[..i].ends_with('\n') { i - 1 } else { i };
    let line_start = |i: usize| {
        if i == 0 {
            fresh
        } else {
            text[..i].ends_with('\n')
        }
    };
    let mut from = 0;
    while let Some(off) = text[from..].find('<') {
        let i = from + off;
        let rest = &text[i..];
        if rest.starts_with(PARAMETER_END) {
            // `</parameter>` and damaged forms like `</parameter/>` or `</parameter1>`.
            match rest.find('>').filter(|&g| g <= PARAMETER_END.len() + 4) {
                Some(g) => {
                    let close = i + g + 1;
                    let after = text[close..].trim_start();
                    let boundary = BOUNDARIES.iter().any(|b| after.starts_with(b));
                    let maybe = BOUNDARIES.iter().any(|b| b.starts_with(after));
                    // At the end, a cut closing tag after it counts as one.
                    if boundary || (last && (after.is_empty() || maybe)) {
                        return (Some((i, close)), hold(i));
                    }
                    if maybe && !last {
                        return (None, hold(i));
                    }
                    from = close; // a literal `</parameter>` inside the value
                }
                None if !last && rest.len() < PARAMETER_END.len() + 5 => return (None, hold(i)),
                None if last => return (Some((i, text.len())), hold(i)),
                None => from = i + 1,
            }
        } else if line_start(i) && BOUNDARIES.iter().any(|b| rest.starts_with(b)) {
            // The closing tag is missing: the value ends where the next tag begins (tags sit
            // on their own lines; mid-line they are part of the value).
            return (Some((i, i)), hold(i));
        } else if !last
            && (PARAMETER_END.starts_with(rest)
                || (line_start(i) && BOUNDARIES.iter().any(|m| m.starts_with(rest))))
        {
            return (None, hold(i));
        } else {
            from = i + 1;
        }
    }
    if last {
        // Cut inside a closing tag: the partial tag is not part of the value.
        let tag = text.rfind('<').filter(|&i| {
            let rest = &text[i..];
            PARAMETER_END.starts_with(rest)
                || (line_start(i) && BOUNDARIES.iter().any(|b| b.starts_with(rest)))
        });
        let end = tag.unwrap_or(text.len());
        (Some((end, text.len())), hold(end))
    } else {
        (None, hold(text.len()))
    }
}

/// The name and the arguments so far of a JSON-form call cut short, `{"name": "NAME",
/// "arguments": ...`; `None` unless the name is complete. Arguments written as a JSON string
/// are decoded; the arguments text is empty when the cut came before it.
fn partial_json_call(body: &str) -> Option<(String, String)> {
    let rest = body.trim_start().strip_prefix('{')?.trim_start();
    let (key, rest) = string_prefix(rest)?;
    if key != "name" {
        return None;
    }
    let rest = rest.trim_start().strip_prefix(':')?.trim_start();
    let (name, rest) = string_prefix(rest)?;
    let args = (|| {
        let rest = rest.trim_start().strip_prefix(',')?.trim_start();
        let (key, rest) = string_prefix(rest)?;
        if key != "arguments" && key != "parameters" {
            return None;
        }
        let rest = rest.trim_start().strip_prefix(':')?.trim_start();
        if rest.starts_with('"') {
            return Some(partial_string(rest));
        }
        // The whole value when it is complete (the object around it was cut), else the text.
        let mut values = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        Some(match values.next() {
            Some(Ok(v)) => v.to_string(),
            _ => rest.to_string(),
        })
    })();
    Some((name, args.unwrap_or_default()))
}

/// A complete JSON string at the start of `text`, and the text after it.
fn string_prefix(text: &str) -> Option<(String, &str)> {
    if !text.starts_with('"') {
        return None;
    }
    let mut strings = serde_json::Deserializer::from_str(text).into_iter::<String>();
    let s = strings.next()?.ok()?;
    Some((s, &text[strings.byte_offset()..]))
}

/// The content of a JSON string that may be cut short (an unfinished escape is dropped).
fn partial_string(text: &str) -> String {
    if let Some((s, _)) = string_prefix(text) {
        return s;
    }
    let (_, escape) = scan_json(text);
    let mut closed = text[..escape.unwrap_or(text.len())].to_string();
    closed.push('"');
    serde_json::from_str(&closed).unwrap_or_default()
}

/// Walks JSON text: the points where it can be cut and closed, `(cut, closers)` (after an
/// opening bracket, before a comma), and, when the text ends inside a string, where the
/// string's unfinished escape begins (`Some(len)` when none), else `None`.
fn scan_json(text: &str) -> (Vec<(usize, String)>, Option<usize>) {
    let closers = |stack: &[char]| stack.iter().rev().collect::<String>();
    let mut cuts = Vec::new();
    let mut stack = Vec::new();
    let mut in_string = false;
    let mut escape: Option<usize> = None;
    for (i, c) in text.char_indices() {
        if in_string {
            match escape {
                // `\uXXXX` ends at its fourth digit, other escapes at their letter.
                Some(e) if text[e + 1..].starts_with('u') && i < e + 5 => {}
                Some(_) => escape = None,
                None if c == '\\' => escape = Some(i),
                None if c == '"' => in_string = false,
                None => {}
            }
            continue;
        }
        match c {
            '"' => in_string = true,
            '{' | '[' => {
                stack.push(if c == '{' { '}' } else { ']' });
                cuts.push((i + 1, closers(&stack)));
            }
            '}' | ']' => {
                stack.pop();
            }
            ',' => cuts.push((i, closers(&stack))),
            _ => {}
        }
    }
    let open_string = in_string.then(|| escape.unwrap_or(text.len()));
    cuts.push((text.len(), closers(&stack)));
    (cuts, open_string)
}

/// Arguments JSON → a value for APIs that need one (Anthropic's `input`): the parsed text, or
/// for arguments cut short, what can be read of them: an open string is closed where it was cut
/// (less an unfinished escape), open brackets are closed, and a member cut before its value is
/// complete (a half key, a number or literal cut short) is left out; `{}` when nothing is left.
pub fn arguments_value(args: &str) -> Value {
    if let Ok(v) = serde_json::from_str::<Value>(args) {
        return v;
    }
    let (mut cuts, open_string) = scan_json(args);
    // The whole text first (the last cut point is its end), then back to earlier cuts.
    let (end, closers) = cuts.pop().unwrap_or_default();
    let mut whole = args[..open_string.unwrap_or(end)].to_string();
    if open_string.is_some() {
        whole.push('"');
    }
    whole.push_str(&closers);
    let candidates = std::iter::once(whole).chain(
        cuts.iter()
            .rev()
            .take(8)
            .map(|(cut, closers)| format!("{}{closers}", &args[..*cut])),
    );
    candidates
        .filter_map(|c| serde_json::from_str::<Value>(&c).ok())
        .find(Value::is_object)
        .unwrap_or_else(|| Value::Object(Map::new()))
}

fn json_string(s: &str) -> String {
    serde_json::to_string(s).expect("strings serialise")
}

/// JSON string escaping without the quotes.
fn escape_json(s: &str) -> String {
    let q = json_string(s);
    q[1..q.len() - 1].to_string()
}

#[cfg(test)]
mod tests;
