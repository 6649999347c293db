//! The OpenAI API: request fields shared by chat and completions, the translation into an
//! engine request, and the two ways of answering (whole, or as SSE chunks).

pub mod chat;
pub mod completions;
mod conversation;

use std::convert::Infallible;
use std::time::{Duration, Instant};

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use splash_engine::{FinishReason, GrammarRequest, PromptImage, Request, SamplingParams};
use tokio::sync::mpsc;
use tokio::sync::mpsc::UnboundedReceiver;

pub use conversation::ChatInput;

use crate::error::ApiError;
use crate::state::AppState;
use crate::worker::{Usage, Work, WorkerEvent};

/// SSE comment interval while nothing else is sent (long prefills): well under the ~20 s
/// after which agent clients give up on a silent stream.
const KEEP_ALIVE: Duration = Duration::from_secs(5);

#[derive(Deserialize, Default)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// `stop`: one string or a list.
#[derive(Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

/// Fields that chat and completions requests share.
#[derive(Deserialize, Default)]
pub struct CommonFields {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub seed: Option<i64>,
    pub stop: Option<Stop>,
    pub n: Option<u64>,
    pub logprobs: Option<Value>,
    pub top_logprobs: Option<u64>,
    pub logit_bias: Option<Map<String, Value>>,
    pub ignore_eos: Option<bool>,
    #[serde(default)]
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
}

impl CommonFields {
    /// Options this server does not implement are refused, never ignored.
    pub fn check_supported(&self) -> Result<(), ApiError> {
        if self.n.is_some_and(|n| n != 1) {
            return Err(ApiError::invalid(
                "n",
                "only n=1 is supported: send one request per completion",
            ));
        }
        match &self.logprobs {
            None | Some(Value::Null) | Some(Value::Bool(false)) => {}
            Some(_) => {
                return Err(ApiError::invalid(
                    "logprobs",
                    "logprobs are not supported by this server; remove the field",
                ))
            }
        }
        if self.top_logprobs.is_some_and(|n| n > 0) {
            return Err(ApiError::invalid(
                "top_logprobs",
                "top_logprobs are not supported by this server; remove the field",
            ));
        }
        if self.logit_bias.as_ref().is_some_and(|m| !m.is_empty()) {
            return Err(ApiError::invalid(
                "logit_bias",
                "logit_bias is not supported by this server; remove the field",
            ));
        }
        Ok(())
    }

    fn stops(&self) -> Result<Vec<String>, ApiError> {
        let stops = match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        if stops.len() > 4 {
            return Err(ApiError::invalid(
                "stop",
                format!("at most 4 stop sequences are allowed, got {}", stops.len()),
            ));
        }
        Ok(stops.into_iter().filter(|s| !s.is_empty()).collect())
    }

    /// Whether the answer is streamed.
    pub fn streaming(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    /// Whether a streamed answer ends with a usage chunk.
    pub fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage)
    }

    fn sampling(&self, s: &AppState) -> Result<SamplingParams, ApiError> {
        let g = &s.model.generation;
        let p = SamplingParams {
            temperature: self.temperature.or(g.temperature).unwrap_or(1.0),
            top_k: match self.top_k {
                Some(k) if k > 0 => k as usize,
                Some(_) => 0, // 0 and -1 both mean "off" in vLLM and llama.cpp
                None => g.top_k.unwrap_or(0),
            },
            top_p: self.top_p.or(g.top_p).unwrap_or(1.0),
            min_p: self.min_p.unwrap_or(0.0),
            presence_penalty: self.presence_penalty.unwrap_or(0.0),
            frequency_penalty: self.frequency_penalty.unwrap_or(0.0),
            repetition_penalty: self.repetition_penalty.unwrap_or(1.0),
            seed: self.seed.map(|s| s as u64),
        };
        p.validate().map_err(|msg| {
            let param = msg.split_whitespace().next().unwrap_or("").to_string();
            ApiError::invalid(&param, msg)
        })?;
        Ok(p)
    }

    /// The engine request for `prompt`: checks the context limit and the output budget.
    /// `max_tokens` absent means `default_max`, or the rest of the context.
    pub fn engine_request(
        &self,
        s: &AppState,
        prompt: Vec<u32>,
        images: Vec<PromptImage>,
        max_tokens: Option<u64>,
        default_max: Option<usize>,
        grammar: Option<GrammarRequest>,
    ) -> Result<Request, ApiError> {
        let limit = s.max_context;
        if prompt.is_empty() {
            return Err(ApiError::bad_request("the prompt is empty"));
        }
        if prompt.len() >= limit {
            return Err(ApiError::context_length(format!(
                "the prompt has {} tokens but the context limit is {limit} tokens (prompt and output together): shorten the prompt",
                prompt.len()
            )));
        }
        let room = limit - prompt.len();
        let max_tokens = match max_tokens {
            Some(0) => return Err(ApiError::invalid("max_tokens", "max_tokens must be at least 1")),
            Some(m) if m > room as u64 => {
                return Err(ApiError::context_length(format!(
                    "the prompt has {} tokens and max_tokens is {m}: together they exceed the context limit of {limit} tokens; lower max_tokens to at most {room}",
                    prompt.len()
                )))
            }
            Some(m) => m as usize,
            None => default_max.unwrap_or(room).min(room),
        };
        Ok(Request {
            prompt,
            sampling: self.sampling(s)?,
            max_tokens,
            stop: self.stops()?,
            ignore_eos: self.ignore_eos.unwrap_or(false),
            grammar,
            images,
        })
    }
}

/// `finish_reason` as OpenAI names it.
pub fn finish_reason(f: &FinishReason) -> &'static str {
    match f {
        FinishReason::Eos(_)
        | FinishReason::StopString(_)
        | FinishReason::GrammarEnd
        | FinishReason::Failed(_)
        | FinishReason::Scored => "stop",
        FinishReason::Length | FinishReason::ContextFull => "length",
    }
}

/// The `usage` object.
pub fn usage_json(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    })
}

/// llama-server-style `timings` (plus the grammar mask time of constrained requests).
pub fn timings_json(u: &Usage) -> Value {
    let (pms, dms) = (u.prefill.as_secs_f64() * 1e3, u.decode.as_secs_f64() * 1e3);
    let rate = |n: usize, ms: f64| if ms > 0.0 { n as f64 / ms * 1e3 } else { 0.0 };
    let mut t = json!({
        "cache_n": u.cached_tokens,
        "prompt_n": u.prompt_tokens,
        "prompt_ms": pms,
        "prompt_per_second": rate(u.prompt_tokens, pms),
        "predicted_n": u.completion_tokens,
        "predicted_ms": dms,
        "predicted_per_second": rate(u.completion_tokens, dms),
    });
    if let Some((time, masks)) = u.grammar {
        t["grammar_mask_ms"] = (time.as_secs_f64() * 1e3).into();
        t["grammar_masks"] = masks.into();
    }
    t
}

/// Submits a generation to the worker; 503 when it is full.
pub fn submit(s: &AppState, request: Request) -> Result<UnboundedReceiver<WorkerEvent>, ApiError> {
    submit_work(s, Work::Generate(request))
}

/// Submits any work to the worker; 503 when it is full.
pub fn submit_work(s: &AppState, work: Work) -> Result<UnboundedReceiver<WorkerEvent>, ApiError> {
    if !s
        .worker
        .load
        .alive
        .load(std::sync::atomic::Ordering::SeqCst)
    {
        return Err(ApiError::engine(
            "the engine has stopped (see the server log); restart splash serve",
        ));
    }
    s.worker.submit(work).map_err(|_| {
        ApiError::overloaded(format!(
            "the server is busy: {} decode lanes and {} queue slots are taken; retry shortly (or start splash with a larger --queue-size)",
            s.config.lanes, s.config.queue_size
        ))
    })
}

/// Waits for the whole generation.
pub async fn collect(
    s: &AppState,
    mut rx: UnboundedReceiver<WorkerEvent>,
    t0: Instant,
) -> Result<(String, Usage), ApiError> {
    let mut text = String::new();
    let mut first = true;
    loop {
        match rx.recv().await {
            Some(WorkerEvent::Text(t)) => {
                if first {
                    s.metrics.observe_ttft(t0.elapsed().as_secs_f64());
                    first = false;
                }
                text.push_str(&t);
            }
            Some(WorkerEvent::Done(u)) => return Ok((text, u)),
            Some(WorkerEvent::Failed { message, invalid }) => {
                return Err(if invalid {
                    // The first line: a grammar error goes on with the grammar's text.
                    ApiError::bad_request(message.lines().next().unwrap_or_default())
                } else {
                    crate::grammar_check::engine_failure(&message)
                });
            }
            None => {
                return Err(ApiError::engine(
                    "the engine stopped before the answer was complete",
                ))
            }
        }
    }
}

/// One step of a stream, for the endpoint's chunk formatter.
pub enum Item {
    Text(String),
    Done(Usage),
}

/// How an API ends a stream: a final marker event (OpenAI's `data: [DONE]`), and how it
/// writes an error event.
pub struct StreamEnd {
    pub done: Option<Event>,
    pub error: fn(ApiError) -> Event,
}

impl StreamEnd {
    /// OpenAI: error objects as data, then `data: [DONE]`.
    pub fn openai() -> Self {
        Self {
            done: Some(Event::default().data("[DONE]")),
            error: |e| Event::default().data(e.body().to_string()),
        }
    }
}

/// Streams a generation as SSE: `initial` events first, then whatever `format` makes of each
/// item, then `end.done`. Engine failures and server shutdown end the stream with an error
/// event; a client that disconnects cancels the generation.
pub fn stream(
    s: &AppState,
    mut rx: UnboundedReceiver<WorkerEvent>,
    t0: Instant,
    initial: Vec<Event>,
    end: StreamEnd,
    mut format: impl FnMut(Item) -> Vec<Event> + Send + 'static,
) -> Response {
    let (tx, out) = mpsc::channel::<Event>(64);
    let mut shutdown = s.shutdown.subscribe();
    let metrics = s.metrics.clone();
    tokio::spawn(async move {
        let done = || end.done.clone();
        let error = end.error;
        for e in initial {
            if tx.send(e).await.is_err() {
                return;
            }
        }
        let mut first = true;
        loop {
            // (events to send, whether they end the stream)
            let (events, last) = tokio::select! {
                ev = rx.recv() => match ev {
                    Some(WorkerEvent::Text(t)) => {
                        if first {
                            metrics.observe_ttft(t0.elapsed().as_secs_f64());
                            first = false;
                        }
                        (format(Item::Text(t)), false)
                    }
                    Some(WorkerEvent::Done(u)) => {
                        let mut v = format(Item::Done(u));
                        v.extend(done());
                        (v, true)
                    }
                    Some(WorkerEvent::Failed { message, .. }) => (std::iter::once(error(crate::grammar_check::engine_failure(&message))).chain(done()).collect(), true),
                    None => (std::iter::once(error(ApiError::engine("the engine stopped before the answer was complete"))).chain(done()).collect(), true),
                },
                stopping = async { shutdown.wait_for(|stop| *stop).await.is_ok() } => {
                    if !stopping {
                        // The server state is gone; nothing will end this stream but the worker.
                        std::future::pending::<()>().await;
                    }
                    let mut e = ApiError::overloaded("the server is shutting down; this answer was cut short");
                    e.code = Some("shutting_down");
                    (std::iter::once(error(e)).chain(done()).collect(), true)
                }
                _ = tx.closed() => return, // client gone: dropping `rx` cancels the generation
            };
            for e in events {
                if tx.send(e).await.is_err() {
                    return;
                }
            }
            if last {
                return;
            }
        }
    });
    let body = futures_util::stream::unfold(out, |mut out| async move {
        out.recv().await.map(|e| (Ok::<_, Infallible>(e), out))
    });
    Sse::new(body)
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE).text("keep-alive"))
        .into_response()
}
