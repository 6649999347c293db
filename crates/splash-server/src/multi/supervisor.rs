//! One engine at a time: the supervisor starts a `splash serve` child process for the model
//! requests ask for, and switches when they ask for another — after the running requests
//! (streams included) have finished, so nothing accepted is lost. The outgoing process exits
//! before the next one starts, so its RAM and GPU memory are back before the next model loads.
//!
//! Requests for a model that is not loaded wait (up to `--switch-timeout`); models are loaded in
//! the order they were first asked for, and a model's waiting requests are all served before
//! the next switch starts.

use std::collections::VecDeque;
use std::io::BufRead;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::config::{merge_flags, MultiConfig};

/// Lines of a child's output kept for the error of a failed load.
const LOG_TAIL: usize = 12;
/// How long a stopping child may take to finish before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(30);

/// What the supervisor is doing.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Phase {
    /// Forwarding requests to the loaded model (if any).
    Serving,
    /// Waiting for the loaded model's running requests before switching to this one.
    Draining(usize),
    /// Starting this model's engine.
    Loading(usize),
}

/// The engine process of the loaded model.
struct Engine {
    model: usize,
    port: u16,
    child: Child,
}

/// The supervisor's state (behind one lock).
pub struct State {
    engine: Option<Engine>,
    pub phase: Phase,
    /// Models asked for and not loaded, in the order they were first asked for.
    pub queue: VecDeque<usize>,
    /// Requests being forwarded (streams until their last byte).
    pub in_flight: usize,
    /// Requests waiting for each model.
    pub waiting: Vec<usize>,
    /// Why each model's last load failed (cleared by its next request).
    pub failed: Vec<Option<String>>,
    /// Loads so far, for `/status`.
    pub switches: u64,
}

impl State {
    /// The loaded model.
    pub fn loaded(&self) -> Option<usize> {
        self.engine.as_ref().map(|e| e.model)
    }

    /// The port of `model`'s engine when requests for it may be forwarded now.
    fn port_for(&self, model: usize) -> Option<u16> {
        match (&self.engine, self.phase) {
            (Some(e), Phase::Serving) if e.model == model => Some(e.port),
            _ => None,
        }
    }

    /// The model being switched to.
    pub fn target(&self) -> Option<usize> {
        match self.phase {
            Phase::Serving => None,
            Phase::Draining(t) | Phase::Loading(t) => Some(t),
        }
    }
}

/// Why a request could not be forwarded.
pub enum Refusal {
    /// Not ready within the switch timeout.
    Switching { target: Option<usize> },
    /// The model's engine failed to start.
    LoadFailed(String),
}

/// Starts, stops and switches the engine processes.
pub struct Supervisor {
    pub config: MultiConfig,
    /// `splash` itself, and the options every model's `serve` gets (after the model's own).
    exe: PathBuf,
    common: Vec<String>,
    api_key: Option<String>,
    switch_timeout: Duration,
    /// 0: no limit.
    startup_timeout: Duration,
    state: Mutex<State>,
    /// Bumped at every change of the state: waiting requests and the switch loop look again.
    changes: watch::Sender<u64>,
}

/// A forwarded request: counted in flight until dropped.
pub struct InFlight(Arc<Supervisor>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.lock().in_flight -= 1;
        self.0.changed();
    }
}

impl Supervisor {
    pub fn new(
        config: MultiConfig,
        exe: PathBuf,
        common: Vec<String>,
        api_key: Option<String>,
        switch_timeout: Duration,
        startup_timeout: Duration,
    ) -> Arc<Self> {
        let n = config.models.len();
        Arc::new(Self {
            config,
            exe,
            common,
            api_key,
            switch_timeout,
            startup_timeout,
            state: Mutex::new(State {
                engine: None,
                phase: Phase::Serving,
                queue: VecDeque::new(),
                in_flight: 0,
                waiting: vec![0; n],
                failed: vec![None; n],
                switches: 0,
            }),
            changes: watch::channel(0).0,
        })
    }

    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn changed(&self) {
        self.changes.send_modify(|v| *v += 1);
    }

    /// The model a request without a `model` goes to: the loaded one, the one being loaded, or
    /// the first of the configuration.
    pub fn default_model(&self) -> usize {
        let st = self.lock();
        st.target()
            .or(st.loaded())
            .or(self.config.preload)
            .unwrap_or(0)
    }

    /// The port of the loaded model's engine, when it is serving (for requests that name no
    /// model and must not load one: `/metrics`, the web page).
    pub fn serving_port(self: &Arc<Self>) -> Option<(u16, InFlight)> {
        let mut st = self.lock();
        let model = st.loaded()?;
        let port = st.port_for(model)?;
        st.in_flight += 1;
        Some((port, InFlight(self.clone())))
    }

    /// Waits until `model` is loaded and serving (starting the switch to it), then counts the
    /// request in flight. Gives up after the switch timeout.
    pub async fn acquire(self: &Arc<Self>, model: usize) -> Result<(u16, InFlight), Refusal> {
        let deadline = Instant::now() + self.switch_timeout;
        let mut changes = self.changes.subscribe();
        {
            let mut st = self.lock();
            if let Some(port) = st.port_for(model) {
                st.in_flight += 1;
                return Ok((port, InFlight(self.clone())));
            }
            if self.switch_timeout.is_zero() {
                return Err(Refusal::Switching {
                    target: st.target(),
                });
            }
            st.failed[model] = None; // asked again: try again
            st.waiting[model] += 1;
            if !st.queue.contains(&model) && st.target() != Some(model) {
                st.queue.push_back(model);
            }
        }
        self.changed();
        loop {
            let woke = tokio::time::timeout_at(deadline.into(), changes.changed()).await;
            let mut st = self.lock();
            if let Some(port) = st.port_for(model) {
                st.waiting[model] -= 1;
                st.in_flight += 1;
                drop(st);
                self.changed();
                return Ok((port, InFlight(self.clone())));
            }
            if let Some(why) = st.failed[model].clone() {
                st.waiting[model] -= 1;
                return Err(Refusal::LoadFailed(why));
            }
            if woke.is_err() {
                st.waiting[model] -= 1;
                return Err(Refusal::Switching {
                    target: st.target(),
                });
            }
        }
    }

    /// Loads the preload model, then switches as requests ask, until the process ends.
    pub async fn run(self: Arc<Self>) {
        if let Some(m) = self.config.preload {
            // Loaded before any request asks (the queue holds only models someone waits for).
            self.lock().phase = Phase::Draining(m);
        }
        let mut changes = self.changes.subscribe();
        loop {
            self.step().await;
            // Also look every second: a crashed engine is noticed without a request.
            let _ = tokio::time::timeout(Duration::from_secs(1), changes.changed()).await;
        }
    }

    /// One decision of the switch loop.
    async fn step(self: &Arc<Self>) {
        let stop = {
            let mut st = self.lock();
            if let Some(e) = &mut st.engine {
                if let Ok(Some(status)) = e.child.try_wait() {
                    let (model, name) = (e.model, self.config.models[e.model].model.clone());
                    eprintln!("serve-multi: the engine of {name} exited ({status}); it is started again for the requests that wait for it");
                    st.engine = None;
                    // A switch it was draining for goes on first; its own waiters, after.
                    if let Phase::Draining(next) = st.phase {
                        st.queue.push_front(next);
                    }
                    st.phase = Phase::Serving;
                    if st.waiting[model] > 0 && !st.queue.contains(&model) {
                        st.queue.push_back(model);
                    }
                }
            }
            match st.phase {
                Phase::Serving => {
                    // The loaded model's waiting requests first (they go as soon as they wake).
                    if st.loaded().is_some_and(|m| st.waiting[m] > 0) {
                        return;
                    }
                    // Nothing to switch for: the loaded model, or one whose requests gave up.
                    while let Some(&m) = st.queue.front() {
                        if st.loaded() == Some(m) || st.waiting[m] == 0 {
                            st.queue.pop_front();
                        } else {
                            break;
                        }
                    }
                    let Some(next) = st.queue.pop_front() else {
                        return;
                    };
                    st.phase = Phase::Draining(next);
                    drop(st);
                    self.changed();
                    return;
                }
                Phase::Draining(next) if st.in_flight == 0 => {
                    st.phase = Phase::Loading(next);
                    st.engine.take()
                }
                Phase::Draining(_) | Phase::Loading(_) => return,
            }
        };
        self.changed();
        if let Some(engine) = stop {
            let name = self.config.models[engine.model].model.clone();
            eprintln!("serve-multi: stopping {name}");
            let _ = tokio::task::spawn_blocking(move || stop_child(engine.child)).await;
        }
        let Phase::Loading(next) = self.lock().phase else {
            return;
        };
        let started = self.start(next).await;
        {
            let mut st = self.lock();
            st.phase = Phase::Serving;
            match started {
                Ok(engine) => {
                    st.engine = Some(engine);
                    st.switches += 1;
                }
                Err(why) => {
                    eprintln!("serve-multi: {why}");
                    st.failed[next] = Some(why);
                }
            }
        }
        self.changed();
    }

    /// Starts `model`'s engine on a free loopback port and waits for its `Ready:` line.
    async fn start(&self, model: usize) -> Result<Engine, String> {
        let entry = &self.config.models[model];
        let mut names = Vec::new();
        for n in entry.names() {
            names.extend(["--served-model-name".to_string(), n.to_string()]);
        }
        let args = merge_flags(&[names, entry.arguments.clone(), self.common.clone()]);
        eprintln!("serve-multi: loading {}", entry.model);
        let mut cmd = Command::new(&self.exe);
        cmd.args([
            "serve",
            "--model",
            &entry.model,
            "--host",
            "127.0.0.1",
            "--port",
            "0",
        ])
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::piped());
        // The engine checks the same key as the front, which forwards the client's header.
        match &self.api_key {
            Some(k) => cmd.env("SPLASH_API_KEY", k),
            None => cmd.env_remove("SPLASH_API_KEY"),
        };
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", self.exe.display()))?;
        let stderr = child.stderr.take().expect("piped");
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        let log = tail.clone();
        let name = entry.model.clone();
        std::thread::spawn(move || relay(stderr, &name, ready_tx, &log));
        let wait = async {
            match ready_rx.await {
                Ok(port) => Ok(port),
                Err(_) => Err("its engine exited before it was ready".to_string()),
            }
        };
        let ready = if self.startup_timeout.is_zero() {
            wait.await
        } else {
            tokio::time::timeout(self.startup_timeout, wait)
                .await
                .unwrap_or_else(|_| {
                    Err(format!(
                        "its engine was not ready within {:.0} s (--startup-timeout)",
                        self.startup_timeout.as_secs_f64()
                    ))
                })
        };
        match ready {
            Ok(port) => Ok(Engine { model, port, child }),
            Err(why) => {
                let _ = tokio::task::spawn_blocking(move || stop_child(child)).await;
                let lines: Vec<String> = tail
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .iter()
                    .cloned()
                    .collect();
                Err(format!(
                    "loading {} failed: {why}; its last output:\n{}",
                    entry.model,
                    lines.join("\n")
                ))
            }
        }
    }

    /// Stops the loaded engine (at exit).
    pub fn shutdown(&self) {
        if let Some(e) = self.lock().engine.take() {
            stop_child(e.child);
        }
    }
}

/// Copies a child's stderr to ours, line by line with its model's name, keeps the last lines,
/// and reports the port of its `Ready: http://HOST:PORT` line.
fn relay(
    stderr: std::process::ChildStderr,
    name: &str,
    ready: tokio::sync::oneshot::Sender<u16>,
    tail: &Mutex<VecDeque<String>>,
) {
    let mut ready = Some(ready);
    for line in std::io::BufReader::new(stderr).lines() {
        let Ok(line) = line else { break };
        eprintln!("[{name}] {line}");
        if let Some(port) = line
            .strip_prefix("Ready: http://")
            .and_then(|rest| rest.rsplit(':').next())
            .and_then(|p| p.trim().parse::<u16>().ok())
        {
            if let Some(tx) = ready.take() {
                let _ = tx.send(port);
            }
        }
        let mut t = tail.lock().unwrap_or_else(|e| e.into_inner());
        t.push_back(line);
        if t.len() > LOG_TAIL {
            t.pop_front();
        }
    }
}

/// SIGTERM (the engine finishes and writes its disk cache), then SIGKILL after a grace period;
/// returns once the process has exited, so its memory is free.
fn stop_child(mut child: Child) {
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: `kill` with a valid signal on our own child's pid has no memory effects.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
    }
    let until = Instant::now() + STOP_GRACE;
    while Instant::now() < until {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}
