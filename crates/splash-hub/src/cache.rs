//! The on-disk cache, laid out exactly as `huggingface_hub` lays it out:
//!
//! ```text
//! <cache_dir>/models--OWNER--REPO/
//!     blobs/<etag>                  file contents, named by sha256 (LFS) or git blob id
//!     blobs/<etag>.incomplete       a download in progress (resumed by the next run)
//!     refs/<revision>               the commit hash the revision pointed at
//!     snapshots/<commit>/<path>     relative symlink to ../../blobs/<etag>
//! ```
//!
//! A blob gets its final name only once complete and verified, and the snapshot link is
//! made only after that, so a path under `snapshots/` is always a whole file.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use crate::config::HubConfig;
use crate::error::{io, Result};

/// The cache directory of one repository.
#[derive(Debug, Clone)]
pub(crate) struct RepoCache {
    pub dir: PathBuf,
}

impl RepoCache {
    pub fn new(config: &HubConfig, repo: &str) -> RepoCache {
        RepoCache {
            dir: config.repo_dir(repo),
        }
    }

    pub fn blob(&self, etag: &str) -> PathBuf {
        self.dir.join("blobs").join(etag)
    }

    pub fn incomplete(&self, etag: &str) -> PathBuf {
        self.dir.join("blobs").join(format!("{etag}.incomplete"))
    }

    pub fn snapshot_dir(&self, commit: &str) -> PathBuf {
        self.dir.join("snapshots").join(commit)
    }

    /// The commit `refs/<revision>` records, if any.
    pub fn read_ref(&self, revision: &str) -> Option<String> {
        let text = fs::read_to_string(self.dir.join("refs").join(revision)).ok()?;
        let commit = text.trim();
        (!commit.is_empty()).then(|| commit.to_string())
    }

    /// Records that `revision` points at `commit` (written to a temporary file, then renamed).
    pub fn write_ref(&self, revision: &str, commit: &str) -> Result<()> {
        if self.read_ref(revision).as_deref() == Some(commit) {
            return Ok(());
        }
        let path = self.dir.join("refs").join(revision);
        let parent = path.parent().expect("a ref path has a parent");
        fs::create_dir_all(parent).map_err(io("create", parent))?;
        let tmp = path.with_file_name(format!(".{}.tmp", std::process::id()));
        fs::write(&tmp, commit).map_err(io("write", &tmp))?;
        fs::rename(&tmp, &path).map_err(io("rename", &tmp))
    }

    /// Points `snapshots/<commit>/<path>` at `blobs/<etag>` with a relative symlink,
    /// replacing whatever was there.
    pub fn link(&self, commit: &str, path: &str, etag: &str) -> Result<PathBuf> {
        let link = self.snapshot_dir(commit).join(path);
        let target = relative_blob_target(path, etag);
        if fs::read_link(&link).is_ok_and(|t| t == target) {
            return Ok(link);
        }
        let parent = link.parent().expect("a snapshot path has a parent");
        fs::create_dir_all(parent).map_err(io("create", parent))?;
        let tmp = parent.join(format!(
            ".{}.{}.tmp",
            link.file_name().unwrap().to_string_lossy(),
            std::process::id()
        ));
        let _ = fs::remove_file(&tmp);
        make_link(&self.blob(etag), &target, &tmp)?;
        fs::rename(&tmp, &link).map_err(io("rename", &tmp))?;
        Ok(link)
    }
}

/// `../../blobs/<etag>` with one more `../` for each directory in `path`.
fn relative_blob_target(path: &str, etag: &str) -> PathBuf {
    let depth = path.matches('/').count();
    let mut target = PathBuf::new();
    for _ in 0..depth + 2 {
        target.push("..");
    }
    target.join("blobs").join(etag)
}

#[cfg(unix)]
fn make_link(_blob: &Path, target: &Path, at: &Path) -> Result<()> {
    std::os::unix::fs::symlink(target, at).map_err(io("symlink", at))
}

/// Without symlinks, the snapshot holds a copy (as `huggingface_hub` does on Windows).
#[cfg(not(unix))]
fn make_link(blob: &Path, _target: &Path, at: &Path) -> Result<()> {
    fs::copy(blob, at).map(|_| ()).map_err(io("copy", blob))
}

/// All files under a snapshot directory, as `/`-separated repository paths, sorted.
pub(crate) fn snapshot_files(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        let Ok(entries) = fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') && name.ends_with(".tmp") {
                continue;
            }
            // `metadata` follows the symlink: a dangling link is not a file.
            match fs::metadata(&path) {
                Ok(m) if m.is_dir() => walk(root, &path, out),
                Ok(m) if m.is_file() => {
                    let rel = path.strip_prefix(root).unwrap();
                    let parts: Vec<_> = rel.iter().map(|p| p.to_string_lossy()).collect();
                    out.push(parts.join("/"));
                }
                _ => {}
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// One repository found in the cache by [`list_cache`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedRepo {
    /// `OWNER/REPO`.
    pub repo: String,
    /// Its `models--OWNER--REPO` directory.
    pub dir: PathBuf,
    /// Bytes used by its blobs, each counted once however many snapshots share it
    /// (partial downloads included).
    pub size_on_disk: u64,
    /// Bytes of partial downloads (`blobs/*.incomplete`) within `size_on_disk`.
    pub incomplete_bytes: u64,
    /// Its snapshots, newest first (by modification time).
    pub snapshots: Vec<CachedSnapshot>,
}

/// One `snapshots/<commit>` directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedSnapshot {
    /// The commit hash.
    pub commit: String,
    /// The revisions (`refs/*`) that point at it, e.g. `["main"]`.
    pub refs: Vec<String>,
    /// Its directory.
    pub dir: PathBuf,
    /// Its files, as repository paths.
    pub files: Vec<String>,
    /// Sum of its files' sizes.
    pub size: u64,
}

/// Lists the model repositories in the hub cache (`models--*` directories), for
/// `splash list`. A missing cache directory is an empty list.
pub fn list_cache(config: &HubConfig) -> Result<Vec<CachedRepo>> {
    let entries = match fs::read_dir(&config.cache_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io("read", &config.cache_dir)(e)),
    };
    let mut repos = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix("models--") else {
            continue;
        };
        let Some((owner, repo)) = rest.split_once("--") else {
            continue;
        };
        repos.push(scan_repo(&format!("{owner}/{repo}"), &entry.path()));
    }
    repos.sort_by(|a, b| a.repo.cmp(&b.repo));
    Ok(repos)
}

fn scan_repo(repo: &str, dir: &Path) -> CachedRepo {
    let mut size_on_disk = 0;
    let mut incomplete_bytes = 0;
    for entry in fs::read_dir(dir.join("blobs"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let len = entry.metadata().map(|m| m.len()).unwrap_or(0);
        size_on_disk += len;
        if entry.file_name().to_string_lossy().ends_with(".incomplete") {
            incomplete_bytes += len;
        }
    }
    let mut refs: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (revision, commit) in read_refs(&dir.join("refs")) {
        refs.entry(commit).or_default().push(revision);
    }
    let mut snapshots = Vec::new();
    for entry in fs::read_dir(dir.join("snapshots"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let commit = entry.file_name().to_string_lossy().into_owned();
        let snap_dir = entry.path();
        let files = snapshot_files(&snap_dir);
        let size = files
            .iter()
            .filter_map(|f| fs::metadata(snap_dir.join(f)).ok())
            .map(|m| m.len())
            .sum();
        let mtime = entry.metadata().and_then(|m| m.modified()).ok();
        snapshots.push((
            mtime,
            CachedSnapshot {
                refs: refs.remove(&commit).unwrap_or_default(),
                commit,
                dir: snap_dir,
                files,
                size,
            },
        ));
    }
    snapshots.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.commit.cmp(&b.1.commit)));
    CachedRepo {
        repo: repo.to_string(),
        dir: dir.to_path_buf(),
        size_on_disk,
        incomplete_bytes,
        snapshots: snapshots.into_iter().map(|(_, s)| s).collect(),
    }
}

/// `(revision, commit)` for every file under `refs/` (revisions may contain `/`).
fn read_refs(dir: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if let Ok(text) = fs::read_to_string(&path) {
                let rel = path.strip_prefix(dir).unwrap();
                let parts: Vec<_> = rel.iter().map(|p| p.to_string_lossy()).collect();
                out.push((parts.join("/"), text.trim().to_string()));
            }
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_targets_are_relative_to_the_snapshot_path() {
        assert_eq!(
            relative_blob_target("config.json", "abc"),
            PathBuf::from("../../blobs/abc")
        );
        assert_eq!(
            relative_blob_target("Q8_0/m-00001-of-00002.gguf", "abc"),
            PathBuf::from("../../../blobs/abc")
        );
    }

    #[test]
    fn missing_cache_lists_nothing() {
        let config = HubConfig::new("/nonexistent/splash-hub-cache");
        assert!(list_cache(&config).unwrap().is_empty());
    }
}
