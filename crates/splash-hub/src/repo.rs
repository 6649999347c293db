//! [`Repo`]: one repository at one commit, online (listed by the Hub) or from the cache.

use std::fs;
use std::io::Read;
use std::ops::Range;
use std::path::{Path, PathBuf};

use crate::api::{ByteRange, Client, RepoFile};
use crate::cache::{snapshot_files, RepoCache};
use crate::config::HubConfig;
use crate::download::Fetcher;
use crate::error::{io, HubError, Result};
use crate::progress;
use crate::spec::{is_commit_hash, HubSpec};

/// A repository resolved to a commit: its file listing, and the means to fetch files into
/// the cache.
///
/// Online, the listing comes from the Hub and files are downloaded on demand. Offline
/// (`HF_HUB_OFFLINE`, [`HubConfig::offline`], or the Hub unreachable at
/// [`Repo::open`]), the listing is the cached snapshot's files and nothing is downloaded.
pub struct Repo {
    id: String,
    revision: String,
    commit: String,
    files: Vec<RepoFile>,
    cache: RepoCache,
    /// `None` when working from the cache only.
    client: Option<Client>,
    quiet: bool,
}

impl Repo {
    /// Resolves `spec.repo` at `spec.revision`: asks the Hub (within
    /// [`HubConfig::check_timeout`]) for the commit and file list; when offline, or when the
    /// Hub cannot be reached or fails (5xx), uses `refs/<revision>` and the snapshot in the
    /// cache instead. Access and not-found errors are not hidden by the cache.
    pub fn open(spec: &HubSpec, config: &HubConfig) -> Result<Repo> {
        if config.offline {
            let why = "offline mode: HF_HUB_OFFLINE=1 or --offline".to_string();
            return Repo::from_cache(spec, config, why, true);
        }
        let client = Client::new(config);
        match client.model_info(&spec.repo, &spec.revision) {
            Ok(info) => Ok(Repo {
                id: spec.repo.clone(),
                revision: spec.revision.clone(),
                commit: info.commit,
                files: info.files,
                cache: RepoCache::new(config, &spec.repo),
                client: Some(client),
                quiet: config.quiet,
            }),
            Err(e) if e.is_unreachable() => {
                tracing::warn!("the Hub is unreachable ({e}); trying the cache");
                Repo::from_cache(spec, config, e.to_string(), false)
            }
            Err(e) => Err(e),
        }
    }

    fn from_cache(
        spec: &HubSpec,
        config: &HubConfig,
        why: String,
        offline_mode: bool,
    ) -> Result<Repo> {
        let cache = RepoCache::new(config, &spec.repo);
        let commit = if is_commit_hash(&spec.revision) {
            Some(spec.revision.clone())
        } else {
            cache.read_ref(&spec.revision)
        };
        let Some(commit) = commit.filter(|c| cache.snapshot_dir(c).is_dir()) else {
            return Err(HubError::NotCached {
                repo: spec.repo.clone(),
                revision: spec.revision.clone(),
                cache_dir: config.cache_dir.clone(),
                why,
                offline_mode,
            });
        };
        let dir = cache.snapshot_dir(&commit);
        let files = snapshot_files(&dir)
            .into_iter()
            .map(|path| RepoFile {
                size: fs::metadata(dir.join(&path)).map(|m| m.len()).ok(),
                sha256: None,
                blob_id: None,
                path,
            })
            .collect();
        tracing::info!(
            "offline ({why}): using the cached snapshot {commit} of {}",
            spec.repo
        );
        Ok(Repo {
            id: spec.repo.clone(),
            revision: spec.revision.clone(),
            commit,
            files,
            cache,
            client: None,
            quiet: config.quiet,
        })
    }

    /// `OWNER/REPO`.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The revision asked for (branch, tag or commit).
    pub fn revision(&self) -> &str {
        &self.revision
    }

    /// The commit hash the revision resolved to.
    pub fn commit(&self) -> &str {
        &self.commit
    }

    /// Every file of the repository at this commit (offline: of the cached snapshot).
    pub fn files(&self) -> &[RepoFile] {
        &self.files
    }

    /// One file of the listing.
    pub fn file(&self, path: &str) -> Option<&RepoFile> {
        self.files.iter().find(|f| f.path == path)
    }

    /// Whether this works from the cache only.
    pub fn is_offline(&self) -> bool {
        self.client.is_none()
    }

    /// `<cache>/models--OWNER--REPO/snapshots/<commit>`.
    pub fn snapshot_dir(&self) -> PathBuf {
        self.cache.snapshot_dir(&self.commit)
    }

    /// Downloads one (small) file fully into the cache and returns its bytes, e.g.
    /// `config.json` to identify the model before any weights are fetched. Unlike
    /// [`Repo::download`] it does not record `refs/<revision>`.
    pub fn fetch_small(&self, path: &str) -> Result<Vec<u8>> {
        // Small: no progress bar.
        let local = self.ensure_all(&[path.to_string()], true)?.remove(0);
        fs::read(&local).map_err(io("read", local))
    }

    /// The bytes of `range` of one file (clamped to its size), by an HTTP range request
    /// unless the file is already in the cache: e.g. a GGUF header prefix. Nothing is
    /// stored.
    pub fn fetch_range(&self, path: &str, range: Range<u64>) -> Result<Vec<u8>> {
        let file = self.listed(path)?;
        let end = file.size.map_or(range.end, |size| range.end.min(size));
        if range.start >= end {
            return Ok(Vec::new());
        }
        let len = end - range.start;
        let interrupted = |reason: String, received: usize| HubError::Interrupted {
            reason,
            path: path.to_string(),
            received: received as u64,
            expected: len,
        };
        if let Some(local) = self.local_copy(file) {
            return read_range(&local, range.start, len);
        }
        let Some(client) = &self.client else {
            return Err(self.incomplete(vec![path.to_string()]));
        };
        let wanted = ByteRange {
            start: range.start,
            end: Some(end - 1),
        };
        let response =
            client.get_file(&self.id, &self.commit, path, Some(wanted), |_| Some(wanted))?;
        let mut body = response.body;
        if response.offset < range.start {
            // The server ignored the range: skip to the start.
            let skip = range.start - response.offset;
            std::io::copy(&mut (&mut body).take(skip), &mut std::io::sink())
                .map_err(|e| interrupted(e.to_string(), 0))?;
        }
        let mut bytes = Vec::with_capacity(len as usize);
        body.take(len)
            .read_to_end(&mut bytes)
            .map_err(|e| interrupted(e.to_string(), bytes.len()))?;
        Ok(bytes)
    }

    /// Makes every `paths` entry a complete, verified file of the snapshot (downloading what
    /// the cache lacks, with a progress bar), records `refs/<revision>`, and returns the
    /// local paths in the same order. Offline, checks they are all in the snapshot.
    pub fn download(&self, paths: &[String]) -> Result<Vec<PathBuf>> {
        let local = self.ensure_all(paths, self.quiet)?;
        if self.client.is_some() && self.revision != self.commit {
            self.cache.write_ref(&self.revision, &self.commit)?;
        }
        Ok(local)
    }

    fn ensure_all(&self, paths: &[String], quiet: bool) -> Result<Vec<PathBuf>> {
        let Some(client) = &self.client else {
            let dir = self.snapshot_dir();
            let missing: Vec<String> = paths
                .iter()
                .filter(|p| !dir.join(p).is_file())
                .cloned()
                .collect();
            if !missing.is_empty() {
                return Err(self.incomplete(missing));
            }
            return Ok(paths.iter().map(|p| dir.join(p)).collect());
        };
        let files = paths
            .iter()
            .map(|p| self.listed(p))
            .collect::<Result<Vec<_>>>()?;
        let fetcher = Fetcher {
            client,
            cache: &self.cache,
            repo: &self.id,
            commit: &self.commit,
        };
        let total = files
            .iter()
            .filter(|f| !fetcher.is_cached(f))
            .filter_map(|f| f.size)
            .sum();
        let bar = progress::bar(total, quiet);
        let local = files
            .iter()
            .map(|f| fetcher.ensure(f, &bar))
            .collect::<Result<Vec<_>>>();
        bar.finish_and_clear();
        local
    }

    fn listed(&self, path: &str) -> Result<&RepoFile> {
        self.file(path).ok_or_else(|| {
            if self.is_offline() {
                self.incomplete(vec![path.to_string()])
            } else {
                HubError::FileNotFound {
                    repo: self.id.clone(),
                    revision: self.revision.clone(),
                    path: path.to_string(),
                }
            }
        })
    }

    pub(crate) fn incomplete(&self, missing: Vec<String>) -> HubError {
        HubError::IncompleteSnapshot {
            dir: self.snapshot_dir(),
            missing,
        }
    }

    /// A complete local copy of the file, if the cache has one.
    fn local_copy(&self, file: &RepoFile) -> Option<PathBuf> {
        let complete = |p: &Path| {
            fs::metadata(p).is_ok_and(|m| m.is_file() && file.size.is_none_or(|s| s == m.len()))
        };
        let linked = self.snapshot_dir().join(&file.path);
        if complete(&linked) {
            return Some(linked);
        }
        let blob = self.cache.blob(file.etag()?);
        complete(&blob).then_some(blob)
    }
}

fn read_range(path: &Path, start: u64, len: u64) -> Result<Vec<u8>> {
    use std::io::{Seek, SeekFrom};
    let mut file = fs::File::open(path).map_err(io("open", path))?;
    file.seek(SeekFrom::Start(start))
        .map_err(io("read", path))?;
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(len)
        .read_to_end(&mut bytes)
        .map_err(io("read", path))?;
    Ok(bytes)
}
