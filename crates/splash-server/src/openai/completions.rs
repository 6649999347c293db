//! `POST /v1/completions`: raw text or token-id prompts, no chat template.

use std::time::Instant;

use axum::extract::State;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{
    collect, finish_reason, stream, submit, timings_json, usage_json, CommonFields, Item, StreamEnd,
};
use crate::error::ApiError;
use crate::ids::new_id;
use crate::json::{typed, JsonObject};
use crate::routes::unix_now;
use crate::state::AppState;

/// OpenAI's default output budget for completions.
const DEFAULT_MAX_TOKENS: usize = 16;

/// `prompt`: text, token ids, or a one-element batch of either.
#[derive(Deserialize)]
#[serde(untagged)]
enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
    Texts(Vec<String>),
    TokenLists(Vec<Vec<u32>>),
}

#[derive(Deserialize)]
struct CompletionFields {
    #[serde(default)]
    model: Option<String>,
    prompt: Prompt,
    max_tokens: Option<u64>,
    echo: Option<bool>,
    suffix: Option<String>,
    best_of: Option<u64>,
}

pub async fn handle(
    State(s): State<AppState>,
    JsonObject(body): JsonObject,
) -> Result<Response, ApiError> {
    let t0 = Instant::now();
    let fields: CompletionFields = typed(&body)?;
    let common: CommonFields = typed(&body)?;
    let model = s.resolve_model(fields.model.as_deref())?;
    common.check_supported()?;
    if fields.echo == Some(true) {
        return Err(ApiError::invalid(
            "echo",
            "echo is not supported by this server; remove the field",
        ));
    }
    if fields.suffix.as_deref().is_some_and(|x| !x.is_empty()) {
        return Err(ApiError::invalid(
            "suffix",
            "suffix (fill-in-the-middle) is not supported by this server",
        ));
    }
    if fields.best_of.is_some_and(|b| b != 1) {
        return Err(ApiError::invalid("best_of", "only best_of=1 is supported"));
    }
    let one = |n: usize| {
        if n == 1 {
            Ok(())
        } else {
            Err(ApiError::invalid(
                "prompt",
                format!("a batch of {n} prompts was sent; send one prompt per request"),
            ))
        }
    };
    let prompt = match fields.prompt {
        Prompt::Text(t) => crate::prompt::prompt_ids(&s.model, s.max_context, t).await?,
        Prompt::Tokens(ids) => ids,
        Prompt::Texts(mut v) => {
            one(v.len())?;
            crate::prompt::prompt_ids(&s.model, s.max_context, v.swap_remove(0)).await?
        }
        Prompt::TokenLists(mut v) => {
            one(v.len())?;
            v.swap_remove(0)
        }
    };
    let vocab = s.model.config.vocab_size;
    if let Some(t) = prompt.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::invalid(
            "prompt",
            format!("token id {t} is outside the vocabulary (size {vocab})"),
        ));
    }
    let request = common.engine_request(
        &s,
        prompt,
        Vec::new(),
        fields.max_tokens,
        Some(DEFAULT_MAX_TOKENS),
        None,
    )?;
    let rx = submit(&s, request)?;
    let id = new_id("cmpl-");
    let created = unix_now();
    if !common.streaming() {
        let (text, usage) = collect(&s, rx, t0).await?;
        return Ok(Json(json!({
            "id": id,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": null, "finish_reason": finish_reason(&usage.finish)}],
            "usage": usage_json(&usage),
            "timings": timings_json(&usage),
        }))
        .into_response());
    }
    let include_usage = common.include_usage();
    let chunk = move |text: &str, finish: Option<&str>| -> Value {
        let mut c = json!({
            "id": id,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": null, "finish_reason": finish}],
        });
        if include_usage {
            c["usage"] = Value::Null;
        }
        c
    };
    let event = |v: Value| Event::default().data(v.to_string());
    Ok(stream(
        &s,
        rx,
        t0,
        Vec::new(),
        StreamEnd::openai(),
        move |item| match item {
            Item::Text(t) => vec![event(chunk(&t, None))],
            Item::Done(u) => {
                let mut last = chunk("", Some(finish_reason(&u.finish)));
                last["timings"] = timings_json(&u);
                let mut events = vec![event(last)];
                if include_usage {
                    let mut usage = chunk("", None);
                    usage["choices"] = json!([]);
                    usage["usage"] = usage_json(&u);
                    events.push(event(usage));
                }
                events
            }
        },
    ))
}
