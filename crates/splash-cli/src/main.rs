//! `splash`: a local inference server for the Qwen3.5 / 3.6 hybrid models.
//!
//! Subcommands: `generate` (stream a completion to stdout), `perplexity` (score a text file),
//! `bench` (prefill and decode speed), `serve` (the HTTP API), `pull` and `list` (the Hugging
//! Face cache), and `claude`, `codex`, `opencode`, `hermes`, `pi` (start a coding agent wired
//! to the running server). `--model` takes `demo` (the bundled demo checkpoint), a local
//! checkpoint, or a Hub repo `OWNER/REPO[:VARIANT]`.

mod commands;
mod draft_arg;
mod model_arg;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use commands::launch::Agent;

#[derive(Parser)]
#[command(
    name = "splash",
    version,
    about = "Fast local inference for Qwen3.5/3.6 hybrid models"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt, streamed to stdout.
    Generate(commands::generate::Args),
    /// Teacher-forced perplexity of a text file.
    Perplexity(commands::perplexity::Args),
    /// Measure prefill and decode speed.
    Bench(commands::bench::Args),
    /// Serve the OpenAI-compatible API over HTTP.
    Serve(commands::serve::Args),
    /// Serve several models from one port, one engine loaded at a time.
    ServeMulti(commands::serve_multi::Args),
    /// Download a Hugging Face model into the local cache without serving it.
    Pull(commands::pull::Args),
    /// List the models in the local Hugging Face cache.
    List(commands::list::Args),
    /// Start Claude Code wired to the running splash server (extra arguments go to it).
    Claude(commands::launch::Args),
    /// Start Codex wired to the running splash server (extra arguments go to it).
    Codex(commands::launch::Args),
    /// Start OpenCode wired to the running splash server (extra arguments go to it).
    Opencode(commands::launch::Args),
    /// Start Hermes Agent wired to the running splash server (extra arguments go to it).
    Hermes(commands::launch::Args),
    /// Start Pi wired to the running splash server (extra arguments go to it).
    Pi(commands::launch::Args),
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SPLASH_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        // Colour codes only for a terminal: not in log files, pipes or journald.
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Generate(a) => commands::generate::run(a),
        Command::Perplexity(a) => commands::perplexity::run(a),
        Command::Bench(a) => commands::bench::run(a),
        Command::Serve(a) => commands::serve::run(a),
        Command::ServeMulti(a) => commands::serve_multi::run(a),
        Command::Pull(a) => commands::pull::run(a),
        Command::List(a) => commands::list::run(a),
        Command::Claude(a) => commands::launch::run(Agent::Claude, a),
        Command::Codex(a) => commands::launch::run(Agent::Codex, a),
        Command::Opencode(a) => commands::launch::run(Agent::OpenCode, a),
        Command::Hermes(a) => commands::launch::run(Agent::Hermes, a),
        Command::Pi(a) => commands::launch::run(Agent::Pi, a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", error_chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes, `: `-joined, leaving out a cause whose text is already said (many
/// errors include their source in their own message).
fn error_chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}
