//! `POST /v1/responses`, `GET /v1/responses/{id}`, `DELETE /v1/responses/{id}`.

use std::time::Instant;

use axum::extract::{Path, State};
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use splash_engine::{Constraint, FinishReason};

use super::convert;
use crate::constraint::{json_format, output_constraint, ToolChoice};
use crate::error::ApiError;
use crate::ids::new_id;
use crate::json::{typed, JsonObject};
use crate::openai::{collect, stream, submit, ChatInput, CommonFields, Item, StreamEnd};
use crate::output::{OutputParser, Part};
use crate::reasoning::ReasoningSplitter;
use crate::routes::unix_now;
use crate::state::AppState;
use crate::worker::Usage;

#[derive(Deserialize)]
struct Fields {
    #[serde(default)]
    model: Option<String>,
    input: Value,
    #[serde(default)]
    instructions: Option<String>,
    #[serde(default)]
    tools: Option<Vec<Value>>,
    #[serde(default)]
    tool_choice: Option<Value>,
    #[serde(default)]
    parallel_tool_calls: Option<bool>,
    #[serde(default)]
    reasoning: Option<Reasoning>,
    #[serde(default)]
    text: Option<TextConfig>,
    max_output_tokens: Option<u64>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    /// Not in OpenAI's API: keep generating through EOS (tests, benchmarks).
    ignore_eos: Option<bool>,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    store: Option<bool>,
    #[serde(default)]
    previous_response_id: Option<String>,
    #[serde(default)]
    metadata: Option<Value>,
    #[serde(default)]
    background: Option<bool>,
}

#[derive(Deserialize)]
struct Reasoning {
    #[serde(default)]
    effort: Option<String>,
}

#[derive(Deserialize)]
struct TextConfig {
    #[serde(default)]
    format: Option<Value>,
}

pub async fn get(
    State(s): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    s.responses
        .get(&id)
        .map(|st| Json(st.response))
        .ok_or_else(|| not_found(&id))
}

pub async fn delete(
    State(s): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    if s.responses.delete(&id) {
        Ok(Json(
            json!({"id": id, "object": "response", "deleted": true}),
        ))
    } else {
        Err(not_found(&id))
    }
}

fn not_found(id: &str) -> ApiError {
    let mut e = ApiError::invalid("previous_response_id", format!("no stored response `{id}` (responses are kept in memory, least recently used dropped first, and are lost on restart)"));
    e.status = axum::http::StatusCode::NOT_FOUND;
    e.code = Some("response_not_found");
    e
}

pub async fn handle(
    State(s): State<AppState>,
    JsonObject(body): JsonObject,
) -> Result<Response, ApiError> {
    let t0 = Instant::now();
    let f: Fields = typed(&body)?;
    let model = s.resolve_model(f.model.as_deref())?;
    if f.background == Some(true) {
        return Err(ApiError::invalid(
            "background",
            "background responses are not supported: send the request without `background` (stream it to see progress)",
        ));
    }
    // The conversation: the stored one this continues, then the new input.
    let mut history = match &f.previous_response_id {
        Some(prev) => {
            s.responses
                .get(prev)
                .ok_or_else(|| not_found(prev))?
                .messages
        }
        None => Vec::new(),
    };
    history.extend(convert::messages(&f.input)?);
    let mut messages = Vec::new();
    if let Some(i) = f.instructions.as_ref().filter(|i| !i.is_empty()) {
        messages.push(json!({"role": "system", "content": i}));
    }
    messages.extend(history.iter().cloned());
    let tools = convert::tools(f.tools.as_deref().unwrap_or_default());
    let choice = f.tool_choice.clone().unwrap_or(Value::Null);
    let none = choice.as_str() == Some("none");
    let mut chat = Map::new();
    chat.insert("messages".into(), Value::Array(messages));
    if !none {
        chat.insert("tools".into(), Value::Array(tools.clone()));
    }
    if let Some(e) = f.reasoning.as_ref().and_then(|r| r.effort.clone()) {
        chat.insert("reasoning_effort".into(), e.into());
    }
    let input: ChatInput = typed(&Value::Object(chat))?;
    let (prompt_text, images) = input.render(&s)?;
    let in_reasoning = ReasoningSplitter::prompt_opens_reasoning(&prompt_text);
    let (prompt, images) = crate::images::prompt_with_images(&s, prompt_text, images).await?;

    let format = f
        .text
        .as_ref()
        .and_then(|t| t.format.clone())
        .filter(|v| !v.is_null());
    let format = match format
        .as_ref()
        .and_then(|v| v.get("type"))
        .and_then(Value::as_str)
    {
        None | Some("text") => None,
        Some("json_object") => Some(Constraint::JsonSchema(json!({"type": "object"}))),
        Some("json_schema") => {
            let schema = format
                .as_ref()
                .and_then(|v| v.get("schema"))
                .cloned()
                .ok_or_else(|| {
                    ApiError::invalid("text.format.schema", "a json_schema format needs `schema`")
                })?;
            let strict = format.as_ref().and_then(|v| v.get("strict")) == Some(&Value::Bool(true));
            Some(json_format(schema, strict))
        }
        Some(other) => {
            return Err(ApiError::invalid(
                "text.format.type",
                format!("unknown text format `{other}`: use text, json_object or json_schema"),
            ))
        }
    };
    let parallel = f.parallel_tool_calls != Some(false);
    let tool_choice = match &choice {
        Value::String(c) if c == "required" => ToolChoice::Forced(None),
        Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("function") => {
            ToolChoice::Forced(Some(
                o.get("name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
            ))
        }
        Value::Null => ToolChoice::Auto { parallel },
        Value::String(c) if c == "auto" => ToolChoice::Auto { parallel },
        Value::String(c) if c == "none" => ToolChoice::None,
        _ => return Err(ApiError::invalid(
            "tool_choice",
            "tool_choice must be auto, none, required or {\"type\": \"function\", \"name\": ...}",
        )),
    };
    let constraint = output_constraint(
        &s.model,
        format,
        "text.format",
        &tools,
        f.tools.as_deref().unwrap_or_default(),
        tool_choice,
    )?;
    let grammar = crate::grammar_check::check(
        &s.model,
        &s.grammar_tables,
        constraint,
        in_reasoning,
        "text.format",
    )
    .await?;
    let common = CommonFields {
        temperature: f.temperature,
        ignore_eos: f.ignore_eos,
        top_p: f.top_p,
        ..CommonFields::default()
    };
    let request = common
        .engine_request(&s, prompt, images, f.max_output_tokens, None, grammar)
        .map_err(|mut e| {
            if e.param.as_deref() == Some("max_tokens") {
                e.param = Some("max_output_tokens".into());
            }
            e
        })?;
    let rx = submit(&s, request)?;

    let id = new_id("resp_");
    let mut parser = OutputParser::new(in_reasoning, if none { &[] } else { &tools });
    if !parallel {
        parser = parser.single_call();
    }
    let base = json!({
        "id": id,
        "object": "response",
        "created_at": unix_now(),
        "model": model,
        "instructions": f.instructions,
        "tools": f.tools.clone().unwrap_or_default(),
        "tool_choice": if choice.is_null() { json!("auto") } else { choice.clone() },
        "parallel_tool_calls": f.parallel_tool_calls.unwrap_or(true),
        "previous_response_id": f.previous_response_id,
        "reasoning": {"effort": f.reasoning.as_ref().and_then(|r| r.effort.clone()), "summary": null},
        "text": {"format": f.text.as_ref().and_then(|t| t.format.clone()).unwrap_or_else(|| json!({"type": "text"}))},
        "max_output_tokens": f.max_output_tokens,
        "temperature": f.temperature,
        "top_p": f.top_p,
        "store": f.store.unwrap_or(true),
        "metadata": f.metadata.clone().unwrap_or_else(|| json!({})),
        "error": null,
        "incomplete_details": null,
    });
    let finish = Finisher {
        s: s.clone(),
        base: base.clone(),
        history,
        store: f.store.unwrap_or(true),
    };

    if !f.stream {
        let (text, usage) = collect(&s, rx, t0).await?;
        let mut items = Items::default();
        let mut sink = Vec::new();
        for p in parser.push(&text).into_iter().chain(parser.finish()) {
            items.add(p, &mut sink);
        }
        items.cut = cut_call(&parser, &usage);
        items.close(&mut sink);
        return Ok(Json(finish.response(items.done, &usage)).into_response());
    }

    let mut seq = 0u64;
    let mut items = Items::default();
    let mut created = base.clone();
    created["status"] = "in_progress".into();
    created["output"] = json!([]);
    let initial = vec![
        ev(&mut seq, "response.created", json!({"response": created})),
        ev(
            &mut seq,
            "response.in_progress",
            json!({"response": created}),
        ),
    ];
    let end = StreamEnd {
        done: None,
        error: |e| {
            Event::default().event("error").data(
                json!({"type": "error", "code": e.code, "message": e.message, "param": e.param})
                    .to_string(),
            )
        },
    };
    Ok(stream(&s, rx, t0, initial, end, move |item| {
        let mut out = Vec::new();
        let parts = match &item {
            Item::Text(t) => parser.push(t),
            Item::Done(_) => parser.finish(),
        };
        for p in parts {
            items.add(p, &mut out);
        }
        if let Item::Done(u) = item {
            items.cut = cut_call(&parser, &u);
            items.close(&mut out);
            let response = finish.response(std::mem::take(&mut items.done), &u);
            // As the API ends a stream: `response.incomplete` when the output limit cut it.
            let last = if cut_short(&u) {
                "response.incomplete"
            } else {
                "response.completed"
            };
            out.push((last.into(), json!({"response": response})));
        }
        out.into_iter()
            .map(|(name, data)| ev(&mut seq, &name, data))
            .collect()
    }))
}

/// A named event with the type and sequence number in its data, as the API sends them.
fn ev(seq: &mut u64, name: &str, mut data: Value) -> Event {
    data["type"] = name.into();
    data["sequence_number"] = (*seq).into();
    *seq += 1;
    Event::default().event(name).data(data.to_string())
}

/// Builds the final response object and stores it.
struct Finisher {
    s: AppState,
    base: Value,
    history: Vec<Value>,
    store: bool,
}

impl Finisher {
    fn response(&self, output: Vec<Value>, u: &Usage) -> Value {
        let mut r = self.base.clone();
        let incomplete = cut_short(u);
        r["status"] = if incomplete {
            "incomplete"
        } else {
            "completed"
        }
        .into();
        if incomplete {
            r["incomplete_details"] = json!({"reason": "max_output_tokens"});
        }
        let text: String = output
            .iter()
            .filter(|i| i["type"] == "message")
            .filter_map(|i| i.pointer("/content/0/text").and_then(Value::as_str))
            .collect();
        r["output_text"] = text.into();
        r["usage"] = json!({
            "input_tokens": u.prompt_tokens,
            "input_tokens_details": {"cached_tokens": u.cached_tokens},
            "output_tokens": u.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": u.prompt_tokens + u.completion_tokens,
        });
        r["output"] = Value::Array(output.clone());
        if self.store {
            let mut messages = self.history.clone();
            messages.extend(convert::messages(&Value::Array(output)).unwrap_or_default());
            let id = r["id"].as_str().unwrap_or_default().to_string();
            self.s.responses.put(id, r.clone(), messages);
        }
        r
    }
}

/// True when generation stopped at the output limit (the response is `incomplete`).
fn cut_short(u: &Usage) -> bool {
    matches!(u.finish, FinishReason::Length | FinishReason::ContextFull)
}

/// The call that the output limit cut (its `function_call` item is `incomplete`).
fn cut_call(parser: &OutputParser, u: &Usage) -> Option<usize> {
    parser.cut_call().filter(|_| cut_short(u))
}

/// Output items as they are built from parts; `open` is the item being streamed.
#[derive(Default)]
struct Items {
    done: Vec<Value>,
    open: Option<Value>,
    /// The call (by its index among calls) cut by the output limit, once known.
    cut: Option<usize>,
    /// The index among calls of the open item, when it is a call.
    open_call: Option<usize>,
}

impl Items {
    fn add(&mut self, part: Part, out: &mut Vec<(String, Value)>) {
        let kind = match &part {
            Part::Reasoning(_) => "reasoning",
            Part::Text(_) => "message",
            Part::CallStart { .. } => "function_call",
            Part::CallArgs { .. } => "function_call_args",
        };
        let same = match &self.open {
            Some(o) => {
                kind == "function_call_args" || (o["type"] == kind && kind != "function_call")
            }
            None => false,
        };
        if !same {
            self.close(out);
            let index = self.done.len();
            let item = match &part {
                Part::Reasoning(_) => {
                    json!({"type": "reasoning", "id": new_id("rs_"), "summary": [], "content": []})
                }
                Part::CallStart {
                    index: call,
                    id,
                    name,
                } => {
                    self.open_call = Some(*call);
                    json!({"type": "function_call", "id": new_id("fc_"), "call_id": id, "name": name, "arguments": "", "status": "in_progress"})
                }
                _ => {
                    json!({"type": "message", "id": new_id("msg_"), "status": "in_progress", "role": "assistant", "content": []})
                }
            };
            out.push((
                "response.output_item.added".into(),
                json!({"output_index": index, "item": item}),
            ));
            if item["type"] == "message" {
                out.push((
                    "response.content_part.added".into(),
                    json!({"item_id": item["id"], "output_index": index, "content_index": 0,
                    "part": {"type": "output_text", "text": "", "annotations": []}}),
                ));
            }
            self.open = Some(item);
        }
        let index = self.done.len();
        let open = self.open.as_mut().expect("an item is open");
        let item_id = open["id"].clone();
        let (text_field, event, delta) = match part {
            Part::Reasoning(t) => ("_text", "response.reasoning_text.delta", t),
            Part::Text(t) => ("_text", "response.output_text.delta", t),
            Part::CallArgs { delta, .. } => {
                ("arguments", "response.function_call_arguments.delta", delta)
            }
            Part::CallStart { .. } => return,
        };
        let acc = open[text_field].as_str().unwrap_or("").to_string() + &delta;
        open[text_field] = acc.into();
        out.push((
            event.into(),
            json!({"item_id": item_id, "output_index": index, "content_index": 0, "delta": delta}),
        ));
    }

    fn close(&mut self, out: &mut Vec<(String, Value)>) {
        let Some(mut item) = self.open.take() else {
            return;
        };
        let index = self.done.len();
        let text = item
            .as_object_mut()
            .and_then(|o| o.remove("_text"))
            .and_then(|t| t.as_str().map(str::to_string))
            .unwrap_or_default();
        match item["type"].as_str() {
            Some("reasoning") => {
                out.push(("response.reasoning_text.done".into(), json!({"item_id": item["id"], "output_index": index, "content_index": 0, "text": text})));
                item["content"] = json!([{"type": "reasoning_text", "text": text}]);
            }
            Some("message") => {
                let part = json!({"type": "output_text", "text": text, "annotations": []});
                out.push(("response.output_text.done".into(), json!({"item_id": item["id"], "output_index": index, "content_index": 0, "text": text})));
                out.push(("response.content_part.done".into(), json!({"item_id": item["id"], "output_index": index, "content_index": 0, "part": part})));
                item["content"] = json!([part]);
                item["status"] = "completed".into();
            }
            _ => {
                let call = self.open_call.take();
                let cut = call.is_some() && call == self.cut;
                out.push(("response.function_call_arguments.done".into(), json!({"item_id": item["id"], "output_index": index, "arguments": item["arguments"]})));
                // A call cut by the output limit: its arguments are what was generated.
                item["status"] = if cut { "incomplete" } else { "completed" }.into();
            }
        }
        out.push((
            "response.output_item.done".into(),
            json!({"output_index": index, "item": item}),
        ));
        self.done.push(item);
    }
}
