//! Getting one file into the cache: skip it if its blob is there, else stream it into
//! `blobs/<etag>.incomplete` (resuming a previous partial file with a `Range` request),
//! check its size and sha256 while streaming, rename it to `blobs/<etag>` and link it
//! from the snapshot.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use indicatif::ProgressBar;
use sha2::{Digest, Sha256};

use crate::api::{is_safe_blob_name, ByteRange, Client, FileResponse, RepoFile};
use crate::cache::RepoCache;
use crate::error::{io, HubError, Result};

const CHUNK: usize = 256 << 10;

/// Downloads files of one commit of one repository.
pub(crate) struct Fetcher<'a> {
    pub client: &'a Client,
    pub cache: &'a RepoCache,
    pub repo: &'a str,
    pub commit: &'a str,
}

impl Fetcher<'_> {
    /// Makes `snapshots/<commit>/<path>` a complete, verified file and returns its path.
    pub fn ensure(&self, file: &RepoFile, progress: &ProgressBar) -> Result<PathBuf> {
        if let Some(link) = self.cached(file, file.etag())? {
            return Ok(link);
        }
        let partial = |etag: &str| partial_len(&self.cache.incomplete(etag));
        let first = file
            .etag()
            .map(partial)
            .filter(|&n| n > 0)
            .map(|start| ByteRange { start, end: None });
        let response = self
            .client
            .get_file(self.repo, self.commit, &file.path, first, |meta| {
                let etag = file.etag().or(meta.etag.as_deref())?;
                let start = partial(etag);
                (start > 0).then_some(ByteRange { start, end: None })
            })?;
        if let Some(commit) = response
            .meta
            .commit
            .as_deref()
            .filter(|c| *c != self.commit)
        {
            tracing::warn!(
                path = file.path,
                commit,
                expected = self.commit,
                "the Hub served another commit"
            );
        }
        let etag = match file.etag().or(response.meta.etag.as_deref()) {
            Some(etag) if is_safe_blob_name(etag) => etag.to_string(),
            other => {
                return Err(HubError::BadResponse {
                    url: format!("{}/{}", self.repo, file.path),
                    reason: format!("no usable ETag for {} (got {other:?})", file.path),
                })
            }
        };
        let expected = file.size.or(response.meta.size);
        if file.etag().is_none() {
            // The blob name is known only now: it may be cached under it already.
            let known = RepoFile {
                size: expected,
                ..file.clone()
            };
            if let Some(link) = self.cached(&known, Some(&etag))? {
                return Ok(link);
            }
        }
        let sha256 = file
            .sha256
            .clone()
            .or_else(|| is_sha256(&etag).then(|| etag.clone()));
        let check = Check {
            path: &file.path,
            size: expected,
            sha256: sha256.as_deref(),
        };
        self.receive(&etag, &check, response, progress)?;
        self.cache.link(self.commit, &file.path, &etag)
    }

    /// Whether the file is complete in the cache (nothing to download).
    pub fn is_cached(&self, file: &RepoFile) -> bool {
        match file.etag() {
            Some(etag) => {
                is_safe_blob_name(etag) && blob_complete(&self.cache.blob(etag), file.size)
            }
            None => blob_complete(
                &self.cache.snapshot_dir(self.commit).join(&file.path),
                file.size,
            ),
        }
    }

    /// The snapshot link, (re)made, when the blob is already complete in the cache.
    fn cached(&self, file: &RepoFile, etag: Option<&str>) -> Result<Option<PathBuf>> {
        let Some(etag) = etag else {
            // No blob name yet: trust an existing snapshot file of the right size.
            let link = self.cache.snapshot_dir(self.commit).join(&file.path);
            return Ok(blob_complete(&link, file.size).then_some(link));
        };
        if !is_safe_blob_name(etag) {
            return Ok(None);
        }
        if !blob_complete(&self.cache.blob(etag), file.size) {
            return Ok(None);
        }
        self.cache.link(self.commit, &file.path, etag).map(Some)
    }

    /// Streams the body into `blobs/<etag>.incomplete`, verifies it and renames it.
    fn receive(
        &self,
        etag: &str,
        check: &Check<'_>,
        response: FileResponse,
        progress: &ProgressBar,
    ) -> Result<()> {
        let partial = self.cache.incomplete(etag);
        let blobs = partial.parent().expect("blobs dir");
        fs::create_dir_all(blobs).map_err(io("create", blobs))?;
        let mut out = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&partial)
            .map_err(io("create", &partial))?;
        let have = out.metadata().map_err(io("read", &partial))?.len();
        let offset = response.offset;
        if offset > have {
            return Err(HubError::BadResponse {
                url: check.path.to_string(),
                reason: format!("the server resumed at byte {offset} but only {have} are on disk"),
            });
        }
        out.set_len(offset).map_err(io("truncate", &partial))?;
        let mut hasher = check.sha256.map(|_| Sha256::new());
        if let Some(hasher) = hasher.as_mut() {
            hash_prefix(&mut out, offset, hasher).map_err(io("read", &partial))?;
        }
        out.seek(SeekFrom::End(0)).map_err(io("seek", &partial))?;
        if offset > 0 {
            tracing::info!(path = check.path, offset, "resuming download");
        }
        progress.set_message(check.path.to_string());
        if offset > 0 {
            // Bytes from an earlier run count as done, but not towards the speed.
            progress.inc(offset);
            progress.reset_eta();
        }

        let mut body = response.body;
        let mut received = offset;
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = match body.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    let _ = out.flush();
                    return Err(HubError::Interrupted {
                        reason: e.to_string(),
                        path: check.path.to_string(),
                        received,
                        expected: check.size.unwrap_or(received),
                    });
                }
            };
            out.write_all(&buf[..n]).map_err(io("write", &partial))?;
            if let Some(hasher) = hasher.as_mut() {
                hasher.update(&buf[..n]);
            }
            received += n as u64;
            progress.inc(n as u64);
            if check.size.is_some_and(|size| received > size) {
                break;
            }
        }
        match check.size {
            Some(size) if received < size => {
                let _ = out.flush();
                return Err(HubError::Interrupted {
                    reason: "the connection closed early".to_string(),
                    path: check.path.to_string(),
                    received,
                    expected: size,
                });
            }
            Some(size) if received > size => {
                return Err(discard(
                    out,
                    &partial,
                    check.path,
                    format!("more than the {size} bytes the Hub lists"),
                ))
            }
            _ => {}
        }
        if let (Some(hasher), Some(expected)) = (hasher, check.sha256) {
            let actual = hex(&hasher.finalize());
            if !actual.eq_ignore_ascii_case(expected) {
                return Err(discard(
                    out,
                    &partial,
                    check.path,
                    format!("its sha256 is {actual} but the Hub lists {expected}"),
                ));
            }
        }
        out.sync_all().map_err(io("write", &partial))?;
        drop(out);
        let blob = self.cache.blob(etag);
        fs::rename(&partial, &blob).map_err(io("rename", &partial))?;
        tracing::debug!(path = check.path, blob = %blob.display(), "downloaded");
        Ok(())
    }
}

/// What a downloaded file must match.
struct Check<'a> {
    path: &'a str,
    size: Option<u64>,
    sha256: Option<&'a str>,
}

/// Removes a bad partial file and says so.
fn discard(out: File, partial: &Path, path: &str, what: String) -> HubError {
    drop(out);
    let _ = fs::remove_file(partial);
    HubError::Corrupt {
        path: path.to_string(),
        what,
    }
}

fn hash_prefix(file: &mut File, len: u64, hasher: &mut Sha256) -> io::Result<()> {
    file.seek(SeekFrom::Start(0))?;
    let mut reader = file.take(len);
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = reader.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        hasher.update(&buf[..n]);
    }
}

/// A whole file (symlinks followed) of the expected size.
fn blob_complete(path: &Path, size: Option<u64>) -> bool {
    fs::metadata(path).is_ok_and(|m| m.is_file() && size.is_none_or(|s| s == m.len()))
}

fn partial_len(path: &Path) -> u64 {
    fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

pub(crate) fn is_sha256(etag: &str) -> bool {
    etag.len() == 64 && etag.bytes().all(|b| b.is_ascii_hexdigit())
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blob_names_are_hashes() {
        assert!(is_sha256(&"0f".repeat(32)));
        assert!(!is_sha256(&"0f".repeat(20)));
    }

    #[test]
    fn sha256_hex_matches_known_digest() {
        let digest = Sha256::digest(b"abc");
        assert_eq!(
            hex(&digest),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
