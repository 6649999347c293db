//! Counters and latency histograms, rendered for `/status` (JSON) and `/metrics` (Prometheus).

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use serde_json::json;

use splash_engine::SpecStats;

use crate::worker::Usage;

/// Bucket bounds of the per-request acceptance length τ (tokens per target pass).
const ACCEPTANCE_BOUNDS: [f64; 9] = [1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0];

/// Acceptance lengths of the last requests kept for `/status`.
const RECENT_ACCEPTANCE: usize = 16;

const LATENCY_BOUNDS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

#[derive(Clone, Default)]
struct Histogram {
    counts: [u64; LATENCY_BOUNDS.len()],
    count: u64,
    sum: f64,
}

impl Histogram {
    fn observe(&mut self, v: f64) {
        for (c, &b) in self.counts.iter_mut().zip(&LATENCY_BOUNDS) {
            if v <= b {
                *c += 1;
            }
        }
        self.count += 1;
        self.sum += v;
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (c, b) in self.counts.iter().zip(&LATENCY_BOUNDS) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {c}");
        }
        let _ = writeln!(
            out,
            "{name}_bucket{{le=\"+Inf\"}} {}\n{name}_sum {}\n{name}_count {}",
            self.count, self.sum, self.count
        );
    }
}

#[derive(Default)]
struct Counters {
    /// The engine's prefix cache, as of its last step.
    prefix_cache: splash_engine::PrefixCacheStats,
    batches: splash_engine::BatchStats,
    requests: BTreeMap<(String, u16), u64>,
    prompt_tokens: u64,
    generated_tokens: u64,
    generations: u64,
    prefill_seconds: f64,
    decode_seconds: f64,
    request_seconds: Histogram,
    ttft_seconds: Histogram,
    /// Speculation: summed counters, per-request τ histogram, the last requests' τ.
    spec: SpecStats,
    spec_requests: u64,
    acceptance: [u64; ACCEPTANCE_BOUNDS.len()],
    acceptance_sum: f64,
    recent_acceptance: VecDeque<f64>,
}

/// Server-wide counters.
#[derive(Default)]
pub struct Metrics {
    inner: Mutex<Counters>,
}

impl Metrics {
    fn with<R>(&self, f: impl FnOnce(&mut Counters) -> R) -> R {
        f(&mut self.inner.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// A finished generation.
    pub fn record_generation(&self, u: &Usage) {
        self.with(|c| {
            c.generations += 1;
            c.prompt_tokens += u.prompt_tokens as u64;
            c.generated_tokens += u.completion_tokens as u64;
            c.prefill_seconds += u.prefill.as_secs_f64();
            c.decode_seconds += u.decode.as_secs_f64();
            if let Some(st) = u.speculation.filter(|st| st.target_passes > 0) {
                let tau = st.acceptance_length();
                c.spec.add(&st);
                c.spec_requests += 1;
                c.acceptance_sum += tau;
                for (n, &b) in c.acceptance.iter_mut().zip(&ACCEPTANCE_BOUNDS) {
                    if tau <= b {
                        *n += 1;
                    }
                }
                if c.recent_acceptance.len() == RECENT_ACCEPTANCE {
                    c.recent_acceptance.pop_front();
                }
                c.recent_acceptance.push_back(tau);
            }
        });
    }

    /// The prefix cache's and the batched decode's counters after an engine step.
    pub fn set_engine(
        &self,
        cache: splash_engine::PrefixCacheStats,
        batches: splash_engine::BatchStats,
    ) {
        self.with(|c| {
            c.prefix_cache = cache;
            c.batches = batches;
        });
    }

    /// Time from request arrival to the first generated text.
    pub fn observe_ttft(&self, secs: f64) {
        self.with(|c| c.ttft_seconds.observe(secs));
    }

    fn record_request(&self, route: String, status: u16, secs: f64) {
        self.with(|c| {
            *c.requests.entry((route, status)).or_default() += 1;
            c.request_seconds.observe(secs);
        });
    }

    /// Counters for `/status`.
    pub fn snapshot(&self) -> serde_json::Value {
        self.with(|c| {
            json!({
                "requests_total": c.requests.values().sum::<u64>(),
                "generations_total": c.generations,
                "prompt_tokens_total": c.prompt_tokens,
                "generated_tokens_total": c.generated_tokens,
                "prefill_seconds_total": c.prefill_seconds,
                "decode_seconds_total": c.decode_seconds,
                "prefill_tokens_per_second": if c.prefill_seconds > 0.0 { c.prompt_tokens as f64 / c.prefill_seconds } else { 0.0 },
                "decode_tokens_per_second": if c.decode_seconds > 0.0 { c.generated_tokens as f64 / c.decode_seconds } else { 0.0 },
                "prefix_cache": {
                    "entries": c.prefix_cache.entries,
                    "bytes": c.prefix_cache.bytes,
                    "budget_bytes": c.prefix_cache.budget_bytes,
                    "lookups_total": c.prefix_cache.lookups,
                    "hits_total": c.prefix_cache.hits,
                    "hit_tokens_total": c.prefix_cache.hit_tokens,
                    "evictions_total": c.prefix_cache.evictions,
                    "disk_hits_total": c.prefix_cache.disk_hits,
                    "disk_hit_tokens_total": c.prefix_cache.disk_hit_tokens,
                    "disk": c.prefix_cache.disk.map(|d| json!({
                        "entries": d.entries,
                        "bytes": d.bytes,
                        "budget_bytes": d.budget_bytes,
                        "writes_total": d.writes,
                        "evictions_total": d.evictions,
                        "discarded_files_total": d.errors,
                    })),
                },
                "batching": {
                    "decode_passes_total": c.batches.passes,
                    "sequences_per_pass": if c.batches.passes > 0 { c.batches.sequences as f64 / c.batches.passes as f64 } else { 0.0 },
                    "rows_per_pass": if c.batches.passes > 0 { c.batches.rows as f64 / c.batches.passes as f64 } else { 0.0 },
                    "prefill_pending_tokens": c.batches.prefill_pending,
                    "preemptions_total": c.batches.preemptions,
                    "resumed_from_cache_total": c.batches.resumed_cached,
                    "resumed_by_recompute_total": c.batches.resumed_recomputed,
                    "preempted_now": c.batches.parked,
                },
                "speculation": {
                    "requests_total": c.spec_requests,
                    "target_passes_total": c.spec.target_passes,
                    "draft_tokens_total": c.spec.drafted,
                    "accepted_tokens_total": c.spec.accepted,
                    "acceptance_length": c.spec.acceptance_length(),
                    "acceptance_rate": if c.spec.drafted > 0 { c.spec.accepted as f64 / c.spec.drafted as f64 } else { 0.0 },
                    "recent_acceptance_lengths": c.recent_acceptance.iter().collect::<Vec<_>>(),
                },
            })
        })
    }

    /// Prometheus text exposition.
    pub fn render(&self, waiting: usize, running: usize) -> String {
        self.with(|c| {
            let mut out = String::new();
            let _ = writeln!(out, "# HELP splash_requests_total HTTP requests by route and status.\n# TYPE splash_requests_total counter");
            for ((route, status), n) in &c.requests {
                let _ = writeln!(out, "splash_requests_total{{route=\"{route}\",status=\"{status}\"}} {n}");
            }
            for (name, help, v) in [
                ("splash_prompt_tokens_total", "Prompt tokens prefilled.", c.prompt_tokens as f64),
                ("splash_generation_tokens_total", "Tokens generated.", c.generated_tokens as f64),
                ("splash_prefill_seconds_total", "Seconds spent in prefill.", c.prefill_seconds),
                ("splash_decode_seconds_total", "Seconds spent in decode.", c.decode_seconds),
                ("splash_spec_target_passes_total", "Speculative verify passes of the target.", c.spec.target_passes as f64),
                ("splash_spec_draft_tokens_total", "Tokens proposed by the draft.", c.spec.drafted as f64),
                ("splash_spec_accepted_tokens_total", "Draft tokens the target accepted.", c.spec.accepted as f64),
                ("splash_prefix_cache_hits_total", "Requests that resumed from a cached prompt prefix.", c.prefix_cache.hits as f64),
                ("splash_prefix_cache_hit_tokens_total", "Prompt tokens restored from the prefix cache instead of prefilled.", c.prefix_cache.hit_tokens as f64),
                ("splash_prefix_cache_disk_hits_total", "Prefix-cache hits read back from the disk tier.", c.prefix_cache.disk_hits as f64),
                ("splash_prefix_cache_disk_writes_total", "States written to the disk tier.", c.prefix_cache.disk.map_or(0, |d| d.writes) as f64),
                ("splash_prefix_cache_disk_discarded_total", "Disk-tier files found damaged or foreign and deleted.", c.prefix_cache.disk.map_or(0, |d| d.errors) as f64),
                ("splash_batch_passes_total", "Batched forward passes of decoding sequences.", c.batches.passes as f64),
                ("splash_batch_sequences_total", "Sequences served by those passes, summed.", c.batches.sequences as f64),
                ("splash_batch_rows_total", "Token rows run by those passes, summed.", c.batches.rows as f64),
                ("splash_preemptions_total", "Sequences preempted to stay within the KV budget.", c.batches.preemptions as f64),
            ] {
                let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
            }
            for (name, help, v) in [
                ("splash_queue_depth", "Requests waiting for a decode lane.", waiting),
                ("splash_running_requests", "Requests being prefilled or decoded.", running),
                ("splash_prefill_pending_tokens", "Prompt tokens of running requests still to prefill.", c.batches.prefill_pending),
                ("splash_preempted_requests", "Requests preempted now, waiting for KV room.", c.batches.parked),
            ] {
                let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
            }
            let name = "splash_spec_acceptance_length";
            let _ = writeln!(out, "# HELP {name} Tokens per target pass (accepted drafts + 1) of each speculative request.\n# TYPE {name} histogram");
            for (n, b) in c.acceptance.iter().zip(&ACCEPTANCE_BOUNDS) {
                let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {n}");
            }
            let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}\n{name}_sum {}\n{name}_count {}", c.spec_requests, c.acceptance_sum, c.spec_requests);
            c.request_seconds.render(&mut out, "splash_request_duration_seconds", "Time to the end of the response headers (streams: to the first byte).");
            c.ttft_seconds.render(&mut out, "splash_time_to_first_token_seconds", "Time from request arrival to the first generated text.");
            out
        })
    }
}

/// Middleware: counts every request by matched route and status.
pub async fn track(State(metrics): State<Arc<Metrics>>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_string())
        .unwrap_or_else(|| "unmatched".into());
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let agent = req
        .headers()
        .get(axum::http::header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .to_string();
    let t0 = Instant::now();
    let resp = next.run(req).await;
    let secs = t0.elapsed().as_secs_f64();
    // One line per request with SPLASH_LOG=info (streams: logged when the stream starts).
    tracing::info!(target: "splash::http", "{method} {path} {} {:.1} ms \"{agent}\"", resp.status().as_u16(), secs * 1e3);
    metrics.record_request(route, resp.status().as_u16(), secs);
    resp
}
