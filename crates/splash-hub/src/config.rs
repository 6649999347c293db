//! [`HubConfig`]: endpoint, token, cache directory and offline mode, read once from the
//! environment the way `huggingface_hub` reads them.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The Hub used when `HF_ENDPOINT` is not set.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// Where and how to talk to the Hub. Build it with [`HubConfig::from_env`] in a program, or
/// with [`HubConfig::new`] and field updates in tests (nothing here reads the process
/// environment after construction).
#[derive(Clone)]
pub struct HubConfig {
    /// Base URL of the Hub, without a trailing `/` (`HF_ENDPOINT`).
    pub endpoint: String,
    /// Access token sent as `Authorization: Bearer` to the endpoint (`HF_TOKEN`, or the
    /// token file).
    pub token: Option<String>,
    /// The hub cache: `models--OWNER--REPO` directories live here (`HF_HUB_CACHE`).
    pub cache_dir: PathBuf,
    /// Never touch the network; use the cache only (`HF_HUB_OFFLINE=1`, `--offline`).
    pub offline: bool,
    /// No progress bar.
    pub quiet: bool,
    /// Time allowed for the startup revision check before falling back to the cache.
    pub check_timeout: Duration,
    /// Per-read stall timeout of downloads: a connection silent this long is given up
    /// (the partial file is kept for the next run).
    pub read_timeout: Duration,
    /// With a GGUF variant, also fetch the repository's vision projector (`mmproj*.gguf`) into
    /// the snapshot; a failure to fetch it is only warned about.
    pub projector: bool,
}

impl HubConfig {
    /// The defaults (public Hub, no token, online, progress shown, 5 s revision check) with
    /// the given hub cache directory.
    pub fn new(cache_dir: impl Into<PathBuf>) -> HubConfig {
        HubConfig {
            endpoint: DEFAULT_ENDPOINT.to_string(),
            token: None,
            cache_dir: cache_dir.into(),
            offline: false,
            quiet: false,
            check_timeout: Duration::from_secs(5),
            read_timeout: Duration::from_secs(60),
            projector: false,
        }
    }

    /// Reads `HF_ENDPOINT`, `HF_TOKEN` (else the file at `HF_TOKEN_PATH`, else
    /// `$HF_HOME/token`), `HF_HOME` (default `$XDG_CACHE_HOME/huggingface` or
    /// `~/.cache/huggingface`), `HF_HUB_CACHE` (default `$HF_HOME/hub`) and
    /// `HF_HUB_OFFLINE` (`1`, `true`, `yes`, `on`).
    pub fn from_env() -> HubConfig {
        HubConfig::from_lookup(|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
    }

    /// [`HubConfig::from_env`] over any variable lookup.
    pub(crate) fn from_lookup(var: impl Fn(&str) -> Option<String>) -> HubConfig {
        let hf_home = var("HF_HOME").map(expand_home).unwrap_or_else(|| {
            let cache = var("XDG_CACHE_HOME")
                .map(expand_home)
                .unwrap_or_else(|| home_dir().join(".cache"));
            cache.join("huggingface")
        });
        let cache_dir = var("HF_HUB_CACHE")
            .or_else(|| var("HUGGINGFACE_HUB_CACHE"))
            .map(expand_home)
            .unwrap_or_else(|| hf_home.join("hub"));
        let token_path = var("HF_TOKEN_PATH")
            .map(expand_home)
            .unwrap_or_else(|| hf_home.join("token"));
        let token = var("HF_TOKEN")
            .or_else(|| var("HUGGING_FACE_HUB_TOKEN"))
            .or_else(|| std::fs::read_to_string(&token_path).ok())
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty());
        let endpoint = var("HF_ENDPOINT").unwrap_or_else(|| DEFAULT_ENDPOINT.to_string());
        HubConfig {
            endpoint: endpoint.trim_end_matches('/').to_string(),
            token,
            offline: var("HF_HUB_OFFLINE").is_some_and(|v| is_true(&v)),
            ..HubConfig::new(cache_dir)
        }
    }

    /// The cache directory of one repository: `<cache_dir>/models--OWNER--REPO`.
    pub fn repo_dir(&self, repo: &str) -> PathBuf {
        self.cache_dir
            .join(format!("models--{}", repo.replace('/', "--")))
    }
}

/// The token is never printed.
impl fmt::Debug for HubConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HubConfig")
            .field("endpoint", &self.endpoint)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("cache_dir", &self.cache_dir)
            .field("offline", &self.offline)
            .field("quiet", &self.quiet)
            .field("check_timeout", &self.check_timeout)
            .field("read_timeout", &self.read_timeout)
            .finish()
    }
}

fn is_true(value: &str) -> bool {
    matches!(
        value.trim().to_ascii_lowercase().as_str(),
        "1" | "true" | "yes" | "on"
    )
}

fn home_dir() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."))
}

fn expand_home(path: String) -> PathBuf {
    match path.strip_prefix("~/") {
        Some(rest) => home_dir().join(rest),
        None if path == "~" => home_dir(),
        None => Path::new(&path).to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn config(vars: &[(&str, &str)]) -> HubConfig {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        HubConfig::from_lookup(|name| vars.get(name).cloned())
    }

    #[test]
    fn defaults_follow_huggingface_hub() {
        let c = config(&[("XDG_CACHE_HOME", "/xdg")]);
        assert_eq!(c.endpoint, "https://huggingface.co");
        assert_eq!(c.cache_dir, PathBuf::from("/xdg/huggingface/hub"));
        assert!(!c.offline);
        assert_eq!(c.check_timeout, Duration::from_secs(5));
        let c = config(&[("HF_HOME", "/hf")]);
        assert_eq!(c.cache_dir, PathBuf::from("/hf/hub"));
    }

    #[test]
    fn explicit_variables_win() {
        let c = config(&[
            ("HF_HOME", "/hf"),
            ("HF_HUB_CACHE", "/elsewhere"),
            ("HF_ENDPOINT", "http://127.0.0.1:9/"),
            ("HF_TOKEN", " hf_abc\n"),
            ("HF_HUB_OFFLINE", "1"),
        ]);
        assert_eq!(c.cache_dir, PathBuf::from("/elsewhere"));
        assert_eq!(c.endpoint, "http://127.0.0.1:9");
        assert_eq!(c.token.as_deref(), Some("hf_abc"));
        assert!(c.offline);
        assert!(!config(&[("HF_HUB_OFFLINE", "0")]).offline);
        assert!(config(&[("HF_HUB_OFFLINE", "TRUE")]).offline);
    }

    #[test]
    fn token_comes_from_the_token_file() {
        let dir = std::env::temp_dir().join(format!("splash-hub-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("token"), "hf_from_home\n").unwrap();
        std::fs::write(dir.join("other"), "hf_from_path").unwrap();
        let home = dir.to_str().unwrap();
        assert_eq!(
            config(&[("HF_HOME", home)]).token.as_deref(),
            Some("hf_from_home")
        );
        let other = dir.join("other");
        let c = config(&[
            ("HF_HOME", home),
            ("HF_TOKEN_PATH", other.to_str().unwrap()),
        ]);
        assert_eq!(c.token.as_deref(), Some("hf_from_path"));
        let c = config(&[("HF_HOME", home), ("HF_TOKEN", "hf_env")]);
        assert_eq!(c.token.as_deref(), Some("hf_env"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn debug_hides_the_token() {
        let mut c = HubConfig::new("/c");
        c.token = Some("hf_secret".into());
        assert!(!format!("{c:?}").contains("hf_secret"));
    }

    #[test]
    fn repo_dir_uses_the_hf_layout() {
        let c = HubConfig::new("/c");
        assert_eq!(
            c.repo_dir("Qwen/Qwen3-0.6B"),
            PathBuf::from("/c/models--Qwen--Qwen3-0.6B")
        );
    }
}
