//! The HTTP front of splash: an OpenAI-compatible API over one engine, hardened for local use.
//!
//! [`serve`] binds the address, starts the engine [`worker`] thread and serves [`router`]
//! until Ctrl+C. Every request goes through the access guard ([`guard`]: Host, Origin, API
//! key), is parsed strictly ([`json`]: errors name the field), translated once into an engine
//! request, and answered in the API's own shape, streamed as SSE or whole.

mod anthropic;
mod config;
mod constraint;
mod content_cache;
mod documents;
mod error;
mod grammar_check;
mod guard;
mod ids;
mod images;
mod json;
mod metrics;
mod multi;
mod openai;
mod output;
mod plan;
mod prompt;
mod reasoning;
mod responses;
mod routes;
mod scoring;
mod state;
mod tool_calls;
mod webui;
mod worker;

/// Test fixtures generated at test time (the real-vocabulary checkpoint's weights).
#[cfg(test)]
#[path = "../../../tests/fixtures/derived.rs"]
mod derived;

pub use config::{parse_duration, parse_size, DiskCacheSettings, ServerConfig};
pub use images::{DEFAULT_MAX_IMAGE_PIXELS, MIN_MAX_IMAGE_PIXELS};
pub use multi::{check_arguments, serve_multi, MultiConfig, MultiOptions};
pub use state::AppState;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use splash_engine::{DiskCacheConfig, Engine};
use splash_model::Model;

/// Builds the application: every route, the access guard and the error fallbacks.
pub fn router(state: AppState) -> Router {
    routes::router(state)
}

/// What a disk-tier file must have been written by: the checkpoint (its directory, weight
/// bytes and format), the KV format and the draft. A file under another identity is not used.
fn cache_identity(model: &Model, config: &ServerConfig) -> String {
    let dir = model
        .dir
        .canonicalize()
        .unwrap_or_else(|_| model.dir.clone());
    let draft = config.drafter.as_ref().map_or("none".to_string(), |d| {
        format!("{d:?}, {} weight bytes", d.memory().weights)
    });
    format!(
        "splash state images v1\nmodel {} ({} weight bytes, {:?})\nKV {:?}\ndraft {draft}\n",
        dir.display(),
        model.weight_bytes,
        model.format,
        config.kv_format
    )
}

/// Why the server could not start.
#[derive(Debug)]
pub struct StartError(pub String);

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for StartError {}

/// The model's vision tower: from its directory, or for a GGUF model from `--mmproj` or an
/// `mmproj*.gguf` beside it (one that cannot be read is skipped with a warning, unless named).
fn load_vision(model: &Model, config: &ServerConfig) -> Result<Option<images::Vision>, StartError> {
    let fail = |e: String| {
        StartError(format!(
            "cannot load the vision tower: {e}; to serve text only, add --language-only"
        ))
    };
    if config.language_only {
        return Ok(None);
    }
    let placed = |mut v: images::Vision| {
        v.place_like(&model.graph);
        v
    };
    if model.dir.is_dir() {
        return Ok(images::Vision::load(&model.dir, config.max_image_pixels)
            .map_err(fail)?
            .map(placed));
    }
    if let Some(path) = &config.mmproj {
        let v = images::Vision::load_gguf(path, config.max_image_pixels)
            .map_err(|e| fail(format!("{}: {e}", path.display())))?;
        return Ok(Some(placed(v)));
    }
    let Some(path) = splash_model::mmproj_beside(&model.dir) else {
        return Ok(None);
    };
    match images::Vision::load_gguf(&path, config.max_image_pixels) {
        Ok(v) => Ok(Some(placed(v))),
        Err(e) => {
            tracing::warn!(
                "{}: not used as the vision tower ({e}); serving text only",
                path.display()
            );
            Ok(None)
        }
    }
}

/// Binds the configured address; call before loading the model so a taken port is reported
/// at once.
pub async fn bind(config: &ServerConfig) -> Result<tokio::net::TcpListener, StartError> {
    let addr = format!("{}:{}", config.host, config.port);
    tokio::net::TcpListener::bind(&addr).await.map_err(|e| {
        if e.kind() == std::io::ErrorKind::AddrInUse {
            StartError(format!(
                "port {} on {} is already in use (another splash or another server?): stop it, or choose another port with --port",
                config.port, config.host
            ))
        } else {
            StartError(format!("cannot listen on {addr}: {e}"))
        }
    })
}

/// Serves `model` on `listener` until Ctrl+C (a second Ctrl+C exits at once). Prints a startup
/// summary and a `Ready: URL` line on stderr once the socket accepts connections.
pub async fn serve(
    listener: tokio::net::TcpListener,
    model: Arc<Model>,
    mut config: ServerConfig,
) -> Result<(), StartError> {
    let local: SocketAddr = listener
        .local_addr()
        .map_err(|e| StartError(e.to_string()))?;
    let vision = load_vision(&model, &config)?.map(Arc::new);
    let mut engine = Engine::new(model.clone())
        .with_kv_format(config.kv_format)
        .with_grammar_warmup();
    // The context limit and the lanes come from the memory plan; a configuration that cannot
    // serve one request stops here with the budget breakdown.
    let vision_memory = vision.as_ref().map(|v| v.memory()).unwrap_or_default();
    let plan = plan::plan(&model, &config, vision_memory).map_err(|e| StartError(e.to_string()))?;
    engine = engine
        .with_max_context(plan.context)
        .with_kv_budget(usize::try_from(plan.kv_tokens).unwrap_or(usize::MAX))
        .with_prefix_cache(plan.prefix_cache_bytes as usize);
    config.lanes = plan.lanes;
    config.memory_plan = Some(plan);
    if let Some(drafter) = &config.drafter {
        engine = engine
            .with_drafter(drafter.clone())
            .with_draft_every_step(config.draft_every_step);
    }
    let mut disk_line = None;
    if let Some(d) = &config.disk_cache {
        let budget = d.budget();
        if budget == 0 {
            return Err(StartError(format!(
                "--max-cache-disk auto: no free disk space found at {}; give a size (e.g. --max-cache-disk 20G) or another --cache-dir",
                d.dir.display()
            )));
        }
        let disk = DiskCacheConfig {
            root: d.dir.clone(),
            budget_bytes: budget,
            persistent: d.persistent,
            identity: cache_identity(&model, &config),
        };
        engine = engine.with_disk_cache(disk).map_err(|e| {
            StartError(format!(
                "cannot use {} for the prefix cache's disk tier: {e}; choose another --cache-dir",
                d.dir.display()
            ))
        })?;
        disk_line = Some(format!(
            "  prefix cache on disk: {} ({:.1} GiB{}, {})",
            engine.disk_cache_dir().unwrap_or(&d.dir).display(),
            budget as f64 / (1u64 << 30) as f64,
            if d.max_bytes.is_none() { ", auto" } else { "" },
            if d.persistent {
                "kept across restarts"
            } else {
                "removed at exit"
            }
        ));
    }
    let state_header_timeout = config.header_read_timeout;
    let state = AppState::new(model, engine, config, vision);
    state.print_summary(local);
    if let Some(line) = disk_line {
        eprintln!("{line}");
    }
    if !local.ip().is_loopback() && state.config.api_key.is_none() {
        eprintln!(
            "warning: listening on {} without an API key: anyone who can reach this address can use the model; set --api-key or SPLASH_API_KEY",
            local.ip()
        );
    }
    let shutdown = state.shutdown.clone();
    let worker = state.worker.clone();
    let app = router(state);
    let host = match local.ip() {
        ip if ip.is_unspecified() => "127.0.0.1".to_string(),
        std::net::IpAddr::V6(ip) => format!("[{ip}]"),
        ip => ip.to_string(),
    };
    eprintln!("Ready: http://{host}:{}", local.port());
    let header_timeout = state_header_timeout;
    let stop = async move {
        stop_requested().await;
        eprintln!("shutting down: finishing open responses (Ctrl+C again to exit at once)");
        let _ = shutdown.send(true);
        tokio::spawn(async {
            let _ = tokio::signal::ctrl_c().await;
            std::process::exit(130);
        });
    };
    serve_http(listener, app, header_timeout, stop).await;
    // The engine's drop writes (persistent) or removes the disk tier's files.
    tokio::task::spawn_blocking(move || worker.stop())
        .await
        .map_err(|e| StartError(format!("stopping the engine: {e}")))
}

/// Resolves on Ctrl+C or SIGTERM (systemd, docker stop): the same orderly shutdown.
async fn stop_requested() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let terminated = async {
        match term.as_mut() {
            Some(t) => {
                t.recv().await;
            }
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminated => {}
    }
}

/// Serves HTTP/1.1 connections until `stop` completes, then lets open requests finish.
///
/// Like `axum::serve`, plus a header read timeout (hyper applies it only with a timer, which
/// `axum::serve` does not set): a client that dribbles its headers, or a keep-alive connection
/// left idle, is closed after `header_timeout` instead of held forever.
async fn serve_http(
    listener: tokio::net::TcpListener,
    app: Router,
    header_timeout: std::time::Duration,
    stop: impl std::future::Future<Output = ()>,
) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use hyper_util::service::TowerToHyperService;

    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    // Dropped when `stop` completes: every connection then shuts down gracefully.
    let (stopping_tx, stopping_rx) = tokio::sync::watch::channel(());
    // Each connection holds a receiver; `closed()` resolves once all are gone.
    let (open_tx, open_rx) = tokio::sync::watch::channel(());
    let mut stop = std::pin::pin!(stop);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: wait instead of spinning.
                    tracing::warn!("accepting a connection failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = &mut stop => break,
        };
        let _ = stream.set_nodelay(true);
        let conn =
            http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
        let mut stopping = stopping_rx.clone();
        let open = open_rx.clone();
        tokio::spawn(async move {
            let mut conn = std::pin::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = stopping.changed() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
            drop(open);
        });
    }
    drop(listener);
    drop(stopping_tx);
    drop(open_rx);
    open_tx.closed().await;
}
