//! The Hub's HTTP API: the model info listing and `resolve/` file downloads, with the
//! Hub's headers, manual redirects (the token stays on the Hub's own host) and status codes
//! turned into [`HubError`]s.

use std::io::Read;
use std::time::Duration;

use serde::Deserialize;

use crate::config::HubConfig;
use crate::error::{HubError, Result};

/// One file of the repository listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoFile {
    /// Path in the repository, `/`-separated.
    pub path: String,
    /// Size in bytes, when the listing gave it.
    pub size: Option<u64>,
    /// The sha256 of an LFS file (its blob name in the cache).
    pub sha256: Option<String>,
    /// The git blob id of a regular file (its blob name in the cache).
    pub blob_id: Option<String>,
}

impl RepoFile {
    /// The blob name in the cache, when the listing tells it: the LFS sha256, else the git
    /// blob id (what the Hub sends as the file's ETag).
    pub fn etag(&self) -> Option<&str> {
        self.sha256.as_deref().or(self.blob_id.as_deref())
    }
}

/// What `GET /api/models/{repo}/revision/{revision}?blobs=true` says.
#[derive(Debug, Clone)]
pub(crate) struct ModelInfo {
    pub commit: String,
    pub files: Vec<RepoFile>,
}

#[derive(Deserialize)]
struct RawInfo {
    sha: Option<String>,
    #[serde(default)]
    siblings: Vec<RawSibling>,
}

#[derive(Deserialize)]
struct RawSibling {
    rfilename: String,
    size: Option<u64>,
    #[serde(rename = "blobId")]
    blob_id: Option<String>,
    lfs: Option<RawLfs>,
}

#[derive(Deserialize)]
struct RawLfs {
    sha256: String,
    size: Option<u64>,
}

/// What the first response of a `resolve/` request says about the file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FileMeta {
    /// `X-Repo-Commit`.
    pub commit: Option<String>,
    /// `X-Linked-Etag` or `ETag`, without quotes and `W/`.
    pub etag: Option<String>,
    /// `X-Linked-Size`, else the full length from `Content-Length` / `Content-Range`.
    pub size: Option<u64>,
}

/// A byte range: `bytes=start-` or `bytes=start-end` (end inclusive).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ByteRange {
    pub start: u64,
    pub end: Option<u64>,
}

/// A file body being received.
pub(crate) struct FileResponse {
    pub meta: FileMeta,
    /// Offset in the file of the body's first byte (non-zero only for a 206).
    pub offset: u64,
    pub body: Box<dyn Read + Send>,
}

/// The final response of a redirect chain.
struct Followed {
    response: ureq::http::Response<ureq::Body>,
    /// The URL that gave it.
    url: String,
    /// File metadata from the redirect responses, if there were any.
    meta: Option<FileMeta>,
    /// The range sent with the final request.
    range: Option<ByteRange>,
}

/// A blocking HTTP client bound to one endpoint and token.
pub(crate) struct Client {
    agent: ureq::Agent,
    endpoint: String,
    token: Option<String>,
    check_timeout: Duration,
}

const MAX_REDIRECTS: usize = 5;

impl Client {
    pub fn new(config: &HubConfig) -> Client {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .max_redirects(0)
            .http_status_as_error(false)
            .user_agent(concat!("splash-hub/", env!("CARGO_PKG_VERSION")))
            .timeout_connect(Some(Duration::from_secs(10)))
            .timeout_recv_response(Some(Duration::from_secs(30)))
            .timeout_per_read(Some(config.read_timeout))
            .build()
            .into();
        Client {
            agent,
            endpoint: config.endpoint.clone(),
            token: config.token.clone(),
            check_timeout: config.check_timeout,
        }
    }

    /// Lists the repository at a revision (with sizes and LFS hashes), within the startup
    /// check timeout.
    pub fn model_info(&self, repo: &str, revision: &str) -> Result<ModelInfo> {
        let url = format!(
            "{}/api/models/{repo}/revision/{}?blobs=true",
            self.endpoint,
            encode(revision, false)
        );
        let Followed { response, url, .. } =
            self.follow(url, None, Some(self.check_timeout), |_| None)?;
        let status = response.status().as_u16();
        if status != 200 {
            return Err(status_error(
                self.target(&url, repo, revision, None),
                &response,
            ));
        }
        let bad = |reason: String| HubError::BadResponse {
            url: url.clone(),
            reason,
        };
        let body = response
            .into_body()
            .with_config()
            .limit(256 << 20)
            .read_to_vec()
            .map_err(|e| network(&url, e))?;
        let raw: RawInfo = serde_json::from_slice(&body)
            .map_err(|e| bad(format!("the model info is not the expected JSON ({e})")))?;
        let commit = raw
            .sha
            .ok_or_else(|| bad("the model info has no \"sha\"".to_string()))?;
        let mut files = Vec::with_capacity(raw.siblings.len());
        for s in raw.siblings {
            if !is_safe_repo_path(&s.rfilename) {
                tracing::warn!(
                    path = s.rfilename,
                    "skipping a listed file with an unsafe path"
                );
                continue;
            }
            let safe = |name: String| is_safe_blob_name(&name).then_some(name);
            files.push(RepoFile {
                path: s.rfilename,
                size: s.size.or(s.lfs.as_ref().and_then(|l| l.size)),
                sha256: s.lfs.and_then(|l| safe(l.sha256.to_ascii_lowercase())),
                blob_id: s.blob_id.and_then(safe),
            });
        }
        Ok(ModelInfo { commit, files })
    }

    /// `GET {endpoint}/{repo}/resolve/{revision}/{path}`, following redirects by hand.
    /// `first` is the range sent on the first request; `after_meta` picks the range for the
    /// redirected request once the Hub's headers (ETag, size) are known.
    pub fn get_file(
        &self,
        repo: &str,
        revision: &str,
        path: &str,
        first: Option<ByteRange>,
        after_meta: impl Fn(&FileMeta) -> Option<ByteRange>,
    ) -> Result<FileResponse> {
        let url = format!(
            "{}/{repo}/resolve/{}/{}",
            self.endpoint,
            encode(revision, false),
            encode(path, true)
        );
        let Followed {
            response,
            url,
            meta,
            range,
        } = self.follow(url, first, None, after_meta)?;
        let status = response.status().as_u16();
        let mut meta = meta.unwrap_or_else(|| FileMeta::from_headers(&response));
        let content_range = header(&response, "content-range");
        let (offset, total) = match (status, content_range.as_deref().map(parse_content_range)) {
            (200, _) => (
                0,
                header(&response, "content-length").and_then(|v| v.parse().ok()),
            ),
            (206, Some(Some((start, total)))) => (start, total),
            (416, Some(Some((_, total)))) if range.is_some() => {
                // The requested start is at or past the end: nothing more to receive.
                let start = range.map_or(0, |r| r.start);
                meta.size = meta.size.or(total);
                return Ok(FileResponse {
                    meta,
                    offset: start,
                    body: Box::new(std::io::empty()),
                });
            }
            (206, _) => {
                return Err(HubError::BadResponse {
                    url,
                    reason: "HTTP 206 without a valid Content-Range".to_string(),
                })
            }
            _ => {
                let target = self.target(&url, repo, revision, Some(path));
                return Err(status_error(target, &response));
            }
        };
        meta.size = meta.size.or(total);
        Ok(FileResponse {
            meta,
            offset,
            body: Box::new(response.into_body().into_reader()),
        })
    }

    /// GETs `url`, following up to [`MAX_REDIRECTS`] redirects. The file metadata is taken
    /// from the redirect responses (the Hub's own); before each redirected request
    /// `after_meta` picks its range from what is known so far.
    fn follow(
        &self,
        mut url: String,
        first: Option<ByteRange>,
        timeout: Option<Duration>,
        after_meta: impl Fn(&FileMeta) -> Option<ByteRange>,
    ) -> Result<Followed> {
        let mut response = self.get(&url, first, timeout)?;
        let mut meta: Option<FileMeta> = None;
        let mut range = first;
        for _ in 0..MAX_REDIRECTS {
            if !response.status().is_redirection() {
                break;
            }
            let hop = FileMeta::from_headers(&response);
            if meta
                .as_ref()
                .is_none_or(|m| m.etag.is_none() && hop.etag.is_some())
            {
                meta = Some(hop);
            }
            range = after_meta(meta.as_ref().unwrap());
            let location = header(&response, "location").ok_or_else(|| HubError::BadResponse {
                url: url.clone(),
                reason: format!("HTTP {} without a Location header", response.status()),
            })?;
            url = join_url(&url, &location);
            response = self.get(&url, range, timeout)?;
        }
        if response.status().is_redirection() {
            return Err(HubError::BadResponse {
                url,
                reason: format!("more than {MAX_REDIRECTS} redirects"),
            });
        }
        Ok(Followed {
            response,
            url,
            meta,
            range,
        })
    }

    fn get(
        &self,
        url: &str,
        range: Option<ByteRange>,
        timeout: Option<Duration>,
    ) -> Result<ureq::http::Response<ureq::Body>> {
        let mut request = self.agent.get(url);
        if let Some(token) = &self.token {
            // The token goes to the Hub only, never to a CDN it redirects to.
            if origin(url) == origin(&self.endpoint) {
                request = request.header("Authorization", format!("Bearer {token}"));
            }
        }
        if let Some(range) = range {
            let end = range.end.map(|e| e.to_string()).unwrap_or_default();
            request = request.header("Range", format!("bytes={}-{end}", range.start));
        }
        let request = match timeout {
            Some(t) => request.config().timeout_global(Some(t)).build(),
            None => request,
        };
        request.call().map_err(|e| network(url, e))
    }

    fn target<'a>(
        &self,
        url: &'a str,
        repo: &'a str,
        revision: &'a str,
        path: Option<&'a str>,
    ) -> Target<'a> {
        Target {
            url,
            repo,
            revision,
            path,
            has_token: self.token.is_some(),
            on_hub: origin(url) == origin(&self.endpoint),
        }
    }
}

impl FileMeta {
    fn from_headers(response: &ureq::http::Response<ureq::Body>) -> FileMeta {
        let etag = header(response, "x-linked-etag").or_else(|| header(response, "etag"));
        let redirect = response.status().is_redirection();
        let size = header(response, "x-linked-size")
            .or_else(|| {
                (!redirect && response.status().as_u16() == 200)
                    .then(|| header(response, "content-length"))
                    .flatten()
            })
            .and_then(|v| v.parse().ok());
        FileMeta {
            commit: header(response, "x-repo-commit"),
            etag: etag.map(|e| normalize_etag(&e)),
            size,
        }
    }
}

fn header(response: &ureq::http::Response<ureq::Body>, name: &str) -> Option<String> {
    response
        .headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().to_string())
}

fn network(url: &str, error: ureq::Error) -> HubError {
    HubError::Network {
        url: url.to_string(),
        source: Box::new(error),
    }
}

/// Where a failed request was aimed, for [`status_error`].
struct Target<'a> {
    url: &'a str,
    repo: &'a str,
    revision: &'a str,
    path: Option<&'a str>,
    has_token: bool,
    on_hub: bool,
}

/// An HTTP error status as the error the user can act on, using the Hub's `X-Error-Code`.
fn status_error(target: Target<'_>, response: &ureq::http::Response<ureq::Body>) -> HubError {
    let Target {
        url,
        repo,
        revision,
        path,
        has_token,
        on_hub,
    } = target;
    if !on_hub {
        // A CDN's answer: its codes say nothing about the repository.
        return HubError::Http {
            url: url.to_string(),
            status: response.status().as_u16(),
            message: String::new(),
        };
    }
    let status = response.status().as_u16();
    let code = header(response, "x-error-code").unwrap_or_default();
    let repo = repo.to_string();
    let revision = revision.to_string();
    match (status, code.as_str(), path) {
        (_, "RevisionNotFound", _) => HubError::RevisionNotFound { repo, revision },
        (_, "EntryNotFound", Some(path)) | (404, "", Some(path)) => HubError::FileNotFound {
            repo,
            revision,
            path: path.to_string(),
        },
        (401 | 403, _, _) => HubError::Unauthorized {
            repo,
            status,
            has_token,
        },
        (404, _, _) => HubError::RepoNotFound { repo, revision },
        _ => HubError::Http {
            url: url.to_string(),
            status,
            message: header(response, "x-error-message").unwrap_or_default(),
        },
    }
}

impl HubError {
    /// Whether the Hub could not be reached (or failed on its side), so the cache may
    /// stand in for it.
    pub(crate) fn is_unreachable(&self) -> bool {
        match self {
            HubError::Network { .. } => true,
            HubError::Http { status, .. } => *status >= 500,
            _ => false,
        }
    }
}

/// A relative `/`-separated path that stays inside the snapshot directory.
fn is_safe_repo_path(path: &str) -> bool {
    !path.is_empty()
        && !path.starts_with('/')
        && !path.contains('\\')
        && path
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..")
}

/// Server-provided ETags become file names: allow only what a hash can contain.
pub(crate) fn is_safe_blob_name(etag: &str) -> bool {
    !etag.is_empty()
        && etag.len() <= 128
        && etag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_'))
}

/// `ETag` / `X-Linked-Etag` values come quoted and sometimes weak: `W/"abc"` → `abc`.
pub(crate) fn normalize_etag(etag: &str) -> String {
    let etag = etag.trim();
    let etag = etag.strip_prefix("W/").unwrap_or(etag);
    etag.trim_matches('"').to_string()
}

/// `bytes 10-99/100` → `(10, Some(100))`; `bytes */100` → `(0, Some(100))`.
fn parse_content_range(value: &str) -> Option<(u64, Option<u64>)> {
    let rest = value.trim().strip_prefix("bytes")?.trim();
    let (span, total) = rest.split_once('/')?;
    let total = total.trim().parse().ok();
    if span.trim() == "*" {
        return Some((0, total));
    }
    let (start, _end) = span.split_once('-')?;
    Some((start.trim().parse().ok()?, total))
}

/// `scheme://host[:port]` of a URL.
fn origin(url: &str) -> &str {
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    let end = url[after_scheme..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |i| after_scheme + i);
    &url[..end]
}

/// A redirect's `Location` made absolute against the URL that answered it.
fn join_url(base: &str, location: &str) -> String {
    if location.starts_with("http://") || location.starts_with("https://") {
        location.to_string()
    } else if let Some(rest) = location.strip_prefix("//") {
        let scheme = base.split("://").next().unwrap_or("https");
        format!("{scheme}://{rest}")
    } else if location.starts_with('/') {
        format!("{}{location}", origin(base))
    } else {
        let path_end = base.find(['?', '#']).unwrap_or(base.len());
        let dir_end = base[..path_end].rfind('/').map_or(path_end, |i| i + 1);
        format!("{}{location}", &base[..dir_end.max(origin(base).len())])
    }
}

/// Percent-encodes all but unreserved characters (and `/` when `keep_slash`), as
/// `huggingface_hub` quotes revisions (`refs/pr/1` → `refs%2Fpr%2F1`) and paths.
fn encode(s: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric()
            || matches!(b, b'-' | b'.' | b'_' | b'~')
            || (keep_slash && b == b'/')
        {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etags_lose_quotes_and_weakness() {
        assert_eq!(normalize_etag("\"abc\""), "abc");
        assert_eq!(normalize_etag("W/\"abc\""), "abc");
        assert_eq!(normalize_etag("abc"), "abc");
    }

    #[test]
    fn content_ranges_parse() {
        assert_eq!(
            parse_content_range("bytes 10-99/100"),
            Some((10, Some(100)))
        );
        assert_eq!(parse_content_range("bytes 0-9/*"), Some((0, None)));
        assert_eq!(parse_content_range("bytes */100"), Some((0, Some(100))));
        assert_eq!(parse_content_range("items 1-2/3"), None);
    }

    #[test]
    fn redirects_resolve_against_the_request() {
        let base = "https://huggingface.co/o/r/resolve/main/a/b.gguf?x=1";
        assert_eq!(origin(base), "https://huggingface.co");
        assert_eq!(origin("http://127.0.0.1:8080"), "http://127.0.0.1:8080");
        assert_eq!(
            join_url(base, "https://cdn.example/x"),
            "https://cdn.example/x"
        );
        assert_eq!(join_url(base, "//cdn.example/x"), "https://cdn.example/x");
        assert_eq!(join_url(base, "/api/x"), "https://huggingface.co/api/x");
        assert_eq!(
            join_url(base, "c.gguf"),
            "https://huggingface.co/o/r/resolve/main/a/c.gguf"
        );
    }

    #[test]
    fn unsafe_names_are_refused() {
        assert!(is_safe_repo_path("Q8_0/a.gguf"));
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../../x",
            "a//b",
            "a\\b",
            "./a",
        ] {
            assert!(!is_safe_repo_path(bad), "{bad}");
        }
        assert!(is_safe_blob_name(&"ab12".repeat(16)));
        assert!(!is_safe_blob_name("../etc/passwd"));
        assert!(!is_safe_blob_name("a/b"));
        assert!(!is_safe_blob_name(""));
    }

    #[test]
    fn revisions_and_paths_are_quoted() {
        assert_eq!(encode("refs/pr/1", false), "refs%2Fpr%2F1");
        assert_eq!(encode("Q8_0/a b.gguf", true), "Q8_0/a%20b.gguf");
    }
}
