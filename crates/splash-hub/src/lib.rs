//! A Hugging Face Hub client for splash: downloads model repositories into the standard
//! Hugging Face cache, so that `huggingface_hub`, transformers and splash share one copy.
//!
//! # Brief overview
//!
//! A model is named by a [`HubSpec`]: `OWNER/REPO` (a safetensors checkpoint) or
//! `OWNER/REPO:VARIANT` (one GGUF quantisation, such as `Q8_0` or `UD-Q4_K_M`), at a
//! revision (branch, tag or commit; `main` by default). [`resolve`] is the one call a
//! command needs: it lists the repository, picks the files, lets the caller's probe look at
//! `config.json` (or the first 4 MiB of the GGUF file) and refuse an unsupported model
//! *before* the weights are downloaded, then downloads the rest and returns a [`Snapshot`]
//! (the snapshot directory and the local file paths).
//!
//! [`Repo`] is the lower level: [`Repo::open`] resolves the revision to a commit and a file
//! list; [`Repo::fetch_small`], [`Repo::fetch_range`] and [`Repo::download`] fetch files.
//! [`list_cache`] lists what the cache holds (for `splash list`).
//!
//! The `fake-hub` feature adds `fake_hub`, a fake Hub server on loopback for tests (this
//! crate's, and other crates' through `[dev-dependencies]`); release builds leave it out.
//!
//! Downloads land in `models--OWNER--REPO/blobs/<etag>.incomplete`, are checked against
//! the size and sha256 the Hub lists while they stream, and are renamed to
//! `blobs/<etag>` and linked from `snapshots/<commit>/<path>` only when whole; a later run
//! resumes an `.incomplete` file with a `Range` request. `refs/<revision>` records the
//! commit once a download completes.
//!
//! At startup the revision is checked with the Hub within 5 s
//! ([`HubConfig::check_timeout`]). If the Hub cannot be reached, or offline mode is on,
//! the snapshot recorded in the cache for that revision is used instead, and the
//! [`Snapshot::offline`] flag says so.
//!
//! # Environment
//!
//! [`HubConfig::from_env`] reads these once; nothing else in the crate reads the process
//! environment (apart from the HTTP client's standard `HTTPS_PROXY` / `NO_PROXY`).
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `HF_ENDPOINT` | the Hub's base URL | `https://huggingface.co` |
//! | `HF_TOKEN` | access token for private and gated repositories | the file at `HF_TOKEN_PATH`, else `$HF_HOME/token` |
//! | `HF_HOME` | Hugging Face's home directory | `$XDG_CACHE_HOME/huggingface` or `~/.cache/huggingface` |
//! | `HF_HUB_CACHE` | the cache of repositories | `$HF_HOME/hub` |
//! | `HF_HUB_OFFLINE` | `1`: never touch the network, use the cache only | off |
//!
//! # Example
//!
//! ```no_run
//! use splash_hub::{resolve, HubConfig, HubSpec, Probe};
//!
//! let spec = HubSpec::parse("Qwen/Qwen3.5-0.8B")?.with_revision("main")?;
//! let config = HubConfig::from_env();
//! let snapshot = resolve(&spec, &config, &|probe| match probe {
//!     Probe::Config { bytes, .. } if bytes.windows(7).any(|w| w == b"qwen3_5") => Ok(()),
//!     _ => Err("only Qwen3.5 checkpoints are supported".to_string()),
//! })?;
//! println!("checkpoint in {}", snapshot.dir.display());
//! # Ok::<(), splash_hub::HubError>(())
//! ```

mod api;
mod cache;
mod config;
mod download;
mod error;
#[cfg(feature = "fake-hub")]
pub mod fake_hub;
mod progress;
mod repo;
mod resolve;
mod select;
mod spec;

pub use api::RepoFile;
pub use cache::{list_cache, CachedRepo, CachedSnapshot};
pub use config::{HubConfig, DEFAULT_ENDPOINT};
pub use error::{HubError, Result};
pub use repo::Repo;
pub use resolve::{resolve, ModelFormat, Probe, Snapshot, GGUF_PROBE_BYTES};
pub use spec::{HubSpec, DEFAULT_REVISION};
