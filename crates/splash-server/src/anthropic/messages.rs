//! `POST /v1/messages` and `POST /v1/messages/count_tokens`.

use std::time::Instant;

use axum::extract::State;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use splash_engine::FinishReason;

use super::convert::Conversation;
use crate::constraint::{self, json_format, output_constraint};
use crate::error::{AnthropicError, ApiError};
use crate::ids::new_id;
use crate::images::{prompt_token_ids, prompt_with_images, PromptImages};
use crate::json::{typed, JsonObject};
use crate::openai::{collect, stream, submit, CommonFields, Item, Stop, StreamEnd};
use crate::output::{Message, OutputParser, Part};
use crate::reasoning::ReasoningSplitter;
use crate::state::AppState;
use crate::tool_calls::arguments_value;
use crate::worker::Usage;

#[derive(Deserialize)]
struct MessagesFields {
    model: String,
    max_tokens: u64,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    stop_sequences: Option<Vec<String>>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i64>,
    /// Not in Anthropic's API: keep generating through EOS (tests, benchmarks).
    ignore_eos: Option<bool>,
    #[serde(default)]
    tool_choice: Option<ToolChoice>,
}

#[derive(Deserialize)]
struct ToolChoice {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    disable_parallel_tool_use: bool,
}

/// The model name to answer with: Claude Code's `claude-*` names mean the served model.
fn resolve(s: &AppState, model: &str) -> Result<String, ApiError> {
    if model.starts_with("claude") {
        Ok(model.to_string())
    } else {
        s.resolve_model(Some(model))
    }
}

/// The prompt text for a Messages request, and its images.
fn render(
    s: &AppState,
    conv: &Conversation,
    tools_in_prompt: bool,
) -> Result<(String, PromptImages), ApiError> {
    conv.chat_input(
        tools_in_prompt,
        s.config.default_reasoning_effort.as_deref(),
    )?
    .render(s)
}

pub async fn count_tokens(
    State(s): State<AppState>,
    body: Result<JsonObject, ApiError>,
) -> Result<Json<Value>, AnthropicError> {
    let JsonObject(body) = body?;
    let conv: Conversation = typed(&body)?;
    if let Some(m) = body.get("model").and_then(Value::as_str) {
        resolve(&s, m)?;
    }
    let (prompt, images) = render(&s, &conv, true)?;
    let n = prompt_token_ids(&s, prompt, images).await?.len();
    Ok(Json(json!({"input_tokens": n})))
}

pub async fn handle(
    State(s): State<AppState>,
    body: Result<JsonObject, ApiError>,
) -> Result<Response, AnthropicError> {
    let t0 = Instant::now();
    let JsonObject(body) = body?;
    let f: MessagesFields = typed(&body)?;
    let conv: Conversation = typed(&body)?;
    let model = resolve(&s, &f.model)?;
    if f.max_tokens == 0 {
        return Err(ApiError::invalid("max_tokens", "max_tokens must be at least 1").into());
    }
    let tools = conv.tools();
    let choice = f
        .tool_choice
        .as_ref()
        .map(|c| c.kind.as_str())
        .unwrap_or("auto");
    let parallel = !f
        .tool_choice
        .as_ref()
        .is_some_and(|c| c.disable_parallel_tool_use);
    let tool_choice = match choice {
        "auto" => constraint::ToolChoice::Auto { parallel },
        "none" => constraint::ToolChoice::None,
        "any" => constraint::ToolChoice::Forced(None),
        "tool" => constraint::ToolChoice::Forced(Some(
            f.tool_choice
                .as_ref()
                .and_then(|c| c.name.clone())
                .ok_or_else(|| {
                    ApiError::invalid(
                        "tool_choice.name",
                        "tool_choice of type `tool` needs `name`",
                    )
                })?,
        )),
        other => {
            return Err(ApiError::invalid(
                "tool_choice.type",
                format!("unknown tool_choice type `{other}`: use auto, any, tool or none"),
            )
            .into())
        }
    };
    let format = conv
        .output_config
        .as_ref()
        .and_then(|o| o.format.clone())
        .filter(|v| !v.is_null());
    let format = match format {
        None => None,
        Some(fmt) => match fmt.get("type").and_then(Value::as_str) {
            // Anthropic's structured outputs are always strict: no undeclared keys.
            Some("json_schema") => Some(json_format(
                fmt.get("schema")
                    .cloned()
                    .unwrap_or_else(|| json!({"type": "object"})),
                true,
            )),
            _ => {
                return Err(ApiError::invalid(
                    "output_config.format.type",
                    "output_config.format.type must be `json_schema`",
                )
                .into())
            }
        },
    };
    let constraint = output_constraint(
        &s.model,
        format,
        "output_config.format",
        &tools,
        conv.tools.as_deref().unwrap_or_default(),
        tool_choice,
    )?;
    let (prompt_text, images) = render(&s, &conv, choice != "none")?;
    let in_reasoning = ReasoningSplitter::prompt_opens_reasoning(&prompt_text);
    let (prompt, images) = prompt_with_images(&s, prompt_text, images).await?;
    // Messages clamps max_tokens to the context instead of refusing the request.
    let room = s.max_context.saturating_sub(prompt.len());
    let clamped = f.max_tokens > room as u64;
    let common = CommonFields {
        temperature: f.temperature,
        ignore_eos: f.ignore_eos,
        top_p: f.top_p,
        top_k: f.top_k,
        stop: f.stop_sequences.clone().map(Stop::Many),
        ..CommonFields::default()
    };
    let grammar = crate::grammar_check::check(
        &s.model,
        &s.grammar_tables,
        constraint,
        in_reasoning,
        "output_config.format",
    )
    .await?;
    let input_tokens = prompt.len();
    let request = common.engine_request(
        &s,
        prompt,
        images,
        Some(f.max_tokens.min(room as u64)),
        None,
        grammar,
    )?;
    let rx = submit(&s, request)?;
    let id = new_id("msg_");
    let parse_tools = if choice == "none" { Vec::new() } else { tools };
    let mut parser = OutputParser::new(in_reasoning, &parse_tools);
    if !parallel {
        parser = parser.single_call();
    }

    if !f.stream {
        let (text, usage) = collect(&s, rx, t0).await?;
        let mut m = Message::default();
        m.extend(parser.push(&text));
        m.extend(parser.finish());
        let mut content = Vec::new();
        if !m.reasoning.is_empty() {
            content.push(json!({"type": "thinking", "thinking": m.reasoning, "signature": ""}));
        }
        if !m.text.is_empty() {
            content.push(json!({"type": "text", "text": m.text}));
        }
        for (cid, name, args) in &m.calls {
            // A call cut by max_tokens keeps what can be read of its arguments.
            let input = arguments_value(args);
            content.push(
                json!({"type": "tool_use", "id": tool_use_id(cid), "name": name, "input": input}),
            );
        }
        let (stop_reason, stop_sequence) = stop_reason(&usage, !m.calls.is_empty(), clamped);
        return Ok(Json(json!({
            "id": id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": stop_sequence,
            "usage": usage_json(&usage),
        }))
        .into_response());
    }

    let event = |name: &str, v: Value| Event::default().event(name).data(v.to_string());
    let initial = vec![
        event(
            "message_start",
            json!({"type": "message_start", "message": {
                "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
                "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": input_tokens, "output_tokens": 0, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
            }}),
        ),
        event("ping", json!({"type": "ping"})),
    ];
    // The open content block: (index, kind).
    let mut open: Option<(usize, &'static str)> = None;
    let mut next = 0usize;
    let end = StreamEnd {
        done: None,
        error: |e| {
            Event::default()
                .event("error")
                .data(AnthropicError(e).body().to_string())
        },
    };
    let mut blocks = move |part: Option<Part>, events: &mut Vec<Event>| {
        let want = match &part {
            Some(Part::Reasoning(_)) => Some("thinking"),
            Some(Part::Text(_)) => Some("text"),
            Some(Part::CallStart { .. }) => Some("tool_use"),
            Some(Part::CallArgs { .. }) => None, // continues the open tool_use block
            None => None,
        };
        let switch = matches!(part, Some(Part::CallStart { .. }) | None)
            || (want.is_some() && open.map(|o| o.1) != want);
        if switch {
            if let Some((i, kind)) = open.take() {
                if kind == "thinking" {
                    events.push(event(
                        "content_block_delta",
                        json!({"type": "content_block_delta", "index": i,
                        "delta": {"type": "signature_delta", "signature": ""}}),
                    ));
                }
                events.push(event(
                    "content_block_stop",
                    json!({"type": "content_block_stop", "index": i}),
                ));
            }
            if let Some(kind) = want {
                let block = match &part {
                    Some(Part::CallStart { id, name, .. }) => {
                        json!({"type": "tool_use", "id": tool_use_id(id), "name": name, "input": {}})
                    }
                    Some(Part::Reasoning(_)) => {
                        json!({"type": "thinking", "thinking": "", "signature": ""})
                    }
                    _ => json!({"type": "text", "text": ""}),
                };
                events.push(event(
                    "content_block_start",
                    json!({"type": "content_block_start", "index": next, "content_block": block}),
                ));
                open = Some((next, kind));
                next += 1;
            }
        }
        let i = open.map(|o| o.0).unwrap_or(0);
        let delta = match part {
            Some(Part::Reasoning(t)) => json!({"type": "thinking_delta", "thinking": t}),
            Some(Part::Text(t)) => json!({"type": "text_delta", "text": t}),
            Some(Part::CallArgs { delta, .. }) => {
                json!({"type": "input_json_delta", "partial_json": delta})
            }
            Some(Part::CallStart { .. }) | None => return,
        };
        events.push(event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": i, "delta": delta}),
        ));
    };
    Ok(stream(&s, rx, t0, initial, end, move |item| {
        let mut events = Vec::new();
        match item {
            Item::Text(t) => {
                for p in parser.push(&t) {
                    blocks(Some(p), &mut events);
                }
            }
            Item::Done(u) => {
                for p in parser.finish() {
                    blocks(Some(p), &mut events);
                }
                blocks(None, &mut events);
                let (reason, seq) = stop_reason(&u, parser.num_calls() > 0, clamped);
                events.push(event("message_delta", json!({"type": "message_delta",
                    "delta": {"stop_reason": reason, "stop_sequence": seq},
                    "usage": {"input_tokens": u.prompt_tokens, "output_tokens": u.completion_tokens}})));
                events.push(event("message_stop", json!({"type": "message_stop"})));
            }
        }
        events
    }))
}

fn tool_use_id(call_id: &str) -> String {
    format!("toolu_{}", call_id.trim_start_matches("call_"))
}

fn usage_json(u: &Usage) -> Value {
    json!({
        // Anthropic counts cache reads apart from `input_tokens`.
        "input_tokens": u.prompt_tokens - u.cached_tokens,
        "output_tokens": u.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": u.cached_tokens,
    })
}

/// `stop_reason` and `stop_sequence`. A cut wins over `tool_use`, as in Anthropic's API: a
/// `tool_use` block cut by `max_tokens` comes with `stop_reason: max_tokens`.
fn stop_reason(u: &Usage, called: bool, clamped: bool) -> (&'static str, Option<String>) {
    match &u.finish {
        FinishReason::Length if clamped => ("model_context_window_exceeded", None),
        FinishReason::ContextFull => ("model_context_window_exceeded", None),
        FinishReason::Length => ("max_tokens", None),
        _ if called => ("tool_use", None),
        FinishReason::StopString(s) => ("stop_sequence", Some(s.clone())),
        FinishReason::Eos(_)
        | FinishReason::GrammarEnd
        | FinishReason::Failed(_)
        | FinishReason::Scored => ("end_turn", None),
    }
}
