//! Messages requests → the chat conversation the template renders.

use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::error::ApiError;
use crate::openai::ChatInput;

/// Lines of system text that change on every request without changing its meaning.
const VOLATILE_PREFIXES: [&str; 1] = ["x-anthropic-billing-header:"];

/// The request fields that shape the prompt.
#[derive(Deserialize)]
pub struct Conversation {
    pub messages: Vec<InMessage>,
    #[serde(default)]
    pub system: Option<System>,
    #[serde(default)]
    pub tools: Option<Vec<Value>>,
    #[serde(default)]
    pub thinking: Option<Thinking>,
    #[serde(default)]
    pub output_config: Option<OutputConfig>,
}

#[derive(Deserialize)]
#[serde(untagged)]
pub enum System {
    Text(String),
    Blocks(Vec<Block>),
}

#[derive(Deserialize)]
pub struct InMessage {
    pub role: String,
    pub content: Content,
}

#[derive(Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Blocks(Vec<Block>),
}

/// A content block; fields not listed are ignored (`cache_control`, `citations`, ...).
#[derive(Deserialize)]
pub struct Block {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
    #[serde(default)]
    pub thinking: Option<String>,
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub input: Option<Value>,
    #[serde(default)]
    pub tool_use_id: Option<String>,
    #[serde(default)]
    pub content: Option<Content>,
    #[serde(default)]
    pub is_error: Option<bool>,
    /// An image's or document's data (`{"type": "base64", "media_type", "data"}`).
    #[serde(default)]
    pub source: Option<Value>,
    /// A document's title and context, given to the model before it.
    #[serde(default)]
    pub title: Option<String>,
    #[serde(default)]
    pub context: Option<String>,
    #[serde(default)]
    pub citations: Option<Value>,
}

/// `thinking`; `budget_tokens` is accepted but not enforced (the template's effort levels
/// steer the length of the reasoning instead).
#[derive(Deserialize)]
pub struct Thinking {
    #[serde(rename = "type")]
    pub kind: String,
}

#[derive(Deserialize, Default)]
pub struct OutputConfig {
    #[serde(default)]
    pub effort: Option<String>,
    #[serde(default)]
    pub format: Option<Value>,
}

impl Conversation {
    /// Whether the model reasons: only with `thinking` enabled or adaptive.
    pub fn thinking_on(&self) -> bool {
        matches!(
            self.thinking.as_ref().map(|t| t.kind.as_str()),
            Some("enabled" | "adaptive")
        )
    }

    /// Tool definitions in OpenAI's function form (the template's input).
    pub fn tools(&self) -> Vec<Value> {
        self.tools
            .iter()
            .flatten()
            .filter_map(|t| {
                // Server tools (web_search, bash_20250124, ...) have a `type` other than
                // `custom`; the model cannot run them here, so they are left out.
                let kind = t.get("type").and_then(Value::as_str).unwrap_or("custom");
                if kind != "custom" {
                    return None;
                }
                Some(json!({"type": "function", "function": {
                    "name": t.get("name")?,
                    "description": t.get("description").cloned().unwrap_or(Value::Null),
                    "parameters": t.get("input_schema").cloned().unwrap_or_else(|| json!({"type": "object"})),
                }}))
            })
            .collect()
    }

    /// The conversation as the chat path takes it. `tools_in_prompt`: whether the tools are
    /// shown to the model (not with `tool_choice: none`).
    pub fn chat_input(
        &self,
        tools_in_prompt: bool,
        default_effort: Option<&str>,
    ) -> Result<ChatInput, ApiError> {
        if let Some(t) = &self.thinking {
            if !matches!(t.kind.as_str(), "enabled" | "adaptive" | "disabled") {
                return Err(ApiError::invalid(
                    "thinking.type",
                    "thinking.type must be `enabled`, `adaptive` or `disabled`",
                ));
            }
        }
        let mut messages = Vec::new();
        if let Some(system) = &self.system {
            let text = match system {
                System::Text(t) => strip_volatile(t),
                System::Blocks(blocks) => blocks
                    .iter()
                    .filter(|b| b.kind == "text")
                    .filter_map(|b| b.text.as_deref().map(strip_volatile))
                    .filter(|t| !t.is_empty())
                    .collect::<Vec<_>>()
                    .join("\n\n"),
            };
            if !text.is_empty() {
                messages.push(json!({"role": "system", "content": text}));
            }
        }
        for (i, m) in self.messages.iter().enumerate() {
            match m.role.as_str() {
                "user" => user_messages(i, &m.content, &mut messages)?,
                "assistant" => messages.push(assistant_message(i, &m.content)?),
                // Claude Code 2.1 sends some instructions as system turns between the others.
                "system" => {
                    let text = strip_volatile(&block_text(&m.content));
                    if !text.is_empty() {
                        messages.push(json!({"role": "system", "content": text}));
                    }
                }
                other => {
                    return Err(ApiError::invalid(
                        &format!("messages[{i}].role"),
                        format!(
                        "unknown role `{other}`: Messages takes `user`, `assistant` and `system`"
                    ),
                    ))
                }
            }
        }
        let effort = if self.thinking_on() {
            self.output_config
                .as_ref()
                .and_then(|o| o.effort.clone())
                .or_else(|| default_effort.map(str::to_string))
        } else {
            Some("none".to_string())
        };
        let mut body = Map::new();
        body.insert("messages".into(), Value::Array(messages));
        if tools_in_prompt {
            body.insert("tools".into(), Value::Array(self.tools()));
        }
        if let Some(e) = effort {
            // Anthropic's scale has no `xhigh`; anything unknown maps to the template default.
            let e = if ["none", "minimal", "low", "medium", "high", "xhigh", "max"]
                .contains(&e.as_str())
            {
                e
            } else {
                "high".into()
            };
            body.insert("reasoning_effort".into(), e.into());
        }
        crate::json::typed(&Value::Object(body))
    }
}

fn strip_volatile(text: &str) -> String {
    text.lines()
        .filter(|l| {
            !VOLATILE_PREFIXES
                .iter()
                .any(|p| l.trim_start().starts_with(p))
        })
        .collect::<Vec<_>>()
        .join("\n")
        .trim()
        .to_string()
}

fn block_text(c: &Content) -> String {
    match c {
        Content::Text(t) => t.clone(),
        Content::Blocks(bs) => bs
            .iter()
            .filter_map(|b| b.text.clone())
            .collect::<Vec<_>>()
            .join("\n"),
    }
}

/// An `image` block as a chat `image_url` part (base64 sources only); `splash_at` keeps the
/// block's own path for errors found once the image is decoded.
fn image_part(b: &Block, at: &str) -> Result<Value, ApiError> {
    let source = b.source.as_ref().and_then(Value::as_object);
    let field = |k: &str| source.and_then(|s| s.get(k)).and_then(Value::as_str);
    match field("type") {
        Some("base64") => {
            let media = field("media_type").unwrap_or("image/png");
            let data = field("data").ok_or_else(|| {
                ApiError::invalid(
                    &format!("{at}.source.data"),
                    "a base64 image source needs `data`",
                )
            })?;
            Ok(json!({"type": "image_url", "image_url": {
                "url": format!("data:{media};base64,{data}"), "splash_at": at}}))
        }
        Some("url") => Err(ApiError::invalid(
            &format!("{at}.source"),
            "splash does not fetch image URLs: send the image as a base64 source",
        )),
        _ => Err(ApiError::invalid(
            &format!("{at}.source"),
            "an image block needs a source of type `base64` with `media_type` and `data`",
        )),
    }
}

/// The chat parts of a `document` block: its title and context as text, then a PDF (base64
/// source) as a `file` part, or a plain-text source as text.
fn document_parts(b: &Block, at: &str) -> Result<Vec<Value>, ApiError> {
    if b.citations
        .as_ref()
        .is_some_and(|c| c.get("enabled").and_then(Value::as_bool) == Some(true))
    {
        return Err(ApiError::invalid(
            &format!("{at}.citations"),
            "document citations are not supported: leave `citations` out",
        ));
    }
    let mut parts: Vec<Value> = [&b.title, &b.context]
        .into_iter()
        .flatten()
        .map(|t| json!({"type": "text", "text": format!("{t}\n")}))
        .collect();
    let source = b.source.as_ref().and_then(Value::as_object);
    let field = |k: &str| source.and_then(|s| s.get(k)).and_then(Value::as_str);
    let data = || {
        field("data").ok_or_else(|| {
            ApiError::invalid(
                &format!("{at}.source.data"),
                "a document source needs `data`",
            )
        })
    };
    match (field("type"), field("media_type")) {
        (Some("base64"), Some("application/pdf")) => parts.push(json!({"type": "file", "file": {
            "file_data": data()?, "splash_at": at}})),
        (Some("text"), _) => parts.push(json!({"type": "text", "text": format!("{}\n", data()?)})),
        (Some("url"), _) => {
            return Err(ApiError::invalid(
                &format!("{at}.source"),
                "splash does not fetch document URLs: send the PDF as a base64 source",
            ))
        }
        _ => {
            return Err(ApiError::invalid(
                &format!("{at}.source"),
                "a document needs a source of type `base64` with media_type `application/pdf`, or of type `text`",
            ))
        }
    }
    Ok(parts)
}

/// Chat content for text, image and document blocks in order: a string when there is no image (text
/// blocks joined by `sep`), else a list of parts.
fn content_parts(
    blocks: &[Block],
    at: &str,
    sep: &str,
    mut other: impl FnMut(usize, &Block) -> Result<(), ApiError>,
) -> Result<Value, ApiError> {
    let mut parts: Vec<Value> = Vec::new();
    let mut images = false;
    for (j, b) in blocks.iter().enumerate() {
        match b.kind.as_str() {
            "text" => {
                let text = b.text.as_deref().unwrap_or("");
                match parts.last_mut() {
                    Some(Value::Object(last)) if last["type"] == "text" => {
                        let joined = format!("{}{sep}{text}", last["text"].as_str().unwrap_or(""));
                        last.insert("text".into(), joined.into());
                    }
                    _ => parts.push(json!({"type": "text", "text": text})),
                }
            }
            "image" => {
                images = true;
                parts.push(image_part(b, &format!("{at}[{j}]"))?);
            }
            "document" => {
                images = true;
                parts.extend(document_parts(b, &format!("{at}[{j}]"))?);
            }
            _ => other(j, b)?,
        }
    }
    if images {
        return Ok(Value::Array(parts));
    }
    let text = parts
        .iter()
        .filter_map(|p| p["text"].as_str())
        .collect::<String>();
    Ok(Value::String(text))
}

/// A user turn: tool results become `tool` messages (in order), the rest one user message.
fn user_messages(i: usize, content: &Content, out: &mut Vec<Value>) -> Result<(), ApiError> {
    let blocks = match content {
        Content::Text(t) => {
            out.push(json!({"role": "user", "content": t}));
            return Ok(());
        }
        Content::Blocks(b) => b,
    };
    let at = format!("messages[{i}].content");
    let mut results = Vec::new();
    let content = content_parts(blocks, &at, "", |j, b| match b.kind.as_str() {
        "tool_result" => {
            let at = format!("{at}[{j}].content");
            let mut result = match &b.content {
                None => Value::String(String::new()),
                Some(Content::Text(t)) => Value::String(t.clone()),
                // Other blocks (search results, references...) carry no text the model reads.
                Some(Content::Blocks(inner)) => content_parts(inner, &at, "\n", |_, _| Ok(()))?,
            };
            if b.is_error == Some(true) {
                match &mut result {
                    Value::String(t) => *t = format!("Error: {t}"),
                    Value::Array(parts) => {
                        parts.insert(0, json!({"type": "text", "text": "Error: "}))
                    }
                    _ => {}
                }
            }
            results.push(json!({"role": "tool", "tool_call_id": b.tool_use_id, "content": result}));
            Ok(())
        }
        other => Err(ApiError::invalid(
            &format!("{at}[{j}].type"),
            format!("unsupported content block `{other}` in a user message"),
        )),
    })?;
    out.extend(results);
    let empty = match &content {
        Value::String(t) => t.is_empty(),
        _ => false,
    };
    if !empty {
        out.push(json!({"role": "user", "content": content}));
    }
    Ok(())
}

fn assistant_message(i: usize, content: &Content) -> Result<Value, ApiError> {
    let blocks = match content {
        Content::Text(t) => return Ok(json!({"role": "assistant", "content": t})),
        Content::Blocks(b) => b,
    };
    let (mut text, mut reasoning, mut calls) = (String::new(), String::new(), Vec::new());
    for (j, b) in blocks.iter().enumerate() {
        match b.kind.as_str() {
            "text" => text.push_str(b.text.as_deref().unwrap_or("")),
            "thinking" => reasoning.push_str(b.thinking.as_deref().unwrap_or("")),
            "redacted_thinking" => {}
            "tool_use" => calls.push(json!({
                "id": b.id,
                "type": "function",
                "function": {"name": b.name, "arguments": b.input.clone().unwrap_or_else(|| json!({}))},
            })),
            other => {
                return Err(ApiError::invalid(
                    &format!("messages[{i}].content[{j}].type"),
                    format!("unsupported content block `{other}` in an assistant message"),
                ))
            }
        }
    }
    let mut m = json!({"role": "assistant", "content": text});
    if !reasoning.is_empty() {
        m["reasoning_content"] = reasoning.into();
    }
    if !calls.is_empty() {
        m["tool_calls"] = Value::Array(calls);
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn billing_header_is_removed() {
        assert_eq!(
            strip_volatile(
                "x-anthropic-billing-header: cc_version=2.1; cch=8f3a1;\nYou are Claude Code."
            ),
            "You are Claude Code."
        );
    }

    #[test]
    fn system_turns_are_kept_in_place() {
        let c: Conversation = serde_json::from_value(json!({
            "system": "Be brief.",
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "system", "content": [{"type": "text", "text": "Agents: explore"}]},
                {"role": "user", "content": "go"},
            ],
        }))
        .unwrap();
        let input = c.chat_input(true, None).unwrap();
        let roles: Vec<&str> = input.messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "system", "user"]);
        let bad: Conversation =
            serde_json::from_value(json!({"messages": [{"role": "tool", "content": "x"}]}))
                .unwrap();
        assert!(bad.chat_input(true, None).is_err());
    }
}
