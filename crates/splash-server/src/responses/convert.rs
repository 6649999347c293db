//! Responses input items → chat messages, and output parts → Responses output items.

use serde_json::{json, Value};

use crate::error::ApiError;

/// Function tools in chat form; tools of other types (`web_search`, `file_search`, ...)
/// cannot run here and are skipped.
pub fn tools(tools: &[Value]) -> Vec<Value> {
    tools
        .iter()
        .filter(|t| t.get("type").and_then(Value::as_str) == Some("function"))
        .filter_map(|t| {
            Some(json!({"type": "function", "function": {
                "name": t.get("name")?,
                "description": t.get("description").cloned().unwrap_or(Value::Null),
                "parameters": t.get("parameters").cloned().unwrap_or_else(|| json!({"type": "object"})),
            }}))
        })
        .collect()
}

fn text_of(content: &Value, at: &str) -> Result<String, ApiError> {
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut text = String::new();
            for (j, p) in parts.iter().enumerate() {
                match p.get("type").and_then(Value::as_str) {
                    Some("input_text" | "output_text" | "text" | "summary_text" | "reasoning_text") => {
                        text.push_str(p.get("text").and_then(Value::as_str).unwrap_or(""))
                    }
                    Some("refusal") => text.push_str(p.get("refusal").and_then(Value::as_str).unwrap_or("")),
                    other => {
                        return Err(ApiError::invalid(
                            &format!("{at}[{j}].type"),
                            format!("content of type {other:?} is not supported: this model reads text only"),
                        ))
                    }
                }
            }
            Ok(text)
        }
        Value::Null => Ok(String::new()),
        _ => Err(ApiError::invalid(
            at,
            "content must be a string or a list of content parts",
        )),
    }
}

/// Message content as chat content: a string, or where it holds `input_image` or `input_file`
/// parts, a list of chat parts (text, `image_url` and `file`, each keeping its own path for
/// errors).
fn content_of(content: &Value, at: &str) -> Result<Value, ApiError> {
    let Value::Array(parts) = content else {
        return Ok(Value::String(text_of(content, at)?));
    };
    let is_image = |p: &Value| {
        matches!(
            p.get("type").and_then(Value::as_str),
            Some("input_image" | "input_file")
        )
    };
    if !parts.iter().any(is_image) {
        return Ok(Value::String(text_of(content, at)?));
    }
    let mut out = Vec::new();
    for (j, p) in parts.iter().enumerate() {
        let here = format!("{at}[{j}]");
        if !is_image(p) {
            let text = text_of(&Value::Array(vec![p.clone()]), at).map_err(|mut e| {
                e.param = Some(format!("{here}.type"));
                e
            })?;
            out.push(json!({"type": "text", "text": text}));
            continue;
        }
        if p.get("type").and_then(Value::as_str) == Some("input_file") {
            let mut file = p.clone();
            file["splash_at"] = here.clone().into();
            out.push(json!({"type": "file", "file": file}));
            continue;
        }
        match p.get("image_url").and_then(Value::as_str) {
            Some(url) => out.push(json!({"type": "image_url", "image_url": {
                "url": url, "splash_at": format!("{here}.image_url")}})),
            None => {
                return Err(ApiError::invalid(
                    &here,
                    "an input_image needs `image_url` with a base64 data URL (`data:image/png;base64,...`); file_id is not supported",
                ))
            }
        }
    }
    Ok(Value::Array(out))
}

/// Input items (or a plain string) → chat messages.
pub fn messages(input: &Value) -> Result<Vec<Value>, ApiError> {
    let items = match input {
        Value::String(s) => return Ok(vec![json!({"role": "user", "content": s})]),
        Value::Array(items) => items,
        _ => {
            return Err(ApiError::invalid(
                "input",
                "input must be a string or a list of items",
            ))
        }
    };
    let mut out: Vec<Value> = Vec::new();
    let mut reasoning: Option<String> = None;
    for (i, item) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        let kind = item
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("message");
        match kind {
            "message" => {
                let role = item.get("role").and_then(Value::as_str).unwrap_or("user");
                let content = content_of(item.get("content").unwrap_or(&Value::Null), &format!("{at}.content"))?;
                let mut m = json!({"role": role, "content": content});
                if role == "assistant" {
                    if let Some(r) = reasoning.take() {
                        m["reasoning_content"] = r.into();
                    }
                }
                out.push(m);
            }
            "function_call" => {
                let call = json!({
                    "id": item.get("call_id"),
                    "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments").cloned().unwrap_or_else(|| json!("{}"))},
                });
                // Calls join the assistant turn they belong to.
                match out.last_mut() {
                    Some(last) if last["role"] == "assistant" => {
                        let calls = last.as_object_mut().expect("message object").entry("tool_calls").or_insert_with(|| json!([]));
                        calls.as_array_mut().expect("tool_calls list").push(call);
                    }
                    _ => {
                        let mut m = json!({"role": "assistant", "content": "", "tool_calls": [call]});
                        if let Some(r) = reasoning.take() {
                            m["reasoning_content"] = r.into();
                        }
                        out.push(m);
                    }
                }
            }
            "function_call_output" => {
                let output = match item.get("output") {
                    Some(Value::String(s)) => Value::String(s.clone()),
                    Some(v @ Value::Array(_)) => content_of(v, &format!("{at}.output"))?,
                    Some(v) => Value::String(v.to_string()),
                    None => Value::String(String::new()),
                };
                out.push(json!({"role": "tool", "tool_call_id": item.get("call_id"), "content": output}));
            }
            "reasoning" => {
                let text = match item.get("content") {
                    Some(c @ Value::Array(_)) => text_of(c, &format!("{at}.content"))?,
                    _ => text_of(item.get("summary").unwrap_or(&Value::Null), &format!("{at}.summary"))?,
                };
                reasoning = Some(text);
            }
            other => {
                return Err(ApiError::invalid(
                    &format!("{at}.type"),
                    format!("input items of type `{other}` are not supported: send message, function_call, function_call_output and reasoning items"),
                ))
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_to_messages() {
        let input = json!([
            {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Need the tool."}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"},
            {"type": "function_call_output", "call_id": "c1", "output": "4C"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "It is 4C."}]}
        ]);
        let m = messages(&input).unwrap();
        assert_eq!(m.len(), 4);
        assert_eq!(m[1]["reasoning_content"], "Need the tool.");
        assert_eq!(m[1]["tool_calls"][0]["function"]["name"], "get_weather");
        assert_eq!(
            (m[2]["role"].as_str(), m[2]["tool_call_id"].as_str()),
            (Some("tool"), Some("c1"))
        );
        assert!(messages(&json!([{"type": "computer_call"}])).is_err());
    }
}
