//! The HTTP front of splash: an OpenAI-compatible API over one engine, hardened for local use.
//!
//! [`serve`] binds the address, starts the engine [`worker`] thread and serves [`router`]
//! until Ctrl+C. Every request goes through the access guard ([`guard`]: Host, Origin, API
//! key), is parsed strictly ([`json`]: errors name the field), translated once into an engine
//! request, and answered in the API's own shape, streamed as SSE or whole.

mod anthropic;
mod config;
mod constraint;
mod error;
mod guard;
mod ids;
mod json;
mod metrics;
mod openai;
mod output;
mod plan;
mod reasoning;
mod responses;
mod routes;
mod state;
mod tool_calls;
mod webui;
mod worker;

pub use config::{parse_size, ServerConfig};
pub use state::AppState;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use splash_engine::Engine;
use splash_model::Model;

/// Builds the application: every route, the access guard and the error fallbacks.
pub fn router(state: AppState) -> Router {
    routes::router(state)
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
    let mut engine = Engine::new(model.clone())
        .with_kv_format(config.kv_format)
        .with_grammar_warmup();
    // The context limit and the lanes come from the memory plan; a configuration that cannot
    // serve one request stops here with the budget breakdown.
    let plan = plan::plan(&model, &config).map_err(|e| StartError(e.to_string()))?;
    engine = engine
        .with_max_context(plan.context)
        .with_prefix_cache(plan.prefix_cache_bytes as usize);
    config.lanes = plan.lanes;
    config.memory_plan = Some(plan);
    if let Some(drafter) = &config.drafter {
        engine = engine
            .with_drafter(drafter.clone())
            .with_draft_every_step(config.draft_every_step);
    }
    let state = AppState::new(model, engine, config);
    state.print_summary(local);
    if !local.ip().is_loopback() && state.config.api_key.is_none() {
        eprintln!(
            "warning: listening on {} without an API key: anyone who can reach this address can use the model; set --api-key or SPLASH_API_KEY",
            local.ip()
        );
    }
    let shutdown = state.shutdown.clone();
    let app = router(state);
    let host = match local.ip() {
        ip if ip.is_unspecified() => "127.0.0.1".to_string(),
        std::net::IpAddr::V6(ip) => format!("[{ip}]"),
        ip => ip.to_string(),
    };
    eprintln!("Ready: http://{host}:{}", local.port());
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            let _ = tokio::signal::ctrl_c().await;
            eprintln!("shutting down: finishing open responses (Ctrl+C again to exit at once)");
            let _ = shutdown.send(true);
            tokio::spawn(async {
                let _ = tokio::signal::ctrl_c().await;
                std::process::exit(130);
            });
        })
        .await
        .map_err(|e| StartError(format!("server error: {e}")))
}
