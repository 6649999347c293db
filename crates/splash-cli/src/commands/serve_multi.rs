//! `splash serve-multi`: one server for several models, one engine loaded at a time.

use std::time::Duration;

use splash_server::{parse_duration, parse_size, MultiConfig, MultiOptions, ServerConfig};

use super::serve::ListenArgs;

#[derive(clap::Args)]
pub struct Args {
    /// The models: `{"models": [{"model": "demo", "aliases": [...], "arguments": [...],
    /// "max_context": N, "preload": true}, ...]}` (`model` as `serve --model` takes it).
    #[arg(long, value_name = "FILE")]
    config: std::path::PathBuf,
    /// Seconds a request waits for its model to be loaded before a 503 `model_switching`
    /// (0: answer at once).
    #[arg(long, default_value_t = 600.0)]
    switch_timeout: f64,
    /// Seconds an engine may take to become ready before its load fails (0: no limit).
    #[arg(long, default_value_t = 0.0)]
    startup_timeout: f64,
    // The engines are given the same API key.
    #[command(flatten)]
    listen: ListenArgs,
    /// Largest accepted request body, e.g. 32M.
    #[arg(long, value_parser = parse_size, default_value = "128M")]
    max_request_size: usize,
    /// Time a client has to send a request's body.
    #[arg(long, value_parser = parse_duration, default_value = "60s")]
    body_read_timeout: Duration,
    /// `splash serve` options for every model, after `--` (they win over a model's own), e.g.
    /// `-- --kv-format bf16 --lanes 2`.
    #[arg(last = true, value_name = "SERVE OPTIONS")]
    serve_options: Vec<String>,
}

fn seconds(name: &str, s: f64) -> anyhow::Result<Duration> {
    if !s.is_finite() || s < 0.0 {
        anyhow::bail!("--{name} must be a number of seconds, 0 or more; got {s}");
    }
    Ok(Duration::from_secs_f64(s))
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let config = MultiConfig::load(&a.config).map_err(anyhow::Error::msg)?;
    splash_server::check_arguments(&a.serve_options)
        .map_err(|e| anyhow::anyhow!("the options after --: {e}"))?;
    let options = MultiOptions {
        config,
        front: ServerConfig {
            max_request_size: a.max_request_size,
            body_read_timeout: a.body_read_timeout,
            ..a.listen.config()?
        },
        common: a.serve_options,
        switch_timeout: seconds("switch-timeout", a.switch_timeout)?,
        startup_timeout: seconds("startup-timeout", a.startup_timeout)?,
    };
    let runtime = super::http_runtime()?;
    runtime.block_on(async move {
        let listener = splash_server::bind(&options.front).await?;
        splash_server::serve_multi(listener, options).await?;
        Ok(())
    })
}
