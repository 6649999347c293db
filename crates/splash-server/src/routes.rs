//! The router and the small endpoints: health, readiness, status, metrics, models,
//! tokenizer and template utilities, and the fallbacks.

use std::sync::atomic::Ordering;

use axum::extract::{Path, State};
use axum::http::{header, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{middleware, Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::json::{typed, JsonObject};
use crate::openai::{self, ChatInput};
use crate::prompt::{self, Tokens};
use crate::state::AppState;
use crate::{anthropic, guard, metrics, responses, scoring, webui};

/// Every route, behind the access guard and the request counter.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/", get(webui::index))
        .route("/webui/{name}", get(webui::asset))
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/status", get(status))
        .route("/metrics", get(prometheus))
        .route("/v1/models", get(models))
        .route("/v1/models/{*id}", get(model_by_id))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/apply-template", post(apply_template))
        .route("/v1/chat/completions", post(openai::chat::handle))
        .route("/v1/completions", post(openai::completions::handle))
        .route("/v1/messages", post(anthropic::handle))
        .route("/v1/responses", post(responses::handle))
        .route(
            "/v1/responses/{id}",
            get(responses::get).delete(responses::delete),
        )
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/v1/judgments", post(scoring::judgments::handle))
        .route("/v1/systemone", post(scoring::systemone::handle))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), guard::guard))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            metrics::track,
        ))
        .layer(middleware::from_fn(typesafe_request_id))
        .with_state(state)
}

/// `x-typesafe-request-id` on every answer of the routes the TypeSafe SDK calls (errors from
/// the access guard too): its errors and logs quote it.
async fn typesafe_request_id(req: axum::extract::Request, next: middleware::Next) -> Response {
    let path = req.uri().path();
    let tag = path == "/v1/systemone" || path.starts_with("/v1/models");
    let mut resp = next.run(req).await;
    if tag {
        if let Ok(v) = axum::http::HeaderValue::from_str(&crate::ids::new_id("req_")) {
            resp.headers_mut().insert("x-typesafe-request-id", v);
        }
    }
    resp
}

async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

async fn ready(State(s): State<AppState>) -> Response {
    let alive = s.worker.load.alive.load(Ordering::SeqCst);
    let stopping = *s.shutdown.borrow();
    if alive && !stopping {
        Json(json!({"status": "ready"})).into_response()
    } else {
        let why = if stopping {
            "shutting down"
        } else {
            "the engine is not running"
        };
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "unavailable", "reason": why})),
        )
            .into_response()
    }
}

async fn status(State(s): State<AppState>) -> Json<Value> {
    let load = &s.worker.load;
    let c = &s.model.config;
    Json(json!({
        "status": if load.alive.load(Ordering::SeqCst) { "ready" } else { "unavailable" },
        "model": s.model_id(),
        "model_ids": *s.model_ids,
        "model_dir": s.model.dir.display().to_string(),
        "model_type": c.model_type,
        "parameters": s.model.graph.num_parameters(),
        "maximum_context_tokens": s.max_context,
        "native_context_tokens": c.max_position_embeddings,
        "vision": s.vision.is_some(),
        "memory": {
            "weights_bytes": s.model.weight_bytes,
            "kv_format": format!("{:?}", s.config.kv_format).to_lowercase(),
            "kv_bytes_per_token": s.kv_bytes_per_token(),
            "plan": s.config.memory_plan.as_ref().map(|p| p.to_json()),
        },
        "queue": {
            "waiting": load.waiting.load(Ordering::SeqCst),
            "running": load.running.load(Ordering::SeqCst),
            "in_flight": load.in_flight.load(Ordering::SeqCst),
            "lanes": s.config.lanes,
            "queue_size": s.config.queue_size,
        },
        "metrics": s.metrics.snapshot(),
        "uptime_seconds": s.started.elapsed().as_secs_f64(),
        "version": env!("CARGO_PKG_VERSION"),
    }))
}

async fn prometheus(State(s): State<AppState>) -> Response {
    let load = &s.worker.load;
    let body = s.metrics.render(
        load.waiting.load(Ordering::SeqCst),
        load.running.load(Ordering::SeqCst),
    );
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}

fn model_card(s: &AppState, id: &str) -> Value {
    json!({
        "id": id,
        "object": "model",
        "created": unix_now(),
        "owned_by": "splash",
        "root": s.model_id(),
        "max_model_len": s.max_context,
        "context_length": s.max_context,
    })
}

pub(crate) fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

async fn models(State(s): State<AppState>) -> Json<Value> {
    let data: Vec<Value> = s.model_ids.iter().map(|id| model_card(&s, id)).collect();
    // `models`: what the TypeSafe SDK's `models.list()` reads.
    let models: Vec<Value> = s
        .model_ids
        .iter()
        .map(|id| json!({"name": id, "description": "served by splash", "release_date": ""}))
        .collect();
    Json(json!({"object": "list", "data": data, "models": models}))
}

async fn model_by_id(
    State(s): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let id = s.resolve_model(Some(&id))?;
    Ok(Json(model_card(&s, &id)))
}

#[derive(Deserialize)]
struct TokenizeBody {
    #[serde(default)]
    content: String,
    #[serde(default)]
    add_special: bool,
}

async fn tokenize(
    State(s): State<AppState>,
    JsonObject(mut v): JsonObject,
) -> Result<Json<Value>, ApiError> {
    // `messages` (vLLM's chat form): the prompt a chat request would send, images included.
    if v.get("messages").is_some() {
        let input: ChatInput = typed(&v)?;
        let (text, images) = input.render(&s)?;
        let tokens = crate::images::prompt_token_ids(&s, text, images).await?;
        return Ok(Json(json!({"count": tokens.len(), "tokens": tokens})));
    }
    if v.get("content").is_none() {
        return Err(ApiError::invalid(
            "content",
            "send `content` (a text) or `messages` (a chat conversation)",
        ));
    }
    // The text is moved out of the body, not copied (it may be many megabytes).
    let content = match v.get_mut("content") {
        Some(Value::String(c)) => std::mem::take(c),
        _ => String::new(),
    };
    let b: TokenizeBody = typed(&v)?;
    // Qwen checkpoints add no BOS/EOS, so add_special changes nothing; it is accepted for
    // compatibility with llama-server and vLLM clients.
    let _ = (b.content, b.add_special);
    // Like a prompt, a text is tokenized up to the context limit: past it, its tokens could
    // not be sent to the model anyway, and a huge text would cost gigabytes to tokenize.
    let limit = s.max_context;
    match prompt::tokenize(&s.model, content, limit).await? {
        Tokens::Ids(tokens) => Ok(Json(json!({"tokens": tokens}))),
        Tokens::Over(n) => Err(ApiError::context_length(format!(
            "the text has more than {n} tokens; /tokenize takes at most the context limit, {limit} tokens: split the text"
        ))),
    }
}

#[derive(Deserialize)]
struct DetokenizeBody {
    tokens: Vec<u32>,
}

async fn detokenize(
    State(s): State<AppState>,
    JsonObject(v): JsonObject,
) -> Result<Json<Value>, ApiError> {
    let b: DetokenizeBody = typed(&v)?;
    let vocab = s.model.config.vocab_size;
    if let Some(t) = b.tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::invalid(
            "tokens",
            format!("token id {t} is outside the vocabulary (size {vocab})"),
        ));
    }
    let content = s
        .model
        .tokenizer
        .decode(&b.tokens, false)
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    Ok(Json(json!({"content": content})))
}

async fn apply_template(
    State(s): State<AppState>,
    JsonObject(v): JsonObject,
) -> Result<Json<Value>, ApiError> {
    let input: ChatInput = typed(&v)?;
    let (prompt, images) = input.render(&s)?;
    let prompt = crate::images::show(&s, prompt, images).await?;
    Ok(Json(json!({"prompt": prompt})))
}

async fn not_found(method: Method, uri: Uri) -> ApiError {
    ApiError::not_found(method.as_str(), uri.path())
}

async fn method_not_allowed(method: Method, uri: Uri) -> Response {
    let mut e = ApiError::not_found(method.as_str(), uri.path());
    e.status = StatusCode::METHOD_NOT_ALLOWED;
    e.code = Some("method_not_allowed");
    e.message = format!("{} is not allowed on {}", method, uri.path());
    e.into_response()
}
