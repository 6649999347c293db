//! A test double of the Hugging Face Hub's HTTP API, for tests only (compiled with the
//! `fake-hub` feature; never part of a release build).
//!
//! [`FakeHub`] is a tiny HTTP/1.1 server on loopback (one thread per connection,
//! `Connection: close`) that answers the model info API (`/api/models/OWNER/REPO/revision/REV`)
//! and `resolve/` URLs the way the Hub does, redirects LFS files to a second listener playing
//! the CDN, honours `Range`, checks bearer tokens of private repositories, logs every
//! request ([`FakeHub::requests`]), and can cut a connection short ([`FakeHub::cut_once`]) or
//! serve corrupt bytes ([`FakeHub::corrupt`]) on demand. [`Silent`] is a listener that never
//! answers; [`TempDir`] a directory removed on drop; [`noise`] deterministic filler bytes.
//!
//! Point a program at it with `HF_ENDPOINT` = [`FakeHub::url`] (or
//! [`HubConfig::endpoint`](crate::HubConfig::endpoint)):
//!
//! ```
//! use splash_hub::fake_hub::{FakeFile, FakeHub};
//!
//! let hub = FakeHub::start();
//! hub.push(
//!     "acme/tiny",
//!     "main",
//!     "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
//!     vec![
//!         FakeFile::git("config.json", r#"{"model_type": "qwen3_5"}"#),
//!         FakeFile::lfs("model.safetensors", vec![0u8; 1024]),
//!     ],
//! );
//! // HF_ENDPOINT=<hub.url> now serves acme/tiny at `main`.
//! assert!(hub.url.starts_with("http://127.0.0.1:"));
//! ```

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use sha2::{Digest, Sha256};

/// One file of a fixture repository.
#[derive(Clone)]
pub struct FakeFile {
    pub path: String,
    pub bytes: Arc<Vec<u8>>,
    /// Stored in LFS: listed with `lfs.sha256`, served by a redirect to the CDN.
    pub lfs: bool,
}

impl FakeFile {
    pub fn git(path: &str, bytes: impl Into<Vec<u8>>) -> FakeFile {
        FakeFile {
            path: path.to_string(),
            bytes: Arc::new(bytes.into()),
            lfs: false,
        }
    }

    pub fn lfs(path: &str, bytes: impl Into<Vec<u8>>) -> FakeFile {
        FakeFile {
            lfs: true,
            ..FakeFile::git(path, bytes)
        }
    }

    pub fn sha256(&self) -> String {
        sha256_hex(&self.bytes)
    }

    /// What the Hub sends as ETag and the cache names the blob: the sha256 for LFS files,
    /// a git-blob-id-like 40-hex string otherwise.
    pub fn etag(&self) -> String {
        if self.lfs {
            self.sha256()
        } else {
            sha256_hex(&[b"blob ".as_slice(), &self.bytes].concat())[..40].to_string()
        }
    }
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Deterministic pseudo-random bytes (xorshift64*).
pub fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 56) as u8
        })
        .collect()
}

/// One request as the server saw it.
#[derive(Clone, Debug)]
pub struct Logged {
    /// `"hub"` or `"cdn"`.
    pub server: &'static str,
    /// Path and query, as sent.
    pub target: String,
    pub range: Option<String>,
    pub authorization: Option<String>,
}

#[derive(Default)]
struct FakeRepo {
    token: Option<String>,
    refs: HashMap<String, String>,
    commits: HashMap<String, Vec<FakeFile>>,
}

#[derive(Default)]
struct State {
    repos: HashMap<String, FakeRepo>,
    log: Vec<Logged>,
    /// Repository path → bytes after which the next CDN answer for it is cut.
    cut_once: HashMap<String, usize>,
    /// Repository paths the CDN serves with flipped bytes.
    corrupt: HashSet<String>,
    /// Old repository name → new one (answered with a relative 307).
    renamed: HashMap<String, String>,
}

/// A running fake Hub; shut down on drop.
pub struct FakeHub {
    pub url: String,
    pub cdn_url: String,
    state: Arc<Mutex<State>>,
    servers: Vec<Server>,
}

impl FakeHub {
    pub fn start() -> FakeHub {
        let state = Arc::new(Mutex::new(State::default()));
        let cdn = Server::start("cdn", state.clone(), None);
        let cdn_url = format!("http://{}", cdn.addr);
        let hub = Server::start("hub", state.clone(), Some(cdn_url.clone()));
        FakeHub {
            url: format!("http://{}", hub.addr),
            cdn_url,
            state,
            servers: vec![hub, cdn],
        }
    }

    /// Adds a commit to `repo` and points `reference` (a branch or tag) at it.
    pub fn push(&self, repo: &str, reference: &str, commit: &str, files: Vec<FakeFile>) {
        let mut state = self.state.lock().unwrap();
        let r = state.repos.entry(repo.to_string()).or_default();
        r.commits.insert(commit.to_string(), files);
        r.refs.insert(reference.to_string(), commit.to_string());
    }

    /// Makes `repo` private: only `Authorization: Bearer <token>` may read it.
    pub fn set_private(&self, repo: &str, token: &str) {
        let mut state = self.state.lock().unwrap();
        state.repos.get_mut(repo).unwrap().token = Some(token.to_string());
    }

    /// Requests for `old` get a relative 307 redirect to the same URL under `new`.
    pub fn rename(&self, old: &str, new: &str) {
        let mut state = self.state.lock().unwrap();
        state.renamed.insert(old.to_string(), new.to_string());
    }

    /// The next CDN answer for `path` sends `after` bytes and closes the connection.
    pub fn cut_once(&self, path: &str, after: usize) {
        self.state
            .lock()
            .unwrap()
            .cut_once
            .insert(path.to_string(), after);
    }

    /// The CDN serves `path` with wrong bytes (same length).
    pub fn corrupt(&self, path: &str) {
        self.state.lock().unwrap().corrupt.insert(path.to_string());
    }

    pub fn requests(&self) -> Vec<Logged> {
        self.state.lock().unwrap().log.clone()
    }

    pub fn clear_log(&self) {
        self.state.lock().unwrap().log.clear();
    }

    /// CDN requests whose path ends with `path`.
    pub fn cdn_requests_for(&self, path: &str) -> Vec<Logged> {
        self.requests()
            .into_iter()
            .filter(|r| r.server == "cdn" && r.target.ends_with(&format!("/{path}")))
            .collect()
    }

    /// Stops both listeners: connections are refused from now on.
    pub fn shutdown(&mut self) {
        self.servers.clear();
    }
}

struct Server {
    addr: std::net::SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    fn start(name: &'static str, state: Arc<Mutex<State>>, cdn_url: Option<String>) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stop2.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                let state = state.clone();
                let cdn_url = cdn_url.clone();
                std::thread::spawn(move || {
                    let _ = handle(name, stream, &state, cdn_url.as_deref());
                });
            }
        });
        Server {
            addr,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr); // wake the accept loop
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Request {
    target: String,
    headers: HashMap<String, String>,
}

struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// Close the connection after this many body bytes.
    cut_after: Option<usize>,
}

impl Response {
    fn new(status: u16) -> Response {
        Response {
            status,
            headers: Vec::new(),
            body: Vec::new(),
            cut_after: None,
        }
    }

    fn header(mut self, name: &str, value: impl Into<String>) -> Response {
        self.headers.push((name.to_string(), value.into()));
        self
    }

    fn error(status: u16, code: &str) -> Response {
        Response::new(status)
            .header("X-Error-Code", code)
            .header("X-Error-Message", code)
    }
}

fn handle(
    server: &'static str,
    stream: TcpStream,
    state: &Mutex<State>,
    cdn_url: Option<&str>,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let (Some(_method), Some(target)) = (parts.next(), parts.next()) else {
        return Ok(());
    };
    let mut headers = HashMap::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let request = Request {
        target: target.to_string(),
        headers,
    };
    let response = {
        let mut state = state.lock().unwrap();
        state.log.push(Logged {
            server,
            target: request.target.clone(),
            range: request.headers.get("range").cloned(),
            authorization: request.headers.get("authorization").cloned(),
        });
        match cdn_url {
            Some(cdn) => hub_route(&mut state, &request, cdn),
            None => cdn_route(&mut state, &request),
        }
    };
    write_response(stream, response)
}

fn write_response(mut stream: TcpStream, response: Response) -> std::io::Result<()> {
    let mut head = format!("HTTP/1.1 {} X\r\n", response.status);
    for (k, v) in &response.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n",
        response.body.len()
    ));
    stream.write_all(head.as_bytes())?;
    let n = response.cut_after.unwrap_or(response.body.len());
    stream.write_all(&response.body[..n.min(response.body.len())])?;
    stream.flush()?;
    stream.shutdown(Shutdown::Both)
}

fn hub_route(state: &mut State, request: &Request, cdn: &str) -> Response {
    let (path, query) = request
        .target
        .split_once('?')
        .unwrap_or((&request.target, ""));
    let path = percent_decode(path);
    for (old, new) in &state.renamed {
        for prefix in ["/api/models/", "/"] {
            if let Some(rest) = path.strip_prefix(&format!("{prefix}{old}/")) {
                let query = if query.is_empty() {
                    String::new()
                } else {
                    format!("?{query}")
                };
                return Response::new(307)
                    .header("Location", format!("{prefix}{new}/{rest}{query}"));
            }
        }
    }
    if let Some(rest) = path.strip_prefix("/api/models/") {
        let Some((repo, revision)) = rest.split_once("/revision/") else {
            return Response::new(404);
        };
        let (commit, files) = match lookup(state, repo, revision, request) {
            Ok(found) => found,
            Err(response) => return response,
        };
        let blobs = query.split('&').any(|q| q == "blobs=true");
        let siblings: Vec<serde_json::Value> = files
            .iter()
            .map(|f| {
                if !blobs {
                    return serde_json::json!({ "rfilename": f.path });
                }
                let mut s = serde_json::json!({
                    "rfilename": f.path,
                    "size": f.bytes.len(),
                    "blobId": f.etag()[..40].to_string(),
                });
                if f.lfs {
                    s["lfs"] = serde_json::json!({
                        "sha256": f.sha256(),
                        "size": f.bytes.len(),
                        "pointerSize": 134,
                    });
                }
                s
            })
            .collect();
        let body = serde_json::json!({
            "id": repo,
            "modelId": repo,
            "sha": commit,
            "private": false,
            "siblings": siblings,
        });
        let mut response = Response::new(200).header("Content-Type", "application/json");
        response.body = serde_json::to_vec(&body).unwrap();
        return response;
    }
    // /{owner}/{name}/resolve/{revision}/{path}
    let parts: Vec<&str> = path.trim_start_matches('/').splitn(5, '/').collect();
    let [owner, name, "resolve", revision, file_path] = parts[..] else {
        return Response::new(404);
    };
    let repo = format!("{owner}/{name}");
    let (commit, files) = match lookup(state, &repo, revision, request) {
        Ok(found) => found,
        Err(response) => return response,
    };
    let Some(file) = files.iter().find(|f| f.path == file_path) else {
        return Response::error(404, "EntryNotFound");
    };
    if file.lfs {
        Response::new(302)
            .header(
                "Location",
                format!("{cdn}/cdn/{}/{}", file.sha256(), file.path),
            )
            .header("X-Repo-Commit", commit.as_str())
            .header("X-Linked-Etag", format!("\"{}\"", file.sha256()))
            .header("X-Linked-Size", file.bytes.len().to_string())
            .header("ETag", format!("W/\"{}\"", &file.etag()[..40]))
    } else {
        ranged(&file.bytes, request)
            .header("X-Repo-Commit", commit.as_str())
            .header("ETag", format!("\"{}\"", file.etag()))
    }
}

/// The commit and files of `repo` at `revision` (a ref or a commit), after the token check.
fn lookup(
    state: &State,
    repo: &str,
    revision: &str,
    request: &Request,
) -> Result<(String, Vec<FakeFile>), Response> {
    let Some(r) = state.repos.get(repo) else {
        return Err(Response::error(404, "RepoNotFound"));
    };
    if let Some(token) = &r.token {
        let expected = format!("Bearer {token}");
        if request.headers.get("authorization") != Some(&expected) {
            return Err(Response::error(401, "RepoNotFound"));
        }
    }
    let commit = r
        .refs
        .get(revision)
        .cloned()
        .unwrap_or(revision.to_string());
    match r.commits.get(&commit) {
        Some(files) => Ok((commit, files.clone())),
        None => Err(Response::error(404, "RevisionNotFound")),
    }
}

fn cdn_route(state: &mut State, request: &Request) -> Response {
    // /cdn/{sha256}/{path}
    let Some(rest) = request.target.strip_prefix("/cdn/") else {
        return Response::new(404);
    };
    let Some((sha, path)) = rest.split_once('/') else {
        return Response::new(404);
    };
    let blob = state
        .repos
        .values()
        .flat_map(|r| r.commits.values().flatten())
        .find(|f| f.sha256() == sha)
        .map(|f| f.bytes.clone());
    let Some(mut bytes) = blob else {
        return Response::new(404);
    };
    if state.corrupt.contains(path) {
        let mut bad = bytes.to_vec();
        for b in bad.iter_mut().step_by(997) {
            *b ^= 0xff;
        }
        bytes = Arc::new(bad);
    }
    let mut response = ranged(&bytes, request).header("ETag", format!("\"{sha}\""));
    response.cut_after = state.cut_once.remove(path);
    response
}

/// 200 with the whole body, or 206 / 416 for a `Range: bytes=S-[E]` request.
fn ranged(bytes: &[u8], request: &Request) -> Response {
    let len = bytes.len();
    let Some(spec) = request
        .headers
        .get("range")
        .and_then(|r| r.strip_prefix("bytes="))
    else {
        let mut response = Response::new(200);
        response.body = bytes.to_vec();
        return response;
    };
    let (start, end) = spec.split_once('-').unwrap();
    let start: usize = start.parse().unwrap();
    let end: usize = end.parse().map_or(len - 1, |e: usize| e.min(len - 1));
    if start >= len {
        return Response::new(416).header("Content-Range", format!("bytes */{len}"));
    }
    let mut response =
        Response::new(206).header("Content-Range", format!("bytes {start}-{end}/{len}"));
    response.body = bytes[start..=end].to_vec();
    response
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8(out).unwrap()
}

/// A listener that accepts connections and never answers (an unresponsive network).
pub struct Silent {
    pub url: String,
    _server: Server,
}

impl Silent {
    pub fn start() -> Silent {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut held = Vec::new();
            for stream in listener.incoming() {
                if stop2.load(Ordering::SeqCst) {
                    break;
                }
                held.extend(stream.ok());
            }
        });
        Silent {
            url: format!("http://{addr}"),
            _server: Server {
                addr,
                stop,
                thread: Some(thread),
            },
        }
    }
}

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new() -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let dir = std::env::temp_dir().join(format!("splash-hub-test-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Default for TempDir {
    fn default() -> TempDir {
        TempDir::new()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
