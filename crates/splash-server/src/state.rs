//! What every handler shares: the model, the settings, the engine worker and the counters.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::FromRef;
use splash_engine::{Engine, GrammarTables};
use splash_model::Model;
use tokio::sync::watch;

use crate::config::ServerConfig;
use crate::error::ApiError;
use crate::images::Vision;
use crate::metrics::Metrics;
use crate::responses::ResponseStore;
use crate::scoring::AnswerSlots;
use crate::worker::Worker;

/// Memory for stored Responses-API conversations.
const RESPONSE_STORE_BYTES: usize = 64 << 20;

/// Shared server state (cheap to clone).
#[derive(Clone)]
pub struct AppState {
    pub model: Arc<Model>,
    pub config: Arc<ServerConfig>,
    pub worker: Arc<Worker>,
    pub metrics: Arc<Metrics>,
    /// Model id first, then aliases.
    pub model_ids: Arc<Vec<String>>,
    /// Prompt + output limit in tokens.
    pub max_context: usize,
    /// Set to true on Ctrl+C: open streams end with an error event.
    pub shutdown: Arc<watch::Sender<bool>>,
    /// Stored Responses-API responses (for `previous_response_id`).
    pub responses: Arc<ResponseStore>,
    pub started: Instant,
    /// The engine's constrained-decoding tables (built once, shared): requests' grammars are
    /// checked with them before they are queued.
    pub grammar_tables: GrammarTables,
    /// The tokenizer's answer slots for scoring, or why the model cannot score.
    pub answer_slots: Arc<Result<AnswerSlots, String>>,
    /// The vision tower, for a model that takes images (and not `--language-only`).
    pub vision: Option<Arc<Vision>>,
}

// The middlewares take only what they use.
impl FromRef<AppState> for Arc<ServerConfig> {
    fn from_ref(s: &AppState) -> Self {
        s.config.clone()
    }
}

impl FromRef<AppState> for Arc<Metrics> {
    fn from_ref(s: &AppState) -> Self {
        s.metrics.clone()
    }
}

impl AppState {
    /// Starts the engine worker for `engine` and gathers the shared state.
    pub fn new(
        model: Arc<Model>,
        engine: Engine,
        config: ServerConfig,
        vision: Option<Arc<Vision>>,
    ) -> Self {
        let metrics = Arc::new(Metrics::default());
        let max_context = engine.max_context();
        let grammar_tables = engine.grammar_tables();
        let worker = Worker::spawn(engine, config.lanes, config.queue_size, metrics.clone());
        let id = config.model_name.clone().unwrap_or_else(|| {
            model
                .dir
                .canonicalize()
                .unwrap_or_else(|_| model.dir.clone())
                .file_name()
                .map(|n| n.to_string_lossy().trim_end_matches(".gguf").to_string())
                .unwrap_or_else(|| "model".into())
        });
        let mut model_ids = vec![id];
        for alias in &config.served_model_names {
            if !model_ids.contains(alias) {
                model_ids.push(alias.clone());
            }
        }
        let answer_slots = Arc::new(AnswerSlots::build(&model));
        if let Err(why) = answer_slots.as_ref() {
            tracing::warn!("/v1/judgments and /v1/systemone are unavailable: {why}");
        }
        Self {
            answer_slots,
            config: Arc::new(config),
            worker: Arc::new(worker),
            metrics,
            model_ids: Arc::new(model_ids),
            max_context,
            shutdown: Arc::new(watch::channel(false).0),
            responses: Arc::new(ResponseStore::new(RESPONSE_STORE_BYTES)),
            model,
            started: Instant::now(),
            grammar_tables,
            vision,
        }
    }

    /// The id the API reports.
    pub fn model_id(&self) -> &str {
        &self.model_ids[0]
    }

    /// Checks a request's optional `model` field; returns the name to echo back.
    pub fn resolve_model(&self, requested: Option<&str>) -> Result<String, ApiError> {
        match requested {
            None | Some("") => Ok(self.model_id().to_string()),
            Some(m) if self.model_ids.iter().any(|id| id == m) => Ok(m.to_string()),
            Some(m) => Err(ApiError::model_not_found(m, &self.model_ids)),
        }
    }

    /// KV-cache bytes one token takes in every attention layer together.
    pub fn kv_bytes_per_token(&self) -> usize {
        self.model.config.kv_bytes_per_token(self.config.kv_format)
    }

    /// The startup summary on stderr.
    pub fn print_summary(&self, addr: SocketAddr) {
        let c = &self.model.config;
        eprintln!(
            "splash {}: model {} ({}, {} parameters, {} layers, vocabulary {}) on {}",
            env!("CARGO_PKG_VERSION"),
            self.model_id(),
            self.model.dir.display(),
            self.model.graph.num_parameters(),
            c.num_layers(),
            c.vocab_size,
            self.model.graph.device()
        );
        eprintln!(
            "  context limit {} tokens; weights {:.1} MiB of {:?} (memory-mapped); KV cache {:?}, {} bytes per token; {} decode lanes, queue {}",
            self.max_context,
            self.model.weight_bytes as f64 / (1 << 20) as f64,
            self.model.format,
            self.config.kv_format,
            self.kv_bytes_per_token(),
            self.config.lanes,
            self.config.queue_size
        );
        if let Some(plan) = &self.config.memory_plan {
            eprintln!("  {}", plan.summary());
        }
        match &self.vision {
            Some(v) => {
                let m = v.memory();
                eprintln!(
                    "  images: vision tower on {} ({:.1} MiB RAM, {:.1} MiB GPU for the largest image), images resized to at most {} pixels",
                    v.device(),
                    m.ram as f64 / (1 << 20) as f64,
                    m.gpu as f64 / (1 << 20) as f64,
                    self.config.max_image_pixels
                )
            }
            None if self.config.language_only => eprintln!("  images: off (--language-only)"),
            None => {}
        }
        eprintln!(
            "  listening on {addr}; API key {}; aliases: {}",
            if self.config.api_key.is_some() {
                "required"
            } else {
                "not required"
            },
            if self.model_ids.len() > 1 {
                self.model_ids[1..].join(", ")
            } else {
                "none".into()
            }
        );
    }
}
