//! `POST /v1/chat/completions`.

use std::time::Instant;

use axum::extract::State;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{
    collect, finish_reason, new_id, stream, submit, timings_json, usage_json, ChatInput,
    CommonFields, Item,
};
use crate::error::ApiError;
use crate::json::{typed, JsonObject};
use crate::output::{Message, OutputParser, Part};
use crate::reasoning::ReasoningSplitter;
use crate::routes::unix_now;
use crate::state::AppState;

/// Chat-only fields (the conversation itself is [`ChatInput`]).
#[derive(Deserialize)]
struct ChatFields {
    #[serde(default)]
    model: Option<String>,
    max_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
    response_format: Option<Value>,
    tool_choice: Option<Value>,
}

pub async fn handle(
    State(s): State<AppState>,
    JsonObject(body): JsonObject,
) -> Result<Response, ApiError> {
    let t0 = Instant::now();
    let fields: ChatFields = typed(&body)?;
    let input: ChatInput = typed(&body)?;
    let common: CommonFields = typed(&body)?;
    let model = s.resolve_model(fields.model.as_deref())?;
    common.check_supported()?;
    if let Some(rf) = &fields.response_format {
        if rf.get("type").and_then(Value::as_str) != Some("text") {
            return Err(ApiError::invalid(
                "response_format",
                "structured output (json_object / json_schema) is not available on this server yet; remove response_format",
            ));
        }
    }
    match fields.tool_choice.as_ref() {
        None | Some(Value::Null) => {}
        Some(Value::String(c)) if c == "auto" || c == "none" => {}
        Some(_) => {
            return Err(ApiError::invalid(
                "tool_choice",
                "forcing a tool call (`required` or a named tool) needs constrained decoding, which this server does not have yet; use `auto`",
            ))
        }
    }
    let prompt_text = input.render(&s)?;
    let in_reasoning = ReasoningSplitter::prompt_opens_reasoning(&prompt_text);
    let prompt = s
        .model
        .tokenizer
        .encode(&prompt_text)
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let request = common.engine_request(
        &s,
        prompt,
        fields.max_completion_tokens.or(fields.max_tokens),
        None,
    )?;
    let rx = submit(&s, request)?;
    let id = new_id("chatcmpl");
    let created = unix_now();
    let tools: Vec<Value> = match fields.tool_choice.as_ref().and_then(Value::as_str) {
        Some("none") => Vec::new(),
        _ => input.tools.clone().unwrap_or_default(),
    };
    let mut parser = OutputParser::new(in_reasoning, &tools);

    if !common.streaming() {
        let (text, usage) = collect(&s, rx, t0).await?;
        let mut m = Message::default();
        m.extend(parser.push(&text));
        m.extend(parser.finish());
        let mut message = json!({"role": "assistant", "content": m.text});
        if !m.reasoning.is_empty() {
            message["reasoning_content"] = m.reasoning.into();
        }
        let finish = if m.calls.is_empty() {
            finish_reason(&usage.finish)
        } else {
            "tool_calls"
        };
        if !m.calls.is_empty() {
            if message["content"] == "" {
                message["content"] = Value::Null;
            }
            message["tool_calls"] = m
                .calls
                .iter()
                .map(|(id, name, args)| json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}}))
                .collect();
        }
        return Ok(Json(json!({
            "id": id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": finish}],
            "usage": usage_json(&usage),
            "timings": timings_json(&usage),
        }))
        .into_response());
    }

    let include_usage = common.include_usage();
    let chunk = move |delta: Value, finish: Option<&str>| -> Value {
        let mut c = json!({
            "id": id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
        });
        if include_usage {
            c["usage"] = Value::Null;
        }
        c
    };
    let event = |v: Value| Event::default().data(v.to_string());
    let initial = vec![event(chunk(
        json!({"role": "assistant", "content": ""}),
        None,
    ))];
    let delta = |p: Part| match p {
        Part::Reasoning(t) => json!({"reasoning_content": t}),
        Part::Text(t) => json!({"content": t}),
        Part::CallStart { index, id, name } => json!({"tool_calls": [{
            "index": index, "id": id, "type": "function", "function": {"name": name, "arguments": ""}}]}),
        Part::CallArgs { index, delta } => {
            json!({"tool_calls": [{"index": index, "function": {"arguments": delta}}]})
        }
    };
    Ok(stream(&s, rx, t0, initial, move |item| match item {
        Item::Text(t) => parser
            .push(&t)
            .into_iter()
            .map(|p| event(chunk(delta(p), None)))
            .collect(),
        Item::Done(u) => {
            let mut events: Vec<Event> = parser
                .finish()
                .into_iter()
                .map(|p| event(chunk(delta(p), None)))
                .collect();
            let finish = if parser.num_calls() > 0 {
                "tool_calls"
            } else {
                finish_reason(&u.finish)
            };
            let mut last = chunk(json!({}), Some(finish));
            last["timings"] = timings_json(&u);
            events.push(event(last));
            if include_usage {
                let mut usage = chunk(json!({}), None);
                usage["choices"] = json!([]);
                usage["usage"] = usage_json(&u);
                events.push(event(usage));
            }
            events
        }
    }))
}
