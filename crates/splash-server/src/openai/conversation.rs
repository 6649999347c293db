//! Chat messages → the model's chat template: roles, content parts, tool calls, reasoning
//! effort and `chat_template_kwargs`, as transformers' `apply_chat_template` receives them.

use serde::Deserialize;
use serde_json::{json, Map, Value};
use splash_model::TemplateInputs;

use crate::error::ApiError;
use crate::images::PromptImages;
use crate::state::AppState;

const EFFORTS: [&str; 7] = ["none", "minimal", "low", "medium", "high", "xhigh", "max"];

/// The conversation part of a chat request (also the body of `/apply-template`).
#[derive(Deserialize)]
pub struct ChatInput {
    pub messages: Vec<Message>,
    #[serde(default)]
    pub tools: Option<Vec<Value>>,
    #[serde(default)]
    pub reasoning_effort: Option<String>,
    #[serde(default)]
    pub chat_template_kwargs: Option<Map<String, Value>>,
    #[serde(default = "yes")]
    pub add_generation_prompt: bool,
}

fn yes() -> bool {
    true
}

/// One chat message.
#[derive(Deserialize)]
pub struct Message {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
    #[serde(default)]
    pub reasoning_content: Option<String>,
    #[serde(default)]
    pub tool_calls: Option<Vec<Value>>,
    #[serde(default)]
    pub tool_call_id: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
}

/// Message content: a string or a list of parts.
#[derive(Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<Part>),
}

/// A content part (`{"type": "text", "text": ...}`, `{"type": "image_url", "image_url": {"url":
/// ...}}`).
#[derive(Deserialize)]
pub struct Part {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
    /// A URL string, or `{"url": ..., "detail": ...}`.
    #[serde(default)]
    pub image_url: Option<Value>,
    /// A `file` part's `{"file_data": "data:application/pdf;base64,...", "filename": ...}`.
    #[serde(default)]
    pub file: Option<Value>,
}

impl ChatInput {
    /// The template variables for this conversation; its images go to `images`, each
    /// leaving its marker in the text.
    pub fn template_inputs(
        &self,
        s: &AppState,
        images: &mut PromptImages,
    ) -> Result<TemplateInputs, ApiError> {
        if self.messages.is_empty() {
            return Err(ApiError::invalid(
                "messages",
                "messages must contain at least one message",
            ));
        }
        let mut messages = Vec::with_capacity(self.messages.len());
        for (i, m) in self.messages.iter().enumerate() {
            let role = match m.role.as_str() {
                "developer" => "system",
                r @ ("system" | "user" | "assistant" | "tool") => r,
                other => {
                    return Err(ApiError::invalid(
                        &format!("messages[{i}].role"),
                        format!(
                        "unknown role `{other}`: use system, developer, user, assistant or tool"
                    ),
                    ))
                }
            };
            let content = match &m.content {
                None => Value::Null,
                Some(Content::Text(t)) => Value::String(t.clone()),
                Some(Content::Parts(parts)) => {
                    let mut text = String::new();
                    for (j, p) in parts.iter().enumerate() {
                        match (p.kind.as_str(), &p.text) {
                            ("text" | "input_text" | "output_text", Some(t)) => text.push_str(t),
                            ("text" | "input_text" | "output_text", None) => {
                                return Err(ApiError::invalid(&format!("messages[{i}].content[{j}].text"), "a text part needs `text`"))
                            }
                            ("image_url", _) => {
                                let at = format!("messages[{i}].content[{j}].image_url");
                                text.push_str(&image_part(s, role, &at, p, images)?);
                            }
                            ("file", _) => {
                                let at = format!("messages[{i}].content[{j}].file");
                                text.push_str(&file_part(s, role, &at, p, images)?);
                            }
                            (kind, _) => {
                                return Err(ApiError::invalid(
                                    &format!("messages[{i}].content[{j}].type"),
                                    format!("content parts of type `{kind}` are not supported: send text, image_url and file (PDF) parts"),
                                ))
                            }
                        }
                    }
                    Value::String(text)
                }
            };
            let mut msg = json!({"role": role, "content": content});
            if let Some(r) = &m.reasoning_content {
                msg["reasoning_content"] = r.clone().into();
            }
            if let Some(calls) = &m.tool_calls {
                msg["tool_calls"] =
                    Value::Array(calls.iter().map(tool_call_for_template).collect());
            }
            if let Some(id) = &m.tool_call_id {
                msg["tool_call_id"] = id.clone().into();
            }
            if let Some(n) = &m.name {
                msg["name"] = n.clone().into();
            }
            messages.push(msg);
        }
        merge_leading_system(&mut messages);
        later_system_as_user(&mut messages);
        let mut extra = Map::new();
        let effort = self
            .reasoning_effort
            .clone()
            .or_else(|| s.config.default_reasoning_effort.clone());
        if let Some(e) = effort {
            if !EFFORTS.contains(&e.as_str()) {
                return Err(ApiError::invalid(
                    "reasoning_effort",
                    format!(
                        "unknown reasoning_effort `{e}`: use one of {}",
                        EFFORTS.join(", ")
                    ),
                ));
            }
            if e == "none" {
                extra.insert("enable_thinking".into(), false.into());
            } else {
                extra.insert("enable_thinking".into(), true.into());
                extra.insert("reasoning_effort".into(), e.into());
            }
        }
        // chat_template_kwargs win over reasoning_effort.
        if let Some(kw) = &self.chat_template_kwargs {
            for (k, v) in kw {
                extra.insert(k.clone(), v.clone());
            }
        }
        Ok(TemplateInputs {
            messages: Value::Array(messages),
            tools: self
                .tools
                .clone()
                .filter(|t| !t.is_empty())
                .map(Value::Array),
            add_generation_prompt: self.add_generation_prompt,
            extra,
        })
    }

    /// The rendered prompt text, with a marker for each of its images.
    pub fn render(&self, s: &AppState) -> Result<(String, PromptImages), ApiError> {
        let Some(template) = &s.model.template else {
            return Err(ApiError::bad_request(
                "this model has no chat template (chat_template.jinja or tokenizer_config.json): use /v1/completions with a raw prompt",
            ));
        };
        let mut images = PromptImages::default();
        let inputs = self.template_inputs(s, &mut images)?;
        let text = template.render(&inputs).map_err(|e| {
            ApiError::bad_request(format!("the chat template rejected these messages: {e}"))
        })?;
        Ok((text, images))
    }
}

/// The marker of an `image_url` part at `at` of a `role` message, its image taken into
/// `images`.
fn image_part(
    s: &AppState,
    role: &str,
    at: &str,
    part: &Part,
    images: &mut PromptImages,
) -> Result<String, ApiError> {
    vision_allowed(s, role, at, "images")?;
    let (url, at) = match &part.image_url {
        Some(Value::String(u)) => (u.as_str(), at),
        // Converted from another API's block, which named its own path.
        Some(Value::Object(o)) => (
            o.get("url").and_then(Value::as_str).unwrap_or(""),
            o.get("splash_at").and_then(Value::as_str).unwrap_or(at),
        ),
        _ => ("", at),
    };
    if url.is_empty() {
        return Err(ApiError::invalid(
            at,
            "an image_url part needs `image_url.url`: a base64 data URL (`data:image/png;base64,...`)",
        ));
    }
    images.push_url(at, url)
}

/// The marker of a `file` part (an inline PDF) at `at` of a `role` message, its file taken
/// into `images`.
fn file_part(
    s: &AppState,
    role: &str,
    at: &str,
    part: &Part,
    images: &mut PromptImages,
) -> Result<String, ApiError> {
    let file = part.file.as_ref().and_then(Value::as_object);
    // Converted from another API's block, which named its own path.
    let at = file
        .and_then(|f| f.get("splash_at"))
        .and_then(Value::as_str)
        .unwrap_or(at);
    vision_allowed(s, role, at, "PDFs")?;
    let field = |k: &str| file.and_then(|f| f.get(k));
    if field("file_id").is_some_and(|v| !v.is_null())
        || field("file_url").is_some_and(|v| !v.is_null())
    {
        return Err(ApiError::invalid(
            at,
            "splash has no file storage and fetches no URLs: send the PDF inline as `file_data` (`data:application/pdf;base64,...`)",
        ));
    }
    match field("file_data").and_then(Value::as_str) {
        Some(data) => images.push_pdf(at, data),
        None => Err(ApiError::invalid(
            at,
            "a file part needs `file.file_data`: the PDF as base64 or `data:application/pdf;base64,...`",
        )),
    }
}

/// The 400 for `what` (images, PDFs) in a `role` message or on a model without vision.
fn vision_allowed(s: &AppState, role: &str, at: &str, what: &str) -> Result<(), ApiError> {
    if !matches!(role, "user" | "tool") {
        return Err(ApiError::invalid(
            at,
            format!("{what} may be sent in user and tool messages, not in a {role} message: move it to a user message"),
        ));
    }
    if s.vision.is_none() {
        return Err(ApiError::invalid(
            at,
            "this model reads text only (it has no vision tower, or the server runs with --language-only): send text",
        ));
    }
    Ok(())
}

/// OpenAI sends tool-call arguments as a JSON string; templates expect the object.
fn tool_call_for_template(call: &Value) -> Value {
    let mut call = call.clone();
    if let Some(args) = call.pointer_mut("/function/arguments") {
        if let Some(parsed) = args
            .as_str()
            .and_then(|a| serde_json::from_str::<Value>(a).ok())
            .filter(Value::is_object)
        {
            *args = parsed;
        }
    }
    call
}

/// Coding agents send their instructions as several system / developer messages (Codex: two
/// developer messages; OpenCode: two system messages), but Qwen templates take one system
/// message, first. The leading run is joined into one, in order.
fn merge_leading_system(messages: &mut Vec<Value>) {
    let lead = messages
        .iter()
        .take_while(|m| m["role"] == "system" && m["content"].is_string())
        .count();
    if lead < 2 {
        return;
    }
    let text = messages[..lead]
        .iter()
        .filter_map(|m| m["content"].as_str())
        .filter(|t| !t.is_empty())
        .collect::<Vec<_>>()
        .join("\n\n");
    messages.splice(..lead, [json!({"role": "system", "content": text})]);
}

/// Qwen templates refuse a system message after the first turn, but agents send them (Claude
/// Code's system turns, Codex's developer messages mid-session). Such a message becomes a user
/// turn in place, marked as a system reminder, so the prompt prefix before it stays the same.
fn later_system_as_user(messages: &mut [Value]) {
    for m in messages.iter_mut().skip(1) {
        if m["role"] == "system" {
            let text = m["content"].as_str().unwrap_or_default();
            *m = json!({"role": "user", "content": format!("<system-reminder>\n{text}\n</system-reminder>")});
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leading_system_messages_are_joined() {
        let mut m = vec![
            json!({"role": "system", "content": "a"}),
            json!({"role": "system", "content": ""}),
            json!({"role": "system", "content": "b"}),
            json!({"role": "user", "content": "hi"}),
            json!({"role": "system", "content": "later"}),
        ];
        merge_leading_system(&mut m);
        assert_eq!(m.len(), 3);
        assert_eq!(m[0], json!({"role": "system", "content": "a\n\nb"}));
        assert_eq!(m[1]["role"], "user");
        assert_eq!(m[2]["content"], "later");
        later_system_as_user(&mut m);
        assert_eq!(
            m[2],
            json!({"role": "user", "content": "<system-reminder>\nlater\n</system-reminder>"})
        );
        let mut one = vec![json!({"role": "system", "content": "a"})];
        merge_leading_system(&mut one);
        assert_eq!(one, vec![json!({"role": "system", "content": "a"})]);
    }
}
