//! `POST /v1/judgments`: one SemIf `direct-options-v1` row — evidence, a criterion and 2–16
//! options — scored in one prefill. Errors in OpenAI's shape.

use std::time::Instant;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use serde_json::{json, Map, Value};

use super::{
    deadline, poisoned, prepare, run, sha256_hex, softmax, PrepareError, SharedHead, LETTERS,
};
use crate::error::ApiError;
use crate::json::JsonObject;
use crate::state::AppState;

/// The fields a judgment may have.
const FIELDS: [&str; 7] = [
    "id", "state", "question", "options", "model", "timeout", "priority",
];
const PROMPT_VERSION: &str = "direct-options-v1";
const READOUT: &str =
    "native full-vocabulary last-position logits restricted to declared answer slots";

/// A validated row.
struct Row<'a> {
    id: &'a str,
    state: &'a Value,
    question: &'a str,
    /// (id, description) of each option.
    options: Vec<(&'a str, &'a str)>,
}

/// Checks a row as SemIf does; errors name the field.
fn validate(body: &Map<String, Value>) -> Result<Row<'_>, ApiError> {
    let mut unknown: Vec<&str> = body
        .keys()
        .map(String::as_str)
        .filter(|k| !FIELDS.contains(k))
        .collect();
    if !unknown.is_empty() {
        unknown.sort_unstable();
        return Err(ApiError::bad_request(format!(
            "unsupported fields: {}; a judgment takes {}",
            unknown.join(", "),
            FIELDS.join(", ")
        )));
    }
    let mut missing: Vec<&str> = ["id", "state", "question", "options"]
        .into_iter()
        .filter(|k| !body.contains_key(*k))
        .collect();
    if !missing.is_empty() {
        missing.sort_unstable();
        return Err(ApiError::bad_request(format!(
            "the row is missing fields: {}",
            missing.join(", ")
        )));
    }
    let text = |key: &str| match body.get(key) {
        Some(Value::String(s)) if !s.is_empty() => Ok(s.as_str()),
        _ => Err(ApiError::invalid(
            key,
            format!("`{key}` must be a nonempty string"),
        )),
    };
    let (id, question) = (text("id")?, text("question")?);
    let state = &body["state"];
    let nonempty = match state {
        Value::String(s) => !s.is_empty(),
        Value::Object(o) => !o.is_empty(),
        Value::Array(a) => !a.is_empty(),
        _ => false,
    };
    if !nonempty {
        return Err(ApiError::invalid(
            "state",
            "`state` must be a nonempty string, object or array",
        ));
    }
    let Some(list) = body["options"]
        .as_array()
        .filter(|o| (2..=LETTERS.len()).contains(&o.len()))
    else {
        return Err(ApiError::invalid(
            "options",
            format!("`options` must be an array of 2-{} options", LETTERS.len()),
        ));
    };
    let mut options = Vec::with_capacity(list.len());
    for (i, o) in list.iter().enumerate() {
        let field = |k: &str| o.get(k).and_then(Value::as_str);
        match (field("id"), field("description")) {
            (Some(id), Some(d)) => options.push((id, d)),
            _ => {
                return Err(ApiError::invalid(
                    &format!("options[{i}]"),
                    format!("options[{i}] needs string `id` and `description` fields"),
                ))
            }
        }
    }
    for (i, (oid, _)) in options.iter().enumerate() {
        if options[..i].iter().any(|(o, _)| o == oid) {
            return Err(ApiError::invalid(
                "options",
                format!("option ids must be unique; `{oid}` appears twice"),
            ));
        }
    }
    if let Some(p) = body.get("priority") {
        if !matches!(p.as_str(), Some("foreground" | "normal" | "background")) {
            return Err(ApiError::invalid(
                "priority",
                "`priority` must be foreground, normal or background",
            ));
        }
    }
    Ok(Row {
        id,
        state,
        question,
        options,
    })
}

pub async fn handle(
    State(s): State<AppState>,
    headers: HeaderMap,
    JsonObject(body): JsonObject,
) -> Result<Json<Value>, ApiError> {
    let t0 = Instant::now();
    let body = body.as_object().expect("JsonObject is an object");
    let model = match body.get("model") {
        None | Some(Value::Null) => None,
        Some(Value::String(m)) => Some(m.as_str()),
        Some(_) => return Err(ApiError::invalid("model", "`model` must be a string")),
    };
    let model = s.resolve_model(model)?;
    let row = validate(body)?;
    let deadline =
        deadline(t0, body.get("timeout")).map_err(|why| ApiError::invalid("timeout", why))?;
    let options: Vec<Value> = row
        .options
        .iter()
        .zip(LETTERS.chars())
        .map(|((_, description), letter)| json!({"letter": letter.to_string(), "description": description}))
        .collect();
    let mut rest = Map::new();
    rest.insert("criterion".into(), row.question.into());
    rest.insert("options".into(), options.into());
    let n = row.options.len();
    let head = &mut SharedHead::default();
    let prompt = match prepare(&s, super::JUDGMENT_SYSTEM, row.state, rest, n, head).await {
        Ok(p) => p,
        Err(PrepareError::TooLong(tokens)) => {
            return Err(ApiError::context_length(format!(
                "the judgment prompt has more than {tokens} tokens but the context limit is {} tokens: shorten the state",
                s.max_context
            )))
        }
        Err(PrepareError::Other(e)) => return Err(e),
    };
    let sha = sha256_hex(&prompt.text);
    let answers = prompt.answers.clone();
    let scored = run(&s, prompt, deadline, poisoned(&s, &headers)).await?;
    let tokens = scored.prompt_tokens;
    Ok(Json(json!({
        "id": row.id,
        "option_ids": row.options.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
        "probabilities": softmax(&scored.logits),
        "option_logits": scored.logits,
        "input_tokens": tokens,
        "cached_tokens": scored.cached_tokens,
        "answer_token_ids": answers,
        "prompt_sha256": sha,
        "prompt_version": PROMPT_VERSION,
        "model": {"id": model},
        "readout": READOUT,
        "probability_status": "uncalibrated",
        "forward_seconds": scored.prefill.as_secs_f64(),
        "total_seconds": t0.elapsed().as_secs_f64(),
        "usage": {"prompt_tokens": tokens, "completion_tokens": 0, "total_tokens": tokens},
    })))
}
