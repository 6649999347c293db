//! `splash serve-multi`: one front server for several models, one engine loaded at a time.
//!
//! The front owns the port, checks Host, Origin and the API key like `serve`, and forwards each
//! request to the engine of the model it names (`model` in the JSON body; the loaded model when
//! it names none) — a `splash serve` child process on a loopback port, started and switched by
//! the [`supervisor`]. Streams are relayed as they come. `/v1/models`, `/status`, `/ready` and
//! `/health` are the front's own: they list every configured model and say which is loaded.

mod config;
mod supervisor;

pub use config::{check_arguments, MultiConfig};

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{middleware, Json, Router};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use serde_json::{json, Value};

use crate::config::ServerConfig;
use crate::error::{for_path, ApiError};
use crate::{guard, StartError};
use supervisor::{Phase, Refusal, Supervisor};

/// Seconds a client is told to wait before retrying a request refused during a switch.
const RETRY_AFTER: u32 = 2;

/// The options of `splash serve-multi`.
pub struct MultiOptions {
    pub config: MultiConfig,
    /// Host, port, API key, allowed hosts and origins, body limits: the front's.
    pub front: ServerConfig,
    /// `splash serve` options every model gets (they win over the model's own).
    pub common: Vec<String>,
    /// How long a request waits for its model to be loaded (0: refuse at once).
    pub switch_timeout: Duration,
    /// How long an engine may take to start (0: no limit).
    pub startup_timeout: Duration,
}

#[derive(Clone)]
struct Front {
    sup: Arc<Supervisor>,
    config: Arc<ServerConfig>,
    client: Client<HttpConnector, Full<Bytes>>,
}

/// Serves until Ctrl+C or SIGTERM, then stops the loaded engine.
pub async fn serve_multi(
    listener: tokio::net::TcpListener,
    options: MultiOptions,
) -> Result<(), StartError> {
    let exe = std::env::current_exe()
        .map_err(|e| StartError(format!("cannot find the splash executable: {e}")))?;
    let sup = Supervisor::new(
        options.config,
        exe,
        options.common,
        options.front.api_key.clone(),
        options.switch_timeout,
        options.startup_timeout,
    );
    let front = Front {
        sup: sup.clone(),
        config: Arc::new(options.front),
        client: Client::builder(hyper_util::rt::TokioExecutor::new()).build_http(),
    };
    let local = listener
        .local_addr()
        .map_err(|e| StartError(e.to_string()))?;
    let header_timeout = front.config.header_read_timeout;
    let app = Router::new()
        .route("/health", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/ready", get(ready))
        .route("/status", get(status))
        .route("/v1/models", get(models))
        .route("/v1/models/{*id}", get(model_by_id))
        .fallback(forward)
        .layer(middleware::from_fn_with_state(
            front.config.clone(),
            guard::guard,
        ))
        .with_state(front);
    let names: Vec<&str> = sup.config.names();
    eprintln!(
        "splash {} serve-multi: {} models ({}); one engine at a time, loaded on first request{}",
        env!("CARGO_PKG_VERSION"),
        sup.config.models.len(),
        names.join(", "),
        match sup.config.preload {
            Some(m) => format!(" ({} now)", sup.config.models[m].model),
            None => String::new(),
        }
    );
    tokio::spawn(sup.clone().run());
    eprintln!("Ready: http://{}:{}", local.ip(), local.port());
    let stop = async {
        crate::stop_requested().await;
        eprintln!("serve-multi: shutting down");
    };
    crate::serve_http(listener, app, header_timeout, stop).await;
    tokio::task::spawn_blocking(move || sup.shutdown())
        .await
        .map_err(|e| StartError(format!("stopping the engine: {e}")))
}

/// Where each model stands, for `/status`.
fn model_states(sup: &Supervisor) -> Vec<Value> {
    let st = sup.lock();
    sup.config
        .models
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let state = if st.loaded() == Some(i) && st.phase == Phase::Serving {
                "loaded"
            } else if st.phase == Phase::Loading(i) {
                "loading"
            } else if st.loaded() == Some(i) {
                "draining"
            } else if st.queue.contains(&i) || st.target() == Some(i) {
                "queued"
            } else if st.failed[i].is_some() {
                "failed"
            } else {
                "unloaded"
            };
            json!({
                "id": m.model,
                "aliases": m.aliases,
                "state": state,
                "waiting": st.waiting[i],
                "error": st.failed[i],
            })
        })
        .collect()
}

async fn ready(State(f): State<Front>) -> Response {
    let st = f.sup.lock();
    match st.phase {
        Phase::Serving => Json(json!({"status": "ready"})).into_response(),
        _ => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "switching"})),
        )
            .into_response(),
    }
}

async fn status(State(f): State<Front>) -> Json<Value> {
    let (loaded, target, queued, in_flight, switches) = {
        let st = f.sup.lock();
        let name = |i: usize| f.sup.config.models[i].model.clone();
        (
            st.loaded().map(name),
            st.target().map(name),
            st.queue.iter().map(|&i| name(i)).collect::<Vec<_>>(),
            st.in_flight,
            st.switches,
        )
    };
    // The loaded engine's own status (memory plan, queue, metrics), when it answers.
    let engine = match f.sup.serving_port() {
        Some((port, _guard)) => fetch_json(&f, port, "/status").await,
        None => None,
    };
    Json(json!({
        "status": if target.is_some() { "switching" } else { "ready" },
        "mode": "serve-multi",
        "loaded": loaded,
        "switch_target": target,
        "queued": queued,
        "in_flight": in_flight,
        "switches": switches,
        "models": model_states(&f.sup),
        "engine": engine,
        "version": env!("CARGO_PKG_VERSION"),
    }))
}

async fn fetch_json(f: &Front, port: u16, path: &str) -> Option<Value> {
    let uri: Uri = format!("http://127.0.0.1:{port}{path}").parse().ok()?;
    let mut req = hyper::Request::get(uri)
        .body(Full::new(Bytes::new()))
        .ok()?;
    if let Some(k) = &f.config.api_key {
        let v = HeaderValue::from_str(&format!("Bearer {k}")).ok()?;
        req.headers_mut().insert(header::AUTHORIZATION, v);
    }
    // A stuck engine must not hold `/status` (nor, through its in-flight count, a switch).
    let fetch = async {
        let resp = f.client.request(req).await.ok()?;
        resp.into_body().collect().await.ok().map(|b| b.to_bytes())
    };
    let body = tokio::time::timeout(Duration::from_secs(2), fetch)
        .await
        .ok()??;
    serde_json::from_slice(&body).ok()
}

fn model_card(f: &Front, name: &str, model: usize) -> Value {
    let loaded = f.sup.lock().loaded() == Some(model);
    json!({
        "id": name,
        "object": "model",
        "created": crate::routes::unix_now(),
        "owned_by": "splash",
        "root": f.sup.config.models[model].model,
        "loaded": loaded,
    })
}

async fn models(State(f): State<Front>) -> Json<Value> {
    let mut data = Vec::new();
    let mut typesafe = Vec::new();
    for (i, m) in f.sup.config.models.iter().enumerate() {
        for name in m.names() {
            data.push(model_card(&f, name, i));
            typesafe.push(json!({"name": name, "description": format!("served by splash serve-multi ({})", m.model), "release_date": ""}));
        }
    }
    Json(json!({"object": "list", "data": data, "models": typesafe}))
}

async fn model_by_id(
    State(f): State<Front>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Result<Json<Value>, ApiError> {
    match f.sup.config.find(&id) {
        Some(i) => Ok(Json(model_card(&f, &id, i))),
        None => Err(unknown_model(&f, &id)),
    }
}

fn unknown_model(f: &Front, name: &str) -> ApiError {
    let names: Vec<String> = f.sup.config.names().iter().map(|s| s.to_string()).collect();
    ApiError::model_not_found(name, &names)
}

/// Forwards a request to the engine of the model it names.
async fn forward(State(f): State<Front>, req: Request) -> Response {
    let path = req.uri().path().to_string();
    match forward_inner(&f, req).await {
        Ok(resp) => resp,
        Err(e) => for_path(&path, e),
    }
}

async fn forward_inner(f: &Front, req: Request) -> Result<Response, ApiError> {
    let (mut parts, body) = req.into_parts();
    let limit = f.config.max_request_size;
    let read = tokio::time::timeout(
        f.config.body_read_timeout,
        axum::body::to_bytes(body, limit),
    );
    let body = read
        .await
        .map_err(|_| ApiError::body_timeout(f.config.body_read_timeout))?
        .map_err(|_| ApiError::too_large(limit))?;
    let (port, in_flight) = if parts.method == Method::POST {
        let named = serde_json::from_slice::<Value>(&body)
            .ok()
            .and_then(|v| v.get("model")?.as_str().map(str::to_string))
            .filter(|m| !m.is_empty());
        let model = match named {
            Some(name) => f
                .sup
                .config
                .find(&name)
                .ok_or_else(|| unknown_model(f, &name))?,
            None => f.sup.default_model(),
        };
        f.sup.acquire(model).await.map_err(|r| refusal(f, r))?
    } else {
        // Reads (the page, /metrics, stored responses) go to the loaded model; they never load one.
        f.sup.serving_port().ok_or_else(|| {
            let mut e = ApiError::overloaded(
                "no model is loaded now (or a switch is in progress): send a request that names a model, then retry",
            );
            e.code = Some("model_switching");
            e.retry_after = Some(RETRY_AFTER);
            e
        })?
    };
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    parts.uri = format!("http://127.0.0.1:{port}{path}")
        .parse()
        .map_err(|e| ApiError::bad_request(format!("cannot forward {path}: {e}")))?;
    // Hop-by-hop headers stay here; the engine sees itself as the host (its own Host check).
    for h in [
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    ] {
        parts.headers.remove(HeaderName::from_static(h));
    }
    let host = HeaderValue::from_str(&format!("127.0.0.1:{port}")).expect("valid");
    parts.headers.insert(header::HOST, host);
    if parts.headers.contains_key(header::ORIGIN) {
        let origin = HeaderValue::from_str(&format!("http://127.0.0.1:{port}")).expect("valid");
        parts.headers.insert(header::ORIGIN, origin);
    }
    let upstream = hyper::Request::from_parts(parts, Full::new(body));
    let resp = f.client.request(upstream).await.map_err(|e| {
        let mut err = ApiError::engine(format!("the model's engine did not answer: {e}"));
        err.status = StatusCode::BAD_GATEWAY;
        err.code = Some("upstream_error");
        err
    })?;
    // The response streams through; the request counts in flight until its last byte.
    let (parts, body) = resp.into_parts();
    let body = body.map_frame(move |frame| {
        let _ = &in_flight;
        frame
    });
    Ok(Response::from_parts(parts, Body::new(body)))
}

fn refusal(f: &Front, r: Refusal) -> ApiError {
    match r {
        Refusal::Switching { target } => {
            let mut e = ApiError::overloaded(format!(
                "the model was not loaded within the switch timeout{}; retry shortly (or start serve-multi with a longer --switch-timeout)",
                match target {
                    Some(t) => format!(" (switching to {})", f.sup.config.models[t].model),
                    None => String::new(),
                }
            ));
            e.code = Some("model_switching");
            e.retry_after = Some(RETRY_AFTER);
            e
        }
        Refusal::LoadFailed(why) => {
            let mut e = ApiError::overloaded(why);
            e.code = Some("model_load_failed");
            e.retry_after = Some(RETRY_AFTER);
            e
        }
    }
}
