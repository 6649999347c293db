//! End-to-end runs of `splash claude|codex|opencode|hermes|pi`: each installed agent is started
//! through its launcher, non-interactively with a one-line prompt, against a fresh
//! `splash serve` (the random real-vocabulary model) that requires an API key, in a throw-away HOME.
//!
//! The model answers with noise, so what is checked is the wiring. An agent passes when
//! - the launcher found the server and started the agent (its `splash: starting` line);
//! - the server answered the agent's own API calls (Messages for Claude Code, Responses for
//!   Codex, Chat Completions for the others) with 200, and none of them with an error: the
//!   server log names the agent by its User-Agent, `/metrics` counts the statuses;
//! - the server generated at least one complete answer for it;
//! - the agent exited by itself within its time limit (its exit code is not checked: agents
//!   may well complain about noise);
//! - the key (passed as `SPLASH_API_KEY`) appears in no file under that HOME.
//!
//! Output is bounded so no agent runs long on the CPU: the launchers' `--max-output-tokens`
//! (Claude Code, OpenCode, Pi, Hermes) and, for Codex, which has no output setting, the
//! server's `--max-context`.
//!
//! Agents are looked up on PATH and in `.agents/` (where `scripts/test-agents` installs them).
//! A missing agent is skipped with a message unless `SPLASH_REQUIRE_AGENTS` names it
//! (comma-separated, or `all`); `SPLASH_AGENTS` limits which run.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const KEY: &str = "e2e-launcher-key-7f3a";
const PROMPT: &str = "Reply with one word: hello";

struct Case {
    agent: &'static str,
    /// The API the agent speaks.
    route: &'static str,
    /// Part of the agent's User-Agent header.
    user_agent: &'static str,
    /// The server's `--max-context`.
    context: &'static str,
    /// Options of the launcher (before `--`).
    launcher: &'static [&'static str],
    args: &'static [&'static str],
    env: &'static [(&'static str, &'static str)],
    limit: Duration,
}

const CASES: [Case; 5] = [
    Case {
        agent: "claude",
        route: "/v1/messages",
        user_agent: "claude-cli/",
        context: "64K",
        launcher: &["--max-output-tokens", "256"],
        args: &["-p", PROMPT],
        env: &[],
        limit: Duration::from_secs(300),
    },
    Case {
        agent: "codex",
        route: "/v1/responses",
        user_agent: "codex_exec/",
        // Codex asks for no output limit: the context bounds its answer.
        context: "16K",
        launcher: &[],
        args: &[
            "exec",
            "--skip-git-repo-check",
            "--sandbox",
            "read-only",
            PROMPT,
        ],
        env: &[],
        limit: Duration::from_secs(300),
    },
    Case {
        agent: "opencode",
        route: "/v1/chat/completions",
        user_agent: "opencode/",
        context: "16K",
        launcher: &["--max-output-tokens", "256"],
        args: &["run", PROMPT],
        env: &[],
        limit: Duration::from_secs(300),
    },
    Case {
        agent: "pi",
        route: "/v1/chat/completions",
        user_agent: "OpenAI/JS",
        context: "16K",
        launcher: &["--max-output-tokens", "256"],
        args: &["-p", PROMPT],
        env: &[],
        limit: Duration::from_secs(300),
    },
    Case {
        agent: "hermes",
        route: "/v1/chat/completions",
        user_agent: "OpenAI/Python",
        // Hermes refuses a window under 64,000 tokens.
        context: "64000",
        launcher: &["--max-output-tokens", "256"],
        args: &["-z", PROMPT],
        env: &[],
        limit: Duration::from_secs(420),
    },
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// PATH with the local agent installs first.
fn agent_path() -> String {
    let r = root();
    let mut dirs = vec![
        r.join(".agents/npm/node_modules/.bin"),
        r.join(".agents/hermes/bin"),
    ];
    dirs.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    std::env::join_paths(dirs)
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

fn find(program: &str, path: &str) -> Option<PathBuf> {
    std::env::split_paths(path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

fn listed(var: &str, agent: &str) -> Option<bool> {
    let v = std::env::var(var).ok().filter(|v| !v.trim().is_empty())?;
    Some(v.split(',').any(|a| a.trim() == agent || a.trim() == "all"))
}

/// A keyed `splash serve` on the real-vocabulary fixture whose log lines are kept.
struct Server {
    child: std::process::Child,
    port: u16,
    log: Arc<Mutex<Vec<String>>>,
}

impl Server {
    fn start(context: &str) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_splash"))
            .args([
                "serve",
                "--model",
                // The random model on the real vocabulary: the agents' prompts are long, and
                // its tiny layers prefill them in seconds on a CI machine.
                &common::realvocab(),
                "--port",
                "0",
                "--max-context",
                context,
                "--api-key",
                KEY,
            ])
            .env("SPLASH_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start splash serve");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        let lines = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(url) = line.split("Ready: ").nth(1) {
                    let _ = tx.send(
                        url.rsplit(':')
                            .next()
                            .unwrap()
                            .trim()
                            .parse::<u16>()
                            .unwrap(),
                    );
                }
                lines.lock().unwrap().push(line);
            }
        });
        let port = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("no Ready line");
        Server { child, port, log }
    }

    fn get(&self, path: &str) -> String {
        let auth = format!("Authorization: Bearer {KEY}\r\n");
        common::http(self.port, "GET", path, &auth, "")
    }

    /// `splash_requests_total` for `route`, by status.
    fn requests(&self, route: &str) -> Vec<(u16, u64)> {
        let prefix = format!("splash_requests_total{{route=\"{route}\",status=\"");
        self.get("/metrics")
            .lines()
            .filter_map(|l| l.strip_prefix(&prefix))
            .filter_map(|rest| {
                let (status, n) = rest.split_once("\"} ")?;
                Some((status.parse().ok()?, n.trim().parse().ok()?))
            })
            .collect()
    }

    fn status(&self) -> serde_json::Value {
        serde_json::from_str(&self.get("/status")).unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Files under `dir` that contain `needle`.
fn files_containing(dir: &Path, needle: &[u8]) -> Vec<PathBuf> {
    let mut hits = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return hits;
    };
    for e in entries.flatten() {
        let p = e.path();
        let Ok(t) = e.file_type() else { continue };
        if t.is_dir() {
            hits.extend(files_containing(&p, needle));
        } else if t.is_file() {
            if let Ok(bytes) = std::fs::read(&p) {
                if bytes.windows(needle.len()).any(|w| w == needle) {
                    hits.push(p);
                }
            }
        }
    }
    hits
}

/// Runs one agent; Ok(summary) or Err(why it failed).
fn run_case(c: &Case, path: &str) -> Result<String, String> {
    let base = root().join("target/launchers").join(c.agent);
    let _ = std::fs::remove_dir_all(&base);
    let (home, work) = (base.join("home"), base.join("work"));
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(&work).unwrap();
    let server = Server::start(c.context);
    let out_path = base.join("output.txt");
    let out = std::fs::File::create(&out_path).unwrap();
    let mut cmd = Command::new("timeout");
    cmd.arg("-k")
        .arg("10")
        .arg(c.limit.as_secs().to_string())
        .arg(env!("CARGO_BIN_EXE_splash"))
        .arg(c.agent)
        .arg("--port")
        .arg(server.port.to_string())
        .args(c.launcher)
        .arg("--")
        .args(c.args)
        .current_dir(&work)
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out);
    // A clean environment for the agent: its own HOME, none of the user's agent settings.
    for (k, _) in std::env::vars() {
        let user_setting = [
            "ANTHROPIC_",
            "CLAUDE_",
            "OPENAI_",
            "CODEX_",
            "OPENCODE_",
            "HERMES_",
            "PI_",
            "XDG_",
        ]
        .iter()
        .any(|p| k.starts_with(p));
        if user_setting || k == "SPLASH_PORT" {
            cmd.env_remove(&k);
        }
    }
    cmd.env("HOME", &home)
        .env("PATH", path)
        .env("SPLASH_API_KEY", KEY);
    for (k, v) in c.env {
        cmd.env(k, v);
    }
    let t0 = Instant::now();
    let status = cmd
        .status()
        .map_err(|e| format!("cannot run timeout: {e}"))?;
    let secs = t0.elapsed().as_secs();
    let output = std::fs::read_to_string(&out_path).unwrap_or_default();
    let tail: String = {
        let lines: Vec<&str> = output.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n    ")
    };
    let fail = |why: String| {
        Err(format!(
            "{why}\n  agent output (last lines):\n    {tail}\n  server log: {}",
            base.join("server.log").display()
        ))
    };
    std::fs::write(
        base.join("server.log"),
        server.log.lock().unwrap().join("\n"),
    )
    .unwrap();

    if !output.contains("splash: starting") {
        return fail("the launcher did not start the agent".into());
    }
    if status.code() == Some(124) || status.code() == Some(137) {
        return fail(format!(
            "the agent did not finish within {} s",
            c.limit.as_secs()
        ));
    }
    let requests = server.requests(c.route);
    let ok: u64 = requests
        .iter()
        .filter(|(s, _)| *s == 200)
        .map(|(_, n)| n)
        .sum();
    let errors: Vec<_> = requests.iter().filter(|(s, _)| *s != 200).collect();
    if ok == 0 {
        return fail(format!(
            "the server answered no {} request with 200 (statuses: {requests:?})",
            c.route
        ));
    }
    if !errors.is_empty() {
        return fail(format!(
            "the server refused some {} requests: {errors:?}",
            c.route
        ));
    }
    let by_agent = server
        .log
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains(&format!("POST {} 200", c.route)) && l.contains(c.user_agent))
        .count();
    if by_agent == 0 {
        return fail(format!(
            "no `POST {} 200` line with a User-Agent containing {:?} in the server log",
            c.route, c.user_agent
        ));
    }
    let m = &server.status()["metrics"];
    let (answers, tokens) = (
        m["generations_total"].as_u64().unwrap_or(0),
        m["generated_tokens_total"].as_u64().unwrap_or(0),
    );
    if answers == 0 || tokens == 0 {
        return fail("the server generated no complete answer".into());
    }
    let leaks = files_containing(&base, KEY.as_bytes())
        .into_iter()
        .filter(|p| !p.ends_with("output.txt") && !p.ends_with("server.log"))
        .collect::<Vec<_>>();
    if !leaks.is_empty() {
        return fail(format!("the API key was written to {leaks:?}"));
    }
    Ok(format!(
        "{ok} × POST {} 200 ({by_agent} logged with its User-Agent), {answers} answers / {tokens} tokens generated, agent exited with {} after {secs} s",
        c.route,
        status.code().map_or("a signal".to_string(), |c| format!("code {c}"))
    ))
}

#[test]
fn agents_through_their_launchers() {
    let path = agent_path();
    let mut failures = Vec::new();
    for c in &CASES {
        if listed("SPLASH_AGENTS", c.agent) == Some(false) {
            continue;
        }
        if find(c.agent, &path).is_none() {
            if listed("SPLASH_REQUIRE_AGENTS", c.agent) == Some(true) {
                failures.push(format!("{}: required by SPLASH_REQUIRE_AGENTS but not installed (scripts/test-agents installs it)", c.agent));
            } else {
                common::record_skip(
                    &format!("agents_through_their_launchers.{}", c.agent),
                    "not installed (scripts/test-agents installs it)",
                );
            }
            continue;
        }
        match run_case(c, &path) {
            Ok(summary) => println!("{}: PASS: {summary}", c.agent),
            Err(why) => {
                println!("{}: FAIL: {why}", c.agent);
                failures.push(format!("{}: {why}", c.agent));
            }
        }
        let _ = std::io::stdout().flush();
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
