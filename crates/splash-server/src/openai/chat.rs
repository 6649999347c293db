//! `POST /v1/chat/completions`.

use std::time::Instant;

use axum::extract::State;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{
    collect, finish_reason, stream, submit, timings_json, usage_json, ChatInput, CommonFields,
    Item, StreamEnd,
};
use crate::constraint::{json_format, output_constraint, OutputConstraint, ToolChoice};
use crate::error::ApiError;
use crate::ids::new_id;
use crate::json::{typed, JsonObject};
use crate::output::{Message, OutputParser, Part};
use crate::reasoning::ReasoningSplitter;
use crate::routes::unix_now;
use crate::state::AppState;
use splash_engine::{Constraint, FinishReason};

/// Chat-only fields (the conversation itself is [`ChatInput`]).
#[derive(Deserialize)]
struct ChatFields {
    #[serde(default)]
    model: Option<String>,
    max_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
    response_format: Option<Value>,
    tool_choice: Option<Value>,
    parallel_tool_calls: Option<bool>,
}

/// The output constraint the request asks for: a JSON schema (`response_format`) or a forced
/// tool call (`tool_choice` `required` or a named function).
fn constraint(
    s: &AppState,
    fields: &ChatFields,
    tools: &[Value],
) -> Result<Option<OutputConstraint>, ApiError> {
    let format = match &fields.response_format {
        None | Some(Value::Null) => None,
        Some(rf) => match rf.get("type").and_then(Value::as_str) {
            Some("text") => None,
            Some("json_object") => Some(Constraint::JsonSchema(json!({"type": "object"}))),
            Some("json_schema") => {
                let schema = rf.pointer("/json_schema/schema").cloned().ok_or_else(|| {
                    ApiError::invalid(
                        "response_format.json_schema.schema",
                        "a json_schema response format needs `json_schema.schema`",
                    )
                })?;
                let strict = rf.pointer("/json_schema/strict") == Some(&Value::Bool(true));
                Some(json_format(schema, strict))
            }
            _ => {
                return Err(ApiError::invalid(
                    "response_format.type",
                    "response_format.type must be `text`, `json_object` or `json_schema`",
                ))
            }
        },
    };
    let auto = ToolChoice::Auto {
        parallel: fields.parallel_tool_calls != Some(false),
    };
    let choice = match &fields.tool_choice {
        None | Some(Value::Null) => auto,
        Some(Value::String(c)) if c == "auto" => auto,
        Some(Value::String(c)) if c == "none" => ToolChoice::None,
        Some(Value::String(c)) if c == "required" => ToolChoice::Forced(None),
        Some(v) => match v.pointer("/function/name").and_then(Value::as_str) {
            Some(name) => ToolChoice::Forced(Some(name.to_string())),
            None => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    "tool_choice must be `auto`, `none`, `required` or {\"type\": \"function\", \"function\": {\"name\": ...}}",
                ))
            }
        },
    };
    output_constraint(&s.model, format, "response_format", tools, tools, choice)
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
    let constraint = constraint(&s, &fields, input.tools.as_deref().unwrap_or_default())?;
    let mut input = input;
    if fields.tool_choice.as_ref().and_then(Value::as_str) == Some("none") {
        // `none`: the model must not call tools, so it is not shown them.
        input.tools = None;
    }
    let (prompt_text, images) = input.render(&s)?;
    let in_reasoning = ReasoningSplitter::prompt_opens_reasoning(&prompt_text);
    let grammar = crate::grammar_check::check(
        &s.model,
        &s.grammar_tables,
        constraint,
        in_reasoning,
        "response_format",
    )
    .await?;
    let (prompt, images) = crate::images::prompt_with_images(&s, prompt_text, images).await?;
    let request = common.engine_request(
        &s,
        prompt,
        images,
        fields.max_completion_tokens.or(fields.max_tokens),
        None,
        grammar,
    )?;
    let rx = submit(&s, request)?;
    let id = new_id("chatcmpl-");
    let created = unix_now();
    let tools: Vec<Value> = match fields.tool_choice.as_ref().and_then(Value::as_str) {
        Some("none") => Vec::new(),
        _ => input.tools.clone().unwrap_or_default(),
    };
    let mut parser = OutputParser::new(in_reasoning, &tools);
    if fields.parallel_tool_calls == Some(false) {
        parser = parser.single_call();
    }

    if !common.streaming() {
        let (text, usage) = collect(&s, rx, t0).await?;
        let mut m = Message::default();
        m.extend(parser.push(&text));
        m.extend(parser.finish());
        let mut message = json!({"role": "assistant", "content": m.text});
        if !m.reasoning.is_empty() {
            message["reasoning_content"] = m.reasoning.into();
        }
        let finish = chat_finish(&usage.finish, !m.calls.is_empty());
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
    Ok(stream(
        &s,
        rx,
        t0,
        initial,
        StreamEnd::openai(),
        move |item| match item {
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
                let finish = chat_finish(&u.finish, parser.num_calls() > 0);
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
        },
    ))
}

/// `finish_reason`: `tool_calls` when the answer calls tools, unless the output was cut short
/// (`length`, as OpenAI reports a call cut by `max_tokens`: its arguments are what was
/// generated of them).
fn chat_finish(finish: &FinishReason, called: bool) -> &'static str {
    match finish_reason(finish) {
        "length" => "length",
        _ if called => "tool_calls",
        other => other,
    }
}
