//! Generated text → the parts of an assistant message, as it streams: reasoning, answer text
//! and tool calls. One parser for every API; each API only formats the [`Part`]s.

use std::collections::HashMap;

use serde_json::Value;

use crate::reasoning::ReasoningSplitter;
use crate::tool_calls::{ToolCallParser, ToolEvent};

/// A piece of the assistant message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Part {
    Reasoning(String),
    Text(String),
    /// A tool call begins (`index` counts calls in this message from 0).
    CallStart {
        index: usize,
        id: String,
        name: String,
    },
    /// More of a call's argument JSON.
    CallArgs {
        index: usize,
        delta: String,
    },
}

/// Splits one answer into [`Part`]s.
pub struct OutputParser {
    reasoning: ReasoningSplitter,
    /// Tool-call parsers for the answer and for the reasoning (a model sometimes calls a tool
    /// without closing its think block); none when the request has no tools.
    calls: Option<[ToolCallParser; 2]>,
    /// (channel, parser's index) → index in the message; `None` for a call dropped because
    /// the request allows fewer calls.
    index: HashMap<(usize, usize), Option<usize>>,
    /// Most calls to return (`parallel_tool_calls: false` → 1).
    max_calls: usize,
    returned: usize,
    /// The returned call the text ended inside of (see [`OutputParser::cut_call`]).
    cut: Option<usize>,
}

impl OutputParser {
    /// `in_reasoning`: the prompt leaves a think block open. `tools`: the request's tool
    /// definitions (empty: no tool-call parsing).
    pub fn new(in_reasoning: bool, tools: &[Value]) -> Self {
        Self {
            reasoning: ReasoningSplitter::new(in_reasoning),
            calls: (!tools.is_empty())
                .then(|| [ToolCallParser::new(tools), ToolCallParser::new(tools)]),
            index: HashMap::new(),
            max_calls: usize::MAX,
            returned: 0,
            cut: None,
        }
    }

    /// Returns only the first call of the answer (the request disabled parallel calls).
    pub fn single_call(mut self) -> Self {
        self.max_calls = 1;
        self
    }

    /// Feeds generated text.
    pub fn push(&mut self, text: &str) -> Vec<Part> {
        let split = self.reasoning.push(text);
        self.route(split.reasoning, split.content, false)
    }

    /// Ends the answer.
    pub fn finish(&mut self) -> Vec<Part> {
        let split = self.reasoning.finish();
        self.route(split.reasoning, split.content, true)
    }

    /// Number of tool calls returned.
    pub fn num_calls(&self) -> usize {
        self.returned
    }

    /// The returned call (its index) that the text ended inside of, before its closing markup:
    /// when generation stopped for `max_tokens`, that call is incomplete and its arguments are
    /// what was generated of them (possibly unfinished JSON, in the JSON form).
    pub fn cut_call(&self) -> Option<usize> {
        self.cut
    }

    fn route(&mut self, reasoning: String, content: String, last: bool) -> Vec<Part> {
        let mut out = Vec::new();
        let Some(parsers) = self.calls.as_mut() else {
            if !reasoning.is_empty() {
                out.push(Part::Reasoning(reasoning));
            }
            if !content.is_empty() {
                out.push(Part::Text(content));
            }
            return out;
        };
        for (channel, text) in [(0, reasoning), (1, content)] {
            let mut events = parsers[channel].push(&text);
            if last {
                events.extend(parsers[channel].finish());
            }
            for e in events {
                let part = match e {
                    ToolEvent::Text(t) if channel == 0 => Part::Reasoning(t),
                    ToolEvent::Text(t) => Part::Text(t),
                    ToolEvent::Start { index, id, name } => {
                        if self.returned >= self.max_calls {
                            self.index.insert((channel, index), None);
                            continue;
                        }
                        let n = self.returned;
                        self.returned += 1;
                        self.index.insert((channel, index), Some(n));
                        Part::CallStart { index: n, id, name }
                    }
                    ToolEvent::Args { index, delta } => match self.index[&(channel, index)] {
                        Some(index) => Part::CallArgs { index, delta },
                        None => continue,
                    },
                    ToolEvent::End { index, closed } => {
                        if let (false, Some(n)) = (closed, self.index[&(channel, index)]) {
                            self.cut = Some(n);
                        }
                        continue;
                    }
                };
                out.push(part);
            }
        }
        out
    }
}

/// A whole message, assembled from parts.
#[derive(Debug, Default)]
pub struct Message {
    pub reasoning: String,
    pub text: String,
    /// `(id, name, arguments JSON)`.
    pub calls: Vec<(String, String, String)>,
}

impl Message {
    /// Adds parts.
    pub fn extend(&mut self, parts: Vec<Part>) {
        for p in parts {
            match p {
                Part::Reasoning(t) => self.reasoning.push_str(&t),
                Part::Text(t) => self.text.push_str(&t),
                Part::CallStart { id, name, .. } => self.calls.push((id, name, String::new())),
                Part::CallArgs { index, delta } => self.calls[index].2.push_str(&delta),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reasoning_then_text_then_call() {
        let tools = [
            json!({"type": "function", "function": {"name": "f", "parameters": {"properties": {"x": {"type": "integer"}}}}}),
        ];
        let mut p = OutputParser::new(true, &tools);
        let mut m = Message::default();
        m.extend(
            p.push("Think.\n</think>\n\nCalling.\n\n<tool_call>\n<function=f>\n<parameter=x>\n4"),
        );
        m.extend(p.push("2\n</parameter>\n</function>\n</tool_call>"));
        m.extend(p.finish());
        assert_eq!(m.reasoning, "Think.\n");
        assert_eq!(m.text, "Calling.");
        assert_eq!(m.calls.len(), 1);
        assert_eq!(
            (m.calls[0].1.as_str(), m.calls[0].2.as_str()),
            ("f", "{\"x\": 42}")
        );
    }

    #[test]
    fn call_inside_unclosed_reasoning_is_still_a_call() {
        let tools = [json!({"name": "f", "parameters": {"properties": {}}})];
        let mut p = OutputParser::new(true, &tools);
        let mut m = Message::default();
        m.extend(p.push("I should call f.\n<tool_call>\n<function=f>\n</function>\n</tool_call>"));
        m.extend(p.finish());
        assert_eq!(m.reasoning, "I should call f.");
        assert_eq!(m.calls[0].1, "f");
    }

    #[test]
    fn single_call_drops_the_rest() {
        let tools = [json!({"name": "f", "parameters": {"properties": {}}})];
        let mut p = OutputParser::new(false, &tools).single_call();
        let mut m = Message::default();
        m.extend(p.push("<tool_call>\n<function=f>\n</function>\n</tool_call>\n<tool_call>\n<function=f>\n</function>\n</tool_call>"));
        m.extend(p.finish());
        assert_eq!(m.calls.len(), 1);
        assert_eq!(p.num_calls(), 1);
    }

    #[test]
    fn the_call_cut_short_is_known() {
        let tools = [json!({"name": "f", "parameters": {"properties": {"x": {"type": "string"}}}})];
        let call = "<tool_call>\n<function=f>\n<parameter=x>\nab\n</parameter>\n</function>\n</tool_call>\n";
        let mut p = OutputParser::new(false, &tools);
        let mut m = Message::default();
        m.extend(p.push(call));
        m.extend(p.push("<tool_call>\n<function=f>\n<parameter=x>\nc"));
        m.extend(p.finish());
        assert_eq!(m.calls.len(), 2);
        assert_eq!(m.calls[1].2, "{\"x\": \"c\"}");
        assert_eq!(p.cut_call(), Some(1));
        let mut p = OutputParser::new(false, &tools);
        p.push(call);
        p.finish();
        assert_eq!(p.cut_call(), None);
    }

    #[test]
    fn without_tools_markup_is_text() {
        let mut p = OutputParser::new(false, &[]);
        let mut m = Message::default();
        m.extend(p.push("<tool_call>x</tool_call>"));
        m.extend(p.finish());
        assert_eq!(m.text, "<tool_call>x</tool_call>");
    }
}
