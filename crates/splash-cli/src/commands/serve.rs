//! `splash serve`: the OpenAI-compatible HTTP server.

use splash_server::{parse_duration, parse_size, DiskCacheSettings, ServerConfig};

use crate::{draft_arg, model_arg};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: model_arg::ModelArgs,
    #[command(flatten)]
    draft: draft_arg::DraftArgs,
    #[command(flatten)]
    listen: ListenArgs,
    /// Cap on prompt + output tokens, e.g. 32K (K = 1024); never above the model's limit,
    /// lowered to what fits in memory.
    #[arg(long, value_parser = parse_size)]
    max_context: Option<usize>,
    /// Most memory (RAM, or GPU memory with CUDA) the weights, draft, KV cache and working
    /// buffers may take, e.g. 28G. Default: what the device has available.
    #[arg(long, value_parser = parse_size)]
    max_memory: Option<usize>,
    /// Extra model name the API answers to (repeatable).
    #[arg(long = "served-model-name")]
    served_model_names: Vec<String>,
    /// reasoning_effort for requests that give none (`none` turns thinking off).
    #[arg(long, env = "SPLASH_DEFAULT_REASONING_EFFORT")]
    default_reasoning_effort: Option<String>,
    /// Largest request body, e.g. 128M.
    #[arg(long, value_parser = parse_size, default_value = "128M")]
    max_request_size: usize,
    /// Time a client has to send a request's headers, e.g. 10 or 500ms; also how long an idle
    /// keep-alive connection stays open.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    header_read_timeout: std::time::Duration,
    /// Time a client has to send a request's whole body (408 after it), e.g. 60 or 2m.
    #[arg(long, value_parser = parse_duration, default_value = "60s")]
    body_read_timeout: std::time::Duration,
    /// Requests that may wait for a decode lane; more get 503 with Retry-After.
    #[arg(long, default_value_t = 32)]
    queue_size: usize,
    /// Requests decoded at once (decode lanes: each step runs one forward pass for all of
    /// them, drafted blocks included). The memory plan lowers it to what fits.
    #[arg(long, alias = "parallel", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=256))]
    lanes: u32,
    /// Do not serve the page at `/`.
    #[arg(long)]
    no_webui: bool,
    /// KV-cache storage: int8 (one scale per token and head), bf16, or f32 (exact).
    #[arg(long, default_value = "int8")]
    kv_format: splash_model::KvFormat,
    /// Disk space for prompt-prefix states evicted from memory, e.g. 50G, or `auto` (a tenth
    /// of the free disk): a repeated prefix is read back instead of prefilled. Default: off.
    #[arg(long, value_parser = parse_disk_size)]
    max_cache_disk: Option<DiskSize>,
    /// Keep the prefix cache's disk files across restarts (for the same model, weights and
    /// formats). Implies `--max-cache-disk auto` unless a size is given.
    #[arg(long)]
    persistent_cache: bool,
    /// Directory of the prefix cache's disk files.
    #[arg(long, env = "SPLASH_CACHE_DIR", value_name = "DIR")]
    cache_dir: Option<std::path::PathBuf>,
    /// Serve text only: the vision tower is not loaded, and images get a 400.
    #[arg(long)]
    language_only: bool,
    /// Images are resized to at most this many pixels (at least 65536); each 32×32 block
    /// of the resized image is one prompt token.
    #[arg(long, default_value_t = splash_server::DEFAULT_MAX_IMAGE_PIXELS, value_parser = clap::value_parser!(u64).range(splash_server::MIN_MAX_IMAGE_PIXELS..))]
    max_image_pixels: u64,
    /// The vision projector of a GGUF model (llama.cpp's `mmproj` file); by default an
    /// `mmproj*.gguf` beside the model file (BF16, then F32, then F16).
    #[arg(long, value_name = "FILE")]
    mmproj: Option<std::path::PathBuf>,
    /// For the end-to-end tests: honour `x-splash-fault` request headers (a non-finite
    /// score). Never needed in use.
    #[arg(long, hide = true)]
    inject_faults: bool,
}

/// Where a server listens and whom it answers (`serve` and `serve-multi`).
#[derive(clap::Args)]
pub struct ListenArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0 picks a free one).
    #[arg(long, env = "SPLASH_PORT", default_value_t = 8000)]
    pub port: u16,
    /// Require this key (`Authorization: Bearer KEY` or `x-api-key: KEY`).
    #[arg(long, env = "SPLASH_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Accept this `Host` name besides IP addresses and localhost (repeatable; `*` for any).
    #[arg(long = "allowed-host")]
    pub allowed_hosts: Vec<String>,
    /// Accept browser requests from this origin, e.g. http://app.local:3000 (repeatable).
    #[arg(long = "allowed-origin")]
    pub allowed_origins: Vec<String>,
}

impl ListenArgs {
    /// The server settings these give; an empty key is an error.
    pub fn config(self) -> anyhow::Result<ServerConfig> {
        // An empty key (`--api-key ""`, or SPLASH_API_KEY set to nothing by a script whose
        // variable was unset) would otherwise mean "no key" without a word.
        if self.api_key.as_deref().is_some_and(|k| k.trim().is_empty()) {
            anyhow::bail!(
                "--api-key (or SPLASH_API_KEY) is empty: give the key clients must send, or to serve without a key leave out --api-key and unset SPLASH_API_KEY"
            );
        }
        Ok(ServerConfig {
            host: self.host,
            port: self.port,
            api_key: self.api_key,
            allowed_hosts: self.allowed_hosts,
            allowed_origins: self.allowed_origins,
            ..ServerConfig::default()
        })
    }
}

/// `--max-cache-disk`: a size or `auto`.
#[derive(Clone, Copy, Debug)]
enum DiskSize {
    Auto,
    Bytes(u64),
}

fn parse_disk_size(s: &str) -> Result<DiskSize, String> {
    if s.eq_ignore_ascii_case("auto") {
        return Ok(DiskSize::Auto);
    }
    parse_size(s)
        .map(|b| DiskSize::Bytes(b as u64))
        .map_err(|e| format!("{e}, or `auto`"))
}

pub fn run(mut a: Args) -> anyhow::Result<()> {
    // A GGUF repository's vision projector comes with the model unless images are off.
    a.model.model.fetch_projector = !a.language_only;
    let mut config = ServerConfig {
        max_context: a.max_context,
        max_memory: a.max_memory.map(|m| m as u64),
        served_model_names: a.served_model_names,
        // A Hub model is named by its repo (the snapshot directory is a commit hash).
        model_name: match model_arg::source(&a.model)? {
            model_arg::Source::Hub(spec) => Some(match &spec.variant {
                Some(variant) => format!("{}:{variant}", spec.repo),
                None => spec.repo,
            }),
            model_arg::Source::Local(_) => None,
        },
        default_reasoning_effort: a.default_reasoning_effort,
        max_request_size: a.max_request_size,
        header_read_timeout: a.header_read_timeout,
        body_read_timeout: a.body_read_timeout,
        queue_size: a.queue_size,
        lanes: a.lanes as usize,
        webui: !a.no_webui,
        kv_format: a.kv_format,
        inject_faults: a.inject_faults,
        language_only: a.language_only,
        mmproj: a.mmproj,
        max_image_pixels: a.max_image_pixels,
        disk_cache: match (a.max_cache_disk, a.persistent_cache) {
            (None, false) => None,
            (size, persistent) => Some(DiskCacheSettings {
                dir: a.cache_dir.unwrap_or_else(DiskCacheSettings::default_dir),
                max_bytes: match size {
                    Some(DiskSize::Bytes(b)) => Some(b),
                    Some(DiskSize::Auto) | None => None,
                },
                persistent,
            }),
        },
        ..a.listen.config()?
    };
    let runtime = super::http_runtime()?;
    runtime.block_on(async move {
        // Bind first: a taken port is reported before the model is loaded.
        let listener = splash_server::bind(&config).await?;
        let model = model_arg::load(&a.model)?;
        config.drafter = draft_arg::load(&a.draft, &a.model, &model)?;
        config.draft_every_step = a.draft.every_step();
        splash_server::serve(listener, model, config).await?;
        Ok(())
    })
}
