//! [`resolve`]: list, pick, probe, download — the one call a command needs.

use std::path::PathBuf;

use crate::config::HubConfig;
use crate::error::{HubError, Result};
use crate::repo::Repo;
use crate::select::{self, Plan};
use crate::spec::HubSpec;

/// How many leading bytes of the first GGUF file the probe sees.
pub const GGUF_PROBE_BYTES: u64 = 4 << 20;

const CONFIG: &str = "config.json";
const SAFETENSORS_INDEX: &str = "model.safetensors.index.json";

/// What the caller's probe gets to decide whether it supports a model, before any weights
/// are downloaded.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum Probe<'a> {
    /// A safetensors checkpoint: the whole `config.json`.
    Config {
        /// `OWNER/REPO`.
        repo: &'a str,
        /// The bytes of `config.json`.
        bytes: &'a [u8],
    },
    /// A GGUF variant: the first [`GGUF_PROBE_BYTES`] of its first file (the header and
    /// metadata, usually).
    Gguf {
        /// `OWNER/REPO`.
        repo: &'a str,
        /// The file's path in the repository.
        path: &'a str,
        /// Its leading bytes (all of it when smaller).
        prefix: &'a [u8],
        /// The whole file's size, when known.
        size: Option<u64>,
    },
}

/// The on-disk format of a resolved model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelFormat {
    /// `config.json` + `*.safetensors` (+ tokenizer and template files).
    Safetensors,
    /// One GGUF variant (one file or its split parts).
    Gguf {
        /// The variant as the files name it (`UD-Q4_K_M`).
        variant: String,
    },
}

/// A model in the cache, ready to load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// `OWNER/REPO`.
    pub repo: String,
    /// The revision asked for.
    pub revision: String,
    /// The commit it resolved to.
    pub commit: String,
    /// `<cache>/models--OWNER--REPO/snapshots/<commit>`: for a safetensors model, the
    /// checkpoint directory to load.
    pub dir: PathBuf,
    /// The local paths of the files fetched (symlinks into `blobs/`): the small files (sorted), then
    /// the safetensors shards; or the GGUF parts in order.
    pub files: Vec<PathBuf>,
    /// Safetensors or GGUF.
    pub format: ModelFormat,
    /// Whether the Hub was not consulted (offline mode or unreachable).
    pub offline: bool,
}

/// Resolves `spec` to a complete snapshot in the cache:
///
/// 1. lists the repository at the revision (or, offline, reads the cached snapshot);
/// 2. picks the files: for a safetensors repository the `*.safetensors` weights and the
///    small JSON / template / tokenizer files (never `*.bin`, `*.pt`, `*.gguf`); for a GGUF
///    variant its `.gguf` file(s);
/// 3. calls `probe` with `config.json` or the first [`GGUF_PROBE_BYTES`] of the GGUF file
///    (a range request), and stops with [`HubError::Refused`] if it answers `Err(reason)`;
/// 4. downloads the rest (resuming partial files, verifying sizes and sha256) and records
///    `refs/<revision>`.
pub fn resolve(
    spec: &HubSpec,
    config: &HubConfig,
    probe: &dyn Fn(&Probe) -> Result<(), String>,
) -> Result<Snapshot> {
    let repo = Repo::open(spec, config)?;
    let names: Vec<String> = repo.files().iter().map(|f| f.path.clone()).collect();
    let refused = |reason| HubError::Refused {
        repo: spec.repo.clone(),
        reason,
    };
    let (format, files) = match select::plan(&spec.repo, &names, spec.variant.as_deref())? {
        Plan::Safetensors { small, weights } => {
            let bytes = repo.fetch_small(CONFIG)?;
            probe(&Probe::Config {
                repo: &spec.repo,
                bytes: &bytes,
            })
            .map_err(refused)?;
            let weights = if small.iter().any(|f| f == SAFETENSORS_INDEX) {
                let index = repo.fetch_small(SAFETENSORS_INDEX)?;
                select::shards_from_index(&index).ok_or_else(|| HubError::InvalidFile {
                    repo: spec.repo.clone(),
                    path: SAFETENSORS_INDEX.to_string(),
                    reason: "no \"weight_map\" of tensor names to file names".to_string(),
                })?
            } else {
                weights
            };
            let mut files = small;
            for weight in weights {
                if !files.contains(&weight) {
                    files.push(weight);
                }
            }
            (ModelFormat::Safetensors, files)
        }
        Plan::Gguf { variant, files } => {
            let missing = select::missing_split_parts(&files);
            if !missing.is_empty() {
                return Err(missing_files(&repo, missing));
            }
            let first = &files[0];
            let prefix = repo.fetch_range(first, 0..GGUF_PROBE_BYTES)?;
            probe(&Probe::Gguf {
                repo: &spec.repo,
                path: first,
                prefix: &prefix,
                size: repo.file(first).and_then(|f| f.size),
            })
            .map_err(refused)?;
            (ModelFormat::Gguf { variant }, files)
        }
    };
    let local = repo.download(&files)?;
    if let (ModelFormat::Gguf { .. }, true) = (&format, config.projector) {
        if let Some(projector) = select::projector(&names) {
            // Text works without it: a projector that cannot be fetched (offline and not
            // cached, say) leaves the model text-only.
            if let Err(e) = repo.download(std::slice::from_ref(&projector)) {
                tracing::warn!(
                    "{}: the vision projector {projector} was not fetched ({e}); images are off",
                    spec.repo
                );
            }
        }
    }
    Ok(Snapshot {
        repo: spec.repo.clone(),
        revision: spec.revision.clone(),
        commit: repo.commit().to_string(),
        dir: repo.snapshot_dir(),
        files: local,
        format,
        offline: repo.is_offline(),
    })
}

fn missing_files(repo: &Repo, missing: Vec<String>) -> HubError {
    if repo.is_offline() {
        repo.incomplete(missing)
    } else {
        HubError::FileNotFound {
            repo: repo.id().to_string(),
            revision: repo.revision().to_string(),
            path: missing.join(", "),
        }
    }
}
