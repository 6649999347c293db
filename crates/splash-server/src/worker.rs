//! The engine thread: owns the [`Engine`], admits queued requests into a fixed number of
//! decode lanes, steps them, and sends each request's text to its own channel. A request
//! whose receiver is gone (client disconnected) is cancelled and its state freed.

use std::collections::{HashMap, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use splash_engine::{
    Engine, EngineError, Event, FinishReason, Request, ScoreRequest, SeqId, SpecStats,
};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use crate::metrics::Metrics;

/// Token counts and times of a finished request.
#[derive(Clone, Debug)]
pub struct Usage {
    pub prompt_tokens: usize,
    /// Prompt tokens restored from the prefix cache (included in `prompt_tokens`).
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    pub finish: FinishReason,
    pub prefill: Duration,
    pub decode: Duration,
    /// Grammar mask time and count (constrained requests).
    pub grammar: Option<(Duration, usize)>,
    /// Speculation counters (requests decoded with a draft).
    pub speculation: Option<SpecStats>,
    /// The answer tokens' logits (score requests).
    pub scores: Option<Vec<f32>>,
}

/// What the worker tells a request.
#[derive(Debug)]
pub enum WorkerEvent {
    Text(String),
    Done(Usage),
    /// The request was refused (`invalid`) or the engine failed.
    Failed {
        message: String,
        invalid: bool,
    },
}

/// What a job asks of the engine.
pub enum Work {
    Generate(Request),
    Score(ScoreRequest),
}

impl Work {
    fn prompt_len(&self) -> usize {
        match self {
            Work::Generate(r) => r.prompt.len(),
            Work::Score(r) => r.prompt.len(),
        }
    }
}

struct Job {
    work: Work,
    events: UnboundedSender<WorkerEvent>,
}

/// Shared view of the worker's load.
#[derive(Default)]
pub struct Load {
    /// Requests accepted and not yet finished (waiting + running).
    pub in_flight: AtomicUsize,
    pub waiting: AtomicUsize,
    pub running: AtomicUsize,
    pub alive: AtomicBool,
}

/// Handle to the engine thread.
pub struct Worker {
    jobs: mpsc::Sender<Message>,
    pub load: Arc<Load>,
    capacity: usize,
    thread: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// What the engine thread receives.
enum Message {
    Job(Box<Job>),
    /// Finish the running requests, drop the engine (its disk-tier files are written or
    /// removed) and end.
    Stop,
}

/// The worker is full.
pub struct Overloaded;

impl Worker {
    /// Starts the engine thread with `lanes` concurrent sequences (sharing the engine's KV
    /// budget) and `queue` waiting slots.
    pub fn spawn(engine: Engine, lanes: usize, queue: usize, metrics: Arc<Metrics>) -> Self {
        let (tx, rx) = mpsc::channel();
        let load = Arc::new(Load::default());
        load.alive.store(true, Ordering::SeqCst);
        let l = load.clone();
        let thread = std::thread::Builder::new()
            .name("splash-engine".into())
            .spawn(move || run(engine, rx, lanes.max(1), l, metrics))
            .expect("spawn engine thread");
        Self {
            jobs: tx,
            load,
            capacity: lanes.max(1) + queue,
            thread: std::sync::Mutex::new(Some(thread)),
        }
    }

    /// Queues a request; its events arrive on the returned channel.
    pub fn submit(&self, work: Work) -> Result<UnboundedReceiver<WorkerEvent>, Overloaded> {
        let before = self.load.in_flight.fetch_add(1, Ordering::SeqCst);
        if before >= self.capacity || !self.load.alive.load(Ordering::SeqCst) {
            self.load.in_flight.fetch_sub(1, Ordering::SeqCst);
            return Err(Overloaded);
        }
        let (events, rx) = unbounded_channel();
        if self
            .jobs
            .send(Message::Job(Box::new(Job { work, events })))
            .is_err()
        {
            self.load.in_flight.fetch_sub(1, Ordering::SeqCst);
            return Err(Overloaded);
        }
        Ok(rx)
    }
}

impl Worker {
    /// Lets the running and queued requests finish, then ends the engine thread and waits for
    /// it (the engine's drop writes or removes the prefix cache's disk files).
    pub fn stop(&self) {
        let _ = self.jobs.send(Message::Stop);
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}

/// Marks the worker dead however its thread ends (a panic outside the guarded step too), so
/// `/ready` answers 503 and new requests are refused instead of queued forever.
struct AliveGuard(Arc<Load>);

impl Drop for AliveGuard {
    fn drop(&mut self) {
        self.0.alive.store(false, Ordering::SeqCst);
    }
}

fn run(
    mut engine: Engine,
    jobs: mpsc::Receiver<Message>,
    lanes: usize,
    load: Arc<Load>,
    metrics: Arc<Metrics>,
) {
    // A request is admitted when its prompt fits in the KV budget beside what the running
    // sequences hold; their growth is the engine's to manage (it preempts the newest).
    let context = engine.max_context();
    let _alive = AliveGuard(load.clone());
    let mut waiting: VecDeque<Job> = VecDeque::new();
    let mut active: HashMap<SeqId, UnboundedSender<WorkerEvent>> = HashMap::new();
    let done = |load: &Load| {
        load.in_flight.fetch_sub(1, Ordering::SeqCst);
    };
    let mut stopping = false;
    loop {
        // Published at every turn, not only before a step: the step that finishes the last
        // sequences is followed by the wait below, and `/status` must not read 1 meanwhile.
        load.waiting.store(waiting.len(), Ordering::SeqCst);
        load.running.store(active.len(), Ordering::SeqCst);
        if active.is_empty() && waiting.is_empty() {
            // Idle: what the last step or a cancellation left (pending prefill included).
            metrics.set_engine(engine.prefix_cache_stats(), engine.batch_stats());
            if stopping {
                break;
            }
            match jobs.recv() {
                Ok(Message::Job(job)) => waiting.push_back(*job),
                Ok(Message::Stop) | Err(_) => break, // the server is gone
            }
        }
        while let Ok(message) = jobs.try_recv() {
            match message {
                Message::Job(job) => waiting.push_back(*job),
                Message::Stop => stopping = true,
            }
        }
        // Clients that left while waiting or running.
        waiting.retain(|j| {
            let keep = !j.events.is_closed();
            if !keep {
                done(&load);
            }
            keep
        });
        active.retain(|&id, tx| {
            let keep = !tx.is_closed();
            if !keep {
                engine.cancel(id);
                done(&load);
            }
            keep
        });
        while active.len() < lanes {
            let Some(job) = waiting.front() else {
                break;
            };
            let need = job.work.prompt_len().min(context);
            let full = engine.num_parked() > 0
                || engine.kv_tokens_committed().saturating_add(need) > engine.kv_budget();
            if !active.is_empty() && full {
                break; // waits for running (and preempted) sequences to make room
            }
            let job = waiting.pop_front().expect("front exists");
            let added = match job.work {
                Work::Generate(r) => engine.add(r),
                Work::Score(r) => engine.add_score(r),
            };
            match added {
                Ok(id) => {
                    active.insert(id, job.events);
                }
                Err(e) => {
                    let invalid = matches!(e, EngineError::InvalidRequest(_));
                    done(&load);
                    let _ = job.events.send(WorkerEvent::Failed {
                        message: e.to_string(),
                        invalid,
                    });
                }
            }
        }
        load.waiting.store(waiting.len(), Ordering::SeqCst);
        load.running.store(active.len(), Ordering::SeqCst);
        if active.is_empty() {
            continue;
        }
        let stepped = std::panic::catch_unwind(AssertUnwindSafe(|| engine.step()));
        metrics.set_engine(engine.prefix_cache_stats(), engine.batch_stats());
        let events = match stepped {
            Ok(Ok(events)) => events,
            failure => {
                let message = match failure {
                    Ok(Err(e)) => format!("the engine failed: {e}"),
                    _ => "the engine failed (internal panic); the request was dropped, the server keeps serving".into(),
                };
                tracing::error!("{message}");
                for (id, tx) in active.drain() {
                    engine.cancel(id);
                    done(&load);
                    let _ = tx.send(WorkerEvent::Failed {
                        message: message.clone(),
                        invalid: false,
                    });
                }
                continue;
            }
        };
        for ev in events {
            match ev {
                Event::Text { id, text } => {
                    if let Some(tx) = active.get(&id) {
                        let _ = tx.send(WorkerEvent::Text(text));
                    }
                }
                Event::Finished { id } => {
                    let Some(seq) = engine.take_finished(id) else {
                        continue;
                    };
                    let (prefill, decode) = seq.timings();
                    let usage = Usage {
                        prompt_tokens: seq.prompt().len(),
                        cached_tokens: seq.cached_tokens(),
                        completion_tokens: seq.output().len(),
                        finish: seq.finish_reason().cloned().unwrap_or(FinishReason::Length),
                        prefill,
                        decode,
                        grammar: seq.grammar_stats(),
                        speculation: seq.spec_stats(),
                        scores: seq.scores().map(<[f32]>::to_vec),
                    };
                    metrics.record_generation(&usage);
                    if let Some(tx) = active.remove(&id) {
                        let event = match &usage.finish {
                            FinishReason::Failed(message) => WorkerEvent::Failed {
                                message: message.clone(),
                                invalid: false,
                            },
                            _ => WorkerEvent::Done(usage),
                        };
                        // Counted out first: a client that sends its next request as soon
                        // as this one ends must find the slot free.
                        done(&load);
                        let _ = tx.send(event);
                    }
                }
            }
        }
    }
}
