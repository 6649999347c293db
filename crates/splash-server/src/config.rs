//! Server settings, as given on the command line.

/// What `splash serve` was asked to do.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub host: String,
    /// 0 picks a free port (printed in the `Ready` line).
    pub port: u16,
    pub api_key: Option<String>,
    /// Extra `Host` names accepted besides IP literals and `localhost` (`*`: any).
    pub allowed_hosts: Vec<String>,
    /// Browser origins accepted besides the server's own (`*`: any).
    pub allowed_origins: Vec<String>,
    /// Cap on prompt + output tokens (never above the model's native limit).
    pub max_context: Option<usize>,
    /// Model id the API answers to, then aliases.
    pub served_model_names: Vec<String>,
    /// The model's name in the API; by default the checkpoint directory or file name.
    pub model_name: Option<String>,
    /// `reasoning_effort` applied when a request has none.
    pub default_reasoning_effort: Option<String>,
    /// Largest accepted request body in bytes.
    pub max_request_size: usize,
    /// Time a client has to send a request's headers (and that an idle keep-alive connection
    /// stays open); the connection is closed after it.
    pub header_read_timeout: std::time::Duration,
    /// Time a client has to send a request's whole body; 408 after it.
    pub body_read_timeout: std::time::Duration,
    /// Requests that may wait for a free decode lane before new ones get 503.
    pub queue_size: usize,
    /// Sequences decoded at once.
    pub lanes: usize,
    /// Serve the page at `/`.
    pub webui: bool,
    /// How sequences store keys and values.
    pub kv_format: splash_model::KvFormat,
    /// The speculative draft (DFlash), when speculation is on.
    pub drafter: Option<std::sync::Arc<dyn splash_engine::Drafter>>,
    /// Draft a full block at every step (`--speculative always`).
    pub draft_every_step: bool,
    /// Memory the plan may use at most (`--max-memory`), in bytes.
    pub max_memory: Option<u64>,
    /// The memory plan the server started with (set by `serve`).
    pub memory_plan: Option<splash_engine::MemoryPlan>,
    /// The prefix cache's disk tier (`--max-cache-disk`), off when `None`.
    pub disk_cache: Option<DiskCacheSettings>,
    /// Leave the vision tower unloaded: images and PDFs get a 400 (`--language-only`).
    pub language_only: bool,
    /// Images are resized to at most this many pixels (`--max-image-pixels`).
    pub max_image_pixels: u64,
    /// The vision projector of a GGUF model (`--mmproj`); by default an `mmproj*.gguf` beside
    /// the model file.
    pub mmproj: Option<std::path::PathBuf>,
    /// Honour test clients' fault requests (`x-splash-fault: nonfinite-logits` makes a
    /// score non-finite): for the end-to-end tests of error paths only.
    pub inject_faults: bool,
}

/// `--max-cache-disk`, `--persistent-cache`, `--cache-dir`.
#[derive(Clone, Debug)]
pub struct DiskCacheSettings {
    /// Where the tier's files go (one directory per model identity below it).
    pub dir: std::path::PathBuf,
    /// Bytes of files at most; `None`: a share of the free disk (`auto`).
    pub max_bytes: Option<u64>,
    /// Keep the files across restarts.
    pub persistent: bool,
}

impl DiskCacheSettings {
    /// The default directory: `$SPLASH_CACHE_DIR`, else `$XDG_CACHE_HOME/splash/prefix-cache`,
    /// else `~/.cache/splash/prefix-cache`.
    pub fn default_dir() -> std::path::PathBuf {
        use std::path::PathBuf;
        let env = |k: &str| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        env("XDG_CACHE_HOME")
            .or_else(|| env("HOME").map(|h| h.join(".cache")))
            .unwrap_or_else(std::env::temp_dir)
            .join("splash/prefix-cache")
    }

    /// The budget: the given size, or for `auto` a tenth of the free disk, at most 256 GiB.
    pub fn budget(&self) -> u64 {
        self.max_bytes.unwrap_or_else(|| {
            splash_engine::free_disk_bytes(&self.dir).map_or(0, |free| (free / 10).min(256 << 30))
        })
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            host: "127.0.0.1".into(),
            port: 8000,
            api_key: None,
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
            max_context: None,
            served_model_names: Vec::new(),
            model_name: None,
            default_reasoning_effort: None,
            max_request_size: 128 << 20,
            header_read_timeout: std::time::Duration::from_secs(10),
            body_read_timeout: std::time::Duration::from_secs(60),
            queue_size: 32,
            lanes: 4,
            webui: true,
            kv_format: splash_model::KvFormat::default(),
            drafter: None,
            draft_every_step: false,
            max_memory: None,
            memory_plan: None,
            disk_cache: None,
            language_only: false,
            mmproj: None,
            max_image_pixels: crate::images::DEFAULT_MAX_IMAGE_PIXELS,
            inject_faults: false,
        }
    }
}

/// Parses a size with an optional binary suffix: `32K` = 32768, `128M`, `2G`, or a plain number.
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let (num, mult) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 1usize << 10),
        Some('M') => (&t[..t.len() - 1], 1 << 20),
        Some('G') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    let n: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a size: use a number with an optional K, M or G suffix (K = 1024), e.g. 32K"))?;
    if !(n.is_finite() && n > 0.0) {
        return Err(format!("`{s}` must be a positive size"));
    }
    Ok((n * mult as f64) as usize)
}

/// Parses a duration in seconds (`10`, `0.5`, or with a unit: `500ms`, `30s`, `2m`).
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let t = s.trim();
    let (num, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60.0)
    } else {
        (t, 1.0)
    };
    let n: f64 = num.trim().parse().map_err(|_| {
        format!("`{s}` is not a duration: use seconds (e.g. 30 or 0.5) or a unit (500ms, 30s, 2m)")
    })?;
    let secs = n * scale;
    if !(secs.is_finite() && secs > 0.0 && secs <= 86_400.0) {
        return Err(format!(
            "`{s}` must be a duration above 0 and at most a day"
        ));
    }
    Ok(std::time::Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("32K"), Ok(32768));
        assert_eq!(parse_size("128M"), Ok(128 << 20));
        assert_eq!(parse_size("1.5k"), Ok(1536));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("lots").unwrap_err().contains("K = 1024"));
        assert!(parse_size("0").is_err());
    }

    #[test]
    fn durations() {
        use std::time::Duration;
        assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("0.5"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("soon").unwrap_err().contains("500ms"));
        for bad in ["0", "-1", "inf", "NaN", "2d"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
