//! `POST /v1/systemone`: TypeSafe System One. Named questions about one `state` — `noul`
//! (yes/no: P(true)), `choice` (a label map: the argmax label) and `score` (ordered levels: the
//! expected level) — each scored in one prefill, one after another under one deadline, sharing
//! the state's prefix. Errors as FastAPI writes them, which the `typesafe-sdk` parses: 422
//! `{"detail": [{loc, msg, type}]}` for validation, `{"detail": {error_type, message}}`
//! otherwise, and 529 instead of 503.

use std::time::Instant;

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};

use super::{
    concentration, deadline, poisoned, prepare, run, slots, softmax, PrepareError, SharedHead,
    MAX_SLOTS,
};
use crate::error::ApiError;
use crate::json::JsonObject;
use crate::state::AppState;

/// Questions per request at most.
const MAX_QUESTIONS: usize = 64;
/// Prompt tokens of all questions together at most.
const MAX_TOTAL_TOKENS: usize = 1 << 20;
const FIELDS: [&str; 5] = ["state", "model", "questions", "timeout", "priority"];
const QUESTION_FIELDS: [&str; 3] = ["type", "instructions", "criteria"];

/// One validation failure, as FastAPI reports it.
pub struct Detail {
    loc: Vec<Value>,
    msg: String,
    kind: &'static str,
}

fn detail(loc: &[&str], msg: impl Into<String>) -> Detail {
    Detail {
        loc: std::iter::once("body")
            .chain(loc.iter().copied())
            .map(Value::from)
            .collect(),
        msg: msg.into(),
        kind: "value_error",
    }
}

fn missing(field: &str) -> Detail {
    Detail {
        kind: "missing",
        ..detail(&[field], "field required")
    }
}

/// A System One error answer.
pub(crate) enum SystemOneError {
    /// 422 with every validation failure found.
    Invalid(Vec<Detail>),
    /// Any other error: its status (503 becomes 529, TypeSafe's "overloaded").
    Api(ApiError),
}

impl From<ApiError> for SystemOneError {
    fn from(e: ApiError) -> Self {
        Self::Api(e)
    }
}

impl IntoResponse for SystemOneError {
    fn into_response(self) -> Response {
        match self {
            Self::Invalid(details) => {
                let detail: Vec<Value> = details
                    .into_iter()
                    .map(|d| json!({"loc": d.loc, "msg": d.msg, "type": d.kind}))
                    .collect();
                (
                    StatusCode::UNPROCESSABLE_ENTITY,
                    Json(json!({ "detail": detail })),
                )
                    .into_response()
            }
            Self::Api(e) => {
                let status = if e.status == StatusCode::SERVICE_UNAVAILABLE {
                    StatusCode::from_u16(529).expect("a valid status")
                } else {
                    e.status
                };
                let kind = e.code.unwrap_or(e.kind);
                let body = json!({"detail": {"error_type": kind, "message": e.message}});
                let mut resp = (status, Json(body)).into_response();
                if let Some(s) = e.retry_after {
                    resp.headers_mut()
                        .insert(header::RETRY_AFTER, HeaderValue::from(s));
                }
                resp
            }
        }
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Noul,
    Choice,
    Score,
}

/// A validated question.
struct Question<'a> {
    id: &'a str,
    kind: Kind,
    instructions: Option<&'a Value>,
    /// Answer labels: `true`/`false`, the choice labels, or the score levels `0`, `1`, ...
    labels: Vec<String>,
    /// What each label means (the label itself when undescribed).
    descriptions: Vec<Value>,
}

/// A string, an object or an array: what System One accepts as text.
fn is_content(v: &Value) -> bool {
    matches!(v, Value::String(_) | Value::Object(_) | Value::Array(_))
}

fn question<'a>(id: &'a str, q: &'a Value, errors: &mut Vec<Detail>) -> Option<Question<'a>> {
    let Some(q) = q.as_object() else {
        errors.push(Detail {
            kind: "model_type",
            ..detail(&["questions", id], "a question must be an object")
        });
        return None;
    };
    let before = errors.len();
    for key in q.keys().filter(|k| !QUESTION_FIELDS.contains(&k.as_str())) {
        errors.push(detail(
            &["questions", id, key],
            format!(
                "unknown field; a question takes {}",
                QUESTION_FIELDS.join(", ")
            ),
        ));
    }
    let kind = match q.get("type").and_then(Value::as_str) {
        Some("noul") => Kind::Noul,
        Some("choice") => Kind::Choice,
        Some("score") => Kind::Score,
        _ => {
            errors.push(detail(
                &["questions", id, "type"],
                "type must be noul, choice or score",
            ));
            return None;
        }
    };
    let instructions = q.get("instructions").filter(|v| !v.is_null());
    if instructions.is_some_and(|v| !is_content(v)) {
        errors.push(detail(
            &["questions", id, "instructions"],
            "instructions must be a string, object or array",
        ));
    }
    let criteria = q.get("criteria").filter(|v| !v.is_null());
    let at = ["questions", id, "criteria"];
    let (labels, descriptions): (Vec<String>, Vec<Value>) = match (kind, criteria) {
        (Kind::Noul, c) => {
            let described = |label: &str| c.and_then(|c| c.get(label)).filter(|v| !v.is_null());
            let ok = c.is_none_or(|c| {
                c.as_object().is_some_and(|o| {
                    o.keys().all(|k| k == "true" || k == "false")
                        && o.values().all(|v| v.is_null() || is_content(v))
                })
            });
            if !ok {
                errors.push(detail(
                    &at,
                    "noul criteria must map true and false to a string, object, array or null",
                ));
            }
            ["true", "false"]
                .iter()
                .map(|l| (l.to_string(), described(l).cloned().unwrap_or(json!(l))))
                .unzip()
        }
        (Kind::Choice, Some(Value::Object(o))) if !o.is_empty() => {
            if o.len() > MAX_SLOTS {
                errors.push(detail(
                    &at,
                    format!("choice takes at most {MAX_SLOTS} options, got {}", o.len()),
                ));
            } else if !o.values().all(|v| v.is_null() || is_content(v)) {
                errors.push(detail(
                    &at,
                    "choice descriptions must be strings, objects, arrays or null",
                ));
            }
            o.iter()
                .map(|(l, d)| (l.clone(), if d.is_null() { json!(l) } else { d.clone() }))
                .unzip()
        }
        (Kind::Choice, _) => {
            errors.push(detail(
                &at,
                "choice criteria must be a nonempty object mapping labels to descriptions",
            ));
            return None;
        }
        (Kind::Score, Some(Value::Array(levels))) if !levels.is_empty() => {
            if levels.len() > MAX_SLOTS {
                errors.push(detail(
                    &at,
                    format!(
                        "score takes at most {MAX_SLOTS} levels, got {}",
                        levels.len()
                    ),
                ));
            } else if !levels.iter().all(is_content) {
                errors.push(detail(
                    &at,
                    "score levels must be strings, objects or arrays",
                ));
            }
            levels
                .iter()
                .enumerate()
                .map(|(i, d)| (i.to_string(), d.clone()))
                .unzip()
        }
        (Kind::Score, _) => {
            errors.push(detail(
                &at,
                "score criteria must be a nonempty array of level descriptions",
            ));
            return None;
        }
    };
    (errors.len() == before).then_some(Question {
        id,
        kind,
        instructions,
        labels,
        descriptions,
    })
}

/// The answer to `q` from its labels' probabilities.
fn answer(q: &Question, p: &[f64]) -> Value {
    let keyed = |keys: &[String]| -> Map<String, Value> {
        keys.iter()
            .cloned()
            .zip(p.iter().map(|&x| json!(x)))
            .collect()
    };
    match q.kind {
        Kind::Noul => json!({"type": "noul", "noul": p[0]}),
        Kind::Choice => {
            let best = (0..p.len()).fold(0, |b, i| if p[i] > p[b] { i } else { b });
            json!({
                "type": "choice",
                "choice": q.labels[best],
                "probabilities": keyed(&q.labels),
                "confidence": concentration(p),
            })
        }
        Kind::Score => {
            let legend: Map<String, Value> = q
                .labels
                .iter()
                .cloned()
                .zip(q.descriptions.iter().cloned())
                .collect();
            json!({
                "type": "score",
                "score": p.iter().enumerate().map(|(i, x)| i as f64 * x).sum::<f64>(),
                "legend": legend,
                "probabilities": keyed(&q.labels),
                "confidence": concentration(p),
            })
        }
    }
}

pub async fn handle(
    State(s): State<AppState>,
    headers: HeaderMap,
    body: Result<JsonObject, ApiError>,
) -> Result<Json<Value>, SystemOneError> {
    let t0 = Instant::now();
    let body = match body {
        Ok(JsonObject(v)) => v,
        // An unreadable body is a validation error here; too large or too slow keep theirs.
        Err(e) if e.status == StatusCode::BAD_REQUEST => {
            return Err(SystemOneError::Invalid(vec![detail(&[], e.message)]))
        }
        Err(e) => return Err(e.into()),
    };
    let body = body.as_object().expect("JsonObject is an object");
    let mut errors = Vec::new();
    for key in body.keys().filter(|k| !FIELDS.contains(&k.as_str())) {
        errors.push(detail(
            &[key],
            format!("unknown field; System One takes {}", FIELDS.join(", ")),
        ));
    }
    match body.get("model") {
        Some(Value::String(m)) if !m.is_empty() => {
            if let Err(e) = s.resolve_model(Some(m)) {
                errors.push(detail(&["model"], e.message));
            }
        }
        None | Some(Value::Null) | Some(Value::String(_)) => errors.push(missing("model")),
        Some(_) => errors.push(detail(&["model"], "model must be a string")),
    }
    let state = body.get("state");
    match state {
        None => errors.push(missing("state")),
        Some(v) if !is_content(v) => errors.push(detail(
            &["state"],
            "state must be a string, object or array",
        )),
        _ => {}
    }
    let mut questions = Vec::new();
    match body.get("questions") {
        None => errors.push(missing("questions")),
        Some(Value::Object(q)) if q.len() > MAX_QUESTIONS => errors.push(detail(
            &["questions"],
            format!(
                "at most {MAX_QUESTIONS} questions per request, got {}: split them",
                q.len()
            ),
        )),
        Some(Value::Object(q)) if !q.is_empty() => {
            for (id, spec) in q {
                questions.extend(question(id, spec, &mut errors));
            }
        }
        Some(_) => errors.push(detail(
            &["questions"],
            "questions must be a nonempty object",
        )),
    }
    let deadline = match deadline(t0, body.get("timeout")) {
        Ok(d) => Some(d),
        Err(why) => {
            errors.push(detail(&["timeout"], why));
            None
        }
    };
    if let Some(p) = body.get("priority") {
        if !matches!(p.as_str(), Some("foreground" | "normal" | "background")) {
            errors.push(detail(
                &["priority"],
                "priority must be foreground, normal or background",
            ));
        }
    }
    let (Some(state), Some(deadline), true) = (state, deadline, errors.is_empty()) else {
        return Err(SystemOneError::Invalid(errors));
    };

    // Every prompt is prepared (and every limit checked) before the first is scored.
    let slots = slots(&s)?;
    let mut prompts = Vec::with_capacity(questions.len());
    let mut total = 0usize;
    let mut head = SharedHead::default();
    for q in &questions {
        if q.labels.len() == 1 {
            prompts.push(None); // one possible answer: certain, no inference
            continue;
        }
        if q.labels.len() > slots.len() {
            errors.push(detail(
                &["questions", q.id, "criteria"],
                format!(
                    "the served tokenizer has {} answer slots; {} were requested",
                    slots.len(),
                    q.labels.len()
                ),
            ));
            continue;
        }
        let options: Vec<Value> = slots
            .labels(q.labels.len())
            .into_iter()
            .zip(&q.labels)
            .zip(&q.descriptions)
            .map(|((slot, label), d)| json!({"slot": slot, "label": label, "description": d}))
            .collect();
        let mut rest = Map::new();
        if let Some(i) = q.instructions {
            rest.insert("criterion".into(), i.clone());
        }
        rest.insert("options".into(), options.into());
        let n = q.labels.len();
        match prepare(&s, super::SYSTEMONE_SYSTEM, state, rest, n, &mut head).await {
            Ok(p) => {
                total += p.ids.len();
                if total > MAX_TOTAL_TOKENS {
                    errors.push(detail(
                        &["questions", q.id],
                        format!("the questions' prompts have more than {MAX_TOTAL_TOKENS} tokens together: ask fewer questions or shorten the state"),
                    ));
                    break;
                }
                prompts.push(Some(p));
            }
            Err(PrepareError::TooLong(n)) => errors.push(detail(
                &["questions", q.id],
                format!(
                    "the question's prompt has more than {n} tokens but the context limit is {} tokens: shorten the state",
                    s.max_context
                ),
            )),
            Err(PrepareError::Other(e)) => return Err(e.into()),
        }
    }
    if !errors.is_empty() {
        return Err(SystemOneError::Invalid(errors));
    }

    let poison = poisoned(&s, &headers);
    let mut answers = Map::new();
    let mut input_tokens = 0;
    for (q, prompt) in questions.iter().zip(prompts) {
        let p = match prompt {
            None => vec![1.0],
            Some(prompt) => {
                let scored = run(&s, prompt, deadline, poison).await?;
                input_tokens += scored.prompt_tokens;
                softmax(&scored.logits)
            }
        };
        answers.insert(q.id.to_string(), answer(q, &p));
    }
    Ok(Json(json!({
        "model": s.model_id(),
        "answers": answers,
        "usage": {"input_tokens": input_tokens, "output_tokens": 0},
    })))
}
