//! The `splash` binary against a fake Hugging Face Hub on loopback
//! (`splash_hub::fake_hub`): `--model OWNER/REPO[:VARIANT]` downloads into a private
//! `HF_HOME`, `serve` answers from it, works again with the Hub gone, `pull` and `list`, and
//! unsupported or private models are refused with a reason before any weights move.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use splash_hub::fake_hub::{noise, FakeFile, FakeHub, Logged, TempDir};

mod common;
use common::{fixture, gguf};

const MLX_REPO: &str = "mlx-community/Qwen35-Tiny-4bit";
const GGUF_REPO: &str = "unsloth/Qwen35-Tiny-GGUF";
const COMMIT: &str = "5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed";

/// The longest any step may take before the test gives up (they take well under a second
/// each; this only bounds a hang).
const TIMEOUT: Duration = Duration::from_secs(60);

/// What "refused quickly" means: no download and no 5 s revision-check timeout.
const QUICK: Duration = Duration::from_secs(10);

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Every file of a fixture directory: `*.safetensors` in LFS, the rest as git files.
fn fixture_files(name: &str) -> Vec<FakeFile> {
    let dir = fixture(name);
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|p| {
            let name = p.file_name().unwrap().to_str().unwrap();
            let bytes = std::fs::read(p).unwrap();
            if name.ends_with(".safetensors") {
                FakeFile::lfs(name, bytes)
            } else {
                FakeFile::git(name, bytes)
            }
        })
        .collect()
}

/// A fake Hub serving the MLX 4-bit fixture as `mlx-community/Qwen35-Tiny-4bit`, with another
/// `.safetensors` file beside the checkpoint (`dequantized.safetensors`, as the fixture's
/// exact dequantised values were once committed) that splash must not download.
fn mlx_hub() -> FakeHub {
    let hub = FakeHub::start();
    let mut files = fixture_files("qwen35-dense-mlx4");
    files.push(FakeFile::lfs("dequantized.safetensors", noise(200_000, 3)));
    hub.push(MLX_REPO, "main", COMMIT, files);
    hub
}

/// `splash ARGS` with its own `HF_HOME`, talking to `hub_url`; no token, cache override or
/// offline switch inherited from the environment running the tests.
fn splash(hub_url: &str, home: &TempDir, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_splash"));
    cmd.args(args)
        .env("HF_ENDPOINT", hub_url)
        .env("HF_HOME", home.path());
    for var in [
        "HF_TOKEN",
        "HF_TOKEN_PATH",
        "HUGGING_FACE_HUB_TOKEN",
        "HF_HUB_OFFLINE",
        "HF_HUB_CACHE",
        "HUGGINGFACE_HUB_CACHE",
        "SPLASH_LOG",
    ] {
        cmd.env_remove(var);
    }
    cmd
}

/// Kills the child on drop, so that a failing assertion leaves no process behind.
struct Reaper(Child);

impl Drop for Reaper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Reads `from` to the end on a thread.
fn drain(mut from: impl Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = from.read_to_end(&mut buf);
        buf
    })
}

/// Runs a command that should finish, within [`TIMEOUT`].
fn run(mut cmd: Command) -> Output {
    let mut child = Reaper(
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("splash runs"),
    );
    let stdout = drain(child.0.stdout.take().unwrap());
    let stderr = drain(child.0.stderr.take().unwrap());
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > TIMEOUT {
            let _ = child.0.kill();
            panic!(
                "{cmd:?} still running after {TIMEOUT:?}; stderr: {}",
                text(&stderr.join().unwrap())
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Output {
        status,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
}

/// A running `splash serve --port 0`, killed on drop.
struct Server {
    url: String,
    log: Arc<Mutex<String>>,
    _child: Reaper,
}

impl Server {
    /// Starts `cmd` and waits for its `Ready: URL` line.
    fn start(mut cmd: Command) -> Server {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("splash runs");
        let log = Arc::new(Mutex::new(String::new()));
        let (ready_tx, ready) = mpsc::channel();
        let out = child.stdout.take().unwrap();
        let err = child.stderr.take().unwrap();
        let child = Reaper(child);
        for (stream, tx) in [
            (Box::new(out) as Box<dyn Read + Send>, None),
            (Box::new(err), Some(ready_tx)),
        ] {
            let log = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines() {
                    let Ok(line) = line else { break };
                    if let (Some(tx), Some(url)) = (&tx, line.strip_prefix("Ready: ")) {
                        let _ = tx.send(url.trim().to_string());
                    }
                    let mut log = log.lock().unwrap();
                    log.push_str(&line);
                    log.push('\n');
                }
            });
        }
        match ready.recv_timeout(TIMEOUT) {
            Ok(url) => Server {
                url,
                log,
                _child: child,
            },
            Err(e) => {
                drop(child);
                panic!(
                    "{cmd:?} did not become ready ({e}); output:\n{}",
                    log.lock().unwrap()
                )
            }
        }
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// The ids `GET /v1/models` lists.
    fn model_ids(&self) -> Vec<String> {
        let (status, body) = http(&self.url, "GET", "/v1/models", None);
        assert_eq!(status, 200, "{body}");
        body["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap().to_string())
            .collect()
    }

    /// A 5-token chat completion from `model`; asserts it succeeded.
    fn chat(&self, model: &str) -> Value {
        let request = json!({
            "model": model,
            "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 5,
        });
        let (status, body) = http(&self.url, "POST", "/v1/chat/completions", Some(&request));
        assert_eq!(status, 200, "{body}\nserver log:\n{}", self.log());
        let tokens = body["usage"]["completion_tokens"].as_u64().unwrap_or(0);
        assert!(tokens >= 1, "{body}");
        body
    }
}

/// One HTTP/1.1 request (`Connection: close`): the status and the body as JSON (a JSON
/// string when the body is not JSON).
fn http(url: &str, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    let addr = url.strip_prefix("http://").expect("an http:// URL");
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(TIMEOUT)).unwrap();
    let body = body.map(Value::to_string).unwrap_or_default();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).unwrap();
    let raw = text(&raw);
    let (head, rest) = raw.split_once("\r\n\r\n").expect("an HTTP response");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status code");
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    let body = if chunked {
        dechunk(rest)
    } else {
        rest.to_string()
    };
    let json = serde_json::from_str(&body).unwrap_or(Value::String(body));
    (status, json)
}

fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    while let Some((size, tail)) = rest.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if size == 0 {
            break;
        }
        out.push_str(&tail[..size]);
        rest = tail[size..].trim_start_matches("\r\n");
    }
    out
}

/// Requests (to the Hub or its CDN) for the repository file `file`.
fn requests_for(hub: &FakeHub, file: &str) -> Vec<Logged> {
    let suffix = format!("/{file}");
    hub.requests()
        .into_iter()
        .filter(|r| {
            let path = r.target.split('?').next().unwrap_or("");
            path.ends_with(&suffix)
        })
        .collect()
}

#[test]
fn mlx_repo_is_downloaded_served_and_then_served_offline() {
    let mut hub = mlx_hub();
    let home = TempDir::new();
    let serve = ["serve", "--model", MLX_REPO, "--port", "0"];

    let server = Server::start(splash(&hub.url, &home, &serve));
    assert!(
        server.model_ids().iter().any(|id| id == MLX_REPO),
        "{:?}",
        server.model_ids()
    );
    server.chat(MLX_REPO);
    drop(server);
    assert!(!hub.cdn_requests_for("model.safetensors").is_empty());
    // The other safetensors file is not the checkpoint (`model*.safetensors` wins).
    assert!(requests_for(&hub, "dequantized.safetensors").is_empty());
    let snapshot = home
        .path()
        .join("hub/models--mlx-community--Qwen35-Tiny-4bit/snapshots")
        .join(COMMIT);
    assert!(snapshot.join("model.safetensors").is_file());
    assert!(snapshot.join("config.json").is_file());

    // The Hub is gone: --offline never asks it; without --offline the revision check fails
    // at once (connection refused) and the cached snapshot is used.
    hub.shutdown();
    let mut offline = serve.to_vec();
    offline.push("--offline");
    let server = Server::start(splash(&hub.url, &home, &offline));
    assert!(server.model_ids().iter().any(|id| id == MLX_REPO));
    server.chat(MLX_REPO);
    drop(server);

    let t0 = Instant::now();
    let server = Server::start(splash(&hub.url, &home, &serve));
    assert!(t0.elapsed() < QUICK, "took {:?} to fall back", t0.elapsed());
    server.chat(MLX_REPO);
    assert!(
        server.log().contains("cached snapshot"),
        "no word of the cache fallback:\n{}",
        server.log()
    );
}

#[test]
fn gguf_variant_downloads_only_its_file() {
    let dir = gguf("qwen35-dense-gguf");
    let read = |name: &str| {
        std::fs::read(dir.join(name))
            .unwrap_or_else(|e| panic!("{}: {e}", dir.join(name).display()))
    };
    let hub = FakeHub::start();
    hub.push(
        GGUF_REPO,
        "main",
        COMMIT,
        vec![
            FakeFile::git(
                ".gitattributes",
                "*.gguf filter=lfs diff=lfs merge=lfs -text\n",
            ),
            FakeFile::git("README.md", "# Qwen35-Tiny GGUF\n"),
            FakeFile::lfs("Qwen35-Tiny-Q8_0.gguf", read("model-Q8_0.gguf")),
            FakeFile::lfs("Qwen35-Tiny-UD-Q4_K_M.gguf", read("model-Q4_mix.gguf")),
            FakeFile::lfs("mmproj-F16.gguf", noise(50_000, 7)),
        ],
    );
    let home = TempDir::new();
    let spec = format!("{GGUF_REPO}:UD-Q4_K_M");
    let server = Server::start(splash(
        &hub.url,
        &home,
        &["serve", "--model", &spec, "--port", "0"],
    ));
    let ids = server.model_ids();
    assert!(ids.contains(&spec), "{ids:?}");
    server.chat(&spec);
    drop(server);
    assert!(!hub
        .cdn_requests_for("Qwen35-Tiny-UD-Q4_K_M.gguf")
        .is_empty());
    assert_eq!(
        requests_for(&hub, "Qwen35-Tiny-Q8_0.gguf").len(),
        0,
        "another variant was requested"
    );
    // The vision projector comes with the variant (this one is not a GGUF: the server warns
    // and serves text, as it did above)...
    let projector = requests_for(&hub, "mmproj-F16.gguf").len();
    assert!(projector > 0, "the vision projector was not fetched");
    // ...unless images are off.
    let home = TempDir::new();
    let server = Server::start(splash(
        &hub.url,
        &home,
        &["serve", "--model", &spec, "--port", "0", "--language-only"],
    ));
    server.chat(&spec);
    drop(server);
    assert_eq!(requests_for(&hub, "mmproj-F16.gguf").len(), projector);
}

#[test]
fn pull_then_list_and_a_second_pull_downloads_nothing() {
    let hub = mlx_hub();
    let home = TempDir::new();
    let pull = ["pull", "--model", MLX_REPO];

    let out = run(splash(&hub.url, &home, &pull));
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    assert!(text(&out.stdout).contains(COMMIT), "{}", text(&out.stdout));
    assert_eq!(hub.cdn_requests_for("model.safetensors").len(), 1);

    let out = run(splash(&hub.url, &home, &["list"]));
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let listing = text(&out.stdout);
    let line = listing
        .lines()
        .find(|l| l.starts_with(MLX_REPO))
        .unwrap_or_else(|| panic!("{MLX_REPO} not listed:\n{listing}"));
    assert!(
        line.contains(&COMMIT[..10]) && line.contains("main"),
        "{line}"
    );
    // The size: a number before its unit, about the 220 KiB of the fixture's weights.
    let words: Vec<&str> = line.split_whitespace().collect();
    let size = words
        .windows(2)
        .find(|w| ["B", "KiB", "MiB", "GiB"].contains(&w[1]))
        .unwrap_or_else(|| panic!("no size in {line:?}"));
    let value: f64 = size[0].parse().unwrap();
    assert!(size[1] == "KiB" && value > 200.0, "{line}");

    hub.clear_log();
    let out = run(splash(&hub.url, &home, &pull));
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    assert!(text(&out.stdout).contains(COMMIT), "{}", text(&out.stdout));
    assert!(
        !hub.requests().is_empty(),
        "the second pull did not check the revision"
    );
    assert_eq!(hub.cdn_requests_for("model.safetensors").len(), 0);
    assert_eq!(requests_for(&hub, "model.safetensors").len(), 0);
}

#[test]
fn unsupported_model_type_is_refused_before_the_weights() {
    let hub = FakeHub::start();
    hub.push(
        "acme/llama-tiny",
        "main",
        COMMIT,
        vec![
            FakeFile::git(
                "config.json",
                r#"{"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64}"#,
            ),
            FakeFile::git("tokenizer.json", r#"{"model": {}}"#),
            FakeFile::lfs("model.safetensors", noise(1 << 20, 11)),
        ],
    );
    let home = TempDir::new();
    let t0 = Instant::now();
    let out = run(splash(
        &hub.url,
        &home,
        &["serve", "--model", "acme/llama-tiny", "--port", "0"],
    ));
    assert!(t0.elapsed() < QUICK, "took {:?}", t0.elapsed());
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("unsupported model_type `llama`") && err.contains("qwen3_5"),
        "{err}"
    );
    assert!(!requests_for(&hub, "config.json").is_empty(), "{err}");
    assert_eq!(requests_for(&hub, "model.safetensors").len(), 0);
}

/// A GGUF v3 header with no tensors and one metadata key, `general.architecture`.
fn gguf_header(architecture: &str) -> Vec<u8> {
    let string = |b: &mut Vec<u8>, s: &str| {
        b.extend((s.len() as u64).to_le_bytes());
        b.extend(s.as_bytes());
    };
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes()); // version
    b.extend(0u64.to_le_bytes()); // tensors
    b.extend(1u64.to_le_bytes()); // metadata pairs
    string(&mut b, "general.architecture");
    b.extend(8u32.to_le_bytes()); // type: string
    string(&mut b, architecture);
    b
}

#[test]
fn unsupported_gguf_architecture_is_refused_before_the_weights() {
    // Longer than the 4 MiB probe, so that a full download would show.
    let mut file = gguf_header("llama");
    file.resize(5 << 20, 0);
    let hub = FakeHub::start();
    hub.push(
        "acme/llama-tiny-GGUF",
        "main",
        COMMIT,
        vec![FakeFile::lfs("llama-tiny-Q4_K_M.gguf", file)],
    );
    let home = TempDir::new();
    let t0 = Instant::now();
    let out = run(splash(
        &hub.url,
        &home,
        &[
            "serve",
            "--model",
            "acme/llama-tiny-GGUF:Q4_K_M",
            "--port",
            "0",
        ],
    ));
    assert!(t0.elapsed() < QUICK, "took {:?}", t0.elapsed());
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("`llama`") && err.contains("qwen35"), "{err}");
    // Only the probe's ranged read of the header; never the whole file.
    let cdn = hub.cdn_requests_for("llama-tiny-Q4_K_M.gguf");
    assert!(!cdn.is_empty(), "the header was not probed");
    for r in cdn {
        assert!(
            r.range
                .as_deref()
                .is_some_and(|r| r.starts_with("bytes=0-")),
            "{r:?}"
        );
    }
    let blobs = home.path().join("hub/models--acme--llama-tiny-GGUF/blobs");
    let cached = std::fs::read_dir(&blobs).map_or(0, |d| d.count());
    assert_eq!(cached, 0, "{} holds a download", blobs.display());
}

#[test]
fn private_repo_needs_hf_token() {
    let hub = mlx_hub();
    hub.set_private(MLX_REPO, "hf_test_secret");
    let home = TempDir::new();
    let pull = ["pull", "--model", MLX_REPO];

    let out = run(splash(&hub.url, &home, &pull));
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("HF_TOKEN") && err.contains(MLX_REPO), "{err}");
    assert_eq!(requests_for(&hub, "model.safetensors").len(), 0);

    let mut cmd = splash(&hub.url, &home, &pull);
    cmd.env("HF_TOKEN", "hf_test_secret");
    let out = run(cmd);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    assert!(text(&out.stdout).contains(COMMIT), "{}", text(&out.stdout));
    assert!(hub
        .requests()
        .iter()
        .any(|r| r.authorization.as_deref() == Some("Bearer hf_test_secret")));
}

#[test]
fn missing_local_path_is_an_error_not_a_download() {
    let hub = mlx_hub();
    let home = TempDir::new();
    for model in ["./nope", "models/nope/model"] {
        let out = run(splash(
            &hub.url,
            &home,
            &["serve", "--model", model, "--port", "0"],
        ));
        assert!(!out.status.success());
        let err = text(&out.stderr);
        assert!(err.contains(model), "{err}");
        assert!(
            err.contains("does not exist") && err.contains("OWNER/REPO"),
            "{err}"
        );
        let out = run(splash(&hub.url, &home, &["pull", "--model", model]));
        assert!(!out.status.success());
        assert!(text(&out.stderr).contains(model), "{}", text(&out.stderr));
    }
    assert!(hub.requests().is_empty(), "{:?}", hub.requests());
    assert!(!home.path().join("hub").exists());
}
