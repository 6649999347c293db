//! `splash claude|codex|opencode|hermes|pi`: start an installed coding agent wired to the
//! running `splash serve`.
//!
//! Each launch finds the server (`--port` / `SPLASH_PORT`; `/status` and `/v1/models`), builds
//! the agent's configuration with a pure function of the server description and the user's
//! environment (one module per agent, unit-tested), writes the few files an agent can only read
//! from disk (atomically, leaving everything else in them alone), and then replaces itself with
//! the agent, passing the user's arguments through. The API key stays in `SPLASH_API_KEY`: the
//! configurations refer to that variable and never hold the key itself.

mod claude;
mod codex;
mod files;
mod hermes;
mod opencode;
mod pi;
mod server;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context};

pub use server::Server;

#[derive(clap::Args)]
pub struct Args {
    /// Port of the running `splash serve`.
    #[arg(long, env = "SPLASH_PORT", default_value_t = 8000)]
    port: u16,
    /// Address of the running `splash serve`.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Tokens the agent may ask for in one answer, e.g. 8K (default: 32K, or a quarter of a
    /// smaller context). Codex has no such setting.
    #[arg(long, value_parser = splash_server::parse_size)]
    max_output_tokens: Option<usize>,
    /// Arguments for the agent, e.g. `splash claude -- -p "hi"` (`--` is optional when the
    /// first one is not a splash flag).
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "AGENT_ARGS"
    )]
    args: Vec<String>,
}

/// The agents splash can start.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Agent {
    Claude,
    Codex,
    OpenCode,
    Hermes,
    Pi,
}

impl Agent {
    /// The agent's name for people.
    pub fn title(self) -> &'static str {
        match self {
            Agent::Claude => "Claude Code",
            Agent::Codex => "Codex",
            Agent::OpenCode => "OpenCode",
            Agent::Hermes => "Hermes Agent",
            Agent::Pi => "Pi",
        }
    }

    /// The command on PATH.
    pub fn program(self) -> &'static str {
        match self {
            Agent::Claude => "claude",
            Agent::Codex => "codex",
            Agent::OpenCode => "opencode",
            Agent::Hermes => "hermes",
            Agent::Pi => "pi",
        }
    }

    /// How to install the agent when it is missing.
    pub fn install_hint(self) -> &'static str {
        match self {
            Agent::Claude => "npm install -g @anthropic-ai/claude-code",
            Agent::Codex => "npm install -g @openai/codex",
            Agent::OpenCode => "npm install -g opencode-ai",
            Agent::Hermes => "pipx install hermes-agent   (or: pip install hermes-agent)",
            Agent::Pi => "npm install -g @mariozechner/pi-coding-agent",
        }
    }
}

/// The environment variables a launch reads (a snapshot, so the builders are pure).
#[derive(Clone, Debug, Default)]
pub struct Env(BTreeMap<String, String>);

impl Env {
    fn from_process() -> Self {
        Self(std::env::vars().collect())
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    /// The user's home directory.
    pub fn home(&self) -> anyhow::Result<PathBuf> {
        self.get("HOME")
            .or_else(|| self.get("USERPROFILE"))
            .map(PathBuf::from)
            .ok_or_else(|| anyhow!("HOME is not set"))
    }

    /// The key the agent should send: the user's `SPLASH_API_KEY`, or a placeholder for a
    /// server that needs none (agents refuse to start without some key).
    pub fn api_key(&self) -> &str {
        self.get("SPLASH_API_KEY").unwrap_or("local")
    }

    #[cfg(test)]
    pub fn with(vars: &[(&str, &str)]) -> Self {
        Self(
            vars.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }
}

/// How to start the agent: arguments and environment changes.
#[derive(Debug, Default, PartialEq)]
pub struct Launch {
    pub args: Vec<String>,
    pub set_env: Vec<(String, String)>,
    pub remove_env: Vec<&'static str>,
}

impl Launch {
    fn set(&mut self, name: &str, value: impl Into<String>) {
        self.set_env.push((name.to_string(), value.into()));
    }

    /// The value this launch gives a variable, if any (for tests).
    #[cfg(test)]
    pub fn env(&self, name: &str) -> Option<&str> {
        self.set_env
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

pub fn run(agent: Agent, a: Args) -> anyhow::Result<()> {
    let env = Env::from_process();
    let program = which(agent.program(), env.get("PATH")).ok_or_else(|| {
        anyhow!(
            "{} is not installed (no `{}` on PATH). Install it with:\n  {}",
            agent.title(),
            agent.program(),
            agent.install_hint()
        )
    })?;
    let mut server = server::discover(&a.host, a.port, env.get("SPLASH_API_KEY"))?;
    server.max_output = a.max_output_tokens;
    if agent == Agent::Codex && a.max_output_tokens.is_some() {
        eprintln!("splash: Codex has no output-limit setting; --max-output-tokens is ignored");
    }
    let launch = match agent {
        Agent::Claude => claude::launch(&server, &env, &a.args),
        Agent::Codex => codex::launch(&server, &env, &a.args),
        Agent::OpenCode => opencode::launch(&server, &env, &a.args)?,
        Agent::Hermes => hermes::prepare(&program, &server, &env, &a.args)?,
        Agent::Pi => pi::prepare(&server, &env, &a.args)?,
    };
    eprintln!(
        "splash: starting {} with {} at {} ({} tokens of context)",
        agent.title(),
        server.model,
        server.base_url,
        server.context
    );
    exec(&program, launch)
}

/// Replaces this process with the agent (on Unix), so signals and the exit code are the
/// agent's own; elsewhere waits for it and exits with its code.
fn exec(program: &Path, launch: Launch) -> anyhow::Result<()> {
    let mut cmd = std::process::Command::new(program);
    cmd.args(&launch.args);
    for name in &launch.remove_env {
        cmd.env_remove(name);
    }
    for (k, v) in &launch.set_env {
        cmd.env(k, v);
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        let err = cmd.exec();
        Err(anyhow!("cannot start {}: {err}", program.display()))
    }
    #[cfg(not(unix))]
    {
        let status = cmd
            .status()
            .with_context(|| format!("cannot start {}", program.display()))?;
        std::process::exit(status.code().unwrap_or(1));
    }
}

/// The first executable `name` on `path`.
fn which(name: &str, path: Option<&str>) -> Option<PathBuf> {
    let path: OsString = path?.into();
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        p.metadata()
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    }
    #[cfg(not(unix))]
    {
        p.is_file()
    }
}

/// Reads a JSON object file the agent owns; a missing file is an empty object.
fn read_json_object(path: &Path) -> anyhow::Result<serde_json::Map<String, serde_json::Value>> {
    match std::fs::read_to_string(path) {
        Ok(text) if text.trim().is_empty() => Ok(Default::default()),
        Ok(text) => match serde_json::from_str(&text) {
            Ok(serde_json::Value::Object(m)) => Ok(m),
            _ => Err(anyhow!(
                "{} is not a JSON object; splash leaves it as it is: fix or move it, then try again",
                path.display()
            )),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Default::default()),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_programs_on_path() {
        let dir = std::env::temp_dir().join(format!("splash-which-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let exe = dir.join("agent-x");
        std::fs::write(&exe, "#!/bin/sh\n").unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let path = format!("/nonexistent:{}", dir.display());
        assert_eq!(which("agent-x", Some(&path)), Some(exe));
        assert_eq!(which("agent-y", Some(&path)), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_key_defaults_to_a_placeholder() {
        assert_eq!(Env::with(&[]).api_key(), "local");
        assert_eq!(Env::with(&[("SPLASH_API_KEY", "")]).api_key(), "local");
        assert_eq!(Env::with(&[("SPLASH_API_KEY", "k")]).api_key(), "k");
    }
}
